"""Context parallelism (CP) for causal self-attention, without Transformer Engine.

CP splits every sequence over the GPUs of a CP group, so each GPU keeps only s/CP tokens of
activations. Everything in a transformer layer is per token except attention, where each query
needs the keys and values of all earlier tokens. This file is that one exception, three ways
(Megatron's `--cp-comm-type` modes), one function each:

* `all_gather_attention`: gather K and V from every rank, attend locally. Simple; K and V of
  the whole sequence sit in memory during the layer.
* `a2a_attention` (DeepSpeed-Ulysses): an all-to-all turns "all heads, my tokens" into "my
  heads, all tokens", ordinary attention runs on full sequences, a second all-to-all turns it
  back. Needs heads divisible by CP.
* `ring_attention` (p2p): K/V chunks travel round the ring of CP ranks; each rank attends to the
  chunk it holds while the next one is in flight, and merges the partial results exactly with
  their log-sum-exp (flash-attention's online softmax). Nothing whole is ever gathered.

Layout. Megatron's data path (`megatron.core.utils.get_batch_on_this_cp_rank`) cuts the sequence
into 2*CP chunks and gives rank r chunks r and 2*CP-1-r (an early and a late one), so every
rank has the same amount of causal work. All functions here take and return that layout:
q, k, v are [b, heads, 2c, d] with c = s / (2*CP), the rank's two chunks one after the other.

Gradients are exact: each collective is a `torch.autograd.Function` whose backward is its
adjoint (all-gather <-> reduce-scatter, all-to-all <-> the reverse all-to-all), and the ring
has its own backward pass that sends the K/V gradients back round the ring to their owners.
On a GPU in bf16/fp16 the ring's blocks run the fused flash-attention kernels (which return the
log-sum-exp); elsewhere (CPU tests, fp32/fp64) a plain math version does the same arithmetic.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from megalab.runtime.levers import CP_MODES as MODES  # names shared with the launcher


def attention(q: Tensor, k: Tensor, v: Tensor, mode: str, group, scale: float,
              dropout_p: float = 0.0) -> Tensor:
    """Causal attention over the CP group's whole sequence; [b, n, 2c, d] x3 -> [b, n, 2c, d]."""
    if mode == "p2p":
        if dropout_p:
            raise NotImplementedError("megalab's ring attention (cp_comm_type p2p) has no attention dropout; "
                                      "fix: add --attention-dropout 0, or use cp_comm_type all_gather or a2a")
        return ring_attention(q, k, v, group, scale)
    if mode == "all_gather":
        return all_gather_attention(q, k, v, group, scale, dropout_p)
    if mode == "a2a":
        return a2a_attention(q, k, v, group, scale, dropout_p)
    raise NotImplementedError(f"megalab's context parallelism has cp_comm_type {', '.join(MODES)}, "
                              f"not {mode!r}; fix: --cp-comm-type p2p (or all_gather, a2a)")


# ------------------------------------------------------------------ the load-balanced layout

def chunk_ids(rank: int, cp: int) -> tuple[int, int]:
    """The two sequence chunks (of 2*cp) that rank holds: an early one and its mirror image."""
    return rank, 2 * cp - 1 - rank


def to_natural_order(x: Tensor, cp: int, dim: int) -> Tensor:
    """Rank-ordered chunks [0, 2cp-1, 1, 2cp-2, ...] along dim -> sequence order [0, 1, ..., 2cp-1]."""
    held = [c for r in range(cp) for c in chunk_ids(r, cp)]
    chunks = x.chunk(2 * cp, dim)
    return torch.cat([chunks[held.index(i)] for i in range(2 * cp)], dim)


def from_natural_order(x: Tensor, cp: int, dim: int) -> Tensor:
    """The inverse of to_natural_order."""
    chunks = x.chunk(2 * cp, dim)
    return torch.cat([chunks[c] for r in range(cp) for c in chunk_ids(r, cp)], dim)


# ------------------------------------------------------------------ collectives with exact backward

