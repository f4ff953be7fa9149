"""Result tables: one markdown page per chapter, our runs beside the published numbers.

`make tables` (python -m megalab tables) reads every committed run record
(results/runs/*/run.json), picks one per target, and writes each chapter's page
(the `table:` path of configs/experiments/NN-*.yaml, e.g. results/01-dp-zero2.md) with the
figures it links (results/plots/*.svg, megalab/results/plots.py).
Pages are generated, deterministic and only rewritten when their content changes, so
`python -m megalab tables --check` can tell CI whether the committed pages are current.

A chapter is diffed against the published table its YAML names with `reference:`: `anchor`
(default; configs/reference/anchor_8xh100.csv, one memory number per row) or `twogpu`
(configs/reference/twogpu_2xh200.csv, memory per GPU for GPU 0 and GPU 1, kept apart). Each chapter
adds the columns its lesson needs (CHAPTER_COLUMNS: efficiencies, bubble, experts per GPU, ...),
computed from the catalog entry and the records, never typed in.

Public API:
  load_reference()          published 8x H100 numbers, indexed by (chapter, row)
  load_twogpu_reference()   published 2x H200 notes, indexed by row
  load_records(root)        newest usable run record per target
  reference_kind(chapter)   'anchor' or 'twogpu'
  columns(chapter)          the chapter page's column names
  CHAPTER_COLUMNS           chapter -> extra Columns (name, cell function, footnote)
  table_frame(chapter)      one chapter's table as a DataFrame of strings
  render_chapter(chapter)   one chapter's page (markdown text)
  write_tables(root)        write every chapter's page; returns the paths that changed
  cli(argv)                 `python -m megalab tables [--check]`
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from megalab.core import catalog
from megalab.core.paths import ROOT
from megalab.core import logparse, markdown, provenance
from megalab.results import index, plots, quotes
from megalab.results.chapter import (  # noqa: F401  (tables.X kept for callers and tests)
    MISSING as _MISSING, REF_GB_TO_GIB, REFERENCE_DIR, REFERENCE_KINDS, RUNS_DIR, Context, context as _context, load_reference,
    load_twogpu_reference, measured as _measured, reference_kind, row_id as _row_id, scaling_series,
    virtual_stages)
from megalab.core.gpus import nominal_gb_to_gib, short_gpu_name
from megalab.core.markdown import report_changes, write_atomic as _write_atomic  # noqa: F401
from megalab.core.records import (  # noqa: F401
    USABLE, RunRecord, mark_shared, num as _num, read_records, stamp as _stamp)
from megalab.core import records as _records

# The rig these tables are measured on has one or two GPUs; targets needing more are listed
# with their reference numbers and a "not run" status.
RIG_GPUS = 2

NO_REF = "—"  # reference cell of an analogue row: there is no published number

UNIT_NOTE = ("Unit: every memory figure on this page is GiB (2^30 bytes) unless its column says otherwise; "
             "`ref GB (pub.)` is the published figure as printed (nvidia-smi MiB / 1000, see "
             "[configs/reference](../configs/reference/README.md#memory-unit)), `ref GiB` the same "
             "converted (× 1000 / 1024), which Δ compares with.")

FOOTNOTES = [
    "Δ is ours − published: GiB for memory (ours against `ref GiB`), percent of the published step "
    "time for ms (+ means we are slower).",
    "Memory is the peak per GPU over the whole run (GiB, NVML used memory as nvidia-smi shows it), "
    "the largest over the run's GPUs; `a / b` is GPU 0 / GPU 1 where they differ by more than 1 GiB "
    "(`lo–hi` with more GPUs).",
    "Step times are the median over steps after warm-up, with the 10th–90th percentile range of that "
    "run's steps; where a target has several ok runs on one host with the same code and settings, "
    "`our ms` is the median of the runs' medians and `runs` gives their number and range (lowest–highest "
    "median), else `runs` is 1. MFU is TFLOP/s/GPU over the GPU's dense bf16 peak (newest run).",
    "`~Rn` rows are 2-GPU analogues of published row Rn: they show the same trend on fewer GPUs "
    "and have no published number of their own (—).",
]


# --------------------------------------------------------------------------- inputs

def load_records(root: Path | None = None, tree: Path | None = None) -> dict[str, dict]:
    """Newest usable record per target (records.load_records) from ROOT, default results/runs; repeats
    are grouped by host, settings and code as git sees it in TREE (default: this checkout)."""
    tree = Path(tree) if tree is not None else ROOT
    return _records.load_records(Path(root) if root is not None else RUNS_DIR,
                                 lambda r: provenance.setup_key(r, tree))


def _started_key(rec: dict) -> float:
    return _stamp(rec.get("started"))


# --------------------------------------------------------------------------- formatting

def _round(x: float, ndigits: int = 0) -> float:
    """Round half away from zero (so hand-checked numbers agree with the table)."""
    m = 10 ** ndigits
    return math.copysign(math.floor(abs(x) * m + 0.5), x) / m


def _fixed(x: float, ndigits: int) -> str:
    r = _round(x, ndigits)
    if r == 0:
        r = 0.0  # no '-0.0'
    return f"{r:.{ndigits}f}"


def fmt_delta_gb(ours: float | None, ref: float | None) -> str:
    """'+1.2' / '-0.4' / '+0.0'; empty when either side is missing."""
    if ours is None or ref is None:
        return ""
    d = _round(ours, 1) - _round(ref, 1)
    return ("+" if _round(d, 1) >= 0 else "") + _fixed(d, 1)


def fmt_delta_pct(ours: float | None, ref: float | None) -> str:
    """Signed percent of the reference: '+12%', '-3%', '+0%'; empty when either side is missing."""
    if ours is None or ref is None or ref == 0:
        return ""
    pct = int(_round((ours - ref) / ref * 100))
    return f"{pct:+d}%"


def fmt_mem(gib: list | None) -> tuple[str, float | None]:
    """(cell, max GiB) for a record's per-GPU peaks."""
    vals = [v for v in (_num(x) for x in (gib or [])) if v is not None]
    if not vals:
        return "", None
    top = max(vals)
    if len(vals) > 1 and top - min(vals) > 1.0:
        if len(vals) == 2:
            return " / ".join(_fixed(v, 1) for v in vals), top
        return f"{_fixed(min(vals), 1)}–{_fixed(top, 1)}", top
    return _fixed(top, 1), top


