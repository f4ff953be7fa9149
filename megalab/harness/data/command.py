"""`python -m megalab prepare-data`: tokenize a text corpus into Megatron's indexed dataset.

Megatron-LM's tools/preprocess_data.py is not in the megatron-core package; this is its equivalent
on megatron-core's own writer (`IndexedDatasetBuilder`). It writes `<prefix>_text_document.bin`
(the token ids of every document, each ended by the end-of-document token) and `.idx` (document
lengths and offsets), which `--data-path <prefix>_text_document` reads.

Sources (--source):
  a Hugging Face Hub dataset id   default `stas/openwebtext-10k`, the 10k-document OpenWebText
                                  subset the reference used (needs network, or HF_HUB_OFFLINE=1
                                  and a cached copy); its `text` column.
  local files: a file, a glob or a folder of
    *.jsonl    one JSON object per line; its `text` field (--text-key) is one document.
    *.parquet  its `text` column; one row is one document.
    *.txt      --txt-docs file: each file is one document; paragraph: each block of text between
               blank lines is one document; auto (default): paragraph for a single .txt file
               (a book or a dump), file for several (one article per file, like OpenWebText).
  python-docs  Python's own documentation, offline wherever Python runs (for machines that cannot
               reach the Hub): the reference topics of `pydoc` and every standard-library
               module's docstrings, one document per topic or module (PSF licence).
  Empty or whitespace-only documents are skipped (and counted).

Tokenizers (--tokenizer):
  gpt2        GPT-2's BPE: --vocab-file/--merge-file, else <out folder>/gpt2-vocab.json and
              gpt2-merges.txt when present, else downloaded from the Hub into that folder.
  train:N     a byte-level BPE with N tokens trained on the corpus itself (nothing to download);
              <|endoftext|> is reserved as a special token.
  DIR         a local Hugging Face tokenizer folder (tokenizer.json; the end-of-document token is
              its eos_token, else <|endoftext|> / </s> / <eos>).
Every document gets the end-of-document token appended (GPT-2's <|endoftext|>). The tokenizer
is saved beside the data as a Hugging Face folder <prefix>-tokenizer/ (tokenizer.json,
tokenizer_config.json, GPT-2-style vocab.json and merges.txt; for DIR: DIR itself): train with
DATA=<prefix>_text_document TOKENIZER_MODEL=<prefix>-tokenizer, i.e. Megatron's
--tokenizer-type HuggingFaceTokenizer --tokenizer-model, which needs `transformers`, not the Hub.

Writing is atomic: temporary names in the output folder, fsync'd, renamed at the end (the .idx
last); an interrupted or failed run leaves no file under the final names and removes its
temporaries. A finished dataset (.bin/.idx/.info.json present, the .idx readable, document and
token counts matching) is kept unless --force. Bad input (unreadable file, invalid JSON line, no
text column, empty corpus, offline Hub) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Callable

from megalab.harness.data.errors import DataError
from megalab.harness.data.pipeline import Result, prepare
from megalab.harness.data.sources import DEFAULT_SOURCE
from megalab.harness.data.splits import DEFAULT_SPLIT, SUGGEST_SEQ_LEN, suggested_split
from megalab.harness.data.writer import Paths


def _split_var(split: str) -> str:
    return "" if split == DEFAULT_SPLIT else f" SPLIT={split}"


def _gpt2_vars(info: dict, paths: Paths, split: str) -> str:
    return (f"DATA={paths.data} VOCAB_FILE={info['vocab_file']} MERGE_FILE={info['merge_file']}"
            f"{_split_var(split)}")


def make_vars(info: dict, paths: Paths, split: str | None = None) -> str:
    """The make variables that train on the dataset (scripts/train_gpt.sh reads them).

    TOKENIZER_MODEL (--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR) reads the exact
    tokenizer that wrote the data, offline. megatron-core 0.19's GPT2BPETokenizer is
    AutoTokenizer.from_pretrained("gpt2", vocab_file=, merges_file=): it needs the Hub's `gpt2`
    repository and then uses that repository's tokenizer.json, not the files passed, so
    VOCAB_FILE/MERGE_FILE are offered for GPT-2 itself only.
    """
    split = split or suggested_split(info["documents"], paths.idx)
    if info.get("tokenizer_dir"):
        return f"DATA={paths.data} TOKENIZER_MODEL={info['tokenizer_dir']}{_split_var(split)}"
    return _gpt2_vars(info, paths, split)


def _size(path: str) -> str:
    n = os.path.getsize(path)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def summary(res: Result) -> str:
    """What was built (or found) and the make variables that train on it."""
    info, paths = res.info, res.paths
    split = suggested_split(info["documents"], paths.idx)  # reads the .idx once
    head = ("prepare-data: already prepared (--force rebuilds): " if res.skipped
            else f"prepare-data: done in {info['seconds']:.1f} s with {info['workers']} worker(s): ")
    lines = [
        head + f"{info['documents']:,} documents, {info['tokens']:,} tokens"
        + (f" ({info['empty_skipped']} empty skipped)" if info.get("empty_skipped") else ""),
        f"  {paths.bin} ({_size(paths.bin)}, {info['dtype']})",
        f"  {paths.idx} ({_size(paths.idx)})",
        f"  tokenizer {info['tokenizer']}: vocab {info['vocab_size']}, end of document "
        f"{info['eod_token']} = {info['eod_id']}"
        + (f", in {info['tokenizer_dir']}/" if info.get("tokenizer_dir") else ""),
        f"train on it: make <target> {make_vars(info, paths, split)}",
    ]
    if split != DEFAULT_SPLIT:
        lines.append(f"  (SPLIT={split}: with {DEFAULT_SPLIT}, {info['documents']} documents leave a split "
                     f"empty or under one {SUGGEST_SEQ_LEN}-token sample, which Megatron 0.19 cannot build; "
                     "the launcher checks again for each target's sequence length)")
    if info["tokenizer"] == "gpt2" and info.get("vocab_file"):
        lines.append(f"  (or, where the Hub is reachable: {_gpt2_vars(info, paths, split)})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m megalab prepare-data",
        description="Tokenize a text corpus into Megatron's indexed dataset "
                    "(<prefix>_text_document.bin/.idx).",
        epilog=__doc__[__doc__.index("Sources (--source):"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=DEFAULT_SOURCE,
                    help=f"Hub dataset id, or local file/glob/folder of .jsonl/.parquet/.txt "
                         f"(default {DEFAULT_SOURCE})")
    ap.add_argument("--tokenizer", default="gpt2", help="gpt2 | train:N | DIR (default gpt2)")
    ap.add_argument("--out", default=None,
                    help="output prefix (default data/<source name>[-bpeN]); "
                         "writes PREFIX_text_document.bin/.idx")
    ap.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    ap.add_argument("--limit-docs", type=int, default=None, help="only the first N documents")
    ap.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json (with --tokenizer gpt2)")
    ap.add_argument("--merge-file", default=None, help="GPT-2 merges.txt (with --tokenizer gpt2)")
    ap.add_argument("--text-key", default="text", help="the text field/column (default text)")
    ap.add_argument("--txt-docs", choices=("auto", "file", "paragraph"), default="auto",
                    help=".txt documents: whole files or blank-line blocks (default auto)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the dataset is there")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    return ap


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (exit status 143)."""


def _env_default(value: str | None) -> str | None:
    # an empty --out/--vocab-file/--merge-file ("$VAR" of an unset variable) means the default
    return value if value not in (None, "") else None


def cli(argv: list[str] | None = None) -> int:
    """`python -m megalab prepare-data ...`: 0 done (or already there), 2 bad input, 130 interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prepare-data":
        argv = argv[1:]
    args = _parser().parse_args(argv)
    previous: Callable | int | None = None
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:  # `kill`/timeout: clean up like Ctrl-C
        def _term(signum, frame):
            raise _Terminated

        previous = signal.signal(signal.SIGTERM, _term)
    try:
        res = prepare(source=args.source, tokenizer=args.tokenizer, out=_env_default(args.out),
                      workers=args.workers, limit_docs=args.limit_docs, force=args.force,
                      vocab_file=_env_default(args.vocab_file), merge_file=_env_default(args.merge_file),
                      text_key=args.text_key, txt_docs=args.txt_docs, quiet=args.quiet)
    except DataError as e:
        print(f"megalab prepare-data: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("megalab prepare-data: interrupted; nothing written under the final names",
              file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    finally:
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary(res))
    return 0
