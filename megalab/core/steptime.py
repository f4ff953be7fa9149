"""Step time, modelled: GEMMs at a size-dependent efficiency, kernel launches, optimizer memory traffic,
communication by bandwidth and the pipeline bubble (no constant MFU).

Per micro-batch and pipeline stage (the busiest stage sets the pace):

* GPU time: every GEMM of the stage's layers (QKV, projection, fc1, fc2; the experts'; flash
  attention's QK^T and PV; the output layer on the last stage), forward once and backward twice
  (data and weight gradient), recomputed forwards again, each at
  `peak x GEMM_EFF_MAX x mnk / (mnk + GEMM_HALF_MNK)`: a GEMM's efficiency saturates with its size
  M*N*K, so a small batch's GEMMs run far below peak. Plus the memory-bound kernels beside them, by
  their HBM bytes over the datasheet bandwidth: ELEMENTWISE_BYTES per token, hidden unit and layer
  (norms, activation, dropout-adds, casts and copies: 119 of the 374 GPU ms of row 111's profile in
  results/bench, which GEMM_EFF_MAX used to stand in for; the share ELEMENTWISE_OUTSIDE_TP of it acts
  on the whole hidden state, which tensor parallelism splits only with SP), and those the fast path's
  levers change: the layer's norms, bias-GeLU, bias-dropout-adds and QKV split where megalab's kernels do not run
  (TORCH_NORM_BYTES or TORCH_RMSNORM_BYTES, RESIDUAL_ADD_BYTES, BIAS_GELU_BYTES, DROPOUT_ADD_BYTES, QKV_CAT_BYTES
  per token, hidden unit and layer: none with triton_norm, norm_residual, bias_gelu, dropout_add, qkv_pack), the
  loss over the logits (LOSS_BYTES_PER_LOGIT, or LOSS_BYTES_PER_LOGIT_BF16_CE with bf16_ce), the QKV bias added
  in a pass of its own (BIAS_ADD_BYTES, none with addmm_bias or without biases), each weight gradient's
  add into the fp32 main_grad (WGRAD_ADD_BYTES per parameter and micro-batch, none with fused_wgrad) and
  the rotary embedding of a RoPE model (ROPE_BYTES, or ROPE_BYTES_COMPILED with compiled_rope), and the word
  embedding's dense gradient (EMBED_GRAD_BYTES per table entry and micro-batch, none with embed_wgrad on an
  untied table), and grouped-query attention's repeated K/V (GQA_REPEAT_BYTES, none with sdpa_gqa). Plus what
  tensor/context/expert parallelism moves inside the micro-batch (all-reduces, ring K/V, all-to-alls,
  pipeline sends): bytes over the datasheet link bandwidth plus COMM_CALL_US per call (the host's part
  of a call: none under the CUDA graph, which replays the collectives with the kernels), not
  overlapped; and MOE_LAYER_MS per MoE layer (routing and token dispatch, whose host syncs stop the
  CPU running ahead). With the moe_gather lever (issue 63: a dispatcher of GPU gathers, no host sync on
  the tokens per expert) that fitted lump gives way to what such a layer moves: its routed copies'
  gathers, combine and activation by HBM bytes (MOE_ROUTED_BYTES, MOE_ACT_BYTES), every expert
  weight's gradient added into main_grad each micro-batch (EXPERT_GRAD_BYTES with expert_stack, else
  the stacking copies and per-expert adds, EXPERT_UNSTACKED_BYTES) and MOE_GATHER_LAYER_MS of router
  and index bookkeeping per layer; see `moe_gather_seconds`.
* CPU time: the kernels it launches, KERNELS_PER_LAYER per layer (plus KERNELS_PER_EXPERT per local
  expert without grouped GEMMs) at LAUNCH_US each. The GPU cannot run ahead of its launches, so a
  micro-batch takes max(GPU time, CPU time): a small batch is launch-bound (101: GBS 1). Except where the
  step still syncs with the host inside its layers (MoE under moe_gather without the CUDA graph: the
  router's and grouped GEMM's stream syncs, 66 a step in row 510's profile): each sync lets the GPU
  drain, so host and GPU overlap only in part, and the micro-batch takes sqrt(GPU^2 + CPU^2), between
  the max and the sum.
* The pipeline: (m + (p - 1) / v) micro-batch times per step (1F1B, interleaved with v chunks).
* Per step: the optimizer's HBM traffic (bytes per parameter it updates / HBM bandwidth; OPT_BYTES_PER_TENSOR
  more without flat_adam), the
  data-parallel gradient reduction beyond what the backward pass hides (Megatron overlaps it:
  --overlap-grad-reduce), and STEP_OVERHEAD_MS (grad-norm sync, the optimizer's launches, logging).

The seven CONSTANTS are fitted on the calibration records only (fit(); megalab/results/validation.py:
a fixed hash of the target id, plus the out-of-catalog runs made before the constants' freeze,
STEPTIME_FROZEN_AT there); the held-out records never touch them. The launch counts, bytes per
parameter and per logit and bandwidths are hand-derived, microbenchmarked or datasheet figures, not
fitted.

Why the memory-bound terms (issue 33): with only GEMMs, GEMM_EFF_MAX priced every non-GEMM kernel as
if it scaled with FLOPs, so the model could not see a lever that removes such work and leaves the
FLOPs alone. bf16_ce and addmm_bias do exactly that: since they became defaults the model read the
1-GPU H100 runs with them about 7% high and those of the older fast path about 0% (the terms' effect is
measured again on every build of results/estimate-vs-measured.md, "What the levers' terms explain").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

# ---- fitted on the calibration set (results/validation.py fit_steptime; tests/test_estimate.py re-fits and compares)
GEMM_EFF_MAX = 0.611  # the efficiency a large bf16 GEMM reaches, of the dense peak
GEMM_HALF_MNK = 3.07e9  # M*N*K at which a GEMM reaches half of GEMM_EFF_MAX
LAUNCH_US = 74.5  # CPU time per kernel launch (Python, Megatron, the CUDA driver), microseconds
COMM_CALL_US = 100.0  # the host's time per collective or p2p call outside a CUDA graph, beside its bytes
MOE_LAYER_MS = 24.8  # one MoE layer's routing and token dispatch per micro-batch (host syncs, permutes)
STEP_OVERHEAD_MS = 9.69  # per step, besides the optimizer's memory traffic
ELEMENTWISE_BYTES = 163.0  # HBM bytes the non-GEMM kernels no lever changes move per token, hidden unit and layer

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
# Without flat_adam (a distributed optimizer always runs without it) fused AdamW walks Megatron's per-tensor list and
# Megatron then copies each master into its bf16 weight, a kernel per tensor: 21.35 against flat_adam's 15.79 ms
# a step over GPT-2 XL's 1.56e9 parameters (results/bench/flat-adam-microbench.txt, no clip), 12 bytes a parameter
# more at 3.35 TB/s.
OPT_BYTES_PER_TENSOR = 12
# Clipping by total norm (every catalog run clips: early gradients are far above --clip-grad 1.0) scales
# each fp32 gradient in a pass of its own, a read and a write (8); with clip_in_adam fused AdamW's kernel
# divides by the coefficient and writes the unscaled gradient back, as it does for GradScaler (4).
CLIP_BYTES, CLIP_BYTES_IN_ADAM = 8, 4
# The loss over the [tokens, vocabulary/TP] logits, forward and backward, per logit: Megatron's
# vocab_parallel_cross_entropy (fp32 copy, max, exp, sum, divide, the fp32 gradient and its bf16 cast)
# 15.80 ms and megalab's bf16_ce (three fused passes over the bf16 logits) 2.39 ms for 15360 x 50304
# logits on an H100 (results/bench/mb-loss-and-bias.txt): 68 and 10 bytes at its 3.35 TB/s.
LOSS_BYTES_PER_LOGIT, LOSS_BYTES_PER_LOGIT_BF16_CE = 68, 10
# Without addmm_bias the QKV projection's bias is a bf16 add of its own over the [tokens, (h + 2kv)/TP]
# output in every forward (the recomputed one too): 4 bytes per element by hand (read, write), but a
# broadcast add runs well below the datasheet bandwidth: row 111's profile (results/bench) has the 48
# CUDAFunctor_add<BFloat16> calls addmm_bias removed at 9.33 ms for 48 x 15360 x 4800 elements, 8.8 bytes
# each at 3.35 TB/s (the microbenchmark's 15360 x 4800 add: 8.5). The effective figure, as the loss's.
BIAS_ADD_BYTES = 9
# Without fused_wgrad every weight's gradient is written in bf16 by its GEMM and then added into the fp32
# main_grad by a kernel of its own, once per micro-batch; with it the GEMM adds in its epilogue. Net bytes
# per parameter per micro-batch the lever saves, from the kernels alone (results/bench/fused-wgrad-microbench.txt:
# row 111's weight-gradient GEMMs and adds, 69.6 ms unfused vs 65.6 fused, over its 1.56e9 weights at
# 3.35 TB/s: 8.6). Counted for every parameter of a stage (the word embedding's add stays: a slight overcount).
WGRAD_ADD_BYTES = 8.6
# Without compiled_rope, Megatron's unfused RoPE runs about ten kernels each way over the rotated query and
# key channels of every layer: row 600's profile (results/bench, "Where a step goes") has its
# concatenations, strided elementwise kernels and bf16 adds at 20.5 ms per step over 16 layers x 16384 tokens
# x 2560 query+key channels, 102 bytes per channel and token at 3.35 TB/s, forward and backward. compiled_rope
# reads and writes each once per pass: 8.
ROPE_BYTES, ROPE_BYTES_COMPILED = 102, 8
# The word embedding's backward writes a dense bf16 gradient of the whole [vocab/TP, h] table each
# micro-batch: zero-filled (2 bytes per entry), then read by Megatron's hook (2) and added into the fp32
# main_grad (read and write, 8). By hand, from the kernels (megalab/runtime/embedding_grad.py); embed_wgrad
# adds the tokens' rows only, a negligible amount. (A tied table moves a little more: not counted.)
EMBED_GRAD_BYTES = 12
# Grouped-query attention without sdpa_gqa: megalab's spec repeats K and V for every query head, and the
# backward sums their gradients back, per layer and micro-batch; the kernels then also read the repeated
# K/V. Per token and query channel (h/TP): the microbenchmark's difference (results/bench/gqa-microbench.txt:
# 32 query heads on 8 K/V heads, 2048 tokens, head 64, forward+backward, cuDNN first: 297 vs 263 us) at
# 3.35 TB/s, 34e-6 x 3.35e12 / (2048 x 2048) = 27. (Row 600's runs agree: 4-6 ms a step over 16 layers x 8
# micro-batches.)
GQA_REPEAT_BYTES = 27
# The layer's kernel levers (megalab/runtime: triton_norm, norm_residual, bias_gelu, dropout_add, qkv_pack) and
# what the kernels each replaces move beyond theirs, per token and hidden unit of a layer, forward and backward,
# at the datasheet's 3.35 TB/s (effective figures, as the loss's), from their microbenchmarks at row 111's shape
# (15360 tokens x hidden 1600, where 1 us a layer is 0.136 bytes); none where the lever runs, and only where
# the layer has that kernel:
#   torch's two LayerNorms, 189 against triton_norm's 122 us each (results/bench/triton-norm-microbench.txt): 18;
#   two RMSNorms at Llama-style 8 x 2560, micro-batch 2 (4096 tokens: 1 us is 0.32 bytes), 66 against 51 us: 10;
#   the residual's gradient added to the norm's in a pass of its own, by hand: a read of two bf16 [tokens, h]
#   tensors and a write of one, less the read norm_residual's kernel adds, for each of the two norms: 8;
#   Megatron's bias-GeLU, 417 against 364 us (bias-gelu-microbench.txt, the 64 x 64 tile), on the 4h-wide MLP: 7;
#   Megatron's two bias-dropout-adds, 182 against 158 us each (dropout-add-microbench.txt): 6.5 (counted
#   wherever the lever is off: a run whose hidden dropout is 0 is overcounted, since its record does not say);
#   the QKV gradient's cat and its bias's sum, 170 against 125 us (qkv-split-microbench.txt), with a QKV bias: 6.
TORCH_NORM_BYTES, TORCH_RMSNORM_BYTES = 18, 10
RESIDUAL_ADD_BYTES = 8
BIAS_GELU_BYTES = 7
DROPOUT_ADD_BYTES = 6.5
QKV_CAT_BYTES = 6
# gelu_epilogue (megalab/runtime/gelu_epilogue.py) replaces bias_gelu's path for a dense GeLU MLP with biases, on one
# tensor-parallel rank: fc1's GEMM and Megatron's bias-GeLU 563 against GELU_AUX_BIAS's 516 us, fc2's input-gradient
# GEMM and bias_gelu's backward 709 against DGELU's 497 and the bias's sum's 79 us, back to back
# (results/bench/gelu-epilogue-microbench.txt): 180 us a layer at row 111's shape, 24.5 bytes fewer. Counted as
# bytes fewer where it runs rather than more where it does not: no run the constants were fitted on had it.
GELU_EPILOGUE_BYTES = 24.5
# Of the elementwise bytes, the share that acts on the whole [s, b, h] hidden state (the two norms and
# the two bias-dropout-adds with their residual gradients, about 56 of the ~128 bytes per token and
# hidden unit a layer's unfused kernels move forward and backward; the GeLU over the 4h-wide MLP and the
# attention's q/k/v layout copies, the rest, sit inside the tensor-parallel region): TP divides it only
# with SP, the rest always.
ELEMENTWISE_OUTSIDE_TP = 0.45
GRAD_REDUCE_BYTES = 4  # Megatron reduces the fp32 main grads (no --grad-reduce-in-bf16)
PARAM_GATHER_BYTES = 2  # ZeRO-2 gathers bf16 weights after the step (--overlap-param-gather)

# ---- MoE layers under moe_gather (issue 63), per routed copy (a token's copy for one of its top-k experts)
# and unit of width, forward and backward, from row 510's profiles at the H200's 4.8 TB/s (16 layers x 131072
# routed copies, h = f = 1024; results/bench/runs/20261129_172646___profile-510-olmoe-1gpu-gbs4: today's levers,
# and 20261129_165645___profile-510-olmoe-1gpu-gbs4/kernels-by-site.txt: without moe_act): the dispatcher's row
# gathers and the combine's sums over the h-wide copies (_Expand, _Combine and their backwards, 5.3 ms): 12
# bytes; the experts' activation times the router's probability over the f-wide (2f with SwiGLU) copies: 18 bytes
# in moe_act's two kernels (8.0 ms), 48 in torch's GeLU, multiply and their backwards (21.5 ms).
MOE_ROUTED_BYTES = 12
MOE_ACT_BYTES, MOE_ACT_TORCH_BYTES = 18, 48
# Every expert weight's gradient reaches main_grad once per micro-batch, whatever the expert's share of the
# tokens. With expert_stack the grouped GEMM's backward puts it there in one pass: the step's first micro-batch
# writes it (a bf16 read, an fp32 write: 3.16 ms for 2.15e9 expert weights at 510, 7 bytes), a later one adds to
# it (an fp32 read more: 12 bytes, scaled from that pass) -- in place of WGRAD_ADD_BYTES. Without expert_stack the
# per-expert weights are stacked (a bf16 copy) in the forward and again in the backward, and DDP's hooks add each
# expert's gradient: 8 bytes more than WGRAD_ADD_BYTES, by hand.
EXPERT_GRAD_FIRST_BYTES, EXPERT_GRAD_ADD_BYTES, EXPERT_UNSTACKED_BYTES = 7, 12, 8
# Fitted on the MoE calibration runs only (megalab/results/validation.py fit_moe: catalog rows' runs with
# moe_gather and today's code made by freeze.MOE_FROZEN_TIME), apart from CONSTANTS: no run those were fitted on had
# the lever.
MOE_GATHER_LAYER_MS = 0.611  # per MoE layer and micro-batch: the router's and dispatcher's small kernels
MOE_CONSTANTS = ("MOE_GATHER_LAYER_MS",)

CONSTANTS = ("GEMM_EFF_MAX", "GEMM_HALF_MNK", "LAUNCH_US", "COMM_CALL_US", "MOE_LAYER_MS", "STEP_OVERHEAD_MS",
             "ELEMENTWISE_BYTES")


@dataclasses.dataclass(frozen=True)
class Features:
    """What the model needs of one layout, before its fitted constants: per stage and micro-batch,
    sum(flops / peak) and sum(flops / (mnk x peak)) over the GEMMs (so GEMM time is
    (a + GEMM_HALF_MNK x b) / GEMM_EFF_MAX), the memory-bound kernels' seconds (the loss and the separate
    bias add, by the levers) and seconds per ELEMENTWISE_BYTES, the kernel launches, the communication
    seconds and calls, the MoE layers; per step, the micro-batch slots, the optimizer's and the DP
    reduction's seconds."""
    a: tuple[float, ...]
    b: tuple[float, ...]
    kernels: tuple[float, ...]
    comm_s: tuple[float, ...]
    calls: tuple[float, ...]  # collective / p2p calls per micro-batch (their latency, COMM_CALL_US)
    moe_layers: tuple[float, ...]  # MoE layers per micro-batch (MOE_LAYER_MS each)
    hbm_s: tuple[float, ...]  # the levers' memory-bound kernels' HBM traffic per micro-batch, seconds
    elementwise: tuple[float, ...]  # layers x b s h (/TP as it splits) / HBM bandwidth: seconds per ELEMENTWISE_BYTES
    slots: float  # m + (p - 1) / v
    optimizer_s: float
    dp_comm_s: float
    # MoE under moe_gather: the layers' memory-bound traffic (seconds) and their count (MOE_GATHER_LAYER_MS each),
    # per micro-batch; host_syncs: the step still syncs inside its layers (sqrt(GPU^2 + CPU^2), not the max)
    moe_s: tuple[float, ...] = ()
    moe_gather_layers: tuple[float, ...] = ()
    host_syncs: bool = False


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
    return _seconds(f, {**moe_fitted(), **(fitted() if c is None else c)})