SHARED_NOTE = ("† ran on a multi-GPU host while another run used its other GPUs (own GPUs and NVLink "
               "ports, shared CPUs and host memory), as the run records' start and end times show.")


OVER_CAP_NOTE = ("‡ ended ok under its GPU_MEM_GB cap, yet its NVML peak is above the cap: the cap limits "
                 "PyTorch's allocator (counting the CUDA context), while NCCL's buffers live outside it, so "
                 "on a real card of the cap's size this run may not fit.")


def over_cap_gib(rec: dict) -> float | None:
    """GiB by which an ok run's NVML peak exceeds its GPU_MEM_GB cap; None when uncapped or within it."""
    r = RunRecord.of(rec)
    cap = _num(r.gpu_mem_cap)
    if r.status != "ok" or cap is None or not r.mem_peak_mib:
        return None
    over = max(r.mem_peak_mib) / 1024 - nominal_gb_to_gib(cap)
    return over if over > 0 else None


def fmt_hardware(rec: dict) -> str:
    r = RunRecord.of(rec)
    hw = f"{r.num_gpus}x {short_gpu_name(r.gpu_name)}" if r.num_gpus else short_gpu_name(r.gpu_name)
    if r.gpu_mem_cap not in (None, ""):
        hw += f", capped {r.gpu_mem_cap} GB"
    if rec.get("_concurrent"):
        hw += " †"  # shared the host with another run on other GPUs (see SHARED_NOTE)
    if over_cap_gib(rec):
        hw += " ‡"  # peak above its cap (see OVER_CAP_NOTE)
    return hw


def not_run_reason(exp: catalog.Experiment) -> str:
    if exp.gpus > RIG_GPUS:
        return f"not run: needs {exp.gpus} GPUs"
    return "not run yet"


def _status(rec: dict | None, exp: catalog.Experiment, ref_oom: bool) -> str:
    """The status cell: the record's own word (a killed or hung run says so, and has no step time)."""
    if rec is None:
        return not_run_reason(exp)
    st = RunRecord.of(rec).status
    if st == "oom":
        return "oom (as reference)" if ref_oom else "oom"
    if st == "ok" and ref_oom:
        return "ok (reference: oom)"
    return st


def fmt_runs(rec: dict | None) -> str:
    """'1', or 'n (lo–hi)' across repeated runs (records.repeats); empty without a measured record."""
    if rec is None or _measured(rec)[0] is None:
        return ""
    runs = RunRecord.of(rec).runs
    return "1" if not runs else f"{runs['n']} ({_fixed(runs['lo_ms'], 0)}–{_fixed(runs['hi_ms'], 0)})"


def _measure_cells(rec: dict | None, ctx: Context) -> dict[str, str]:
    ms, p10, p90, tflops, mfu = _measured(rec)
    return {
        "runs": fmt_runs(rec),
        "provenance": "" if rec is None else provenance.of(rec, ctx.tree).cell,
        "our ms": "" if ms is None else _fixed(ms, 0),
        "our p10–p90 ms": f"{_fixed(p10, 0)}–{_fixed(p90, 0)}" if (p10 is not None and p90 is not None) else "",
        "TFLOP/s/GPU": "" if tflops is None else _fixed(tflops, 0),
        "MFU": "" if mfu is None else f"{_fixed(mfu * 100, 1)}%",
        "hardware": "" if rec is None else fmt_hardware(rec),
        "machine": "" if rec is None else _machine(rec),  # labelled m1, m2, ... by _frame
    }


def _machine(rec: dict) -> str:
    """The machine a record ran on: its host key (GPU UUID), or without a UUID the host name, GPU and count."""
    r = RunRecord.of(rec)
    key = provenance.host_key(r) or ""
    return key if (r.raw.get("gpu_uuids") or not key) else f"{key} x{r.num_gpus}"


def machine_labels(recs: list[dict]) -> dict[str, str]:
    """host_key -> 'm1', 'm2', ... in the order the machines first ran a row of the page."""
    first: dict[str, str] = {}
    for r in sorted(recs, key=lambda r: r.get("started") or ""):
        key = _machine(r)
        if key and key not in first:
            first[key] = f"m{len(first) + 1}"
    return first


