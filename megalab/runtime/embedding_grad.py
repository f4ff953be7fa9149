"""The word embedding's weight gradient added straight into its fp32 main_grad, row by row.

Why. Megatron's VocabParallelEmbedding looks its rows up with F.embedding, whose backward writes a
dense bf16 gradient as big as the whole table (vocab x hidden): fill it with zeros, scatter the tokens'
rows into it, then Megatron's DDP hook adds all of it into the fp32 main_grad. That is once per
micro-batch, for a gradient with at most micro-batch x sequence non-zero rows. On row 600 (Llama-style,
a 128256 x 2048 table, 8 micro-batches) the fill and the fp32 add show in the step's profile
(results/bench/README.md#where-a-step-goes-profiles: the bf16 FillFunctor and the float `add`).

What this does instead: `main_grad.index_add_(0, tokens, rows)`, the tokens' gradient rows in fp32
added where they belong, then it tells Megatron's hook the gradient is in (grad_added_to_main_grad), as
Megatron's own linear layers do under --gradient-accumulation-fusion; autograd gets an uninitialised
stand-in, as it does from them. Where the same row appears twice the two additions meet in atomics,
as in F.embedding's own backward: the sums are equal up to the order of fp32 additions.

Scope. The rest goes to F.embedding unchanged: a weight with no main_grad (no DDP wrapper: the CPU
tests, inference), a weight shared with the output layer (GPT-2's tied embeddings: Megatron zeroes
the output layer's stand-in there and adds the sum itself, zero_out_wgrad), F.embedding's other
options, and no autograd. Exactness: tests/test_embedding_grad.py.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def _eligible(ids: torch.Tensor, weight: torch.Tensor) -> bool:
    return (torch.is_grad_enabled() and weight.requires_grad and getattr(weight, "main_grad", None) is not None
            and hasattr(weight, "grad_added_to_main_grad") and not getattr(weight, "zero_out_wgrad", False)
            and not ids.is_floating_point())


class _IntoMainGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight):
        ctx.save_for_backward(ids)
        ctx.weight = weight  # the Parameter itself: main_grad and the hook's flag live on it
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        main = weight.main_grad
        main.index_add_(0, ids.reshape(-1), grad_out.reshape(-1, grad_out.size(-1)).to(main.dtype))
        weight.grad_added_to_main_grad = True  # Megatron's hook skips its add (distributed_data_parallel.py)
        # The hook needs a gradient to fire on (overlap_grad_reduce counts it); never read.
        return None, torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


def embedding(input, weight, *args, **kwargs):
    """Drop-in for F.embedding(input, weight) as Megatron's VocabParallelEmbedding calls it."""
    if args or kwargs or not _eligible(input, weight):
        return F.embedding(input, weight, *args, **kwargs)
    return _IntoMainGrad.apply(input, weight)


class _Functional(types.ModuleType):
    """torch.nn.functional for megatron.core.tensor_parallel.layers, its `embedding` replaced."""

    embedding = staticmethod(embedding)

    def __getattr__(self, name):
        return getattr(F, name)


def install() -> bool:
    """Route the F.embedding of Megatron's VocabParallelEmbedding (its only F call) here."""
    from megatron.core.tensor_parallel import layers

    if isinstance(layers.F, _Functional):
        return True
    if layers.F is not F:
        return False  # someone else's patch: leave it
    layers.F = _Functional("megalab_functional")
    return True
