"""LayerNorm and RMSNorm as kernels torch.compile generates, forward and backward (the compiled_norm lever).

Why. Without TE or apex, megalab's Norm (megalab/runtime/spec.py) runs torch's own norm kernels. On row
111 (GPT-2 XL, 15 x 1024 tokens, hidden 1600) they take about 19 ms of a 345 ms GPU step (results/bench,
"Where a step goes"): the forward (5.2 ms, 97 calls), the input gradient (5.8 ms) and the weight and bias
gradients (`GammaBetaBackward`, 7.9 ms), which reads the input and the output gradient a second time at
about 1.2 TB/s, a third of what the GPU's memory gives.

What this does instead: the same math, written once below, compiled by torch.compile (Inductor: Triton
kernels; Megatron's own `jit_fuser` is torch.compile too) for CUDA tensors, its backward derived by
AOTAutograd. The statistics are taken in fp32 and the output rounded once to the input's dtype, as torch's
kernels do. Tensors off the GPU (the CPU tests) go on to torch's functions unchanged. Exactness against
torch's norms: tests/test_norm.py.
"""
from __future__ import annotations

import torch

_COMPILED: list = []  # the compiled _norm, made once per process at the first CUDA call


def _norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
          shifted: bool) -> torch.Tensor:
    """LayerNorm (or RMSNorm with `rms`) over the last dimension; `shifted`: the weight is stored as
    gamma - 1 (Megatron's zero-centred gamma). Statistics in fp32, one rounding at the end."""
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 for bf16/fp16 (float64 stays: the CPU tests)
    xf = x.to(acc)
    if rms:
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    else:
        mean = xf.mean(-1, keepdim=True)
        centred = xf - mean
        y = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    gamma = weight.to(acc) + 1 if shifted else weight.to(acc)
    y = y * gamma
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def _kernel():
    if not _COMPILED:
        _COMPILED.append(torch.compile(_norm, dynamic=False, fullgraph=True))
    return _COMPILED[0]


def compiled(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
             shifted: bool) -> torch.Tensor:
    """_norm, compiled (one process-wide compile; a new shape or dtype compiles again)."""
    return _kernel()(x, weight, bias, eps, rms, shifted)