def machine_note(recs: list[dict]) -> str | None:
    """The legend of the machine column: each label's GPUs, GPU UUID and when its rows ran."""
    labels = machine_labels(recs)
    if not labels:
        return None
    parts = []
    for key, label in labels.items():
        mine = [RunRecord.of(r) for r in recs if _machine(r) == key]
        times = sorted(r.started for r in mine if r.started)
        uuids = mine[0].raw.get("gpu_uuids") or []
        end = times[-1][11:16] if times and times[-1][:10] == times[0][:10] else (times[-1][:16].replace("T", " ") if times else "")
        span = f"{times[0][:16].replace('T', ' ')}–{end}" if times else "?"
        on_node = max((r.raw.get("gpus_on_node") or r.num_gpus or 0 for r in mine), default=0)  # the machine's, not a run's
        parts.append(f"{label} = {on_node or '?'}x {short_gpu_name(mine[0].gpu_name or '?')} "
                     + (f"(GPU {uuids[0][:13]}…, rows run {span} UTC)" if uuids else
                        f"(no GPU UUID recorded: rows run {span} UTC, possibly on several machines of that name)"))
    return ("machine: the physical machine of the row's record, by its first GPU's UUID (every rig machine "
            "has the host name `vm`): " + "; ".join(parts) + ". Identical commands differ by 5-23% between "
            "machines: compare step times within one machine (and code) only, as the efficiency columns "
            "and `make check` do.")


# --------------------------------------------------------------------------- chapter-specific columns

@dataclasses.dataclass(frozen=True)
class Column:
    """A column computed from the catalog entry (and, for some, the chapter's other rows/records).

    `cell` returns the cell text, or None for an empty cell; a missing input (KeyError, TypeError, ...)
    also gives an empty cell. `where`: "layout" puts the column after the layout columns, "result"
    after MFU. `note` becomes a footnote of the page.
    """
    name: str
    cell: Callable[[catalog.Experiment, Context], Any]
    right: bool = True
    where: str = "layout"
    note: str | None = None


def _try(fn: Callable[[], Any]) -> str:
    """fn()'s text; empty when it is None or an input is missing (unknown model preset, None, ...)."""
    try:
        v = fn()
    except _MISSING:
        return ""
    return "" if v is None else str(v)


def _cell(col: Column, exp: catalog.Experiment, ctx: Context) -> str:
    return _try(lambda: col.cell(exp, ctx))


def _int_or_1(x: float) -> str:
    """'8' for 8.0, '2.5' for 2.5."""
    return str(int(x)) if float(x).is_integer() else _fixed(x, 1)


def _yes_no(v: Any) -> str:
    return "yes" if v else "no"


def bubble_fraction(exp: catalog.Experiment) -> float | None:
    """Pipeline bubble over ideal compute time, (p - 1) / (v * m); None without a pipeline."""
    if exp.pp <= 1:
        return None
    return (exp.pp - 1) / (virtual_stages(exp) * exp.num_microbatches)


def mlp_up_gmac_per_rank(exp: catalog.Experiment) -> float:
    """Multiply-accumulates of one micro-batch's MLP up-projection (h -> 4h) on one TP rank, in G."""
    h = int(exp.model_cfg["hidden_size"])
    return exp.mbs * exp.seq_length * h * 4 * h / exp.tp / 1e9


def allreduce_mb_per_call(exp: catalog.Experiment) -> float | None:
    """Bytes (MB) of bf16 activations [b, s, h] in one TP all-reduce; None at TP=1 (no all-reduce)."""
    if exp.tp <= 1:
        return None
    return 2 * exp.mbs * exp.seq_length * int(exp.model_cfg["hidden_size"]) / 1e6


OTHER_HOST = "≠host"  # a ratio of two of our rows whose records ran on different hosts: not made

OTHER_HOST_NOTE = (f"`{OTHER_HOST}`: the two runs this ratio would divide ran on different hosts (the records' "
                   "`hostname`) or with different code or defaults (their provenance), so it is not given: "
                   "identical commands differ by 5–23% between hosts, and today's defaults (a CUDA graph) "
                   "change a step by up to 3x.")


class _OtherHost(Exception):
    pass


def same_host(ctx: Context, a: catalog.Experiment, b: catalog.Experiment) -> bool:
    """False when both rows' records name their host and the hosts differ (every launcher-written
    record has `hostname`; a record without one cannot be told apart and is not flagged)."""
    ha, hb = ctx.host(a), ctx.host(b)
    return ha is None or hb is None or ha == hb


def _efficiency(exp: catalog.Experiment, ctx: Context, want: str, ms_of: Callable) -> float | None:
    series = scaling_series(exp, ctx.exps)
    if series is None or series[0] != want:
        return None
    ms = ms_of(exp)
    base_exp = next((e for e in series[1] if e.tp == 1 and ms_of(e) is not None), None)
    base = None if base_exp is None else ms_of(base_exp)
    if ms is None or base is None or ms <= 0:
        return None
    if ms_of == ctx.our_ms and not same_host(ctx, exp, base_exp):
        raise _OtherHost
    return base / ms if want == "weak" else base / (exp.tp * ms)


def _ours(fn: Callable[[], Any]) -> Any:
    """fn() for our side of a ratio; OTHER_HOST where its two runs ran on different hosts."""
    try:
        return fn()
    except _OtherHost:
        return OTHER_HOST


def _ref_and_ours(ref: str | None, ours: str | None) -> str | None:
    if ref is None and ours is None:
        return None
    return f"{ref or NO_REF} / {ours or NO_REF}"


def _pct_or_mark(v: Any) -> str | None:
    return v if isinstance(v, str) or v is None else f"{_fixed(v * 100, 0)}%"


