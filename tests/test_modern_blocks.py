"""Chapter 6's decoder blocks on megalab's TE-free spec, exact against plain PyTorch (CPU, float64).

Each new block a Llama-style preset switches on is compared with a reference written from the
paper's formula, not from Megatron's code: RMSNorm, the SwiGLU MLP (three matrices), rotary position
embeddings in attention, grouped-query attention (the reference loops over K/V groups, each group's
query heads attending to that group's one K/V head) and the untied output layer. Then the whole GPT
model is built with every one of them on and trained one step, as `--spec megalab.runtime.spec
megalab_layer_spec` does on a GPU.
"""
import pytest

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megalab.runtime.spec import Norm, megalab_layer_spec, megalab_transformer_layer_spec  # noqa: E402
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.transformer.spec_utils import build_module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

TOL = dict(atol=1e-12, rtol=1e-10)  # float64 on both sides: only summation order differs
H, HEADS, SEQ, B = 32, 4, 8, 2


@pytest.fixture
def cpu_rope(world1, monkeypatch):
    """Megatron's RotaryEmbedding moves its frequencies to torch.cuda.current_device() on first use
    (a GPU run's behaviour); here that device is the CPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


def _layer(cfg: TransformerConfig):
    """One TransformerLayer of megalab's spec (its attention and MLP are what the tests compare)."""
    return build_module(megalab_transformer_layer_spec(), config=cfg, layer_number=1)


def _config(**kw) -> TransformerConfig:
    base = dict(num_layers=2, hidden_size=H, num_attention_heads=HEADS, use_cpu_initialization=True,
                hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
                gradient_accumulation_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
                bias_activation_fusion=False, apply_rope_fusion=False, add_bias_linear=False,
                params_dtype=torch.float64, init_method_std=0.2)
    base.update(kw)
    return TransformerConfig(**base)


