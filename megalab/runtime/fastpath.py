"""Speed without Transformer Engine or apex: faster stand-ins for what Megatron falls back on.

With neither TE nor apex installed, Megatron-Core 0.19 uses plain PyTorch for three per-step jobs
that touch every parameter:
  - the optimizer: torch.optim.AdamW in its default multi-tensor ("foreach") mode;
  - the gradient norm for clipping: `local_multi_tensor_l2_norm`, one torch.norm per tensor and a
    device-to-host copy of each result (a sync per parameter tensor);
  - gradient scaling / main-to-model copies: `local_multi_tensor_scale`, a temporary per tensor.
Each patch below replaces one of them with PyTorch's fused or foreach kernel. A fourth,
`fused_wgrad`, stands in for apex's `fused_weight_gradient_mlp_cuda`, the kernel Megatron's linear
layers call for `--gradient-accumulation-fusion`: the weight-gradient GEMM adds straight into the
fp32 main_grad (torch.addmm with out_dtype=float32, one cuBLAS call) instead of writing a bf16
gradient that a separate fp32 `add` kernel per parameter then accumulates (580 adds, 10.6 ms a step
of row 111 in results/bench, "Where a step goes"). A fifth,
`cudnn_sdpa`, puts cuDNN's fused attention first in PyTorch's SDPA backend order (PyTorch
prefers flash; on Hopper cuDNN's kernel is often faster; any shape it cannot serve falls through). A sixth,
`bf16_ce`, computes the loss from the bf16 logits without an fp32 copy of them
(megalab/runtime/cross_entropy.py). A seventh, `addmm_bias`, adds a linear layer's bias inside its GEMM
(torch.addmm: cuBLASLt's bias epilogue) where Megatron runs the GEMM and then a separate broadcast add
(the QKV projection: 9.3 ms a step of row 111). A ninth, `compiled_rope`, runs Megatron's unfused
rotary embedding as one compiled kernel each way (megalab/runtime/rope.py). A tenth, `clip_in_adam`,
hands gradient clipping's coefficient to fused AdamW's kernel instead of scaling every gradient in a
pass of its own (megalab/runtime/clip.py). An eleventh, `embed_wgrad`, adds the word embedding's
gradient rows into its fp32 main_grad instead of a dense table-sized gradient per micro-batch
(megalab/runtime/embedding_grad.py). A twelfth, `sdpa_gqa`, lets the attention kernel read each shared
K/V head itself (SDPA's enable_gqa) instead of megalab's spec repeating K and V for every query head
(megalab/runtime/spec.py, SDPAttention). A thirteenth, `flat_adam`, runs fused AdamW over flat buffers laid
out like Megatron's grad buffer in one kernel that also writes the bf16 weights, so Megatron's per-tensor
master-to-weight copy goes (megalab/runtime/flat_adam.py). A fourteenth, `device_norm`, gives Megatron's clip
the tensor-scale kernel it looks for in TE (multi_tensor_scale_tensor), so the clip's norm stays on the GPU:
Megatron otherwise reads it to the host (`.item()`), and the GPU waits idle while Python prepares the
optimizer's launch. A fifteenth, `compiled_norm`, runs megalab's LayerNorm/RMSNorm as the kernels torch.compile
generates, forward and backward (megalab/runtime/norm.py); a sixteenth, `triton_norm`, runs them as megalab's
own Triton kernels, whose backward reads its inputs once (megalab/runtime/triton_norm.py); a seventeenth,
`bias_gelu`, runs the MLP's bias-GeLU backward as one Triton kernel that also sums the bias's gradient
(megalab/runtime/bias_gelu.py); an eighteenth, `norm_residual`, beside triton_norm, lets a transformer layer's
norms hand Megatron the residual too, so that its gradient is added inside the norm's backward kernel instead of
in a pass of autograd's own (megalab/runtime/triton_norm.py); a nineteenth, `dropout_add`, runs Megatron's
bias-dropout-add as one Triton kernel each way whose backward draws the dropout mask again instead of reading a
saved one, and sums the bias's gradient as it goes (megalab/runtime/dropout_add.py); a twentieth, `qkv_pack`,
beside addmm_bias, packs the QKV projection's gradient (the cat of the query, key and value gradients) and sums its
bias's gradient in the same pass, which the linear layer's backward then skips (megalab/runtime/qkv_split.py); a
twenty-first, `zero_overlap`, zeroes the grad buffer on a side stream beside the forward instead of ahead of it
(megalab/runtime/zero_overlap.py); a twenty-second, `gelu_epilogue`, adds a GeLU MLP's fc1 bias and applies GeLU in
fc1's GEMM epilogue, and GeLU's derivative in fc2's input-gradient GEMM, through cuBLASLt (nvmath-python;
megalab/runtime/gelu_epilogue.py).
Each is named in MEGALAB_FAST (FAST=... or all); the launcher's default turns on those that paid in the benchmark
(megalab/core/variables.py, default_fast) and the rest stay opt-in, so a benchmark can show what each one buys.
Every one computes the same function as the piece it replaces (tests/test_fastpath.py and the lever's own test).

An eighth lever, `grouped_gemm`, is not a patch: megalab/runtime/spec.py reads it when it builds MoE layers and
then gives them GroupedMLP experts (megalab/runtime/grouped_experts.py: torch._grouped_mm instead of
SequentialMLP's loop over the experts; tests/test_grouped_experts.py). The launcher adds it by
default where the model preset asks for moe_grouped_gemm and Transformer Engine is absent.
"""
from __future__ import annotations

