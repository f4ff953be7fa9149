"""Tests for megalab/runtime/spec.py (CPU only: gloo, no CUDA, no TE, no apex).

Megatron's own local attention (DotProductAttention) can run on CPU with two test-only shims,
because three of its helpers hard-code CUDA: the score buffer (`get_global_memory_buffer`), the
dropout RNG tracker fork (always entered, even for p=0) and the default causal mask (built with
device="cuda" when no mask is passed; we pass an explicit causal mask to Megatron's side instead).
"""

import math

import pytest
from conftest import RANKS, CpuBuffer, NullRngTracker, free_port as _free_port, start_ranks

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megalab.runtime.spec import Norm, SDPAttention, megalab_layer_spec  # noqa: E402
from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

# Tolerances. SDPAttention runs in float32; references run in float64 on the same values. float32
# has eps ~1.2e-7; attention over <= 16 keys with O(1) inputs accumulates a few ulps per dot
# product and softmax, so 1e-5 absolute / 1e-4 relative is ~100x the observed error yet far below
# any real bug (a wrong scale, mask or head mapping shows up at 1e-2 or more).
ATOL32, RTOL32 = 1e-5, 1e-4



def _config(**overrides) -> TransformerConfig:
    kw = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,  # Megatron's CPU init path: no CUDA RNG tracker needed
        hidden_dropout=0.0,
        attention_dropout=0.0,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


def _causal_mask(s: int) -> torch.Tensor:
    """Megatron's convention: True = masked out. [1, 1, s, s]."""
    return torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]