def _weak_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    vals = [_ours(lambda f=f: _efficiency(exp, ctx, "weak", f)) for f in (ctx.ref_ms, ctx.our_ms)]
    return _ref_and_ours(*(_pct_or_mark(v) for v in vals))


def _strong_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    vals = [_ours(lambda f=f: _efficiency(exp, ctx, "strong", f)) for f in (ctx.ref_ms, ctx.our_ms)]
    return _ref_and_ours(*(v if isinstance(v, str) or v is None else _fixed(v, 2) for v in vals))


def _bubble_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    b = bubble_fraction(exp)
    return None if b is None else f"{_fixed(b * 100, 1)}%"


def recompute_baseline(exp: catalog.Experiment, exps: list[catalog.Experiment]) -> catalog.Experiment | None:
    """Chapter 3's full-recompute row at exp's sequence length and GBS, which its speedups are against."""
    return next((e for e in exps if e.recompute.startswith("full") and e.seq_length == exp.seq_length
                 and e.gbs == exp.gbs), None)


def _speedup_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    base = recompute_baseline(exp, ctx.exps)
    if base is None:
        return None
    vals: list[Any] = [(b / ms if (b is not None and ms) else None) for b, ms in
                       ((f(base), f(exp)) for f in (ctx.ref_ms, ctx.our_ms))]
    if vals[1] is not None and not same_host(ctx, base, exp):
        vals[1] = OTHER_HOST
    return _ref_and_ours(*(v if isinstance(v, str) or v is None else f"{_fixed(v, 2)}x" for v in vals))


def _experts_per_gpu(exp: catalog.Experiment, ctx: Context) -> str | None:
    return None if exp.num_experts is None else _int_or_1(exp.num_experts / exp.ep)


_REF_TIMERS = re.compile(r"forward ([\d.]+) ms backward ([\d.]+) ms misc ([\d.]+) ms")


def _ref_timers_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    ref = ctx.ref_row(exp)
    m = _REF_TIMERS.search(str(ref["notes"])) if ref is not None else None
    return None if m is None else " / ".join(m.groups())


def _our_timers_cell(exp: catalog.Experiment, ctx: Context) -> str | None:
    """From this row's profiled run (`make profile-<id>`), whose own record never stands in a row."""
    rec = ctx.records.get(f"profile-{exp.id}")
    b = (rec or {}).get("breakdown_ms")
    if not b:
        return None
    return " / ".join(_fixed(v, 0) for v in (b["forward"], b["backward"], b["optimizer"] + b["other"]))


def _opt(v: Any) -> str | None:
    return None if v is None else str(v)


C_TP = Column("TP", lambda e, c: e.tp)
C_PP = Column("PP", lambda e, c: e.pp)
C_CP = Column("CP", lambda e, c: e.cp)
C_SP = Column("SP", lambda e, c: _yes_no(e.sp), right=False)
C_ZERO2 = Column("ZeRO-2", lambda e, c: _yes_no(e.zero2), right=False)
C_RECOMPUTE = Column("recompute", lambda e, c: e.recompute, right=False)
C_CP_COMM = Column("CP comm", lambda e, c: e.cp_comm, right=False)

CHAPTER_COLUMNS: dict[int, list[Column]] = {
    1: [C_ZERO2],
    2: [C_TP, C_SP, C_RECOMPUTE,
        Column("GMAC/rank (MLP up)", lambda e, c: _fixed(mlp_up_gmac_per_rank(e), 1),
               note="GMAC/rank (MLP up) = b·s·h·4h / TP / 1e9 with b = MBS, s = seq, h = hidden: "
                    "one micro-batch's MLP up-projection on one tensor-parallel rank."),
        Column("all-reduce MB/call", lambda e, c: _opt(None if (v := allreduce_mb_per_call(e)) is None
                                                        else _fixed(v, 1)),
               note="all-reduce MB/call = 2 bytes · b·s·h / 1e6: the bf16 activations of one tensor-parallel "
                    "all-reduce (with SP the same bytes move as a reduce-scatter plus an all-gather); "
                    "empty at TP=1, which has none."),
        Column("weak eff.", _weak_cell, where="result",
               note="weak eff. = TP1 ms / TPN ms within a weak-scaling series (ids 21x/22x with the same "
                    "GBS; the model grows with TP), strong eff. = (TP1 ms / N) / TPN ms within a "
                    "strong-scaling series (ids 23x/24x, same model and GBS); each as `published / ours`, "
                    "— where that side has no step time."),
        Column("strong eff.", _strong_cell, where="result"),
        Column("ref fwd / bwd / misc ms", _ref_timers_cell, where="result"),
        Column("our fwd / bwd / misc ms", _our_timers_cell, where="result",
               note="fwd / bwd / misc ms: Megatron's forward-compute and backward-compute timers per step "
                    "(summed over micro-batches) and the rest of the step (optimizer, communication outside "
                    "them, data), medians after warm-up; ours from `make profile-<id>` (--timing-log-level 2 "
                    "and a torch profiler trace), a run of its own whose slower, synchronised steps never "
                    "stand in the ms column.")],
    3: [C_CP, C_CP_COMM, C_RECOMPUTE,
        Column("speedup vs recompute", _speedup_cell, where="result",
               note="speedup vs recompute = step ms of the full-recompute row with the same sequence length "
                    "and GBS (300 at 4096, 331 at 32768) / this row's step ms, as `published / ours`; — where "
                    "that side has no step time, empty where no such row exists (the reference's 16k rows)."),
        ],
    4: [C_TP, C_SP, C_PP,
        Column("m", lambda e, c: e.num_microbatches),
        Column("v", lambda e, c: _int_or_1(virtual_stages(e))),
        Column("bubble", _bubble_cell,
               note="m = micro-batches per step (GBS / (MBS · DP)), v = virtual stages per GPU (layers per "
                    "pipeline stage / layers per virtual stage, or 1), bubble = (PP − 1) / (v · m): idle "
                    "pipeline time as a percent of the compute time.")],
    5: [Column("experts", lambda e, c: _opt(e.num_experts)),
        Column("top-k", lambda e, c: _opt(e.topk)),
        Column("EP", lambda e, c: e.ep),
        Column("ETP", lambda e, c: e.etp),
        Column("experts/GPU", _experts_per_gpu,
               note="experts/GPU = experts / EP: the experts each GPU holds (ETP splits each of them further)."),
        C_ZERO2],
    6: [C_TP, C_SP, C_PP, C_CP, C_ZERO2],
}


