"""megalab/runtime/moe_dispatch.py: GatherDispatcher computes what Megatron's dispatchers compute (CPU, gloo).

Each case routes the same tokens through Megatron's allgather dispatcher (on one GPU its alltoall dispatcher permutes
the same way, with the same argsort-based permute, but needs CUDA streams) and through GatherDispatcher, runs the
same stand-in experts on what each hands them (a per-expert scale, so the row order and the counts both matter),
combines, and compares the output and the gradients of the tokens and of the router probs. Routing maps come from
a real top-k over random logits (so every token has exactly k experts), including maps where experts get no token.
"""

import pytest

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402

from megalab.runtime import levers, moe_dispatch  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402


def _config(experts, topk, **kw):
    return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, num_moe_experts=experts,
                             moe_router_topk=topk, moe_ffn_hidden_size=8, use_cpu_initialization=True,
                             add_bias_linear=False, **kw)


def _routing(tokens, experts, topk, seed, skew=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g, dtype=torch.float64)
    if skew:  # the last experts never win: empty groups
        logits[:, experts // 2:] -= 100.0
    top = logits.topk(topk, dim=1)
    probs = torch.zeros_like(logits).scatter(1, top.indices, top.values.softmax(-1))
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
    return probs, routing_map


def _experts(x, counts, probs):
    """A stand-in for the experts: expert e's rows times (e + 1) and their prob; it checks the counts sum."""
    counts = counts.tolist() if isinstance(counts, torch.Tensor) else counts
    assert sum(counts) == x.shape[0]
    scale = torch.repeat_interleave(torch.arange(1, len(counts) + 1, dtype=x.dtype), torch.tensor(counts))
    return x * (scale * probs.to(x.dtype)).unsqueeze(-1)


def _through(dispatcher, hidden, probs, routing_map, upstream):
    hidden = hidden.detach().clone().requires_grad_()
    probs = probs.detach().clone().requires_grad_()
    x, p = dispatcher.dispatch_preprocess(hidden, routing_map, probs)
    x, p = dispatcher.token_dispatch(x, p)
    x, counts, p = dispatcher.dispatch_postprocess(x, p)
    y = dispatcher.combine_preprocess(_experts(x, counts, p))
    out = dispatcher.combine_postprocess(dispatcher.token_combine(y))
    out.backward(upstream)
    return out.detach(), hidden.grad, probs.grad, counts


@pytest.mark.parametrize("experts,topk,tokens,skew", [(4, 2, 7, False), (8, 3, 33, True), (16, 8, 64, False)])
def test_gather_dispatcher_matches_megatrons_dispatcher(world1, experts, topk, tokens, skew):
    cfg = _config(experts, topk)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    ref = MoEAllGatherTokenDispatcher(experts, list(range(experts)), cfg, pg_collection=pg)
    assert moe_dispatch.eligible(ref, cfg) is None
    ours = moe_dispatch.GatherDispatcher(cfg, pg_collection=pg)
    probs, routing_map = _routing(tokens, experts, topk, seed=tokens, skew=skew)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(tokens, 1, cfg.hidden_size, generator=g, dtype=torch.float64)
    upstream = torch.randn(tokens, 1, cfg.hidden_size, generator=g, dtype=torch.float64)
    want = _through(ref, hidden, probs, routing_map, upstream)
    got = _through(ours, hidden, probs, routing_map, upstream)
    for name, a, b in zip(("output", "tokens' grad", "probs' grad"), got[:3], want[:3]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    assert got[3].device == hidden.device and got[3].tolist() == list(want[3])  # counts, left on the device
    if skew:
        assert 0 in got[3].tolist()


def test_the_rows_come_in_megatrons_order_and_each_token_has_its_k_rows():
    probs, routing_map = _routing(50, 8, 3, seed=3)
    token_of_row, rows_of_token, order = moe_dispatch.plan(routing_map, 3)
    experts_of_rows = order // 50
    assert torch.all(experts_of_rows[1:] >= experts_of_rows[:-1])  # sorted by expert
    assert torch.equal(token_of_row[rows_of_token], torch.arange(50).unsqueeze(1).expand(50, 3))


def test_a_wrong_plan_is_caught_by_the_comparison(world1, monkeypatch):
    """The check can fail: rows of a token summed from the wrong places give another output."""
    cfg = _config(8, 2)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    ref = MoEAllGatherTokenDispatcher(8, list(range(8)), cfg, pg_collection=pg)
    ours = moe_dispatch.GatherDispatcher(cfg, pg_collection=pg)
    plan = moe_dispatch.plan
    monkeypatch.setattr(moe_dispatch, "plan", lambda m, k: (lambda t, r, o: (t, r.roll(1, 0), o))(*plan(m, k)))
    probs, routing_map = _routing(20, 8, 2, seed=5)
    hidden = torch.randn(20, 1, cfg.hidden_size, dtype=torch.float64)
    upstream = torch.randn(20, 1, cfg.hidden_size, dtype=torch.float64)
    assert not torch.allclose(_through(ours, hidden, probs, routing_map, upstream)[0],
                              _through(ref, hidden, probs, routing_map, upstream)[0])


@pytest.mark.parametrize("change,why", [
    (dict(moe_expert_capacity_factor=1.0), "token dropping"),
    (dict(moe_router_padding_for_quantization=True), "padding for quantization"),
])
def test_layouts_it_does_not_serve_keep_megatrons_dispatcher(world1, change, why):
    cfg = _config(8, 2)
    for k, v in change.items():  # set after validation: padding for quantization needs fp8 to be constructed
        setattr(cfg, k, v)
    ref = MoEAllGatherTokenDispatcher(8, list(range(8)), cfg,
                                      pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    assert moe_dispatch.eligible(ref, cfg) == why


def test_the_moe_layer_swaps_its_dispatcher_only_with_the_lever(world1):
    from megalab.runtime import spec
    from tests.conftest import applied

    cfg = _config(4, 2)
    layer_spec = spec.megalab_transformer_layer_spec(num_experts=4, moe_grouped_gemm=True).submodules.mlp
    with applied([levers.GROUPED_GEMM]):
        assert type(layer_spec(config=cfg).token_dispatcher) is MoEAllGatherTokenDispatcher
    with applied([levers.GROUPED_GEMM, levers.MOE_GATHER]):
        assert type(layer_spec(config=cfg).token_dispatcher) is moe_dispatch.GatherDispatcher


def _checkgather_sum():
    """In Triton's interpreter: the kernel's sum of each token's k rows against the gather-and-sum in float64."""
    import torch

    from megalab.runtime import moe_dispatch as D

    for tokens, k, hidden in ((1, 1, 8), (D.BLOCK_T * 2 + 3, 8, 40), (7, 3, D.BLOCK_H + 24)):
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(tokens * hidden + k)
            x = torch.randn(tokens * k, hidden, generator=g).to(dtype)
            rows = torch.randperm(tokens * k, generator=g).view(tokens, k)
            got = D.gather_sum(x, rows)
            want = x.double()[rows].sum(1)
            tol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}[dtype]
            assert got.dtype == dtype
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # gather_rows: each row copied from its index (repeats and a ragged last tile), bit for bit
    for rows, tokens, hidden in ((1, 1, 8), (D.BLOCK_T * 2 + 3, 5, D.BLOCK_H + 24)):
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(tokens, hidden, generator=g).bfloat16()
        index = torch.randint(0, tokens, (rows,), generator=g)
        assert torch.equal(D.gather_rows(x, index), x.index_select(0, index))
    print("ok")


def test_gather_sum_kernel_sums_each_tokens_rows():
    from tests.conftest import interpreted

    r = interpreted("import test_moe_dispatch as t; t._checkgather_sum()")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
