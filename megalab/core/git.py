"""git, asked about the checkout: one way to run it, so that no reader of a tree without git (a copy on
a GPU rig, a container) or with a git that hangs is ever stopped by it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from megalab.core.scoped import Scoped

_ASKED = Scoped()  # asked_once's answers: (root, args) -> the completed process


def run(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    """`git -C ROOT ARGS`, its output as text; None where git cannot be run (not installed, timed out)."""
    key, memo = (str(root), args), _ASKED.memo
    if memo is not None and key in memo:
        return memo[key]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        out = None
    if memo is not None:
        memo[key] = out
    return out


# Within the block git is asked each question once, and a question asked again gets the first answer: for a reader
# of a checkout that nothing commits to while it reads (a page build asks ~800 questions, ~370 of them different:
# the same commits' provenance and freeze, for each record of them).
asked_once = _ASKED.block
