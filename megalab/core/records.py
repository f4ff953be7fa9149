"""Run records in: one typed, versioned reader for every run.json the pages and checks read.

A record is what the launcher wrote at the end of a run (megalab/harness/record.py). Schema 1 (every
committed record so far) holds the measurements, the config and provenance. Schema 2 adds `intent`
(the resolved run plan) and `observed` (what the entry point's `megalab: transformer_impl=...` line
said actually ran). For a schema 1 record `observed` is read from that line in the raw log beside it,
when it is there, and `intent` is None.

Statuses: ok, oom, failed, incomplete, killed, hung. Only ok and incomplete runs have step times
(MEASURED); a killed or hung run never stands in a table as a measurement. A run that finished all its
iterations and then hung at exit is `ok` with an `exit_hang` note (`notes`).

Readers: read_records() yields RunRecords; load_records() picks one per target (the tables' rows) and
gives their raw dicts, which claims and page cells address by field name.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator
from megalab.core import logparse

SCHEMA = 2  # what the launcher writes now (megalab/harness/record.py imports it)

STATUSES = ("ok", "oom", "failed", "incomplete", "killed", "hung", "oom_busy")
USABLE = ("ok", "oom")  # statuses preferred when picking a target's record
MEASURED = ("ok", "incomplete")  # statuses whose step times are measurements (an oom/failed/killed run has none)


def num(v: Any) -> float | None:
    """A finite float, or None (None, NaN, text, bools)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    f = num(v)
    return int(f) if f is not None and f.is_integer() else None


def _nums(v: Any) -> tuple[float, ...]:
    """The finite numbers of a per-GPU list (anything else: none)."""
    return tuple(x for x in (num(e) for e in v) if x is not None) if isinstance(v, (list, tuple)) else ()


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def stamp(s: Any) -> float:
    """An ISO time of a record as seconds since the epoch; -inf if absent or unreadable."""
    if not isinstance(s, str):
        return float("-inf")
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return float("-inf")
    if t.tzinfo is None:  # records are written in UTC; a naive stamp is read as UTC too
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run.json, typed: a field the file lacks (or holds in the wrong type) is None / empty."""
    target: str
    status: str
    schema: int = 1
    returncode: int | None = None
    step_ms_median: float | None = None
    step_ms_p10: float | None = None
    step_ms_p90: float | None = None
    step_count: int | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    mem_peak_gib: tuple[float, ...] = ()
    mem_peak_mib: tuple[float, ...] = ()
    gpu_name: str | None = None
    num_gpus: int | None = None
    hostname: str | None = None
    started: str | None = None
    ended: str | None = None
    error: str | None = None
    config: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    busy_gpus: Any = None  # what the preflight found in use when ALLOW_BUSY_GPUS=1 let the run start
    intent: dict | None = None  # schema 2: the resolved run plan
    run_dir: Path | None = None
    raw: dict = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, raw: dict, run_dir: Path | None = None, *, strict: bool = True) -> RunRecord:
        """A record from its parsed JSON (any schema); raises ValueError when it is no run record
        (strict=False: a partial dict, as tests and page cells hand around, is read as far as it goes)."""
        if not isinstance(raw, dict) or (strict and not isinstance(raw.get("target"), str)):
            raise ValueError("not a run record (no target)")
        return cls(
            target=str(raw.get("target") or ""), status=str(raw.get("status") or "unknown"), schema=_int(raw.get("schema")) or 1,
            returncode=_int(raw.get("returncode")),
            **{k: num(raw.get(k)) for k in ("step_ms_median", "step_ms_p10", "step_ms_p90", "tflops_per_gpu", "mfu")},
            step_count=_int(raw.get("step_count")),
            mem_peak_gib=_nums(raw.get("mem_peak_gib")), mem_peak_mib=_nums(raw.get("mem_peak_mib")),
            gpu_name=_str(raw.get("gpu_name")), num_gpus=_int(raw.get("num_gpus")),
            hostname=None if raw.get("hostname") is None else str(raw.get("hostname")),
            started=_str(raw.get("started")), ended=_str(raw.get("ended")), error=_str(raw.get("error")),
            config=_dict(raw.get("config")), versions=_dict(raw.get("versions")), files=_dict(raw.get("files")),
            notes=tuple(str(n) for n in raw.get("notes") or () if isinstance(raw.get("notes"), list)),
            busy_gpus=raw.get("busy_gpus"), intent=raw.get("intent") if isinstance(raw.get("intent"), dict) else None,
            run_dir=run_dir, raw=raw)

    @classmethod
    def of(cls, rec: RunRecord | dict) -> RunRecord:
        """A RunRecord from either form (page code is handed raw dicts by tests and load_records)."""
        return rec if isinstance(rec, RunRecord) else cls.from_dict(rec, rec.get("_dir"), strict=False)

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """ROOT/…/run.json; OSError / ValueError (UnicodeDecodeError included) when unreadable or no record."""
        return cls.from_dict(json.loads(Path(path).read_text()), Path(path).parent)

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def measured(self) -> tuple[float | None, ...]:
        """(median ms, p10, p90, TFLOP/s/GPU, MFU); all None unless the steps are valid (MEASURED). The
        median is the median of the runs' medians where repeats exist (`runs`); the rest are this run's."""
        if self.status not in MEASURED:
            return (None,) * 5
        return (self.step_ms, self.step_ms_p10, self.step_ms_p90, self.tflops_per_gpu, self.mfu)

    @property
    def runs(self) -> dict | None:
        """Spread across repeated runs (records.repeats), set by load_records; None for one run."""
        r = self.raw.get("_runs")
        return r if isinstance(r, dict) and (r.get("n") or 0) >= 2 else None

    @property
    def step_ms(self) -> float | None:
        """The row's step time: the median of the runs' medians where repeats exist, else this run's."""
        if self.status not in MEASURED:
            return None
        return self.runs["median_ms"] if self.runs else self.step_ms_median

    @property
    def gpu_mem_cap(self) -> Any:
        """The GPU_MEM_GB the run was capped to, as written (None when uncapped)."""
        return self.config.get("gpu_mem_gb")

    @property
    def transformer_impl(self) -> str | None:
        """What ran: the entry point's own word where known, else what the launcher asked for."""
        return (self.observed or {}).get("transformer_impl") or self.config.get("transformer_impl")

    @property
    def log_path(self) -> Path | None:
        """The raw log (logparse.log_file: gzipped under results/); read it with logparse.read_log."""
        return None if self.run_dir is None else logparse.log_file(self.run_dir / (self.files.get("log") or "logs.txt"))

    @cached_property
    def observed(self) -> dict | None:
        """What the entry point reported it ran (its `megalab:` lines): schema 2 stores it, schema 1's
        is read from the raw log beside the record (None when that log or line is not there)."""
        if isinstance(self.raw.get("observed"), dict):
            return self.raw["observed"]
        if self.log_path is None:
            return None
        try:
            return logparse.megalab_lines(logparse.read_log(self.log_path)) or None
        except OSError:
            return None

    @property
    def window(self) -> tuple[float, float] | None:
        """(start, end) in epoch seconds, when both are known."""
        start, end = stamp(self.started), stamp(self.ended)
        return (start, end) if start > float("-inf") and end > float("-inf") else None


