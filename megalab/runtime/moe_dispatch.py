"""A MoE token dispatcher without host syncs, for layers whose experts all live on this GPU (the moe_gather lever).

Why. Megatron's alltoall dispatcher without TE copies the tokens-per-expert counts to the host and waits for them
in every layer's forward (they size the splits of its second permutation and of SequentialMLP), splits the tokens
into one chunk per expert and concatenates them again (twice a layer, and again in the backward), and undoes the
permutation with a bf16 `scatter_add_`, whose backward and the permutation's own (an `index_add_`) are atomic adds.
Where expert parallel and expert tensor parallel are both 1 none of that moves a token between GPUs: the host waits
for nothing it needs, and each step's host time adds to the GPU's instead of hiding behind it.

What. The same permutation (tokens sorted by expert, then by position, as Megatron's argsort-based `permute`
orders them), built from two index vectors on the GPU:
  - token_of_row [T*k]: the token each permuted row copies (the permutation: a gather);
  - rows_of_token [T, k]: the k rows holding each token's expert outputs (the combine: a gather and a sum over k).
Each direction's backward is the other's forward, so no atomics and no host sync anywhere; the sum over k runs in
fp32 and rounds once (Megatron's scatter_add rounds after every add), in one Triton kernel on a GPU. The counts per expert stay on the GPU, where
GroupedMLP hands them to torch._grouped_mm as offsets (megalab/runtime/grouped_experts.py).

Scope. Dropless top-k routing (no capacity factor, no padding for quantization), EP = ETP = 1, no shared-expert
overlap: `eligible` says which; anything else keeps Megatron's dispatcher. Its equivalence to Megatron's dispatcher,
forward and backward: tests/test_moe_dispatch.py.
"""
from __future__ import annotations

import os

import torch

from megalab.runtime import levers
from megalab.runtime.jit import kernel

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
from megatron.core.transformer.moe.moe_layer import MoELayer as _MegatronMoELayer
from megatron.core.transformer.moe.moe_layer import get_default_pg_collection
from megatron.core.transformer.moe.token_dispatcher import (
    MoEAllGatherTokenDispatcher,
    MoEAlltoAllTokenDispatcher,
    MoETokenDispatcher,
)

LEVER = levers.MOE_GATHER


BLOCK_T = 8  # gather_sum's tile, tokens x hidden columns: the fastest of five (results/bench/moe-kernels-microbench.txt)
BLOCK_H = 256


def _gather_sum_kernel(x_ptr, rows_ptr, out_ptr, tokens, hidden, K: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_H: tl.constexpr):
    """out[t, h] = sum over j < K of x[rows[t, j], h], in fp32, rounded once."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tmask = t < tokens
    m = tmask[:, None] & (h[None, :] < hidden)
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for j in tl.static_range(K):
        r = tl.load(rows_ptr + t * K + j, mask=tmask, other=0)
        acc += tl.load(x_ptr + r[:, None].to(tl.int64) * hidden + h[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t[:, None].to(tl.int64) * hidden + h[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


def gather_sum(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_j x[rows[t, j]], summed in fp32 and rounded once to x's dtype: one Triton kernel on a GPU (it
    reads each row once and writes no [T * k, hidden] intermediate), a gather and a sum elsewhere."""
    t, k = rows.shape
    hidden = x.shape[-1]
    if triton is None or not (x.is_cuda or _interpreted()) or not x.is_contiguous() or x.dim() != 2:
        return x.index_select(0, rows.reshape(-1)).view(t, k, hidden).sum(1)
    out = torch.empty(t, hidden, dtype=x.dtype, device=x.device)
    if t:
        grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(hidden, BLOCK_H))
        kernel(_gather_sum_kernel)[grid](x, rows.contiguous(), out, t, hidden, K=k, BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H)
    return out


