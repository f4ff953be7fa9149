"""The results as data: results/runs.csv (one row per committed run record) and results/rows.csv (one
row per chapter-table row), written by `make tables` beside the pages.

Tidy and typed: every value comes from the typed record (core/schema.py's RunRecord), the catalog and
the published tables (the clock columns from the monitor's CSV committed beside the record, core/clocks.py),
never from a page's formatted cell. Numbers are numbers (no thousands separators,
no units, no `oom` in a numeric column: the `status` column says how a run ended, NaN where a figure is
missing), booleans are `true`/`false`, times ISO 8601 in UTC. The schema (RUN_COLUMNS, ROW_COLUMNS:
column, type, unit, meaning) is documented in results/README.md from the same lists, and
tests/test_dataset.py reads both files with pandas and checks each column's type.

runs.csv holds every record under RUN_DIRS: the chapter rows' runs, the benchmark's, the out-of-catalog
holdout runs, the real-data and integrity runs and the quickstart's (`collection` says which).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from megalab.core import catalog, clocks, markdown, provenance
from megalab.core.records import RunRecord, num, read_records
from megalab.core.schema import stamp
from megalab.results import columns as cols, predicted
from megalab.results.chapter import REF_GB_TO_GIB, Context, context, row_id
from megalab.results.hosts import Hosts

MACHINE = ("the machine, the same key on every page: GPU model and the smallest UUID of the GPUs its records saw "
           "together ('H100-aed36c01'; '<model>x<GPUs>-noid' for a record without a GPU UUID: megalab/results/hosts.py)")
from megalab.runtime import levers

# Where committed records live: collection -> folder under the checkout.
RUN_DIRS = {"runs": "results/runs", "bench": "results/bench/runs", "holdout": "results/holdout/runs",
            "data": "results/data/runs", "integrity": "results/integrity/runs", "quickstart": "results/quickstart/runs"}
RUNS_CSV, ROWS_CSV = "results/runs.csv", "results/rows.csv"

# The types a column may have, as pandas.read_csv reads them back: int (int64, never missing), number
# (float64, NaN where missing), bool (true/false, never missing), text (empty where missing), time
# (ISO 8601 UTC text: read_csv(..., parse_dates=[...])).
KINDS = ("int", "number", "bool", "text", "time")


@dataclasses.dataclass(frozen=True)
class Col:
    name: str
    kind: str
    unit: str
    meaning: str
    digits: int | None = None  # rounding of a number (None: as recorded)


def _num(v: Any) -> float:
    return float("nan") if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def _text(v: Any) -> str:
    return "" if v is None else str(v)


def _utc(v: str | None) -> str:
    """An ISO time as UTC, to the second ('' where absent)."""
    t = stamp(v)
    return "" if t == float("-inf") else dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _seq_length(rec: RunRecord) -> int | None:
    preset = rec.config.model_preset or catalog.models().get(rec.config.model or "", {})
    return preset.get("seq_length")


def _gpu_mem(rec: RunRecord, i: int) -> float:
    return _num(rec.mem_peak_gib[i]) if i < len(rec.mem_peak_gib) else float("nan")


def _mem_max(rec: RunRecord) -> float:
    return _num(max(rec.mem_peak_gib)) if rec.mem_peak_gib else float("nan")


@functools.lru_cache(maxsize=4)  # the record's two clock columns read its CSV once
def _clock_figures(run_dir: Path | None) -> dict:
    """What the run's cards ran at while busy (core.clocks: the monitor's samples, all GPUs pooled); {} where the
    monitor did not sample clocks (before 2026-11-27) or the CSV is damaged."""
    busy = clocks.pooled(run_dir)
    return busy.figures() if busy is not None and busy.busy else {}


def _power_capped(rec: RunRecord) -> float:
    fig = _clock_figures(rec.run_dir)
    return _num(fig["held"].get("power_cap", 0.0) if fig else None)


# --------------------------------------------------------------------------- runs.csv

def _run_common() -> list[tuple[Col, Callable[[RunRecord], Any]]]:
    """Columns runs.csv and rows.csv share: what a record says about its run (RunRecord -> value)."""
    c = lambda r: r.config  # noqa: E731
    return [
        (Col("status", "text", "", "how the run ended: ok, oom, failed, incomplete, killed, hung, oom_busy"), lambda r: r.status),
        (Col("started", "time", "UTC", "when training started (ISO 8601)"), lambda r: _utc(r.started)),
        (Col("commit", "text", "", "megalab commit the run ran (`-dirty`: its run code, megalab/runtime, had uncommitted changes)"),
         lambda r: _text(r.versions.megalab_commit)),
        (Col("host", "text", "", "the machine: host name, first GPU's name and UUID (provenance.host_key)"),
         lambda r: _text(provenance.host_key(r))),
        (Col("gpu_name", "text", "", "GPU model as NVML names it"), lambda r: _text(r.gpu_name)),
        (Col("num_gpus", "number", "GPUs", "GPUs the run used"), lambda r: _num(r.num_gpus)),
        (Col("gpu_mem_cap_gb", "number", "GB (nominal)", "the GPU_MEM_GB cap; NaN uncapped"), lambda r: _num(c(r).gpu_mem_gb)),
        (Col("iters", "number", "steps", "training iterations asked for (ITERS)"),
         lambda r: _num(c(r).iters if c(r).iters is not None else r.train_iters)),
        (Col("timed_steps", "number", "steps", "steps the median step time is taken over (after warm-up)"),
         lambda r: _num(r.step_count)),
        (Col("warmup", "number", "steps", "steps dropped as warm-up"), lambda r: _num(r.warmup_iters)),
        (Col("fastpath", "text", "", "megalab's TE-free fast-path levers, comma-separated (`none`: no levers; empty where the record does not say)"),
         lambda r: "" if r.fastpath is None else levers.text(r.fastpath)),
        (Col("cuda_graph", "bool", "", "Megatron's full-iteration CUDA graph was on"), lambda r: bool(c(r).cuda_graph)),
        (Col("spec", "text", "", "layer spec without TE: megalab (TE-free) or local (Megatron's stock)"),
         lambda r: _text(c(r).spec)),
        (Col("transformer_engine", "bool", "", "the run used Transformer Engine"),
         lambda r: r.transformer_impl == "transformer_engine"),
        (Col("megatron_core", "text", "", "megatron-core version"), lambda r: _text(r.versions.megatron_core)),
        (Col("torch", "text", "", "torch version"), lambda r: _text(r.versions.torch)),
        (Col("cuda", "text", "", "CUDA version torch was built with"), lambda r: _text(r.versions.cuda)),
        (Col("tflops_per_gpu", "number", "TFLOP/s", "model TFLOP/s per GPU as Megatron reports it", 1),
         lambda r: _num(r.measured[3])),
        (Col("mfu", "number", "fraction", "TFLOP/s per GPU over the GPU's dense bf16 peak", 4), lambda r: _num(r.measured[4])),
        (Col("mem_peak_gib_max", "number", "GiB", "NVML peak memory, the largest over the run's GPUs", 3), _mem_max),
        *[(Col(f"mem_peak_gib_gpu{i}", "number", "GiB", f"NVML peak memory of GPU {i}; NaN beyond the run's GPUs", 3),
           lambda r, i=i: _gpu_mem(r, i)) for i in range(8)],
        (Col("sm_mhz_busy", "number", "MHz", "median SM clock over the monitor's samples with the GPU busy "
             f"(utilisation >= {clocks.BUSY_UTIL_PCT}%), all GPUs pooled; NaN where it did not sample clocks", 0),
         lambda r: _num(_clock_figures(r.run_dir).get("sm_mhz"))),
        (Col("power_capped_share", "number", "fraction", "share of those busy samples whose clock the power cap held "
             "down (NVML's clock-event reasons); NaN where the monitor did not sample clocks", 3),
         _power_capped),
        (Col("gbs", "number", "sequences", "global batch size"), lambda r: _num(c(r).gbs)),
        (Col("mbs", "number", "sequences", "micro-batch size"), lambda r: _num(c(r).mbs)),
        *[(Col(k, "number", "", f"{k.upper()} degree"), lambda r, k=k: _num(getattr(c(r), k))) for k in ("tp", "pp", "cp", "ep", "dp")],
        (Col("seq_length", "number", "tokens", "sequence length of the model as built"), lambda r: _num(_seq_length(r))),
        (Col("model", "text", "", "model preset (configs/models.yaml)"), lambda r: _text(c(r).model)),
        (Col("loss_first", "number", "", "lm loss of the first iteration Megatron logged (its log prints every step)", 4), lambda r: _num(r.loss_first)),
        (Col("loss_last", "number", "", "lm loss of the last iteration Megatron logged", 4), lambda r: _num(r.loss_last)),
        (Col("extra_args", "text", "", "the user's EXTRA_ARGS"), lambda r: _text(c(r).extra_args)),
    ]


def run_columns() -> list[tuple[Col, Callable[[RunRecord, str, Path, Hosts], Any]]]:
    """runs.csv: (column, value of (record, collection, tree, the machines of every run))."""
    own = [
        (Col("run", "text", "", "the run's folder name (time___target)"), lambda r, k, t, h: r.run_dir.name),
        (Col("collection", "text", "", "where it is committed: " + ", ".join(f"{k} ({d})" for k, d in RUN_DIRS.items())),
         lambda r, k, t, h: k),
        (Col("target", "text", "", "make target (a bench variant: target.variant; profile-/resume- runs keep the prefix)"),
         lambda r, k, t, h: r.target),
        (Col("chapter", "number", "", "catalog chapter of the target"), lambda r, k, t, h: _num(r.config.chapter)),
        (Col("machine", "text", "", MACHINE), lambda r, k, t, h: h.key(r)),
        (Col("provenance", "text", "", "today (today's code and defaults), older or unknown: provenance.py"),
         lambda r, k, t, h: provenance.MARK[provenance.of(r, t).state]),
        (Col("provenance_why", "text", "", "why a run is older or unknown"), lambda r, k, t, h: provenance.of(r, t).why),
        (Col("step_ms_median", "number", "ms", "this run's median step time after warm-up", 3),
         lambda r, k, t, h: _num(r.step_ms_median if r.measured[0] is not None else None)),
        (Col("step_ms_p10", "number", "ms", "10th percentile of its step times", 3), lambda r, k, t, h: _num(r.measured[1])),
        (Col("step_ms_p90", "number", "ms", "90th percentile of its step times", 3), lambda r, k, t, h: _num(r.measured[2])),
    ]
    shared = [(col, lambda r, k, t, h, f=f: f(r)) for col, f in _run_common()]
    first, rest = own[:5], own[5:]
    return [*first, *shared[:1], *rest, *shared[1:]]


def runs_frame(root: Path, hosts: Hosts | None = None) -> pd.DataFrame:
    """Every committed record under ROOT's RUN_DIRS, one row each (collection, then folder order)."""
    spec = run_columns()
    hosts = hosts if hosts is not None else Hosts.under(root / "results", "megalab tables")
    rows = [[f(rec, key, root, hosts) for _, f in spec]
            for key, folder in RUN_DIRS.items() for rec in read_records(root / folder, "megalab tables")]
    return _typed(pd.DataFrame(rows, columns=[c.name for c, _ in spec]), [c for c, _ in spec])


