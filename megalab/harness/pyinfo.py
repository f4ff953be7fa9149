"""Which Python and which torch a run uses, read without importing torch (importlib.metadata).

Every preflight prints it and `make which-python` (`python -m megalab python`) prints it alone, so
a run that would use the CPU-only test venv on a GPU machine says so before it starts.
"""
from __future__ import annotations

import sys
from importlib import metadata


def torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def build(version: str | None) -> str:
    """'CPU build' for a +cpu wheel, 'CUDA x.y' for +cuXYZ, else '' (e.g. NGC's own builds)."""
    if not version or "+" not in version:
        return ""
    local = version.split("+", 1)[1]
    if local == "cpu":
        return "CPU build"
    if local.startswith("cu") and local[2:].isdigit():
        return f"CUDA {local[2:-1]}.{local[-1]}"
    return ""


def line(executable: str = sys.executable, version: str | None = ..., gpus: int = 0) -> str:  # type: ignore[assignment]
    """One preflight line: 'python     /x/bin/python; torch 2.13.0+cpu (CPU build)'; with GPUs here,
    a CPU build is called out with its fix."""
    version = torch_version() if version is ... else version
    if version is None:
        what = "torch not installed"
    else:
        kind = build(version)
        what = f"torch {version}" + (f" ({kind})" if kind else "")
    warn = ("; a CPU build cannot train on GPUs: fix: PY=python3 (the system's CUDA torch) or a CUDA torch"
            if gpus and build(version) == "CPU build" else "")
    return f"python     {executable}; {what}{warn}"


def cli(argv: list[str]) -> int:
    print(line())
    return 0
