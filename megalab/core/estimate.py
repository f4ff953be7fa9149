"""`python -m megalab plan TARGET`: predict a target's memory per GPU, FLOPs and step time before
launching it, and check the prediction against every committed run (`plan --validate`).

What is counted, per GPU (one entry per pipeline stage; every GPU of a stage looks the same):

* Parameters, as Megatron builds them for a GPT model on the local/megalab spec (defaults: learned
  absolute positions, LayerNorm, biases, GeLU, tied embeddings; a preset may change them with
  disable_bias_linear, swiglu, normalization, position_embedding_type,
  untie_embeddings_and_output_weights, ffn_hidden_size, num_query_groups, moe_ffn_hidden_size,
  moe_router_topk): per layer 2h (LN) + h(h + 2kv) + (h + 2kv) (QKV) + h*h + h (proj) + 2h (LN)
  + 2hf + f + h (MLP), plus the word embedding V_pad*h and positions on the first stage, the final
  LN on the last, and, with PP > 1, a copy of the (tied) word embedding as the last stage's output
  layer. The vocabulary is padded to a multiple of 128 x TP. TP splits the QKV/fc1 weights and
  biases and the proj/fc2 weights; proj/fc2 biases and norms stay whole.
* Weights + grads + optimizer state: Megatron bf16 keeps a bf16 weight (2 B), an fp32 main grad
  (4 B, the DDP grad buffer) and an fp32 master weight with Adam m and v (12 B): 18 B/param. The
  distributed optimizer (ZeRO-2 here) divides only the 12 by DP (Megatron's grad buffer stays
  whole): 6 + 12/DP. Expert weights divide by EP x ETP, and their 12 by the expert-DP size.
  (Megatron's own "weight and optimizer" line omits biases and position embeddings: 0.15% less.)
* Activations per layer: Korthikanti et al. 2022 (configs/reference/papers.md): sbh(34 + 5as/h), TP
  sbh(10 + 24/t + 5as/(ht)), TP+SP sbh(34/t + 5as/(ht)). megalab's spec computes attention with
  PyTorch SDPA (flash kernel), which never stores the s x s scores: the 5as/(ht) term goes, and
  what SDPA keeps for its backward is added instead: the fp32 logsumexp, 4as/(ht) in sbh units.
  (Its output is the same storage as the 2sbh linear-projection input already in the 34: flash
  allocates it like q, in [s, b, heads, dim] order, so megalab's reshape is a view.)
  spec='local' (Megatron's DotProductAttention) keeps 5as/(ht). Selective recompute drops the
  score term; full recompute keeps 2sbh per checkpointed chunk plus one chunk's full activations.
  Pipeline: stage k holds min(p - k, m) microbatches under 1F1B; interleaved with v model chunks,
  Megatron's warm-up count (2(p - k - 1) + (v - 1)p + 1 chunks), which is the paper's
  L(1 + (p - 1)/(pv)) on the first stage. CP divides the sequence.
* The last stage adds the output layer and loss: b*s*V_pad/TP logits in bf16 (2 B) and their fp32
  copy (4 B) in Megatron's vocab_parallel_cross_entropy (`.float()`, then exp/softmax in place and
  saved for backward; the backward makes the bf16 gradient while the fp32 one is alive), plus the
  final-LN input/output (4sbh).
* The peak is the larger of that forward/backward peak and the optimizer step, where torch's AdamW
  (Megatron's fallback without TE/apex; foreach) allocates one fp32 temporary per local parameter.
* What PyTorch's allocator cannot see or does not hand out: a fixed allowance for the CUDA context,
  cuBLAS workspaces and the driver's reservation, another for NCCL when the GPU has peers (more
  with PP's p2p and CP's second communicator), and a fraction for the caching allocator's slack,
  plus, under ring attention, the K/V chunk blocks NCCL still holds (one per ring step per layer).
  The constants below name each with its evidence.

FLOPs per step are Megatron's own `num_floating_point_operations` (transformer part): it counts
model FLOPs only, with no term for recomputation, so recompute work is added separately for the
step-time prediction (see `flops_breakdown`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

from megalab.core import gpus, steptime

GIB = 2**30
MIB = 2**20

# ---- Megatron's arithmetic (not calibrated) -------------------------------------------------------
# Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by (128) x TP.
VOCAB_DIVISIBLE_BY = 128
# bf16 training: bf16 weight, fp32 main grad (DDP buffer), fp32 master weight + Adam m + v.
BYTES_WEIGHT, BYTES_GRAD, BYTES_OPTIMIZER = 2, 4, 12
# torch.optim.AdamW (foreach), Megatron's optimizer without TE/apex, builds sqrt(v) as a new fp32
# tensor list during the step: 4 bytes per parameter this GPU updates, on top of the state. The
# fused AdamW of megalab's fast path (megalab/runtime/fastpath.py) updates in place: no temporary.
BYTES_ADAM_STEP_TEMP = 4
# Logits in the loss: bf16 from the output layer (2) plus the fp32 copy vocab_parallel_cross_entropy
# makes and saves as the softmax (4); in backward the fp32 grad (in place) and its bf16 cast.
BYTES_LOGITS = 2 + 4
# With the bf16_ce lever (megalab/runtime/cross_entropy.py) the loss keeps the bf16 logits (2) and the
# backward writes their bf16 gradient (2) beside them: 1.44 GiB lower at row 111 on an H100, as measured.
BYTES_LOGITS_BF16_CE = 2 + 2

# ---- allowances outside the formulas: each the calibration records' figure by a written rule
# (megalab/results/allowances.py, which tests/test_estimate.py holds these to; the evidence below is
# how each was first found)
# NVML-visible memory outside PyTorch's allocator on a GPU with no peers: the driver's reservation
# (483 MiB on the H100, 618 on the H200, present before launch), the CUDA context with its loaded
# kernels, and cuBLAS workspaces. Measured peak minus Megatron's max reserved on the 1-GPU runs:
# 2979 MiB (H100, 5 runs), 3110 MiB (H200, 001).
CUDA_CONTEXT_MIB = 3000
# NCCL's communicator buffers when the GPU has peers. Measured peak minus max reserved, less the
# 1-GPU H200's 3110 MiB: 383 MiB for DP on 2-8 H200s, 479 for TP=2 and TP=4, 867-871 for ZeRO-2 at
# DP=2-8; 512 is the allowance for the one communicator of plain DP or TP (ZeRO-2's extra is left
# out: those rows stay within 8%). "Max reserved" is the last rank's TensorBoard series, which runs
# to the last iteration: Megatron's log line stops after iteration 2, and on 15 runs the series ends
# 0.2-3.1 GiB above it (memory the allocator reserved later, which read as NCCL's before).
NCCL_MIB = 512
# PP > 1 adds NCCL memory of its own: the stages' activation/gradient sends and receives are NCCL
# point-to-point operations, with p2p connections (per-channel send and receive buffers to the
# neighbouring stage) beside the collective ones, and the tied word embedding's gradient is
# all-reduced over a first/last-stage group of its own. The same measurement: 1507-1509 MiB on all
# seven 1F1B runs (006, 461-492: m = 1 to 32, so nothing per microbatch) and 1703 on all five
# interleaved ones (489-481: v = 2 to 18, so nothing per virtual stage; 196 MiB more, once, with
# the interleaved schedule's unbatched, overlapped isend/irecv); 512 + 1024 = 1536.
NCCL_PP_MIB = 1024
# CP > 1 uses two communicators: attention's K/V traffic on the CP group, and the gradient all-reduce
# over DP x CP. The same measurement: 853-1061 MiB on CP=2 and CP=4 alike, with any cp_comm (302-352,
# 005, 304); 512 + 512.
NCCL_CP_MIB = 512
# PyTorch's caching allocator reserves more than it hands out (2 MiB rounding, blocks split and
# cached across iterations). Megatron's max reserved / max allocated - 1 on the committed runs:
# 0.6-5.5% without ZeRO-2 or gradient accumulation, 5.8-9.9% with them, 11.5-12.6% on the local
# spec and on a PP=2 last stage; the calibration median (results/allowances.py's rule: each target's
# median, then their median, to 1%) is 6%.
ALLOCATOR_SLACK = 0.05
# Ring attention (CP with cp_comm p2p) strands K/V chunks in the allocator on top of that. Each ring
# step hands a K/V chunk (2 x s/CP x b x kv/t x 2 B) to an asynchronous NCCL isend/irecv, which
# PyTorch guards with recordStream on NCCL's stream: once freed, the block is not handed out again
# until the allocator has seen NCCL's event complete, and with the CPU queueing work ahead of the GPU
# it mostly has not, so the allocator reserves fresh segments instead. Max reserved - max allocated
# - 5%, in chunks per layer (a rank's reserved = its peak less its run's memory outside the
# allocator): 2.0-3.3 on 304's four ranks (CP=4, 3 steps), 0.4-1.6 on the ranks of 302, 332 and 005
# (CP=2, 1 step); the all_gather and a2a runs (synchronous collectives) stay at 1.2-6.4% slack.
# One chunk per ring step per layer: on the busy side for CP=2, as a memory estimate should err.
RING_STRANDED_CHUNKS_PER_STEP = 1.0

# ---- GPUs -----------------------------------------------------------------------------------------
# Memory and peak from the one datasheet table (megalab/core/gpus.py); GPU_MEM_GB=N caps to
# memcap.nominal_gb_to_gib(N) GiB (80: an H100 80GB).
DEFAULT_MFU = 0.35
SPECS = ("megalab", "local")


def gpu_spec(gpu_name: str | None) -> tuple[float, float]:
    """(memory GiB, peak bf16 TFLOP/s) for a GPU name; the H100 80GB when unknown or None."""
    gpu = gpus.lookup(gpu_name) or gpus.default_gpu()
    return gpu.memory_gib, gpu.tflops_bf16


def nccl_mib(gpus: int, pp: int, cp: int) -> int:
    """NCCL's memory outside PyTorch's allocator: none without peers, else one communicator's, plus
    what a pipeline and context parallelism add (NCCL_MIB, NCCL_PP_MIB, NCCL_CP_MIB)."""
    if gpus <= 1:
        return 0
    return NCCL_MIB + (NCCL_PP_MIB if pp > 1 else 0) + (NCCL_CP_MIB if cp > 1 else 0)


def padded_vocab(vocab: int, tp: int) -> int:
    mult = VOCAB_DIVISIBLE_BY * tp
    return -(-int(vocab) // mult) * mult


# --------------------------------------------------------------------------- model shape

@dataclasses.dataclass(frozen=True)
class Shape:
    """The model numbers the estimate reads from a preset (configs/models.yaml), with Megatron's
    defaults where a key is absent: biases on, GeLU, LayerNorm, learned positions, tied embeddings."""
    layers: int
    h: int
    heads: int
    seq: int
    max_pos: int
    vocab: int
    ffn: int
    groups: int  # query groups (= heads without GQA)
    bias: bool = True  # add_bias_linear (presets: disable_bias_linear)
    swiglu: bool = False
    norm: int = 2  # parameters per hidden unit of a norm: LayerNorm 2 (weight, bias), RMSNorm 1
    learned_pos: bool = True
    rope: bool = False  # rotary positions (position_embedding: rope)
    tied: bool = True
    num_experts: int | None = None
    topk: int | None = None
    moe_ffn: int | None = None

    @classmethod
    def of(cls, preset: dict[str, Any], exp: Any = None) -> "Shape":
        h = int(preset["hidden_size"])
        heads = int(preset["num_attention_heads"])
        num_experts = getattr(exp, "num_experts", None) or preset.get("num_experts")
        topk = getattr(exp, "topk", None) or preset.get("moe_router_topk") or preset.get("topk") or 1
        ffn = int(preset.get("ffn_hidden_size") or 4 * h)
        return cls(layers=int(preset["num_layers"]), h=h, heads=heads, seq=int(preset["seq_length"]),
                   max_pos=int(preset.get("max_position_embeddings", preset["seq_length"])),
                   vocab=int(preset["vocab_size"]), ffn=ffn,
                   groups=int(preset.get("num_query_groups", heads)),
                   bias=not preset.get("disable_bias_linear", False), swiglu=bool(preset.get("swiglu", False)),
                   norm=1 if preset.get("normalization") == "RMSNorm" else 2,
                   # the preset keys (position_embedding, untie_embeddings) or Megatron's own names
                   learned_pos=preset.get("position_embedding",
                                          preset.get("position_embedding_type", "learned_absolute")) == "learned_absolute",
                   rope=preset.get("position_embedding", preset.get("position_embedding_type")) == "rope",
                   tied=not (preset.get("untie_embeddings")
                             or preset.get("untie_embeddings_and_output_weights", False)),
                   num_experts=int(num_experts) if num_experts else None,
                   topk=int(topk) if num_experts else None,
                   moe_ffn=int(preset.get("moe_ffn_hidden_size") or ffn) if num_experts else None)

    @property
    def kv(self) -> int:  # key (= value) projection width
        return self.h // self.heads * self.groups

    @property
    def gate(self) -> int:  # fc1 is 2f wide with SwiGLU
        return 2 if self.swiglu else 1


def layer_params(sh: Shape, tp: int) -> tuple[float, float, float]:
    """(TP-sharded, replicated, expert) parameters of one layer as held by one TP rank (expert
    parameters are for all experts, before EP/ETP). Column-parallel weights and biases (QKV, fc1)
    and row-parallel weights (proj, fc2) split over TP; row-parallel biases and norms do not."""
    h, kv, f, bias, g = sh.h, sh.kv, sh.ffn, int(sh.bias), sh.gate
    attn_sharded = h * (h + 2 * kv) + bias * (h + 2 * kv) + h * h  # QKV weight(+bias), proj weight
    attn_repl = bias * h + sh.norm * h  # proj bias, input norm
    if sh.num_experts:
        fm, n = sh.moe_ffn, sh.num_experts
        expert = n * (g * h * fm + bias * g * fm + fm * h + bias * h)
        router = h * n + bias * n
        return attn_sharded / tp, attn_repl + sh.norm * h + router, float(expert)
    mlp_sharded = g * h * f + bias * g * f + f * h  # fc1 weight(+bias), fc2 weight
    mlp_repl = bias * h + sh.norm * h  # fc2 bias, pre-MLP norm
    return (attn_sharded + mlp_sharded) / tp, attn_repl + mlp_repl, 0.0


def embedding_params(sh: Shape, tp: int) -> tuple[float, float]:
    """(first stage, last stage) non-layer parameters per TP rank, as if PP > 1: word embedding
    (+ learned positions) first; final norm and the output layer last (tied: Megatron's copy)."""
    vpad = padded_vocab(sh.vocab, tp)
    first = vpad * sh.h / tp + (sh.max_pos * sh.h if sh.learned_pos else 0)
    last = sh.norm * sh.h + vpad * sh.h / tp
    return first, last


def total_params(sh: Shape, tp: int = 1) -> int:
    """Unique parameters (vocab padded for this TP), as Megatron prints at PP=1, TP=1."""
    s, r, e = layer_params(sh, 1)
    vpad = padded_vocab(sh.vocab, tp)
    out = 0 if sh.tied else vpad * sh.h
    emb = vpad * sh.h + (sh.max_pos * sh.h if sh.learned_pos else 0)
    return int(sh.layers * (s + r + e) + emb + sh.norm * sh.h + out)


# --------------------------------------------------------------------------- activations

def layer_activation_sbh(sh: Shape, *, tp: int, sp: bool, spec: str, selective: bool,
                         seq: int | None = None, etp: int = 1, cp: int = 1, cp_comm: str | None = None,
                         dropout_add: bool = False, moe_gather: bool = False, moe_act: bool = False) -> float:
    """Bytes one layer stores for backward, in units of s*b*h (Korthikanti et al., Table 2).

    34 = attention 11 (QKV input 2, Q K 4, V 2, proj input 2, dropout mask 1) + MLP 19 (fc1 input
    2, GeLU input 8, fc2 input 8, dropout mask 1) + LayerNorms 4. Under TP the 10 that sit outside
    the TP region stay whole (split by t too with SP), the 24 inside are split. GQA shrinks K and V;
    the MLP's 16 is 4f/h (6f/h with SwiGLU: a 2f-wide fc1 output and the f-wide product). With SDPA
    (spec megalab) the score term 5as/(ht) gives way to the fp32 logsumexp, 4bas/t bytes = 4a/(ht)
    per s*b*h. seq: this GPU's sequence (s/CP).
    CP (megalab/runtime/cp_attention.py, like TE's): p2p and a2a keep the same Q, K, V bytes (the ring's K/V
    chunks are transient; Ulysses keeps full-sequence tensors of 1/CP of the heads); all_gather keeps
    the gathered K and V of the whole sequence for backward: 4(CP - 1)g/(at) more.
    MoE (checked against the chapter-5 runs, results/estimate-vs-measured.md): each of the top-k
    routed copies of a token keeps its fc1 input (2h), the f-wide tensors (4f or 6f) and its expert
    output for the probability-weighted combine (2h); the router keeps fp32 logits and probabilities
    (8E bytes per token). Expert TP does not split them: Megatron's all-to-all dispatcher gathers the
    tokens of the whole ETP group onto every rank (token_dispatcher.py, `gather_from_sequence_parallel_
    region` over the expert-TP group), so each rank holds ETP x the h-wide tensors and ETP x tokens
    times f/ETP of the f-wide ones. Under moe_gather (megalab/runtime/moe_dispatch.py) the combine keeps only its
    indices (the probability is applied in the experts' activation), so a copy keeps its fc1 input (2h) and the
    f-wide tensors: torch's GeLU input, its output (for the probability's gradient) and fc2's input (6f), or with
    moe_act's one kernel the GeLU input and fc2's input (4f).
    dropout_add (megalab/runtime/dropout_add.py): the two bias-dropout-adds keep a seed, not their byte masks."""
    h, a, t = sh.h, sh.heads, tp
    seq = sh.seq if seq is None else seq
    ff = 6 if sh.swiglu else 4  # bytes per f-wide unit kept by the MLP (GeLU/SwiGLU input + fc2 input)
    qkv = 2 * (1 + 2 * sh.groups / a)  # Q, K, V kept for QK^T and attention over V
    inside = qkv + 2  # + linear-projection input
    outside = 4 + 2 + 2 + (0 if dropout_add else 2)  # norms, QKV input, fc1 input (the MLP's norm output), 2 dropout masks
    if sh.num_experts:
        if moe_gather:  # the fc1 input; torch's GeLU keeps its output too, moe_act does not
            copy = 2 * etp + (ff if moe_act and not sh.swiglu else ff + 2) * sh.moe_ffn / h
        else:  # the fc1 input and the expert output for the combine
            copy = (2 + 2) * etp + ff * sh.moe_ffn / h
        experts = sh.topk * copy + 8 * sh.num_experts / h
        per = ((outside + inside) / t if sp else outside + inside / t) + experts
    else:
        inside_mlp = ff * sh.ffn / h
        per = (outside + inside + inside_mlp) / t if sp else outside + (inside + inside_mlp) / t
    if not selective:
        if spec == "local":
            per += 5 * a * seq / (h * t)
        else:
            per += 4 * a / (h * t)
    if cp > 1 and cp_comm == "all_gather":
        per += 2 * 2 * (cp - 1) * sh.groups / (a * t)
    return per


def parse_recompute(recompute: str) -> tuple[str, str | None, int]:
    """'none' | 'selective' | 'full-uniform-N' | 'full-block-N' -> (granularity, method, N)."""
    if recompute in ("none", "selective"):
        return recompute, None, 0
    _, method, n = recompute.split("-")
    return "full", method, int(n)


# --------------------------------------------------------------------------- the estimate

@dataclasses.dataclass
class Stage:
    """One pipeline stage: what each of its GPUs holds."""
    index: int
    gpus: int  # GPUs that look like this one (TP x CP x DP of them)
    layers: int
    params: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    inflight: float  # microbatches of this stage's layers held at once
    activations_bytes: float  # all in-flight microbatches (+ embedding inputs, recompute working set)
    head_bytes: float  # last stage: logits (2 + 4 B) + final-LN tensors; else 0
    workset_bytes: float  # a layer's backward transient (the f-wide gradients)
    optimizer_step_bytes: float  # AdamW's fp32 temporary during the step
    ring_slack_bytes: float  # ring attention's stranded K/V chunks (RING_STRANDED_CHUNKS_PER_STEP)
    allocated_bytes: float  # PyTorch allocator peak (cf. Megatron's "max allocated")
    overhead_bytes: float  # context + NCCL + allocator slack (+ the ring's)
    peak_bytes: float  # what nvidia-smi would show (with the CUDA graph's allowance, when on)
    graph_bytes: float = 0.0  # the full-iteration CUDA graph's private pool and static inputs (CUDA_GRAPH)

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_without_graph_bytes(self) -> float:
        """The peak with the CUDA graph's allowance left out (what CUDA_GRAPH=auto's room rule reads)."""
        return self.allocated_bytes + self.overhead_bytes

    @property
    def peak_at(self) -> str:
        fb = self.state_bytes + self.activations_bytes + max(self.head_bytes, self.workset_bytes)
        return "optimizer step" if self.state_bytes + self.optimizer_step_bytes > fb else "forward/backward"


@dataclasses.dataclass
class Estimate:
    target: str
    model: str
    spec: str
    gpus: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int
    sp: bool
    zero2: bool
    recompute: str
    mbs: int
    gbs: int
    num_microbatches: int
    virtual_stages: int
    vocab: int
    vocab_padded: int
    params_total: int
    stages: list[Stage]
    per_layer_sbh: float
    seq: int
    hidden: int
    gpu_name: str
    gpu_mem_gib: float
    peak_tflops: float
    flops_per_step: float  # Megatron's num_floating_point_operations (model FLOPs)
    hw_flops_per_step: float  # + recomputation
    bubble: float  # pipeline bubble fraction (p-1)/(v m)
    mfu: float
    step_ms: float
    tflops_per_gpu: float  # as Megatron reports it: model FLOPs / step / GPU
    step: steptime.Features | None = None  # the step-time model's inputs (None under a constant MFU)
    bf16_ce: bool = False  # the loss keeps bf16 logits only (BYTES_LOGITS_BF16_CE)

    @property
    def peak_gib(self) -> float:
        return max(s.peak_bytes for s in self.stages) / GIB

    @property
    def peak_without_graph_gib(self) -> float:
        return max(s.peak_without_graph_bytes for s in self.stages) / GIB

    @property
    def allocated_gib(self) -> float:
        return max(s.allocated_bytes for s in self.stages) / GIB

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.gpu_mem_gib

    @property
    def params_per_gpu(self) -> list[int]:
        return [s.params for s in self.stages]


def inflight_microbatches(stage: int, pp: int, vpp: int, microbatches: int) -> float:
    """Micro-batches (in units of one stage's layers) whose activations stage k holds at once under
    1F1B: PP - k, or with interleaving the chunks in flight over the virtual stages."""
    if vpp > 1:
        return min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, microbatches * vpp) / vpp
    return min(pp - stage, microbatches)


