"""norm_residual (megalab/runtime/triton_norm.py, _NormResidual; megalab/runtime/spec.py, ResidualNorm) inside
Megatron's own GPT: a transformer layer's two norms hand Megatron (output, residual), and the residual's gradient is
added in the norm's backward kernel. Logits, loss and every parameter's gradient must match the same model with
torch's norms, and with triton_norm alone. Run in Triton's interpreter on CPU (a fresh interpreter: Triton reads
TRITON_INTERPRET when it is imported), so the kernels themselves run inside Megatron's layers."""
import pytest

from tests.conftest import interpreted


def _check(normalization: str, wrong: str = ""):
    """In the fresh interpreter: one GPT, three ways (torch's norms; triton_norm; triton_norm + norm_residual)."""
    import os

    from conftest import assert_same_run, tiny_gpt

    from megalab.runtime import triton_norm as T
    from megalab.runtime import levers

    assert os.environ.get("TRITON_INTERPRET") == "1"
    if wrong == "no-residual":  # a backward that drops the residual's gradient must fail the check below
        T._backward = lambda ctx, dy, dres, f=T._backward: f(ctx, dy, None)
    pairs = []  # each call of the residual form: the layer got (output, residual)
    T.norm_residual = lambda *a, f=T.norm_residual: pairs.append(1) or f(*a)

    with tiny_gpt(normalization=normalization, bias_dropout_fusion=False) as (model, run):
        def way(on: bool, residual: bool):
            levers.mark_applied([n for n, v in (("triton_norm", on), ("norm_residual", residual)) if v])
            return run()

        with_torch = way(False, False)
        assert not pairs
        with_triton = way(True, False)
        assert not pairs
        ours = way(True, True)
        assert len(pairs) == 2 * model.config.num_layers, pairs  # each layer's two norms, not the final one
        for ref in (with_torch, with_triton):
            assert_same_run(ours, ref)
    print("norm_residual ok")


def _run(*args):
    return interpreted(f"import test_norm_residual as t; t._check({', '.join(repr(a) for a in args)})")


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_norm_residual_is_megatrons_gpt_within_fp32s_rounding(normalization):
    """Megatron's GPT with megalab's spec: its layers take the residual from the norm, and the loss and every
    gradient are those of the model with torch's norms (and with triton_norm alone)."""
    out = _run(normalization)
    assert out.returncode == 0 and "norm_residual ok" in out.stdout, out.stderr[-3000:]


def test_a_dropped_residual_gradient_is_caught_in_the_model():
    """The check can fail: a norm backward that ignores the residual's gradient is refused."""
    out = _run("LayerNorm", "no-residual")
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-3000:]