def _reference_attention(q, k, v, scale, mask=None):
    """softmax(Q K^T * scale, masked) V in float64. q: [sq, b, np, hn]; k, v: [sk, b, ng, hn];
    mask: Megatron convention (True = masked), broadcastable to [b, np, sq, sk]."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.size(2) // k.size(2)
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("qbnh,kbnh->bnqk", q, k) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    probs = scores.softmax(-1)
    out = torch.einsum("bnqk,kbnh->qbnh", probs, v)
    return out.reshape(out.size(0), out.size(1), -1)


def _qkv(sq, b, heads, groups, hn, sk=None, dtype=torch.float32):
    sk = sq if sk is None else sk
    q = torch.randn(sq, b, heads, hn, dtype=dtype, requires_grad=True)
    k = torch.randn(sk, b, groups, hn, dtype=dtype, requires_grad=True)
    v = torch.randn(sk, b, groups, hn, dtype=dtype, requires_grad=True)
    return q, k, v


def _grads(out, upstream, tensors):
    return torch.autograd.grad(out, tensors, upstream)


# ---------------------------------------------------------------------------- SDPAttention


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_sdpa_causal_matches_reference_forward_backward(world1, heads, groups):
    torch.manual_seed(0)
    cfg = _config(num_attention_heads=heads, num_query_groups=groups)
    attn = SDPAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal,
                        attention_type="self")
    sq, b, hn = 12, 2, cfg.kv_channels
    q, k, v = _qkv(sq, b, heads, groups, hn)
    out = attn(q, k, v, attention_mask=None)
    assert out.shape == (sq, b, heads * hn)
    ref = _reference_attention(q, k, v, 1 / math.sqrt(hn), _causal_mask(sq))
    torch.testing.assert_close(out.double(), ref, atol=ATOL32, rtol=RTOL32)

    g = torch.randn_like(out)
    got = _grads(out, g, (q, k, v))
    want = _grads(ref, g.double(), (q, k, v))
    for a, w in zip(got, want):
        torch.testing.assert_close(a.double(), w.double(), atol=ATOL32, rtol=RTOL32)


def test_sdpa_padding_mask(world1):
    torch.manual_seed(1)
    cfg = _config(num_query_groups=2)
    attn = SDPAttention(cfg, 1, AttnMaskType.padding, "self")
    sq, b, hn = 10, 3, cfg.kv_channels
    q, k, v = _qkv(sq, b, 4, 2, hn)
    # Key padding: sequence i has its last 3*i keys padded (True = masked, Megatron convention).
    mask = torch.zeros(b, 1, sq, sq, dtype=torch.bool)
    for i in range(b):
        if i:
            mask[i, :, :, sq - 3 * i:] = True
    out = attn(q, k, v, attention_mask=mask)
    ref = _reference_attention(q, k, v, 1 / math.sqrt(hn), mask)
    torch.testing.assert_close(out.double(), ref, atol=ATOL32, rtol=RTOL32)
    g = torch.randn_like(out)
    for a, w in zip(_grads(out, g, (q, k, v)), _grads(ref, g.double(), (q, k, v))):
        torch.testing.assert_close(a.double(), w.double(), atol=ATOL32, rtol=RTOL32)

    # A fully masked query row (a padding query) must stay finite, and leave other rows alone.
    mask[0, :, 2, :] = True
    out2 = attn(q, k, v, attention_mask=mask)
    assert torch.isfinite(out2).all()
    keep = torch.ones(sq, dtype=torch.bool)
    keep[2] = False
    torch.testing.assert_close(out2[keep, 0], out[keep, 0], atol=ATOL32, rtol=RTOL32)


def test_sdpa_causal_with_kv_cache_is_bottom_right_aligned(world1):
    """sq < sk (prefill after cached keys): query i sits at position sk - sq + i."""
    torch.manual_seed(2)
    cfg = _config()
    attn = SDPAttention(cfg, 1, AttnMaskType.causal, "self")
    sq, sk, hn = 4, 9, cfg.kv_channels
    q, k, v = _qkv(sq, 2, 4, 4, hn, sk=sk)
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq).logical_not()[None, None]
    ref = _reference_attention(q, k, v, 1 / math.sqrt(hn), mask)
    torch.testing.assert_close(attn(q, k, v, None).double(), ref, atol=ATOL32, rtol=RTOL32)


def test_sdpa_dropout_only_in_training(megatron_on_cpu):
    torch.manual_seed(3)
    q, k, v = _qkv(8, 2, 4, 4, 8)
    plain = SDPAttention(_config(), 1, AttnMaskType.causal, "self")
    drop = SDPAttention(_config(attention_dropout=0.5), 1, AttnMaskType.causal, "self")
    drop.eval()
    # In eval both call SDPA with dropout_p=0: bit-identical.
    torch.testing.assert_close(drop(q, k, v, None), plain(q, k, v, None), atol=0, rtol=0)
    drop.train()
    assert not torch.allclose(drop(q, k, v, None), plain(q, k, v, None))


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(num_query_groups=2), dict(apply_query_key_layer_scaling=True),
     dict(softmax_scale=0.05), dict(kv_channels=16)],
    ids=["default", "gqa", "qk_layer_scaling", "softmax_scale", "kv_channels"],
)
def test_sdpa_matches_megatron_dot_product_attention(megatron_on_cpu, overrides):
    """Same constructor arguments, same numbers as Megatron's local core attention, incl. the
    apply_query_key_layer_scaling trick (scale / layer_number, then scores * layer_number)."""
    torch.manual_seed(4)
    cfg = _config(**overrides)
    kwargs = dict(config=cfg, layer_number=3, attn_mask_type=AttnMaskType.causal,
                  attention_type="self", softmax_scale=cfg.softmax_scale)
    ours, theirs = SDPAttention(**kwargs), DotProductAttention(**kwargs)
    q, k, v = _qkv(8, 2, cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels)
    out = ours(q, k, v, None)
    ref = theirs(q, k, v, _causal_mask(8))  # CPU: Megatron's default causal mask needs CUDA
    torch.testing.assert_close(out, ref, atol=ATOL32, rtol=RTOL32)
    g = torch.randn_like(out)
    for a, w in zip(_grads(out, g, (q, k, v)), _grads(ref, g, (q, k, v))):
        torch.testing.assert_close(a, w, atol=ATOL32, rtol=RTOL32)


def test_sdpa_rejects_what_its_context_parallelism_lacks_and_packed_sequences(world1):
    with pytest.raises(NotImplementedError, match="--attention-dropout 0"):
        SDPAttention(_config(context_parallel_size=2, attention_dropout=0.1), 1,
                     AttnMaskType.causal, "self", cp_comm_type="p2p")
    with pytest.raises(NotImplementedError, match="a2a\\+p2p"):
        SDPAttention(_config(context_parallel_size=2), 1, AttnMaskType.causal, "self",
                     cp_comm_type="a2a+p2p")
    # all_gather and a2a keep attention dropout (plain SDPA underneath)
    SDPAttention(_config(context_parallel_size=2, attention_dropout=0.1), 1,
                 AttnMaskType.causal, "self", cp_comm_type="a2a")
    attn = SDPAttention(_config(), 1, AttnMaskType.causal, "self")
    q, k, v = _qkv(4, 1, 4, 4, 8)
    with pytest.raises(NotImplementedError, match="packed"):
        attn(q, k, v, None, packed_seq_params=PackedSeqParams(qkv_format="thd"))


# ---------------------------------------------------------------------------- Norm


def _reference_rms_norm(x, weight, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered_gamma"])
def test_norm_matches_reference(normalization, zero_centered):
    torch.manual_seed(5)
    h, eps = 16, 1e-5
    cfg = _config(normalization=normalization, layernorm_zero_centered_gamma=zero_centered,
                  layernorm_epsilon=eps)
    norm = Norm(config=cfg, hidden_size=h, eps=cfg.layernorm_epsilon)
    assert norm.eps == eps
    with torch.no_grad():  # random affine params, so a wrong weight/bias use cannot hide
        norm.weight.copy_(torch.randn(h))
        if norm.bias is not None:
            norm.bias.copy_(torch.randn(h))
    gamma = norm.weight.detach() + (1 if zero_centered else 0)

    x = torch.randn(6, 2, h, requires_grad=True)
    out = norm(x)
    g = torch.randn_like(out)
    if normalization == "LayerNorm":
        ref_mod = torch.nn.LayerNorm(h, eps=eps).double()
        with torch.no_grad():
            ref_mod.weight.copy_(gamma)
            ref_mod.bias.copy_(norm.bias)
        ref = ref_mod(x.double())
        ref_params = (ref_mod.weight, ref_mod.bias)
        params = (norm.weight, norm.bias)
    else:
        assert norm.bias is None
        ref_w = gamma.double().requires_grad_()
        ref = _reference_rms_norm(x, ref_w, eps)
        ref_params, params = (ref_w,), (norm.weight,)
    torch.testing.assert_close(out.double(), ref, atol=ATOL32, rtol=RTOL32)
    got = _grads(out, g, (x, *params))
    want = _grads(ref, g.double(), (x, *ref_params))
    for a, w in zip(got, want):  # d/dweight is the same for gamma and gamma - 1
        torch.testing.assert_close(a.double(), w.double(), atol=ATOL32, rtol=RTOL32)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("sp", [True, False])
def test_norm_marks_params_sequence_parallel(normalization, sp):
    cfg = _config(normalization=normalization, sequence_parallel=sp, tensor_model_parallel_size=2)
    norm = Norm(config=cfg, hidden_size=8, eps=1e-5)
    params = list(norm.parameters())
    assert len(params) == (2 if normalization == "LayerNorm" else 1)
    for p in params:
        assert getattr(p, "sequence_parallel") is sp


def _sp_worker(rank: int, port: int, world_size: int):
    """One TP rank of a tp=2 sequence-parallel group: each rank normalises its half of the
    sequence, then Megatron's finalize_model_grads must sum the norm grads over the TP group."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    try:
        h, s, b = 8, 6, 2
        cfg = _config(tensor_model_parallel_size=world_size, sequence_parallel=True)

        class Chunk(torch.nn.Module):
            """Stands in for Megatron's DDP-wrapped model chunk: DDP accumulates grads into
            param.main_grad, owns ddp_config, and finish_grad_sync() does the DP reduction
            (a no-op here: DP = 1)."""

            def __init__(self):
                super().__init__()
                self.config = cfg
                self.ddp_config = DistributedDataParallelConfig()
                self.ln = Norm(config=cfg, hidden_size=h, eps=1e-5)
                self.rms = Norm(config=cfg, hidden_size=h, eps=1e-5, normalization="RMSNorm")
                self.control = torch.nn.Parameter(torch.zeros(h))  # no SP mark: not reduced

            def finish_grad_sync(self, force_all_reduce=False):
                pass

            def forward(self, x):
                return self.rms(self.ln(x)) + self.control

        torch.manual_seed(0)  # same full-sequence data and params on both ranks
        x_full = torch.randn(s, b, h)
        g_full = torch.randn(s, b, h)
        chunk = Chunk()
        with torch.no_grad():
            for p in (chunk.ln.weight, chunk.ln.bias, chunk.rms.weight):
                p.copy_(torch.randn(h))

        # Reference: the whole sequence on one rank.
        full = {n: gr for n, gr in zip(
            [n for n, _ in chunk.named_parameters()],
            torch.autograd.grad(chunk(x_full), list(chunk.parameters()), g_full))}

        # Sequence parallel: this rank's shard [s/tp, b, h] only.
        shard = slice(rank * s // world_size, (rank + 1) * s // world_size)
        chunk(x_full[shard]).backward(g_full[shard])
        local = {}
        for n, p in chunk.named_parameters():
            p.main_grad = p.grad.detach().clone()  # as Megatron's DDP does
            local[n] = p.main_grad.clone()
            p.grad = None

        finalize_model_grads([chunk])

        for n, p in chunk.named_parameters():
            if n == "control":
                # Not marked: left rank-local (each rank's partial sum).
                torch.testing.assert_close(p.main_grad, local[n], atol=0, rtol=0)
            else:
                assert not torch.allclose(local[n], full[n])  # a shard alone is a partial sum
                # Summed over both ranks == the full-sequence gradient. float32, 6 x 2 tokens:
                # only the summation order differs, so 1e-5 is ample.
                torch.testing.assert_close(p.main_grad, full[n], atol=1e-5, rtol=1e-5)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@RANKS
def test_sp_norm_grads_all_reduced_by_megatron_finalize_model_grads():
    start_ranks(_sp_worker, 2, _free_port(), 2)


# ---------------------------------------------------------------------------- the spec in a GPT


def _norms(model):
    """Every norm module (input/pre-MLP/q/k/final), skipping the IdentityOp placeholders."""
    return {n: m for n, m in model.named_modules()
            if "layernorm" in n.split(".")[-1] and not isinstance(m, IdentityOp)}


def _gpt(cfg, spec, seed=0):
    torch.manual_seed(seed)
    return GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=64,
                    max_sequence_length=16)


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(num_query_groups=2, normalization="RMSNorm", qk_layernorm=True)],
    ids=["layernorm_mha", "rmsnorm_gqa_qk_layernorm"],
)
def test_gpt_matches_megatron_local_spec(megatron_on_cpu, overrides):
    cfg = _config(**overrides)
    ours = _gpt(cfg, megalab_layer_spec(cfg))
    local = _gpt(cfg, get_gpt_layer_local_spec(
        qk_layernorm=cfg.qk_layernorm, normalization=cfg.normalization))

    # Same parameters, names and shapes (so checkpoints interchange); only the modules differ.
    shapes = lambda m: {n: p.shape for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(ours) == shapes(local)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in local.parameters())
    assert all(isinstance(m, Norm) for m in _norms(ours).values())
    assert "final_layernorm" in " ".join(_norms(ours))
    assert all(type(layer.self_attention.core_attention) is SDPAttention
               for layer in ours.decoder.layers)
    ours.load_state_dict(local.state_dict())

    torch.manual_seed(6)
    b, s = 2, 16
    ids = torch.randint(0, 64, (b, s))
    pos = torch.arange(s).expand(b, s)
    labels = torch.randint(0, 64, (b, s))
    # Megatron's side needs the explicit causal mask on CPU; ours ignores it for the causal
    # mask type (is_causal=True), so both see the same masking.
    mask = _causal_mask(s)
    logits = [m(ids, pos, mask) for m in (ours, local)]
    # float32 through two layers: different kernels sum in different orders (see ATOL32).
    torch.testing.assert_close(logits[0], logits[1], atol=ATOL32, rtol=RTOL32)

    losses = [m(ids, pos, mask, labels=labels).mean() for m in (ours, local)]
    torch.testing.assert_close(losses[0], losses[1], atol=ATOL32, rtol=RTOL32)
    for loss in losses:
        loss.backward()
    local_grads = dict(local.named_parameters())
    for n, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, local_grads[n].grad, atol=ATOL32, rtol=RTOL32,
                                   msg=lambda m, n=n: f"{n}: {m}")


