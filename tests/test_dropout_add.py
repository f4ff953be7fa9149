"""dropout_add (megalab/runtime/dropout_add.py) is Megatron's bias-dropout-add, residual + dropout(x + bias): the
output, the input, bias (also straight into an fp32 main_grad) and residual gradients, against the same mask
applied in float64, in Triton's interpreter on CPU (the kernels themselves run). The mask is read back by drawing
the same seed again (torch's generator reset) on x = 1; its rate, and that the four rows a draw serves and two calls
get masks of their own, are checked too. Triton reads TRITON_INTERPRET when it is imported: a fresh interpreter."""
import pytest

from tests.conftest import interpreted


def _check(dtype_name: str, wrong: str = ""):
    import torch

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megalab.runtime import dropout_add as D
    from megalab.runtime import param_grad

    dtype = getattr(torch, dtype_name)
    if wrong == "other-seed":  # a backward that draws another mask must fail the check below
        D._BiasDropoutAdd.backward = (lambda ctx, g, f=D._BiasDropoutAdd.backward: f(_Ctx(ctx), g))
    if wrong == "first-program":  # a bias gradient of the first program's rows only
        reduce = param_grad.reduce
        param_grad.reduce = lambda params, parts: reduce(params, parts[:, :1].contiguous())
    tol = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7}[dtype]
    p = 0.3
    # rows: 1, a ragged group of four, two programs of several tiles, the second ragged; columns: fewer than a
    # block, not a multiple of one
    for rows, n in ((1, 7), (5, 130), (4 * D.ROW_GROUPS * (D.TILES_PER_PROGRAM + 1) + 7, 257)):
        for has_bias, into_main_grad in ((False, False), (True, False), (True, True)):
            g = torch.Generator().manual_seed(rows * n + 2 * has_bias + into_main_grad)
            x = torch.randn(rows, 1, n, generator=g, dtype=torch.float64).to(dtype).double()
            res = torch.randn(rows, 1, n, generator=g, dtype=torch.float64).to(dtype).double()
            b = torch.randn(n, generator=g, dtype=torch.float64).to(dtype).double()
            dout = torch.randn(rows, 1, n, generator=g, dtype=torch.float64).to(dtype).double()
            torch.manual_seed(7)  # the seed the kernel's call draws: the same for the mask's read-back
            kept = _mask(D, x.to(dtype), p).double()
            assert ((kept == 0) | ((kept * (1 - p) - 1).abs() < tol)).all(), kept.unique()
            mask = (kept > 0).double()

            xx = x.to(dtype).requires_grad_()
            rr = res.to(dtype).requires_grad_()
            bb = torch.nn.Parameter(b.to(dtype)) if has_bias else None
            start = torch.randn(n, generator=g, dtype=torch.float64).float()
            if into_main_grad:  # as Megatron's DDP wraps a parameter
                bb.main_grad = start.clone()
                bb.grad_added_to_main_grad = False
            torch.manual_seed(7)
            out = D.bias_dropout_add_train((xx, bb), rr, p)
            out.backward(dout.to(dtype))

            want = res + mask * (x + (b if has_bias else 0)) / (1 - p)
            dx = mask * dout / (1 - p)
            checks = [("out", out.detach().double(), want), ("dx", xx.grad.double(), dx),
                      ("dresidual", rr.grad.double(), dout)]
            if has_bias:
                got_b = (bb.main_grad.double() - start.double()) if into_main_grad else bb.grad.double()
                checks.append(("dbias", got_b, dx.sum(dim=(0, 1))))
                if into_main_grad:
                    assert bb.grad_added_to_main_grad, "the hook's flag was not set"
            for name, a, e in checks:
                scale = max(1.0, e.abs().max().item())  # the bias gradient is a sum over rows
                err = (a - e).abs().max().item() / scale
                assert err <= tol, f"{dtype_name} rows={rows} n={n} bias={has_bias} {name}: {err:.2e}"
    print("dropout_add ok")


def _rate():
    """The mask keeps 1 - p of the elements, rows that share a draw are not one mask, and calls differ."""
    import torch

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megalab.runtime import dropout_add as D

    rows, n = 4 * D.ROW_GROUPS * 2, 300
    for p in (0.1, 0.5):
        like = torch.empty(rows, 1, n)
        a, b = _mask(D, like, p) > 0, _mask(D, like, p) > 0
        kept = a.float().mean().item()
        sigma = (p * (1 - p) / a.numel()) ** 0.5
        assert abs(kept - (1 - p)) < 5 * sigma, (p, kept)
        # two rows of one draw (4g, 4g + 1) agree where two independent masks would: p^2 + (1 - p)^2
        same = (a[0::4] == a[1::4]).float().mean().item()
        assert abs(same - (p * p + (1 - p) ** 2)) < 0.05, (p, same)
        assert (a != b).any(), "two calls drew one mask"
    print("dropout_add rate ok")