class _AllGather(torch.autograd.Function):
    """Concatenate every rank's x along dim. Backward: each rank keeps the sum of the gradients
    for its own slice (a reduce-scatter), since every rank used every slice."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


def _reduce_scatter(x: Tensor, dim: int, group) -> Tensor:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [p.contiguous() for p in x.chunk(world, dim)]
    if dist.get_backend(group) == "gloo":  # gloo has no reduce-scatter: all-reduce, keep our slice
        full = torch.stack(parts)
        dist.all_reduce(full, group=group)
        return full[rank]
    out = torch.empty_like(parts[rank])
    dist.reduce_scatter(out, parts, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Cut x into world pieces along split_dim, send piece j to rank j, concatenate what arrives
    along cat_dim (in rank order). Backward: the same exchange with the two dims swapped."""

    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, group):
        ctx.dims, ctx.group = (split_dim, cat_dim), group
        world = dist.get_world_size(group)
        send = torch.stack(x.chunk(world, split_dim)).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        return torch.cat(recv.unbind(0), cat_dim)

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim = ctx.dims
        return _AllToAll.apply(grad, cat_dim, split_dim, ctx.group), None, None, None


# ------------------------------------------------------------------ mode 1: all-gather K and V

def all_gather_attention(q, k, v, group, scale, dropout_p=0.0):
    """Gather the whole K and V, then let each local query chunk see the keys up to itself.

    Query chunk j (of 2cp) attends to keys 0 .. (j+1)c with the causal diagonal aligned to the
    bottom right (its last query sees the last of those keys): `causal_lower_right`.
    """
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    kv = _AllGather.apply(torch.stack([k, v]), 3, group)  # [2, b, n, s, d], rank-ordered chunks
    k_all, v_all = to_natural_order(kv, cp, dim=3).unbind(0)
    c = q.size(2) // 2
    outs = []
    for half, j in zip(q.split(c, dim=2), chunk_ids(rank, cp)):
        end = (j + 1) * c
        o = F.scaled_dot_product_attention(
            half, k_all[:, :, :end], v_all[:, :, :end], attn_mask=causal_lower_right(c, end),
            dropout_p=dropout_p, scale=scale)
        outs.append(o.permute(2, 0, 1, 3))
    # Joined in [s, b, n, d] memory order, so the caller's reshape to [s, b, n*d] is a view.
    return torch.cat(outs, dim=0).permute(1, 2, 0, 3)


# ------------------------------------------------------------------ mode 2: all-to-all (Ulysses)

def a2a_attention(q, k, v, group, scale, dropout_p=0.0):
    """Sequence-sharded -> head-sharded, plain causal attention on the full sequence, and back."""
    cp = dist.get_world_size(group)
    if q.size(1) % cp:
        raise ValueError(f"cp_comm_type a2a splits heads over CP: {q.size(1)} heads per rank do not divide "
                         f"by CP={cp}; fix: use p2p or all_gather, or a CP dividing the heads")
    qkv = _AllToAll.apply(torch.stack([q, k, v]), 2, 3, group)  # [3, b, n/cp, s, d], rank-ordered
    q, k, v = to_natural_order(qkv, cp, dim=3).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale)
    out = from_natural_order(out, cp, dim=2)
    return _AllToAll.apply(out, 2, 1, group)  # back to [b, n, 2c, d]: all heads, my chunks


# ------------------------------------------------------------------ mode 3: ring attention (p2p)

def _fused(q: Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def _acc(x: Tensor) -> torch.dtype:
    """Accumulate in fp32 at least (fp64 stays fp64: the CPU tests compare to 1e-9)."""
    return torch.promote_types(x.dtype, torch.float32)


def block_forward(q, k, v, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """Attention of q over one K/V block: (output, log-sum-exp of the scaled scores, fp32 [b, n, sq])."""
    if _fused(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, lse
    acc = _acc(q)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale
    if causal:  # square block: query i sees keys 0..i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.to(acc)).to(q.dtype), lse


def block_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    """Gradients of one block, given the *final* output and log-sum-exp of these queries.

    With P = exp(S - lse) the block's share of the final softmax, D = rowsum(dO * O) (O is the
    final output), dS = P * (dO V^T - D): flash-attention's backward, which is exact for a block
    when fed the merged O and lse. Returns dq, dk, dv: in q's dtype from the fused kernel (the ring adds
    them into its fp32 buffers, converting on the way, with no fp32 copy of its own), else in the
    accumulation dtype (fp32 or fp64).
    """
    acc = _acc(q)
    if _fused(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, q.size(2), k.size(2),  # None: not variable-length
            0.0, causal, None, None, scale=scale)[:3]  # None: no dropout, so no RNG state
    q, k, v, dout, out = (t.to(acc) for t in (q, k, v, dout, out))
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), dout)
    dp = torch.matmul(dout, v.transpose(-2, -1))
    ds = p * (dp - (dout * out).sum(-1, keepdim=True)) * scale
    return torch.matmul(ds, k), torch.matmul(ds.transpose(-2, -1), q), dv


def _merge(out, lse, block_out, block_lse):
    """Combine two partial softmax results over disjoint key sets (in place; block_out may be bf16:
    addcmul_ reads it into out's dtype without a converted copy)."""
    new_lse = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new_lse).unsqueeze(-1)).addcmul_(block_out, torch.exp(block_lse - new_lse).unsqueeze(-1))
    lse.copy_(new_lse)


