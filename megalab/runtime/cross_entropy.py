"""The language-model loss on the bf16 logits: no fp32 copy of them, kept or passed on.

Why. Without Transformer Engine, Megatron computes the loss with `vocab_parallel_cross_entropy`:
the bf16 logits [s, b, V/TP] become an fp32 copy (`.float()`), then max, subtract, exp, sum and
divide run one kernel each over it, in place; the fp32 softmax is kept for the backward, which
subtracts the one-hot target, scales by the incoming gradient and hands an fp32 gradient back,
which autograd then casts to bf16: visible in a step's profile (results/bench/README.md#where-a-step-goes-profiles)
and, at the end of the forward pass, when memory peaks, 6 bytes per logit (the bf16 logits and their fp32 copy).

What this does instead, with the same math in fp32:
  forward   m = max_v x         (one read of the bf16 logits; all-reduced over TP)
            S = sum_v exp(x - m), and x[target]   (a second read; all-reduced over TP)
            loss = m + log S - x[target];  keeps the bf16 logits and lse = m + log S
  backward  dx = (exp(x - lse) - onehot(target)) * dloss, written in bf16 (one read, one write)
Each line is one fused kernel from torch.compile (Megatron's own `jit_fuser` is torch.compile too)
on CUDA; on CPU (the tests) the same functions run eagerly. 2 bytes per logit are kept instead of
6, and the ~8 passes over an fp32 [tokens, V] tensor become 3 over the bf16 one.

Scope. Label smoothing is left to Megatron's function (the patch hands such calls on); the
vocabulary split over TP ranks is the same as Megatron's (VocabUtility). Exactness against
Megatron's function: tests/test_cross_entropy.py (float64 on CPU, TP=1 and TP=2 over gloo).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _acc(x: torch.Tensor) -> torch.Tensor:
    """x in the precision the sums run in: fp32 for 16-bit logits (as Megatron's), else x's own."""
    return x.float() if x.element_size() < 4 else x


def _row_max(x: torch.Tensor) -> torch.Tensor:
    return _acc(x).amax(dim=-1)


def _sum_exp_and_target(x: torch.Tensor, row_max: torch.Tensor, target: torch.Tensor, start: int,
                        end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_v exp(x - m) per row, and the target's logit where this rank holds it (else 0)."""
    xf = _acc(x)
    sum_exp = torch.exp(xf - row_max.unsqueeze(-1)).sum(dim=-1)
    mine = (target >= start) & (target < end)
    local = torch.where(mine, target - start, torch.zeros_like(target))
    picked = torch.gather(xf, 1, local.unsqueeze(-1)).squeeze(-1)
    return sum_exp, torch.where(mine, picked, torch.zeros_like(picked))


def _grad(x: torch.Tensor, lse: torch.Tensor, target: torch.Tensor, start: int, end: int,
          grad_loss: torch.Tensor) -> torch.Tensor:
    """(softmax - onehot(target)) * dloss, in the logits' dtype."""
    p = torch.exp(_acc(x) - lse.unsqueeze(-1))
    cols = torch.arange(x.size(-1), device=x.device) + start
    onehot = (cols.unsqueeze(0) == target.unsqueeze(-1)).to(p.dtype)
    return ((p - onehot) * grad_loss.unsqueeze(-1)).to(x.dtype)


_COMPILED: dict[str, object] = {}


def _kernel(fn, x: torch.Tensor):
    """fn compiled into one fused kernel for CUDA tensors (once per process), else fn itself."""
    if not x.is_cuda:
        return fn
    if fn.__name__ not in _COMPILED:
        _COMPILED[fn.__name__] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[fn.__name__]


def _vocab_range(per_rank: int, group) -> tuple[int, int, int]:
    """(start, end, world): the slice of the vocabulary this rank's logits hold, as Megatron splits it."""
    world = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
    rank = dist.get_rank(group) if world > 1 else 0
    return rank * per_rank, (rank + 1) * per_rank, world


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, group) -> torch.Tensor:
        vocab = logits.size(-1)
        x = logits.reshape(-1, vocab)
        t = target.reshape(-1)
        start, end, world = _vocab_range(vocab, group)
        row_max = _kernel(_row_max, x)(x)
        if world > 1:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        sum_exp, picked = _kernel(_sum_exp_and_target, x)(x, row_max, t, start, end)
        if world > 1:  # one all-reduce for both, as Megatron's fused path does
            both = torch.cat((sum_exp, picked))
            dist.all_reduce(both, group=group)
            sum_exp, picked = both.split(sum_exp.numel())
        lse = row_max + torch.log(sum_exp)
        ctx.save_for_backward(logits, lse, t)
        ctx.start, ctx.end = start, end
        return (lse - picked).view_as(target)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, lse, t = ctx.saved_tensors
        x = logits.reshape(-1, logits.size(-1))
        g = grad_loss.reshape(-1).to(lse.dtype)
        dx = _kernel(_grad, x)(x, lse, t, ctx.start, ctx.end, g)
        return dx.view_as(logits), None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, group=None) -> torch.Tensor:
    """Per-token loss [s, b] of vocab-parallel logits [s, b, V/TP] (TP group `group`, None: no TP)."""
    return _CrossEntropy.apply(logits, target, group)


def install() -> bool:
    """Route Megatron's `tensor_parallel.vocab_parallel_cross_entropy` (the loss of every GPT model
    without --cross-entropy-loss-fusion) here; calls with label smoothing go on to Megatron's."""
    from megatron.core import tensor_parallel

    original = tensor_parallel.vocab_parallel_cross_entropy
    if getattr(original, "MEGALAB", False):
        return True

    def vocab_parallel_cross_entropy(vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
        if label_smoothing:
            return original(vocab_parallel_logits, target, label_smoothing, tp_group=tp_group)
        if tp_group is None:
            from megatron.core import parallel_state

            tp_group = parallel_state.get_tensor_model_parallel_group()
        return cross_entropy(vocab_parallel_logits, target, tp_group)

    vocab_parallel_cross_entropy.MEGALAB = True
    tensor_parallel.vocab_parallel_cross_entropy = vocab_parallel_cross_entropy
    return True