def _seconds(f: Features, c: dict[str, float]) -> float:
    """step_seconds with every constant in C."""
    per_mb = max(combined(*micro_batch_s(f, i, c), f.host_syncs) for i in range(len(f.a)))
    return f.slots * per_mb + f.optimizer_s + exposed(f.dp_comm_s, per_mb) + c["STEP_OVERHEAD_MS"] * 1e-3


def micro_batch_s(f: Features, i: int, c: dict[str, float]) -> tuple[float, float]:
    """Stage I's micro-batch on the GPU (GEMMs, memory-bound kernels, communication) and on the host (its kernel
    launches): step_seconds takes the larger."""
    gpu = ((f.a[i] + c["GEMM_HALF_MNK"] * f.b[i]) / c["GEMM_EFF_MAX"] + f.hbm_s[i] + f.elementwise[i] * c["ELEMENTWISE_BYTES"]
           + f.comm_s[i] + f.calls[i] * c["COMM_CALL_US"] * 1e-6 + f.moe_layers[i] * c["MOE_LAYER_MS"] * 1e-3)
    if f.moe_s:
        gpu += f.moe_s[i] + f.moe_gather_layers[i] * c.get("MOE_GATHER_LAYER_MS", MOE_GATHER_LAYER_MS) * 1e-3
    return gpu, f.kernels[i] * c["LAUNCH_US"] * 1e-6