import importlib

import torch

from megalab.runtime import levers


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for amp_C.multi_tensor_l2norm: one fused pass, no host sync."""
    tensors = [t for group in tensor_lists for t in group]
    if not tensors:
        return torch.zeros(1, dtype=torch.float, device=_device()), None
    from megalab.runtime import flat_adam

    total = flat_adam.grad_norm(tensors)  # flat_adam's buffers: one kernel over the grad buffer
    if total is not None:
        return total, None
    norms = torch._foreach_norm(tensors)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    return total.reshape(1), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for amp_C.multi_tensor_scale: dst = src * scale, without a temporary per tensor. Also TE's
    multi_tensor_scale_tensor (the scale a 1-element device tensor), which device_norm hands Megatron's clip."""
    src, dst = tensor_lists[0], tensor_lists[1]
    if not src:
        return
    if not all(a is b for a, b in zip(src, dst)):  # Megatron's clip scales in place ([grads, grads]): no copy
        torch._foreach_copy_(dst, src)
    if isinstance(scale, torch.Tensor):
        torch._foreach_mul_(dst, scale.reshape(()))  # read on the device: no host sync
    elif scale != 1.0:  # Megatron copies main to model params with scale 1.0: a second pass for nothing
        torch._foreach_mul_(dst, scale)


def wgrad_gemm_accum_fp32(total_input, grad_output, main_grad):
    """Drop-in for apex's fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32.

    main_grad (fp32, [out, in]) += grad_output^T @ total_input, with 2-D bf16/fp16 inputs [tokens, out]
    and [tokens, in], as Megatron's LinearWithGradAccumulationAndAsyncCommunication passes them. On
    CUDA one GEMM accumulates in fp32 and adds into main_grad in its epilogue: the bf16 gradient is
    never rounded or written. Elsewhere (CPU, or a torch without addmm's out_dtype) the same sum in
    two steps, in fp32.
    """
    if main_grad.is_cuda and _ADDMM_OUT_DTYPE[0]:
        try:
            torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)
            return
        except (RuntimeError, TypeError):  # a torch whose addmm.dtype_out wants self in the input dtype
            _ADDMM_OUT_DTYPE[0] = False
    main_grad.addmm_(grad_output.t().float(), total_input.float())


def wgrad_gemm_accum_fp16(total_input, grad_output, main_grad):
    """Drop-in for apex's wgrad_gemm_accum_fp16: main_grad in the inputs' 16-bit type."""
    main_grad.addmm_(grad_output.t(), total_input)


_ADDMM_OUT_DTYPE = [True]  # cleared at the first torch that refuses an fp32 `self` (then: unfused, exact)


