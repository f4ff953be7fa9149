"""param_grad (megalab/runtime/param_grad.py) adds a kernel's table of partial sums into each parameter's fp32
main_grad, or writes the gradient in the parameter's dtype where it cannot; and triton_norm's weight and bias
gradients take that path. In Triton's interpreter on CPU, in a fresh interpreter (TRITON_INTERPRET is read when
Triton is imported)."""
from tests.conftest import interpreted


def _param(n, dtype, main=None, flag=True, zero_out=False):
    import torch

    p = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    if main is not None:
        p.main_grad = main.clone()
    if flag:
        p.grad_added_to_main_grad = False
    if zero_out:
        p.zero_out_wgrad = True
    return p


def _check():
    import torch
    import torch.nn.functional as F

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megalab.runtime import param_grad as P
    from megalab.runtime import triton_norm as T

    g = torch.Generator().manual_seed(0)
    # rows and columns that are not multiples of the kernel's blocks
    for programs, n in ((1, 3), (P.BLOCK_ROWS + 3, P.BLOCK_COLS + 5)):
        parts = torch.randn(2, programs, n, generator=g)
        want = parts.double().sum(1)
        start = [torch.randn(n, generator=g) for _ in range(2)]
        # both into main_grad: added (what was there stays), flags set, stand-ins handed back
        ps = [_param(n, torch.bfloat16, main=s) for s in start]
        out = P.reduce(ps, parts)
        for p, s, w in zip(ps, start, want):
            assert torch.allclose(p.main_grad.double(), s.double() + w, atol=1e-5), "not added into main_grad"
            assert p.grad_added_to_main_grad is True
        assert all(o.shape == (n,) for o in out)
        # one of them without Megatron's flag, or zeroed by Megatron itself: both written in the weight's dtype
        for other in (_param(n, torch.float32, main=start[1], flag=False),
                      _param(n, torch.float32, main=start[1], zero_out=True)):
            ps = [_param(n, torch.float32, main=start[0]), other]
            out = P.reduce(ps, parts)
            assert all(o.dtype == torch.float32 for o in out)
            assert all(torch.allclose(o.double(), w, atol=1e-5) for o, w in zip(out, want)), "wrong sums"
            assert torch.equal(ps[0].main_grad, start[0]), "main_grad touched though the gradient went to autograd"
        # one table (a bias alone)
        out = P.reduce([_param(n, torch.float32)], parts[:1].contiguous())
        assert torch.allclose(out[0].double(), want[0], atol=1e-5)

    # triton_norm's weight and bias gradients into main_grad, equal to torch's LayerNorm's (fp32)
    rows, h = 3 * T.MIN_ROWS + 3, 40
    x = torch.randn(rows, h, generator=g)
    dy = torch.randn(rows, h, generator=g)
    w0, b0 = torch.randn(h, generator=g), torch.randn(h, generator=g)
    start = torch.randn(h, generator=g)
    w, b = _param(h, torch.float32, main=start), _param(h, torch.float32, main=start)
    with torch.no_grad():
        w.copy_(w0), b.copy_(b0)
    T.norm(x, w, b, 1e-5, False, False).backward(dy)
    rw, rb = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    F.layer_norm(x, (h,), rw, rb, 1e-5).backward(dy)
    for name, p, r in (("dweight", w, rw), ("dbias", b, rb)):
        assert torch.allclose(p.main_grad - start, r.grad, atol=1e-4), f"triton_norm {name} not in main_grad"
        assert p.grad_added_to_main_grad is True
    print("param_grad ok")


def test_param_grad_adds_into_main_grad_or_hands_autograd_the_gradient():
    """Sums over a table's rows added into every main_grad (the hook's flag set), or, where one parameter has no
    flag or is zeroed by Megatron, written for autograd and main_grad left alone; triton_norm's gradients go in."""
    out = interpreted("import test_param_grad as t; t._check()")
    assert out.returncode == 0 and "param_grad ok" in out.stdout, out.stderr[-3000:]