def combined(gpu_s: float, cpu_s: float, host_syncs: bool) -> float:
    """A micro-batch's time from its GPU and host parts: the larger where the host runs ahead, and where syncs
    inside the layers stop it (host_syncs) the two overlap only in part: sqrt(GPU^2 + CPU^2), between max and sum."""
    return math.hypot(gpu_s, cpu_s) if host_syncs else max(gpu_s, cpu_s)


def moe_gather_seconds(sh: Any, *, tokens: int, expert_params: float, layers: int, expert_stack: bool,
                       moe_act: bool, microbatches: int, hbm: float) -> float:
    """HBM seconds one micro-batch's MoE layers spend beside their GEMMs under moe_gather (a step's average over
    its micro-batches): the routed copies' gathers and combine (MOE_ROUTED_BYTES over h) and activation
    (MOE_ACT_BYTES over the f or 2f wide fc1 output with moe_act, else MOE_ACT_TORCH_BYTES), and every expert
    weight's gradient into main_grad (written by the first micro-batch, added by the rest, with expert_stack; else
    EXPERT_UNSTACKED_BYTES), beyond the WGRAD_ADD_BYTES every parameter is already priced at."""
    routed = tokens * sh.topk
    per_copy = sh.h * MOE_ROUTED_BYTES + sh.gate * sh.moe_ffn * (MOE_ACT_BYTES if moe_act else MOE_ACT_TORCH_BYTES)
    n = max(1, microbatches)
    grads = ((EXPERT_GRAD_FIRST_BYTES + (n - 1) * EXPERT_GRAD_ADD_BYTES) / n - WGRAD_ADD_BYTES if expert_stack
             else EXPERT_UNSTACKED_BYTES)
    return (layers * routed * per_copy + expert_params * grads) / hbm


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
    c = {**moe_fitted(), **c}  # step_seconds' constants, merged once for all the features
    return sum(abs(math.log(_seconds(f, c) / m)) for f, m in zip(features, measured_s)) / len(features)


