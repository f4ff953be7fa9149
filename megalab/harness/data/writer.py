"""Megatron's indexed dataset on disk: its file names, reading its .idx, and writing it atomically.

A dataset is <prefix>_text_document.bin (every document's token ids, back to back), .idx (Megatron's
index: a header, then sequence lengths, offsets and document boundaries) and .info.json (what
prepare-data built it from, and its counts). megatron-core's own IndexedDatasetBuilder writes .bin
and .idx, so `--data-path <prefix>_text_document` reads them; the .idx header is read here in plain
Python, so the launcher checks a dataset without importing torch.

Writing is atomic: a Staging writes everything under temporary names in the output folder (the
three files and the tokenizer folder), commit() fsyncs and renames them, the .idx last, and close()
removes what was not committed. An interrupted or failed run therefore leaves no file under the
final names; the temporaries of a run killed outright (SIGKILL) carry its pid, and the next run on
that prefix removes them once that pid is gone.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import struct
from dataclasses import dataclass

import numpy as np

from megalab._compat import ensure_typing_override

SUFFIX = "_text_document"

_IDX_HEADER = b"MMIDIDX\x00\x00"  # megatron.core.datasets.indexed_dataset._INDEX_HEADER
_IDX_HEADER_SIZE = 34  # magic, version <Q, dtype code <B, sequence count <Q, document-index count <Q
_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 8, 8: 2}  # indexed_dataset.DType codes


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

    @property
    def tokenizer(self) -> str:  # the Hugging Face folder saved beside the data (gpt2, train:N)
        return self.prefix + "-tokenizer"

    def tmp(self, kind: str) -> str:
        """This process's temporary name for one of the data files (kind: bin, idx, info)."""
        return _tmp_name(self.data, kind)

    def tokenizer_tmp(self, kind: str) -> str:
        """This process's temporary name for the tokenizer folder (kind: dir, being written; old,
        the folder it replaces)."""
        return _tmp_name(self.tokenizer, kind)


def _tmp_name(path: str, kind: str) -> str:
    # .<name>.<pid>.<kind>.tmp: hidden, beside the final name (so a rename stays on one file
    # system), and the pid tells clean_stale_temps whether its run is still alive.
    d, base = os.path.split(path)
    return os.path.join(d, f".{base}.{os.getpid()}.{kind}.tmp")


def read_idx_header(path: str) -> tuple[int, int, int]:
    """(dtype code, sequence count, document-index count) of a Megatron .idx; raises ValueError."""
    with open(path, "rb") as f:
        head = f.read(_IDX_HEADER_SIZE)
    if len(head) < _IDX_HEADER_SIZE or head[:9] != _IDX_HEADER:
        raise ValueError("not a Megatron .idx (bad header)")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[9:])
    if version != 1 or code not in _DTYPE_SIZES:
        raise ValueError(f"unsupported .idx (version {version}, dtype code {code})")
    if os.path.getsize(path) != _IDX_HEADER_SIZE + seqs * 12 + docs * 8:
        raise ValueError(".idx truncated or padded")
    return code, seqs, docs


def document_tokens(idx_path: str) -> np.ndarray:
    """Tokens per document of a Megatron .idx (its sequence lengths summed per document)."""
    code, seqs, docs = read_idx_header(idx_path)
    lengths = np.fromfile(idx_path, dtype=np.int32, count=seqs, offset=_IDX_HEADER_SIZE).astype(np.int64)
    doc_idx = np.fromfile(idx_path, dtype=np.int64, count=docs, offset=_IDX_HEADER_SIZE + seqs * 12)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    return cum[doc_idx[1:]] - cum[doc_idx[:-1]]


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


def builder_class():
    """megatron-core's IndexedDatasetBuilder and DType (imported late: they pull in torch)."""
    import warnings

    ensure_typing_override()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" etc.
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    return IndexedDatasetBuilder, DType


class Staging:
    """One build's files under temporary names: open() starts the .bin, add() appends a document,
    finalize() writes the .idx, commit() renames everything into place; on leaving the `with`
    block, whatever was not committed is removed (the tokenizer folder staged at
    paths.tokenizer_tmp("dir") included)."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.bin, self.idx, self.info = paths.tmp("bin"), paths.tmp("idx"), paths.tmp("info")
        self.tokenizer = paths.tokenizer_tmp("dir")
        self.builder = None
        self.committed = False

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        if self.builder is not None and not self.builder.data_file.closed:
            self.builder.data_file.close()
        if not self.committed:
            for p in (self.bin, self.idx, self.info):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            shutil.rmtree(self.tokenizer, ignore_errors=True)

    def open(self, vocab_size: int) -> np.dtype:
        """Start the .bin; the token dtype is the smallest that holds vocab_size ids (Megatron's)."""
        builder, dtypes = builder_class()
        dtype = np.dtype(dtypes.optimal_dtype(vocab_size))
        os.makedirs(os.path.dirname(self.paths.data) or ".", exist_ok=True)
        self.builder = builder(self.bin, dtype=dtype.type)
        return dtype

    def add(self, ids: np.ndarray) -> None:
        """One document: its token ids, the end-of-document id last."""
        self.builder.add_document(ids, [ids.size])

    def finalize(self) -> None:
        """Close the .bin and write the .idx (still under temporary names)."""
        self.builder.finalize(self.idx)

    def commit(self, info: dict, with_tokenizer: bool) -> None:
        """Write info as .info.json, fsync, and rename the files (and, with_tokenizer, the staged
        tokenizer folder) to their final names. The .idx goes last: until it is renamed,
        `finished()` says no, so a crash in between leaves a dataset that is rebuilt rather than
        a mismatched pair."""
        paths = self.paths
        with open(self.info, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
            f.write("\n")
        for p in (self.bin, self.idx, self.info):
            _fsync(p)
        if with_tokenizer:
            for p in os.listdir(self.tokenizer):
                _fsync(os.path.join(self.tokenizer, p))

        for p in (paths.idx, paths.info):
            if os.path.exists(p):
                os.unlink(p)
        if with_tokenizer:
            if os.path.isdir(paths.tokenizer):
                old = paths.tokenizer_tmp("old")
                os.replace(paths.tokenizer, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(self.tokenizer, paths.tokenizer)
        os.replace(self.bin, paths.bin)
        os.replace(self.info, paths.info)
        os.replace(self.idx, paths.idx)
        self.committed = True
        _fsync(os.path.dirname(paths.data) or ".")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_stale_temps(paths: Paths) -> None:
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