def test_gpt_with_sequence_parallel_config_builds_and_marks_every_norm(megatron_on_cpu):
    """Megatron's local spec refuses sequence_parallel (WrappedTorchNorm asserts); ours builds,
    marks every norm parameter, the final norm included, and computes the same loss (at TP = 1
    the SP scatter/gather are identities)."""
    cfg_sp = _config()
    # TransformerConfig refuses sequence_parallel with TP = 1 at construction; set it afterwards
    # so the model builds on one CPU process (its SP communication then reduces to identities).
    cfg_sp.sequence_parallel = True
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        _gpt(cfg_sp, get_gpt_layer_local_spec())

    ours_sp = _gpt(cfg_sp, megalab_layer_spec(cfg_sp))
    norms = _norms(ours_sp)
    assert "decoder.final_layernorm" in norms
    for n, norm in norms.items():
        assert isinstance(norm, Norm), n
        assert all(p.sequence_parallel for p in norm.parameters()), n

    cfg = _config()
    ours = _gpt(cfg, megalab_layer_spec(cfg))
    ours.load_state_dict(ours_sp.state_dict())
    ids = torch.randint(0, 64, (2, 16))
    pos = torch.arange(16).expand(2, 16)
    labels = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(ours_sp(ids, pos, None, labels=labels),
                               ours(ids, pos, None, labels=labels), atol=ATOL32, rtol=RTOL32)


