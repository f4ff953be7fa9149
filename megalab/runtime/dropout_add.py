"""Megatron's bias-dropout-add in one Triton kernel each way, the dropout mask drawn again in the backward (the
dropout_add lever).

Why. After the attention's and the MLP's output projections a transformer layer computes
residual + dropout(x + bias) (megatron/core/fusions/fused_bias_dropout.py). Megatron compiles it with
torch.compile, whose kernel draws one Philox value per element (the generator makes four a draw) and writes a
byte mask for the backward; the backward reads that mask, writes the input gradient, and sums the bias's copy in
a second pass: at row 111 about twice the time its bytes need (results/bench/README.md#where-a-step-goes-profiles), and
24.5 MB of mask a call kept for the backward (2.4 GB a step).

What this does. One seed a call, drawn by torch's CUDA generator (torch.randint: Megatron's RNG tracker, its
activation recompute and CUDA graph capture all see an ordinary draw). The forward keeps element (r, c) where
the uniform value of Philox(seed, (r // 4) * hidden + c), output r % 4, is at least p: one draw serves four rows.
It computes residual + keep * (x + bias) / (1 - p) in fp32 and rounds once. It saves only the seed: the backward
draws the same mask, writes dx = keep * g / (1 - p), sums dx over its rows per column (the bias's gradient, into
its fp32 main_grad by megalab/runtime/param_grad.py), and hands g on to the residual untouched.

Scope. Training, dropout above zero, x and residual of one shape and dtype and contiguous, a 1-D bias of the
hidden size or none, fewer than 2**31 elements, CUDA tensors (or Triton's interpreter); anything else goes to
Megatron's function. The masks differ from torch's (another draw of the same distribution). Exactness against
the same mask applied in float64, and the mask's rate: tests/test_dropout_add.py (Triton's interpreter on CPU).
"""
from __future__ import annotations

import os

import torch

from megalab.runtime import levers, param_grad
from megalab.runtime.jit import kernel

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it); without it, no lever
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

ROW_GROUPS = 8  # rows per quarter-tile: a program's tile is 4 x 8 rows (one Philox draw for four of them)
BLOCK_COLS = 128  # columns a program owns
TILES_PER_PROGRAM = 8  # backward: tiles a program walks, keeping its columns' bias sums (one table row a program)
# backward: its tile loop software-pipelined, two tiles' loads in flight while one computes; one load at a time was
# slower (results/bench/pipelined-loops-microbench.txt).
STAGES = 3
WARPS = 4


def bda_forward(x_ptr, b_ptr, r_ptr, out_ptr, seed_ptr, rows, n, p, scale,
                 HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows [4 * GROUPS * program_id(0), ...) and this program's columns: out = r + keep * (x + b) * scale."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)  # rows 4g .. 4g + 3 share a draw
    draws = tl.randint4x(seed, groups[:, None] * n + cols[None, :])
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    for k in tl.static_range(4):
        r = groups * 4 + k
        m = (r[:, None] < rows) & cmask[None, :]
        offs = r[:, None].to(tl.int64) * n + cols[None, :]
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += bias[None, :]
        keep = tl.uint_to_uniform_float(draws[k]) >= p
        y = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32) + tl.where(keep, x * scale, 0.0)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def bda_backward(g_ptr, dx_ptr, seed_ptr, part_ptr, rows, n, p, scale, groups_per_program,
                  HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr):
    """dx = keep * g * scale over this program's row groups and columns (the forward's mask, drawn again) and,
    with HAS_BIAS, dx summed over those rows per column (the bias's partial gradient)."""
    pid_r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    seed = tl.load(seed_ptr)
    acc = tl.zeros((GROUPS, BLOCK_C), dtype=tl.float32)
    first = pid_r * groups_per_program
    last = tl.minimum(first + groups_per_program, tl.cdiv(rows, 4))
    for g0 in tl.range(first, last, GROUPS, num_stages=STAGES):  # STAGES - 1 later tiles' loads in flight
        groups = g0 + tl.arange(0, GROUPS)
        draws = tl.randint4x(seed, groups[:, None] * n + cols[None, :])
        # the tile's four rows of a draw (4g + k) are all loaded before any is stored: one round trip, not four
        r = groups[:, None] * 4
        ok = (groups[:, None] < last) & cmask[None, :]
        offs = r.to(tl.int64) * n + cols[None, :]
        m0, m1, m2, m3 = ok & (r < rows), ok & (r + 1 < rows), ok & (r + 2 < rows), ok & (r + 3 < rows)
        g0_ = tl.load(g_ptr + offs, mask=m0, other=0.0).to(tl.float32)
        g1_ = tl.load(g_ptr + offs + n, mask=m1, other=0.0).to(tl.float32)
        g2_ = tl.load(g_ptr + offs + 2 * n, mask=m2, other=0.0).to(tl.float32)
        g3_ = tl.load(g_ptr + offs + 3 * n, mask=m3, other=0.0).to(tl.float32)
        d0 = tl.where((tl.uint_to_uniform_float(draws[0]) >= p) & m0, g0_ * scale, 0.0)
        d1 = tl.where((tl.uint_to_uniform_float(draws[1]) >= p) & m1, g1_ * scale, 0.0)
        d2 = tl.where((tl.uint_to_uniform_float(draws[2]) >= p) & m2, g2_ * scale, 0.0)
        d3 = tl.where((tl.uint_to_uniform_float(draws[3]) >= p) & m3, g3_ * scale, 0.0)
        tl.store(dx_ptr + offs, d0.to(dx_ptr.dtype.element_ty), mask=m0)
        tl.store(dx_ptr + offs + n, d1.to(dx_ptr.dtype.element_ty), mask=m1)
        tl.store(dx_ptr + offs + 2 * n, d2.to(dx_ptr.dtype.element_ty), mask=m2)
        tl.store(dx_ptr + offs + 3 * n, d3.to(dx_ptr.dtype.element_ty), mask=m3)
        if HAS_BIAS:
            acc += (d0 + d1) + (d2 + d3)
    if HAS_BIAS:
        tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


