"""LayerNorm and RMSNorm in hand-written Triton kernels, forward and backward (the triton_norm lever).

Why. Without TE or apex, megalab's Norm (megalab/runtime/spec.py) runs torch's own kernels. Those are three
passes: the forward, the input gradient and `GammaBetaBackward` for the weight and bias gradients, which reads
the input and the output gradient a second time (their time: results/bench/README.md#where-a-step-goes-profiles).
The ideal moves about a third of those bytes: the forward reads x and writes y, the backward reads x and dy and
writes dx, each once. These kernels beat compiled_norm (torch.compile's kernels for the same math) too:
results/bench/triton-norm-microbench.txt.

What this does. Forward: one program per row, the statistics in fp32, y rounded once to x's dtype (as
torch's kernels do); the row's mean and 1/std are kept for the backward (8 bytes a row). Backward: a grid of
a few programs per SM, each walking its block of rows: the row's input gradient, and the weight and bias
gradients summed over its rows in fp32 registers, the loads of the rows ahead in flight; one more kernel adds the
programs' partial sums (a [programs, hidden] fp32 table, 3 MB at row 111) straight into the fp32 main_grad of
Megatron's grad buffer (megalab/runtime/param_grad.py). So dy and x are read once, and the weight and bias
gradients need no pass of their own, no bf16 rounding and no add of Megatron's hook.

Scope. CUDA tensors whose hidden size fits one block (up to 16384 elements), any float dtype; anything else
goes to torch's functions (megalab/runtime/spec.py keeps that path). Exactness against torch's norms, in the
Triton interpreter on CPU: tests/test_triton_norm.py.
"""
from __future__ import annotations

import os

import torch

from megalab.runtime import levers, param_grad
from megalab.runtime.jit import kernel, sms

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it); without it, no lever
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

MAX_HIDDEN = 16384  # one row in one block of registers; wider rows go to torch's kernels
# backward: enough programs to fill the GPU, few enough that the partial table stays small; 3 an SM beat 4 in the
# microbenchmark (results/bench/grid-tuning-microbench.txt).
PROGRAMS_PER_SM = 3
MIN_ROWS = 8  # backward: rows a program takes at least, so that a short batch does not make the table the work
# backward: its row loop software-pipelined, the next two rows' loads issued while this one computes. One row's
# loads at a time left each row a DRAM round trip with few warps an SM to hide it; 3 stages beat 1, 2 and 4, and
# beat more programs an SM (results/bench/pipelined-loops-microbench.txt).
STAGES = 3


