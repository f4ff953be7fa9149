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
import glob
import json
import os
import re
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from megalab._compat import ensure_typing_override

DEFAULT_SOURCE = "stas/openwebtext-10k"
DEFAULT_OUT_DIR = "data"
GPT2_HUB_REPO = "openai-community/gpt2"
EOD_TOKEN = "<|endoftext|>"
SUFFIX = "_text_document"
HUB_PARQUET_REVISION = "refs/convert/parquet"  # the Hub's own Parquet export of script datasets
LOCAL_EXTS = (".jsonl", ".parquet", ".txt")
FIX_LOCAL = "--source path/to/*.jsonl|*.parquet|*.txt (local files; make prepare-data DATA_SOURCE=...)"
INSTALL_DATA = "fix: pip install -e '.[data]' (datasets, tokenizers)"

_IDX_HEADER = b"MMIDIDX\x00\x00"  # megatron.core.datasets.indexed_dataset._INDEX_HEADER
_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 8, 8: 2}  # indexed_dataset.DType codes


class DataError(Exception):
    """A problem with the input or the environment: one line on stderr, exit status 2."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# ---- sources ------------------------------------------------------------------------------------
@dataclass
class Source:
    spec: str                    # as given
    key: str                     # the identity recorded in .info.json (absolute for local files)
    name: str                    # for the default output prefix
    hub: bool = False
    files: list[Path] = field(default_factory=list)
    text_key: str = "text"
    txt_docs: str = "auto"
    _hub_rows: object = None     # the loaded datasets.Dataset, loaded once
    builtin: bool = False        # python-docs

    def total(self) -> int | None:
        """Number of documents when cheap to know (for the progress bar), else None."""
        if self.hub and self._hub_rows is not None:
            return len(self._hub_rows)
        if self.files and all(f.suffix == ".parquet" for f in self.files):
            try:
                import pyarrow.parquet as pq

                return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
            except Exception:
                return None
        if self.files and all(f.suffix == ".txt" for f in self.files) and self._txt_mode() == "file":
            return len(self.files)
        return None

    def _txt_mode(self) -> str:
        if self.txt_docs != "auto":
            return self.txt_docs
        return "paragraph" if len(self.files) == 1 else "file"

    def documents(self) -> Iterator[str]:
        """Every document's text, in order (empty ones included; the caller skips them)."""
        if self.hub:
            yield from _hub_documents(self)
            return
        if self.builtin:
            yield from _python_docs()
            return
        for path in self.files:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(path, self.text_key)
            elif path.suffix == ".parquet":
                yield from _parquet_documents(path, self.text_key)
            else:
                yield from _txt_documents(path, self._txt_mode())


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _python_docs() -> Iterator[str]:
    """pydoc's reference topics, then each stdlib module's docstrings (module, classes, functions)."""
    import ast
    import sysconfig

    import pydoc_data.topics as topics

    for name in sorted(topics.topics):
        yield topics.topics[name]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        nodes = [tree, *(n for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
        yield "\n\n".join(d for n in nodes if (d := ast.get_docstring(n)))


def resolve_source(spec: str, text_key: str = "text", txt_docs: str = "auto") -> Source:
    if spec == "python-docs":
        import platform

        return Source(spec=spec, key=f"python-docs:{platform.python_version()}", name="python-docs",
                      builtin=True)
    has_glob = any(c in spec for c in "*?[")
    looks_local = (has_glob or os.path.exists(spec) or spec.startswith((".", "/", "~"))
                   or spec.endswith(LOCAL_EXTS))
    if not looks_local:
        if _HUB_ID.match(spec):
            return Source(spec=spec, key=f"hub:{spec}", name=spec.rsplit("/", 1)[1], hub=True,
                          text_key=text_key, txt_docs=txt_docs)
        raise DataError(f"source '{spec}' is neither a file, a glob, a folder nor a Hub dataset id "
                        f"(owner/name); fix: {FIX_LOCAL}")
    expanded = os.path.expanduser(spec)
    if os.path.isdir(expanded):
        files = sorted(p for p in Path(expanded).rglob("*") if p.is_file() and p.suffix in LOCAL_EXTS)
        name = Path(os.path.abspath(expanded)).name
        if not files:
            raise DataError(f"no *.jsonl, *.parquet or *.txt files under {spec}")
    else:
        matches = sorted(glob.glob(expanded, recursive=True)) if has_glob else [expanded]
        files = [Path(m) for m in matches if os.path.isfile(m)]
        if not files:
            raise DataError(f"no file matches '{spec}'; fix: {FIX_LOCAL}")
        bad = [f for f in files if f.suffix not in LOCAL_EXTS]
        if bad:
            raise DataError(f"{bad[0]}: unsupported file type '{bad[0].suffix}' "
                            f"(expected .jsonl, .parquet or .txt)")
        if has_glob:  # corpus/*.jsonl, corpus/part-*.jsonl -> "corpus"
            head = re.split(r"[*?\[]", expanded, maxsplit=1)[0]
            name = Path(os.path.dirname(os.path.abspath(head + "x"))).name or "corpus"
        else:
            name = files[0].stem
    return Source(spec=spec, key=os.path.abspath(expanded), name=name, files=files,
                  text_key=text_key, txt_docs=txt_docs)


def _jsonl_documents(path: Path, key: str) -> Iterator[str]:
    lineno = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno}); "
                                    f"fix: repair or delete that line") from None
                if not isinstance(obj, dict) or key not in obj:
                    has = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
                    raise DataError(f"{path}:{lineno}: no '{key}' field (has: {has}); "
                                    f"fix: --text-key NAME")
                text = obj[key]
                if text is None:
                    text = ""
                if not isinstance(text, str):
                    raise DataError(f"{path}:{lineno}: '{key}' is a {type(text).__name__}, not a string")
                yield text
    except UnicodeDecodeError:
        raise DataError(f"{path}:{lineno + 1}: not UTF-8 text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({_first_line(e)})") from None


