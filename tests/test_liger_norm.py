"""The liger_norm lever: liger-kernel's norms stand in for megalab's Norm only with the lever on and on the GPU;
on the GPU (pytest -m gpu) they are torch's norms within bf16's rounding, gradients too, zero-centred gamma
included."""
import importlib.util

import pytest

from megalab._compat import ensure_typing_override


def test_the_lever_is_read_only_for_cuda_tensors(monkeypatch):
    ensure_typing_override()
    import torch

    from megalab.runtime import levers, liger_norm

    x = torch.empty(2, 3, 64)
    assert not liger_norm.takes(x)  # the lever is off
    monkeypatch.setattr(levers, "_APPLIED", {"liger_norm"})
    assert not liger_norm.takes(x)  # a CPU tensor: torch's functions run


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel is not installed")
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shifted", [False, True])
def test_liger_norm_is_torchs_norm_within_bf16_rounding(rms, shifted):
    ensure_typing_override()
    import torch
    import torch.nn.functional as F

    from megalab.runtime import liger_norm

    torch.manual_seed(0)
    s, b, h = 256, 3, 1600
    x = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(h, device="cuda") + 0.5 - (1 if shifted else 0)).to(torch.bfloat16).requires_grad_()
    bias = None if rms else (torch.randn(h, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16)

    def torch_norm(x, w, bias):
        g = (w.double() + 1) if shifted else w.double()
        return (F.rms_norm(x.double(), (h,), g, 1e-5) if rms
                else F.layer_norm(x.double(), (h,), g, None if bias is None else bias.double(), 1e-5))

    params = [t for t in (x, w, bias) if t is not None]
    want = torch_norm(x, w, bias)
    want_grads = torch.autograd.grad(want, params, dy.double())
    got = liger_norm.norm(x, w, bias, 1e-5, rms, shifted)
    got_grads = torch.autograd.grad(got, params, dy)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert (got.double() - want).abs().max().item() < 0.05
    for g, w_ in zip(got_grads, want_grads):
        scale = w_.abs().max().item() or 1.0
        assert (g.double() - w_).abs().max().item() / scale < 0.02
