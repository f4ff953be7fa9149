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

    from conftest import free_port
    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megalab.runtime import spec, triton_norm as T

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    assert os.environ.get("TRITON_INTERPRET") == "1"
    if wrong == "no-residual":  # a backward that drops the residual's gradient must fail the check below
        T._backward = lambda ctx, dy, dres, f=T._backward: f(ctx, dy, None)
    pairs = []  # each call of the residual form: the layer got (output, residual)
    T.norm_residual = lambda *a, f=T.norm_residual: pairs.append(1) or f(*a)

    cfg = TransformerConfig(num_layers=2, hidden_size=40, num_attention_heads=4, normalization=normalization,
                            use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
                            masked_softmax_fusion=False, gradient_accumulation_fusion=False,
                            persist_layer_norm=False, bias_dropout_fusion=False)
    torch.manual_seed(0)
    model = GPTModel(config=cfg, transformer_layer_spec=spec.megalab_layer_spec(cfg), vocab_size=64,
                     max_sequence_length=16)
    b, s = 2, 16
    ids = torch.randint(0, 64, (b, s))
    pos = torch.arange(s).expand(b, s)
    labels = torch.randint(0, 64, (b, s))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]

    def run(on: bool, residual: bool):
        T.ON, T.RESIDUAL = on, residual
        model.zero_grad(set_to_none=True)
        loss = model(ids, pos, mask, labels=labels).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    torch_loss, torch_grads = run(False, False)
    assert not pairs
    triton_loss, triton_grads = run(True, False)
    assert not pairs
    ours_loss, ours_grads = run(True, True)
    assert len(pairs) == 2 * cfg.num_layers, pairs  # each layer's two norms, not the final one
    for ref_loss, ref_grads in ((torch_loss, torch_grads), (triton_loss, triton_grads)):
        torch.testing.assert_close(ours_loss, ref_loss, atol=1e-5, rtol=1e-4)
        for n, g in ours_grads.items():
            torch.testing.assert_close(g, ref_grads[n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
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
