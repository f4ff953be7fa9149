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


def _check_stacked(wrong: str = ""):
    """into_stacked: a stacked expert gradient written (fresh) or added into main_grad, empty experts zero even
    where the GEMM left garbage in their slices; sizes that are not multiples of the kernel's block."""
    import torch

    from megalab.runtime import param_grad as P

    if wrong == "adds-when-fresh":  # a kernel that adds onto what is there when it should write must fail below
        real = P.into_stacked
        P.into_stacked = lambda main, dw, counts, fresh: real(main, dw, counts, False)
    g = torch.Generator().manual_seed(0)
    for experts, out, inp in ((1, 3, 5), (5, 7, P.BLOCK_STACKED // 16 + 3)):
        counts = torch.tensor([3, 0, 4, 0, 5][:experts])
        dw = torch.randn(experts, out, inp, generator=g).bfloat16()
        dw[counts == 0] = float("nan")  # pytorch/pytorch#172439: an empty group's slice is whatever was there
        want = torch.where((counts != 0).view(-1, 1, 1), dw.float(), 0.0)
        for fresh in (True, False):
            start = torch.randn(experts, out, inp, generator=g) if not fresh else torch.randn(1).expand(
                experts, out, inp).contiguous()  # fresh: what is there must not count
            main = start.clone()
            assert P.into_stacked(main, dw, counts, fresh)
            torch.testing.assert_close(main, want if fresh else start + want, rtol=0, atol=0)
        main = torch.zeros(experts, out, inp)
        assert P.into_stacked(main, dw.nan_to_num(), None, True)  # without counts every expert counts
        torch.testing.assert_close(main, dw.nan_to_num().float(), rtol=0, atol=0)
    assert not P.into_stacked(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3), None, True)
    print("into_stacked ok")


def test_stacked_expert_gradient_written_or_added_into_main_grad_empty_experts_zero():
    out = interpreted("import test_param_grad as t; t._check_stacked()")
    assert out.returncode == 0 and "into_stacked ok" in out.stdout, out.stderr[-3000:]


def test_a_stacked_gradient_added_where_it_should_be_written_fails_the_check():
    out = interpreted("import test_param_grad as t; t._check_stacked('adds-when-fresh')")
    assert out.returncode != 0 and "Mismatched elements" in out.stderr, out.stderr[-3000:]
