"""The chapter tables' columns: which columns a chapter page has, and each cell as a function of the
catalog entry, the chapter's records and the published tables (tables.py assembles the pages).

Every cell is computed, never typed in: the anchor and two-GPU rows (`row`), the formatting helpers
they share with the other pages (memory, deltas, hardware, runs), and the columns a chapter adds for
its lesson (CHAPTER_COLUMNS: efficiencies, bubble, experts per GPU, ...).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

from megalab.core import catalog, provenance
from megalab.core.gpus import short_gpu_name
from megalab.runtime.memcap import nominal_gb_to_gib
from megalab.core.records import RecordError, RunRecord, num as _num
from megalab.results import alike, predicted
from megalab.results.chapter import (MISSING as _MISSING, REF_GB_TO_GIB, RIG_GPUS, Context, measured as _measured,
                                     reference_kind, row_id as _row_id, runs_behind, scaling_series, virtual_stages)
from megalab.results.hosts import Hosts


NO_REF = "—"  # reference cell of an analogue row: there is no published number


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


def fmt_mem(gib: list[float] | tuple[float, ...]) -> tuple[str, float | None]:
    """(cell, max GiB) for a record's per-GPU peaks."""
    vals = list(gib)
    if not vals:
        return "", None
    top = max(vals)
    if len(vals) > 1 and top - min(vals) > 1.0:
        if len(vals) == 2:
            return " / ".join(_fixed(v, 1) for v in vals), top
        return f"{_fixed(min(vals), 1)}–{_fixed(top, 1)}", top
    return _fixed(top, 1), top


SHARED_NOTE = ("† ran while another run may have shared its machine (its own GPUs, but the machine's CPUs, host "
               "memory and links), as the run records' start and end times and GPU UUIDs show "
               "(megalab/results/hosts.py).")


OVER_CAP_NOTE = ("‡ ended ok under its GPU_MEM_GB cap, yet its NVML peak is above the cap: the cap limits "
                 "PyTorch's allocator (counting the CUDA context), while NCCL's buffers live outside it, so "
                 "on a real card of the cap's size this run may not fit.")


def over_cap_gib(r: RunRecord) -> float | None:
    """GiB by which an ok run's NVML peak exceeds its GPU_MEM_GB cap; None when uncapped or within it."""
    cap = r.gpu_mem_cap
    if r.status != "ok" or cap is None or not r.mem_peak_mib:
        return None
    over = max(r.mem_peak_mib) / 1024 - nominal_gb_to_gib(cap)
    return over if over > 0 else None


def fmt_cap(cap: float | None) -> str:
    """', capped 80 GB' (the cap as the user typed it: 80, not 80.0); '' uncapped."""
    return "" if cap is None else f", capped {cap:g} GB"


def fmt_hardware(r: RunRecord, hosts: Hosts | None = None) -> str:
    """'2x H200, capped 80 GB', with † where another run may have shared its machine (HOSTS; without them,
    the record's own `concurrent`) and ‡ where its peak passed its cap."""
    hw = f"{r.num_gpus}x {short_gpu_name(r.gpu_name)}" if r.num_gpus else short_gpu_name(r.gpu_name)
    hw += fmt_cap(r.gpu_mem_cap)
    if hosts.beside(r) if hosts is not None else r.concurrent:
        hw += " †"  # another run may have shared its machine (see SHARED_NOTE)
    if over_cap_gib(r):
        hw += " ‡"  # peak above its cap (see OVER_CAP_NOTE)
    return hw


def not_run_reason(exp: catalog.Experiment) -> str:
    if exp.gpus > RIG_GPUS:
        return f"not run: needs {exp.gpus} GPUs"
    return "not run yet"


def _status(rec: RunRecord | None, exp: catalog.Experiment, ref_oom: bool) -> str:
    """The status cell: the record's own word (a killed or hung run says so, and has no step time)."""
    if rec is None:
        return not_run_reason(exp)
    st = rec.status
    if st == "oom":
        return "oom (as reference)" if ref_oom else "oom"
    if st == "ok" and ref_oom:
        return "ok (reference: oom)"
    return st


def fmt_runs(rec: RunRecord | None) -> str:
    """'1', or 'n (lo–hi)' across repeated runs (records.repeats); empty without a measured record."""
    if rec is None or _measured(rec)[0] is None:
        return ""
    runs = rec.runs
    return "1" if not runs else f"{runs.n} ({_fixed(runs.lo_ms, 0)}–{_fixed(runs.hi_ms, 0)})"