# --------------------------------------------------------------------------- rows.csv

def _ref(ctx: Context, exp: catalog.Experiment) -> dict[str, Any]:
    """The published row's figures, typed: memory GB as printed (anchor), GiB, per GPU (two-GPU notes),
    whether it ran out of memory, step time."""
    ref = ctx.ref_row(exp)
    out = {"gb": None, "gib": None, "gpu0": None, "gpu1": None, "oom": False, "ms": ctx.ref_ms(exp)}
    if ref is None:
        return out
    if ctx.kind == "twogpu":
        n = 1 if exp.gpus == 1 else 2
        per = [num(ref[f"mem_mib_gpu{i}"]) for i in range(n)]
        out["gpu0"], out["gpu1"] = [None if v is None else v / 1024 for v in per] + [None] * (2 - n)
        known = [v for v in (out["gpu0"], out["gpu1"]) if v is not None]
        out["gib"] = max(known) if known else None
    else:
        text = str(ref["mem_gb_per_gpu"]).strip()
        out["oom"] = text.lower() == "oom"
        out["gb"] = None if out["oom"] else num(text)
        out["gib"] = None if out["gb"] is None else out["gb"] * REF_GB_TO_GIB
    return out


# What rows.csv takes from the catalog entry rather than the record (and the record's status, which the
# row's own `row_status` carries).
_ROW_OWN = {"status", "gbs", "mbs", "tp", "pp", "cp", "ep", "dp", "seq_length", "model"}


