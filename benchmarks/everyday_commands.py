"""How long the everyday commands take on a fresh clone on this machine: `make help`, `make list`, `make help FAST`,
`python -m megalab plan TARGET`, `make tables` with nothing to do (its first build in the clone, which leaves its
stamp, and the next), and a target's first `DRY_RUN=1 make` (Megatron's check not yet cached: a fresh cache folder)
and its second (cached). Issue 59's goals: make tables with nothing to do 2 s or less, help/list/plan under 1 s,
the first dry run 5 s or less. No GPU needed; the clone and the caches are temporary folders.

Run from the repository root: `PYTHONPATH=$PWD .venv/bin/python benchmarks/everyday_commands.py [TARGET] [--repeats N]`
(each command N times, the median printed with the range; wall seconds, and the CPU seconds of the command and
its children, which a busy machine inflates less). The clone is of HEAD: commit what you measure.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ARGV."""
    start, cpu = time.perf_counter(), _children_cpu()
    out = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start, _children_cpu() - cpu
    if out.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[-300:]}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", default="101-gpt2xl-dp1-gbs1-bf16")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    make = ["make", "--no-print-directory"]
    rows: list[tuple[str, list[tuple[float, float]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", "--local", str(ROOT), str(clone)], check=True)
        env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(clone)}
        for name, argv in (("make help", [*make, "help"]), ("make list", [*make, "list"]),
                           ("make help FAST", [*make, "help", "FAST"]),
                           (f"plan {args.target}", [sys.executable, "-m", "megalab", "plan", args.target])):
            rows.append((name, [timed(argv, env, clone) for _ in range(args.repeats)]))
        first, again = [], []
        for _ in range(args.repeats):  # the stamp is in the machine's cache: a fresh one is a fresh machine
            with tempfile.TemporaryDirectory() as cache:
                fresh = {**env, "MEGALAB_CACHE_DIR": cache}
                first.append(timed([*make, "tables"], fresh, clone))
                again.append(timed([*make, "tables"], fresh, clone))
        rows += [("make tables, first in the clone", first), ("make tables, nothing to do", again)]
        first, second = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:  # Megatron's verdict not cached yet, as on a fresh machine
                dry = {**env, "DRY_RUN": "1", "MEGALAB_CACHE_DIR": cache}
                first.append(timed([*make, args.target], dry, clone))
                second.append(timed([*make, args.target], dry, clone))
        rows += [(f"DRY_RUN=1 make {args.target}, first", first), (f"DRY_RUN=1 make {args.target}, cached", second)]
    width = max(len(n) for n, _ in rows)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end; a fresh clone of HEAD; "
          f"median of {args.repeats} (min-max), seconds")
    print(f"  {'':<{width}}  {'wall':>6}  {'':13}  {'CPU':>6}")
    for name, times in rows:
        wall, cpu = [w for w, _ in times], [c for _, c in times]
        print(f"  {name:<{width}}  {statistics.median(wall):6.2f}  ({min(wall):5.2f}-{max(wall):5.2f})  "
              f"{statistics.median(cpu):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