def chapter_columns(chapter: int) -> list[Column]:
    return CHAPTER_COLUMNS.get(chapter, [])


# --------------------------------------------------------------------------- columns

ANCHOR_LAYOUT = ["Row", "make target", "model", "GBS", "MBS", "seq", "GPUs", "DP"]
ANCHOR_RESULT = ["ref GB (pub.)", "ref GiB", "our GiB", "Δ GiB", "ref ms", "our ms", "Δ ms", "our p10–p90 ms",
                 "runs", "TFLOP/s/GPU", "MFU", "tok/s/GPU"]
TWOGPU_LAYOUT = ["Row", "make target", "idea", "GBS", "MBS"]
TWOGPU_RESULT = ["ref GiB GPU0", "ref GiB GPU1", "our GiB GPU0", "our GiB GPU1", "Δ GiB", "ref ms",
                 "our ms", "Δ ms", "our p10–p90 ms", "runs", "TFLOP/s/GPU", "MFU", "tok/s/GPU"]
TAIL = ["hardware", "machine", "provenance", "status"]
_LEFT = {"Row", "make target", "model", "idea", "hardware", "machine", "provenance", "status"}


def columns(chapter: int) -> list[str]:
    """The chapter page's column names, in order."""
    layout, result = (TWOGPU_LAYOUT, TWOGPU_RESULT) if reference_kind(chapter) == "twogpu" else \
        (ANCHOR_LAYOUT, ANCHOR_RESULT)
    extra = chapter_columns(chapter)
    if reference_kind(chapter) == "none":  # nothing published to diff against: no Row, ref or Δ columns
        layout = [c for c in layout if c != "Row"]
        result = [c for c in result if not c.startswith(("ref ", "Δ"))]
    return [*layout, *(c.name for c in extra if c.where == "layout"), *result,
            *(c.name for c in extra if c.where == "result"), *TAIL]


def _align(chapter: int) -> list[str]:
    left = _LEFT | {c.name for c in chapter_columns(chapter) if not c.right}
    return ["left" if c in left else "right" for c in columns(chapter)]


# --------------------------------------------------------------------------- rows

def idea(exp: catalog.Experiment) -> str:
    """Short name of what a target changes: 'baseline', 'DP=2', 'TP=2 + SP', 'CP=2', 'PP=2 m=1', ..."""
    parts = []
    if exp.dp > 1:
        parts.append(f"DP={exp.dp}")
    if exp.tp > 1:
        parts.append(f"TP={exp.tp}" + (" + SP" if exp.sp else ""))
    if exp.cp > 1:
        parts.append(f"CP={exp.cp}")
    if exp.pp > 1:
        v = virtual_stages(exp)
        parts.append(f"PP={exp.pp} m={exp.num_microbatches}" + (f" v={_int_or_1(v)}" if v != 1 else ""))
    if exp.ep > 1:
        parts.append(f"EP={exp.ep}")
    if exp.zero2:
        parts.append("ZeRO-2")
    if exp.recompute != "none":
        parts.append(f"recompute {exp.recompute}")
    return ", ".join(parts) or "baseline"


def _anchor_cells(exp: catalog.Experiment, ctx: Context) -> dict[str, str]:
    rec = ctx.rec(exp)
    ref = ctx.ref_row(exp)
    ref_mem_text = "" if ref is None else str(ref["mem_gb_per_gpu"]).strip()
    ref_oom = ref_mem_text.lower() == "oom"
    ref_mem = None if ref_oom else _num(ref_mem_text)
    ref_ms = ctx.ref_ms(exp)

    cells = {
        "Row": _row_id(exp), "make target": exp.id, "model": exp.model,
        "GBS": str(exp.gbs), "MBS": str(exp.mbs), "seq": _try(lambda: exp.seq_length),
        "GPUs": str(exp.gpus), "DP": str(exp.dp),
    }
    ref_gib = None if ref_mem is None else ref_mem * REF_GB_TO_GIB
    if exp.ref:
        cells["ref GB (pub.)"] = "oom" if ref_oom else ("" if ref_mem is None else ref_mem_text)
        cells["ref GiB"] = "oom" if ref_oom else ("" if ref_gib is None else _fixed(ref_gib, 1))
        cells["ref ms"] = "" if ref_ms is None else _fixed(ref_ms, 0)
    elif exp.analogue_of:
        cells["ref GB (pub.)"] = cells["ref GiB"] = cells["ref ms"] = NO_REF
    else:
        cells["ref GB (pub.)"] = cells["ref GiB"] = cells["ref ms"] = ""

    mem_cell, our_mem = fmt_mem(rec.get("mem_peak_gib")) if rec is not None else ("", None)
    ms = _measured(rec)[0]
    cells["our GiB"] = mem_cell
    cells["Δ GiB"] = fmt_delta_gb(our_mem, ref_gib)
    cells["Δ ms"] = fmt_delta_pct(_round(ms) if ms is not None else None, ref_ms)
    cells.update(_measure_cells(rec, ctx))
    cells["status"] = _status(rec, exp, ref_oom)
    return cells


