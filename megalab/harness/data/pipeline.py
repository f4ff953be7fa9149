"""prepare(): the pipeline from a --source to a finished dataset, tying the other modules together.

  resolve the source (sources.py) and the tokenizer spec (tokenizer.py), name the output (Paths);
  keep a finished dataset built from the same inputs (unless force), refuse to overwrite another;
  load or train the tokenizer, encode the documents (encode.py) and write them (writer.py), atomically.

Inputs are checked in that order: a bad --source is reported before a bad --tokenizer, an offline
Hub before any tokenizer download.
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from megalab.harness.data.encode import encoded
from megalab.harness.data.errors import DataError
from megalab.harness.data.sources import DEFAULT_SOURCE, Source, resolve_source
from megalab.harness.data.tokenizer import TokenizerSpec, load_tokenizer
from megalab.harness.data.writer import SUFFIX, Paths, Staging, clean_stale_temps, finished

DEFAULT_OUT_DIR = "data"


@dataclass
class Result:
    paths: Paths
    info: dict
    skipped: bool  # True: the dataset was already there


def default_prefix(src: Source, tokenizer: TokenizerSpec, out_dir: str = DEFAULT_OUT_DIR) -> str:
    """<out_dir>/<source name><tag>: data/openwebtext-10k, data/corpus-bpe8192."""
    return os.path.join(out_dir, re.sub(r"[^\w.-]+", "_", src.name) + tokenizer.tag)


def _normalize_out(out: str | None, src: Source, tokenizer: TokenizerSpec) -> Paths:
    """--out as a prefix: none or a folder gets the default name; .bin/.idx/_text_document dropped."""
    if not out:
        return Paths(default_prefix(src, tokenizer))
    if out.endswith(os.sep) or os.path.isdir(out):
        return Paths(default_prefix(src, tokenizer, out.rstrip(os.sep) or os.sep))
    for ext in (".bin", ".idx"):
        out = out[: -len(ext)] if out.endswith(ext) else out
    return Paths(out[: -len(SUFFIX)] if out.endswith(SUFFIX) else out)


class _Texts:
    """The source's documents with text, the first `limit` of them; each pass (BPE training, then
    encoding) counts the empty ones it skipped in `empty`."""

    def __init__(self, src: Source, limit: int | None) -> None:
        self.src, self.limit, self.empty = src, limit, 0

    def __iter__(self) -> Iterator[str]:
        self.empty = kept = 0
        for t in self.src.documents():
            if not t.strip():
                self.empty += 1
                continue
            yield t
            kept += 1
            if self.limit is not None and kept >= self.limit:
                return


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


def prepare(source: str = DEFAULT_SOURCE, tokenizer: str = "gpt2", out: str | None = None,
            workers: int | None = None, limit_docs: int | None = None, force: bool = False,
            vocab_file: str | None = None, merge_file: str | None = None, text_key: str = "text",
            txt_docs: str = "auto", quiet: bool = False) -> Result:
    """Tokenize `source` into <prefix>_text_document.bin/.idx; command.py's docstring (--help) says more."""
    t0 = time.time()
    src = resolve_source(source, text_key, txt_docs)
    spec = TokenizerSpec.parse(tokenizer)
    paths = _normalize_out(out, src, spec)
    want = {"source": src.key, "tokenizer": spec.key, "limit_docs": limit_docs, "text_key": text_key}

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
    src.load()  # a Hub source's own "offline" error first, before any tokenizer download
    clean_stale_temps(paths)

    texts = _Texts(src, limit_docs)
    with Staging(paths) as staging:
        tok = load_tokenizer(spec, texts, Path(paths.tokenizer), Path(staging.tokenizer),
                             Path(os.path.dirname(paths.data) or "."), vocab_file, merge_file)
        dtype = staging.open(tok.vocab_size)
        total = src.total()
        if total is not None and limit_docs is not None:
            total = min(total, limit_docs)
        chunk = 64 if total is None else max(1, min(256, total // (workers * 8) or 1))

        docs = tokens = 0
        with encoded(texts, tok, dtype, workers, chunk) as chunks:
            progress = _Progress(total, quiet)
            try:
                for arrays in chunks:
                    for ids in arrays:
                        staging.add(ids)
                        tokens += ids.size
                    docs += len(arrays)
                    progress.update(len(arrays))
            finally:
                progress.close()
        staging.finalize()
        if docs == 0:
            raise DataError(f"no documents with text in {source} "
                            f"({texts.empty} empty); fix: point --source at a non-empty corpus")

        info = {**want, "documents": docs, "tokens": tokens, "empty_skipped": texts.empty,
                "eod_token": tok.eod_token, "eod_id": tok.eod_id, "vocab_size": tok.vocab_size,
                "dtype": dtype.name, "vocab_file": tok.vocab_file, "merge_file": tok.merge_file,
                "tokenizer_dir": tok.model_dir, "seconds": round(time.time() - t0, 2),
                "workers": workers, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        staging.commit(info, with_tokenizer=tok.staged_dir is not None)
    return Result(paths, info, skipped=False)
