"""Run records in: every reader of run.json goes through here (the schema itself: schema.py).

Statuses: ok, oom, failed, incomplete, killed, hung, oom_busy. Only ok and incomplete runs have step
times (MEASURED); a killed or hung run never stands in a table as a measurement. A run that finished
all its iterations and then hung at exit is `ok` with an `exit_hang` note (`notes`).

A bad record (not JSON, a field of the wrong type, a status no launcher writes, ...) is skipped by
every reader with one line on stderr naming the file and the field, once per file and problem: it
never makes a row and never stops a page.

Readers: read_records() yields RunRecords; load_records() picks one per target (the tables' rows),
each with the repeats of its measurement (`runs`) and the runs that shared its host (`concurrent`).
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from megalab.core.paths import ROOT
from megalab.core.scoped import Scoped
from megalab.core.schema import (MEASURED, SCHEMA, STATUSES, USABLE, RecordError, Repeats,  # noqa: F401
                                 RunRecord, stamp)

_warned: set[tuple[str, str]] = set()


def num(v: Any) -> float | None:
    """A finite float, or None (None, NaN, text, bools): for cells read from the reference CSVs."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_records(root: Path, who: str | None = "megalab", pattern: str = "*/run.json") -> Iterator[RunRecord]:
    """Every ROOT/PATTERN as a RunRecord (run_dir: its folder), in path order. A file that is no valid
    record is skipped with one line on stderr (WHO: the command saying it), once per file and problem:
    a run.json that is a directory, a FIFO or a link to nowhere (which glob would pass over) too. Inside
    read_once, a folder read whole once is not read again."""
    key, memo = (str(root), pattern), _READ.memo
    if memo is not None and key in memo:
        yield from memo[key]
        return
    got = []
    for path in _candidates(Path(root), pattern):
        try:
            got.append(RunRecord.load(path))
        except RecordError as e:
            skip(path, str(e), who or "megalab")
            continue
        yield got[-1]
    if memo is not None:
        memo[key] = got


_READ = Scoped()  # read_once's folders: (root, pattern) -> the records read whole
# Within the block each folder's records are read once (every later reader gets the records the first read whole):
# for a reader of records that nothing writes while it reads them, as a page build, whose rows, machines, runs beside
# them, dataset and estimator each read every record again (eight readings of 1,203 files).
read_once = _READ.block


def _candidates(root: Path, pattern: str) -> list[Path]:
    """ROOT/PATTERN's paths, PATTERN's last part a plain name: every folder the rest matches that holds
    something by that name, whatever it is (os.path.lexists: a symbolic-link loop is named, not skipped)."""
    head, _, name = pattern.rpartition("/")
    folders = root.glob(head) if head else [root]
    return sorted(d / name for d in folders if os.path.lexists(d / name))


def skip(path: Path, why: str, who: str = "megalab") -> None:
    """The one line a reader prints for a record it will not use (once per file and reason)."""
    if (str(path), why) in _warned:
        return
    _warned.add((str(path), why))
    fix = "" if "; fix: " in why else "; fix: mend or remove that file (a bad record never makes a row)"
    print(f"{who}: skipping {_rel(path)}: {why}{fix}", file=sys.stderr)


def _rel(path: Path) -> str:
    try:  # the folder resolved, the file's own name kept: run.json may be a link that leads nowhere
        return str((Path(path).parent.resolve() / Path(path).name).relative_to(ROOT))
    except (ValueError, RuntimeError, OSError):
        return str(path)


def setup_key(rec: RunRecord) -> tuple:
    """What makes two runs of one target repeats of the same measurement: the same host and GPUs, the
    same megalab commit and the same settings (fast path, CUDA graph, extra flags, cap, warm-up).
    Pages pass a key that reads "the same code" from git instead of the commit (provenance.setup_key)."""
    return (rec.hostname, rec.versions.megalab_commit, *settings(rec))


def settings(rec: RunRecord) -> tuple:
    """A run's settings as compared between runs (the cap as a number: "80" and 80.0 are one cap)."""
    c = rec.config
    return (rec.gpu_name, rec.num_gpus, c.transformer_impl, c.spec, c.fastpath, c.cuda_graph, c.extra_args,
            c.gpu_mem_gb, rec.warmup_iters)


def repeats(chosen: RunRecord, recs: Iterable[RunRecord], setup: Callable = setup_key) -> Repeats | None:
    """Spread across runs: the ok runs of chosen's target with chosen's setup key, when there are two
    or more: n, the median of the runs' median step times, their lowest and highest, and the runs."""
    key = setup(chosen)
    same = [r for r in recs if r.target == chosen.target and r.status == "ok" and r.step_ms_median is not None
            and setup(r) == key]
    if chosen.status != "ok" or len(same) < 2:
        return None
    ms = sorted(r.step_ms_median for r in same)
    mid = len(ms) // 2
    median = ms[mid] if len(ms) % 2 else (ms[mid - 1] + ms[mid]) / 2
    return Repeats(n=len(ms), median_ms=median, lo_ms=ms[0], hi_ms=ms[-1],
                   runs=tuple(sorted(r.run_dir.name for r in same if r.run_dir is not None)))


def load_records(root: Path, setup: Callable = setup_key, who: str = "megalab",
                 prefer: Callable[[RunRecord], bool] | None = None) -> dict[str, RunRecord]:
    """Newest record per target from ROOT/*/run.json, with its repeats (`runs`: repeats()) and the runs
    that shared its host (`concurrent`: mark_shared).

    Per target: the newest (by `started`) record whose status is ok or oom, among those PREFER takes
    where it takes any (a page's row prefers a plain `make <target>` to a lever trial's launch of that
    target with other settings); if it has none, the newest record of any status. Bad files are skipped
    with one line on stderr (WHO: the command).
    """
    by_target: dict[str, list[tuple[float, str, RunRecord]]] = {}
    for rec in read_records(root, who):
        by_target.setdefault(rec.target, []).append((stamp(rec.started), rec.run_dir.name, rec))
    out = {}
    for target, recs in sorted(by_target.items()):
        usable = [r for r in recs if r[2].status in USABLE]
        preferred = [r for r in usable if prefer(r[2])] if prefer else []
        chosen = max(preferred or usable or recs, key=lambda r: (r[0], r[1]))[2]
        out[target] = chosen.grouped(repeats(chosen, [r[2] for r in recs], setup))
    return mark_shared(out, Path(root).parent, who)


def mark_shared(recs: dict, results: Path, who: str = "megalab") -> dict:
    """RECS (any key -> RunRecord) with `concurrent` set on each: the runs that shared its host while it
    ran, from the start and end times of every record under RESULTS (rows, bench and data runs)."""
    windows = [(*w, str(r.hostname), r.target) for r in read_records(results, who, "**/run.json")
               if (w := r.window)]
    return {k: r.grouped(r.runs, concurrent_with(r, windows)) for k, r in recs.items()}


def concurrent_with(rec: RunRecord, windows: list[tuple[float, float, str, str]]) -> list[str]:
    """Targets of the other runs on the same host whose time overlapped this one's (several
    runs can share a multi-GPU host on disjoint GPUs; their step times may differ a little)."""
    w = rec.window
    if not w:
        return []
    return sorted({t for s, e, h, t in windows if h == str(rec.hostname) and s < w[1] and w[0] < e and (s, e) != w})