def held_activations(inflight: float, layers: int, layer_bytes: float, ckpt_bytes: float, recompute: str) -> float:
    """Activation bytes a stage holds: every layer's for each in-flight micro-batch, or with full
    recompute the checkpointed inputs plus one recomputed working set."""
    gran, method, nrec = parse_recompute(recompute)
    if gran != "full":
        return inflight * layers * layer_bytes
    if method == "uniform":
        stored = math.ceil(layers / nrec) * ckpt_bytes
        working = min(nrec, layers) * layer_bytes
    else:  # block: the first N layers of the stage keep their input only
        n = min(nrec, layers)
        stored = n * ckpt_bytes + (layers - n) * layer_bytes
        working = layer_bytes if n else 0.0
    return inflight * stored + working


# The full-iteration CUDA graph's extra memory (its private pool, static inputs and outputs), as a share
# of the peak without it, and at least GRAPH_MEMORY_MIN_GIB: the median over the calibration set's graph on/off
# pairs (one target, GPU, fast path, cap and extra flags; megalab/results/allowances.py, the pairs listed in
# results/estimate-vs-measured.md), the smallest extra as the floor. CUDA_GRAPH=auto (megalab/core/graphs.py)
# plans with a room of its own, since a wrong "on" costs an out-of-memory run.
GRAPH_MEMORY_SHARE = 0.01
GRAPH_MEMORY_MIN_GIB = 0.1
# With megalab's context-parallel ring attention the graph costs far more, likely because its private
# pool keeps each ring step's K/V buffers and flash outputs apart where the eager allocator reuses them
# (not profiled): the most a calibration CP run with the graph needed (megalab/results/allowances.py).
GRAPH_MEMORY_SHARE_CP = 0.73