def test_rmsnorm_is_x_over_rms_times_weight(world1):
    cfg = _config(normalization="RMSNorm", layernorm_epsilon=1e-6)
    norm = Norm(cfg, H, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H, dtype=torch.float64))
    x = torch.randn(SEQ, B, H, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert not hasattr(norm, "bias") or norm.bias is None  # RMSNorm has no bias
    torch.testing.assert_close(norm(x), ref, **TOL)


def test_swiglu_mlp_is_three_matrices(world1):
    ffn = 24
    cfg = _config(ffn_hidden_size=ffn, gated_linear_unit=True, activation_func=F.silu)
    mlp = _layer(cfg).mlp
    w1 = mlp.linear_fc1.weight  # [2f, h]: the gate's rows, then the up projection's
    w2 = mlp.linear_fc2.weight  # [h, f]
    assert tuple(w1.shape) == (2 * ffn, H) and tuple(w2.shape) == (H, ffn)
    gate, up = w1[:ffn], w1[ffn:]
    x = torch.randn(SEQ, B, H, dtype=torch.float64)
    out, bias = mlp(x)
    assert bias is None
    torch.testing.assert_close(out, (F.silu(x @ gate.T) * (x @ up.T)) @ w2.T, **TOL)


def _rope_reference(t: torch.Tensor, base: float) -> torch.Tensor:
    """t: [s, b, n, d]; rotate each (i, i + d/2) pair of channels by position x base^(-2i/d).
    Megatron keeps its angle table (and their cos/sin) in float32 whatever the model's dtype, as on a
    GPU: the reference does too, so the comparison is exact; the rotation itself is float64."""
    s, d = t.size(0), t.size(-1)
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None]  # [s, d/2]
    cos, sin = (f(ang).double()[:, None, None] for f in (torch.cos, torch.sin))
    x1, x2 = t[..., : d // 2], t[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _attention_reference(attn, x, groups: int, rope_base: float | None):
    """Self-attention from the layer's own weights, one K/V group at a time."""
    hn = H // HEADS
    rep = HEADS // groups
    mixed = x @ attn.linear_qkv.weight.T  # Megatron's layout: per group, its rep query heads, then k, then v
    mixed = mixed.view(SEQ, B, groups, (rep + 2) * hn)
    q = mixed[..., : rep * hn].reshape(SEQ, B, HEADS, hn)
    k = mixed[..., rep * hn: (rep + 1) * hn]
    v = mixed[..., (rep + 1) * hn:]
    if rope_base is not None:
        q, k = _rope_reference(q, rope_base), _rope_reference(k, rope_base)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    heads = []
    for g in range(groups):  # each group's query heads see only that group's key and value
        for h in range(g * rep, (g + 1) * rep):
            scores = torch.einsum("sbd,tbd->bst", q[:, :, h], k[:, :, g]) / hn ** 0.5
            probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            heads.append(torch.einsum("bst,tbd->sbd", probs, v[:, :, g]))
    return torch.cat(heads, dim=-1) @ attn.linear_proj.weight.T


@pytest.mark.parametrize("groups, rope", [(HEADS, True), (2, False), (2, True), (1, True)],
                         ids=["rope", "gqa", "gqa+rope", "mqa+rope"])
def test_attention_with_rope_and_grouped_query_heads(cpu_rope, groups, rope):
    base = 500000.0
    cfg = _config(num_query_groups=groups)
    attn = _layer(cfg).self_attention
    assert tuple(attn.linear_qkv.weight.shape) == (H + 2 * groups * (H // HEADS), H)  # smaller K/V projections
    x = torch.randn(SEQ, B, H, dtype=torch.float64)
    emb = None
    if rope:
        emb = RotaryEmbedding(kv_channels=H // HEADS, rotary_percent=1.0, rotary_base=base,
                              use_cpu_initialization=True)(SEQ)
    out, _ = attn(x, attention_mask=None, rotary_pos_emb=emb)
    torch.testing.assert_close(out, _attention_reference(attn, x, groups, base if rope else None), **TOL)


@pytest.mark.parametrize("groups", [2, 1], ids=["gqa", "mqa"])
def test_sdpa_gqa_lever_reads_shared_heads_without_repeating_them(cpu_rope, groups, monkeypatch):
    """sdpa_gqa: SDPA's enable_gqa instead of repeated K/V; same output and gradients,
    and K/V are really not repeated."""
    from megalab.runtime import levers

    cfg = _config(num_query_groups=groups)
    attn = _layer(cfg).self_attention
    emb = RotaryEmbedding(kv_channels=H // HEADS, rotary_percent=1.0, rotary_base=500000.0,
                          use_cpu_initialization=True)(SEQ)
    x0 = torch.randn(SEQ, B, H, dtype=torch.float64)
    calls = []
    real = torch.Tensor.repeat_interleave
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda t, *a, **k: calls.append(1) or real(t, *a, **k))

    def run(native):
        monkeypatch.setattr(levers, "_APPLIED", {"sdpa_gqa"} if native else set())
        calls.clear()
        x = x0.clone().requires_grad_()
        out, _ = attn(x, attention_mask=None, rotary_pos_emb=emb)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        return out.detach(), x.grad, attn.linear_qkv.weight.grad.clone(), len(calls)

    attn.zero_grad()
    want_out, want_dx, want_dw, repeats = run(False)
    attn.zero_grad()
    out, dx, dw, native_repeats = run(True)
    assert repeats == 2 and native_repeats == 0
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(dx, want_dx, **TOL)
    torch.testing.assert_close(dw, want_dw, **TOL)
    torch.testing.assert_close(out, _attention_reference(attn, x0, groups, 500000.0), **TOL)


def _llama_like(untie: bool) -> GPTModel:
    cfg = _config(num_query_groups=2, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                  ffn_hidden_size=48)
    return GPTModel(config=cfg, transformer_layer_spec=megalab_layer_spec(cfg), vocab_size=64,
                    max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=500000,
                    share_embeddings_and_output_weights=not untie)


@pytest.mark.parametrize("untie", [True, False], ids=["untied", "tied"])
def test_output_layer_untied_has_its_own_weight(cpu_rope, untie):
    torch.manual_seed(0)
    model = _llama_like(untie)
    emb = model.embedding.word_embeddings.weight
    assert (model.output_layer.weight is not None) == untie
    out_w = model.output_layer.weight if untie else emb
    if untie:
        assert out_w.data_ptr() != emb.data_ptr()
    hidden = {}
    model.decoder.register_forward_hook(lambda m, i, o: hidden.setdefault("h", o))
    tokens = torch.randint(0, 64, (B, SEQ))
    pos = torch.arange(SEQ)[None].expand(B, SEQ)
    logits = model(tokens, pos, attention_mask=None)
    torch.testing.assert_close(logits, (hidden["h"] @ out_w.T).transpose(0, 1), **TOL)


def test_a_llama_like_gpt_builds_and_trains_on_megalabs_spec(cpu_rope):
    torch.manual_seed(0)
    model = _llama_like(untie=True)
    names = dict(model.named_parameters())
    assert not any(n.endswith(".bias") for n in names)  # no biases anywhere (RMSNorm, disable_bias_linear)
    assert "embedding.position_embeddings.weight" not in names  # rotary: no learned positions
    tokens = torch.randint(0, 64, (B, SEQ))
    pos = torch.arange(SEQ)[None].expand(B, SEQ)
    loss = model(tokens, pos, attention_mask=None, labels=tokens).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_estimator_counts_the_same_parameters_as_megatron_builds(world1):
    """params of the tiny Llama-like model: estimate.total_params (SwiGLU's 3 matrices, GQA's smaller
    K/V, RMSNorm's one vector, the untied output layer) equals what Megatron built."""
    from megalab.core import estimate

    model = _llama_like(untie=True)
    built = sum(p.numel() for p in model.parameters())
    cfg = {"num_layers": 2, "hidden_size": H, "num_attention_heads": HEADS, "num_query_groups": 2,
           "ffn_hidden_size": 48, "seq_length": SEQ, "vocab_size": 64, "normalization": "RMSNorm", "swiglu": True,
           "position_embedding": "rope", "untie_embeddings": True, "disable_bias_linear": True}
    sh = estimate.Shape.of(cfg)
    vpad = estimate.padded_vocab(64, 1)  # Megatron pads to 128: the tiny model here does not
    assert estimate.total_params(sh) - 2 * (vpad - 64) * H == built


# ---- the launcher side: presets become Megatron's flags, and Megatron's build accepts them --------------

def test_chapter6_presets_reach_megatrons_model_config():
    from megalab.core import catalog, plan
    from megalab.harness import validate
    from megalab.core.variables import Options
    from megatron.training.argument_utils import core_transformer_config_from_args

    p = plan.build(catalog.get("600"), Options(iters=5))
    args = validate.validate(p.entry_args, 1)
    cfg = core_transformer_config_from_args(args)
    assert (cfg.normalization, cfg.gated_linear_unit, cfg.activation_func, cfg.num_query_groups, cfg.add_bias_linear,
            cfg.apply_rope_fusion) == ("RMSNorm", True, F.silu, 8, False, False)
    assert (args.position_embedding_type, args.rotary_base, args.untie_embeddings_and_output_weights) == \
        ("rope", 500000, True)


@pytest.mark.skipif(__import__("megalab.core.plan", fromlist=["x"]).te_available() is not None,
                    reason="with Transformer Engine the fused RoPE is available")
def test_the_preflight_check_builds_the_config_so_fused_rope_fails_before_launch():
    """Without TE Megatron's argument check accepts fused RoPE; only building the config refuses it
    ("apply_rope_fusion is not available"): the preflight does both, so it fails there, not at start-up."""
    from megalab.core import catalog, plan
    from megalab.harness import validate
    from megalab.core.variables import Options

    argv = [a for a in plan.build(catalog.get("600"), Options(iters=5)).entry_args if a != "--no-rope-fusion"]
    with pytest.raises(validate.MegatronRejected, match="apply_rope_fusion is not available"):
        validate.validate(argv, 1)


@pytest.mark.parametrize("target", ["600", "611"])
def test_estimated_flops_are_megatrons_for_swiglu_gqa_and_untied(target):
    """plan's FLOPs per step (SwiGLU's 3 matrices, GQA's smaller K/V, the untied logits) equal Megatron's
    own num_floating_point_operations for the chapter-6 presets."""
    from megalab.core import catalog, plan
    from megalab.harness import validate
    from megalab.core.variables import Options
    from megalab.core import estimate
    from megatron.training.training import num_floating_point_operations

    exp = catalog.get(target)
    args = validate.validate(plan.build(exp, Options(iters=5)).entry_args, exp.gpus)
    assert estimate.estimate(exp).flops_per_step == pytest.approx(num_floating_point_operations(args, exp.gbs),
                                                                  rel=1e-9)