def _ring_step(rank: int, src: int):
    """Which queries see which keys when rank holds the K/V chunks of rank src.

    Returns (q rows, kv rows, causal) as slices of the 2c local positions. src == rank: the
    local chunks, causal (chunk r before chunk 2cp-1-r, so plain causal over the 2c tokens).
    src < rank: both local queries come after src's early chunk and before its late one.
    src > rank: only the late local chunk comes after either of src's chunks, and after both.
    """
    if src == rank:
        return slice(None), slice(None), True
    if src < rank:
        return slice(None), "first", False
    return "second", slice(None), False


def _half(x: Tensor, which) -> Tensor:
    if which == "first":
        return x[:, :, : x.size(2) // 2]
    if which == "second":
        return x[:, :, x.size(2) // 2:]
    return x


def _sendrecv(tensor: Tensor, group, rank: int, cp: int):
    """Start sending tensor to the next rank and receiving the previous rank's into a new buffer."""
    recv = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, dist.get_global_rank(group, (rank + 1) % cp), group),
           dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, (rank - 1) % cp), group)]
    return recv, dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, scale):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        kv = torch.stack([k, v]).contiguous()
        # Stored [s, b, n, d] and viewed as [b, n, s, d]: the caller's reshape to [s, b, n*d] is then
        # a view, so the output saved here is the same memory as the projection's input.
        b, n, sq, d = q.shape
        out = lse = None
        for step in range(cp):
            # Start moving the chunk we hold to the next rank before computing with it.
            nxt, reqs = _sendrecv(kv, group, rank, cp) if step < cp - 1 else (None, [])
            rows, cols, causal = _ring_step(rank, (rank - step) % cp)
            o, l = block_forward(_half(q, rows), _half(kv[0], cols), _half(kv[1], cols), causal, scale)
            if out is None:  # step 0, our own chunks, every query: the running result starts as this block
                out = torch.empty(sq, b, n, d, dtype=_acc(q), device=q.device).permute(1, 2, 0, 3)
                out.copy_(o)
                lse = l.to(_acc(q))
            else:
                _merge(_half(out, rows), _half(lse, rows), o, l)
            _wait(reqs)
            kv = nxt
        out = out.to(q.dtype)  # keeps the [s, b, n, d] memory order
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        dout = dout.contiguous()
        kv = torch.stack([k, v]).contiguous()
        dq = dkv = None  # dkv: the gradient of the K/V chunk we hold, travelling with it round the ring
        for step in range(cp):
            nxt, reqs = _sendrecv(kv, group, rank, cp) if step < cp - 1 else (None, [])
            rows, cols, causal = _ring_step(rank, (rank - step) % cp)
            dq_b, dk_b, dv_b = block_backward(
                _half(dout, rows), _half(q, rows), _half(kv[0], cols), _half(kv[1], cols),
                _half(out, rows), _half(lse, rows).contiguous(), causal, scale)
            if dq is None:  # step 0: every query (as in forward)
                dq = torch.empty(q.shape, dtype=_acc(q), device=q.device).copy_(dq_b)
            else:
                _half(dq, rows).add_(dq_b)
            # this step's share of the chunk's K/V gradient: written once (no zero-fill, then add)
            mine = torch.empty((2, *k.shape), dtype=_acc(k), device=k.device)
            for i, g in enumerate((dk_b, dv_b)):
                _half(mine[i], cols).copy_(g)
                if cols == "first":  # keys of the other half got nothing from these queries
                    _half(mine[i], "second").zero_()
            if dkv is not None:  # add what the ranks before us accumulated for this chunk
                _wait(dkv_reqs)
                mine.add_(dkv)
            # Pass the chunk's gradient on with the chunk; after cp hops it is back at its owner.
            dkv, dkv_reqs = _sendrecv(mine, group, rank, cp)
            _wait(reqs)
            kv = nxt
        _wait(dkv_reqs)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def ring_attention(q, k, v, group, scale):
    """Ring attention over the load-balanced layout (see `_ring_step` for who sees what)."""
    return _RingAttention.apply(q, k, v, group, scale)
