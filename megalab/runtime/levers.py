"""Names of the run's levers, shared by the launcher and the code inside torchrun. No torch here:
the harness reads these to plan a run on a machine without torch (`make list`, dry runs).

  - the fast-path levers (MEGALAB_FAST / FAST=, megalab/runtime/fastpath.py), and `requested()`
    which parses them;
  - the context-parallel modes megalab's TE-free attention has (megalab/runtime/cp_attention.py).
"""
from __future__ import annotations

import os

GROUPED_GEMM = "grouped_gemm"  # megalab/runtime/grouped_experts.py's MoE experts
FUSED_WGRAD = "fused_wgrad"  # megalab's stand-in for apex's wgrad kernel: --gradient-accumulation-fusion
BF16_CE = "bf16_ce"  # megalab/runtime/cross_entropy.py: the loss on the bf16 logits, no fp32 copy
ADDMM_BIAS = "addmm_bias"  # megalab/runtime/fastpath.py: a linear layer's bias added in its GEMM
COMPILED_ROPE = "compiled_rope"  # megalab/runtime/rope.py: rotary embeddings in one kernel each way
CLIP_IN_ADAM = "clip_in_adam"  # megalab/runtime/clip.py: gradient clipping inside fused AdamW's kernel
EMBED_WGRAD = "embed_wgrad"  # megalab/runtime/embedding_grad.py: the embedding's gradient rows into main_grad
FLAT_ADAM = "flat_adam"  # megalab/runtime/flat_adam.py: AdamW over flat buffers, the bf16 weights in its kernel
DEVICE_NORM = "device_norm"  # megalab/runtime/fastpath.py: the clip's norm stays on the GPU, no host sync
COMPILED_NORM = "compiled_norm"  # megalab/runtime/norm.py: LayerNorm/RMSNorm as torch.compile's kernels
TRITON_NORM = "triton_norm"  # megalab/runtime/triton_norm.py: LayerNorm/RMSNorm in megalab's Triton kernels
BIAS_GELU = "bias_gelu"  # megalab/runtime/bias_gelu.py: bias-GeLU's backward and its bias gradient in one kernel
NORM_RESIDUAL = "norm_residual"  # megalab/runtime/triton_norm.py: the residual's gradient added in the norm's kernel
DROPOUT_ADD = "dropout_add"  # megalab/runtime/dropout_add.py: bias-dropout-add in one kernel each way, no saved mask
QKV_PACK = "qkv_pack"  # megalab/runtime/qkv_split.py: the QKV gradient's cat and its bias's sum in one pass
SDPA_GQA = "sdpa_gqa"  # megalab/runtime/spec.py: grouped-query attention read by the kernel, K/V not repeated
ZERO_OVERLAP = "zero_overlap"  # megalab/runtime/zero_overlap.py: the grad buffer zeroed beside the forward
GELU_EPILOGUE = "gelu_epilogue"  # megalab/runtime/gelu_epilogue.py: the MLP's bias and GeLU in cuBLASLt's epilogues
MOE_GATHER = "moe_gather"  # megalab/runtime/moe_dispatch.py: MoE tokens permuted by gathers, no host sync (EP = ETP = 1)
EXPERT_STACK = "expert_stack"  # megalab/runtime/grouped_experts.py: a layer's expert weights as one tensor each
MOE_ACT = "moe_act"  # megalab/runtime/moe_act.py: the experts' GeLU times the router's probability, one kernel each way
PATCHES = ("fused_adam", "foreach_norm", "foreach_scale", FUSED_WGRAD, "cudnn_sdpa", BF16_CE, ADDMM_BIAS,
           GROUPED_GEMM, COMPILED_ROPE, CLIP_IN_ADAM, EMBED_WGRAD, SDPA_GQA, FLAT_ADAM, DEVICE_NORM,
           COMPILED_NORM, TRITON_NORM, BIAS_GELU, NORM_RESIDUAL, DROPOUT_ADD, QKV_PACK, ZERO_OVERLAP,
           GELU_EPILOGUE, MOE_GATHER, EXPERT_STACK, MOE_ACT)
SPEC_LEVERS = (GROUPED_GEMM, MOE_GATHER, EXPERT_STACK, MOE_ACT)  # read by megalab/runtime/spec.py, so fastpath.apply leaves them alone

CP_MODES = ("p2p", "all_gather", "a2a")  # Megatron's --cp-comm-type values megalab's CP attention has


def requested(env=os.environ) -> list[str]:
    """The lever names in MEGALAB_FAST ('', 0, none: none; all: every one); unknown ones raise ValueError."""
    raw = env.get("MEGALAB_FAST", "").strip()
    if not raw or raw in ("0", "none"):
        return []
    names = list(PATCHES) if raw == "all" else [n.strip() for n in raw.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PATCHES))
    if unknown:
        raise ValueError(f"MEGALAB_FAST: unknown patch(es) {unknown}; fix: choose from {', '.join(PATCHES)} or all")
    return names
