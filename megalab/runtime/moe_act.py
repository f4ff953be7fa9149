"""The MoE experts' GeLU times each row's router probability, one Triton kernel each way (the moe_act lever).

Why. Between the experts' two grouped GEMMs Megatron's MLP runs `gelu(h)`, then `h * probs` with the probs in fp32,
which writes an fp32 copy of the whole [tokens x top-k, ffn] activation before rounding it back to bf16; the backward
runs the multiply's two gradients and GeLU's as separate passes. With 64 experts, top-8 and 16,384 tokens that
activation is 131,072 x 1,024: each pass moves a quarter to half a gigabyte.

What. Forward: y = bf16(gelu(h) * p[row]) in one read of h. Backward: dh = dy * p[row] * gelu'(h) and
dp[row] = sum over the row of dy * gelu(h), in one read of h and dy, the row sums in fp32. GeLU is the exact (erf)
form Megatron's expert MLP uses (F.gelu); other activations, gated units and biases keep Megatron's arithmetic
(megalab/runtime/grouped_experts.py decides). Against that arithmetic in Triton's interpreter: tests/test_moe_act.py.
"""
from __future__ import annotations

import torch

from megalab.runtime import levers
from megalab.runtime.jit import kernel

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

LEVER = levers.MOE_ACT
# 4 rows x 4 warps: the fastest tile each way at row 510's shape (results/bench/moe-kernels-microbench.txt)
BLOCK_ROWS = 4  # rows per program; a row (ffn columns) is walked in BLOCK_COLS steps
BLOCK_COLS = 1024
WARPS = 4


def _forward(h_ptr, p_ptr, y_ptr, rows, n, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < rows
    p = tl.load(p_ptr + r, mask=rmask, other=0.0).to(tl.float32)
    for c0 in range(0, n, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        m = rmask[:, None] & (c[None, :] < n)
        offs = r[:, None].to(tl.int64) * n + c[None, :]
        x = tl.load(h_ptr + offs, mask=m, other=0.0).to(tl.float32)
        g = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # exact GeLU: x * Phi(x)
        tl.store(y_ptr + offs, (g * p[:, None]).to(y_ptr.dtype.element_ty), mask=m)


def _backward(h_ptr, p_ptr, dy_ptr, dh_ptr, dp_ptr, rows, n, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < rows
    p = tl.load(p_ptr + r, mask=rmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in range(0, n, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        m = rmask[:, None] & (c[None, :] < n)
        offs = r[:, None].to(tl.int64) * n + c[None, :]
        x = tl.load(h_ptr + offs, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=m, other=0.0).to(tl.float32)
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)  # Phi'(x): gelu'(x) = Phi(x) + x Phi'(x)
        tl.store(dh_ptr + offs, (dy * p[:, None] * (cdf + x * pdf)).to(dh_ptr.dtype.element_ty), mask=m)
        acc += tl.sum(tl.where(m, dy * x * cdf, 0.0), axis=1)
    tl.store(dp_ptr + r, acc, mask=rmask)


class _WeightedGeLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, probs):
        ctx.save_for_backward(h, probs)
        rows, n = h.shape
        y = torch.empty_like(h)
        if rows:
            kernel(_forward)[(triton.cdiv(rows, BLOCK_ROWS),)](h, probs, y, rows, n, BLOCK_R=BLOCK_ROWS,
                                                               BLOCK_C=min(BLOCK_COLS, triton.next_power_of_2(n)),
                                                               num_warps=WARPS)
        return y

    @staticmethod
    def backward(ctx, dy):
        h, probs = ctx.saved_tensors
        rows, n = h.shape
        dy = dy.contiguous()
        dh = torch.empty_like(h)
        dp = torch.empty(rows, dtype=torch.float32, device=h.device)
        if rows:
            kernel(_backward)[(triton.cdiv(rows, BLOCK_ROWS),)](h, probs, dy, dh, dp, rows, n, BLOCK_R=BLOCK_ROWS,
                                                                BLOCK_C=min(BLOCK_COLS, triton.next_power_of_2(n)),
                                                                num_warps=WARPS)
        return dh, dp.to(probs.dtype)


def eligible(h: torch.Tensor, probs: torch.Tensor) -> bool:
    """A 2-D contiguous activation and one probability per row, on a GPU (or in Triton's interpreter)."""
    return (triton is not None and h.dim() == 2 and probs.shape == h.shape[:1] and h.is_contiguous()
            and probs.is_contiguous() and (h.is_cuda or h.device.type == "cpu" and _interpreted()))


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def weighted_gelu(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """bf16(gelu(h) * probs[:, None]) with its gradients in one kernel each way (see the module doc)."""
    return _WeightedGeLU.apply(h, probs)
