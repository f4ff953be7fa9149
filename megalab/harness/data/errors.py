"""The one error prepare-data shows the user: DataError, one line on stderr and exit status 2.

Every stage (source, Hub, tokenizer, writer, splits) raises it for bad input or an unusable
environment, so the command catches a single type; first_line quotes a library's own exception
inside that one line. The fixes several stages name are spelled here once.
"""
from __future__ import annotations

FIX_LOCAL = "--source path/to/*.jsonl|*.parquet|*.txt (local files; make prepare-data DATA_SOURCE=...)"
INSTALL_DATA = "fix: pip install -e '.[data]' (datasets, tokenizers)"


class DataError(Exception):
    """A problem with the input or the environment: one line on stderr, exit status 2."""


def first_line(exc: BaseException) -> str:
    """`Type: the first line of its message` (at most 200 characters), for a one-line error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
