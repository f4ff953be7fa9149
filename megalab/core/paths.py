"""Where the checkout is: every path megalab reads or writes is under ROOT (configs/, results/,
tutorials/, outdir/ by default)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