def row_columns() -> list[Col]:
    return [
        Col("chapter", "int", "", "chapter of the catalog"),
        Col("row", "text", "", "published row id (Rn, Tn, ...), ~Rn for a 2-GPU analogue of row Rn, empty for none"),
        Col("target", "text", "", "make target"),
        Col("model", "text", "", "model preset"),
        Col("gpus", "int", "GPUs", "GPUs the target needs"),
        Col("gbs", "int", "sequences", "global batch size"),
        Col("mbs", "int", "sequences", "micro-batch size"),
        *[Col(k, "int", "", f"{k.upper()} degree") for k in ("tp", "pp", "cp", "ep", "dp")],
        Col("seq_length", "int", "tokens", "sequence length"),
        Col("row_status", "text", "", "the row: ok, oom, ... as its record ended, or not run (not run yet / needs N GPUs)"),
        Col("ran", "bool", "", "a record stands in the row"),
        Col("run", "text", "", "the record's run folder (the newest of its repeats)"),
        Col("median_of", "text", "", "the run folders (results/runs/) whose median step times the row's median is "
            "taken over, space-separated: its repeats, else its one run; empty without a record"),
        Col("runs", "int", "runs", "how many runs the row's step time is the median of (0 without one)"),
        Col("runs_lo_ms", "number", "ms", "lowest median step time among those runs", 3),
        Col("runs_hi_ms", "number", "ms", "highest median step time among those runs", 3),
        Col("timed_steps_min", "number", "steps", "fewest steps after warm-up a run of the median timed"),
        Col("timed_steps_max", "number", "steps", "most steps after warm-up a run of the median timed"),
        Col("step_ms", "number", "ms", "the row's step time: the median of its runs' medians", 3),
        Col("step_ms_p10", "number", "ms", "10th percentile of the newest run's step times", 3),
        Col("step_ms_p90", "number", "ms", "90th percentile of the newest run's step times", 3),
        Col("tokens_per_s_per_gpu", "number", "tokens/s", "GBS x seq / step time / GPUs", 1),
        Col("provenance", "text", "", "today, older or unknown (provenance.py); empty without a record"),
        Col("provenance_why", "text", "", "why a row is older or unknown"),
        Col("machine", "text", "", MACHINE),
        *[col for col, _ in _run_common() if col.name not in _ROW_OWN],
        Col("ref_mem_gb_published", "number", "GB (nvidia-smi MiB / 1000)", "published memory per GPU as printed (8x H100 reference)", 2),
        Col("ref_mem_gib", "number", "GiB", "published memory per GPU in GiB (two-GPU notes: the larger GPU)", 3),
        Col("ref_mem_gib_gpu0", "number", "GiB", "published memory of GPU 0 (two-GPU notes)", 3),
        Col("ref_mem_gib_gpu1", "number", "GiB", "published memory of GPU 1 (two-GPU notes)", 3),
        Col("ref_oom", "bool", "", "the published run ran out of memory"),
        Col("ref_step_ms", "number", "ms", "published step time", 3),
        Col("predicted_for", "text", "", "the machine a prediction is for (rows needing more GPUs than the rig lends)"),
        Col("predicted_mem_gib", "number", "GiB", "PREDICTED (not measured) peak memory per GPU: `plan TARGET GPU=h100`", 3),
        Col("predicted_fits", "bool", "", "PREDICTED to fit in the GPU's memory (false also where there is no prediction)"),
        Col("predicted_step_ms", "number", "ms", "PREDICTED (not measured) step time; NaN where predicted not to fit", 3),
    ]