def _per_gpu(values: Any, n: int) -> list[float | None]:
    vals = list(values) if isinstance(values, (list, tuple)) else []
    return [_num(vals[i]) if i < len(vals) else None for i in range(n)]


def _twogpu_cells(exp: catalog.Experiment, ctx: Context) -> dict[str, str]:
    rec = ctx.rec(exp)
    ref = ctx.ref_row(exp)
    n = 1 if exp.gpus == 1 else 2
    ref_gib = [None, None] if ref is None else \
        [None if (v := _num(ref[f"mem_mib_gpu{i}"])) is None else v / 1024 for i in range(2)]
    ref_gib = ref_gib[:n] + [None] * (2 - n)
    ours = _per_gpu(None if rec is None else rec.get("mem_peak_gib"), 2)
    ref_ms = ctx.ref_ms(exp)
    ms = _measured(rec)[0]

    cells = {"Row": _row_id(exp), "make target": exp.id, "idea": _try(lambda: idea(exp)),
             "GBS": str(exp.gbs), "MBS": str(exp.mbs)}
    for i in range(2):
        if exp.analogue_of and not exp.ref:
            cells[f"ref GiB GPU{i}"] = NO_REF if i < n else ""
        else:
            cells[f"ref GiB GPU{i}"] = "" if ref_gib[i] is None else _fixed(ref_gib[i], 1)
        cells[f"our GiB GPU{i}"] = "" if ours[i] is None else _fixed(ours[i], 1)
    oom = rec is not None and rec.get("status") == "oom"  # its peak is the card's limit, not its need
    deltas = ["" if oom else fmt_delta_gb(ours[i], ref_gib[i]) for i in range(n)]
    cells["Δ GiB"] = " / ".join(d or NO_REF for d in deltas) if any(deltas) else ""
    if exp.ref:
        cells["ref ms"] = "" if ref_ms is None else _fixed(ref_ms, 0)
    else:
        cells["ref ms"] = NO_REF if exp.analogue_of else ""
    cells["Δ ms"] = fmt_delta_pct(_round(ms) if ms is not None else None, ref_ms)
    cells.update(_measure_cells(rec, ctx))
    cells["status"] = _status(rec, exp, False)
    return cells


def tokens_per_s_per_gpu(exp: catalog.Experiment, step_ms: float | None) -> float | None:
    """GBS x seq / step time / GPUs: the throughput Megatron-Bridge and torchtitan report."""
    if not step_ms:
        return None
    return exp.gbs * exp.seq_length / (step_ms / 1000) / exp.gpus


TOKENS_NOTE = ("tok/s/GPU = GBS × seq / our median step time / GPUs: tokens trained per second per GPU "
               "(the unit Megatron-Bridge and torchtitan report).")


def _row(exp: catalog.Experiment, ctx: Context) -> dict[str, str]:
    cells = _twogpu_cells(exp, ctx) if ctx.kind == "twogpu" else _anchor_cells(exp, ctx)
    tok = tokens_per_s_per_gpu(exp, ctx.our_ms(exp))
    cells["tok/s/GPU"] = "" if tok is None else f"{_round(tok):,.0f}"
    for col in chapter_columns(ctx.chapter):
        cells[col.name] = _cell(col, exp, ctx)
    return cells


def _ours_sentence(recs: list[dict]) -> str:
    typed = [RunRecord.of(r) for r in recs]
    gpus = sorted({short_gpu_name(r.gpu_name) for r in typed if r.gpu_name})
    impls = {r.transformer_impl for r in typed}
    impls.discard(None)
    if "transformer_engine" in impls:
        te = "with Transformer Engine" if impls == {"transformer_engine"} else \
            "with and without Transformer Engine (see each run.json)"
    else:
        te = "without Transformer Engine"
    where = " and ".join(gpus) if gpus else "our rig (no runs recorded yet)"
    return (f"ours on {where}, {te}, on mock data, timing the median step after warm-up and reading "
            "nvidia-smi-style peak memory per GPU through NVML")


SOURCES = {
    "anchor": (
        "configs/reference/anchor_8xh100.csv",
        "Published numbers are from the tutorial series \"Megatron, Transformed!\" (Chua, 2025) on "
        "8x H100 80GB with Megatron core_r0.14 and Transformer Engine "
        "([configs/reference](../configs/reference/README.md))"),
    "none": ("configs/experiments", "No published table to compare with: every row is our own measurement, "
             "\"not run yet\" until it is run"),
    "twogpu": (
        "configs/reference/twogpu_2xh200.csv",
        "Published numbers are from the same author's 2x H200 notes (Chua, 2025: public notes on "
        "tinkering with model parallelism on GPT-2 large, by the author of \"Megatron, Transformed!\") "
        "on 2x H200 141GB with NVLink, NGC PyTorch 25.06 and Transformer Engine "
        "([configs/reference](../configs/reference/README.md))"),
}