def read_records(root: Path, who: str | None, pattern: str = "*/run.json") -> Iterator[RunRecord]:
    """Every ROOT/PATTERN as a RunRecord (run_dir: its folder), in path order; unreadable or malformed
    files skipped, with a warning on stderr naming WHO (None: silently)."""
    for path in sorted(Path(root).glob(pattern)):
        try:
            yield RunRecord.load(path)
        except (OSError, ValueError) as e:  # UnicodeDecodeError and JSON errors are ValueErrors
            if who:
                why = str(e) if "no target" in str(e) else f"unreadable ({e})"
                print(f"{who}: skipping {path}: {why}", file=sys.stderr)


def setup_key(rec: RunRecord) -> tuple:
    """What makes two runs of one target repeats of the same measurement: the same host and GPUs, the
    same megalab commit and the same settings (fast path, CUDA graph, extra flags, cap, warm-up).
    Pages pass a key that reads "the same code" from git instead of the commit (provenance.setup_key)."""
    return (rec.hostname, rec.versions.get("megalab_commit"), *settings(rec))


def settings(rec: RunRecord) -> tuple:
    c = rec.config
    return (rec.gpu_name, rec.num_gpus, c.get("transformer_impl"), c.get("spec"), c.get("fastpath"),
            c.get("cuda_graph"), c.get("extra_args"), c.get("gpu_mem_gb"), rec.raw.get("warmup_iters"))


def repeats(chosen: RunRecord, recs: Iterable[RunRecord], setup=setup_key) -> dict | None:
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
    return {"n": len(ms), "median_ms": median, "lo_ms": ms[0], "hi_ms": ms[-1],
            "runs": sorted(r.run_dir.name for r in same if r.run_dir is not None)}


def load_records(root: Path, setup=setup_key) -> dict[str, dict]:
    """Newest record per target from ROOT/*/run.json, as its raw dict (`_concurrent` added, and
    `_runs` (repeats()) where several ok runs of the target share its setup key).

    Per target: the newest (by `started`) record whose status is ok or oom; if it has none, the
    newest record of any status. Unreadable or malformed files are skipped with a warning on stderr.
    """
    by_target: dict[str, list[tuple[float, str, RunRecord]]] = {}
    for rec in read_records(root, "megalab tables"):
        by_target.setdefault(rec.target, []).append((stamp(rec.started), rec.run_dir.name, rec))
    out = {}
    for target, recs in sorted(by_target.items()):
        usable = [r for r in recs if r[2].status in USABLE]
        chosen = max(usable or recs, key=lambda r: (r[0], r[1]))[2]
        out[target] = chosen.raw
        runs = repeats(chosen, [r[2] for r in recs], setup)
        if runs:
            out[target]["_runs"] = runs
        else:
            out[target].pop("_runs", None)
    mark_shared(out.values(), Path(root).parent)
    return out


def mark_shared(recs: Iterable[dict], results: Path) -> None:
    """Set `_concurrent` on each record: the runs that shared its host while it ran, from the start
    and end times of every record under RESULTS (rows, bench and data runs)."""
    windows = [(*w, str(r.hostname), r.target) for r in read_records(results, None, "**/run.json")
               if (w := r.window)]
    for rec in recs:
        rec["_concurrent"] = concurrent_with(rec, windows)


def concurrent_with(rec: dict | RunRecord, windows: list[tuple[float, float, str, str]]) -> list[str]:
    """Targets of the other runs on the same host whose time overlapped this one's (several
    runs can share a multi-GPU host on disjoint GPUs; their step times may differ a little)."""
    r = RunRecord.of(rec)
    w = r.window
    if not w:
        return []
    return sorted({t for s, e, h, t in windows if h == str(r.hostname) and s < w[1] and w[0] < e and (s, e) != w})