def _row(exp: catalog.Experiment, ctx: Context) -> dict[str, Any]:
    rec = ctx.rec(exp)
    ms = ctx.our_ms(exp)
    steps = cols.timed_steps(rec)
    runs = rec.runs if rec is not None else None
    ref = _ref(ctx, exp)
    est = predicted.predicted(exp)
    tok = cols.tokens_per_s_per_gpu(exp, ms)
    prov = provenance.of(rec, ctx.tree) if rec is not None else None
    out = {
        "chapter": exp.chapter, "row": row_id(exp), "target": exp.id, "model": exp.model, "gpus": exp.gpus,
        "gbs": exp.gbs, "mbs": exp.mbs, "tp": exp.tp, "pp": exp.pp, "cp": exp.cp, "ep": exp.ep, "dp": exp.dp,
        "seq_length": exp.seq_length,
        "row_status": rec.status if rec is not None else cols.not_run_reason(exp), "ran": rec is not None,
        "run": rec.run_dir.name if rec is not None and rec.run_dir else "",
        "median_of": " ".join(r.run_dir.name for r in ctx.runs(exp) if r.run_dir is not None),
        "runs": 0 if ms is None else (runs.n if runs else 1),
        "runs_lo_ms": _num(runs.lo_ms if runs and ms is not None else ms),
        "runs_hi_ms": _num(runs.hi_ms if runs and ms is not None else ms),
        "timed_steps_min": _num(steps[0] if steps else None), "timed_steps_max": _num(steps[1] if steps else None),
        "step_ms": _num(ms), "step_ms_p10": _num(rec.measured[1] if rec else None),
        "step_ms_p90": _num(rec.measured[2] if rec else None), "tokens_per_s_per_gpu": _num(tok),
        "provenance": provenance.MARK[prov.state] if prov else "", "provenance_why": prov.why if prov else "",
        "machine": ctx.hosts.key(rec) if rec is not None else "",
        "ref_mem_gb_published": _num(ref["gb"]), "ref_mem_gib": _num(ref["gib"]), "ref_mem_gib_gpu0": _num(ref["gpu0"]),
        "ref_mem_gib_gpu1": _num(ref["gpu1"]), "ref_oom": ref["oom"], "ref_step_ms": _num(ref["ms"]),
        "predicted_for": predicted.machine_text(exp) if est is not None else "",
        "predicted_mem_gib": _num(est.peak_gib if est is not None else None),
        "predicted_fits": bool(est is not None and est.fits),
        "predicted_step_ms": _num(est.step_ms if est is not None and est.fits else None),
    }
    for col, f in _run_common():
        if col.name not in _ROW_OWN:
            out[col.name] = f(rec) if rec is not None else (False if col.kind == "bool" else
                                                            ("" if col.kind in ("text", "time") else float("nan")))
    return out


