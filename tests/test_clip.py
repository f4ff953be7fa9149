"""clip_in_adam (megalab/runtime/clip.py): Megatron's clip by total norm, folded into fused AdamW's
kernel, gives the update Megatron's clip-then-step gives (CPU, fresh random data)."""
import math

import pytest
import torch

from megalab._compat import ensure_typing_override
from megalab.runtime import clip, fastpath


def _params(seed, shapes=((33, 7), (129,), (4, 5, 6))):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _grads(seed, like, scale):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) * scale for p in like]


@pytest.fixture
def megatron_clip(monkeypatch):
    """Megatron's own clip, run on CPU: its assert wants CUDA tensors, its scale is the local fallback."""
    ensure_typing_override()
    import megatron.core.optimizer.clip_grads as mclip
    import megatron.core.optimizer.optimizer as optmod
    from megatron.core.utils import local_multi_tensor_scale

    for mod in (mclip, optmod):
        monkeypatch.setattr(mod, "clip_grad_by_total_norm_fp32", mod.clip_grad_by_total_norm_fp32)
    monkeypatch.setattr(mclip, "multi_tensor_scale_impl", local_multi_tensor_scale)

    def on_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
        coeff = max_norm / (total_norm + 1.0e-6)
        grads = [p.grad for p in parameters if p.grad is not None]
        if coeff < 1.0:
            local_multi_tensor_scale(2048, None, [grads, grads], coeff)
    monkeypatch.setattr(clip, "_MEGATRON", [on_cpu])
    return on_cpu


@pytest.mark.parametrize("on_device", [False, True], ids=["host_norm", "device_norm"])
@pytest.mark.parametrize("max_norm, grad_scale", [(1.0, 3.0), (1.0, 0.001), (0.25, 1.0)])
def test_folded_clip_gives_megatrons_update(megatron_clip, max_norm, grad_scale, on_device):
    """Five steps, norms above and below max_norm: the same weights as clip-then-step. With device_norm the
    norm arrives as Megatron's 1-element tensor and the coefficient never becomes a Python number."""
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref_p, got_p = _params(0), _params(0)
    ref = fastpath.FusedAdamW(ref_p, **kw)
    got = fastpath.FusedAdamW(got_p, **kw)
    unclipped_p = _params(0)
    unclipped = fastpath.FusedAdamW(unclipped_p, **kw)  # shows the clip changes the weights at all
    clipped = 0
    for step in range(5):
        # a different scale each step: Adam cancels a coefficient that is the same every step
        for ps in (ref_p, got_p, unclipped_p):
            for p, g in zip(ps, _grads(10 + step, ps, grad_scale * (1 + 2 * step))):
                p.grad = g
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in ref_p))
        clipped += norm > max_norm
        megatron_clip(ref_p, max_norm, norm)
        ref.step()
        clip.clip_grad_by_total_norm_fp32(got_p, max_norm, torch.tensor([norm]) if on_device else norm)
        if on_device:  # always set, 1 where nothing is clipped (Megatron clamps the coefficient at 1)
            want = max(1.0, (norm + 1e-6) / max_norm)
            assert got.grad_scale.shape == () and math.isclose(float(got.grad_scale), want, rel_tol=1e-6)
        else:
            assert (got.grad_scale is not None) == (max_norm / (norm + 1e-6) < 1.0)
        got.step()
        unclipped.step()
        assert got.grad_scale is None  # one step's coefficient, cleared after it
    assert clipped in (0, 5)  # each case is all-clipped or none-clipped, by its grad scale
    apart = max(float((a - b).abs().max()) for a, b in zip(unclipped_p, ref_p))
    assert (apart > 1e-4) == bool(clipped)  # where it clips, the clip is visible in the weights
    for a, b in zip(got_p, ref_p):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # grad / (1/c) vs grad * c: one rounding


def test_a_subset_of_the_optimizers_parameters_goes_to_megatron(megatron_clip):
    """A separate grad-norm group gets a coefficient of its own: not foldable into one grad_scale."""
    ps = _params(1)
    opt = fastpath.FusedAdamW(ps, lr=1e-3)
    for p, g in zip(ps, _grads(2, ps, 10.0)):
        p.grad = g
    before = [p.grad.clone() for p in ps]
    clip.clip_grad_by_total_norm_fp32(ps[:2], 1.0, 100.0)
    assert getattr(opt, "grad_scale", None) is None
    for p, b in zip(ps[:2], before[:2]):
        torch.testing.assert_close(p.grad, b * (1.0 / (100.0 + 1e-6)))  # Megatron scaled them in place
    torch.testing.assert_close(ps[2].grad, before[2])


