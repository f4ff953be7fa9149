"""The MLP's bias-GeLU backward in one Triton kernel that also sums the bias gradient (the bias_gelu lever).

Why. Megatron's fused bias-GeLU (megatron/core/fusions/fused_bias_gelu.py, the tanh approximation GPT-2 uses)
returns the same tensor as the gradient of its input and of its bias; autograd then sums the bias's copy over
every token (`sum_to`), a second pass over the [tokens, 4 x hidden] gradient. At row 111 that pass reads 196 MB a
layer (its time: results/bench/README.md#where-a-step-goes-profiles). Then Megatron's DDP
hook adds the bf16 bias gradient into its fp32 main_grad.

What this does. The forward is Megatron's own (its compiled bias_gelu). The backward reads the output gradient and
the saved input once: each program takes a block of columns over a block of rows, writes the input gradient
(Megatron's formula, in fp32, rounded once) and keeps its columns' sums in registers; megalab/runtime/param_grad.py
then adds the programs' partial sums into the bias's fp32 main_grad. The bias's gradient is summed before the
bf16 rounding that Megatron's input gradient gets, so it can differ from Megatron's in the last bf16 bit.

Scope. Megatron's MLP calls it where it would call bias_gelu_impl (GeLU with a bias, no gated unit); CUDA tensors
only, anything else goes to Megatron's function. Exactness against Megatron's math in Triton's interpreter on
CPU: tests/test_bias_gelu.py.
"""
from __future__ import annotations

import torch

from megalab.runtime import param_grad
from megalab.runtime.jit import kernel, sms

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it); without it, no lever
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

# The tile, 64 x 64 with 4 warps: the microbenchmark's pick at row 111's shape (results/bench/bias-gelu-microbench.txt).
BLOCK_ROWS = 64  # rows a program handles per step of its loop
BLOCK_COLS = 64  # columns a program owns (its partial sums): 4 x hidden 1600 = 6400 gives 100 column blocks
PROGRAMS_PER_SM = 4  # enough programs to fill the GPU, few enough that the partial table stays small
WARPS = 4  # per program: 128 threads, 32 values each a tile


def bias_gelu_backward(g_ptr, y_ptr, b_ptr, dx_ptr, part_ptr, rows, n, rows_per_program,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx = gelu'(y + b) * g for this program's rows and columns (Megatron's bias_gelu_back, in fp32), and the
    sum of dx over those rows per column (the bias's partial gradient)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)  # summed over its rows once, at the end: no
    # reduction across the program's warps in the loop
    first = pid_r * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for r0 in range(first, last, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        m = (r[:, None] < last) & cmask[None, :]
        offs = r[:, None].to(tl.int64) * n + cols[None, :]
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        x = tl.load(y_ptr + offs, mask=m, other=0.0).to(tl.float32) + bias[None, :]
        # tanh(z) = 2 sigmoid(2z) - 1: exact enough here (its error, ~1e-7 absolute, meets terms of about 0.5)
        t = 2.0 * tl.sigmoid(2.0 * (0.79788456 * x * (1.0 + 0.044715 * x * x))) - 1.0
        ff = 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)
        dx = tl.where(m, ff * g, 0.0)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
        acc += dx
    tl.store(part_ptr + pid_r * n + cols, tl.sum(acc, axis=0), mask=cmask)


def megatron_bias_gelu():
    from megatron.core.fusions import fused_bias_gelu

    return fused_bias_gelu


class BiasGeLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        ctx.bias = bias  # the Parameter: its main_grad lives on it
        return megatron_bias_gelu().bias_gelu(bias, input)

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        n = input.shape[-1]
        y = input.reshape(-1, n)
        g = grad_output.reshape(-1, n)
        y, g = (t if t.is_contiguous() else t.contiguous() for t in (y, g))
        rows = y.shape[0]
        col_blocks = triton.cdiv(n, BLOCK_COLS)
        row_programs = max(1, min(triton.cdiv(rows, BLOCK_ROWS),
                                  triton.cdiv(sms(y.device) * PROGRAMS_PER_SM, col_blocks)))
        per = triton.cdiv(rows, row_programs)
        row_programs = triton.cdiv(rows, per)
        dx = torch.empty_like(y)
        parts = param_grad.tables(1, row_programs, n, y.device)
        kernel(bias_gelu_backward)[(row_programs, col_blocks)](g, y, bias, dx, parts[0], rows, n, per,
                                                                BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
                                                                num_warps=WARPS)
        dbias = param_grad.reduce([ctx.bias], parts)[0] if ctx.needs_input_grad[1] else None
        return dx.view(input.shape), dbias


def _eligible(input: torch.Tensor, bias: torch.Tensor) -> bool:
    return (triton is not None and input.is_cuda and bias is not None and bias.dim() == 1
            and input.shape[-1] == bias.shape[0] and input.numel() > 0)


def bias_gelu_impl(input: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Drop-in for Megatron's bias_gelu_impl(input, bias)."""
    if not _eligible(input, bias):
        return megatron_bias_gelu().bias_gelu_impl(input, bias)
    return BiasGeLU.apply(input, bias)


def install() -> bool:
    """Route the bias_gelu_impl of Megatron's MLP (the name its module imported) here."""
    from megatron.core.transformer import mlp

    if mlp.bias_gelu_impl is bias_gelu_impl:
        return True
    if mlp.bias_gelu_impl is not megatron_bias_gelu().bias_gelu_impl:
        return False  # someone else's patch: leave it
    mlp.bias_gelu_impl = bias_gelu_impl
    return True