def _grid_rows(rows: int) -> tuple[int, int]:
    """Backward: (programs along the rows, row groups each takes): TILES_PER_PROGRAM tiles a program, steps enough
    for its pipelined loop, and a partial table of one row a program."""
    per = ROW_GROUPS * TILES_PER_PROGRAM
    return triton.cdiv(triton.cdiv(rows, 4), per), per


class _BiasDropoutAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, prob):
        n = x.shape[-1]
        rows = x.numel() // n
        seed = torch.randint(0, 2 ** 62, (1,), device=x.device, dtype=torch.int64)
        out = torch.empty_like(residual)
        scale = 1.0 / (1.0 - prob)
        grid = (triton.cdiv(triton.cdiv(rows, 4), ROW_GROUPS), triton.cdiv(n, BLOCK_COLS))
        kernel(bda_forward)[grid](x, bias if bias is not None else x, residual, out, seed, rows, n, prob, scale,
                                   HAS_BIAS=bias is not None, GROUPS=ROW_GROUPS, BLOCK_C=BLOCK_COLS,
                                   num_warps=WARPS)
        ctx.save_for_backward(seed)
        ctx.bias = bias  # the Parameter: its main_grad lives on it
        ctx.prob, ctx.rows, ctx.shape = prob, rows, x.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (seed,) = ctx.saved_tensors
        n = ctx.shape[-1]
        g = grad_out if grad_out.is_contiguous() else grad_out.contiguous()
        has_bias = ctx.bias is not None and ctx.needs_input_grad[1]
        col_blocks = triton.cdiv(n, BLOCK_COLS)
        programs, per = _grid_rows(ctx.rows)
        dx = torch.empty(ctx.shape, dtype=g.dtype, device=g.device)
        parts = param_grad.tables(1, programs, n, g.device) if has_bias else dx
        kernel(bda_backward)[(programs, col_blocks)](g, dx, seed, parts, ctx.rows, n, ctx.prob,
                                                      1.0 / (1.0 - ctx.prob), per, HAS_BIAS=has_bias,
                                                      GROUPS=ROW_GROUPS, BLOCK_C=BLOCK_COLS, STAGES=STAGES,
                                                      num_warps=WARPS)
        dbias = param_grad.reduce([ctx.bias], parts)[0] if has_bias else None
        return dx, dbias, grad_out, None


def takes(x: torch.Tensor, bias, residual: torch.Tensor, prob: float) -> bool:
    """Whether these kernels compute residual + dropout(x + bias, prob) (else Megatron's function does)."""
    return (triton is not None and prob > 0.0 and x.shape == residual.shape and x.dtype == residual.dtype
            and x.is_contiguous() and residual.is_contiguous() and 0 < x.numel() < 2 ** 31
            and (bias is None or (bias.dim() == 1 and bias.shape[0] == x.shape[-1] and bias.dtype == x.dtype))
            and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"))


def bias_dropout_add_train(x_with_bias, residual: torch.Tensor, prob: float) -> torch.Tensor:
    """Drop-in for Megatron's bias_dropout_add_fused_train((x, bias), residual, prob)."""
    x, bias = x_with_bias
    if not takes(x, bias, residual, prob):
        from megatron.core.fusions import fused_bias_dropout

        return fused_bias_dropout.bias_dropout_add_fused_train(x_with_bias, residual, prob)
    return _BiasDropoutAdd.apply(x, bias, residual, prob)


def get_bias_dropout_add(training, fused):
    """Megatron's get_bias_dropout_add, with the fused training function megalab's where the lever is on (the
    layer asks at every call, so the lever set after the model was built counts)."""
    from megatron.core.fusions import fused_bias_dropout

    if levers.on(levers.DROPOUT_ADD) and training and fused:
        return bias_dropout_add_train
    return fused_bias_dropout.get_bias_dropout_add(training, fused)