def _gather_rows_kernel(x_ptr, idx_ptr, out_ptr, rows, hidden, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[r, h] = x[idx[r], h]."""
    r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = r < rows
    m = rmask[:, None] & (h[None, :] < hidden)
    src = tl.load(idx_ptr + r, mask=rmask, other=0)
    v = tl.load(x_ptr + src[:, None].to(tl.int64) * hidden + h[None, :], mask=m, other=0.0)
    tl.store(out_ptr + r[:, None].to(tl.int64) * hidden + h[None, :], v, mask=m)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x.index_select(0, index) for a 2-D x: one Triton kernel on a GPU, gather_sum's tiles (index_select's own
    kernel moved 510's rows at about 60% of the memory's speed)."""
    if triton is None or not (x.is_cuda or _interpreted()) or not x.is_contiguous() or x.dim() != 2:
        return x.index_select(0, index)
    rows, hidden = index.numel(), x.shape[1]
    out = torch.empty(rows, hidden, dtype=x.dtype, device=x.device)
    if rows:
        grid = (triton.cdiv(rows, BLOCK_T), triton.cdiv(hidden, BLOCK_H))
        kernel(_gather_rows_kernel)[grid](x, index.contiguous(), out, rows, hidden, BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H)
    return out


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class _Expand(torch.autograd.Function):
    """Permute: row r of the output is token token_of_row[r]. Backward: each token's k rows summed."""

    @staticmethod
    def forward(ctx, x, token_of_row, rows_of_token):
        ctx.save_for_backward(token_of_row, rows_of_token)
        return gather_rows(x, token_of_row)

    @staticmethod
    def backward(ctx, grad):
        _, rows_of_token = ctx.saved_tensors
        return gather_sum(grad, rows_of_token), None, None


class _Combine(torch.autograd.Function):
    """Unpermute: token t is the sum of its k rows. Backward: each row gets its token's gradient."""

    @staticmethod
    def forward(ctx, y, token_of_row, rows_of_token):
        ctx.save_for_backward(token_of_row, rows_of_token)
        return gather_sum(y, rows_of_token)

    @staticmethod
    def backward(ctx, grad):
        token_of_row, _ = ctx.saved_tensors
        return gather_rows(grad.contiguous(), token_of_row), None, None


def plan(routing_map: torch.Tensor, topk: int):
    """(token_of_row, rows_of_token, order) for a [T, E] routing map with exactly `topk` experts per token.

    order[r] is row r's entry in the expert-major flattening of the map (expert * T + token): Megatron's
    argsort-based permute takes the same first T * topk entries, so the rows come out in its order. (Without the
    sorts, nonzero_static and a scan of the flat map give the same rows no faster at 510: bench page.)"""
    t = routing_map.shape[0]
    order = routing_map.T.reshape(-1).argsort(descending=True, stable=True)[: t * topk]
    token_of_row = order % t
    rows_of_token = token_of_row.argsort(stable=True).view(t, topk)
    return token_of_row, rows_of_token, order


class GatherDispatcher(MoETokenDispatcher):
    """Megatron's token-dispatcher interface (MoELayer calls these six steps in order) for EP = ETP = 1."""

    def dispatch_preprocess(self, hidden_states, routing_map, probs):
        self.hidden_shape = hidden_states.shape
        x = hidden_states.view(-1, self.hidden_shape[-1])
        self.token_of_row, self.rows_of_token, order = plan(routing_map, self.config.moe_router_topk)
        self.tokens_per_expert = routing_map.sum(dim=0)  # stays on the GPU: no host sync
        permuted_probs = probs.T.reshape(-1).index_select(0, order)
        return _Expand.apply(x, self.token_of_row, self.rows_of_token), permuted_probs

    def token_dispatch(self, hidden_states, probs):
        return hidden_states, probs  # every expert is on this GPU: nothing to send

    def dispatch_postprocess(self, hidden_states, probs):
        tokens_per_expert, self.tokens_per_expert = self.tokens_per_expert, None
        return hidden_states, tokens_per_expert, probs

    def combine_preprocess(self, hidden_states):
        return hidden_states

    def token_combine(self, hidden_states, async_finish=True, allocate_on_comm_stream=True):
        return hidden_states

    def combine_postprocess(self, hidden_states):
        out = _Combine.apply(hidden_states, self.token_of_row, self.rows_of_token)
        self.token_of_row = self.rows_of_token = None
        return out.view(self.hidden_shape)


def eligible(dispatcher: MoETokenDispatcher, config) -> str | None:
    """None where GatherDispatcher computes what `dispatcher` would; else why not, in a few words."""
    if type(dispatcher) not in (MoEAlltoAllTokenDispatcher, MoEAllGatherTokenDispatcher):
        return f"dispatcher {type(dispatcher).__name__}"
    if dispatcher.ep_size != 1 or dispatcher.tp_size != 1:
        return "expert or expert-tensor parallel"
    if config.moe_expert_capacity_factor is not None or config.moe_pad_expert_input_to_capacity:
        return "token dropping"
    if config.moe_router_padding_for_quantization:
        return "padding for quantization"
    if config.moe_shared_expert_overlap:
        return "shared-expert overlap"
    return None


class MoELayer(_MegatronMoELayer):
    """Megatron's MoE layer; with the moe_gather lever and an eligible layout, its dispatcher is GatherDispatcher."""

    def __init__(self, config, submodules=None, layer_number=None, pg_collection=None, **kwargs):
        pg_collection = pg_collection or get_default_pg_collection()  # as Megatron's layer does
        super().__init__(config, submodules, layer_number=layer_number, pg_collection=pg_collection, **kwargs)
        if not levers.on(LEVER):
            return
        why_not = eligible(self.token_dispatcher, config)
        if why_not is None:
            self.token_dispatcher = GatherDispatcher(config, pg_collection=pg_collection)
        _report(why_not)


_REPORTED = False


def _report(why_not: str | None) -> None:
    """Once per process, on the first rank: whether the lever's dispatcher runs (the log says what ran)."""
    global _REPORTED
    if _REPORTED or (torch.distributed.is_initialized() and torch.distributed.get_rank() != 0):
        return
    _REPORTED = True
    print(f"megalab: moe_dispatch={'gather' if why_not is None else 'megatron (' + why_not + ')'}", flush=True)
