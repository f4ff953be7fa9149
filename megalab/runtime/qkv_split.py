"""The QKV projection's gradient packed, and its bias's gradient summed, in one pass (the qkv_pack lever).

Why. Megatron splits the QKV projection's output into query, key and value views (megatron/core/transformer/
attention.py: TE's SplitAlongDim, or torch.split without TE). Without TE the split's backward is a torch.cat of the
three gradients the attention kernel returns, and the linear layer's backward then sums that packed gradient over
every token for the bias (`grad_output.sum(dim=0)`, in bf16), a second pass over it; Megatron's DDP hook then adds
the bf16 sum into the fp32 main_grad. Their time at row 111: results/bench/README.md#where-a-step-goes-profiles and
results/bench/qkv-split-microbench.txt.

What this does. Megatron's attention module calls its module-level SplitAlongDim; without TE that name is None,
and this lever sets it to `split_along_dim`. Where the projection's output comes from Megatron's linear layer with
megalab's addmm_bias forward and a bias (fastpath.linear_forward_addmm_bias keeps the bias on the layer's autograd
node), the split runs as an autograd function that takes the bias too. The forward is torch.split's views; the
backward writes the packed gradient, query, key and value in one launch (whatever strides they arrive with),
and each program's column sums of it in fp32; megalab/runtime/param_grad.py adds those into the
bias's fp32 main_grad. The linear layer's node is told that its bias needs nothing (its `use_bias`), so its
backward sums nothing. Without such a bias (Llama-style layers) the split stays torch.split: the pack alone is no
faster than the cat (qkv-split-microbench.txt).

Scope. A 4-D [s, b, groups, width] tensor split along its last dimension, in training (grad enabled), on CUDA (or
Triton's interpreter), the bias one value per column of a group's width times the groups; anything else, and TE's
own SplitAlongDim where TE is installed, as before. Exactness (the packed gradient equal to torch.cat's, the bias's
sums against float64, the whole layer against Megatron's): tests/test_qkv_split.py, in Triton's interpreter on CPU.
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

BLOCK_TOKENS = 64  # tokens a program copies per step of its loop (64 x 4 warps was the fastest tile at 111's shape)
PROGRAMS_PER_SM = 4  # row programs x heads: enough to fill the GPU, few enough that the partial table stays small
WARPS = 4
VIEWS = ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0")  # autograd nodes of a view, walked back


def pack(q, k, v, out_ptr, part_ptr, tokens, batch, heads, tokens_per_program, q_s, q_b, q_h, k_s, k_b, k_h, v_s,
          v_b, v_h, wq, wk, W, SUMS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One piece (program_id(2): query, key or value, widths wq, wk and the rest of W) of one group
    (program_id(1)): this program's tokens, copied into the piece's columns of the group's W in the packed
    [tokens, heads, W] gradient, and with SUMS their sums per column over those tokens (the bias's partial
    gradient, fp32). All three pieces in one launch, which beat three
    (results/bench/grid-tuning-microbench.txt)."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
    piece = tl.program_id(2)
    if piece == 0:
        src = q
    elif piece == 1:
        src = k
    else:
        src = v
    # a where, not the branches: a stride of 1 is a constant to Triton, a type the branches could not share
    s_s = tl.where(piece == 0, q_s, tl.where(piece == 1, k_s, v_s)).to(tl.int64)
    s_b = tl.where(piece == 0, q_b, tl.where(piece == 1, k_b, v_b)).to(tl.int64)
    s_h = tl.where(piece == 0, q_h, tl.where(piece == 1, k_h, v_h)).to(tl.int64)
    width = tl.where(piece == 0, wq, tl.where(piece == 1, wk, W - wq - wk))
    off = tl.where(piece == 0, 0, tl.where(piece == 1, wq, wq + wk))
    cols = tl.arange(0, BLOCK_W)
    cmask = cols < width
    first = pid_t * tokens_per_program
    last = tl.minimum(first + tokens_per_program, tokens)
    acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    for t0 in range(first, last, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        m = (t < last)[:, None] & cmask[None, :]
        s = (t // batch).to(tl.int64)
        b = (t % batch).to(tl.int64)
        x = tl.load(src + (s * s_s + b * s_b + head * s_h)[:, None] + cols[None, :], mask=m, other=0.0)
        tl.store(out_ptr + (t.to(tl.int64) * heads * W + head * W + off)[:, None] + cols[None, :], x, mask=m)
        if SUMS:
            acc += x.to(tl.float32)
    if SUMS:
        tl.store(part_ptr + pid_t * heads * W + head * W + off + cols, tl.sum(acc, axis=0), mask=cmask)


class _SplitWithBias(torch.autograd.Function):
    """torch.split's views forward; backward, the packed gradient and the bias's (which the linear layer's node no
    longer sums)."""

    @staticmethod
    def forward(ctx, mixed, bias, sizes):
        ctx.sizes, ctx.shape, ctx.bias = sizes, mixed.shape, bias
        return tuple(torch.split(mixed, sizes, dim=-1))

    @staticmethod
    def backward(ctx, *grads):
        s, b, heads, W = ctx.shape
        like = next(g for g in grads if g is not None)
        tokens = s * b
        packed = torch.empty(ctx.shape, dtype=like.dtype, device=like.device)
        row_programs = max(1, min(triton.cdiv(tokens, BLOCK_TOKENS),
                                  triton.cdiv(sms(like.device) * PROGRAMS_PER_SM, heads)))
        per = triton.cdiv(tokens, row_programs)
        row_programs = triton.cdiv(tokens, per)
        sums = ctx.needs_input_grad[1]
        parts = param_grad.tables(1, row_programs, heads * W, like.device) if sums else packed
        pieces = []
        for g, width in zip(grads, ctx.sizes):
            if g is None:  # an output no one used: its gradient is zero
                g = torch.zeros(s, b, heads, width, dtype=like.dtype, device=like.device)
            elif g.stride(-1) != 1:
                g = g.contiguous()
            pieces.append(g)
        q, k, v = pieces
        kernel(pack)[(row_programs, heads, 3)](q, k, v, packed, parts, tokens, b, heads, per, *q.stride()[:3],
                                                *k.stride()[:3], *v.stride()[:3], ctx.sizes[0], ctx.sizes[1], W,
                                                SUMS=sums, BLOCK_T=BLOCK_TOKENS,
                                                BLOCK_W=triton.next_power_of_2(max(ctx.sizes)), num_warps=WARPS)
        dbias = param_grad.reduce([ctx.bias], parts)[0] if sums else None
        return packed, dbias, None


def _linear_node(mixed: torch.Tensor):
    """The autograd node of Megatron's linear layer that made `mixed` (through views), where megalab's addmm_bias
    forward ran it with a bias it still sums; else None."""
    node = mixed.grad_fn
    while node is not None and type(node).__name__ in VIEWS:
        node = node.next_functions[0][0]
    if node is not None and getattr(node, "use_bias", False) and getattr(node, "megalab_bias", None) is not None:
        return node
    return None


def split_along_dim(mixed: torch.Tensor, dim: int, sizes):
    """Drop-in for TE's SplitAlongDim(mixed, dim, sizes), which Megatron's attention calls: torch.split's views,
    with the gradient's pack and the QKV bias's sum fused where the lever is on and the projection's bias is
    megalab's to take."""
    node = None
    # three pieces (query, key, value): the pack's one launch takes exactly three
    if (levers.on(levers.QKV_PACK) and triton is not None and len(sizes) == 3 and mixed.dim() == 4 and dim in (3, -1)
            and torch.is_grad_enabled() and mixed.requires_grad
            and (mixed.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
            and mixed.numel() < 2 ** 31):
        node = _linear_node(mixed)
    if node is None:
        return torch.split(mixed, sizes, dim=dim)
    bias = node.megalab_bias
    if bias.dim() != 1 or bias.numel() != mixed.shape[2] * mixed.shape[3] or bias.dtype != mixed.dtype:
        return torch.split(mixed, sizes, dim=dim)
    node.use_bias = False  # the pack's backward sums the bias: the linear layer's backward must not
    return _SplitWithBias.apply(mixed, bias, tuple(sizes))


def install() -> bool:
    """Set Megatron's attention module's SplitAlongDim (None without TE) to split_along_dim; False, and nothing
    changed, where TE's is there."""
    from megatron.core.transformer import attention

    if attention.SplitAlongDim is split_along_dim:
        return True
    if attention.SplitAlongDim is not None:
        return False  # TE's: its backward already skips the cat where it can
    attention.SplitAlongDim = split_along_dim
    return True
