"""Speed without Transformer Engine or apex: the fast-path levers' installs, and the drop-ins that live here.

With neither TE nor apex installed, Megatron-Core 0.19 falls back on plain PyTorch for work that touches every
parameter each step: torch's foreach AdamW, `local_multi_tensor_l2_norm` (one torch.norm and a host copy per tensor)
for the clip, `local_multi_tensor_scale` (a temporary per tensor) for scaling, a bf16 weight gradient added into the
fp32 main_grad by one kernel a parameter (580 adds at row 111: results/bench, "Where a step goes"), and a linear
layer's bias added in a pass after its GEMM. The drop-ins below replace those fallbacks, each computing the same
function (tests/test_fastpath.py); the other levers' code is in their own files.

The levers themselves (what each does, what it needs, where the default turns it on, its evidence) are the table of
megalab/runtime/levers.py, read as docs/levers.md. `apply` installs the ones a run names, in the table's order.
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
