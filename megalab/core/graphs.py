"""CUDA_GRAPH=auto: Megatron's full-iteration CUDA graph wherever it works and pays.

Without Transformer Engine a small step is mostly kernel launches: the graph replays the whole
forward+backward as one launch. It costs memory (the graph's private pool and static inputs) and it
cannot capture everything. So `auto` turns it on for a layout only when (a) that kind of layout has
been seen to capture, replay, exit and keep loss parity with its graph-off twin on the rig
(results/integrity), and (b) the memory plan leaves room for the graph; otherwise off, with the reason
printed in the preflight and kept in the run record. CUDA_GRAPH=1 forces it on, CUDA_GRAPH=0 off.
"""
from __future__ import annotations

import dataclasses

from megalab.core import flags

# Context parallel: the largest micro-batch (tokens per GPU: MBS x seq / CP) for which auto graphs it. The
# graph saves launches per micro-batch, which matter only where a micro-batch's kernels are small.
CP_GRAPH_MAX_TOKENS = 4096

# Layout features where the graph fails or is unverified, and why (checked in this order).
REFUSED = (
    ("te", "measured without Transformer Engine only; TE brings its own graph paths (--cuda-graph-impl transformer_engine)"),
    ("spec_local", "Megatron's stock local spec stays stock: it is the bench's unmodified baseline"),
    ("profile", "Megatron's per-microbatch timers and the torch profiler need kernels launched one by one"),
    ("moe", "Megatron's MoE token dispatcher synchronises with the host (without the moe_gather lever, with "
            "expert or expert-tensor parallel, or token dropping); capture fails on the rig "
            "(522: 'operation not permitted on an event last recorded in a capturing stream')"),
    ("moe_gpus", "with the moe_gather lever MoE captures and replays on one GPU (510; results/bench, levers tried "
                 "against the default); on several GPUs it is not yet measured: CUDA_GRAPH=1 to try"),
    ("pp_no_vpp", "Megatron's non-interleaved pipeline schedule synchronises the device in its p2p sends, "
                  "which capture forbids (006: cudaErrorStreamCaptureUnsupported in p2p_communication._communicate); "
                  "interleaved (VPP) pipelines capture (489)"),
    ("sp_dropout", "with sequence parallel and dropout the graph-on run drifted from its graph-off twin, its loss "
                   "higher at every later step (004: results/integrity), as if its dropout masks repeated across "
                   "replays; auto leaves the graph off there until that is understood: CUDA_GRAPH=1 to try"),
    ("cp", "with megalab's context-parallel attention the graph captures, keeps loss parity and exits; it pays where "
           "a micro-batch is small and the ring's launches bound it (604: 1024 tokens per GPU), but at 32768 (005, "
           "MBS 64) it gained nothing for +21 GiB (results/integrity), so auto leaves it off above "
           f"{CP_GRAPH_MAX_TOKENS} tokens per GPU per micro-batch: CUDA_GRAPH=1 to try"),
    ("recompute", "recompute trades time for memory and the graph spends it back: on 1x H100 300 captured "
                  "and kept loss parity, but gained 1% (864 vs 874 ms) for +5.1 GiB (results/integrity); "
                  "CUDA_GRAPH=1 to use it"),
    ("multinode", "verified on one node only (CUDA_GRAPH=1 to try)"),
    ("exit_interval", "a run stopped early for a resume check is not verified with the graph"),
)


# Features the graph fails with even when CUDA_GRAPH=1 forces it: refused before launch, with the fix.
FAILS = (
    ("torch_profiler", "the torch profiler's kernel tracing breaks the graph's capture (600 and 101 failed with "
                       "'operation not permitted when stream is capturing')"),
)


@dataclasses.dataclass(frozen=True)
class GraphDecision:
    on: bool
    reason: str

    def line(self) -> str:
        return f"full-iteration CUDA graph: {'on' if self.on else 'off'} ({self.reason})"


# The room auto leaves for the graph, as a share of the predicted peak without it. It has to cover the
# graph's own memory and the estimator's error where that error decides, near the GPU's capacity, so it is
# derived from the calibration records (megalab/results/allowances.py, tests/test_estimate.py): the most
# room any graph run there needed, its measured peak with the graph over the predicted peak without it
# (the margin and its runs: results/estimate-vs-measured.md, GRAPH_MARGIN_SHARE), rounded up to 1%.
GRAPH_MARGIN_SHARE = 0.09
GRAPH_MARGIN_MIN_GIB = 1.0


def graph_memory_gib(predicted_peak_gib: float) -> float:
    """The room auto keeps free for the graph."""
    return max(GRAPH_MARGIN_MIN_GIB, GRAPH_MARGIN_SHARE * predicted_peak_gib)