def graph_memory_bytes(peak_bytes: float, cp: int = 1) -> float:
    return max(GRAPH_MEMORY_MIN_GIB * GIB, (GRAPH_MEMORY_SHARE_CP if cp > 1 else GRAPH_MEMORY_SHARE) * peak_bytes)


def estimate(exp: Any, *, gpu_mem_gib: float | None = None, spec: str = "megalab",
             gpu_name: str | None = None, mfu: float | None = None,
             model_cfg: dict[str, Any] | None = None, fast: Iterable[str] = (), cuda_graph: bool = False) -> Estimate:
    """Predict memory per GPU (per pipeline stage), FLOPs and step time for a catalog Experiment.

    gpu_mem_gib: the memory to fit in (default: gpu_name's, else an H100 80GB's 79.65 GiB).
    spec: 'megalab' (SDPA attention, no s x s scores; also right for Transformer Engine) or 'local'
    (Megatron's DotProductAttention). model_cfg overrides exp.model_cfg (a run record's preset).
    Step time: the model of megalab/core/steptime.py, or with `mfu` the old constant-MFU guess. `fast`: the run's
    fast-path levers (megalab/runtime/levers.py; those it has no term for count as off)."""
    fast = frozenset(fast)
    if spec not in SPECS:
        raise ValueError(f"spec must be one of {SPECS}, got {spec!r}")
    e = exp  # a catalog.Experiment (for a run record: rebuilt from its config)
    sh = Shape.of(model_cfg if model_cfg is not None else exp.model_cfg, e)
    p, m = e.pp, e.num_microbatches
    v = (sh.layers // p) // e.layers_per_virtual_stage if e.layers_per_virtual_stage else 1
    vpad = padded_vocab(sh.vocab, e.tp)
    stages, per_layer_sbh = memory_stages(e, sh, spec=spec, fast=fast, cuda_graph=cuda_graph, v=v, vpad=vpad)

    name = gpu_name or gpus.DEFAULT_GPU_NAME
    mem, peak = gpu_spec(name)
    fl = flops_breakdown(sh, gbs=e.gbs, tp=e.tp, recompute=e.recompute)
    bubble = (p - 1) / (v * m) if p > 1 else 0.0
    features = None
    if mfu is not None:  # the old guess, on request (plan --mfu)
        step_s = fl["hardware"] / (e.gpus * peak * 1e12 * mfu) * (1 + bubble)
    else:
        features = step_features(e, sh, stages, vpad=vpad, v=v, gpu_name=name, cuda_graph=cuda_graph,
                                 fast=fast)
        step_s = steptime.step_seconds(features)
        mfu = fl["model"] / (step_s * e.gpus * peak * 1e12)
    return Estimate(
        target=e.id, model=e.model, spec=spec, gpus=e.gpus, tp=e.tp, pp=p, cp=e.cp, dp=e.dp, ep=e.ep, etp=e.etp,
        sp=e.sp, zero2=e.zero2, recompute=e.recompute, mbs=e.mbs, gbs=e.gbs, num_microbatches=m,
        virtual_stages=v, vocab=sh.vocab, vocab_padded=vpad, params_total=total_params(sh, e.tp),
        stages=stages, per_layer_sbh=per_layer_sbh, seq=sh.seq, hidden=sh.h, gpu_name=name,
        gpu_mem_gib=gpu_mem_gib if gpu_mem_gib is not None else mem, peak_tflops=peak,
        flops_per_step=fl["model"], hw_flops_per_step=fl["hardware"], bubble=bubble, mfu=mfu,
        step_ms=step_s * 1e3, tflops_per_gpu=fl["model"] / step_s / e.gpus / 1e12, step=features,
        bf16_ce="bf16_ce" in fast)


def memory_stages(e: Any, sh: Shape, *, spec: str, fast: frozenset[str], cuda_graph: bool, v: int,
                  vpad: int) -> tuple[list[Stage], float]:
    """Each pipeline stage's memory per GPU (its parameters and state, the activations it holds, the transients of
    its backward and optimizer step, what lies outside the allocator), and the activations per layer in s b h."""
    t, p, cp = e.tp, e.pp, e.cp
    dp, m = e.dp, e.num_microbatches
    ep, etp = e.ep, e.etp
    expert_dp = max(1, e.gpus // (p * ep * etp))
    dense_dp_opt = dp * cp if e.zero2 else 1  # distributed optimizer shards over the DP x CP group
    expert_dp_opt = expert_dp if e.zero2 else 1

    s = sh.seq // cp
    b = e.mbs
    sbh = s * b * sh.h
    sp_div = t if e.sp else 1
    per_layer_sbh = layer_activation_sbh(sh, tp=t, sp=e.sp, spec=spec,
                                         selective=(parse_recompute(e.recompute)[0] == "selective"),
                                         seq=s, etp=e.etp, cp=cp, cp_comm=e.cp_comm, dropout_add="dropout_add" in fast,
                                         moe_gather="moe_gather" in fast and ep == 1 and etp == 1,
                                         moe_act="moe_act" in fast)
    layer_bytes = per_layer_sbh * sbh
    ckpt_bytes = 2 * sbh / sp_div  # a checkpointed layer input

    sharded, repl, expert = layer_params(sh, t)
    L = sh.layers // p
    stages: list[Stage] = []
    for k in range(p):
        first, last = k == 0, k == p - 1
        dense = L * (sharded + repl)
        emb_first, emb_last = embedding_params(sh, t)
        if first:
            dense += emb_first
        if last:  # final norm, and the output layer unless PP=1 shares the tied embedding
            dense += emb_last if (p > 1 or not sh.tied) else sh.norm * sh.h
        experts = L * expert / (ep * etp)
        params = int(round(dense + experts))
        weights = params * BYTES_WEIGHT
        grads = params * BYTES_GRAD
        optim = dense * BYTES_OPTIMIZER / dense_dp_opt + experts * BYTES_OPTIMIZER / expert_dp_opt
        step_temp = 0 if "fused_adam" in fast else (dense / dense_dp_opt + experts / expert_dp_opt) * BYTES_ADAM_STEP_TEMP

        inflight = inflight_microbatches(k, p, v, m)
        acts = held_activations(inflight, L, layer_bytes, ckpt_bytes, e.recompute)
        if first:  # token ids (int64) and the embedding dropout mask, per in-flight microbatch
            acts += min(p, m) * (8 * s * b + sbh / sp_div)
        head = 0.0
        if last:
            head = (BYTES_LOGITS_BF16_CE if "bf16_ce" in fast else BYTES_LOGITS) * s * b * vpad / t + 4 * sbh / sp_div
        # a layer's backward transient: incoming + outgoing hidden grads, and the f-wide grad
        f_wide = sh.moe_ffn * sh.topk / e.etp if sh.num_experts else sh.ffn * sh.gate / t
        workset = (4 * sbh / sp_div) + 2 * s * b * f_wide

        state = weights + grads + optim
        allocated = max(state + acts + max(head, workset), state + step_temp)
        # ring attention's K/V chunks (K and V in bf16, s/CP tokens, kv/t wide) that NCCL still holds:
        # one per ring step (CP - 1) per layer, RING_STRANDED_CHUNKS_PER_STEP
        ring = 0.0
        if cp > 1 and (e.cp_comm or "p2p") == "p2p":  # Megatron's default --cp-comm-type is p2p
            ring = RING_STRANDED_CHUNKS_PER_STEP * (cp - 1) * L * 2 * s * b * (sh.kv / t) * 2
        overhead = allocated * ALLOCATOR_SLACK + ring + (CUDA_CONTEXT_MIB + nccl_mib(e.gpus, p, cp)) * MIB
        graph = graph_memory_bytes(allocated + overhead, cp) if cuda_graph else 0.0
        stages.append(Stage(index=k, gpus=e.gpus // p, layers=L, params=params, weights_bytes=weights,
                            grads_bytes=grads, optimizer_bytes=optim, inflight=inflight,
                            activations_bytes=acts, head_bytes=head, workset_bytes=workset,
                            optimizer_step_bytes=step_temp, ring_slack_bytes=ring, allocated_bytes=allocated,
                            overhead_bytes=overhead, peak_bytes=allocated + overhead + graph,
                            graph_bytes=graph))
    return stages, per_layer_sbh


def layer_lever_bytes(sh: Shape, *, triton_norm: bool, norm_residual: bool, bias_gelu: bool, dropout_add: bool,
                      qkv_pack: bool, gelu_epilogue: bool = False) -> tuple[float, float]:
    """HBM bytes per token, hidden unit and layer that the layer's kernels move where megalab's lever for them is
    off (steptime.TORCH_NORM_BYTES and the rest): (on the whole hidden state, inside the tensor-parallel region).
    A lever counts only where the layer has its kernel: bias_gelu for a dense GeLU MLP with biases, qkv_pack for a
    QKV bias, norm_residual beside triton_norm. gelu_epilogue (where it runs: the caller says, one tensor-parallel
    rank) replaces bias_gelu's kernels and counts as the bytes it moves fewer than they do."""
    rms = sh.norm == 1
    dense_gelu = not sh.num_experts and not sh.swiglu and sh.bias
    out = 0.0 if triton_norm else (steptime.TORCH_RMSNORM_BYTES if rms else steptime.TORCH_NORM_BYTES)
    out += 0.0 if triton_norm and norm_residual else steptime.RESIDUAL_ADD_BYTES
    out += 0.0 if dropout_add else steptime.DROPOUT_ADD_BYTES
    if dense_gelu and gelu_epilogue:
        inside = -steptime.GELU_EPILOGUE_BYTES
    else:
        inside = steptime.BIAS_GELU_BYTES if dense_gelu and not bias_gelu else 0.0
    inside += steptime.QKV_CAT_BYTES if sh.bias and not qkv_pack else 0.0
    return out, inside


def step_features(e: Any, sh: Shape, stages: list[Stage], *, vpad: int, v: int, gpu_name: str | None,
                  fast: frozenset[str], cuda_graph: bool = False) -> steptime.Features:
    """The step-time model's inputs for a layout (megalab/core/steptime.py): per stage and micro-batch
    its GEMM terms, memory-bound kernels (the loss and the separate bias add by the levers, the
    elementwise work per token and hidden unit), kernel launches and in-micro-batch communication; per
    step the optimizer's HBM traffic and the DP reduction. Datasheet bandwidths (gpus.py); nothing here
    is fitted."""
    gpu = gpus.lookup(gpu_name) or gpus.default_gpu()
    default = gpus.default_gpu()
    peak = gpu.tflops_bf16 * 1e12
    hbm = (gpu.hbm_tbps or default.hbm_tbps) * 1e12
    link = gpu.link_gbps or default.link_gbps
    full = parse_recompute(e.recompute)[0] == "full"
    passes = 4.0 if full else 3.0
    b, s, h, t = e.mbs, sh.seq // e.cp, sh.h, e.tp
    outside = steptime.ELEMENTWISE_OUTSIDE_TP  # elementwise work on the whole hidden state: split by TP only with SP
    a_, b_, kernels, comm, calls, moe, hbm_s, elementwise = [], [], [], [], [], [], [], []
    # moe_gather's dispatcher (EP = ETP = 1 only) replaces the host-synced one MOE_LAYER_MS prices
    gather = bool(sh.num_experts) and "moe_gather" in fast and e.ep == 1 and e.etp == 1
    moe_s, gather_layers = [], []
    for st in stages:
        ga, gb = _gemm_terms(e, sh, st, fast=fast, vpad=vpad, peak=peak, passes=passes)
        a_.append(ga)
        b_.append(gb)
        hbm_s.append(_memory_bound_bytes(e, sh, st, fast=fast, vpad=vpad, passes=passes) / hbm)
        elementwise.append(st.layers * passes / 3 * b * s * h * (outside / (t if e.sp else 1) + (1 - outside) / t) / hbm)
        per_layer = steptime.KERNELS_PER_LAYER * (4 / 3 if full else 1)
        if sh.num_experts and "grouped_gemm" not in fast:
            per_layer += sh.num_experts / e.ep * steptime.KERNELS_PER_EXPERT
        kernels.append(0.0 if cuda_graph else st.layers * per_layer)  # a graph replays them in one launch
        c, n_calls = _stage_comm(e, sh, st, link=link, full=full, v=v)
        comm.append(c)
        calls.append(0 if cuda_graph else n_calls)  # the graph replays the collectives: no host latency
        moe.append(st.layers if sh.num_experts and not gather else 0)
        if gather:
            moe_s.append(steptime.moe_gather_seconds(
                sh, tokens=b * s, expert_params=st.layers * layer_params(sh, t)[2], layers=st.layers,
                expert_stack="expert_stack" in fast, moe_act="moe_act" in fast, microbatches=e.num_microbatches,
                hbm=hbm) * passes / 3)
            gather_layers.append(st.layers * passes / 3)
    slots = e.num_microbatches + ((e.pp - 1) / v if e.pp > 1 else 0.0)
    return steptime.Features(a=tuple(a_), b=tuple(b_), kernels=tuple(kernels), comm_s=tuple(comm),
                             calls=tuple(calls), moe_layers=tuple(moe), hbm_s=tuple(hbm_s),
                             elementwise=tuple(elementwise), slots=slots,
                             optimizer_s=_optimizer_seconds(e, stages, fast=fast, hbm=hbm),
                             dp_comm_s=_dp_comm_seconds(e, sh, stages, link=link),
                             moe_s=tuple(moe_s), moe_gather_layers=tuple(gather_layers),
                             host_syncs=gather and not cuda_graph)


def _gemm_terms(e: Any, sh: Shape, st: Stage, *, fast: frozenset[str], vpad: int, peak: float,
                passes: float) -> tuple[float, float]:
    """A stage's GEMMs per micro-batch as the step-time model's two terms (steptime.gpu_terms): its layers' passes
    (the core attention's forward again under selective recompute) and, on the last stage, the output layer."""
    t, cp, ep, etp, b = e.tp, e.cp, e.ep, e.etp, e.mbs
    grouped = "grouped_gemm" in fast
    layer_g = steptime.gemms(sh, mbs=b, tp=t, cp=cp, ep=ep, etp=etp, grouped=grouped, layers=st.layers, last=False,
                             vocab_padded=vpad)
    ga, gb = steptime.gpu_terms(layer_g, peak, passes)
    if parse_recompute(e.recompute)[0] == "selective":  # the core attention's forward again
        ga2, gb2 = steptime.gpu_terms(layer_g[2:3], peak, 1.0)
        ga, gb = ga + ga2, gb + gb2
    if st.index == e.pp - 1:
        la, lb = steptime.gpu_terms(steptime.gemms(sh, mbs=b, tp=t, cp=cp, ep=ep, etp=etp, grouped=grouped, layers=0,
                                                   last=True, vocab_padded=vpad)[-1:], peak, 3.0)
        ga, gb = ga + la, gb + lb
    return ga, gb


def _memory_bound_bytes(e: Any, sh: Shape, st: Stage, *, fast: frozenset[str], vpad: int, passes: float) -> float:
    """HBM bytes a stage's memory-bound kernels move per micro-batch: the loss over this rank's logits (last stage),
    the QKV bias added in a pass of its own (without addmm_bias, in every forward), the weight gradients' adds into
    main_grad (without fused_wgrad), the unfused RoPE (without compiled_rope), the word embedding's dense gradient
    (first stage; none with embed_wgrad on an untied table), grouped-query attention's repeated K/V (none with
    sdpa_gqa, except under CP, whose attention repeats them either way), and the layer's kernels the levers replace
    where they do not run."""
    t, cp, b, s, h = e.tp, e.cp, e.mbs, sh.seq // e.cp, sh.h
    full = parse_recompute(e.recompute)[0] == "full"
    layer_out, layer_in = layer_lever_bytes(sh, triton_norm="triton_norm" in fast,
                                            norm_residual="norm_residual" in fast, bias_gelu="bias_gelu" in fast,
                                            dropout_add="dropout_add" in fast, qkv_pack="qkv_pack" in fast,
                                            gelu_epilogue="gelu_epilogue" in fast and t == 1 and not e.sp)
    x = 0.0
    if st.index == 0 and not ("embed_wgrad" in fast and not sh.tied):
        x += vpad / t * h * steptime.EMBED_GRAD_BYTES
    if sh.kv < h and not ("sdpa_gqa" in fast and cp == 1):
        x += (passes / 3) * st.layers * b * s * h / t * steptime.GQA_REPEAT_BYTES
    if st.index == e.pp - 1:
        x += b * s * vpad / t * (steptime.LOSS_BYTES_PER_LOGIT_BF16_CE if "bf16_ce" in fast
                                 else steptime.LOSS_BYTES_PER_LOGIT)
    if sh.bias and "addmm_bias" not in fast:
        x += st.layers * (2 if full else 1) * b * s * (h + 2 * sh.kv) / t * steptime.BIAS_ADD_BYTES
    if "fused_wgrad" not in fast:  # each weight gradient added into main_grad by a kernel of its own
        x += st.params * steptime.WGRAD_ADD_BYTES
    if sh.rope:  # the rotated query and key channels, forward (again when recomputed) and backward
        x += (passes / 3) * st.layers * b * s * (h + sh.kv) / t * (
            steptime.ROPE_BYTES_COMPILED if "compiled_rope" in fast else steptime.ROPE_BYTES)
    # the layer's kernels megalab's levers replace, where they do not run: on the whole hidden state (split by
    # TP only with SP) and inside the tensor-parallel region
    x += st.layers * passes / 3 * b * s * h * (layer_out / (t if e.sp else 1) + layer_in / t)
    return x


def _stage_comm(e: Any, sh: Shape, st: Stage, *, link: float, full: bool, v: int) -> tuple[float, int]:
    """(seconds, collective calls) of a stage's communication within a micro-batch: TP's all-reduces (2 per layer
    forward, 2 backward, 2 more in a recomputed forward; SP's reduce-scatter + all-gather move the same bytes), CP's
    K/V exchange by its mode, MoE's dispatch and combine, and PP's activations and their gradients."""
    t, p, cp, ep, etp = e.tp, e.pp, e.cp, e.ep, e.etp
    b, s, h = e.mbs, sh.seq // cp, sh.h
    act = 2 * b * s * h  # one bf16 activation [b, s/cp, h]
    c = st.layers * (6 if full else 4) * steptime.ring_allreduce_s(act, t, link)
    n_calls = st.layers * (6 if full else 4) if t > 1 else 0
    if cp > 1:
        n_calls += st.layers * {"p2p": 3 * (cp - 1), "all_gather": 2}.get(e.cp_comm or "p2p", 8)
        kv_chunk = 2 * 2 * b * s * sh.kv / t  # K and V of s/cp tokens, bf16
        mode = e.cp_comm or "p2p"
        if mode == "p2p":
            c += st.layers * 3 * (cp - 1) * kv_chunk / (link * 1e9)  # forward ring, backward K/V + dK/dV
        elif mode == "all_gather":
            c += st.layers * 2 * steptime.one_way_s(kv_chunk * cp, cp, link)
        else:  # a2a: q, k, v, output forward and their gradients backward
            c += st.layers * 8 * steptime.one_way_s(2 * b * s * h / t, cp, link)
    if sh.num_experts and ep * etp > 1:  # dispatch + combine, forward and backward
        c += st.layers * 4 * steptime.one_way_s(2 * b * s * sh.topk * h * etp, ep * etp, link)
        n_calls += st.layers * 4
    if p > 1:  # activations forward and their gradients backward, per virtual chunk
        c += 2 * v * act / (link * 1e9)
        n_calls += 2 * v
    return c, n_calls


def _optimizer_seconds(e: Any, stages: list[Stage], *, fast: frozenset[str], hbm: float) -> float:
    """The busiest GPU's optimizer step: AdamW's HBM traffic over the parameters it updates (fused or foreach, the
    clip's own pass or inside fused AdamW, the per-tensor walk flat_adam removes) and the gradients it reads."""
    busiest = max(stages, key=lambda st: st.params)
    opt_params = busiest.optimizer_bytes / BYTES_OPTIMIZER  # the parameters this GPU updates
    opt_bytes = steptime.OPT_BYTES_FUSED if "fused_adam" in fast else steptime.OPT_BYTES_FOREACH
    opt_bytes += steptime.CLIP_BYTES_IN_ADAM if "clip_in_adam" in fast and "fused_adam" in fast else steptime.CLIP_BYTES
    if "fused_adam" in fast and not ("flat_adam" in fast and not e.zero2):  # flat_adam serves Megatron's non-distributed optimizer only
        opt_bytes += steptime.OPT_BYTES_PER_TENSOR
    return (opt_params * opt_bytes + busiest.params * steptime.GRAD_BYTES) / hbm


def _dp_comm_seconds(e: Any, sh: Shape, stages: list[Stage], *, link: float) -> float:
    """The data-parallel reduction of the busiest GPU's gradients: an all-reduce, or with ZeRO-2 a reduce-scatter of
    the gradients and an all-gather of the bf16 weights."""
    busiest = max(stages, key=lambda st: st.params)
    p, ep, etp = e.pp, e.ep, e.etp
    expert_dp = max(1, e.gpus // (p * ep * etp))
    dp = e.dp * e.cp
    if dp <= 1 and expert_dp <= 1:
        return 0.0
    n = dp if not sh.num_experts else max(dp, expert_dp)
    grads = busiest.params * steptime.GRAD_REDUCE_BYTES
    if e.zero2:  # reduce-scatter the grads, all-gather the bf16 weights
        return steptime.one_way_s(grads, n, link) + steptime.one_way_s(busiest.params * steptime.PARAM_GATHER_BYTES, n,
                                                                       link)
    return steptime.ring_allreduce_s(grads, n, link)


def flops_breakdown(sh: Shape, *, gbs: int, tp: int = 1, recompute: str = "none") -> dict[str, float]:
    """FLOPs per step. 'model': Megatron's num_floating_point_operations (training.py, transformer
    part: 3 x 2 x tokens x (QKV + proj + MLP GEMMs + logits) + 3 x 2 x B s^2 q/2 x 2 for causal
    attention); it has no recompute term. 'hardware': plus the recomputed forward work: full
    recompute reruns every checkpointed layer's forward (+1/3 of the layers' FLOPs), selective
    reruns the core attention's forward (+1/3 of its s^2 term)."""
    tokens = gbs * sh.seq
    q, kv, h = sh.h, sh.kv, sh.h
    attn_linear = 6 * (h * (q + 2 * kv) + q * h)
    ffn_factor = 3 if sh.swiglu else 2  # Megatron's ffn_expansion_factor
    if sh.num_experts:
        mlp = 6 * h * sh.moe_ffn * sh.topk * ffn_factor
    else:
        mlp = 6 * h * sh.ffn * ffn_factor
    logits = 6 * h * padded_vocab(sh.vocab, tp)
    core = gbs * sh.seq**2 * 6 * q  # x3 fwd/bwd x2 FMA x q/2 causal x2 (QK^T and PV)
    layers_linear = tokens * (attn_linear + mlp) * sh.layers
    layers_core = core * sh.layers
    model = layers_linear + layers_core + tokens * logits
    gran, method, n = parse_recompute(recompute)
    extra = 0.0
    if gran == "full":
        frac = 1.0 if method == "uniform" else min(n, sh.layers) / sh.layers
        extra = (layers_linear + layers_core) / 3 * frac
    elif gran == "selective":
        extra = layers_core / 3
    return {"model": float(model), "hardware": float(model + extra), "layers": float(layers_linear + layers_core),
            "logits": float(tokens * logits)}


# --------------------------------------------------------------------------- rendering

def _g(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def render(est: Estimate) -> str:
    """A short plan block: one line per item, GiB with one decimal, the formula named."""
    e = est
    lay = f"TP{e.tp} PP{e.pp} CP{e.cp} DP{e.dp}" + (f" EP{e.ep}" if e.ep > 1 else "") + (" SP" if e.sp else "")
    if e.virtual_stages > 1:
        lay += f" VPP{e.virtual_stages}"
    opt = (f"6 + 12/{e.dp * e.cp} B/param (ZeRO-2: bf16 weight 2 + fp32 grad 4 + fp32 master/Adam m,v 12 "
           f"over DP)" if e.zero2 else "18 B/param (bf16 weight 2 + fp32 grad 4 + fp32 master/Adam m,v 12)")
    attn = ("+ 5as/(ht): local DotProductAttention keeps the s x s scores" if e.spec == "local"
            else "+ 4as/(ht) logsumexp: SDPA keeps no s x s scores")
    if e.recompute == "selective":
        attn = "selective recompute: no attention-score term"
    elif e.recompute.startswith("full"):
        attn += f"; {e.recompute}: 2sbh per checkpoint + one chunk live"
    lines = [
        f"plan         {e.target}: {e.gpus} GPU(s), {lay}, MBS {e.mbs} x {e.num_microbatches} microbatch(es) "
        f"x DP {e.dp} = GBS {e.gbs}; spec {e.spec}; recompute {e.recompute}; ZeRO-2 {'on' if e.zero2 else 'off'}",
        f"params       {e.params_total:,} total (vocab {e.vocab} padded to {e.vocab_padded}, a multiple of "
        f"128 x TP{e.tp}); per GPU {', '.join(f'{p:,}' for p in e.params_per_gpu)}",
        f"state        {opt}",
        f"activations  {e.per_layer_sbh:.2f} x s b h bytes per layer, s={e.seq // e.cp} b={e.mbs} h={e.hidden} "
        f"(Korthikanti {'34/t' if e.sp else ('10 + 24/t' if e.tp > 1 else '34')} {attn})",
    ]
    for st in e.stages:
        tag = "GPU" if e.pp == 1 else f"stage {st.index}"
        per_logit = "(2 bf16 + 2 bf16 gradient, bf16_ce)" if e.bf16_ce else "(2 bf16 + 4 fp32)"
        head = f" + logits/loss {_g(st.head_bytes)} (b s V/t x {per_logit})" if st.head_bytes else ""
        lines.append(
            f"{tag:<12} weights {_g(st.weights_bytes)} + grads {_g(st.grads_bytes)} + optimizer "
            f"{_g(st.optimizer_bytes)} + activations {_g(st.activations_bytes)} ({st.layers} layers x "
            f"{st.inflight:g} microbatch(es) in flight){head}; peak at {st.peak_at}"
            + (f" (+ AdamW's fp32 temporary {_g(st.optimizer_step_bytes)})" if st.peak_at == "optimizer step" else "")
            + ": "
            f"allocated {_g(st.allocated_bytes)} + overhead {_g(st.overhead_bytes)}"
            + (f" + CUDA graph {_g(st.graph_bytes)}" if st.graph_bytes else "") + f" = {_g(st.peak_bytes)}")
    ring = max(st.ring_slack_bytes for st in e.stages)
    lines.append(
        f"overhead     CUDA context/cuBLAS {CUDA_CONTEXT_MIB} MiB + NCCL {nccl_mib(e.gpus, e.pp, e.cp)} MiB "
        f"+ allocator slack {ALLOCATOR_SLACK:.0%} of allocated"
        + (f" + ring attention's stranded K/V chunks {_g(ring)} (one per ring step per layer)" if ring else ""))
    verdict = "fits" if e.fits else "DOES NOT FIT"
    lines.append(f"peak         {e.peak_gib:.1f} GiB per GPU (busiest) vs {e.gpu_mem_gib:.1f} GiB "
                 f"({e.gpu_name}): {verdict}" + ("" if e.fits else "; fix: smaller MBS, ZeRO-2, more TP/PP or recompute"))
    extra = "" if e.hw_flops_per_step == e.flops_per_step else f" (+{(e.hw_flops_per_step / e.flops_per_step - 1):.0%} recompute)"
    bub = f" x (1 + bubble {e.bubble:.2f})" if e.bubble else ""
    lines.append(f"flops        {e.flops_per_step / 1e12:.1f} TFLOP per step (Megatron num_floating_point_operations)"
                 f"{extra}")
    lines.append(f"time         {e.step_ms:.0f} ms per step{bub} (GEMMs by size, kernel launches, optimizer traffic, "
                 f"communication: megalab/core/steptime.py): {e.tflops_per_gpu:.0f} TFLOP/s/GPU as Megatron "
                 f"reports it, {e.mfu:.0%} of {e.peak_tflops:.0f}")
    return "\n".join(lines)