def _parquet_documents(path: Path, key: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow; {INSTALL_DATA}") from None
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet ({_first_line(e)})") from None
    if key not in names:
        raise DataError(f"{path}: no '{key}' column (has: {', '.join(names[:8])}); fix: --text-key NAME")
    try:
        batches = pf.iter_batches(columns=[key], batch_size=1024)
        for batch in batches:
            for text in batch.column(0).to_pylist():
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{path}: column '{key}' holds {type(text).__name__}, not strings")
                yield text or ""
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet ({_first_line(e)})") from None


def _txt_documents(path: Path, mode: str) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({_first_line(e)})") from None
    if mode == "file":
        yield text
    else:
        yield from (b.strip("\n") for b in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")))


# ---- the Hugging Face Hub -----------------------------------------------------------------------
def _hub_endpoint() -> tuple[str, int]:
    """Host and port a Hub request connects to first: the HTTPS proxy when one is set."""
    url = (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
           or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if "://" not in url:
        url = "http://" + url
    u = urllib.parse.urlsplit(url)
    return u.hostname or "huggingface.co", u.port or (443 if u.scheme == "https" else 80)


def _hub_reachable(timeout: float = 5.0) -> bool:
    """A TCP connect to the Hub (or proxy), bounded in time even when DNS hangs."""
    host, port = _hub_endpoint()
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok and ok[0])


def _hub_offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")


def _check_hub(what: str, fix: str = FIX_LOCAL) -> None:
    if not _hub_offline() and not _hub_reachable():
        host, port = _hub_endpoint()
        raise DataError(f"cannot reach the Hugging Face Hub ({host}:{port}) for {what}; fix: "
                        f"{fix}, or HF_HUB_OFFLINE=1 to use a copy already in the HF cache")


def _load_hub(name: str, split: str):
    """datasets.load_dataset, falling back to the Hub's Parquet export for script datasets."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "60")
    try:
        import datasets
    except ImportError:
        raise DataError(f"loading '{name}' from the Hub needs `datasets`; {INSTALL_DATA}") from None
    try:
        return datasets.load_dataset(name, split=split)
    except RuntimeError as e:  # datasets>=4 no longer runs loading scripts (stas/openwebtext-10k has one)
        if "scripts are no longer supported" not in str(e):
            raise
        return datasets.load_dataset(name, split=split, revision=HUB_PARQUET_REVISION)


def load_hub_rows(src: Source):
    """Load (download or read from the HF cache) a Hub source's train split, once."""
    if src._hub_rows is None:
        _check_hub(f"'{src.spec}'")
        try:
            rows = _load_hub(src.spec, "train")
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"cannot load '{src.spec}' from the Hugging Face Hub ({_first_line(e)}); "
                            f"fix: {FIX_LOCAL}") from None
        cols = list(getattr(rows, "column_names", []) or [])
        if src.text_key not in cols:
            raise DataError(f"{src.spec}: no '{src.text_key}' column (has: {', '.join(cols[:8])}); "
                            f"fix: --text-key NAME")
        src._hub_rows = rows
    return src._hub_rows


def _hub_documents(src: Source) -> Iterator[str]:
    rows = load_hub_rows(src)
    for row in rows.select_columns([src.text_key]) if hasattr(rows, "select_columns") else rows:
        yield row[src.text_key] or ""


# ---- tokenizers ---------------------------------------------------------------------------------
@dataclass
class Tok:
    spec: str                     # as requested: gpt2 | train:N | DIR
    tokenizer: object             # a tokenizers.Tokenizer
    eod_id: int
    eod_token: str
    vocab_size: int
    vocab_file: str | None = None
    merge_file: str | None = None
    model_dir: str | None = None  # a local HF tokenizer folder (HuggingFaceTokenizer)
    staged_dir: str | None = None  # a trained tokenizer's temporary folder, committed with the data


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"tokenizing needs the `tokenizers` package; {INSTALL_DATA}") from None
    return tokenizers