def timed_steps(rec: RunRecord | None) -> tuple[int, int] | None:
    """(fewest, most) steps after warm-up that a run of the row's median timed; None without a step time."""
    if rec is None or _measured(rec)[0] is None:
        return None
    counts = [r.step_count for r in runs_behind(rec) if r.step_count is not None]
    return (min(counts), max(counts)) if counts else None


def fmt_timed_steps(rec: RunRecord | None) -> str:
    """'22' (every run of the median timed 22 steps), '12–22' where they differ; empty without a step time."""
    steps = timed_steps(rec)
    if steps is None:
        return ""
    return str(steps[0]) if steps[0] == steps[1] else f"{steps[0]}–{steps[1]}"


TIMED_STEPS_NOTE = ("`timed steps` = the steps after warm-up that each of the row's `runs` timed (ITERS less "
                    "WARMUP; a range where the runs differ): `our ms` is the median over those steps of each run, "
                    "then over the runs.")


def _measure_cells(rec: RunRecord | None, ctx: Context) -> dict[str, str]:
    ms, p10, p90, tflops, mfu = _measured(rec)
    return {
        "runs": fmt_runs(rec),
        "timed steps": fmt_timed_steps(rec),
        "provenance": "" if rec is None else provenance.of(rec, ctx.tree).cell,
        "our ms": "" if ms is None else _fixed(ms, 0),
        "our p10–p90 ms": f"{_fixed(p10, 0)}–{_fixed(p90, 0)}" if (p10 is not None and p90 is not None) else "",
        "TFLOP/s/GPU": "" if tflops is None else _fixed(tflops, 0),
        "MFU": "" if mfu is None else f"{_fixed(mfu * 100, 1)}%",
        "hardware": "" if rec is None else fmt_hardware(rec, ctx.hosts),
        "machine": "" if rec is None else ctx.hosts.key(rec),  # the same key on every page (hosts.py)
        "graph": "" if rec is None else alike.graph(rec),
    }


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


OTHER_HOST = "≠host"  # the bench's and data page's ratio of runs of two hosts or codes: not made

OTHER_HOST_NOTE = (f"`{OTHER_HOST}`: the two runs this ratio would divide ran on different machines (the records' "
                   "host and first GPU) or with different code or defaults (their provenance), so it is not given: "
                   "one command's step time moves between machines (results/checks.md, \"Between machines\", "
                   "measures how far on the committed runs), and today's defaults (a CUDA graph) move it more "
                   "(results/bench measures what each changes).")

UNLIKE = "unlike"  # a chapter table's ratio of two rows whose runs are not like for like (alike.py): not made

UNLIKE_NOTE = (f"`{UNLIKE}`: the two rows this ratio would divide did not run like for like: another machine, run "
               "code, FAST levers, CUDA graph, ITERS, WARMUP, precision, cap, layer spec, EXTRA_ARGS or torch / "
               "megatron-core, or another run may have shared the machine (megalab/results/alike.py names the "
               "difference; results/checks.md does for the claims), so it is not given.")


class _OtherHost(Exception):
    pass


def unlike(ctx: Context, a: catalog.Experiment, b: catalog.Experiment) -> list[alike.Difference]:
    """How the runs behind two rows differ in more than their layout ([] when like for like, or a row has
    no record: nothing is divided then)."""
    ra, rb = ctx.runs(a), ctx.runs(b)
    if not (ra and rb) or a.id == b.id:
        return []
    return alike.differences({a.id: ra, b.id: rb}, ctx.hosts, ctx.tree)


def same_host(ctx: Context, a: catalog.Experiment, b: catalog.Experiment) -> bool:
    """Whether a page may divide two rows' step times: their runs are like for like (unlike)."""
    return not unlike(ctx, a, b)


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
    """fn() for our side of a ratio; UNLIKE where its two rows' runs are not like for like."""
    try:
        return fn()
    except _OtherHost:
        return UNLIKE


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
        vals[1] = UNLIKE
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
    b = rec.breakdown_ms if rec is not None else None
    if b is None:
        return None
    return " / ".join(_fixed(v, 0) for v in (b.forward, b.backward, b.optimizer + b.other))


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
                 "runs", "timed steps", "TFLOP/s/GPU", "MFU", "tok/s/GPU"]
TWOGPU_LAYOUT = ["Row", "make target", "idea", "GBS", "MBS"]
TWOGPU_RESULT = ["ref GiB GPU0", "ref GiB GPU1", "our GiB GPU0", "our GiB GPU1", "Δ GiB", "ref ms",
                 "our ms", "Δ ms", "our p10–p90 ms", "runs", "timed steps", "TFLOP/s/GPU", "MFU", "tok/s/GPU"]