def rows_frame(records: dict[str, RunRecord], reference: pd.DataFrame | None, twogpu: pd.DataFrame | None,
               tree: Path, hosts: Hosts | None = None) -> pd.DataFrame:
    """One row per chapter-table row (chapter, then catalog order), from the records the pages read."""
    rows = []
    for chapter in catalog.chapters():
        ctx = context(chapter, records, reference, twogpu, None, tree, hosts)
        rows += [_row(e, ctx) for e in ctx.exps]
    spec = row_columns()
    return _typed(pd.DataFrame(rows, columns=[c.name for c in spec]), spec)


# --------------------------------------------------------------------------- out

def _typed(df: pd.DataFrame, spec: list[Col]) -> pd.DataFrame:
    """Each column in its kind (numbers rounded to their digits)."""
    for col in spec:
        if col.kind in ("number", "int"):
            df[col.name] = pd.to_numeric(df[col.name]).astype("float64" if col.kind == "number" else "int64")
            if col.digits is not None:
                df[col.name] = df[col.name].round(col.digits)
        elif col.kind == "bool":
            df[col.name] = df[col.name].astype(bool)
        else:
            df[col.name] = df[col.name].astype(str)
    return df


def csv_text(df: pd.DataFrame) -> str:
    """The frame as CSV: booleans true/false, NaN empty, plain numbers (no thousands separators)."""
    out = df.copy()
    for name in out.columns:
        if out[name].dtype == bool:
            out[name] = out[name].map({True: "true", False: "false"})
    return out.to_csv(index=False, lineterminator="\n")