def test_moe_spec_matches_megatron_local_moe_block(world1):
    """MoE: Megatron's local MoE layer (router + SequentialMLP experts) with our attention and
    norms; moe_layer_freq decides which layers are MoE. MoE forward needs CUDA in Megatron (the
    router moves its weight to the current CUDA device), so this checks construction only."""
    cfg = _config(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16,
                  moe_grouped_gemm=True, moe_token_dispatcher_type="allgather",
                  moe_layer_freq=[1, 0], normalization="RMSNorm", qk_layernorm=True,
                  add_bias_linear=False)
    ours = _gpt(cfg, megalab_layer_spec(cfg))
    local = _gpt(cfg, get_gpt_decoder_block_spec(cfg, use_transformer_engine=False,
                                                 normalization="RMSNorm"))
    shapes = lambda m: {n: p.shape for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(ours) == shapes(local)
    assert [isinstance(layer.mlp, MoELayer) for layer in ours.decoder.layers] == [True, False]
    assert all(isinstance(m, Norm) for m in _norms(ours).values())
    assert all(type(layer.self_attention.core_attention) is SDPAttention
               for layer in ours.decoder.layers)


def test_spec_accepts_gpt_model_config_and_vp_stage(world1):
    """Megatron's GPTModelBuilder calls megalab_layer_spec(GPTModelConfig, vp_stage=...)."""
    from megatron.training.models.gpt import GPTModelConfig

    cfg = _config(num_layers=3)
    spec = megalab_layer_spec(GPTModelConfig(transformer=cfg, vocab_size=64), vp_stage=None)
    assert len(spec.submodules.layer_specs) == 3
    assert spec.submodules.layer_norm is Norm


# ---------------------------------------------------------------------------- context parallel GPT


def _cp_gpt_worker(rank: int, port: int, cp: int, modes):
    """A 2-layer GQA GPT with CP=cp against the same weights without CP, on the full sequence.

    Tokens and positions are cut as megatron.core.utils.get_batch_on_this_cp_rank cuts them; the
    per-token losses must equal the full model's at this rank's positions, and the parameter
    gradients summed over the CP group (what Megatron's DP x CP gradient all-reduce does) must
    equal the full model's.
    """
    from megatron.core.utils import get_batch_on_this_cp_rank

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cp)
    parallel_state.initialize_model_parallel(1, 1, context_parallel_size=cp)
    try:
        b, s = 2, 16
        torch.manual_seed(6)
        full = {"tokens": torch.randint(0, 64, (b, s)), "labels": torch.randint(0, 64, (b, s)),
                "position_ids": torch.arange(s).expand(b, s)}
        kw = dict(num_query_groups=2, params_dtype=torch.float64)
        ref = _gpt(_config(**kw), megalab_layer_spec(_config(**kw)))
        ref_loss = ref(full["tokens"], full["position_ids"], None, labels=full["labels"])
        ref_loss.sum().backward()
        local = get_batch_on_this_cp_rank(dict(full, cu_seqlens=None), is_hybrid_cp=False,
                                          cp_group=parallel_state.get_context_parallel_group())
        want = local["labels"]  # ref_loss at this rank's positions: cut the same way
        want_loss = get_batch_on_this_cp_rank({"labels": ref_loss.detach(), "cu_seqlens": None},
                                              is_hybrid_cp=False,
                                              cp_group=parallel_state.get_context_parallel_group())["labels"]
        assert want.shape == (b, s // cp)
        for mode in modes:
            cfg = _config(context_parallel_size=cp, cp_comm_type=mode, **kw)
            model = _gpt(cfg, megalab_layer_spec(cfg))  # same seed: same weights as ref
            loss = model(local["tokens"], local["position_ids"], None, labels=local["labels"])
            torch.testing.assert_close(loss, want_loss, rtol=1e-9, atol=1e-9,
                                       msg=lambda m, mode=mode: f"{mode} rank {rank} loss: {m}")
            loss.sum().backward()
            ref_grads = dict(ref.named_parameters())
            for n, p in model.named_parameters():
                dist.all_reduce(p.grad)
                torch.testing.assert_close(p.grad, ref_grads[n].grad, rtol=1e-8, atol=1e-10,
                                           msg=lambda m, n=n, mode=mode: f"{mode} {n}: {m}")
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@RANKS
def test_gpt_with_context_parallel_matches_the_full_sequence():
    # not forked from this process, which may hold world1's process group (a child cannot drop it): conftest
    start_ranks(_cp_gpt_worker, 2, _free_port(), 2, ("p2p", "all_gather", "a2a"))


# ---------------------------------------------------------------------------- tensor + sequence parallel GPT


def _tp_sp_gpt_worker(rank: int, port: int, tp: int, ref_path: str, levers: str = ""):
    """The megalab spec at TP=tp with sequence parallel against the same weights at TP=1.

    `levers`: fast-path levers installed in this rank first (megalab/runtime/fastpath.py), e.g. the
    default's bf16_ce (the vocab-parallel loss) and addmm_bias (the bias inside the GEMM, after SP's
    all-gather): the TP=1 reference is Megatron's own path, so they must compute the same function.

    Each rank takes its slice of the TP=1 weights (Megatron's layouts split column-parallel weights,
    QKV grouped per head group, and the vocabulary along dim 0, row-parallel weights along dim 1), runs
    its sequence shard through the SP regions, and must reproduce the full model's per-token losses;
    after the all-reduce Megatron's finalize_model_grads does for `sequence_parallel` parameters, each
    rank's gradient must be its slice of the full model's.
    """
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    from megatron.core.tensor_parallel import layers as tp_layers, mappings as tp_mappings

    for mod in (parallel_state, tp_layers, tp_mappings):  # Megatron's SP gather buffer is CUDA memory
        mod.get_global_memory_buffer = lambda: CpuBuffer()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: NullRngTracker()
    torch.cuda.current_device = lambda: "cpu"  # SP's reduce-scatter allocates on the "current device"
    if levers:
        from megalab.runtime import fastpath

        assert fastpath.apply(levers.split(",")) == levers.split(",")
    try:
        ref = torch.load(ref_path)
        kw = dict(num_query_groups=2, params_dtype=torch.float64)
        cfg = _config(tensor_model_parallel_size=tp, sequence_parallel=True, **kw)
        model = _gpt(cfg, megalab_layer_spec(cfg))

        def my_slice(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            dims = [d for d in range(full.dim()) if full.shape[d] != like.shape[d]]
            if not dims:
                return full
            (d,) = dims
            return full.chunk(tp, dim=d)[rank]

        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(my_slice(ref["params"][n], p))
        loss = model(ref["tokens"], ref["position_ids"], None, labels=ref["labels"])
        # Megatron's vocab-parallel cross-entropy runs in fp32 whatever the model's dtype, and its sum
        # over the vocabulary is split over the ranks: fp32 rounding (1e-7), far below any real error.
        torch.testing.assert_close(loss.to(ref["loss"].dtype), ref["loss"], rtol=1e-6, atol=1e-6)  # bf16_ce: fp64
        loss.sum().backward()
        for n, p in model.named_parameters():
            if getattr(p, "sequence_parallel", False):
                dist.all_reduce(p.grad)  # what finalize_model_grads does for SP parameters
            want = my_slice(ref["grads"][n], p)  # fp32 loss rounding: tolerances relative to the tensor
            torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()),
                                       msg=lambda m, n=n: f"rank {rank} {n}: {m}")
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@RANKS
@pytest.mark.parametrize("levers", ["", "bf16_ce,addmm_bias"])
def test_gpt_with_tp2_and_sequence_parallel_matches_tp1(megatron_on_cpu, tmp_path, levers):
    """The check behind the bench's TP=2 + SP parity pair: same function and gradients, exactly; with
    the default fast path's loss and linear levers too."""
    kw = dict(num_query_groups=2, params_dtype=torch.float64)
    ref = _gpt(_config(**kw), megalab_layer_spec(_config(**kw)), seed=3)
    b, s = 2, 16
    torch.manual_seed(7)
    batch = {"tokens": torch.randint(0, 64, (b, s)), "labels": torch.randint(0, 64, (b, s)),
             "position_ids": torch.arange(s).expand(b, s).contiguous()}
    with torch.no_grad():  # move every weight off its init so a mis-sliced one cannot pass by symmetry
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    loss = ref(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    loss.sum().backward()
    path = tmp_path / "ref.pt"
    torch.save({**batch, "loss": loss.detach(),
                "params": {n: p.detach().clone() for n, p in ref.named_parameters()},
                "grads": {n: p.grad.detach().clone() for n, p in ref.named_parameters()}}, path)
    start_ranks(_tp_sp_gpt_worker, 2, _free_port(), 2, str(path), levers)


def test_residual_norm_hands_megatron_one_tensor_where_the_layer_wraps_its_norm(world1):
    """norm_residual's pair (output, residual) goes only where Megatron's layer calls its norm plainly: a layer that
    recomputes its norms (selective `layernorm`) or offloads activations wraps the call and expects one tensor."""
    from megalab.runtime.spec import ResidualNorm

    assert ResidualNorm(_config(), 32).gives_residual
    assert not Norm(_config(), 32).gives_residual  # the final and q/k norms: always one tensor
    recompute = _config(recompute_granularity="selective", recompute_modules=["layernorm"])
    assert not ResidualNorm(recompute, 32).gives_residual
    assert ResidualNorm(_config(recompute_granularity="selective", recompute_modules=["core_attn"]), 32).gives_residual
    offload = _config()
    offload.fine_grained_activation_offloading = True
    assert not ResidualNorm(offload, 32).gives_residual
