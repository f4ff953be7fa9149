"""Tests for megalab/runtime/grouped_experts.py: GroupedMLP computes SequentialMLP's function (CPU, gloo).

Each test builds Megatron's SequentialMLP and megalab's GroupedMLP for the same config, copies the
weights across (same state-dict keys), feeds both the same permuted tokens, tokens_per_expert and
router probs, and compares the output and every gradient: the tokens', the probs' (the router
learns through them) and each expert's weights and biases. Token counts are uneven and include an
expert with no tokens. float64 runs the per-expert-loop kernel (torch._grouped_mm has no float64);
float32 with 16-byte-aligned sizes runs torch._grouped_mm's CPU kernel, forward and backward.
"""

import pytest
from conftest import RANKS, free_port as _free_port, start_ranks

from megalab._compat import ensure_typing_override

ensure_typing_override()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megalab.runtime import grouped_experts, levers
from tests.conftest import applied
from megalab.core import plan, variables
from megalab.harness import launch  # noqa: E402
from megalab.core.catalog import get as target  # noqa: E402
from megalab.runtime.grouped_experts import GroupedMLP  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}  # bf16: rounding order differs, not the math
COUNTS = [3, 0, 6, 1, 2]  # uneven, expert 1 gets no token



def _config(dtype=torch.float64, **kw) -> TransformerConfig:
    base = dict(num_layers=1, hidden_size=16, num_attention_heads=4, num_moe_experts=len(COUNTS),
                moe_ffn_hidden_size=8, moe_router_topk=2, use_cpu_initialization=True,
                params_dtype=dtype, add_bias_linear=False, gradient_accumulation_fusion=False,
                bias_activation_fusion=False, bias_dropout_fusion=False)
    return TransformerConfig(**(base | kw))


def _pair(cfg: TransformerConfig, num_local: int | None = None, stacked: bool = False):
    """SequentialMLP and GroupedMLP of the same config, the grouped one holding the same weights (stacked: with
    the expert_stack lever, one tensor per linear for all experts)."""
    pg = ProcessGroupCollection.use_mpu_process_groups()
    n = num_local or cfg.num_moe_experts
    sub = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    torch.manual_seed(0)
    seq = SequentialMLP(n, cfg, sub, pg_collection=pg)
    with applied([levers.GROUPED_GEMM, levers.EXPERT_STACK] if stacked else []):
        grp = GroupedMLP(n, cfg, sub, pg_collection=pg)
    assert grp.stacked == (stacked and n > 1)
    with torch.no_grad():  # biases start at zero: make them count
        for p in seq.parameters():
            if p.dim() == 1:
                p.normal_()
        grp.load_state_dict(seq.state_dict())
    if cfg.add_bias_linear:
        # With EP = ETP = 1 SequentialMLP's fc2 returns its output through Megatron's (identity)
        # TP all-reduce Function, and MLP's in-place `output += bias * probs` then fails ("a view
        # ... modified inplace"). Under EP or ETP > 1 the expert linears skip that Function
        # ("explicit expert comm"); take that path here, which is the same arithmetic.
        for e in seq.local_experts:
            e.linear_fc1.explicit_expert_comm = e.linear_fc2.explicit_expert_comm = True
    return seq, grp


def _run(module, x, counts, probs, upstream):
    x = x.detach().clone().requires_grad_()
    probs = probs.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out, bias = module(x, torch.tensor(counts), probs)
    assert bias is None
    out.backward(upstream)
    return out.detach(), x.grad, probs.grad, _per_expert_grads(module)


def _per_expert_grads(module):
    """Parameter gradients by SequentialMLP's names (a stacked GroupedMLP's split per expert)."""
    grads = {n: p.grad for n, p in module.named_parameters()}
    if getattr(module, "stacked", False):
        for name in [n for n in grads if n.startswith("linear_fc")]:
            for i, g in enumerate(grads.pop(name).unbind(0)):
                grads[f"local_experts.{i}.{name}"] = g
    return grads


def _compare(seq, grp, counts=COUNTS, dtype=torch.float64, seed=1, probs_dtype=None):
    torch.manual_seed(seed)
    tokens = sum(counts)
    x = torch.randn(tokens, seq.config.hidden_size, dtype=dtype)
    probs = torch.rand(tokens, dtype=probs_dtype or dtype)
    upstream = torch.randn(tokens, seq.config.hidden_size, dtype=dtype)
    want, got = _run(seq, x, counts, probs, upstream), _run(grp, x, counts, probs, upstream)
    tol = TOL[dtype]
    torch.testing.assert_close(got[0], want[0], **tol, msg=lambda m: f"output: {m}")
    torch.testing.assert_close(got[1], want[1], **tol, msg=lambda m: f"input grad: {m}")
    torch.testing.assert_close(got[2], want[2], **tol, msg=lambda m: f"probs grad: {m}")
    assert got[3].keys() == want[3].keys()
    for name, g in want[3].items():
        assert got[3][name] is not None, name
        torch.testing.assert_close(got[3][name], g, **tol, msg=lambda m, name=name: f"{name} grad: {m}")
    return got


