"""Each TE-free fast-path piece computes what Megatron's fallback computes (CPU, fresh random data)."""
import pytest
import torch

from megalab.runtime import fastpath
from megalab._compat import ensure_typing_override


def _tensors(seed, shapes=((7, 3), (128,), (5, 5, 5), (1,))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_foreach_l2_norm_equals_the_norm_of_all_elements(seed):
    a, b = _tensors(seed), _tensors(seed + 10)
    ref = torch.cat([t.flatten() for t in a + b]).double().norm()
    got, _ = fastpath.foreach_l2_norm(2048, None, [a, b], False)
    assert got.shape == (1,)
    torch.testing.assert_close(got.double()[0], ref, rtol=1e-6, atol=0)  # fp32 sums of ~300 terms


def test_foreach_l2_norm_of_nothing_is_zero():
    got, _ = fastpath.foreach_l2_norm(2048, None, [[]], False)
    assert float(got) == 0.0


def test_foreach_scale_matches_megatron_local_scale():
    ensure_typing_override()
    from megatron.core.utils import local_multi_tensor_scale

    src = _tensors(3)
    dst_ref = [torch.full_like(t, float("nan")) for t in src]  # poisoned: every element must be written
    dst = [torch.full_like(t, float("nan")) for t in src]
    local_multi_tensor_scale(2048, None, [src, dst_ref], 0.37)
    fastpath.foreach_scale(2048, None, [src, dst], 0.37)
    for a, b in zip(dst, dst_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fused_adamw_follows_plain_adamw():
    torch.manual_seed(0)
    p1 = [torch.nn.Parameter(t) for t in _tensors(4)]
    p2 = [torch.nn.Parameter(t.clone()) for t in _tensors(4)]
    kw = dict(lr=6e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = torch.optim.AdamW(p1, foreach=False, **kw)
    fused = fastpath.FusedAdamW(p2, **kw)
    assert fused.defaults["fused"] is True
    for step in range(5):
        grads = _tensors(100 + step)
        for p, q, g in zip(p1, p2, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ref.step()
        fused.step()
    for p, q in zip(p1, p2):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)  # same math, different fp32 op order


def test_requested_parses_and_rejects_unknown_names():
    assert fastpath.requested({}) == []
    assert fastpath.requested({"MEGALAB_FAST": "all"}) == list(fastpath.PATCHES)
    assert fastpath.requested({"MEGALAB_FAST": "fused_adam, foreach_norm"}) == ["fused_adam", "foreach_norm"]
    with pytest.raises(ValueError, match="unknown patch.*fix"):
        fastpath.requested({"MEGALAB_FAST": "warp_speed"})


def test_apply_replaces_only_megatrons_fallbacks(monkeypatch):
    ensure_typing_override()
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as optmod

    monkeypatch.setattr(torch.optim, "AdamW", torch.optim.AdamW)  # restored after the test
    monkeypatch.setattr(clip, "l2_norm_impl", clip.l2_norm_impl)
    monkeypatch.setattr(clip, "multi_tensor_scale_impl", clip.multi_tensor_scale_impl)
    monkeypatch.setattr(optmod, "multi_tensor_scale_impl", optmod.multi_tensor_scale_impl)
    applied = fastpath.apply(list(fastpath.PATCHES))
    # neither TE nor apex here: all three are fallbacks; the attention order is a GPU-only patch
    assert applied == ["fused_adam", "foreach_norm", "foreach_scale"]
    assert torch.optim.AdamW is fastpath.FusedAdamW
    assert clip.l2_norm_impl is fastpath.foreach_l2_norm