def write(root: Path, records: dict[str, RunRecord], reference: pd.DataFrame | None, twogpu: pd.DataFrame | None,
          *, check: bool = False, hosts: Hosts | None = None, rows: pd.DataFrame | None = None) -> list[Path]:
    """results/runs.csv (where ROOT has committed records: not for `make compare`'s pages) and
    results/rows.csv (ROWS where the caller made it already); the paths whose content changed (with check,
    would change)."""
    hosts = hosts if hosts is not None else Hosts.under(root / "results", "megalab tables", records.values())
    rows = rows if rows is not None else rows_frame(records, reference, twogpu, root, hosts)
    outputs = [(root / ROWS_CSV, rows)]
    if (root / RUN_DIRS["runs"]).is_dir():
        outputs.insert(0, (root / RUNS_CSV, runs_frame(root, hosts)))
    return [path for path, df in outputs if markdown.write_if_changed(path, csv_text(df), check=check)]


def read_csv_args(spec: list[Col]) -> dict[str, Any]:
    """pandas.read_csv's arguments that read a file of SPEC's columns as typed: text as text (empty, not
    NaN, where missing), times as UTC datetimes. Numbers and booleans need none."""
    text = [c.name for c in spec if c.kind == "text"]
    return {"dtype": {name: str for name in text}, "keep_default_na": False,
            "na_values": {c.name: [""] for c in spec if c.kind in ("number", "time")},
            "parse_dates": [c.name for c in spec if c.kind == "time"]}


def schema_section() -> list[str]:
    """results/README.md's section on the two files: each column's type, unit and meaning."""
    out = ["## Data", "",
           "Two tidy CSV files for pandas and friends, written by `make tables` with the pages: "
           "[runs.csv](runs.csv), one row per committed run record (every collection: "
           + ", ".join(f"`{k}` = {d}" for k, d in RUN_DIRS.items()) + "), and [rows.csv](rows.csv), one row per "
           "chapter-table row (what the pages show, typed). Numbers are plain numbers in the unit named below "
           "(NaN/empty where missing, never `oom` or a thousands separator: a run's end is its `status`), "
           "booleans `true`/`false`, times ISO 8601 in UTC. `predicted_*` columns are the estimator's "
           "predictions for rows no machine here runs, never measurements. A plain `pd.read_csv` reads the "
           "numbers (int: int64, number: float64) and booleans as typed; read the text columns as text, or a "
           "version such as CUDA's `13.0` becomes a number, and parse the times: "
           "`pd.read_csv('results/runs.csv', dtype={'cuda': str, 'torch': str}, parse_dates=['started'])`, "
           "or with every text column named, `megalab.results.dataset.read_csv_args`.", ""]
    for title, spec in (("runs.csv", [c for c, _ in run_columns()]), ("rows.csv", row_columns())):
        out += [f"### {title}", "",
                *markdown.table(["column", "type", "unit", "meaning"],
                                ([f"`{c.name}`", c.kind, c.unit, c.meaning] for c in spec), None), ""]
    return out[:-1]