ACTIVATIONS = {
    "gelu": dict(activation_func=F.gelu, gated_linear_unit=False),  # the olmoe-like preset
    "swiglu": dict(activation_func=F.silu, gated_linear_unit=True),
    "clamped-glu": dict(activation_func=F.silu, gated_linear_unit=True, activation_func_clamp_value=0.5,
                        glu_linear_offset=1.0),
}


STACKED = pytest.mark.parametrize("stacked", [False, True], ids=["per-expert", "stacked"])


@STACKED
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_float64_matches_sequential_mlp(world1, act, bias, stacked):
    seq, grp = _pair(_config(add_bias_linear=bias, **ACTIVATIONS[act]), stacked=stacked)
    _compare(seq, grp)
    assert grp.last_kernels == {"loop"}  # torch._grouped_mm has no float64 kernel


@STACKED
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_float32_through_torch_grouped_mm_matches_sequential_mlp(world1, act, stacked):
    seq, grp = _pair(_config(torch.float32, **ACTIVATIONS[act]), stacked=stacked)
    grp.kernel = "grouped_mm"  # must run: an unusable kernel raises instead of looping
    _compare(seq, grp, dtype=torch.float32)
    assert grp.last_kernels == {"torch._grouped_mm"}  # forward, input grad and weight grad


@STACKED
def test_bfloat16_with_float32_probs_as_in_training(world1, stacked):
    """The GPU case: bf16 weights and tokens, fp32 router probs (torch._grouped_mm's CPU kernel)."""
    seq, grp = _pair(_config(torch.bfloat16, **ACTIVATIONS["swiglu"]), stacked=stacked)
    grp.kernel = "grouped_mm"
    out = _compare(seq, grp, dtype=torch.bfloat16, probs_dtype=torch.float32)[0]
    assert out.dtype == torch.bfloat16


def test_auto_kernel_picks_grouped_mm_where_it_can_and_loops_where_it_cannot(world1):
    seq, grp = _pair(_config(torch.float32))
    _compare(seq, grp, dtype=torch.float32)
    assert grp.last_kernels == {"torch._grouped_mm"}
    odd = _config(torch.float32, hidden_size=10, num_attention_heads=2, moe_ffn_hidden_size=6)
    seq, grp = _pair(odd)  # rows of 10 and 6 floats (40, 24 bytes): not 16-byte aligned
    _compare(seq, grp, dtype=torch.float32)
    assert grp.last_kernels == {"loop"}


@pytest.mark.parametrize("counts", [[0, 0, 7, 0, 0], [2, 2, 2, 2, 2], [0, 0, 0, 0, 0]],
                         ids=["one-busy-expert", "even", "no-tokens"])
@STACKED
def test_token_distributions(world1, counts, stacked):
    for dtype, kernel in ((torch.float64, "loop"), (torch.float32, "grouped_mm")):
        seq, grp = _pair(_config(dtype, **ACTIVATIONS["swiglu"]), stacked=stacked)
        grp.kernel = kernel if sum(counts) else "auto"
        got = _compare(seq, grp, counts=counts, dtype=dtype)
        for e, c in enumerate(counts):  # an expert without tokens: exactly zero weight gradient
            if c == 0:
                assert not got[3][f"local_experts.{e}.linear_fc1.weight"].any()
                assert not got[3][f"local_experts.{e}.linear_fc2.weight"].any()


def test_probs_on_input_with_top1(world1):
    seq, grp = _pair(_config(moe_router_topk=1, moe_router_pre_softmax=True, moe_apply_probs_on_input=True))
    _compare(seq, grp)


@STACKED
def test_one_local_expert_is_sequential_mlps_own_path(world1, stacked):
    seq, grp = _pair(_config(num_moe_experts=1), num_local=1, stacked=stacked)
    _compare(seq, grp, counts=[5])


def test_wrong_token_count_is_refused(world1):
    _, grp = _pair(_config())
    with pytest.raises(ValueError, match="sums to 12, but 11 tokens"):
        grp(torch.randn(11, 16, dtype=torch.float64), torch.tensor(COUNTS), torch.rand(11, dtype=torch.float64))