def _bytelevel_bpe(vocab_file: str, merge_file: str):
    """GPT-2's tokenizer from vocab.json/merges.txt, exactly as GPT2TokenizerFast builds it."""
    tk = _tokenizers()
    try:
        impl = tk.ByteLevelBPETokenizer(vocab_file, merge_file, add_prefix_space=False)
    except Exception as e:
        raise DataError(f"cannot read GPT-2 BPE files {vocab_file}, {merge_file} ({_first_line(e)})") from None
    return impl._tokenizer


def _gpt2_tokenizer(vocab_file: str | None, merge_file: str | None, out_dir: Path,
                    final_dir: Path) -> Tok:
    if bool(vocab_file) != bool(merge_file):
        raise DataError("--vocab-file and --merge-file go together; fix: pass both")
    if not vocab_file:
        vocab_file, merge_file = str(out_dir / "gpt2-vocab.json"), str(out_dir / "gpt2-merges.txt")
        if not (os.path.isfile(vocab_file) and os.path.isfile(merge_file)):
            _download_gpt2(out_dir, vocab_file, merge_file)
    for f in (vocab_file, merge_file):
        if not os.path.isfile(f):
            raise DataError(f"{f}: no such file")
    tok = _bytelevel_bpe(vocab_file, merge_file)
    eod = tok.token_to_id(EOD_TOKEN)
    if eod is None:
        raise DataError(f"{vocab_file}: no {EOD_TOKEN} token, so not GPT-2's vocabulary")
    staged = _stage_dir(final_dir)
    shutil.copyfile(vocab_file, staged / "vocab.json")
    shutil.copyfile(merge_file, staged / "merges.txt")
    _save_hf_folder(tok, staged)
    return Tok("gpt2", tok, eod, EOD_TOKEN, tok.get_vocab_size(with_added_tokens=True),
               vocab_file=str(final_dir / "vocab.json"), merge_file=str(final_dir / "merges.txt"),
               model_dir=str(final_dir), staged_dir=str(staged))


def _stage_dir(final_dir: Path) -> Path:
    staged = final_dir.parent / f".{final_dir.name}.{os.getpid()}.dir.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def _save_hf_folder(tok, folder: Path) -> None:
    """tokenizer.json + tokenizer_config.json: a folder AutoTokenizer (Megatron's
    HuggingFaceTokenizer, --tokenizer-model) loads offline, with <|endoftext|> as eos/eod."""
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "GPT2TokenizerFast", "bos_token": EOD_TOKEN, "eos_token": EOD_TOKEN,
              "unk_token": EOD_TOKEN, "add_prefix_space": False, "model_max_length": 1_000_000_000}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


