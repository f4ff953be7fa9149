"""bias_gelu (megalab/runtime/bias_gelu.py) is Megatron's fused bias-GeLU: its input and bias gradients, the
latter also straight into an fp32 main_grad, in Triton's interpreter on CPU (the kernel itself runs, not a copy of
its math). Triton's reductions are interpreted only where TRITON_INTERPRET was set before Triton was imported, so
the checks run in a fresh interpreter."""
import pytest

from tests.conftest import interpreted


def _gelu(bias, y):
    """Megatron's bias_gelu (the tanh approximation), in whatever dtype it is given."""
    import torch

    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _check(dtype_name: str, wrong: str = ""):
    """Run in the fresh interpreter: every case against autograd of Megatron's formula in float64."""
    import torch

    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    from megatron.core.fusions import fused_bias_gelu

    from megalab.runtime import bias_gelu as B
    from megalab.runtime import param_grad

    fused_bias_gelu.bias_gelu = _gelu  # Megatron's forward, uncompiled: the kernel under test is the backward
    dtype = getattr(torch, dtype_name)
    if wrong == "first-program":  # a bias gradient of the first block of rows only must fail the check below
        reduce = param_grad.reduce
        param_grad.reduce = lambda params, parts: reduce(params, parts[:, :1].contiguous())
    if wrong == "no-bias":  # a derivative taken without the bias must fail too
        B.BiasGeLU.backward = (lambda ctx, g, f=B.BiasGeLU.backward: (
            f(_Ctx(ctx, zero_bias=True), g)))
    tol = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7}[dtype]
    # rows: 1, a few, a ragged last block; columns: fewer than a block, not a multiple of one; the last case
    # narrow enough (one column block) that its rows are split between programs (the interpreter counts one SM)
    for rows, n in ((1, 7), (5, 130), (3 * B.BLOCK_ROWS + 5, 257), (3 * B.BLOCK_ROWS + 5, 40)):
        for into_main_grad in (False, True):
            g = torch.Generator().manual_seed(rows * n + into_main_grad)
            y = (torch.randn(rows, 1, n, generator=g, dtype=torch.float64) * 2).to(dtype).double()
            b = (torch.randn(n, generator=g, dtype=torch.float64)).to(dtype).double()
            dout = torch.randn(rows, 1, n, generator=g, dtype=torch.float64).to(dtype).double()

            yy = y.to(dtype).requires_grad_()
            bb = torch.nn.Parameter(b.to(dtype))
            start = torch.randn(n, generator=g, dtype=torch.float64).float()
            if into_main_grad:  # as Megatron's DDP wraps a parameter
                bb.main_grad = start.clone()
                bb.grad_added_to_main_grad = False
            out = B.BiasGeLU.apply(yy, bb)
            out.backward(dout.to(dtype))

            ry, rb = y.clone().requires_grad_(), b.clone().requires_grad_()
            _gelu(rb, ry).backward(dout)
            got_b = (bb.main_grad.double() - start.double()) if into_main_grad else bb.grad.double()
            if into_main_grad:
                assert bb.grad_added_to_main_grad, "the hook's flag was not set"
            for name, a, e in (("y", out.detach().double(), _gelu(b, y)), ("dx", yy.grad.double(), ry.grad),
                               ("dbias", got_b, rb.grad)):
                scale = max(1.0, e.abs().max().item())  # the bias gradient is a sum over rows
                err = (a - e).abs().max().item() / scale
                assert err <= tol, f"{dtype_name} rows={rows} n={n} main_grad={into_main_grad} {name}: {err:.2e}"
    print("bias_gelu ok")


class _Ctx:
    """A backward's ctx whose saved bias reads as zeros (the wrong variant above)."""

    def __init__(self, ctx, zero_bias):
        import torch

        self._ctx, self.bias, self.needs_input_grad = ctx, ctx.bias, ctx.needs_input_grad
        x, b = ctx.saved_tensors
        self.saved_tensors = (x, torch.zeros_like(b) if zero_bias else b)


def _run(*args):
    return interpreted(f"import test_bias_gelu as t; t._check({', '.join(repr(a) for a in args)})")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bias_gelu_is_megatrons_within_the_dtypes_rounding(dtype):
    """One row to a ragged block of rows, widths that are not a block's: y, dx and dbias (autograd's gradient,
    or added into an fp32 main_grad with Megatron's flag set) within fp32's (or one bf16) rounding of float64."""
    out = _run(dtype)
    assert out.returncode == 0 and "bias_gelu ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("wrong", ["first-program", "no-bias"])
def test_a_wrong_bias_gelu_is_caught(wrong):
    """The check can fail: a bias gradient from one program's rows, or a derivative without the bias."""
    out = _run("float32", wrong)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]