TWOGPU_UNIT_NOTE = ("Unit: every memory figure on this page is GiB (2^30 bytes); the published figures are "
                    "nvidia-smi MiB as printed in the notes, divided by 1024 here.")

TWOGPU_FOOTNOTES = [
    "Δ is ours − published: GiB per GPU (`GPU 0 / GPU 1`) for memory (none for a run that ran out of "
    "memory: its peak is the card's limit), percent of the published step time for ms (+ means we are "
    "slower).",
    "Memory is the peak of each GPU over the whole run in GiB, GPU 0 and GPU 1 side by side and never "
    "merged (with PP=2 the two stages hold different layers and activations): published numbers are "
    "nvidia-smi MiB / 1024, ours NVML used memory (what nvidia-smi shows) / 1024.",
    "The published step time is the mean of the two logged iterations shown in the notes; ours is the "
    "median over steps after warm-up, with the 10th–90th percentile range. MFU is TFLOP/s/GPU over the "
    "GPU's dense bf16 peak.",
    "The published runs used Transformer Engine, ours Megatron with megalab's TE-free layers, so Δ "
    "includes the difference between the two implementations.",
]


def _frame(ctx: Context) -> pd.DataFrame:
    cols = columns(ctx.chapter)
    df = pd.DataFrame([_row(e, ctx) for e in ctx.exps], columns=cols, dtype=str)
    labels = machine_labels([ctx.records[t] for t in df["make target"] if t in ctx.records])
    df["machine"] = df["machine"].map(lambda k: labels.get(k, ""))
    return df


def table_frame(chapter: int, records: dict[str, dict] | None = None,
                reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                exps: list[catalog.Experiment] | None = None, tree: Path | None = None) -> pd.DataFrame:
    """The chapter's table as a DataFrame of strings (one row per target, catalog order).

    `exps` replaces the catalog's targets of the chapter (tests build their own Experiments); `tree`
    is the checkout whose git history judges each record's code (default: this one).
    """
    return _frame(_context(chapter, records, reference, twogpu, exps, ROOT if tree is None else Path(tree)))


