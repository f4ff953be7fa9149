"""A small parameter's gradient from a kernel's table of partial sums, added straight into its fp32 main_grad.

Why. A norm's weight and bias, and a linear layer's bias, get gradients that are sums over every token. megalab's
Triton kernels (triton_norm.py, bias_gelu.py) sum them in registers while they write the input gradient, one row
of partial sums per program. Adding that table up with torch, rounding it to bf16 for autograd, and then Megatron's
DDP hook adding the bf16 gradient into the fp32 main_grad is three kernels a parameter (at row 111 about 580
small launches a step, results/bench/README.md#where-a-step-goes-profiles). Here one kernel sums the table's rows
and adds the result, still in fp32, into main_grad, then tells Megatron's hook that the gradient is in
(grad_added_to_main_grad), as Megatron's own linear layers do under --gradient-accumulation-fusion and
embedding_grad.py does for the word embedding. Autograd gets an uninitialised stand-in, which the hook needs to fire
on and never reads.

Where a parameter has no main_grad (no DDP wrapper: the CPU tests, inference) or Megatron zeroes its gradient
itself (zero_out_wgrad), the same kernel writes the gradient in the parameter's dtype instead, for autograd.
Exactness: tests/test_param_grad.py (Triton's interpreter on CPU).

A stacked expert weight's gradient (grouped_experts.py, expert_stack) comes from one grouped GEMM; `into_stacked`
adds it into main_grad in one pass that also zeroes the experts that got no tokens, and writes it instead of adding
where nothing is in main_grad yet (the step's first micro-batch: Megatron's DDP zeroed the buffer and reset the
parameter's grad_added_to_main_grad), which saves reading the fp32 buffer.
"""
from __future__ import annotations

import torch

from megalab.runtime.jit import kernel

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK_ROWS = 64  # rows of the table summed per step of the loop
BLOCK_COLS = 64  # columns per program: hidden 1600 gives 25 programs a table


def sum_rows(part_ptr, out0_ptr, out1_ptr, rows, n, ADD: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """Columns [pid * BLOCK_C, ...) of table program_id(1): the sum over its rows, added to (ADD) or written
    into that table's output, in the output's dtype."""
    pid = tl.program_id(0)
    table = tl.program_id(1)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n
    base = part_ptr + table.to(tl.int64) * rows * n
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for r0 in range(0, rows, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        m = (r[:, None] < rows) & cmask[None, :]
        acc += tl.load(base + r[:, None] * n + cols[None, :], mask=m, other=0.0)
    total = tl.sum(acc, axis=0)
    if table == 0:
        if ADD:
            total += tl.load(out0_ptr + cols, mask=cmask, other=0.0)
        tl.store(out0_ptr + cols, total.to(out0_ptr.dtype.element_ty), mask=cmask)
    else:
        if ADD:
            total += tl.load(out1_ptr + cols, mask=cmask, other=0.0)
        tl.store(out1_ptr + cols, total.to(out1_ptr.dtype.element_ty), mask=cmask)


def _into_stacked(dw_ptr, counts_ptr, main_ptr, n, per_expert, HAS_COUNTS: tl.constexpr, FRESH: tl.constexpr,
                  BLOCK: tl.constexpr):
    """main[i] (+)= dw[i] for i in this program's block, 0 where element i's expert got no tokens (HAS_COUNTS)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(dw_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_COUNTS:
        c = tl.load(counts_ptr + offs // per_expert, mask=m, other=0)
        g = tl.where(c != 0, g, 0.0)
    if not FRESH:
        g += tl.load(main_ptr + offs, mask=m, other=0.0)
    tl.store(main_ptr + offs, g, mask=m)


BLOCK_STACKED = 4096  # elements per program of _into_stacked


def into_stacked(main: torch.Tensor, dw: torch.Tensor, counts: torch.Tensor | None, fresh: bool) -> bool:
    """main ([experts, ...] fp32) += dw (or = dw where `fresh`), with expert e's slice taken as zero where
    counts[e] == 0 (counts on the device; None: every expert counts). False (nothing done) where the kernel cannot
    run: no Triton, not a GPU (nor Triton's interpreter), or tensors it does not take as they are."""
    import os

    if (triton is None or main.dtype != torch.float32 or main.shape != dw.shape or not main.is_contiguous()
            or not dw.is_contiguous() or main.device != dw.device
            or not (main.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")):
        return False
    n = main.numel()
    if n:
        has = counts is not None  # without counts the pointer is never read: main stands in
        kernel(_into_stacked)[(triton.cdiv(n, BLOCK_STACKED),)](
            dw, counts.contiguous() if has else main, main, n, n // main.shape[0], HAS_COUNTS=has, FRESH=fresh,
            BLOCK=BLOCK_STACKED, num_warps=8)
    return True


def into_main_grad(param: torch.Tensor) -> bool:
    """Whether `param`'s gradient can go straight into its fp32 main_grad (Megatron's DDP param with its hook's
    flag, whose gradient Megatron does not zero itself)."""
    main = getattr(param, "main_grad", None)
    return (main is not None and main.dtype == torch.float32 and hasattr(param, "grad_added_to_main_grad")
            and not getattr(param, "zero_out_wgrad", False) and main.shape == param.shape)


def tables(count: int, programs: int, n: int, device) -> torch.Tensor:
    """The partial-sum tables a kernel fills: [count, programs, n] fp32, one per parameter."""
    return torch.empty(count, programs, n, dtype=torch.float32, device=device)


def reduce(params: list[torch.Tensor], parts: torch.Tensor) -> list[torch.Tensor]:
    """The gradients autograd gets for `params` (one or two 1-D parameters of size n), whose partial sums are
    `parts` ([len(params), programs, n] fp32): in each main_grad where every one has it (stand-ins returned),
    else computed in the parameter's dtype."""
    count, rows, n = parts.shape
    into = all(into_main_grad(p) for p in params)
    outs = [p.main_grad if into else torch.empty(n, dtype=p.dtype, device=parts.device) for p in params]
    grid = (triton.cdiv(n, BLOCK_COLS), count)
    kernel(sum_rows)[grid](parts, outs[0], outs[-1], rows, n, ADD=into, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
                            num_warps=4)
    if not into:
        return outs
    for p in params:
        p.grad_added_to_main_grad = True  # Megatron's DDP hook skips its add (distributed_data_parallel.py)
    return [torch.empty(p.shape, dtype=p.dtype, device=p.device) for p in params]