# A chapter with rows no machine here runs shows the estimator's prediction for them (predicted.py), each
# column just before our measured one of the same quantity: beside the published figure, never in ours.
PREDICTED = {"predicted GiB": ("our GiB", "our GiB GPU0"), "predicted ms": ("our ms",)}
TAIL = ["hardware", "machine", "graph", "provenance", "status"]
_LEFT = {"Row", "make target", "model", "idea", "hardware", "machine", "graph", "provenance", "status"}
GRAPH_NOTE = ("graph: whether Megatron's full-iteration CUDA graph was on in the row's run (one replay of the whole "
              "step: no per-kernel launch cost). CUDA_GRAPH=auto decides it per row from the memory plan and the "
              "layout (megalab/core/graphs.py), so two rows of one lesson can differ in it: their step times are then "
              "not compared (`unlike` in a ratio column; results/checks.md refuses such a claim).")


def has_predictions(chapter: int) -> bool:
    """Whether a chapter has rows no machine here runs (predicted.wanted): then it has predicted columns."""
    return any(e.chapter == chapter and predicted.wanted(e) for e in catalog.catalog().values())


def columns(chapter: int) -> list[str]:
    """The chapter page's column names, in order."""
    layout, result = (TWOGPU_LAYOUT, TWOGPU_RESULT) if reference_kind(chapter) == "twogpu" else \
        (ANCHOR_LAYOUT, ANCHOR_RESULT)
    extra = chapter_columns(chapter)
    if reference_kind(chapter) == "none":  # nothing published to diff against: no Row, ref or Δ columns
        layout = [c for c in layout if c != "Row"]
        result = [c for c in result if not c.startswith(("ref ", "Δ"))]
    if has_predictions(chapter):
        for name, before in PREDICTED.items():
            at = next(result.index(c) for c in before if c in result)
            result = [*result[:at], name, *result[at:]]
    return [*layout, *(c.name for c in extra if c.where == "layout"), *result,
            *(c.name for c in extra if c.where == "result"), *TAIL]


def align(chapter: int) -> list[str]:
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

    mem_cell, our_mem = fmt_mem(rec.mem_peak_gib) if rec is not None else ("", None)
    ms = _measured(rec)[0]
    cells["our GiB"] = mem_cell
    cells["Δ GiB"] = fmt_delta_gb(our_mem, ref_gib)
    cells["Δ ms"] = fmt_delta_pct(_round(ms) if ms is not None else None, ref_ms)
    cells.update(_measure_cells(rec, ctx))
    cells["status"] = _status(rec, exp, ref_oom)
    return cells


def _per_gpu(vals: list[float] | tuple[float, ...], n: int) -> list[float | None]:
    return [vals[i] if i < len(vals) else None for i in range(n)]


def _twogpu_cells(exp: catalog.Experiment, ctx: Context) -> dict[str, str]:
    rec = ctx.rec(exp)
    ref = ctx.ref_row(exp)
    n = 1 if exp.gpus == 1 else 2
    ref_gib = [None, None] if ref is None else \
        [None if (v := _num(ref[f"mem_mib_gpu{i}"])) is None else v / 1024 for i in range(2)]
    ref_gib = ref_gib[:n] + [None] * (2 - n)
    ours = _per_gpu(() if rec is None else rec.mem_peak_gib, 2)
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
    oom = rec is not None and rec.status == "oom"  # its peak is the card's limit, not its need
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


def predicted_cells(exp: catalog.Experiment) -> dict[str, str]:
    """The estimator's prediction for a row no machine here runs (predicted.py): peak GiB per GPU, with
    `(oom)` where it does not fit in an H100's memory (then no step time), and ms; empty otherwise."""
    est = predicted.predicted(exp)
    if est is None:
        return {name: "" for name in PREDICTED}
    return {"predicted GiB": _fixed(est.peak_gib, 1) + ("" if est.fits else " (oom)"),
            "predicted ms": _fixed(est.step_ms, 0) if est.fits else ""}


def row(exp: catalog.Experiment, ctx: Context) -> dict[str, str]:
    """One row of a chapter's table: column name -> cell text."""
    cells = _twogpu_cells(exp, ctx) if ctx.kind == "twogpu" else _anchor_cells(exp, ctx)
    if has_predictions(ctx.chapter):
        cells.update(predicted_cells(exp))
    tok = tokens_per_s_per_gpu(exp, ctx.our_ms(exp))
    cells["tok/s/GPU"] = "" if tok is None else f"{_round(tok):,.0f}"
    for col in chapter_columns(ctx.chapter):
        cells[col.name] = _cell(col, exp, ctx)
    return cells