def render_chapter(chapter: int, records: dict[str, dict] | None = None,
                   reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                   block_only: bool = False, tree: Path | None = None) -> str:
    """Markdown page for one chapter: title, provenance sentence, table, footnotes.

    block_only: just the provenance sentence, table and footnotes (what tutorials embed).
    tree: the checkout whose git history judges each record's code (default: this one).
    """
    meta = catalog.chapters()[chapter]
    ctx = _context(chapter, records, reference, twogpu, None, ROOT if tree is None else Path(tree))
    df = _frame(ctx)
    targets = set(df["make target"])
    recs = [ctx.records[t] for t in sorted(targets & set(ctx.records))]
    table = "\n".join(markdown.table(list(df.columns), df.itertuples(index=False), _align(chapter), padded=True))
    source_file, published = SOURCES[ctx.kind]
    if ctx.kind == "twogpu":
        notes = list(TWOGPU_FOOTNOTES)
        ref_notes = [f"{e.ref}: {ref['notes']}" for e in ctx.exps
                     if (ref := ctx.ref_row(e)) is not None and isinstance(ref["notes"], str) and ref["notes"]]
        if ref_notes:
            notes.append("Published notes: " + ". ".join(ref_notes) + ".")
    elif ctx.kind == "none":
        notes = FOOTNOTES[1:]  # no Δ
    else:
        notes = list(FOOTNOTES)
    notes += [TOKENS_NOTE] + [c.note for c in chapter_columns(chapter) if c.note]
    notes.append(provenance.LEGEND)
    if note := machine_note(recs):
        notes.append(note)
    if any(OTHER_HOST in str(v) for v in df.values.ravel()):
        notes.append(OTHER_HOST_NOTE)
    if any(r.get("_concurrent") for r in recs):
        notes.append(SHARED_NOTE)
    if any(over_cap_gib(r) for r in recs):
        notes.append(OVER_CAP_NOTE)
    unit = UNIT_NOTE if ctx.kind == "anchor" else TWOGPU_UNIT_NOTE
    block = "\n".join([published + "; " + _ours_sentence(recs) + ".", "", unit, "", table, "",
                          *(f"- {note}" for note in notes)])
    if block_only:
        return block + "\n"
    lines = [
        f"# Chapter {chapter}: {meta.get('title', '')}".rstrip(),
        "",
        f"<!-- generated by `make tables` from results/runs/*/run.json and {source_file}; "
        "do not edit by hand -->",
        "",
        block,
    ]
    if figures := plots.page_links(ctx, meta["table"]):
        lines += ["", *figures]
    if meta.get("tutorial") and (catalog.ROOT / meta["tutorial"]).exists():
        lines += ["", f"Tutorial: [{meta['tutorial']}](../{meta['tutorial']}). "
                      "Run a row with `make <make target>`, then `make tables`."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- output

class NotToday(Exception):
    """STRICT: rows whose records are not today's code and defaults (one line, naming them)."""


def not_today(records: dict[str, dict], tree: Path) -> dict[str, list[str]]:
    """Provenance cell ('older (schema 1)', ...) -> the short ids of the catalog rows whose record has
    it, for every row that is not provenance CURRENT, in catalog order."""
    out: dict[str, list[str]] = {}
    for exp in catalog.catalog().values():
        rec = records.get(exp.id)
        if rec is not None and (p := provenance.of(rec, tree)).state != provenance.CURRENT:
            out.setdefault(p.cell, []).append(exp.id.split("-", 1)[0])
    return out


def write_tables(root: Path | None = None, *, check: bool = False, strict: bool = False,
                 records: dict[str, dict] | None = None, index_page: dict | None = None) -> list[Path]:
    """Write every chapter's table page (and its CSV, same rows) under ROOT; return the paths whose
    content changed.

    Records come from ROOT/results/runs unless given (`compare`: the committed ones and an outdir's);
    a file whose content is unchanged is not touched. With check=True nothing is written and the
    returned paths are those that *would* change. With strict=True nothing is written when a row's
    record is not today's code and defaults (NotToday).
    """
    root = Path(root) if root is not None else ROOT
    records = load_records(root / "results" / "runs", root) if records is None else records
    if strict and (rows := not_today(records, root)):
        n = sum(len(ids) for ids in rows.values())
        raise NotToday(f"{n} row(s) come from other code or other defaults than today's: "
                       + "; ".join(f"{why}: {' '.join(ids)}" for why, ids in rows.items()) + "; fix: re-run them with `make <target>` (plain, no FAST/CUDA_GRAPH/"
                       "EXTRA_ARGS/WARMUP) and commit the records, or build without STRICT=1")
    reference, twogpu = load_reference(), load_twogpu_reference()
    # the pages link these figures: drawn first, so no link is ever dangling
    changed = plots.write_plots(root, records=records, check=check)
    frames = {}
    for chapter, meta in catalog.chapters().items():
        path = root / meta["table"]
        frames[chapter] = table_frame(chapter, records, reference, twogpu=twogpu, tree=root)
        csv_text = frames[chapter].to_csv(index=False, lineterminator="\n")
        for path, text in ((path, render_chapter(chapter, records, reference, twogpu=twogpu, tree=root)),
                           (path.with_suffix(".csv"), csv_text)):  # the same rows, machine-readable
            try:
                old = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                old = None
            if old == text:
                continue
            if not check:
                markdown.write_atomic(path, text)
            changed.append(path)
    changed += index.write(root, frames, check=check, **(index_page or {}))  # results/README.md
    blocks = {ch: render_chapter(ch, records, reference, twogpu=twogpu, block_only=True, tree=root)
              for ch in catalog.chapters()}
    for path in sorted((root / "tutorials").glob("*.md")):
        old = path.read_text(encoding="utf-8")
        try:  # the chapter tables, then the prose's quoted cells (quotes.py)
            text, moved = quotes.fill(embed_tables(old, blocks), lambda t: table_row(frames, t))
        except quotes.QuoteError as e:
            raise quotes.QuoteError(f"{path.relative_to(root)}: {e}") from None
        for line in moved:
            print(f"megalab tables: {path.relative_to(root)}: {line}: re-read the sentence around it")
        if text != old:
            if not check:
                markdown.write_atomic(path, text)
            changed.append(path)
    return changed


def table_row(frames: dict[int, pd.DataFrame], target: str) -> dict[str, str] | None:
    """TARGET's row (a catalog id, short or full) in its chapter's table, column -> cell; None if none."""
    try:
        exp = catalog.get(target)
    except catalog.CatalogError:
        return None
    frame = frames.get(exp.chapter)
    rows = frame[frame["make target"] == exp.id] if frame is not None else None
    return None if rows is None or rows.empty else {k: str(v) for k, v in rows.iloc[0].items()}


EMBED = re.compile(r"(<!-- megalab:table chapter=(\d+) -->\n)(.*?)(<!-- /megalab:table -->)", re.S)


def embed_tables(text: str, blocks: dict[int, str]) -> str:
    """Replace what sits between a tutorial's table markers with the chapter's current table."""
    def fill(m: re.Match) -> str:
        chapter = int(m.group(2))
        body = blocks.get(chapter, f"(no chapter {chapter} in the catalog)\n")
        return m.group(1) + body + m.group(4)

    return EMBED.sub(fill, text)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if any table is out of date (for CI)")
    ap.add_argument("--strict", action="store_true",
                    help="refuse (exit 1, write nothing) if a row's record is not today's code and defaults "
                         "(make tables STRICT=1)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Rebuild results/*.md from results/runs/*/run.json."""
    root = args.root
    try:
        changed = write_tables(root, check=args.check, strict=args.strict)
    except (NotToday, quotes.QuoteError) as e:
        print(f"megalab tables: {e}", file=sys.stderr)
        return 1
    # committed raw logs and TensorBoard event files are kept gzipped (4-7x smaller: the checkout stays
    # small enough to copy to a GPU machine); every reader takes either (logparse.log_file, estimate._events)
    if args.check:
        changed += logparse.plain_logs(root / "results")
    elif gz := logparse.compress_logs(root / "results"):
        print(f"megalab tables: gzipped {len(gz)} raw log(s) under results/ (logs.txt and TensorBoard events -> .gz)")
    n = len(catalog.chapters())
    return report_changes(changed, root, check=args.check, what="tables", fix="run `make tables`",
                          detail=f" ({n} file{'s' * (n != 1)})")

