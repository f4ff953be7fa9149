"""Gradient clipping folded into the optimizer's kernel (lever `clip_in_adam`).

Megatron clips by total norm in a pass of its own: once the norm is known, every fp32 main gradient
is multiplied by max_norm / norm (multi_tensor_scale over [grads, grads]: a read and a write of each
gradient; its time: results/bench/README.md#where-a-step-goes-profiles),
and AdamW then reads each gradient again. torch's fused AdamW already divides every gradient by
`optimizer.grad_scale` inside its one kernel (the hook torch's GradScaler unscales through). Setting
it to norm / max_norm gives AdamW the clipped gradients without that pass: the same update up to
one rounding (grad / (1/c) instead of grad * c, both in fp32).

Folded only where it is exactly Megatron's clip: the parameters handed to the clip are all the
parameters with a gradient of one megalab FusedAdamW (one coefficient for all of them) and gradients in
`.grad` (not the precision-aware optimizer's decoupled ones). The coefficient may be a Python number
(Megatron's norm after its `.item()`) or a device tensor (lever `device_norm`: the norm never left the
GPU, so the coefficient is clamped there as Megatron clamps it, and grad_scale is 1 where nothing is
clipped). Anything else (a separate grad-norm group, another optimizer) goes to Megatron's own function. The
coefficient is used by the next step only: FusedAdamW clears it after every step, and a step that is
skipped leaves it for the next clip to overwrite (each step's clip runs before its optimizer step).
"""
from __future__ import annotations

import weakref

import torch

_OPTIMIZERS: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()  # FusedAdamW instances
_MEGATRON = []  # Megatron's clip_grad_by_total_norm_fp32, kept by install() for the cases not folded


def register(optimizer: torch.optim.Optimizer) -> None:
    """A fused AdamW whose step honours `grad_scale` (megalab's FusedAdamW registers itself)."""
    _OPTIMIZERS.add(optimizer)


def owner(params: list) -> torch.optim.Optimizer | None:
    """The registered optimizer whose parameters with a gradient are exactly `params`, else None."""
    wanted = {id(p) for p in params}
    for opt in list(_OPTIMIZERS):
        with_grad = {id(p) for g in opt.param_groups for p in g["params"] if p.grad is not None}
        if with_grad == wanted:
            return opt
    return None


def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad: bool = False):
    """Megatron's clip_grad_by_total_norm_fp32 (same arguments), folded into AdamW where it can be."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    coeff = max_norm / (total_norm + 1.0e-6)  # Megatron's coefficient, to the letter
    params = [p for p in parameters if p.grad is not None]
    opt = owner(params) if params and not use_decoupled_grad else None
    if opt is None:
        return _MEGATRON[0](parameters, max_norm, total_norm, use_decoupled_grad)
    if isinstance(coeff, torch.Tensor):  # device_norm: no host sync here, the kernel reads the scale
        opt.grad_scale = torch.reciprocal(coeff.clamp_max(1.0).float()).reshape(())
    else:
        opt.grad_scale = (torch.full((), 1.0 / coeff, dtype=torch.float32, device=params[0].grad.device)
                          if coeff < 1.0 else None)


def install() -> bool:
    """Route Megatron's clip (both names it is called by) through the function above."""
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as optmod

    if clip.clip_grad_by_total_norm_fp32 is not clip_grad_by_total_norm_fp32:
        _MEGATRON[:] = [clip.clip_grad_by_total_norm_fp32]
    clip.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32
    if hasattr(optmod, "clip_grad_by_total_norm_fp32"):
        optmod.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32
    return True