def _norm_forward(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n, eps,
             RMS: tl.constexpr, HAS_BIAS: tl.constexpr, SHIFTED: tl.constexpr, BLOCK: tl.constexpr):
    """One row: y = (x - mean) / std * gamma + beta (RMS: x / rms * gamma), statistics in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    if RMS:
        mean = 0.0
        xc = x
    else:
        mean = tl.sum(x, axis=0) / n
        xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n + eps)
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if SHIFTED:  # Megatron's zero-centred gamma: the weight is stored as gamma - 1
        gamma = gamma + 1.0
    y = xc * rstd * gamma
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if not RMS:
        tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def norm_backward(x_ptr, w_ptr, dy_ptr, dr_ptr, dx_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, rows, n,
                   rows_per_program, RMS: tl.constexpr, HAS_BIAS: tl.constexpr, SHIFTED: tl.constexpr,
                   HAS_RES: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """A block of rows: each row's dx (plus the residual's gradient dr, with HAS_RES), and this block's sums of
    dy * xhat (dgamma) and dy (dbeta)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if SHIFTED:
        gamma = gamma + 1.0
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for row in tl.range(first, last, num_stages=STAGES):  # STAGES - 1 later rows' loads in flight
        off = tl.cast(row, tl.int64) * n
        x = tl.load(x_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        wdy = gamma * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n
        if RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            c2 = tl.sum(wdy, axis=0) / n
            dx = (wdy - (xhat * c1 + c2)) * rstd
        if HAS_RES:  # x also fed the residual branch: its gradient joins here, before the one rounding
            dx += tl.load(dr_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + off + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        if HAS_BIAS:
            db += dy
    tl.store(dw_ptr + pid * n + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(db_ptr + pid * n + cols, db, mask=mask)


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


def warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def _programs(x: torch.Tensor, rows: int) -> int:
    return max(1, min(-(-rows // MIN_ROWS), sms(x.device) * PROGRAMS_PER_SM))


def _forward(ctx, x, weight, bias, eps, rms, shifted):
    """The forward kernel over x's rows; saves what _backward needs on ctx."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty_like(x2)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = _block(n)
    kernel(_norm_forward)[(rows,)](x2, weight, bias if bias is not None else weight, y, mean, rstd, n, eps,
                                   RMS=rms, HAS_BIAS=bias is not None, SHIFTED=shifted, BLOCK=block,
                                   num_warps=warps(block))
    ctx.save_for_backward(x2, weight, mean, rstd)
    ctx.params = [weight] if bias is None else [weight, bias]  # the Parameters: main_grad lives on them
    ctx.rms, ctx.shifted, ctx.shape = rms, shifted, x.shape
    return y.view(x.shape)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    t = t.reshape(-1, n)
    return t if t.is_contiguous() else t.contiguous()


def _backward(ctx, dy, dres):
    """(dx, dweight, dbias, None, None, None): dx plus `dres` (the residual's gradient) where it is given."""
    x2, weight, mean, rstd = ctx.saved_tensors
    rows, n = x2.shape
    dy2 = _rows(dy, n) if dy is not None else torch.zeros_like(x2)
    dr2 = _rows(dres, n) if dres is not None else dy2
    dx = torch.empty_like(x2)
    programs = _programs(x2, rows)
    per = triton.cdiv(rows, programs)
    programs = triton.cdiv(rows, per)
    parts = param_grad.tables(len(ctx.params), programs, n, x2.device)  # dgamma's, then dbeta's
    has_bias = len(ctx.params) == 2
    block = _block(n)
    kernel(norm_backward)[(programs,)](x2, weight, dy2, dr2, dx, mean, rstd, parts[0], parts[-1], rows, n, per,
                                        RMS=ctx.rms, HAS_BIAS=has_bias, SHIFTED=ctx.shifted,
                                        HAS_RES=dres is not None, BLOCK=block, STAGES=STAGES,
                                        num_warps=warps(block))
    grads = param_grad.reduce(ctx.params, parts) if any(ctx.needs_input_grad[1:3]) else [None, None]
    return dx.view(ctx.shape), grads[0], grads[1] if has_bias else None, None, None, None


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms, shifted):
        return _forward(ctx, x, weight, bias, eps, rms, shifted)

    @staticmethod
    def backward(ctx, dy):
        return _backward(ctx, dy, None)


class _NormResidual(torch.autograd.Function):
    """The norm, and x itself as a second output for the residual branch (the norm_residual lever): autograd
    then hands that branch's gradient to this backward, whose kernel adds it to dx, instead of adding the two
    gradients of x in a pass of its own (a read of two [tokens, hidden] tensors and a write of one)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms, shifted):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros to read
        return _forward(ctx, x, weight, bias, eps, rms, shifted), x

    @staticmethod
    def backward(ctx, dy, dres):
        return _backward(ctx, dy, dres)


def fits(x: torch.Tensor) -> bool:
    """Whether these kernels take `x` (else torch's norm does)."""
    return triton is not None and x.shape[-1] <= MAX_HIDDEN and x.numel() > 0


def takes(x: torch.Tensor) -> bool:
    """Whether megalab's Norm runs these kernels on `x`: the lever is on, x fits, and x is on the GPU (or Triton's
    interpreter runs, which takes CPU tensors: the CPU tests of the layers around them)."""
    return levers.on(levers.TRITON_NORM) and fits(x) and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
         shifted: bool) -> torch.Tensor:
    """LayerNorm (RMSNorm with `rms`) of x over its last dimension; `shifted`: weight stored as gamma - 1."""
    return _Norm.apply(x, weight, bias, eps, rms, shifted)


def norm_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
                  shifted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x), x): x as the residual whose gradient the norm's backward adds (_NormResidual)."""
    return _NormResidual.apply(x, weight, bias, eps, rms, shifted)
