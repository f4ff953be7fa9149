"""CUDA_GRAPH=auto's policy (megalab/core/graphs.py): on where verified and where memory allows."""
import pytest

from megalab.core import catalog, graphs


def decide(target, requested="auto", predicted=None, capacity=80.0, graph_peak=None, **kw):
    exp = catalog.get(target)
    opts = dict(impl="local", spec="megalab", profile=False, nnodes=1, exit_interval=None) | kw
    return graphs.decide(requested, features=graphs.features_of(exp, **opts),
                         predicted_peak_gib=predicted, capacity_gib=capacity, graph_peak_gib=graph_peak)


def test_dense_layouts_get_the_graph_when_it_fits():
    d = decide("101-gpt2xl-dp1-gbs1-bf16", predicted=33.0)
    assert d.on and "33.0 GiB without the graph" in d.reason and "3.0 GiB for the graph" in d.reason
    # with the estimator's peak with the graph, the reason quotes that one figure (the plan's peak line)
    d = decide("101-gpt2xl-dp1-gbs1-bf16", predicted=33.0, graph_peak=34.7)
    assert d.on and "predicted peak 34.7 GiB with the graph, 45.3 GiB under the 80.0 GiB" in d.reason
    assert "33.0" not in d.reason and "1.3 GiB to spare" in d.reason  # 33.0 + 3.0 - 34.7
    assert decide("232-strong-scale-gpt2-1.2B-tp2-paper", predicted=27.0).on
    assert decide("489-gpt2large-pp2-9L-vpp2-m8", predicted=21.0).on


def test_memory_turns_it_off_and_says_by_how_much():
    d = decide("002-gpt2large-dp2-gbs64", predicted=74.1, capacity=74.5)
    assert not d.on and "74.1 GiB without the graph, 0.4 GiB under the 74.5 GiB" in d.reason
    assert "auto wants 6.7 GiB for the graph" in d.reason
    # the decision reads the graph-off peak: the estimator's graph figure changes the words only
    assert not decide("002-gpt2large-dp2-gbs64", predicted=74.1, capacity=74.5, graph_peak=74.4).on
    assert not decide("101-gpt2xl-dp1-gbs1-bf16", predicted=None).on  # no plan, no graph


@pytest.mark.parametrize("target,kw,word", [
    ("522-olmoe-dp2-zero2-ep2", {}, "MoE"),
    ("006-gpt2large-pp2-gbs64-m1", {}, "non-interleaved pipeline"),
    ("005-gpt2large-cp2-gbs64", {}, "context-parallel"),
    ("101-gpt2xl-dp1-gbs1-bf16", {"profile": True}, "profiler"),
    ("101-gpt2xl-dp1-gbs1-bf16", {"spec": "local"}, "stock"),
    ("101-gpt2xl-dp1-gbs1-bf16", {"impl": "transformer_engine"}, "Transformer Engine"),
    ("101-gpt2xl-dp1-gbs1-bf16", {"nnodes": 2}, "one node"),
])
def test_unverified_or_failing_layouts_stay_off_with_a_reason(target, kw, word):
    d = decide(target, predicted=10.0, **kw)
    assert not d.on and word in d.reason


def test_explicit_values_win_and_bad_ones_are_one_line_errors():
    assert decide("522-olmoe-dp2-zero2-ep2", requested="1").on
    assert not decide("101-gpt2xl-dp1-gbs1-bf16", requested="0", predicted=1.0).on
    with pytest.raises(ValueError, match="fix: CUDA_GRAPH=auto"):
        decide("101-gpt2xl-dp1-gbs1-bf16", requested="maybe")


def test_a_forced_graph_in_a_profile_run_is_refused_before_launch():
    """CUDA_GRAPH=1 with profile-<id>: the capture fails under the torch profiler, so the launch stops with
    the fix instead of starting a run that dies after its start-up."""
    with pytest.raises(ValueError, match="profile run.*fix: drop CUDA_GRAPH=1"):
        decide("600-llama1b-1gpu-gbs8", requested="1", profile=True)
    assert decide("600-llama1b-1gpu-gbs8", requested="1").on  # without the profiler, forcing it still works
    assert not decide("600-llama1b-1gpu-gbs8", requested="0", profile=True).on


def test_context_parallel_is_graphed_only_where_a_micro_batch_is_small():
    """CP's graph saves launches per micro-batch: auto takes it at MBS x seq / CP up to CP_GRAPH_MAX_TOKENS
    (604: MBS 1 of 2048 over CP 2) and leaves it off above (302: 16384 tokens; 005: 32768)."""
    small = catalog.get("604-llama1b-cp2-gbs16")
    assert small.mbs * small.seq_length // small.cp <= graphs.CP_GRAPH_MAX_TOKENS
    assert decide("604-llama1b-cp2-gbs16", predicted=33.0).on
    for target in ("302-cp2-gpt2-1.2B-gbs8-len4096", "005-gpt2large-cp2-gbs64"):
        d = decide(target, predicted=33.0)
        assert not d.on and f"above {graphs.CP_GRAPH_MAX_TOKENS} tokens" in d.reason


def test_sequence_parallel_with_dropout_stays_off():
    """With SP and dropout the graph-on run drifted from its twin (004), so auto leaves it off; SP without
    dropout (602: the Llama rows set both dropouts to 0) and dropout without SP (003) keep it."""
    d = decide("004-gpt2large-tp2-sp-gbs64", predicted=33.0)
    assert not d.on and "sequence parallel and dropout" in d.reason
    assert decide("602-llama1b-tp2-sp-gbs16", predicted=20.0).on
    assert decide("003-gpt2large-tp2-gbs64", predicted=33.0).on
    # EXTRA_ARGS that turn both dropouts off give the graph back; one of them alone does not
    assert decide("004-gpt2large-tp2-sp-gbs64", predicted=33.0,
                  extra_args=("--hidden-dropout", "0", "--attention-dropout", "0")).on
    assert not decide("004-gpt2large-tp2-sp-gbs64", predicted=33.0, extra_args=("--hidden-dropout", "0")).on


def test_a_graph_peak_over_capacity_turns_it_off():
    """The estimator's peak with the graph (its CP share can be large) must fit too, not only the margin."""
    d = decide("604-llama1b-cp2-gbs16", predicted=40.0, capacity=60.0, graph_peak=69.2)
    assert not d.on and "40.0 GiB without the graph, and the graph's own 29.2 GiB would take it past the 60.0 GiB" in d.reason
    assert decide("604-llama1b-cp2-gbs16", predicted=32.0, capacity=79.6, graph_peak=55.4).on
