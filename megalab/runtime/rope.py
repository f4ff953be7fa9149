"""Rotary position embedding (RoPE) in one fused kernel each way, without Transformer Engine.

Why. Megatron's fused RoPE is Transformer Engine's, so a TE-free run has `--no-rope-fusion` and
Megatron's `_apply_rotary_pos_emb_bshd` runs op by op: cos, sin, two casts, a chunk, a negation, a
concatenation, two products, a sum and a last concatenation, each one kernel over the query or the
key of every layer, and as many again in the backward. On row 600 (Llama-style 1.5B, 16 layers,
8 micro-batches) that is thousands of small kernels a step (results/bench/README.md#where-a-step-goes-profiles:
the `CatArrayBatchedCopy`, bf16 `add` and strided `elementwise_kernel` calls).

What this does instead: the same math, written once below, compiled by torch.compile into one
kernel for the forward and one for the backward (Megatron's own `jit_fuser` is torch.compile too),
for CUDA tensors:
    out = t * cos(f) + rotate_half(t) * sin(f),  rotate_half([x1, x2]) = [-x2, x1]
with cos and sin of the fp32 frequencies scaled by mscale and cast to t's dtype as Megatron does, and
the channels past the rotary dimension passed through. The products and the sum run in fp32 and are
rounded once (Megatron's op-by-op path rounds after each op): at most one bf16 rounding step apart.

Scope. Interleaved and MLA-style layouts, and tensors off the GPU (the CPU tests), go on to
Megatron's function unchanged. Exactness against Megatron's function: tests/test_rope.py.
"""
from __future__ import annotations

import torch

_COMPILED: list = []  # the compiled _rope, made once per process at the first CUDA call
_MEGATRON: list = []  # Megatron's _apply_rotary_pos_emb_bshd, kept for the calls this leaves to it


def _rope(t: torch.Tensor, freqs: torch.Tensor, mscale: float) -> torch.Tensor:
    """Megatron's non-interleaved `_apply_rotary_pos_emb_bshd`, as one expression."""
    rot_dim = freqs.shape[-1]
    x, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos_ = (torch.cos(freqs) * mscale).to(t.dtype)
    sin_ = (torch.sin(freqs) * mscale).to(t.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * cos_ + rotated * sin_, t_pass), dim=-1)


def _kernel():
    if not _COMPILED:
        _COMPILED.append(torch.compile(_rope, dynamic=False, fullgraph=True))
    return _COMPILED[0]


def apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False, mla_rotary_interleaved=False, mscale=1.0,
                              multi_latent_attention=None):
    """Drop-in for Megatron-Core 0.19's `rope_utils._apply_rotary_pos_emb_bshd` (same arguments)."""
    if rotary_interleaved or mla_rotary_interleaved or multi_latent_attention or not t.is_cuda:
        return _MEGATRON[0](t, freqs, rotary_interleaved=rotary_interleaved,
                            mla_rotary_interleaved=mla_rotary_interleaved, mscale=mscale,
                            multi_latent_attention=multi_latent_attention)
    return _kernel()(t, freqs, float(mscale))


_ARGS = ("t", "freqs", "rotary_interleaved", "mla_rotary_interleaved", "mscale", "multi_latent_attention")


def install() -> bool:
    """Route Megatron's unfused RoPE (what `apply_rotary_pos_emb` calls for [s, b, h, d] tensors without
    --rope-fusion) here. False, and nothing changed, where Megatron's function has other arguments than
    the ones this copies."""
    import inspect

    from megatron.core.models.common.embeddings import rope_utils

    current = rope_utils._apply_rotary_pos_emb_bshd
    if current is apply_rotary_pos_emb_bshd:
        return True
    if tuple(inspect.signature(current).parameters) != _ARGS:
        return False
    _MEGATRON[:] = [current]
    rope_utils._apply_rotary_pos_emb_bshd = apply_rotary_pos_emb_bshd
    return True
