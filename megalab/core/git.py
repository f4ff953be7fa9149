"""git, asked about the checkout: one way to run it, so that no reader of a tree without git (a copy on
a GPU rig, a container) or with a git that hangs is ever stopped by it."""
from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

_ASKED: dict[tuple, subprocess.CompletedProcess | None] | None = None  # asked_once's answers, while one is open


def run(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    """`git -C ROOT ARGS`, its output as text; None where git cannot be run (not installed, timed out)."""
    key = (str(root), args)
    if _ASKED is not None and key in _ASKED:
        return _ASKED[key]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        out = None
    if _ASKED is not None:
        _ASKED[key] = out
    return out


@contextlib.contextmanager
def asked_once() -> Iterator[None]:
    """Within the block git is asked each question once, and a question asked again gets the first answer: for a
    reader of a checkout that nothing commits to while it reads (a page build asks ~800 questions, ~370 of them
    different: the same commits' provenance and freeze, for each record of them)."""
    global _ASKED
    outer = _ASKED
    if outer is None:
        _ASKED = {}
    try:
        yield
    finally:
        if outer is None:
            _ASKED = None