def test_decoupled_grads_and_other_optimizers_go_to_megatron(megatron_clip):
    ps = _params(2)
    plain = torch.optim.AdamW(ps, lr=1e-3)  # not registered: its step may not honour grad_scale
    for p, g in zip(ps, _grads(3, ps, 10.0)):
        p.grad = g
    before = [p.grad.clone() for p in ps]
    clip.clip_grad_by_total_norm_fp32(ps, 1.0, 50.0)
    assert getattr(plain, "grad_scale", None) is None
    for p, b in zip(ps, before):
        torch.testing.assert_close(p.grad, b * (1.0 / (50.0 + 1e-6)))
    qs = _params(3)
    fused = fastpath.FusedAdamW(qs, lr=1e-3)
    for p, g in zip(qs, _grads(4, qs, 10.0)):
        p.grad = g
    calls = []
    clip._MEGATRON[:] = [lambda *a: calls.append(a)]
    clip.clip_grad_by_total_norm_fp32(qs, 1.0, 50.0, use_decoupled_grad=True)
    assert len(calls) == 1 and getattr(fused, "grad_scale", None) is None


def test_foreach_scale_in_place_is_one_pass(monkeypatch):
    """Megatron's clip hands [grads, grads]: scaled in place, no copy of each tensor onto itself."""
    ts = [torch.randn(5, 3), torch.randn(7)]
    want = [t * 0.3 for t in ts]
    monkeypatch.setattr(torch, "_foreach_copy_", lambda *a: pytest.fail("copied a tensor onto itself"))
    fastpath.foreach_scale(2048, None, [ts, ts], 0.3)
    for t, w in zip(ts, want):
        torch.testing.assert_close(t, w, rtol=0, atol=0)


def test_install_routes_both_of_megatrons_names(monkeypatch):
    ensure_typing_override()
    import megatron.core.optimizer.clip_grads as mclip
    import megatron.core.optimizer.optimizer as optmod

    for mod in (mclip, optmod):
        monkeypatch.setattr(mod, "clip_grad_by_total_norm_fp32", mod.clip_grad_by_total_norm_fp32)
    monkeypatch.setattr(clip, "_MEGATRON", list(clip._MEGATRON))
    original = mclip.clip_grad_by_total_norm_fp32
    assert clip.install() and clip.install()  # twice: Megatron's function is still the one kept
    assert mclip.clip_grad_by_total_norm_fp32 is clip.clip_grad_by_total_norm_fp32
    assert optmod.clip_grad_by_total_norm_fp32 is clip.clip_grad_by_total_norm_fp32
    assert clip._MEGATRON == [original]


def test_device_norm_keeps_megatrons_norm_and_scale_on_the_device(monkeypatch):
    """device_norm hands Megatron's clip_grads the tensor-scale kernel TE would: its norm comes back a tensor
    (no `.item()`), and its own clip (clip_in_adam off) scales by the clamped tensor coefficient."""
    ensure_typing_override()
    import megatron.core.optimizer.clip_grads as mclip

    monkeypatch.setattr(mclip, "multi_tensor_scale_tensor_impl", mclip.multi_tensor_scale_tensor_impl)
    monkeypatch.setattr(mclip, "l2_norm_impl", mclip.l2_norm_impl)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)  # one process, no group
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: zeros(*a, **k))  # its device='cuda', on CPU
    assert mclip.multi_tensor_scale_tensor_impl is None  # neither TE nor apex here
    assert fastpath.apply(["foreach_norm", "device_norm"]) == ["foreach_norm", "device_norm"]
    assert mclip.multi_tensor_scale_tensor_impl is fastpath.foreach_scale
    grads = _grads(5, _params(5), 4.0)
    want = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("the norm went to the host"))
    norm = mclip.get_grad_norm_fp32(grads)
    assert isinstance(norm, torch.Tensor) and math.isclose(float(norm.sum()), want, rel_tol=1e-5)
    for big in (True, False):
        ts = [g.clone() for g in grads]
        total = norm if big else norm * 0 + 0.5  # above max_norm 1: scaled; below: left as they are
        coeff = min(1.0, 1.0 / (float(total.sum()) + 1e-6))
        fastpath.foreach_scale(2048, None, [ts, ts], (1.0 / (total + 1e-6)).clamp_max(1.0))
        for t, g in zip(ts, grads):
            torch.testing.assert_close(t, g * coeff)