def _mask(D, like, p):
    """The lever's kernel on ones over zeros: its output over 1 / (1 - p) where it keeps, 0 where it drops (the mask
    of the seed the call draws from torch's generator)."""
    import torch

    return D._BiasDropoutAdd.apply(torch.ones_like(like), None, torch.zeros_like(like), p)


class _Ctx:
    """A backward's ctx whose saved seed is another one (the wrong variant above)."""

    def __init__(self, ctx):
        self.bias, self.needs_input_grad = ctx.bias, ctx.needs_input_grad
        self.prob, self.rows, self.shape = ctx.prob, ctx.rows, ctx.shape
        self.saved_tensors = (ctx.saved_tensors[0] + 1,)


def _gpt(wrong: str = ""):
    """In the fresh interpreter: Megatron's GPT with megalab's spec and hidden dropout, its bias-dropout-adds run by
    the lever's kernels against the same masks applied by torch's ops (read back as above): the layers hand the
    kernels the right tensors, and the loss and every gradient agree."""
    from conftest import assert_same_run, tiny_gpt

    import torch

    from megalab.runtime import dropout_add as D
    from megalab.runtime import levers

    p = 0.3
    calls = []
    kernels = D.bias_dropout_add_train

    def ours(x_with_bias, residual, prob):
        calls.append(prob)
        return kernels(x_with_bias, residual, prob)

    def by_torch(x_with_bias, residual, prob):
        x, bias = x_with_bias
        with torch.no_grad():  # the seed the kernel would draw, and its mask
            mask = _mask(D, x, prob) != 0
        if wrong == "no-bias":
            bias = None
        return residual + mask * (x + (0 if bias is None else bias)) / (1 - prob)

    with tiny_gpt(hidden_dropout=p, bias_dropout_fusion=True) as (model, run):
        levers.mark_applied(["dropout_add"])
        D.bias_dropout_add_train = ours
        ours = run()
        assert calls == [p] * 2 * model.config.num_layers, calls  # each layer's two bias-dropout-adds
        D.bias_dropout_add_train = by_torch
        assert_same_run(ours, run())
    print("dropout_add gpt ok")


def test_dropout_add_is_megatrons_gpt_with_the_same_masks():
    out = interpreted("import test_dropout_add as t; t._gpt()")
    assert out.returncode == 0 and "dropout_add gpt ok" in out.stdout, out.stderr[-3000:]


def test_a_gpt_whose_masks_leave_out_the_bias_is_caught():
    """The check can fail: the same masks without the projections' biases give another loss."""
    out = interpreted("import test_dropout_add as t; t._gpt('no-bias')")
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]


def _run(*args):
    return interpreted(f"import test_dropout_add as t; t._check({', '.join(repr(a) for a in args)})")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_add_is_megatrons_with_its_own_mask(dtype):
    """One row to several tiles, widths that are not a block's, with and without a bias (autograd's gradient or
    added into an fp32 main_grad with Megatron's flag set): out, dx, dresidual and dbias within fp32's (or one
    bf16) rounding of the same mask's float64 math; the backward draws the forward's mask."""
    out = _run(dtype)
    assert out.returncode == 0 and "dropout_add ok" in out.stdout, out.stderr[-3000:]


def test_dropout_adds_mask_has_the_rate_and_fresh_draws():
    out = interpreted("import test_dropout_add as t; t._rate()")
    assert out.returncode == 0 and "dropout_add rate ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("wrong", ["other-seed", "first-program"])
def test_a_wrong_dropout_add_is_caught(wrong):
    """The check can fail: a backward drawing another mask, or a bias gradient from one program's rows."""
    out = _run("float32", wrong)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]


def test_dropout_add_leaves_what_it_does_not_take_to_megatron(monkeypatch):
    """Inference, no dropout, mixed dtypes, a non-contiguous input, CPU without the interpreter: Megatron's."""
    import torch

    from megalab.runtime import dropout_add as D
    from megalab.runtime import levers

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, r = torch.ones(4, 1, 8), torch.zeros(4, 1, 8)
    assert not D.takes(x, None, r, 0.1)  # CPU, no interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert D.takes(x, None, r, 0.1)
    assert not D.takes(x, None, r, 0.0)
    assert not D.takes(x.double(), None, r, 0.1)
    assert not D.takes(x.transpose(0, 2), None, r.transpose(0, 2), 0.1)
    assert not D.takes(x, torch.ones(7), r, 0.1)
    from megatron.core.fusions import fused_bias_dropout as M

    monkeypatch.setattr(levers, "_APPLIED", {"dropout_add"})
    assert D.get_bias_dropout_add(True, True) is D.bias_dropout_add_train
    assert D.get_bias_dropout_add(False, True) is M.bias_dropout_add_fused_inference
    assert D.get_bias_dropout_add(True, False) is not D.bias_dropout_add_train  # unfused was asked for
    monkeypatch.setattr(levers, "_APPLIED", set())
    assert D.get_bias_dropout_add(True, True) is M.bias_dropout_add_fused_train
