"""git, asked about the checkout: one way to run it, so that no reader of a tree without git (a copy on
a GPU rig, a container) or with a git that hangs is ever stopped by it."""
from __future__ import annotations

import subprocess
from pathlib import Path


def run(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    """`git -C ROOT ARGS`, its output as text; None where git cannot be run (not installed, timed out)."""
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
