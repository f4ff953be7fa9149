"""compiled_norm (megalab/runtime/norm.py) computes torch's LayerNorm and RMSNorm: values and gradients (CPU)."""
import pytest
import torch
import torch.nn.functional as F

from megalab._compat import ensure_typing_override

ensure_typing_override()

from megalab.runtime import fastpath, levers, norm  # noqa: E402


def _inputs(seed, rows=12, h=40, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 3, h, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    w = (torch.randn(h, generator=g, dtype=torch.float64) * 0.3 + 1).to(dtype)
    b = (torch.randn(h, generator=g, dtype=torch.float64) * 0.1).to(dtype)
    return x, w, b


def _value_and_grads(fn, x, w, b):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    out = fn(x, w, b)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return out.detach(), x.grad, w.grad, b.grad


def _torch(rms, shifted, eps=1e-5):
    def fn(x, w, b):
        gamma = w + 1 if shifted else w
        if rms:
            return F.rms_norm(x, x.shape[-1:], gamma, eps) + 0 * b.sum()  # b unused: a zero gradient
        return F.layer_norm(x, x.shape[-1:], gamma, b, eps)
    return fn


def _ours(rms, shifted, eps=1e-5):
    def fn(x, w, b):
        out = norm._norm(x, w, None if rms else b, eps, rms, shifted)
        return out + 0 * b.sum() if rms else out
    return fn


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shifted", [False, True])
def test_norm_math_is_torchs_in_float64(seed, rms, shifted):
    x, w, b = _inputs(seed)
    ours = _value_and_grads(_ours(rms, shifted), x, w, b)
    theirs = _value_and_grads(_torch(rms, shifted), x, w, b)
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rms", [False, True])
def test_norm_math_in_bf16_is_within_one_rounding_of_torchs(rms):
    x, w, b = _inputs(3, dtype=torch.bfloat16)
    ours, theirs = _ours(rms, False)(x, w, b), _torch(rms, False)(x, w, b)
    exact = _torch(rms, False)(x.double(), w.double(), b.double())
    assert ours.dtype == theirs.dtype == torch.bfloat16
    for y in (ours, theirs):  # each a bf16 rounding of the same function
        torch.testing.assert_close(y.double(), exact, rtol=2 ** -7, atol=2 ** -7)


def test_a_wrong_norm_is_caught():
    """The check above can fail: a norm that forgets the mean is not LayerNorm."""
    x, w, b = _inputs(4)
    wrong = _value_and_grads(_ours(True, False), x, w, b)[0] + b
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong, _torch(False, False)(x, w, b), rtol=1e-6, atol=1e-6)


def test_norm_traces_whole_for_the_compiler():
    """fullgraph=True on the GPU: the function must trace without a graph break (checked here with the
    eager backend, which compiles nothing)."""
    x, w, b = _inputs(5, dtype=torch.float32)
    for rms in (False, True):
        traced = torch.compile(norm._norm, backend="eager", fullgraph=True, dynamic=False)
        torch.testing.assert_close(traced(x, w, None if rms else b, 1e-5, rms, False),
                                   norm._norm(x, w, None if rms else b, 1e-5, rms, False))


def test_the_lever_switches_megalabs_norm_on_the_gpu_only(monkeypatch):
    """Off the GPU megalab's Norm stays torch's even with the lever on (CPU tests, CPU tensors)."""
    from megalab.runtime import spec

    monkeypatch.setattr(levers, "_APPLIED", set())
    assert fastpath.apply(["compiled_norm"]) == ["compiled_norm"] and levers.on("compiled_norm")
    called = []
    monkeypatch.setattr(norm, "compiled", lambda *a: called.append(a))
    cfg = type("C", (), {"normalization": "LayerNorm", "layernorm_zero_centered_gamma": False,
                         "params_dtype": torch.float32, "sequence_parallel": False})()
    layer = spec.Norm(cfg, 8)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(layer(x), F.layer_norm(x, (8,), layer.weight, layer.bias, 1e-5))
    assert not called
