"""Where the checkout is: every path megalab reads or writes is under ROOT (configs/, results/,
tutorials/, outdir/ by default), and the machine's cache outside it."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def cache_root(environ=os.environ) -> Path:
    """The machine's cache (never committed, safe to delete): MEGALAB_CACHE_DIR, else
    $XDG_CACHE_HOME/megalab, else ~/.cache/megalab."""
    return Path(environ.get("MEGALAB_CACHE_DIR") or Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "megalab")
