"""How long the everyday commands take on this machine: `make help`, `make list`, `make help FAST`,
`python -m megalab plan TARGET`, and a target's first `DRY_RUN=1 make` (Megatron's own argument check not yet
cached: a fresh cache folder) and its second (cached). Issue 59's goals: under 1 s each, the first dry run 5 s or
less. No GPU needed; nothing is written outside a temporary folder.

Run from the repository root: `PYTHONPATH=$PWD .venv/bin/python benchmarks/everyday_commands.py [TARGET] [--repeats N]`
(each command N times, the median printed with the range).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[-300:]}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", default="101-gpt2xl-dp1-gbs1-bf16")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(ROOT)}
    make = ["make", "--no-print-directory"]
    rows = []
    for name, argv in (("make help", [*make, "help"]), ("make list", [*make, "list"]),
                       ("make help FAST", [*make, "help", "FAST"]),
                       (f"plan {args.target}", [sys.executable, "-m", "megalab", "plan", args.target])):
        times = [timed(argv, env) for _ in range(args.repeats)]
        rows.append((name, times))
    first, second = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:  # Megatron's verdict not cached yet, as on a fresh machine
            dry = {**env, "DRY_RUN": "1", "MEGALAB_CACHE_DIR": cache}
            first.append(timed([*make, args.target], dry))
            second.append(timed([*make, args.target], dry))
    rows += [(f"DRY_RUN=1 make {args.target}, first", first), (f"DRY_RUN=1 make {args.target}, cached", second)]
    width = max(len(n) for n, _ in rows)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; median of {args.repeats} (min-max), seconds")
    for name, times in rows:
        print(f"  {name:<{width}}  {statistics.median(times):6.2f}  ({min(times):.2f}-{max(times):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
