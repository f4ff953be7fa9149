"""How Megatron cuts a dataset into train/validation/test (--split), and when it cannot.

Megatron 0.19 splits by whole documents, and two cuts break it: a split of 0 documents makes it loop
forever (GPTDataset._get_num_epochs never reaches the requested tokens), and a split whose documents
hold less than one sample stops it with "no sample to consume: 0" once its data loader is built.
949,50,1 gives a small corpus both. The launcher asks split_problem before it starts a run on a
prepared dataset (DATA=), and prepare-data's summary suggests a --split that works; both reproduce
Megatron's arithmetic in plain Python on the .idx, without torch.
"""
from __future__ import annotations

import re

import numpy as np

from megalab.harness.data.errors import first_line
from megalab.harness.data.writer import document_tokens

DEFAULT_SPLIT = "949,50,1"  # scripts/train_gpt.sh's --split
SUGGEST_SEQ_LEN = 1024  # the GPT-2 presets' sequence; launch re-checks with the target's own


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
    """A --split under which no built split of n documents is empty (nor, doc_tokens and seq_len
    given, under one sample): 949,50,1 where it works, else 98,2,0, else 100,0,0."""
    for split in (DEFAULT_SPLIT, "98,2,0", "100,0,0"):
        if _split_ok(split, n, doc_tokens, seq_len):
            return split
    return "100,0,0"


def split_problem(data_prefix: str, split: str, seq_len: int) -> str | None:
    """Why Megatron would stop (or hang) on this dataset with this --split and sequence length, or None."""
    idx = data_prefix + ".idx"
    try:
        tokens = document_tokens(idx)
    except (OSError, ValueError) as e:
        return f"DATA={data_prefix}: {idx} is not a readable dataset index ({first_line(e)}); fix: make prepare-data"
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


def suggested_split(documents: int, idx_path: str) -> str:
    """The --split prepare-data suggests for a dataset of `documents` documents: safe for a
    SUGGEST_SEQ_LEN-token sequence when its .idx is readable, else for document counts alone."""
    try:
        tokens = document_tokens(idx_path)
    except (OSError, ValueError):
        tokens = None
    return safe_split(documents, tokens, SUGGEST_SEQ_LEN if tokens is not None else None)
