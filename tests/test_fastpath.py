"""Each TE-free fast-path piece computes what Megatron's fallback computes (CPU, fresh random data)."""
import pytest
import torch

from megalab.runtime import fastpath, levers
from megalab._compat import ensure_typing_override
from tests.conftest import keep_megatrons_wgrad_lookup


def _tensors(seed, shapes=((7, 3), (128,), (5, 5, 5), (1,))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_foreach_l2_norm_equals_the_norm_of_all_elements(seed):
    a, b = _tensors(seed), _tensors(seed + 10)
    ref = torch.cat([t.flatten() for t in a + b]).double().norm()
    got, _ = fastpath.foreach_l2_norm(2048, None, [a, b], False)
    assert got.shape == (1,)
    torch.testing.assert_close(got.double()[0], ref, rtol=1e-6, atol=0)  # fp32 sums of ~300 terms


def test_foreach_l2_norm_of_nothing_is_zero():
    got, _ = fastpath.foreach_l2_norm(2048, None, [[]], False)
    assert float(got) == 0.0


@pytest.mark.parametrize("scale, dtype", [(0.37, torch.float32), (1.0, torch.bfloat16)])
def test_foreach_scale_matches_megatron_local_scale(scale, dtype):
    """Also as Megatron copies fp32 main params into bf16 model params: scale 1.0, another dtype."""
    ensure_typing_override()
    from megatron.core.utils import local_multi_tensor_scale

    src = _tensors(3)
    dst_ref = [torch.full_like(t, float("nan"), dtype=dtype) for t in src]  # poisoned: every element written
    dst = [torch.full_like(t, float("nan"), dtype=dtype) for t in src]
    local_multi_tensor_scale(2048, None, [src, dst_ref], scale)
    fastpath.foreach_scale(2048, None, [src, dst], scale)
    for a, b in zip(dst, dst_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fused_adamw_follows_plain_adamw():
    torch.manual_seed(0)
    p1 = [torch.nn.Parameter(t) for t in _tensors(4)]
    p2 = [torch.nn.Parameter(t.clone()) for t in _tensors(4)]
    kw = dict(lr=6e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = torch.optim.AdamW(p1, foreach=False, **kw)
    fused = fastpath.FusedAdamW(p2, **kw)
    assert fused.defaults["fused"] is True
    for step in range(5):
        grads = _tensors(100 + step)
        for p, q, g in zip(p1, p2, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ref.step()
        fused.step()
    for p, q in zip(p1, p2):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)  # same math, different fp32 op order


def test_parse_reads_lever_names_and_rejects_unknown_ones():
    assert levers.parse("") == levers.parse("none") == ()
    assert levers.parse("all") == levers.NAMES
    assert levers.parse("fused_adam, foreach_norm") == ("fused_adam", "foreach_norm")
    with pytest.raises(ValueError, match="unknown lever.*warp_speed"):
        levers.parse("warp_speed")


def test_apply_replaces_only_megatrons_fallbacks(monkeypatch):
    ensure_typing_override()
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as optmod

    monkeypatch.setattr(torch.optim, "AdamW", torch.optim.AdamW)  # restored after the test
    monkeypatch.setattr(clip, "l2_norm_impl", clip.l2_norm_impl)
    monkeypatch.setattr(clip, "multi_tensor_scale_impl", clip.multi_tensor_scale_impl)
    monkeypatch.setattr(optmod, "multi_tensor_scale_impl", optmod.multi_tensor_scale_impl)
    monkeypatch.setattr(clip, "multi_tensor_scale_tensor_impl", clip.multi_tensor_scale_tensor_impl)
    for mod in (clip, optmod):
        monkeypatch.setattr(mod, "clip_grad_by_total_norm_fp32", mod.clip_grad_by_total_norm_fp32)
    keep_megatrons_wgrad_lookup(monkeypatch)
    _keep_megatrons_loss_and_linear(monkeypatch)
    applied = fastpath.apply(levers.NAMES)
    # neither TE nor apex here: all are fallbacks, applied in the table's order; the attention order is a GPU-only
    # patch, and so are cuBLASLt's epilogues; the spec's lever is read by the spec, never installed
    assert applied == ["fused_adam", "foreach_norm", "foreach_scale", "bf16_ce", "addmm_bias", "clip_in_adam",
                       "flat_adam", "device_norm", "triton_norm", "bias_gelu", "dropout_add",
                       "qkv_pack", "norm_residual", "fused_wgrad", "compiled_rope", "embed_wgrad", "sdpa_gqa"]
    # liger_norm applies only where liger-kernel imports (not in CI)
    assert levers.applied() == {*applied, *levers.SPEC_LEVERS}
    assert torch.optim.AdamW is fastpath.FusedAdamW
    from megalab.runtime import dropout_add
    assert dropout_add.get_bias_dropout_add(True, True) is dropout_add.bias_dropout_add_train
    from megatron.core.transformer import attention, mlp

    from megalab.runtime import qkv_split
    assert attention.SplitAlongDim is qkv_split.split_along_dim and levers.on("qkv_pack")

    from megalab.runtime import bias_gelu
    assert mlp.bias_gelu_impl is bias_gelu.bias_gelu_impl
    assert clip.l2_norm_impl is fastpath.foreach_l2_norm
    from megalab.runtime import clip as folded
    assert optmod.clip_grad_by_total_norm_fp32 is folded.clip_grad_by_total_norm_fp32


def test_clip_in_adam_needs_fused_adam(monkeypatch):
    """Only fused AdamW's kernel scales by grad_scale: without fused_adam the clip stays Megatron's."""
    ensure_typing_override()
    import megatron.core.optimizer.optimizer as optmod

    monkeypatch.setattr(torch.optim, "AdamW", torch.optim.AdamW)
    monkeypatch.setattr(optmod, "clip_grad_by_total_norm_fp32", optmod.clip_grad_by_total_norm_fp32)
    before = optmod.clip_grad_by_total_norm_fp32
    assert fastpath.apply(["clip_in_adam"]) == []
    assert optmod.clip_grad_by_total_norm_fp32 is before


def _keep_megatrons_loss_and_linear(monkeypatch):
    """Undo bf16_ce's, addmm_bias's, compiled_rope's, embed_wgrad's, flat_adam's, sdpa_gqa's,
    triton_norm's (norm_residual's with it), bias_gelu's, dropout_add's and qkv_pack's installs after the
    test."""
    from megatron.core import tensor_parallel
    from megatron.core.optimizer import optimizer as optmod

    f16 = optmod.Float16OptimizerWithFloat16Params
    for name in ("__init__", "_copy_main_params_to_model_params"):
        monkeypatch.setattr(f16, name, getattr(f16, name))
    monkeypatch.setattr(f16, "_megalab_flat_adam", False, raising=False)
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel import layers

    monkeypatch.setattr(rope_utils, "_apply_rotary_pos_emb_bshd", rope_utils._apply_rotary_pos_emb_bshd)
    fn = layers.LinearWithGradAccumulationAndAsyncCommunication
    monkeypatch.setattr(tensor_parallel, "vocab_parallel_cross_entropy", tensor_parallel.vocab_parallel_cross_entropy)
    monkeypatch.setattr(fn, "forward", fn.__dict__["forward"])
    monkeypatch.setattr(layers, "F", layers.F)
    monkeypatch.setattr(levers, "_APPLIED", set(levers.applied()))  # what apply notes is the test's alone
    from megatron.core.transformer import mlp

    monkeypatch.setattr(mlp, "bias_gelu_impl", mlp.bias_gelu_impl)
    from megatron.core.transformer import attention

    monkeypatch.setattr(attention, "SplitAlongDim", attention.SplitAlongDim)


# ---- addmm_bias: the bias inside the GEMM ------------------------------------------------------------

def _linear_run(x, w, b, seq_shape):
    """Megatron's linear autograd function on CPU: output, and the gradients of input, weight and bias."""
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce

    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = linear_with_grad_accumulation_and_async_allreduce(x.view(*seq_shape, -1), w, b, False, False, False)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
    return y.detach(), x.grad, w.grad, b.grad


def test_addmm_bias_computes_megatrons_linear(monkeypatch):
    ensure_typing_override()
    from megatron.core.tensor_parallel import layers

    _keep_megatrons_loss_and_linear(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((12, 16), (10, 16), (10,)))
    before = _linear_run(x, w, b, (4, 3))
    assert fastpath.install_addmm_bias() and fastpath.install_addmm_bias()  # idempotent
    calls = []
    addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: calls.append(1) or addmm(*a, **k))
    after = _linear_run(x, w, b, (4, 3))
    assert len(calls) == 1  # the forward took the GEMM with the bias in it
    assert after[0].shape == (4, 3, 10)
    for name, a, c in zip(("out", "dx", "dw", "db"), before, after):
        torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")
    # a linear without bias takes the plain GEMM (and still works)
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce
    y = linear_with_grad_accumulation_and_async_allreduce(x, w, None, False, False, False)
    torch.testing.assert_close(y, x @ w.t())
    assert len(calls) == 1


def test_addmm_bias_leaves_another_megatron_forward_alone(monkeypatch):
    ensure_typing_override()
    from megatron.core.tensor_parallel import layers

    fn = layers.LinearWithGradAccumulationAndAsyncCommunication
    _keep_megatrons_loss_and_linear(monkeypatch)

    def forward(ctx, input, weight, bias, something_new):  # a later Megatron's signature
        return input

    monkeypatch.setattr(fn, "forward", staticmethod(forward))
    assert not fastpath.install_addmm_bias()
    assert fn.forward is forward


# ---- fused_wgrad: megalab's stand-in for apex's fused_weight_gradient_mlp_cuda ---------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_wgrad_accum_fp32_adds_the_weight_gradient_into_main_grad(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 40, generator=g).bfloat16()   # [tokens, in]
    dy = torch.randn(96, 24, generator=g).bfloat16()  # [tokens, out]
    main = torch.randn(24, 40, generator=g)           # fp32 [out, in], already holding a micro-batch's sum
    want = main.double() + dy.double().t() @ x.double()
    fastpath.wgrad_gemm_accum_fp32(x, dy, main)
    assert main.dtype == torch.float32
    torch.testing.assert_close(main.double(), want, rtol=1e-5, atol=1e-5)


def test_wgrad_accum_fp16_keeps_main_grad_in_the_inputs_type():
    x, dy = torch.ones(8, 4).bfloat16(), torch.ones(8, 3).bfloat16()
    main = torch.zeros(3, 4).bfloat16()
    fastpath.wgrad_gemm_accum_fp16(x, dy, main)
    assert main.dtype == torch.bfloat16 and torch.equal(main, torch.full((3, 4), 8.0).bfloat16())


def test_megatrons_linear_accumulates_through_the_stand_in(monkeypatch):
    """Megatron's own linear autograd with gradient_accumulation_fusion=True, served by the stand-in:
    main_grad gets the same sum as Megatron's unfused path (a bf16 weight.grad added afterwards), closer
    to the exact sum because the gradient is never rounded to bf16 on the way."""
    ensure_typing_override()
    layers = keep_megatrons_wgrad_lookup(monkeypatch)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    assert fastpath.install_wgrad_fusion() is True
    assert layers._grad_accum_fusion_available is True
    import sys

    assert sys.modules["fused_weight_gradient_mlp_cuda"].wgrad_gemm_accum_fp32 is fastpath.wgrad_gemm_accum_fp32

    g = torch.Generator().manual_seed(7)
    x0 = torch.randn(64, 2, 48, generator=g).bfloat16()
    w0 = torch.randn(32, 48, generator=g).bfloat16()
    dy = torch.randn(64, 2, 32, generator=g).bfloat16()
    start = torch.randn(32, 48, generator=g)
    exact = start.double() + dy.reshape(-1, 32).double().t() @ x0.reshape(-1, 48).double()

    def run(fused):
        x = x0.clone().requires_grad_(True)
        w = torch.nn.Parameter(w0.clone())
        w.main_grad = start.clone()
        out = layers.linear_with_grad_accumulation_and_async_allreduce(
            x, w, None, gradient_accumulation_fusion=fused, allreduce_dgrad=False, sequence_parallel=False)
        out.backward(dy)
        if not fused:  # what Megatron's DDP hook does with the bf16 weight.grad
            w.main_grad.add_(w.grad)
        else:
            assert w.grad is None  # nothing left for the hook to add
        return w.main_grad, x.grad

    fused_grad, fused_dx = run(True)
    plain_grad, plain_dx = run(False)
    torch.testing.assert_close(fused_dx, plain_dx, rtol=0, atol=0)  # the input gradient is untouched
    torch.testing.assert_close(fused_grad, plain_grad, rtol=2e-2, atol=2e-2)  # plain rounds each sum to bf16
    assert (fused_grad.double() - exact).abs().max() <= (plain_grad.double() - exact).abs().max()


def test_install_wgrad_fusion_leaves_apexs_extension_alone(monkeypatch):
    import sys
    import types

    layers = keep_megatrons_wgrad_lookup(monkeypatch)
    apex_ext = types.ModuleType("fused_weight_gradient_mlp_cuda")
    monkeypatch.setitem(sys.modules, "fused_weight_gradient_mlp_cuda", apex_ext)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    assert fastpath.install_wgrad_fusion() is False
    assert sys.modules["fused_weight_gradient_mlp_cuda"] is apex_ext


def test_norm_residual_needs_triton_norm(monkeypatch):
    """norm_residual's add is in triton_norm's kernel: without triton_norm nothing is applied (the launcher
    refuses that FAST itself: tests/test_plan.py)."""
    monkeypatch.setattr(levers, "_APPLIED", set())
    assert fastpath.apply(["norm_residual"]) == []
    assert not levers.on("norm_residual")
