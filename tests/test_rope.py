"""compiled_rope (megalab/runtime/rope.py) computes Megatron's unfused RoPE: values and gradients (CPU)."""
import pytest
import torch

from megalab._compat import ensure_typing_override

ensure_typing_override()

from megatron.core.models.common.embeddings import rope_utils  # noqa: E402

from megalab.runtime import fastpath, rope  # noqa: E402

MEGATRON = rope_utils._apply_rotary_pos_emb_bshd


def _inputs(seed, s=6, b=2, h=3, d=8, rot=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(s, b, h, d, generator=g, dtype=torch.float64).to(dtype)
    freqs = torch.randn(s, 1, 1, rot, generator=g, dtype=torch.float32) * 3
    return t, freqs


def _value_and_grad(fn, t, freqs, **kw):
    t = t.clone().requires_grad_()
    out = fn(t, freqs, **kw)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return out.detach(), t.grad


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rot", [8, 4])  # the whole head dimension, and half of it (t_pass non-empty)
@pytest.mark.parametrize("mscale", [1.0, 0.7])
def test_rope_math_is_megatrons_in_float64(seed, rot, mscale):
    t, freqs = _inputs(seed, rot=rot)
    ours = _value_and_grad(lambda t, f: rope._rope(t, f, mscale), t, freqs)
    theirs = _value_and_grad(MEGATRON, t, freqs, mscale=mscale)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_rope_math_in_bf16_is_within_one_rounding_of_megatrons():
    t, freqs = _inputs(3, dtype=torch.bfloat16)
    ours, theirs = rope._rope(t, freqs, 1.0), MEGATRON(t, freqs)
    exact = MEGATRON(t.double(), freqs)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    # both are bf16 roundings of the same function: each within a few bf16 ulps of the float64 value
    for x in (ours, theirs):
        torch.testing.assert_close(x.double(), exact, rtol=2 ** -6, atol=2 ** -6)


def test_a_wrong_rotation_is_caught():
    """The check above can fail: rotating the other way round is not Megatron's RoPE."""
    t, freqs = _inputs(4)
    x1, x2 = torch.chunk(t, 2, dim=-1)
    wrong = t * torch.cos(freqs) + torch.cat((x2, -x1), dim=-1) * torch.sin(freqs)
    assert not torch.allclose(wrong, MEGATRON(t, freqs))


def test_install_routes_megatrons_unfused_rope_and_leaves_the_rest_to_it(monkeypatch):
    monkeypatch.setattr(rope_utils, "_apply_rotary_pos_emb_bshd", MEGATRON)
    monkeypatch.setattr(rope, "_MEGATRON", [])
    assert fastpath.apply(["compiled_rope"]) == ["compiled_rope"]
    assert rope_utils._apply_rotary_pos_emb_bshd is rope.apply_rotary_pos_emb_bshd
    assert rope.install()  # twice: still installed, Megatron's function still the one kept
    assert rope._MEGATRON == [MEGATRON]
    t, freqs = _inputs(5)
    for kw in ({}, {"rotary_interleaved": True}, {"mscale": 0.5}):  # CPU tensors: Megatron's own path
        torch.testing.assert_close(rope_utils._apply_rotary_pos_emb_bshd(t, freqs, **kw), MEGATRON(t, freqs, **kw),
                                   rtol=0, atol=0)


def test_install_leaves_another_megatron_signature_alone(monkeypatch):
    def other(t, freqs, interleaved=False):
        return t

    monkeypatch.setattr(rope_utils, "_apply_rotary_pos_emb_bshd", other)
    assert rope.install() is False
    assert rope_utils._apply_rotary_pos_emb_bshd is other
