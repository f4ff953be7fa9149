"""Step time, modelled: GEMMs at a size-dependent efficiency, kernel launches, optimizer memory traffic,
communication by bandwidth and the pipeline bubble (no constant MFU).

Per micro-batch and pipeline stage (the busiest stage sets the pace):

* GPU time: every GEMM of the stage's layers (QKV, projection, fc1, fc2; the experts'; flash
  attention's QK^T and PV; the output layer on the last stage), forward once and backward twice
  (data and weight gradient), recomputed forwards again, each at
  `peak x GEMM_EFF_MAX x mnk / (mnk + GEMM_HALF_MNK)`: a GEMM's efficiency saturates with its size
  M*N*K, so a small batch's GEMMs run far below peak. Plus what tensor/context/expert parallelism
  moves inside the micro-batch (all-reduces, ring K/V, all-to-alls, pipeline sends): bytes over the
  datasheet link bandwidth plus COMM_CALL_US per call, not overlapped; and MOE_LAYER_MS per MoE layer
  (routing and token dispatch, whose host syncs stop the CPU running ahead).
* CPU time: the kernels it launches, KERNELS_PER_LAYER per layer (plus KERNELS_PER_EXPERT per local
  expert without grouped GEMMs) at LAUNCH_US each. The GPU cannot run ahead of its launches, so a
  micro-batch takes max(GPU time, CPU time): a small batch is launch-bound (101: GBS 1).
* The pipeline: (m + (p - 1) / v) micro-batch times per step (1F1B, interleaved with v chunks).
* Per step: the optimizer's HBM traffic (bytes per parameter it updates / HBM bandwidth), the
  data-parallel gradient reduction beyond what the backward pass hides (Megatron overlaps it:
  --overlap-grad-reduce), and STEP_OVERHEAD_MS (grad-norm sync, the optimizer's launches, logging).

The six CONSTANTS are fitted on the calibration records only (fit(); validation.split in megalab/results/validation.py: a fixed hash of
the target id); the held-out records never touch them. The launch counts, bytes per parameter and
bandwidths are hand-derived or datasheet figures, not fitted.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

# ---- fitted on the calibration set (results/validation.py fit_steptime; tests/test_estimate.py re-fits and compares)
GEMM_EFF_MAX = 0.449  # the efficiency a large bf16 GEMM reaches, of the dense peak
GEMM_HALF_MNK = 1.22e10  # M*N*K at which a GEMM reaches half of GEMM_EFF_MAX
LAUNCH_US = 79.0  # CPU time per kernel launch (Python, Megatron, the CUDA driver), microseconds
COMM_CALL_US = 8.48  # latency of one collective or p2p call, beside its bytes over the link
MOE_LAYER_MS = 25.1  # one MoE layer's routing and token dispatch per micro-batch (host syncs, permutes)
STEP_OVERHEAD_MS = 3.58  # per step, besides the optimizer's memory traffic

# ---- hand-derived (not fitted)
# Kernels one layer launches per micro-batch on megalab's TE-free spec, forward + backward: about 22 in
# the forward (2 norms, 4 GEMMs with bias adds, SDPA, 2 bias-dropout-adds of 3 kernels, GeLU, the QKV
# split) and twice that in the backward.
KERNELS_PER_LAYER = 66
KERNELS_PER_EXPERT = 12  # SequentialMLP: fc1, activation, fc2 per expert, forward and backward
# HBM bytes per parameter the optimizer moves per step: fused AdamW reads the fp32 main grad, master
# weight, m and v (16) and writes master, m, v and the bf16 weight (14); torch's foreach AdamW makes
# each elementwise step a pass of its own (about 3x). Every parameter also has its gradient read for the
# norm and zeroed (8) whatever the optimizer shards.
OPT_BYTES_FUSED, OPT_BYTES_FOREACH, GRAD_BYTES = 30, 90, 8
GRAD_REDUCE_BYTES = 4  # Megatron reduces the fp32 main grads (no --grad-reduce-in-bf16)
PARAM_GATHER_BYTES = 2  # ZeRO-2 gathers bf16 weights after the step (--overlap-param-gather)

CONSTANTS = ("GEMM_EFF_MAX", "GEMM_HALF_MNK", "LAUNCH_US", "COMM_CALL_US", "MOE_LAYER_MS", "STEP_OVERHEAD_MS")


@dataclasses.dataclass(frozen=True)
class Features:
    """What the model needs of one layout, before its fitted constants: per stage and micro-batch,
    sum(flops / peak) and sum(flops / (mnk x peak)) over the GEMMs (so GEMM time is
    (a + GEMM_HALF_MNK x b) / GEMM_EFF_MAX), the kernel launches, the communication seconds and calls,
    the MoE layers; per step, the micro-batch slots, the optimizer's and the DP reduction's seconds."""
    a: tuple[float, ...]
    b: tuple[float, ...]
    kernels: tuple[float, ...]
    comm_s: tuple[float, ...]
    calls: tuple[float, ...]  # collective / p2p calls per micro-batch (their latency, COMM_CALL_US)
    moe_layers: tuple[float, ...]  # MoE layers per micro-batch (MOE_LAYER_MS each)
    slots: float  # m + (p - 1) / v
    optimizer_s: float
    dp_comm_s: float


def gemms(sh: Any, *, mbs: int, tp: int, cp: int, ep: int, etp: int, grouped: bool,
          layers: int, last: bool, vocab_padded: int) -> list[tuple[float, float, float]]:
    """(flops, mnk, count) of one stage's GEMMs for one micro-batch's forward (count: how many)."""
    s, h, kv, t = sh.seq // cp, sh.h, sh.kv, tp
    m = mbs * s
    out = [(2 * m * (h + 2 * kv) / t * h, m * (h + 2 * kv) / t * h, layers),  # QKV
           (2 * m * h * h / t, m * h * h / t, layers)]  # projection
    d = h // sh.heads
    bh = mbs * sh.heads / t
    # flash attention, causal: QK^T and PV over half the (s, s * cp) pairs of this rank's queries
    att_flops = 2 * 2 * bh * s * (s * cp) * d / 2
    out.append((att_flops, s * s * cp * d * bh, layers))
    if sh.num_experts:
        local = sh.num_experts / ep
        tokens = m * sh.topk * etp  # this rank's routed copies (the ETP group's tokens gathered)
        f = sh.moe_ffn / etp
        per = tokens / local if not grouped else tokens  # one GEMM per expert, or one grouped GEMM
        out.append((2 * tokens * sh.gate * f * h, per * sh.gate * f * h, layers))  # fc1, all local experts
        out.append((2 * tokens * f * h, per * f * h, layers))  # fc2
    else:
        f = sh.ffn / t
        out.append((2 * m * sh.gate * f * h, m * sh.gate * f * h, layers))
        out.append((2 * m * f * h, m * f * h, layers))
    if last:
        out.append((2 * m * vocab_padded / t * h, m * vocab_padded / t * h, 1))
    return out


def gpu_terms(gemm_list: Iterable[tuple[float, float, float]], peak_flops: float, passes: float) -> tuple[float, float]:
    """(a, b): sum(flops/peak) and sum(flops/(mnk peak)) over the GEMMs, times `passes` (3 for forward and
    backward, 4 with a recomputed forward)."""
    a = b = 0.0
    for flops, mnk, count in gemm_list:
        a += passes * count * flops / peak_flops
        b += passes * count * flops / (mnk * peak_flops)
    return a, b


def step_seconds(f: Features, c: dict[str, float] | None = None) -> float:
    """The model: the busiest stage's micro-batch time (max of GPU and CPU) over the pipeline's slots,
    plus the optimizer, the exposed DP reduction and the per-step overhead. `c`: constants (default:
    this module's, read at call time)."""
    c = fitted() if c is None else c
    per_mb = max(max((a + c["GEMM_HALF_MNK"] * b) / c["GEMM_EFF_MAX"] + comm + calls * c["COMM_CALL_US"] * 1e-6
                     + moe * c["MOE_LAYER_MS"] * 1e-3, k * c["LAUNCH_US"] * 1e-6)
                 for a, b, k, comm, calls, moe in zip(f.a, f.b, f.kernels, f.comm_s, f.calls, f.moe_layers))
    return f.slots * per_mb + f.optimizer_s + exposed(f.dp_comm_s, per_mb) + c["STEP_OVERHEAD_MS"] * 1e-3


def exposed(dp_comm_s, per_mb_s):
    """The DP reduction the last micro-batch's backward (2/3 of it) does not hide."""
    return max(0.0, dp_comm_s - per_mb_s * 2 / 3)


def ring_allreduce_s(nbytes: float, n: int, link_gbps: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / (link_gbps * 1e9)


def one_way_s(nbytes: float, n: int, link_gbps: float) -> float:
    """Reduce-scatter, all-gather or all-to-all: each rank sends (n - 1)/n of its bytes."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / (link_gbps * 1e9)


def loss(features: list[Features], measured_s: list[float], c: dict[str, float]) -> float:
    """Mean |log(predicted / measured)|: a 2x miss weighs the same either way."""
    return sum(abs(math.log(step_seconds(f, c) / m)) for f, m in zip(features, measured_s)) / len(features)


# Where the fit starts, and each constant's allowed range (the fit works on their logarithms).
START = {"GEMM_EFF_MAX": 0.6, "GEMM_HALF_MNK": 1e10, "LAUNCH_US": 20.0, "COMM_CALL_US": 50.0,
         "MOE_LAYER_MS": 5.0, "STEP_OVERHEAD_MS": 20.0}
BOUNDS = {"GEMM_EFF_MAX": (0.05, 1.0), "GEMM_HALF_MNK": (1e6, 1e14), "LAUNCH_US": (1.0, 500.0),
          "COMM_CALL_US": (1.0, 5000.0), "MOE_LAYER_MS": (0.01, 200.0), "STEP_OVERHEAD_MS": (0.1, 500.0)}


def fit(features: list[Features], measured_s: list[float], rounds: int = 12) -> dict[str, float]:
    """The constants minimising loss() over the given records: coordinate descent on each constant's
    logarithm over a shrinking grid (deterministic, no scipy), rounded to 3 significant digits."""
    c = dict(START)
    width = 4.0  # natural-log half-width of the first grid
    for _ in range(rounds):
        for k in CONSTANTS:
            lo, hi = BOUNDS[k]
            centre = math.log(c[k])
            grid = [min(max(centre + width * (i / 8 - 1), math.log(lo)), math.log(hi)) for i in range(17)]
            c[k] = min((math.exp(x) for x in grid), key=lambda v: loss(features, measured_s, {**c, k: v}))
        width *= 0.6
    return {k: float(f"{v:.3g}") for k, v in c.items()}


def fitted() -> dict[str, float]:
    """The constants this module uses (what fit() gave on the calibration set)."""
    return {k: globals()[k] for k in CONSTANTS}