def test_same_parameters_and_state_dict_as_sequential_mlp(world1):
    """Parameter names, shapes, count, the tensor-parallel / expert attributes Megatron's DDP and
    optimizer read, and the distributed-checkpoint keys are SequentialMLP's."""
    seq, grp = _pair(_config(add_bias_linear=True, **ACTIVATIONS["swiglu"]))
    shapes = lambda m: {n: tuple(p.shape) for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(grp) == shapes(seq)
    assert sum(p.numel() for p in grp.parameters()) == sum(p.numel() for p in seq.parameters())
    assert grp.state_dict().keys() == seq.state_dict().keys()
    attrs = ("allreduce", "tensor_model_parallel", "partition_dim", "partition_stride")
    for (n, p), q in zip(grp.named_parameters(), seq.parameters()):
        assert {a: getattr(p, a, None) for a in attrs} == {a: getattr(q, a, None) for a in attrs}, n
    meta = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    assert grp.sharded_state_dict("mlp.experts.", metadata=meta).keys() == \
        seq.sharded_state_dict("mlp.experts.", metadata=meta).keys()


def test_stacked_experts_keep_sequential_mlps_state_dict_and_checkpoint(world1):
    """expert_stack: two Parameters per linear instead of one per expert, with SequentialMLP's attributes (the
    tensor-parallel axis one along), state-dict keys and distributed-checkpoint tensors, which share the stacked
    memory (a checkpoint load writes into them)."""
    seq, grp = _pair(_config(add_bias_linear=True, **ACTIVATIONS["swiglu"]), stacked=True)
    assert sorted(n for n, _ in grp.named_parameters()) == [
        "linear_fc1.bias", "linear_fc1.weight", "linear_fc2.bias", "linear_fc2.weight"]
    assert sum(p.numel() for p in grp.parameters()) == sum(p.numel() for p in seq.parameters())
    for name in ("linear_fc1.weight", "linear_fc2.weight"):
        p, q = grp.get_parameter(name), seq.local_experts[0].get_parameter(name)
        assert (p.allreduce, p.tensor_model_parallel, p.partition_dim) == (
            q.allreduce, q.tensor_model_parallel, q.partition_dim + 1)
    assert grp.state_dict().keys() == seq.state_dict().keys()
    torch.testing.assert_close(grp.state_dict(), seq.state_dict(), rtol=0, atol=0)
    meta = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    ours = grp.sharded_state_dict("mlp.experts.", metadata=meta)
    assert ours.keys() == seq.sharded_state_dict("mlp.experts.", metadata=meta).keys()
    stacked = grp.linear_fc2.weight
    fc2 = [t for k, t in ours.items() if k.endswith("linear_fc2.weight")]
    assert fc2 and all(t.data.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
                       for t in fc2)
    assert all(e.linear_fc1.weight is None for e in grp.local_experts)  # the views are gone again
    with torch.no_grad():  # and a per-expert state dict loads into the stacked tensors
        for p in seq.parameters():
            p.add_(1.0)
    grp.load_state_dict(seq.state_dict())
    torch.testing.assert_close(grp.state_dict(), seq.state_dict(), rtol=0, atol=0)


def test_stacked_experts_fire_their_two_modules_pre_hooks(world1):
    _, grp = _pair(_config(), stacked=True)
    fired = []
    for m in (grp.linear_fc1, grp.linear_fc2):
        m.register_forward_pre_hook(lambda m, args: fired.append(m))
    grp(torch.randn(12, 16, dtype=torch.float64), torch.tensor(COUNTS), torch.rand(12, dtype=torch.float64))
    assert [id(m) for m in fired] == [id(grp.linear_fc1), id(grp.linear_fc2)]


@pytest.mark.parametrize("on_host", [True, False], ids=["host-counts", "device-counts"])
@pytest.mark.parametrize("into_main_grad", [False, True], ids=["returned", "into-main-grad"])
def test_weight_gradient_of_empty_experts_is_zero_even_where_the_kernel_leaves_garbage(monkeypatch, on_host,
                                                                                    into_main_grad):
    """pytorch/pytorch#172439: _grouped_mm may leave an empty group's output unwritten. Such slices come out zero,
    with the counts on the host (zeroed one by one) or on the device (a mask, no sync), returned or added into an
    fp32 main_grad (Megatron's DDP) in the same pass."""
    counts = [3, 0, 4, 0, 5]
    real = grouped_experts._try_grouped_mm

    def leaves_garbage(kernel, a, b, groups):
        out = real("grouped_mm", a, b, groups)
        for e, c in enumerate(counts):
            if c == 0 and out.dim() == 3:
                out[e].fill_(7.0)
        return out

    monkeypatch.setattr(grouped_experts, "_try_grouped_mm", leaves_garbage)
    g = torch.Generator().manual_seed(0)
    dy, x = torch.randn(12, 16, generator=g), torch.randn(12, 8, generator=g)
    groups = grouped_experts._Groups(torch.tensor(counts), 12, x.device, on_host=on_host)
    want = torch.stack([dy[s].t() @ x[s] for s in grouped_experts._Groups(torch.tensor(counts), 12, x.device).slices()])
    start = torch.randn(len(counts), 16, 8, generator=g, dtype=torch.float64).float()
    main = start.clone()
    got = grouped_experts._wgrad(dy, x, groups, "auto", into=main if into_main_grad else None)
    got = main - start if into_main_grad else got
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not got[1].any() and not got[3].any()
    monkeypatch.setattr(grouped_experts, "_try_grouped_mm", real)  # the check can fail: without the masking...
    garbage = leaves_garbage("auto", dy.t(), x, groups)
    assert garbage[1].eq(7.0).all()


def test_stacked_weight_gradient_goes_into_main_grad_as_megatrons_ddp_expects(world1):
    """Wrapped by Megatron's DDP a weight has main_grad and grad_added_to_main_grad: the stacked experts put their
    gradient there, flag it, and hand autograd Megatron's placeholder, so DDP's hook adds nothing twice. The step's
    first micro-batch (DDP zeroed the buffer and reset the flag) writes it; the next ones add to it."""
    seq, grp = _pair(_config(torch.float32), stacked=True)
    grp.kernel = "grouped_mm"
    want = {k: g.clone() for k, g in _compare(seq, grp, dtype=torch.float32)[3].items()}
    grp.zero_grad(set_to_none=True)
    for p in grp.parameters():
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
        p.grad_added_to_main_grad = False
    for micro_batch in (1, 2):
        torch.manual_seed(1)  # _compare's first draw again: the same tokens, probs and upstream gradient
        x = torch.randn(sum(COUNTS), 16)
        probs = torch.rand(sum(COUNTS))
        upstream = torch.randn(sum(COUNTS), 16)
        grp(x, torch.tensor(COUNTS), probs)[0].backward(upstream)
        for name in ("linear_fc1.weight", "linear_fc2.weight"):
            p = grp.get_parameter(name)
            assert p.grad_added_to_main_grad
            per_expert = torch.stack([want[f"local_experts.{i}.{name}"] for i in range(len(COUNTS))])
            torch.testing.assert_close(p.main_grad, micro_batch * per_expert, rtol=1e-5, atol=1e-5)


def test_expert_modules_forward_pre_hooks_fire(world1):
    """The expert linears are not called, yet their forward pre-hooks must run: Megatron's DDP
    waits there for the parameters' all-gather under --overlap-param-gather (ZeRO-2)."""
    _, grp = _pair(_config())
    fired = []
    for e in grp.local_experts:
        for lin in (e.linear_fc1, e.linear_fc2):
            lin.register_forward_pre_hook(lambda m, args: fired.append(m))
    grp(torch.randn(12, 16, dtype=torch.float64), torch.tensor(COUNTS), torch.rand(12, dtype=torch.float64))
    assert len(fired) == 2 * len(COUNTS) and len(set(map(id, fired))) == len(fired)


# ---------------------------------------------------------------------------- EP and expert TP


def _parallel_worker(rank: int, port: int, ep: int, etp: int):
    """Two ranks, EP=ep x expert-TP=etp: each rank's GroupedMLP against its SequentialMLP (local
    experts only under EP; moe_ffn_hidden / ETP of every expert under ETP)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=etp)
    try:
        for act in ("gelu", "swiglu"):
            cfg = _config(expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                          num_moe_experts=4, add_bias_linear=etp == 1, **ACTIVATIONS[act])
            for stacked in (False, True):
                seq, grp = _pair(cfg, num_local=4 // ep, stacked=stacked)
                ffn = cfg.moe_ffn_hidden_size * (2 if cfg.gated_linear_unit else 1) // etp
                w1 = grp.linear_fc1.weight[0] if stacked else grp.local_experts[0].linear_fc1.weight
                assert w1.shape == (ffn, cfg.hidden_size)
                counts = [3, 0, 2, 4][: 4 // ep]
                _compare(seq, grp, counts=counts, seed=rank)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@RANKS
@pytest.mark.parametrize("ep,etp", [(2, 1), (1, 2)], ids=["EP=2", "ETP=2"])
def test_expert_parallel_and_expert_tensor_parallel(ep, etp):
    start_ranks(_parallel_worker, 2, _free_port(), ep, etp)


# ---------------------------------------------------------------------------- how it is switched on


def test_spec_builds_grouped_experts_with_the_lever_and_the_same_parameters(world1, monkeypatch):
    from megalab.runtime.spec import megalab_layer_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    def gpt(cfg):
        torch.manual_seed(0)
        return GPTModel(config=cfg, transformer_layer_spec=megalab_layer_spec(cfg), vocab_size=64,
                        max_sequence_length=16)

    cfg = _config(torch.float32, num_layers=2, moe_layer_freq=[1, 0], moe_token_dispatcher_type="allgather",
                  normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0)
    with applied([]):
        plain = gpt(cfg)
    assert type(plain.decoder.layers[0].mlp.experts) is SequentialMLP
    with applied(["fused_adam", "grouped_gemm"]):
        grouped = gpt(cfg)
    assert type(grouped.decoder.layers[0].mlp.experts) is GroupedMLP
    assert {n: p.shape for n, p in grouped.named_parameters()} == {n: p.shape for n, p in plain.named_parameters()}
    for (n, p), q in zip(grouped.named_parameters(), plain.parameters()):  # same seed, same init
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=n)
    monkeypatch.setenv("MEGALAB_FAST", "none")  # Megatron's own flag asks for it too
    assert type(gpt(_config(torch.float32, moe_grouped_gemm=True)).decoder.layers[0].mlp.experts) is GroupedMLP


def _opts(**kw):
    if isinstance(kw.get("fast"), str):  # FAST as typed, parsed as the make variable is
        kw["fast"] = variables.parse("FAST", kw["fast"])
    return launch.Options(**({"iters": 20} | kw))


def _plan(exp, opts, impl="local", gpus=None):
    """The plan of exp under impl: Transformer Engine "present" or not on this (pretend) machine."""
    return plan.build(exp, opts, plan.Machine(gpus=gpus, te="x" if impl == "transformer_engine" else None))


@pytest.mark.parametrize("tid", ["522", "531"])  # EP=2; expert-TP=2
def test_olmoe_targets_get_the_substitute_and_megatron_accepts_them(tid):
    from megalab.harness import validate
    from megatron.training.argument_utils import gpt_config_from_args

    exp = target(tid)
    p = _plan(exp, _opts())
    env = p.env
    assert grouped_experts.LEVER in env["MEGALAB_FAST"].split(",")
    with applied(levers.parse(env["MEGALAB_FAST"])):
        assert grouped_experts.wanted()
    assert not grouped_experts.wanted()  # the lever off: SequentialMLP, unless Megatron's flag asks
    cmd = p.command
    assert "--moe-grouped-gemm" not in cmd  # Megatron's flag stays off: its grouped GEMM is TE's
    args = validate.validate(p.entry_args, exp.gpus)
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (exp.ep, exp.etp)
    gpt_config_from_args(args)
    assert dict(_plan(exp, _opts(), "local").substituted_flags) == {"--moe-grouped-gemm": grouped_experts.LEVER}
    assert list(_plan(exp, _opts(), "local").dropped_flags) == ["--moe-permute-fusion"]
    lines = launch.preflight(_plan(exp, _opts(), gpus=2))
    assert any(line.startswith("substitute --moe-grouped-gemm") for line in lines)
    assert any(line.startswith("dropped    --moe-permute-fusion") for line in lines)


def test_the_substitute_is_off_with_fast_none_spec_local_or_te():
    exp = target("522")
    for opts in (_opts(fast="none"), _opts(fast="fused_adam"), _opts(spec="local")):
        assert dict(_plan(exp, opts).substituted_flags) == {}
        assert list(_plan(exp, opts).dropped_flags) == ["--moe-grouped-gemm", "--moe-permute-fusion"]
        assert grouped_experts.LEVER not in _plan(exp, opts).fastpath
    assert dict(_plan(exp, _opts(), "transformer_engine").substituted_flags) == {}
    assert "--moe-grouped-gemm" in _plan(exp, _opts(), "transformer_engine").command
    # FAST=all asks for every lever, this one included; a dense model has nothing to group
    assert grouped_experts.LEVER in _plan(exp, _opts(fast="all")).fastpath
    assert grouped_experts.LEVER not in _plan(target("101"), _opts(fast="all")).fastpath
    # dense GPT-2: its layer's levers and the fused wgrad too
    assert _plan(target("101"), _opts()).fastpath == levers.EVERY + ("bias_gelu", "dropout_add", "qkv_pack",
                                                                "norm_residual", "fused_wgrad", "gelu_epilogue")
