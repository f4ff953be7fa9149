"""What a run's GPUs ran at: the clock columns the monitor (megalab/harness/monitor.py) writes into each run's
gpu_memory.csv, read in one place, by `python -m megalab bench clocks RUN` and by the bench page
(megalab/results/onegpu_goals.py), which may not import the harness. No tabulate here (the monitor imports
this module, and a launch runs without it): the tables are drawn by their callers."""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import statistics
from collections import Counter
from pathlib import Path

from megalab.core import infile

CLOCK_COLUMNS = ("util_pct", "sm_mhz", "power_w", "held_by")  # the monitor's, after t_s, gpu and mem_used_mib
BUSY_UTIL_PCT = 50  # a sample counts as the run's work where NVML saw the GPU busy at least this share of its window
CSV_NAME = "gpu_memory.csv"


@dataclasses.dataclass
class Busy:
    """One GPU's samples (or several GPUs' and runs' pooled: `+`): how many, how many with the GPU busy, and those
    busy samples' SM clocks, power draws (a blank cell, NVML unable to read it, adds none) and, per clock-event
    reason (monitor.HELD_BY's names), how many of them it held the clock down in."""
    samples: int = 0
    busy: int = 0
    mhz: list[float] = dataclasses.field(default_factory=list)
    watts: list[float] = dataclasses.field(default_factory=list)
    held: Counter[str] = dataclasses.field(default_factory=Counter)

    def __add__(self, other: Busy) -> Busy:
        return Busy(self.samples + other.samples, self.busy + other.busy, self.mhz + other.mhz,
                    self.watts + other.watts, self.held + other.held)

    def figures(self) -> dict:
        """The SM clock (median, lowest, highest), the power's median, each reason's share of the busy samples;
        a figure with no reading is None."""
        return {"samples": self.samples, "busy": self.busy,
                "sm_mhz": statistics.median(self.mhz) if self.mhz else None,
                "sm_mhz_range": (min(self.mhz), max(self.mhz)) if self.mhz else None,
                "power_w": statistics.median(self.watts) if self.watts else None,
                "held": {r: n / self.busy for r, n in sorted(self.held.items())}}


def csv_path(path: Path) -> Path:
    """The monitor CSV of PATH: a run directory or the CSV itself."""
    path = Path(path)
    return path / CSV_NAME if path.is_dir() else path


def per_gpu(path: Path) -> dict[int, Busy] | None:
    """A run's samples per GPU (path: its directory or its gpu_memory.csv); None for a CSV without the clock columns
    (a monitor from before it read them, or not a monitor CSV). InputError, one line, for a file that cannot be
    read or a cell that is no number."""
    p = csv_path(path)
    try:
        text = infile.text(p, infile.LOG_LIMIT)  # as record.py reads it: a long multi-GPU run's CSV passes 4 MiB
    except infile.InputError as e:
        raise infile.InputError(e.path, e.reason, "name a run directory or its gpu_memory.csv") from None
    return _per_gpu(text, p)


@functools.lru_cache(maxsize=4096)  # a CSV's text parsed once a process: a page build reads every run's (1,203)
def _per_gpu(text: str, p: Path) -> dict[int, Busy] | None:
    """per_gpu of a CSV's TEXT (P: the file, for its errors). Its Busy values are shared: readers add them up into
    new ones (Busy.__add__) and read figures, never change them."""
    rows = csv.DictReader(io.StringIO(text))
    if not set(CLOCK_COLUMNS) <= set(rows.fieldnames or ()):
        return None
    per: dict[int, Busy] = {}
    for line, row in enumerate(rows, 2):
        try:
            gpu, util = int(row["gpu"]), float(row["util_pct"])
            mhz = float(row["sm_mhz"]) if row["sm_mhz"] else None
            watts = float(row["power_w"]) if row["power_w"] else None
        except (TypeError, ValueError):  # TypeError: a short row's missing cells are None
            raise infile.InputError(p, f"line {line}: gpu, util_pct, sm_mhz or power_w is not a number",
                                    "restore the run's memory CSV") from None
        g = per.setdefault(gpu, Busy())
        g.samples += 1
        if util < BUSY_UTIL_PCT:
            continue
        g.busy += 1
        if mhz is not None:
            g.mhz.append(mhz)
        if watts is not None:
            g.watts.append(watts)
        g.held.update(filter(None, (row["held_by"] or "").split("+")))
    return per


def pooled(path: Path | None) -> Busy | None:
    """A run's busy samples, all its GPUs pooled; None where it has none to give: no run directory (a record read
    without one), no monitor CSV, one from before the clock columns, or a damaged one (a table loses that run's clock
    figures, never its page)."""
    if path is None:
        return None
    try:
        per = per_gpu(path)
    except infile.InputError:
        return None
    return sum(per.values(), Busy()) if per else None


def summary(path: Path) -> list[dict]:
    """Per GPU of a run's monitor CSV (path: the run directory or its gpu_memory.csv), over the samples with the GPU
    busy (BUSY_UTIL_PCT): its figures (Busy.figures) and `gpu`. InputError, one line naming the fix, where there
    is nothing to summarise."""
    per = per_gpu(path)
    if per is None:
        names = ", ".join(CLOCK_COLUMNS[:-1]) + f" and {CLOCK_COLUMNS[-1]}"
        raise infile.InputError(csv_path(path), f"no {names} columns (a monitor from before it read clocks and "
                                "power, or not a monitor CSV)", "run the target again")
    if not per:
        raise infile.InputError(csv_path(path), "no samples", "run the target again")
    return [{"gpu": gpu, **g.figures()} for gpu, g in sorted(per.items())]


def mhz_cell(s: dict) -> str:
    """'median (lowest-highest)' of a summary's SM clock, '-' without a reading."""
    lo, hi = s["sm_mhz_range"] or (0, 0)
    return f"{s['sm_mhz']:.0f} ({lo:.0f}-{hi:.0f})" if s["sm_mhz"] else "-"


def power_cell(s: dict) -> str:
    """A summary's median power draw in whole watts, '-' without a reading."""
    return f"{s['power_w']:.0f}" if s["power_w"] else "-"


def held_cell(s: dict) -> str:
    return ", ".join(f"{r} {share:.0%}" for r, share in s["held"].items()) or "nothing"