def _download_gpt2(out_dir: Path, vocab_file: str, merge_file: str) -> None:
    _check_hub("GPT-2's vocab.json/merges.txt",
               fix="--vocab-file/--merge-file (local GPT-2 files), --tokenizer train:N "
                   "(a BPE trained on the corpus)")
    try:
        from huggingface_hub import hf_hub_download

        got = [hf_hub_download(GPT2_HUB_REPO, f) for f in ("vocab.json", "merges.txt")]
    except ImportError:
        raise DataError(f"downloading GPT-2's BPE needs huggingface_hub; {INSTALL_DATA}") from None
    except Exception as e:
        raise DataError(f"cannot download GPT-2's BPE from the Hub ({_first_line(e)}); fix: "
                        f"--vocab-file/--merge-file, or --tokenizer train:N") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for src, dst in zip(got, (vocab_file, merge_file)):
        tmp = f"{dst}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def _dir_tokenizer(path: str) -> Tok:
    p = Path(path)
    tk = _tokenizers()
    tj = p / "tokenizer.json" if p.is_dir() else p
    vocab, merges = p / "vocab.json", p / "merges.txt"
    if tj.is_file():
        try:
            tok = tk.Tokenizer.from_file(str(tj))
        except Exception as e:
            raise DataError(f"{tj}: not a Hugging Face tokenizer.json ({_first_line(e)})") from None
    elif p.is_dir() and vocab.is_file() and merges.is_file():
        tok = _bytelevel_bpe(str(vocab), str(merges))
    else:
        raise DataError(f"tokenizer '{path}' is not gpt2, train:N, nor a folder with tokenizer.json "
                        f"(or vocab.json + merges.txt)")
    candidates = []
    cfg = (p if p.is_dir() else p.parent) / "tokenizer_config.json"
    if cfg.is_file():
        try:
            eos = json.loads(cfg.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            candidates.append(eos)
    candidates += [EOD_TOKEN, "</s>", "<eos>", "<|end_of_text|>"]
    for token in candidates:
        eod = tok.token_to_id(token)
        if eod is not None:
            break
    else:
        raise DataError(f"tokenizer '{path}' has no end-of-document token (eos_token in "
                        f"tokenizer_config.json, {EOD_TOKEN} or </s>)")
    d = p if p.is_dir() else p.parent
    gpt2_files = (d / "vocab.json").is_file() and (d / "merges.txt").is_file()
    return Tok(path, tok, eod, token, tok.get_vocab_size(with_added_tokens=True),
               vocab_file=str(d / "vocab.json") if gpt2_files else None,
               merge_file=str(d / "merges.txt") if gpt2_files else None, model_dir=str(d))


def _train_tokenizer(n: int, texts: Iterable[str], final_dir: Path) -> Tok:
    """A byte-level BPE of n tokens (256 bytes + <|endoftext|> + merges) on the corpus itself.

    Saved to a temporary folder beside final_dir, renamed with the dataset: tokenizer.json and
    tokenizer_config.json (AutoTokenizer / HuggingFaceTokenizer read the folder) plus GPT-2-style
    vocab.json/merges.txt (--tokenizer-type GPT2BPETokenizer --vocab-file --merge-file).
    """
    tk = _tokenizers()
    impl = tk.ByteLevelBPETokenizer(add_prefix_space=False)
    impl.train_from_iterator(texts, vocab_size=n, min_frequency=2, show_progress=False,
                             special_tokens=[EOD_TOKEN])
    staged = _stage_dir(final_dir)
    impl.save_model(str(staged))  # vocab.json, merges.txt
    tok = impl._tokenizer
    _save_hf_folder(tok, staged)
    return Tok(f"train:{n}", tok, tok.token_to_id(EOD_TOKEN), EOD_TOKEN,
               tok.get_vocab_size(with_added_tokens=True), vocab_file=str(final_dir / "vocab.json"),
               merge_file=str(final_dir / "merges.txt"), model_dir=str(final_dir), staged_dir=str(staged))


def _parse_train_spec(spec: str) -> int | None:
    if not spec.startswith("train:"):
        return None
    try:
        n = int(spec.split(":", 1)[1])
    except ValueError:
        n = 0
    if n < 257:
        raise DataError(f"--tokenizer {spec}: N must be an integer >= 257 "
                        f"(256 byte tokens + {EOD_TOKEN}); e.g. train:8192")
    return n


# ---- tokenizing, in worker processes -------------------------------------------------------------
_W: dict = {}


def _init_worker(tokenizer_json: str, eod: int, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: the pool is the parallelism
    tk = _tokenizers()
    _W.update(tok=tk.Tokenizer.from_str(tokenizer_json), eod=eod, dtype=np.dtype(dtype))


def _encode(texts: list[str], tok=None, eod: int | None = None, dtype=None) -> list[np.ndarray]:
    if tok is None:  # in a worker process: what _init_worker set up
        tok, eod, dtype = _W["tok"], _W["eod"], _W["dtype"]
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = np.empty(len(enc.ids) + 1, dtype=dtype)
        ids[:-1] = enc.ids
        ids[-1] = eod
        out.append(ids)
    return out


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while chunk := list(islice(it, size)):
        yield chunk


class _Throttle:
    """Back-pressure for Pool.imap, whose feeder thread would otherwise read the whole corpus
    into the task queue: at most `n` chunks in flight; stop() ends the feed (for terminate())."""

    def __init__(self, n: int) -> None:
        self._sem = threading.Semaphore(n)
        self._stop = threading.Event()

    def feed(self, chunks: Iterable[list[str]]) -> Iterator[list[str]]:
        for chunk in chunks:
            while not self._sem.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            yield chunk

    def done(self) -> None:
        self._sem.release()

    def stop(self) -> None:
        self._stop.set()


class _Progress:
    """tqdm on a terminal; else a plain line at most every 10 s (logs, make, CI)."""

    def __init__(self, total: int | None, quiet: bool) -> None:
        self.n, self.total, self.quiet, self.bar = 0, total, quiet, None
        self.t0 = self.last = time.monotonic()
        if not quiet and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="doc", desc="prepare-data", file=sys.stderr)
            except ImportError:
                pass

    def update(self, k: int) -> None:
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
            return
        now = time.monotonic()
        if not self.quiet and now - self.last >= 10:
            self.last = now
            of = f"/{self.total}" if self.total else ""
            print(f"prepare-data: {self.n}{of} documents, {self.n / (now - self.t0):.0f} doc/s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---- the dataset on disk ------------------------------------------------------------------------
@dataclass
class Paths:
    prefix: str  # without _text_document

    @property
    def data(self) -> str:  # what --data-path / DATA= take
        return self.prefix + SUFFIX

    @property
    def bin(self) -> str:
        return self.data + ".bin"

    @property
    def idx(self) -> str:
        return self.data + ".idx"

    @property
    def info(self) -> str:
        return self.data + ".info.json"

    def tmp(self, kind: str) -> str:
        d, base = os.path.split(self.data)
        return os.path.join(d, f".{base}.{os.getpid()}.{kind}.tmp")


def read_idx_header(path: str) -> tuple[int, int, int]:
    """(dtype code, sequence count, document-index count) of a Megatron .idx; raises ValueError."""
    with open(path, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != _IDX_HEADER:
        raise ValueError("not a Megatron .idx (bad header)")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[9:])
    if version != 1 or code not in _DTYPE_SIZES:
        raise ValueError(f"unsupported .idx (version {version}, dtype code {code})")
    if os.path.getsize(path) != 34 + seqs * 12 + docs * 8:
        raise ValueError(".idx truncated or padded")
    return code, seqs, docs


def finished(paths: Paths) -> dict | None:
    """The .info.json of a complete dataset at paths, else None (anything missing or inconsistent)."""
    try:
        with open(paths.info, encoding="utf-8") as f:
            info = json.load(f)
        code, seqs, docs = read_idx_header(paths.idx)
        ok = (docs - 1 == seqs == info["documents"]
              and os.path.getsize(paths.bin) == info["tokens"] * _DTYPE_SIZES[code]
              and (not info.get("tokenizer_dir") or os.path.isdir(info["tokenizer_dir"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if ok else None


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clean_stale_temps(paths: Paths) -> None:
    """Remove temporaries of earlier runs on this prefix that were killed (their pid is gone):
    .<name>_text_document.<pid>.{bin,idx,info}.tmp and .<name>-tokenizer.<pid>.{dir,old}.tmp."""
    d, base = os.path.split(paths.prefix)
    pattern = re.compile(rf"\.{re.escape(base)}(?:{SUFFIX}|-tokenizer)\.(\d+)\.\w+\.tmp$")
    for p in glob.glob(os.path.join(d or ".", f".{glob.escape(base)}*.tmp")):
        m = pattern.match(os.path.basename(p))
        if m and not _pid_alive(int(m.group(1))):
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _builder_class():
    """megatron-core's IndexedDatasetBuilder (imported late: it pulls in torch)."""
    import warnings

    ensure_typing_override()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" etc.
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    return IndexedDatasetBuilder, DType


def default_prefix(src: Source, tokenizer: str, out_dir: str = DEFAULT_OUT_DIR) -> str:
    if tokenizer == "gpt2":
        tag = ""
    elif tokenizer.startswith("train:"):
        tag = "-bpe" + tokenizer.split(":", 1)[1]
    else:
        tag = "-" + Path(os.path.abspath(tokenizer)).name.removesuffix("-tokenizer")
    return os.path.join(out_dir, re.sub(r"[^\w.-]+", "_", src.name) + tag)


def _normalize_out(out: str | None, src: Source, tokenizer: str) -> Paths:
    if not out:
        return Paths(default_prefix(src, tokenizer))
    if out.endswith(os.sep) or os.path.isdir(out):
        return Paths(default_prefix(src, tokenizer, out.rstrip(os.sep) or os.sep))
    for ext in (".bin", ".idx"):
        out = out[: -len(ext)] if out.endswith(ext) else out
    return Paths(out[: -len(SUFFIX)] if out.endswith(SUFFIX) else out)


# ---- prepare ------------------------------------------------------------------------------------
@dataclass
class Result:
    paths: Paths
    info: dict
    skipped: bool  # True: the dataset was already there


def prepare(source: str = DEFAULT_SOURCE, tokenizer: str = "gpt2", out: str | None = None,
            workers: int | None = None, limit_docs: int | None = None, force: bool = False,
            vocab_file: str | None = None, merge_file: str | None = None, text_key: str = "text",
            txt_docs: str = "auto", quiet: bool = False) -> Result:
    """Tokenize `source` into <prefix>_text_document.bin/.idx; see the module docstring."""
    t0 = time.time()
    src = resolve_source(source, text_key, txt_docs)
    paths = _normalize_out(out, src, tokenizer)
    out_dir = Path(os.path.dirname(paths.data) or ".")
    train_n = _parse_train_spec(tokenizer)
    tok_key = tokenizer if (tokenizer == "gpt2" or train_n) else os.path.abspath(tokenizer)
    want = {"source": src.key, "tokenizer": tok_key, "limit_docs": limit_docs, "text_key": text_key}

    info = finished(paths)
    if info is not None and not force:
        got = {k: info.get(k) for k in want}
        if got != want:
            diff = ", ".join(f"{k}={got[k]!r} (asked {want[k]!r})" for k in want if got[k] != want[k])
            raise DataError(f"{paths.data}.bin/.idx hold another dataset: {diff}; "
                            f"fix: --force to rebuild it, or --out another prefix")
        return Result(paths, info, skipped=True)

    if limit_docs is not None and limit_docs < 1:
        raise DataError("--limit-docs must be >= 1")
    workers = max(1, workers or os.cpu_count() or 1)
    if src.hub:  # the source's own "offline" error first, before any tokenizer download
        load_hub_rows(src)
    _clean_stale_temps(paths)

    skipped_empty = [0]

    def texts() -> Iterator[str]:
        kept = 0
        for t in src.documents():
            if not t.strip():
                skipped_empty[0] += 1
                continue
            yield t
            kept += 1
            if limit_docs is not None and kept >= limit_docs:
                return

    tmp_bin, tmp_idx, tmp_info = paths.tmp("bin"), paths.tmp("idx"), paths.tmp("info")
    tok: Tok | None = None
    pool = builder = None
    throttle = _Throttle(1)
    committed = False
    try:
        tok_dir = Path(paths.prefix + "-tokenizer")
        if train_n:
            tok = _train_tokenizer(train_n, texts(), tok_dir)
            skipped_empty[0] = 0
        elif tokenizer == "gpt2":
            tok = _gpt2_tokenizer(vocab_file, merge_file, out_dir, tok_dir)
        else:
            if vocab_file or merge_file:
                raise DataError("--vocab-file/--merge-file go with --tokenizer gpt2")
            tok = _dir_tokenizer(tokenizer)

        Builder, DType = _builder_class()
        dtype = np.dtype(DType.optimal_dtype(tok.vocab_size))
        total = src.total()
        if total is not None and limit_docs is not None:
            total = min(total, limit_docs)
        chunk = 64 if total is None else max(1, min(256, total // (workers * 8) or 1))

        out_dir.mkdir(parents=True, exist_ok=True)
        builder = Builder(tmp_bin, dtype=dtype.type)
        if workers == 1:
            encoded: Iterator[list[np.ndarray]] = (
                _encode(c, tok.tokenizer, tok.eod_id, dtype) for c in _chunks(texts(), chunk))
        else:
            import multiprocessing as mp

            # spawn, not fork: the parent may have used tokenizers' thread pool (BPE training),
            # which does not survive a fork.
            pool = mp.get_context("spawn").Pool(
                workers, initializer=_init_worker,
                initargs=(tok.tokenizer.to_str(), tok.eod_id, dtype.str))
            throttle = _Throttle(4 * workers)
            encoded = pool.imap(_encode, throttle.feed(_chunks(texts(), chunk)))

        progress = _Progress(total, quiet)
        docs = tokens = 0
        try:
            for arrays in encoded:
                for ids in arrays:
                    builder.add_document(ids, [ids.size])
                    tokens += ids.size
                docs += len(arrays)
                progress.update(len(arrays))
                throttle.done()
        finally:
            progress.close()
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
        builder.finalize(tmp_idx)
        if docs == 0:
            raise DataError(f"no documents with text in {source} "
                            f"({skipped_empty[0]} empty); fix: point --source at a non-empty corpus")

        info = {**want, "documents": docs, "tokens": tokens, "empty_skipped": skipped_empty[0],
                "eod_token": tok.eod_token, "eod_id": tok.eod_id, "vocab_size": tok.vocab_size,
                "dtype": dtype.name, "vocab_file": tok.vocab_file, "merge_file": tok.merge_file,
                "tokenizer_dir": tok.model_dir, "seconds": round(time.time() - t0, 2),
                "workers": workers, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(tmp_info, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
            f.write("\n")
        for p in (tmp_bin, tmp_idx, tmp_info):
            _fsync(p)
        if tok.staged_dir:
            for p in Path(tok.staged_dir).iterdir():
                _fsync(str(p))

        # Commit. The .idx goes last: until it is renamed, `finished()` says no, so a crash in
        # between leaves a dataset that is rebuilt rather than a mismatched pair.
        for p in (paths.idx, paths.info):
            if os.path.exists(p):
                os.unlink(p)
        if tok.staged_dir:
            final_dir = tok.model_dir
            if os.path.isdir(final_dir):
                old = os.path.join(os.path.dirname(final_dir),
                                   f".{os.path.basename(final_dir)}.{os.getpid()}.old.tmp")
                os.replace(final_dir, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tok.staged_dir, final_dir)
        os.replace(tmp_bin, paths.bin)
        os.replace(tmp_info, paths.info)
        os.replace(tmp_idx, paths.idx)
        committed = True
        _fsync(str(out_dir))
        return Result(paths, info, skipped=False)
    finally:
        throttle.stop()
        if pool is not None:
            pool.terminate()
            pool.join()
        if builder is not None and not builder.data_file.closed:
            builder.data_file.close()
        if not committed:
            for p in (tmp_bin, tmp_idx, tmp_info):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            if tok is not None and tok.staged_dir:
                shutil.rmtree(tok.staged_dir, ignore_errors=True)


DEFAULT_SPLIT = "949,50,1"  # scripts/train_gpt.sh's --split


def split_ranges(split: str, n: int) -> list[tuple[int, int] | None]:
    """[start, end) documents per train/valid/test split of n, exactly as Megatron 0.19 cuts them
    (None: the split is not built). parse_and_normalize_split + convert_split_vector_to_split_matrix
    + BlendedMegatronDatasetBuilder._build_megatron_dataset_splits, in plain Python."""
    w = [float(x) for x in re.findall(r"[.0-9]+", split)][:3]
    w += [0.0] * (3 - len(w))
    total = sum(w)
    w = [x / total for x in w]
    ends = [0.0]
    for x in w:
        ends.append(ends[-1] + x)
    return [None if b <= a else (int(round(a * float(n))), int(round(b * float(n))))
            for a, b in zip(ends[:-1], ends[1:])]


def split_documents(split: str, n: int) -> list[int | None]:
    """Documents per train/valid/test split of n (None: the split is not built)."""
    return [None if r is None else r[1] - r[0] for r in split_ranges(split, n)]


def split_samples(split: str, doc_tokens: np.ndarray, seq_len: int) -> list[int | None]:
    """Samples of seq_len tokens per split in one epoch, as GPTDataset counts them:
    (tokens - 1) // seq_len, the extra token being the last label. None: not built."""
    cum = np.concatenate([[0], np.cumsum(doc_tokens, dtype=np.int64)])
    return [None if r is None else max(int(cum[r[1]] - cum[r[0]]) - 1, 0) // seq_len
            for r in split_ranges(split, len(doc_tokens))]


def _split_ok(split: str, n: int, doc_tokens: np.ndarray | None, seq_len: int | None) -> bool:
    if not all(c is None or c > 0 for c in split_documents(split, n)):
        return False
    return doc_tokens is None or all(c is None or c > 0 for c in split_samples(split, doc_tokens, seq_len))


def safe_split(n: int, doc_tokens: np.ndarray | None = None, seq_len: int | None = None) -> str:
    """A --split under which no built split is empty. Megatron 0.19 loops forever building a
    GPTDataset over 0 documents (GPTDataset._get_num_epochs never reaches the requested tokens),
    which 949,50,1 gives the test split of any corpus of 500 documents or fewer; and a split whose
    documents hold less than one sample (doc_tokens, seq_len given) stops it with "no sample to
    consume: 0" when its data loader is built."""
    for split in (DEFAULT_SPLIT, "98,2,0", "100,0,0"):
        if _split_ok(split, n, doc_tokens, seq_len):
            return split
    return "100,0,0"


def document_tokens(idx_path: str) -> np.ndarray:
    """Tokens per document of a Megatron .idx (its sequence lengths summed per document)."""
    code, seqs, docs = read_idx_header(idx_path)
    lengths = np.fromfile(idx_path, dtype=np.int32, count=seqs, offset=34).astype(np.int64)
    doc_idx = np.fromfile(idx_path, dtype=np.int64, count=docs, offset=34 + seqs * 12)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    return cum[doc_idx[1:]] - cum[doc_idx[:-1]]


def split_problem(data_prefix: str, split: str, seq_len: int) -> str | None:
    """Why Megatron would stop (or hang) on this dataset with this --split and sequence length, or None."""
    idx = data_prefix + ".idx"
    try:
        tokens = document_tokens(idx)
    except (OSError, ValueError) as e:
        return f"DATA={data_prefix}: {idx} is not a readable dataset index ({_first_line(e)}); fix: make prepare-data"
    n = len(tokens)
    docs, samples = split_documents(split, n), split_samples(split, tokens, seq_len)
    for name, d, c in zip(("train", "validation", "test"), docs, samples):
        if d is not None and (d == 0 or c == 0):
            fix = safe_split(n, tokens, seq_len)
            what = "no documents" if d == 0 else f"{d} document(s), less than one {seq_len}-token sample"
            return (f"DATA={data_prefix}: SPLIT={split} leaves the {name} split {what}, and Megatron 0.19 "
                    f"{'hangs' if d == 0 else 'stops (no sample to consume)'} building it; "
                    f"fix: SPLIT={fix}" + ("" if fix != "100,0,0" or _split_ok(fix, n, tokens, seq_len)
                                            else " and a larger corpus"))
    return None


SUGGEST_SEQ_LEN = 1024  # the GPT-2 presets' sequence; launch re-checks with the target's own


def suggested_split(info: dict, paths: Paths) -> str:
    try:
        tokens = document_tokens(paths.idx)
    except (OSError, ValueError):
        tokens = None
    return safe_split(info["documents"], tokens, SUGGEST_SEQ_LEN if tokens is not None else None)


def make_vars(info: dict, paths: Paths, split: str | None = None) -> str:
    """The make variables that train on the dataset (scripts/train_gpt.sh reads them).

    TOKENIZER_MODEL (--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR) reads the exact
    tokenizer that wrote the data, offline. megatron-core 0.19's GPT2BPETokenizer is
    AutoTokenizer.from_pretrained("gpt2", vocab_file=, merges_file=): it needs the Hub's `gpt2`
    repository and then uses that repository's tokenizer.json, not the files passed, so
    VOCAB_FILE/MERGE_FILE are offered for GPT-2 itself only.
    """
    split = split or suggested_split(info, paths)
    extra = "" if split == DEFAULT_SPLIT else f" SPLIT={split}"
    if info.get("tokenizer_dir"):
        return f"DATA={paths.data} TOKENIZER_MODEL={info['tokenizer_dir']}{extra}"
    return (f"DATA={paths.data} VOCAB_FILE={info['vocab_file']} MERGE_FILE={info['merge_file']}"
            f"{extra}")


def _size(path: str) -> str:
    n = os.path.getsize(path)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def summary(res: Result) -> str:
    info, paths = res.info, res.paths
    split = suggested_split(info, paths)  # reads the .idx once
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
        extra = "" if split == DEFAULT_SPLIT else f" SPLIT={split}"
        lines.append(f"  (or, where the Hub is reachable: DATA={paths.data} "
                     f"VOCAB_FILE={info['vocab_file']} MERGE_FILE={info['merge_file']}{extra})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m megalab prepare-data",
        description="Tokenize a text corpus into Megatron's indexed dataset "
                    "(<prefix>_text_document.bin/.idx).",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli())
