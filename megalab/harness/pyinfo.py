"""Which Python and which torch a run uses, read without importing torch (importlib.metadata).

Every preflight prints it and `make which-python` (`python -m megalab python`) prints it alone, so
a run that would use the CPU-only test venv on a GPU machine says so before it starts.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path


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


def recompiles(environ=os.environ, torch_dir: Path | None = ...) -> bool:  # type: ignore[assignment]
    """True where every process compiles torch from source: PYTHONDONTWRITEBYTECODE is set and torch's
    package has no bytecode cache. On the GPU rig that made `import torch` 5.5 s instead of 2.6 s, in
    the launcher and in every worker (results/bench: "Where a launch goes", the imports column)."""
    if not environ.get("PYTHONDONTWRITEBYTECODE"):
        return False
    if torch_dir is ...:
        try:
            spec = importlib.util.find_spec("torch")  # finds the package without importing it
        except (ImportError, ValueError):
            spec = None
        torch_dir = Path(spec.origin).parent if spec and spec.origin else None
    return torch_dir is not None and not (torch_dir / "__pycache__").is_dir()


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
    if version is not None and recompiles():
        warn += ("; PYTHONDONTWRITEBYTECODE is set and torch has no bytecode cache, so every process compiles "
                 "torch from source at start: fix: unset PYTHONDONTWRITEBYTECODE")
    return f"python     {executable}; {what}{warn}"


def main(args) -> int:
    """`python -m megalab python` (make which-python): the Python and torch make runs targets with."""
    print(line())
    return 0