def decide(requested: str, *, features: set[str], predicted_peak_gib: float | None,
           capacity_gib: float | None, graph_peak_gib: float | None = None) -> GraphDecision:
    """requested: the CUDA_GRAPH variable (auto | 1 | 0); features: names from REFUSED that apply.

    predicted_peak_gib is the estimator's peak per GPU without the graph, which the rule reads (room:
    that peak + graph_memory_gib of it within capacity_gib); capacity_gib is what one GPU may use: the
    GPU_MEM_GB cap, else the GPU's own memory (None when neither is known). graph_peak_gib is the
    estimator's peak with the graph (estimate.py's CUDA graph allowance): the figure an "on" reason
    quotes, so that the preflight's speed line and its peak line print one peak, not two.
    """
    value = (requested or "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return GraphDecision(False, "CUDA_GRAPH=0")
    if value in ("1", "true", "yes", "on"):
        for feature, why in FAILS:
            if feature in features:
                raise ValueError(f"CUDA_GRAPH={requested} with a profile run: {why}; fix: drop CUDA_GRAPH=1 "
                                 "(a profile runs without the graph)")
        return GraphDecision(True, "CUDA_GRAPH=1")
    if value != "auto":
        raise ValueError(f"CUDA_GRAPH={requested} is not auto, 1 or 0; fix: CUDA_GRAPH=auto (the default), 1 or 0")
    for feature, why in REFUSED:
        if feature in features:
            return GraphDecision(False, f"auto: {why}")
    if predicted_peak_gib is None or capacity_gib is None:
        return GraphDecision(False, "auto: no memory plan for this layout or GPU, so no room for the graph is known")
    room = graph_memory_gib(predicted_peak_gib)
    if predicted_peak_gib + room > capacity_gib:  # off: the peak line prints this graph-off peak
        return GraphDecision(False, f"auto: predicted peak {predicted_peak_gib:.1f} GiB without the graph, "
                                    f"{capacity_gib - predicted_peak_gib:.1f} GiB under the {capacity_gib:.1f} GiB "
                                    f"per GPU, where auto wants {room:.1f} GiB for the graph")
    if graph_peak_gib is not None and graph_peak_gib > capacity_gib:  # the graph's own memory would not fit
        return GraphDecision(False, f"auto: predicted peak {predicted_peak_gib:.1f} GiB without the graph, and the "
                                    f"graph's own {graph_peak_gib - predicted_peak_gib:.1f} GiB would take it past the "
                                    f"{capacity_gib:.1f} GiB per GPU")
    if graph_peak_gib is None:
        return GraphDecision(True, f"auto: predicted peak {predicted_peak_gib:.1f} GiB without the graph, "
                                   f"{capacity_gib - predicted_peak_gib:.1f} GiB under the {capacity_gib:.1f} GiB "
                                   f"per GPU, where auto wants {room:.1f} GiB for the graph")
    # on: the peak line prints the peak with the graph, so this quotes that one; what auto keeps beyond
    # the estimate's graph allowance is spare, not another peak
    spare = max(predicted_peak_gib + room - graph_peak_gib, 0.0)
    return GraphDecision(True, f"auto: predicted peak {graph_peak_gib:.1f} GiB with the graph, "
                               f"{capacity_gib - graph_peak_gib:.1f} GiB under the {capacity_gib:.1f} GiB per GPU, "
                               f"where auto wants {spare:.1f} GiB to spare")


# Megatron flags that keep Megatron's own (host-syncing) MoE dispatcher even with moe_gather (moe_dispatch.eligible)
_SYNCING_MOE_FLAGS = ("--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
                      "--moe-router-padding-for-quantization", "--moe-shared-expert-overlap")


def features_of(exp, *, impl: str, spec: str, profile: bool, nnodes: int, exit_interval, fast=(),
                extra_args=()) -> set[str]:
    """The REFUSED features an experiment and its options have (fast: the run's levers; extra_args: EXTRA_ARGS)."""
    gather = ("moe_gather" in fast and exp.ep == 1 and exp.etp == 1
              and not any(a in _SYNCING_MOE_FLAGS for a in (*exp.extra_args, *extra_args)))
    found = {
        "te": impl == "transformer_engine",
        "spec_local": spec != "megalab",
        "profile": profile or bool(getattr(exp, "timing_log_level", 0)),
        "torch_profiler": profile,
        "moe": bool(exp.num_experts) and not gather,
        "moe_gpus": bool(exp.num_experts) and gather and exp.gpus > 1,
        "pp_no_vpp": exp.pp > 1 and not exp.layers_per_virtual_stage,
        "sp_dropout": exp.sp and flags.dropout([*exp.extra_args, *extra_args]) > 0,
        "cp": exp.cp > 1 and exp.mbs * exp.seq_length // exp.cp > CP_GRAPH_MAX_TOKENS,
        "recompute": exp.recompute not in (None, "", "none"),
        "multinode": nnodes > 1,
        "exit_interval": bool(exit_interval),
    }
    return {k for k, v in found.items() if v}
