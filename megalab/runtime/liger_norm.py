"""LayerNorm and RMSNorm in liger-kernel's Triton kernels (the liger_norm lever): a maintained library's norms,
tried run against run against megalab's own (triton_norm). Evidence: results/bench/README.md#levers-tried-against-the-default.

liger-kernel is optional: the lever applies only where it imports (levers.REQUIREMENTS). Its kernels take a
2-D view of x; Megatron's zero-centred gamma (weight stored as gamma - 1) is liger's RMSNorm `offset` and, for
LayerNorm, the weight plus one.
"""
from __future__ import annotations

import torch

from megalab.runtime import levers


def takes(x: torch.Tensor) -> bool:
    """Whether megalab's Norm runs liger's kernels on x: the lever is on and x is on the GPU."""
    return levers.on(levers.LIGER_NORM) and x.is_cuda


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
         shifted: bool) -> torch.Tensor:
    """LayerNorm (RMSNorm with `rms`) of x over its last dimension; `shifted`: weight stored as gamma - 1."""
    if rms:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        # "gemma" casting: statistics and scale in fp32, one rounding (torch's F.rms_norm does the same);
        # in_place=False: dY may be read again by autograd (the residual's branch)
        return LigerRMSNormFunction.apply(x, weight, eps, 1.0 if shifted else 0.0, "gemma", False)
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return LigerLayerNormFunction.apply(x, weight + 1 if shifted else weight, bias, eps)