# Where the fit starts, and each constant's allowed range (the fit works on their logarithms).
# COMM_CALL_US is a host's cost per NCCL call, tens of microseconds: unbounded, the fit takes it to ~700
# (standing in for the calibration's under-predicted context-parallel runs, whose misses are structural)
# and then reads graph-off TP runs up to 40% high (244, 224, 222). 100 us bounds it physically.
START = {"GEMM_EFF_MAX": 0.6, "GEMM_HALF_MNK": 1e10, "LAUNCH_US": 20.0, "COMM_CALL_US": 50.0,
         "MOE_LAYER_MS": 5.0, "STEP_OVERHEAD_MS": 20.0, "ELEMENTWISE_BYTES": 50.0}
BOUNDS = {"GEMM_EFF_MAX": (0.05, 1.0), "GEMM_HALF_MNK": (1e6, 1e14), "LAUNCH_US": (1.0, 500.0),
          "COMM_CALL_US": (1.0, 100.0), "MOE_LAYER_MS": (0.01, 200.0), "STEP_OVERHEAD_MS": (0.1, 500.0),
          "ELEMENTWISE_BYTES": (1.0, 1000.0), "MOE_GATHER_LAYER_MS": (0.001, 50.0)}


def fit(features: list[Features], measured_s: list[float], rounds: int = 12, names: tuple[str, ...] = CONSTANTS,
        start: dict[str, float] | None = None) -> dict[str, float]:
    """The constants `names` minimising loss() over the given records, from `start` (default START): coordinate
    descent on each constant's logarithm over a shrinking grid (deterministic, no scipy), rounded to 3 significant
    digits."""
    c = dict(START if start is None else start)
    width = 4.0  # natural-log half-width of the first grid
    for _ in range(rounds):
        for k in names:
            lo, hi = BOUNDS[k]
            centre = math.log(c[k])
            grid = [min(max(centre + width * (i / 8 - 1), math.log(lo)), math.log(hi)) for i in range(17)]
            c[k] = min((math.exp(x) for x in grid), key=lambda v: loss(features, measured_s, {**c, k: v}))
        width *= 0.6
    return {k: float(f"{c[k]:.3g}") for k in names}


def fitted() -> dict[str, float]:
    """The constants this module uses (what fit() gave on the calibration set)."""
    return {k: globals()[k] for k in CONSTANTS}


def moe_fitted() -> dict[str, float]:
    """The MoE-under-moe_gather constants (what fit_moe gave on the MoE calibration runs)."""
    return {k: globals()[k] for k in MOE_CONSTANTS}


def fit_moe(features: list[Features], measured_s: list[float]) -> dict[str, float]:
    """MOE_CONSTANTS fitted on the given runs (fit()'s descent), CONSTANTS held at their stored values."""
    return fit(features, measured_s, names=MOE_CONSTANTS, start={**fitted(), "MOE_GATHER_LAYER_MS": 1.0})
