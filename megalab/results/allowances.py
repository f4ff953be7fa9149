"""The memory estimator's allowances (megalab/core/estimate.py), each derived from the calibration
records only, by a rule written down here: what results/estimate-vs-measured.md shows and what
tests/test_estimate.py holds the committed constants to.

An allowance is what the formulas cannot see: memory outside PyTorch's allocator (the CUDA context,
NCCL's buffers), the allocator's slack, ring attention's stranded K/V chunks, the CUDA graph's pool, and
the room CUDA_GRAPH=auto keeps for the graph (megalab/core/graphs.py's margin, the one policy constant here). The
run records measure each of them (NVML's peak less Megatron's max reserved is the memory outside the
allocator; max reserved over max allocated is the slack), so each constant is the calibration set's
figure, rounded by its rule. The held-out and out-of-catalog records never enter: their memory errors
are then out of sample.

The CUDA graph's share under context parallelism (GRAPH_MEMORY_SHARE_CP) is the most any calibration CP
run with the graph needed over the peak predicted without it, rounded up: CUDA_GRAPH=auto graphs CP only
where a micro-batch is small, and refuses the graph where that peak would pass the GPU's capacity.
NOT_DERIVED names an allowance the calibration set cannot give, and the page with it.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable

from megalab.core import estimate as E
from megalab.core import graphs

MIB = 2**20
GIB = 2**30

# Allowances the calibration set cannot give, and where they come from instead (none at present).
NOT_DERIVED: dict[str, str] = {}


def outside_mib(row: dict[str, Any]) -> float | None:
    """NVML memory outside PyTorch's allocator: the peak of the rank whose max reserved runs to the last
    iteration (TensorBoard's series; else the busiest logged rank) less that max reserved."""
    peaks, mem = row["peaks_mib"], row["mem"]
    logged = [r for r in mem if r < len(peaks) and mem[r].get("max_reserved_mb")]
    if not logged:
        return None
    ref = max(logged, key=lambda r: (bool(mem[r].get("to_last_iteration")), mem[r]["max_reserved_mb"]))
    return peaks[ref] - mem[ref]["max_reserved_mb"]


def slacks(row: dict[str, Any]) -> list[float]:
    """Every logged rank's max reserved / max allocated - 1."""
    mem = row["mem"]
    return [m["max_reserved_mb"] / m["max_allocated_mb"] - 1 for r, m in mem.items()
            if r < len(row["peaks_mib"]) and m.get("max_allocated_mb") and m.get("max_reserved_mb")]


def ring_chunks(row: dict[str, Any]) -> float | None:
    """Ring attention's stranded K/V chunks per ring step per layer on the busiest logged rank: its max
    reserved beyond max allocated and the slack, over one chunk per step per layer. None unless the
    run is a p2p ring whose chunks could be told from the slack (at least ALLOCATOR_SLACK of max
    allocated: 604's grouped-query K/V chunks total 32 MiB, below what the allocator's rounding moves)."""
    est, mem = row["est"], row["mem"]
    stage = est.stages[0]
    if est.cp < 2 or not stage.ring_slack_bytes:
        return None
    per_chunk = stage.ring_slack_bytes / E.RING_STRANDED_CHUNKS_PER_STEP / MIB  # one per step per layer
    figures = [(m["max_reserved_mb"] - m["max_allocated_mb"] * (1 + E.ALLOCATOR_SLACK)) / per_chunk
               for r, m in mem.items() if m.get("max_allocated_mb") and m.get("max_reserved_mb")
               and per_chunk >= E.ALLOCATOR_SLACK * m["max_allocated_mb"]]
    return max(figures) if figures else None


def graph_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(target, extra share, extra GiB) of the CUDA graph: per calibration target run both with and
    without it on one GPU kind and count, fast path, cap and extra flags, the median peak with it over
    the median without it."""
    groups: dict[tuple, dict[bool, list[float]]] = {}
    for r in rows:
        groups.setdefault(r["pair_key"], {}).setdefault(r["graph"], []).append(r["meas_gib"])
    out = []
    for key, sides in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if True in sides and False in sides:
            on, off = statistics.median(sides[True]), statistics.median(sides[False])
            out.append((key[0], on / off - 1, on - off))
    return out


# Where the graph's room decides anything: runs whose measured peak used this share of their GPU or more.
NEAR_CAPACITY = 0.85


def graph_room(row: dict[str, Any]) -> float | None:
    """The room a CUDA-graph run near its GPU's capacity needed, as CUDA_GRAPH=auto counts it: its measured
    peak over the estimator's peak without the graph, less 1 (None for other runs)."""
    if not row["graph"] or row["status"] != "ok" or row["meas_gib"] < NEAR_CAPACITY * row["capacity_gib"]:
        return None
    return row["meas_gib"] / row["est"].peak_without_graph_gib - 1


def derive(rows: list[dict[str, Any]]) -> dict[str, tuple[float, str]]:
    """{allowance: (the calibration set's figure, what it is)} from calibration rows (validation_rows,
    status ok); the rules in RULES round each figure into the constant. A figure no calibration run
    measures (a tree with few records) is None: never a made-up number."""
    rows = [r for r in rows if r["status"] == "ok"]

    def med(xs) -> float | None:
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None
    plain = [r for r in rows if not r["graph"] and outside_mib(r) is not None]
    one = [r for r in plain if r["est"].gpus == 1]
    h200 = [r for r in one if "H200" in r["gpu"]]
    context = med(outside_mib(r) for r in h200)  # every multi-GPU calibration run is on H200s
    multi = [r for r in plain if r["est"].gpus > 1 and "H200" in r["gpu"]]

    def nccl(sel: Callable[[Any], bool]) -> float | None:
        return None if context is None else med(outside_mib(r) - context for r in multi if sel(r["est"]))

    def dense(e) -> bool:
        return e.pp == 1 and e.cp == 1 and e.ep == 1 and not e.zero2
    dp, tp = nccl(lambda e: dense(e) and e.tp == 1), nccl(lambda e: dense(e) and e.tp > 1)
    ring = [x for r in rows if (x := ring_chunks(r)) is not None]
    pairs = graph_pairs([r for r in rows if r["est"].cp == 1])  # CP's graph has a share of its own
    cp_graph = [r["meas_gib"] / r["est"].peak_without_graph_gib - 1 for r in rows if r["graph"] and r["est"].cp > 1]
    rooms = [x for r in rows if (x := graph_room(r)) is not None]
    out = {
        "CUDA_CONTEXT_MIB": (med(outside_mib(r) for r in one),
                             f"median memory outside the allocator, {len(one)} 1-GPU runs (MiB)"),
        "NCCL_MIB": (None if dp is None or tp is None else max(dp, tp),
                     f"the larger median over the H200 context ({_mib(context)} MiB) of plain DP ({_mib(dp)}) and "
                     f"plain TP ({_mib(tp)}) runs (MiB)"),
        "NCCL_PP_MIB": (nccl(lambda e: e.pp > 1 and e.virtual_stages == 1),
                        "median over the H200 context, 1F1B pipelines (MiB, NCCL's total)"),
        "NCCL_CP_MIB": (nccl(lambda e: e.cp > 1), "median over the H200 context, context parallelism (MiB, NCCL's total)"),
        # per target first: how often one target was launched (a lever trial's repeats) must not move it
        "ALLOCATOR_SLACK": (med(med(v) for v in _slacks_by_target(rows).values()),
                            f"median over {len(_slacks_by_target(rows))} targets of each target's median max reserved / "
                            f"max allocated - 1 ({sum(len(slacks(r)) for r in rows)} logged ranks)"),
        "RING_STRANDED_CHUNKS_PER_STEP": (med(ring), f"median over {len(ring)} ring-attention runs, busiest rank"),
        "GRAPH_MEMORY_SHARE": (med(p[1] for p in pairs),
                               "median over graph on/off pairs: " + ", ".join(f"{t.split('-')[0]} {s:+.1%}" for t, s, _ in pairs)),
        "GRAPH_MEMORY_MIN_GIB": (min((p[2] for p in pairs), default=None), "the smallest extra of those pairs (GiB)"),
        "GRAPH_MEMORY_SHARE_CP": (max(cp_graph, default=None),
                                  f"the most any of {len(cp_graph)} context-parallel runs with the graph needed: measured "
                                  "peak over the peak predicted without the graph"),
        "GRAPH_MARGIN_SHARE": (max(rooms, default=None),
                               f"CUDA_GRAPH=auto's room: the most any of {len(rooms)} graph runs at "
                               f"{NEAR_CAPACITY:.0%} of their GPU or more needed (measured peak over the peak "
                               "predicted without the graph)"),
    }
    return out


def _slacks_by_target(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        if got := slacks(r):
            out.setdefault(r["target"], []).extend(got)
    return out


def _mib(x: float | None) -> str:
    return "no runs" if x is None else f"{x:.0f}"


def _up(x: float, step: float) -> float:
    return step * math.ceil(x / step)


# The constant from its calibration figure: the context to 100 MiB; NCCL's totals up to 512 MiB steps
# (an allowance errs on the busy side; the pipeline's and CP's are what they add to NCCL_MIB); the allocator's
# slack up to 1% (an allowance too: rounded down it under-predicts the peak of half the targets it came from); the
# graph's share to 1%; the ring's chunks to 0.5; the graph's floor to 0.1 GiB; auto's room for the graph up to 1% (a wrong
# "on" costs an out-of-memory run).
RULES: dict[str, tuple[str, Callable[[float, dict], float]]] = {
    "CUDA_CONTEXT_MIB": ("to 100", lambda x, g: round(x / 100) * 100),
    "NCCL_MIB": ("up to 512", lambda x, g: _up(x, 512)),
    "NCCL_PP_MIB": ("up to 512, less NCCL_MIB", lambda x, g: _up(x, 512) - _up(g["NCCL_MIB"][0], 512)),
    "NCCL_CP_MIB": ("up to 512, less NCCL_MIB", lambda x, g: _up(x, 512) - _up(g["NCCL_MIB"][0], 512)),
    "ALLOCATOR_SLACK": ("up to 1%", lambda x, g: round(_up(x, 0.01), 2)),
    "RING_STRANDED_CHUNKS_PER_STEP": ("to 0.5", lambda x, g: round(x * 2) / 2),
    "GRAPH_MEMORY_SHARE": ("to 1%", lambda x, g: round(x, 2)),
    "GRAPH_MEMORY_MIN_GIB": ("to 0.1", lambda x, g: round(x, 1)),
    "GRAPH_MEMORY_SHARE_CP": ("up to 1%", lambda x, g: round(_up(x, 0.01), 2)),
    "GRAPH_MARGIN_SHARE": ("up to 1%", lambda x, g: round(_up(x, 0.01), 2)),
}
# Where each constant lives: the estimator's, except auto's room, which is the graph policy's.
HOME = {"GRAPH_MARGIN_SHARE": graphs}


def check(rows: list[dict[str, Any]]) -> dict[str, tuple[float, str, str, float, float]]:
    """{allowance: (calibration figure, what it is, rule, the rule's constant, the committed constant)};
    figure and rule's constant None where no calibration run measures it (NCCL_MIB's with it)."""
    got = derive(rows)

    def ruled(k: str, x: float | None) -> float | None:
        needs = ("NCCL_MIB",) if k in ("NCCL_PP_MIB", "NCCL_CP_MIB") else ()
        return None if x is None or any(got[n][0] is None for n in needs) else RULES[k][1](x, got)
    return {k: (x, what, RULES[k][0], ruled(k, x), getattr(HOME.get(k, E), k)) for k, (x, what) in got.items()}