def install_wgrad_fusion() -> bool:
    """Give Megatron a `fused_weight_gradient_mlp_cuda` module backed by the two functions above.

    Megatron looks the module up twice: once when megatron.core.tensor_parallel.layers is imported
    (setting `_grad_accum_fusion_available`), and lazily in megatron.core.utils for the deferred
    embedding wgrad. Both are served: the module goes into sys.modules and into layers' globals.
    Returns False (and changes nothing) where a real extension (apex) is already there.
    """
    import sys
    import types

    from megatron.core.tensor_parallel import layers

    name = "fused_weight_gradient_mlp_cuda"
    if layers._grad_accum_fusion_available and not getattr(sys.modules.get(name), "MEGALAB", False):
        return False  # apex's own extension imported: it is the real fused kernel
    mod = types.ModuleType(name, "megalab's torch stand-in for apex's extension")
    mod.MEGALAB = True
    mod.wgrad_gemm_accum_fp32 = wgrad_gemm_accum_fp32
    mod.wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp16
    sys.modules[name] = mod
    layers.fused_weight_gradient_mlp_cuda = mod
    layers._grad_accum_fusion_available = True
    return True


# LinearWithGradAccumulationAndAsyncCommunication.forward's arguments in the Megatron-Core this forward
# copies (0.19); another signature leaves Megatron's forward alone.
_LINEAR_ARGS = ("ctx", "input", "weight", "bias", "gradient_accumulation_fusion", "allreduce_dgrad",
                "sequence_parallel", "grad_output_buffer", "wgrad_deferral_limit", "tp_group", "gtp_remat_size")


def linear_forward_addmm_bias(ctx, input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
                              sequence_parallel, grad_output_buffer, wgrad_deferral_limit, tp_group,
                              gtp_remat_size):
    """Megatron-Core 0.19's LinearWithGradAccumulationAndAsyncCommunication.forward, line for line,
    except the GEMM: `addmm(bias, x, W^T)` adds the bias in the GEMM's epilogue (in fp32, before the
    one rounding to bf16) instead of `matmul(x, W^T) + bias`, a second pass over the output, and the
    bias kept on the node for qkv_pack. The backward is Megatron's own, unchanged (it reads only what
    this saves, and sums the bias's gradient unless qkv_pack's split has cleared `use_bias`)."""
    from megatron.core.tensor_parallel.layers import dist_all_gather_func, get_global_memory_buffer

    if gradient_accumulation_fusion and hasattr(weight, "main_grad"):
        main_grad = weight.main_grad
    else:
        main_grad = None
    ctx.save_for_backward(input, weight)
    if gtp_remat_size > 1:
        weight = weight.all_gather_and_prefetch(fwd=True)
    ctx.main_grad = main_grad
    ctx.use_bias = bias is not None
    ctx.gradient_accumulation_fusion = gradient_accumulation_fusion
    ctx.allreduce_dgrad = allreduce_dgrad
    ctx.sequence_parallel = sequence_parallel
    ctx.wgrad_deferral_limit = wgrad_deferral_limit
    ctx.grad_output_buffer = grad_output_buffer
    ctx.tp_group = tp_group
    ctx.gtp_remat_size = gtp_remat_size
    ctx.megalab_bias = bias  # qkv_pack's split takes the bias's gradient from here (megalab/runtime/qkv_split.py)
    if sequence_parallel:
        dim_size = list(input.size())
        dim_size[0] = dim_size[0] * tp_group.size()
        all_gather_buffer = get_global_memory_buffer().get_tensor(dim_size, input.dtype, "mpu")
        dist_all_gather_func(all_gather_buffer, input, group=tp_group)
        total_input = all_gather_buffer
    else:
        total_input = input
    if bias is None:
        return torch.matmul(total_input, weight.t())
    flat = total_input.reshape(-1, total_input.size(-1))
    return torch.addmm(bias, flat, weight.t()).view(*total_input.shape[:-1], weight.size(0))


def install_addmm_bias() -> bool:
    """Make linear_forward_addmm_bias the forward of Megatron's linear autograd function (every
    Column/RowParallelLinear without TE calls it). False, and nothing changed, where Megatron's
    forward has another signature than the one copied."""
    import inspect

    from megatron.core.tensor_parallel import layers

    fn = layers.LinearWithGradAccumulationAndAsyncCommunication
    current = inspect.unwrap(fn.forward)
    if current is linear_forward_addmm_bias:
        return True
    if tuple(inspect.signature(current).parameters) != _LINEAR_ARGS:
        return False
    fn.forward = staticmethod(layers.custom_fwd(linear_forward_addmm_bias))
    return True


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


class FusedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW with its single-kernel implementation (fused=True) switched on. Its kernel
    divides each gradient by `grad_scale` where one is set: clip_in_adam (megalab/runtime/clip.py) sets
    it for one step."""

    def __init__(self, params, *args, **kwargs):
        kwargs.setdefault("fused", True)
        kwargs.pop("foreach", None)
        super().__init__(params, *args, **kwargs)
        from megalab.runtime import clip

        clip.register(self)

    def step(self, closure=None):
        from megalab.runtime import flat_adam

        try:
            if closure is None and flat_adam.step(self):  # flat_adam: one kernel over flat buffers
                return None
            return super().step(closure)
        finally:
            self.grad_scale = None  # a clip coefficient is one step's

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        from megalab.runtime import flat_adam

        flat_adam.readopt(self)  # the loaded moments into flat_adam's buffers, where it has them


def prefer_cudnn_attention() -> bool:
    """Order SDPA's backends cuDNN, flash, memory-efficient, math for the rest of the process (a GPU-only choice:
    on CPU there is nothing to reorder)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    sdpa_kernel(order, set_priority=True).__enter__()  # entered for good: never exited
    return True


def install_fused_adam() -> bool:
    """Megatron builds `torch.optim.AdamW(...)` by attribute lookup when it makes the optimizer: FusedAdamW
    instead, where Megatron falls back on torch's optimizer (no apex)."""
    import megatron.core.optimizer as mopt

    if not getattr(mopt, "USING_PYTORCH_OPTIMIZER", False):
        return False
    torch.optim.AdamW = FusedAdamW
    return True


def install_foreach_norm() -> bool:
    import megatron.core.optimizer.clip_grads as clip
    from megatron.core import utils as mutils

    if clip.l2_norm_impl is not mutils.local_multi_tensor_l2_norm:
        return False
    clip.l2_norm_impl = foreach_l2_norm
    return True


def install_foreach_scale() -> bool:
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as optmod
    from megatron.core import utils as mutils

    if clip.multi_tensor_scale_impl is not mutils.local_multi_tensor_scale:
        return False
    clip.multi_tensor_scale_impl = foreach_scale
    if getattr(optmod, "multi_tensor_scale_impl", None) is mutils.local_multi_tensor_scale:
        optmod.multi_tensor_scale_impl = foreach_scale
    return True


def install_device_norm() -> bool:
    """Megatron keeps the clip's norm a device tensor where a tensor-scale kernel exists (TE's): this is one."""
    import megatron.core.optimizer.clip_grads as clip

    if getattr(clip, "multi_tensor_scale_tensor_impl", False) is not None:
        return False
    clip.multi_tensor_scale_tensor_impl = foreach_scale
    return True


def install_flat_adam() -> bool:
    from megalab.runtime import flat_adam

    return flat_adam.install(FusedAdamW)  # it replaces FusedAdamW's step (fused_adam, which it needs, installed it)


def _has(requirement: str) -> bool:
    """Whether this process has what a lever requires (levers.REQUIREMENTS)."""
    if requirement == "cuda":
        return torch.cuda.is_available()
    try:
        importlib.import_module(requirement)
    except ImportError:
        return False
    return True


def apply(names) -> list[str]:
    """Install the named levers into Megatron's modules, in the table's order (megalab/runtime/levers.py), and
    return those applied: a lever applies where the machine has what it requires, the levers it needs were applied,
    and its installer found Megatron's fallback to replace (where TE or apex provide the kernel, it is left alone).
    The spec's levers are not installed and not returned, but the spec reads them with the rest (levers.applied)."""
    asked = set(names)
    applied = []
    for lever in levers.TABLE:
        if lever.name not in asked or lever.spec:
            continue
        if not all(_has(r) for r in lever.requires) or not all(n in applied for n in lever.needs):
            continue
        if lever.install:
            module, function = lever.install.split(":")
            if not getattr(importlib.import_module(module), function)():
                continue
        applied.append(lever.name)
    levers.mark_applied([*applied, *(n for n in levers.SPEC_LEVERS if n in asked)])
    return applied
