"""triton_norm (megalab/runtime/triton_norm.py) computes torch's LayerNorm and RMSNorm: values and the input,
weight and bias gradients, in Triton's interpreter on CPU (the kernels themselves run, not a copy of their math).
Triton's reductions are interpreted only where TRITON_INTERPRET was set before Triton was imported, so the
checks run in a fresh interpreter."""
import pytest

from tests.conftest import interpreted


def _check(dtype_name: str, wrong: str = "", residual: str = ""):
    """Run in the fresh interpreter: every case against torch's norm in float64, per dtype's tolerance. With
    `residual` the norm_residual form: "used", the residual feeds a branch whose gradient dr joins dx; "unused",
    the residual output is left alone (its gradient None)."""
    import torch
    import torch.nn.functional as F

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megalab.runtime import triton_norm as T

    dtype = getattr(torch, dtype_name)
    if wrong == "no-mean":  # a kernel that forgets the mean must fail the check below
        T.norm = lambda x, w, b, eps, rms, shifted, f=T.norm: f(x, w, b, eps, True, shifted) + (0 if b is None else b)
    if wrong == "no-residual":  # a backward that drops the residual's gradient must fail the check below
        T._backward = lambda ctx, dy, dres, f=T._backward: f(ctx, dy, None)
    tol = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7}[dtype]
    # rows: 1, fewer than a program's MIN_ROWS, and a ragged last block; hidden: not a power of two
    for rows, h in ((1, 40), (5, 7), (3 * 7 * T.MIN_ROWS + 3, 40), (130, 257)):
        for rms in (False, True):
            for shifted in (False, True):
                g = torch.Generator().manual_seed(rows * h + 2 * rms + shifted)
                x = torch.randn(rows, 1, h, generator=g, dtype=torch.float64) * 2 + 0.5
                w = torch.randn(h, generator=g, dtype=torch.float64) * 0.3 + (0 if shifted else 1)
                b = None if rms else torch.randn(h, generator=g, dtype=torch.float64) * 0.1
                dy = torch.randn(rows, 1, h, generator=g, dtype=torch.float64)
                dr = torch.randn(rows, 1, h, generator=g, dtype=torch.float64)
                # the inputs as the dtype holds them: the reference sees what the kernel sees
                x, w, dy, dr = (t.to(dtype).double() for t in (x, w, dy, dr))
                b = None if b is None else b.to(dtype).double()

                def run(fn, cast):
                    xx, ww = (t.to(cast).requires_grad_() for t in (x, w))
                    bb = None if b is None else b.to(cast).requires_grad_()
                    y, r = fn(xx, ww, bb)
                    if residual == "used":
                        torch.autograd.backward((y, r), (dy.to(cast), dr.to(cast)))
                    else:
                        y.backward(dy.to(cast))
                    return [t.double() for t in (y.detach(), xx.grad, ww.grad, *(() if bb is None else (bb.grad,)))]

                def ref(xx, ww, bb):
                    gamma = ww + 1 if shifted else ww
                    y = F.rms_norm(xx, (h,), gamma, 1e-5) if rms else F.layer_norm(xx, (h,), gamma, bb, 1e-5)
                    return y, xx.view_as(xx)

                def mine(xx, ww, bb):
                    if residual:
                        return T.norm_residual(xx, ww, bb, 1e-5, rms, shifted)
                    return T.norm(xx, ww, bb, 1e-5, rms, shifted), None

                ours = run(mine, dtype)
                exact = run(ref, torch.float64)
                for name, a, e in zip(("y", "dx", "dweight", "dbias"), ours, exact):
                    scale = max(1.0, e.abs().max().item())  # the gradients of weight and bias are sums over rows
                    err = (a - e).abs().max().item() / scale
                    assert err <= tol, f"{dtype_name} rows={rows} h={h} rms={rms} shifted={shifted} {name}: {err:.2e}"
    print("triton_norm ok")


def _run(*args):
    return interpreted(f"import test_triton_norm as t; t._check({', '.join(repr(a) for a in args)})")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_norm_is_torchs_norm_within_the_dtypes_rounding(dtype):
    """LayerNorm and RMSNorm, gamma stored as is or zero-centred, one row to a ragged block of rows, a hidden
    size that is not a power of two: y, dx, dgamma and dbeta within fp32's (or one bf16) rounding of float64."""
    out = _run(dtype)
    assert out.returncode == 0 and "triton_norm ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("residual", ["used", "unused"])
def test_norm_residual_adds_the_residuals_gradient_into_dx(residual):
    """norm_residual's form (output, residual): where the residual feeds a branch, dx is the norm's input gradient
    plus that branch's gradient, added in the kernel; where it is unused, the plain norm's gradients."""
    out = _run("bfloat16", "", residual)
    assert out.returncode == 0 and "triton_norm ok" in out.stdout, out.stderr[-3000:]


def test_a_dropped_residual_gradient_is_caught():
    """The check can fail: a backward that ignores the residual's gradient is refused."""
    out = _run("float32", "no-residual", "used")
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]


def test_a_wrong_norm_is_caught():
    """The check can fail: a LayerNorm that forgets the mean (RMSNorm's kernel plus beta) is refused."""
    out = _run("float32", "no-mean")
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]


def test_the_lever_is_read_only_for_cuda_tensors_that_fit(monkeypatch):
    """megalab's Norm takes triton_norm's kernels only with the lever on, on the GPU (or in Triton's interpreter)
    and for rows that fit one block; on CPU (and for wider rows) torch's functions run, so turning the lever on
    changes nothing here."""
    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    import torch

    from megalab.runtime import triton_norm
    from megalab.runtime import levers

    assert triton_norm.fits(torch.empty(2, 3, 1600))
    assert not triton_norm.fits(torch.empty(2, 3, triton_norm.MAX_HIDDEN + 1))
    assert not triton_norm.fits(torch.empty(0, 3, 1600))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_norm.takes(torch.empty(2, 3, 1600))  # the lever is off
    monkeypatch.setattr(levers, "_APPLIED", {"triton_norm"})
    assert not triton_norm.takes(torch.empty(2, 3, 1600))  # a CPU tensor, no interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_norm.takes(torch.empty(2, 3, 1600))
    assert not triton_norm.takes(torch.empty(2, 3, triton_norm.MAX_HIDDEN + 1))
