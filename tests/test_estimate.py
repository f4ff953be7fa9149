"""megalab.core.estimate: parameter counts and state bytes against what Megatron prints, the activation
formula on a tiny config worked by hand, the pipeline-stage split, Megatron's FLOPs against the
committed records, the validation table on the committed runs, and the CLI's exit codes."""
from __future__ import annotations


import math
import re
from pathlib import Path

import pytest

from megalab.runtime import memcap
from megalab.core import catalog, git, graphs
from megalab.__main__ import main
from megalab.core import estimate as E, gpus, steptime
from megalab.results import allowances, freeze, validation as V
from megalab.core.schema import stamp
from megalab.core.catalog import Experiment
from megalab.core.records import RunRecord
from megalab.runtime import levers
from tests.conftest import code_as_at_base

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20

# A tiny model for hand arithmetic: s=32, h=64, a=4, 2 layers, vocab 1000.
TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "max_position_embeddings": 32, "vocab_size": 1000}


def tiny(**kw) -> Experiment:
    base = dict(id="tiny", chapter=0, about="", model="gpt2-xl", gpus=1, gbs=2, mbs=2)
    return Experiment(**{**base, **kw})


# --------------------------------------------------------------------------- parameters and state

def test_gpt2xl_parameters_as_megatron_prints():
    est = E.estimate(catalog.get("101-gpt2xl-dp1-gbs1-bf16"))
    assert est.vocab == 50257 and est.vocab_padded == 50304
    assert est.params_total == 1_557_686_400  # "> number of parameters on ... rank (0, 0, 0)"
    assert est.params_per_gpu == [1_557_686_400]


def test_vocab_padding_is_a_multiple_of_128_times_tp():
    assert E.padded_vocab(50257, 1) == 50304
    assert E.padded_vocab(50257, 2) == 50432  # 50304 is not a multiple of 256
    assert E.padded_vocab(50257, 8) == 51200


def test_tensor_parallel_params_per_gpu_as_megatron_prints():
    est = E.estimate(catalog.get("003-gpt2large-tp2-gbs64"))
    assert est.params_per_gpu == [387_921_920]  # logs of results/runs/*003*


def test_weight_and_optimizer_dp1_matches_megatron():
    st = E.estimate(catalog.get("101-gpt2xl-dp1-gbs1-bf16")).stages[0]
    assert st.state_bytes == 18 * 1_557_686_400
    assert abs(st.state_bytes / MB / 26699.47 - 1) < 0.005
    # The 0.15% is Megatron's formula leaving out biases (9h per layer) and positions (s x h).
    h, layers = 1600, 48
    megatron_count = 1_557_686_400 - 9 * h * layers - 1024 * h
    assert round(18 * megatron_count / MB, 2) == 26699.47


@pytest.mark.parametrize("target", ["122-gpt2xl-dp2-gbs32-zero2", "152-gpt2xl-dp2-gbs30-zero2"])
def test_weight_and_optimizer_dp2_zero2_matches_megatron(target):
    st = E.estimate(catalog.get(target)).stages[0]
    assert st.state_bytes == pytest.approx((6 + 12 / 2) * 1_557_686_400)
    assert abs(st.state_bytes / MB / 17799.65 - 1) < 0.005


def test_zero2_at_dp1_shards_nothing():
    assert E.estimate(catalog.get("121-gpt2xl-dp1-gbs16-oom")).stages[0].state_bytes == 18 * 1_557_686_400


def test_moe_params_by_hand_without_biases():
    # An OLMoE-like preset: 16 layers, h 1024, expert FFN 1024, 64 experts, no linear biases.
    cfg = {"num_layers": 16, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 4096,
           "max_position_embeddings": 4096, "vocab_size": 50257, "disable_bias_linear": True,
           "moe_ffn_hidden_size": 1024, "moe_router_topk": 8}
    h, L = 1024, 16
    experts = L * 64 * 2 * h * 1024
    dense = L * (4 * h * h + 64 * h + 2 * 2 * h) + 2 * h + 50304 * h + 4096 * h
    est = E.estimate(tiny(gpus=8, gbs=32, mbs=4, num_experts=64, zero2=True), model_cfg=cfg)
    assert est.params_total == experts + dense == 2_271_414_272
    ep8 = E.estimate(tiny(gpus=8, gbs=32, mbs=4, num_experts=64, zero2=True, ep=8), model_cfg=cfg)
    assert ep8.params_per_gpu == [dense + experts // 8]


# --------------------------------------------------------------------------- activations by hand

def test_activation_formula_tiny_by_hand():
    s, b, h, a = 32, 2, 64, 4
    sbh = s * b * h  # 4096
    # megalab (SDPA): sbh(34 + 4a/h) = 4096 x 34.25 = 140288 bytes per layer
    est = E.estimate(tiny(), model_cfg=TINY)
    assert est.per_layer_sbh == pytest.approx(34.25)
    st = est.stages[0]
    embed = 8 * s * b + sbh  # token ids (int64) + embedding dropout mask
    assert st.activations_bytes == pytest.approx(2 * 140288 + embed)
    # logits: b s V_pad x (2 + 4) with V_pad = 1024; plus the final-LN tensors 4sbh
    assert st.head_bytes == pytest.approx(6 * s * b * 1024 + 4 * sbh)
    # local spec keeps the scores: sbh(34 + 5as/h) = 4096 x (34 + 10) = 180224 bytes per layer
    loc = E.estimate(tiny(), model_cfg=TINY, spec="local")
    assert loc.per_layer_sbh * sbh == pytest.approx(180224)
    assert 5 * a * s / h == 10


def test_activation_formula_tp_sp_recompute_by_hand():
    sh = E.Shape.of(TINY)
    f = E.layer_activation_sbh
    # TP=2 (local): 10 + 24/2 + 5 x 4 x 32 / (64 x 2) = 22 + 5 = 27
    assert f(sh, tp=2, sp=False, spec="local", selective=False) == pytest.approx(27)
    # TP=2 + SP (local): 34/2 + 5 = 22
    assert f(sh, tp=2, sp=True, spec="local", selective=False) == pytest.approx(22)
    # selective recompute drops the score term: 10 + 24/2 = 22
    assert f(sh, tp=2, sp=False, spec="local", selective=True) == pytest.approx(22)
    # megalab TP=2 + SP: 17 + 4 x 4 / (64 x 2) = 17.125
    assert f(sh, tp=2, sp=True, spec="megalab", selective=False) == pytest.approx(17.125)
    # full recompute, uniform 1: 2sbh per layer kept + one layer's full activations live
    est = E.estimate(tiny(recompute="full-uniform-1"), model_cfg=TINY)
    sbh = 32 * 2 * 64
    assert est.stages[0].activations_bytes == pytest.approx(2 * 2 * sbh + 34.25 * sbh + 8 * 32 * 2 + sbh)


def test_expert_tp_keeps_the_gathered_tokens_h_wide_tensors():
    # Megatron's all-to-all dispatcher gathers the ETP group's tokens onto every rank: per routed
    # token copy, the h-wide fc1 input and expert output (2 + 2 bytes per h) grow ETP-fold, while
    # ETP x tokens times f/ETP keeps the f-wide part (6f/h with SwiGLU) as it is.
    cfg = dict(TINY, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64, swiglu=True)
    sh = E.Shape.of(cfg)
    f = lambda etp: E.layer_activation_sbh(sh, tp=1, sp=False, spec="megalab", selective=False, etp=etp)  # noqa: E731
    assert f(2) - f(1) == pytest.approx(sh.topk * 4 * (2 - 1))
    assert f(4) - f(1) == pytest.approx(sh.topk * 4 * (4 - 1))


def test_context_parallel_divides_the_sequence():
    one = E.estimate(tiny(gpus=2, gbs=4), model_cfg=TINY).stages[0]
    cp2 = E.estimate(tiny(gpus=2, cp=2), model_cfg=TINY).stages[0]
    assert cp2.head_bytes == pytest.approx(one.head_bytes / 2)
    # all_gather keeps the whole sequence's K and V: 2 tensors x 2 bytes x (CP - 1) more, per s b h
    sh = E.Shape.of(TINY)
    ring, ag = (E.layer_activation_sbh(sh, tp=1, sp=False, spec="megalab", selective=False, cp=4, cp_comm=c)
                for c in ("p2p", "all_gather"))
    assert ag - ring == pytest.approx(4 * 3 * sh.groups / sh.heads)


def test_ring_attention_strands_one_kv_chunk_per_step_per_layer():
    # K and V (2) x s/CP tokens x b x kv width x 2 bytes, per ring step (CP - 1) per layer
    ring = E.estimate(tiny(gpus=4, cp=4, gbs=2), model_cfg=TINY).stages[0]
    assert ring.ring_slack_bytes == 3 * 2 * (2 * 8 * 2 * 64 * 2)  # steps x layers x (K, V x s/CP x b x h x 2 B)
    for comm in ("all_gather", "a2a"):  # synchronous collectives: nothing held
        assert E.estimate(tiny(gpus=4, cp=4, gbs=2, cp_comm=comm), model_cfg=TINY).stages[0].ring_slack_bytes == 0
    assert E.estimate(tiny(gpus=4, gbs=8), model_cfg=TINY).stages[0].ring_slack_bytes == 0


def test_nccl_allowance_by_layout():
    assert E.nccl_mib(1, 1, 1) == 0  # no peers
    assert E.nccl_mib(8, 1, 1) == E.NCCL_MIB  # DP or TP: one communicator
    assert E.nccl_mib(2, 2, 1) == E.NCCL_MIB + E.NCCL_PP_MIB
    assert E.nccl_mib(4, 1, 4) == E.NCCL_MIB + E.NCCL_CP_MIB


def test_tensorboard_memory_runs_past_the_log_line():
    # 481: the log's memory line (after iteration 2) says 15186 MB reserved on the last rank; the
    # allocator reserved more in iteration 3, which only the TensorBoard series shows.
    run = next((ROOT / "results" / "runs").glob("*___481-gpt2large-pp2-1L-vpp18-m8"))
    tb = V.tensorboard_mem_mb(run)
    assert tb["mem-reserved-bytes"] == pytest.approx(16760, abs=1)
    assert tb["mem-max-allocated-bytes"] == pytest.approx(14509, abs=1)
    mem = V.megatron_mem_by_rank(RunRecord.load(run / "run.json"))
    assert mem[1]["max_reserved_mb"] == pytest.approx(16760, abs=1) and mem[1]["to_last_iteration"]
    assert mem[0]["max_reserved_mb"] == 15654.0  # rank 0: the log line only
    assert V.tensorboard_mem_mb(ROOT / "no-such-run") == {}


# --------------------------------------------------------------------------- pipeline stages

def test_pipeline_stage_split_gpt2large_pp2():
    est = E.estimate(catalog.get("006-gpt2large-pp2-gbs64-m1"))
    first, last = est.stages
    # Megatron's per-rank parameter counts (logs of results/runs/*006*): embeddings + positions on
    # the first stage; final LN + a copy of the tied word embedding on the last.
    assert (first.params, last.params) == (419_893_760, 418_585_600)
    assert est.params_total == 774_090_240  # the copy counts once
    assert first.head_bytes == 0 and last.head_bytes > 0
    assert (first.inflight, last.inflight) == (1, 1)  # one microbatch: nothing else in flight


def test_pipeline_inflight_microbatches_1f1b_and_interleaved():
    cfg = {**TINY, "num_layers": 8}
    est = E.estimate(tiny(gpus=4, pp=4, gbs=16), model_cfg=cfg)  # m = 8
    assert [s.inflight for s in est.stages] == [4, 3, 2, 1]
    est = E.estimate(tiny(gpus=4, pp=4, gbs=4), model_cfg=cfg)  # m = 2 < p
    assert [s.inflight for s in est.stages] == [2, 2, 2, 1]
    # interleaved, v = 2 chunks of 1 layer: first stage holds p(1 + (p-1)/(pv)) = 5.5 microbatches
    est = E.estimate(tiny(gpus=4, pp=4, gbs=16, layers_per_virtual_stage=1), model_cfg=cfg)
    assert est.virtual_stages == 2
    assert est.stages[0].inflight == pytest.approx(4 * (1 + 3 / 8))


# --------------------------------------------------------------------------- fit, FLOPs, render

def test_local_spec_at_mbs15_does_not_fit_an_h100():
    exp = catalog.get("111-gpt2xl-dp1-fit-80GB")
    assert E.estimate(exp).fits
    loc = E.estimate(exp, spec="local")
    assert not loc.fits and loc.gpu_mem_gib == pytest.approx(79.65, abs=0.01)
    assert E.estimate(exp, spec="local", gpu_mem_gib=400).fits


def test_gpu_mem_gb_80_is_an_h100():
    assert memcap.nominal_gb_to_gib(80) == pytest.approx(81559 / 1024)
    assert E.gpu_spec("NVIDIA H200")[0] == pytest.approx(143771 / 1024)


def _records():
    for d in V.RECORD_DIRS:
        for p in sorted((ROOT / d).glob("*/run.json")):
            yield RunRecord.load(p)


def test_flops_are_megatrons_on_committed_runs():
    """Megatron logs TFLOP/s = its FLOPs / step time / GPUs; ours times the same step must agree."""
    n = 0
    for rec in _records():
        if rec.status != "ok" or not rec.tflops_per_gpu:
            continue
        est = V.estimate_record(rec)
        logged = rec.tflops_per_gpu * 1e12 * rec.step_ms_median / 1e3 * est.gpus
        assert est.flops_per_step == pytest.approx(logged, rel=0.01), rec.target
        n += 1
    assert n >= 20


def test_step_time_at_mfu():
    est = E.estimate(catalog.get("111-gpt2xl-dp1-fit-80GB"), mfu=0.35)
    assert est.step_ms == pytest.approx(est.flops_per_step / (989e12 * 0.35) * 1e3)
    assert est.tflops_per_gpu == pytest.approx(989 * 0.35)
    full = E.estimate(tiny(recompute="full-uniform-1"), model_cfg=TINY)
    assert full.hw_flops_per_step > full.flops_per_step  # Megatron's count has no recompute term


def test_step_time_is_a_model_of_its_own():
    """Small batches are launch-bound (CPU time per kernel), large ones GPU-bound; TP adds its calls."""
    one = E.estimate(catalog.get("101-gpt2xl-dp1-gbs1-bf16"), fast={"fused_adam"})
    f = one.step
    gpu, cpu = steptime.micro_batch_s(f, 0, steptime.fitted())
    assert cpu > 2 * gpu  # GBS 1 without the graph: the launches set the pace, not the kernels
    # GBS 15: the GPU's work does, by a margin (its GEMMs alone once sat within 0.1% of the launches: a bound
    # that a refit could cross either way said nothing)
    gpu, cpu = steptime.micro_batch_s(E.estimate(catalog.get("111-gpt2xl-dp1-fit-80GB"), fast={"fused_adam"}).step, 0,
                                      steptime.fitted())
    assert gpu > 1.2 * cpu
    assert one.step_ms == pytest.approx(steptime.step_seconds(f) * 1e3)
    assert one.mfu == pytest.approx(one.flops_per_step / (one.step_ms / 1e3 * 989e12))
    tp = E.estimate(catalog.get("232-strong-scale-gpt2-1.2B-tp2-paper")).step
    assert tp.calls[0] == 40 * 4 and tp.comm_s[0] > 0  # 4 all-reduces per layer, 40 layers


def test_gpus_have_bandwidths():
    from megalab.core import gpus

    for g in gpus.GPUS:
        assert g.hbm_tbps and g.link_gbps, g.short


@pytest.fixture(scope="module")
def steps():
    return V.step_rows(ROOT)


@pytest.fixture(scope="module")
def rows():
    return V.validation_rows(ROOT)


@pytest.fixture(scope="module")
def table(steps, rows):
    """The validation page made from the committed records (what `plan --validate` writes), made once."""
    return V.validation_table(ROOT, rows, steps)


def _holdout(r) -> bool:
    return f"/{V.HOLDOUT_DIR.split('/', 1)[1]}/" in f"/{r['run']}"


def test_split_is_fixed_and_disjoint(steps, rows):
    for table in (steps, rows):
        sides = {}
        for r in table:
            if not _holdout(r):
                sides.setdefault(r["target"], set()).add(r["set"])
        assert all(len(v) == 1 for v in sides.values())  # every run of a target on one side
        assert {r["set"] for r in table} <= set(V.SETS) and {V.CALIBRATION, V.HELD_OUT} <= {r["set"] for r in table}
    # memory: out of the catalog = the holdout runs, and only they (no allowance is derived from them)
    assert all((r["set"] == V.OUT_OF_CATALOG) == _holdout(r) for r in rows)
    # step time: a holdout run is out of sample after the constants' freeze, else calibration (seen by a refit)
    for r in steps:
        if _holdout(r):
            assert r["set"] == (V.CALIBRATION if r["seen"] else V.OUT_OF_CATALOG)
        else:
            assert r["set"] != V.OUT_OF_CATALOG and not r["seen"]
    assert V.split("101-gpt2xl-dp1-gbs1-bf16") == V.CALIBRATION  # sha1 % 3: fixed, never re-drawn
    held = [r for r in steps if r["set"] == V.HELD_OUT]
    assert len(held) >= 10


@pytest.fixture(scope="module")
def refit(steps):
    """The step-time constants fitted on the committed records (what the page refits), fitted once."""
    return V.fit_steptime(steps)


def test_step_constants_are_fitted_on_the_calibration_set_only(steps, refit):
    assert refit == steptime.fitted()
    # the held-out rows do not move the fit: drop them and refit
    assert V.fit_steptime([r for r in steps if r["set"] == V.CALIBRATION]) == steptime.fitted()


def test_calibration_runs_since_the_freeze_wait_for_the_next_refit(steps, refit, table):
    """Today's constants are the fit of the calibration runs made before the freeze (so they re-derive from the
    records whatever runs since); the page says how many wait for the next refit and what it would give."""
    waiting = [r for r in steps if r["set"] == V.CALIBRATION and r["after_freeze"]]
    assert waiting  # the seventeenth session's trial runs of 600 and beyond the catalog, among others
    assert refit == V.fit_steptime([r for r in steps if r not in waiting]) == steptime.fitted()
    # the page (its step-time part is step_section(steps)) says so
    assert f"{len(waiting)} calibration runs made since the freeze wait for the next refit" in table


def test_estimate_page_is_up_to_date(table):
    text = table
    assert (ROOT / "results" / "estimate-vs-measured.md").read_text() == text, \
        "results/estimate-vs-measured.md is out of date: run `python -m megalab plan --validate`"
    assert "- step time, held-out, unseen: median |error|" in text and "- memory, held-out, unseen: median |error|" in text
    assert "- step time, held-out with a calibration twin" in text and "- memory, held-out with a calibration twin" in text


def test_the_line_on_todays_code_reads_only_runs_of_todays_code():
    """The run code changed in the eighteenth session (gelu_epilogue, 25ada8d, 2026-11-27 08:40 UTC), and since then
    only gelu_epilogue.py did (the nineteenth: nvmath's logger, 11:05 UTC; the twenty-first: cuda.core's device made
    current on each thread, 15:13 UTC), a file that only runs with that lever execute: the runs of today's code are
    those since 08:40 without the lever and those since 15:13 with it (goal launches and lever trials, none of them the
    estimator's held-out runs), every set and setting alike, and only they. (Read as at the commit before issue 59,
    whose changes under megalab/runtime made every run's code older until the rows are re-run.)"""
    with code_as_at_base():
        steps = V.step_rows(ROOT)
    today = {r["run"].split("/")[-1] for r in steps if r["code_today"]}
    today = {t for t in today if t < "20261129"}  # issue 63's runs came after the base: not this test's
    since = {r["run"].split("/")[-1] for r in steps if "20261129" > r["run"].split("/")[-1] >= "20261127_0841"
             and ("gelu_epilogue" not in r["fastpath"].split(",") or r["run"].split("/")[-1] >= "20261127_1514")}
    assert today == since and any("gelu_epilogue" in r["fastpath"] for r in steps if r["code_today"])
    assert not any(r["run"].startswith(V.HOLDOUT_DIR) for r in steps
                   if r["code_today"] and r["run"].split("/")[-1] < "20261129")
    line = V.code_today_line([r for r in steps if r["run"].split("/")[-1] < "20261129"])[0]
    assert f"over {len(today)} runs" in line and "signed median +" in line  # today's code beats the constants


@pytest.mark.parametrize("table", ["steps", "rows"])
def test_twins_are_counted_apart_from_the_unseen(table, request):
    """A held-out run whose model input equals a calibration run's is a twin: it appears in the twin line
    and never in the unseen one, and twins and unseen add up to the held-out set. The runs the MoE constants were
    fitted on count as seen too, with their twins."""
    rs = request.getfixturevalue(table)
    rs = [r for r in rs if r.get("status", "ok") == "ok"]
    held = [r for r in rs if r["set"] == V.HELD_OUT]
    (_, calib), (_, twin), (_, unseen), _ = V.by_set(rs)
    assert twin and unseen and len(twin) + len(unseen) == len(held)
    keys = {r["model_key"] for r in calib} | {r["model_key"] for r in rs if r.get("moe_fit")}
    assert all(r["model_key"] in keys for r in twin) and not any(r["model_key"] in keys for r in unseen)


def test_allowances_come_from_the_calibration_set(rows):
    """Every memory allowance is its calibration figure by its rule (megalab/results/allowances.py); the
    held-out and out-of-catalog runs never enter the derivation."""
    calib = [r for r in rows if r["set"] == V.CALIBRATION and r["status"] == "ok"]
    got = allowances.check(calib)
    assert set(got) | set(allowances.NOT_DERIVED) >= {"CUDA_CONTEXT_MIB", "NCCL_MIB", "NCCL_PP_MIB", "NCCL_CP_MIB",
                                                      "ALLOCATOR_SLACK", "RING_STRANDED_CHUNKS_PER_STEP",
                                                      "GRAPH_MEMORY_SHARE", "GRAPH_MEMORY_MIN_GIB",
                                                      "GRAPH_MEMORY_SHARE_CP"}
    for name, (figure, _, rule, derived, committed) in got.items():
        assert derived == pytest.approx(committed), f"{name}: calibration gives {figure:.4g} -> {derived} ({rule}), committed {committed}"
    # CP's graph share comes from calibration CP runs with the graph (604), and every such run is calibration
    assert got["GRAPH_MEMORY_SHARE_CP"][0] is not None


def test_auto_graph_room_holds_on_runs_it_was_not_derived_from(rows):
    """CUDA_GRAPH=auto's room (graphs.GRAPH_MARGIN_SHARE) comes from the calibration runs near their GPU's
    capacity; every held-out and out-of-catalog graph run near capacity needed no more (the check can fail:
    such a run that needed more would have been a wrong "on", an out-of-memory launch)."""
    rooms = {r["run"]: x for r in rows if r["set"] != V.CALIBRATION and (x := allowances.graph_room(r)) is not None}
    assert len(rooms) >= 3
    over = {run: f"{x:+.1%}" for run, x in rooms.items() if x > graphs.GRAPH_MARGIN_SHARE}
    assert not over, f"needed more room than auto keeps ({graphs.GRAPH_MARGIN_SHARE:.0%}): {over}"


def test_out_of_catalog_runs_are_judged_against_constants_frozen_before_them(steps):
    """freeze.FROZEN_AT is the commit whose steptime.py holds today's constants (a refit moves it), its
    time is that commit's, and a holdout run counts as out of sample only if it ran on code after it."""
    if git.run(ROOT, "rev-parse", "HEAD").returncode != 0:
        pytest.skip("no git here")
    assert git.run(ROOT, "merge-base", "--is-ancestor", freeze.FROZEN_AT, "HEAD").returncode == 0
    assert freeze.constants_at(freeze.FROZEN_AT, steptime.CONSTANTS) == steptime.fitted(), \
        "steptime.py's constants changed since freeze.FROZEN_AT: commit the refit, then set FROZEN_AT to that commit"
    when = git.run(ROOT, "log", "-1", "--format=%cI", freeze.FROZEN_AT).stdout.strip()
    assert stamp(when) == stamp(freeze.FROZEN_TIME)
    for r in steps:
        if r["seen"] or r["set"] == V.OUT_OF_CATALOG:
            rec = RunRecord.load(ROOT / r["run"] / "run.json")
            after = freeze.after_freeze(rec.versions.megalab_commit, rec.started, ROOT)
            assert after == (r["set"] == V.OUT_OF_CATALOG)
            # where git cannot say, the time says the same
            assert (stamp(rec.started) > stamp(freeze.FROZEN_TIME)) == after


def test_lever_terms_follow_the_levers():
    """bf16_ce shortens the loss and addmm_bias the QKV bias add: the model's step time drops with each,
    and addmm_bias changes nothing for a model without biases (Llama)."""
    gpt = catalog.get("111-gpt2xl-dp1-fit-80GB")
    base, ce, bias, both = (E.estimate(gpt, fast={"fused_adam", *k}).step_ms for k in
                            ((), ("bf16_ce",), ("addmm_bias",), ("bf16_ce", "addmm_bias")))
    assert both < ce < base and both < bias < base
    llama = catalog.get("600-llama1b-1gpu-gbs8")
    assert E.estimate(llama, fast={"addmm_bias"}).step_ms == E.estimate(llama).step_ms
    # gelu_epilogue: GeLU's passes fewer where its MLP runs (GPT-2's, one tensor-parallel rank); Llama has none
    assert (E.estimate(gpt, fast={"fused_adam", "bias_gelu", "gelu_epilogue"}).step_ms
            < E.estimate(gpt, fast={"fused_adam", "bias_gelu"}).step_ms)
    assert E.estimate(llama, fast={"gelu_epilogue"}).step_ms == E.estimate(llama).step_ms
    tp2 = catalog.get("212-weak-scale-tp2-gpt2-2.5B-paper")
    assert E.estimate(tp2, fast={"gelu_epilogue"}).step_ms == E.estimate(tp2).step_ms
    # fused_wgrad removes each weight gradient's add; compiled_rope the unfused RoPE's passes (RoPE models only)
    gpt, llama = catalog.get("112"), catalog.get("600")
    g = {"cuda_graph": True}  # under the graph the GPU's time shows (without it 600's launches set the pace)
    assert E.estimate(gpt, fast={"fused_wgrad"}, **g).step_ms < E.estimate(gpt, **g).step_ms
    assert E.estimate(llama, fast={"compiled_rope"}, **g).step_ms < E.estimate(llama, **g).step_ms
    assert E.estimate(gpt, fast={"compiled_rope"}, **g).step_ms == E.estimate(gpt, **g).step_ms  # no RoPE in GPT-2
    # clip_in_adam drops the clip's own pass, only beside fused AdamW (its kernel does the scaling)
    one = catalog.get("101")
    assert E.estimate(one, fast={"fused_adam", "clip_in_adam"}, **g).step_ms < E.estimate(one, fast={"fused_adam"}, **g).step_ms
    assert E.estimate(one, fast={"clip_in_adam"}, **g).step_ms == E.estimate(one, **g).step_ms
    # embed_wgrad drops the dense table gradient of an untied table only; sdpa_gqa the repeated K/V of GQA only
    assert E.estimate(llama, fast={"embed_wgrad"}, **g).step_ms < E.estimate(llama, **g).step_ms
    assert E.estimate(gpt, fast={"embed_wgrad"}, **g).step_ms == E.estimate(gpt, **g).step_ms  # GPT-2's table is tied
    assert E.estimate(llama, fast={"sdpa_gqa"}, **g).step_ms < E.estimate(llama, **g).step_ms
    assert E.estimate(gpt, fast={"sdpa_gqa"}, **g).step_ms == E.estimate(gpt, **g).step_ms  # no GQA in GPT-2
    # the layer's kernel levers: each shortens the step where the layer has its kernel, and nowhere else
    for lever in ("triton_norm", "dropout_add", "bias_gelu", "qkv_pack"):
        assert E.estimate(gpt, fast={lever}, **g).step_ms < E.estimate(gpt, **g).step_ms, lever
    assert E.estimate(llama, fast={"bias_gelu"}, **g).step_ms == E.estimate(llama, **g).step_ms  # SwiGLU, no biases
    assert E.estimate(llama, fast={"qkv_pack"}, **g).step_ms == E.estimate(llama, **g).step_ms  # no QKV bias
    assert E.estimate(gpt, fast={"triton_norm", "norm_residual"}, **g).step_ms < E.estimate(gpt, fast={"triton_norm"}, **g).step_ms
    assert E.estimate(gpt, fast={"norm_residual"}, **g).step_ms == E.estimate(gpt, **g).step_ms  # only beside triton_norm
    # flat_adam replaces fused AdamW's per-tensor walk and Megatron's copies; a distributed optimizer keeps them
    adam = {"fused_adam"}
    assert E.estimate(one, fast={*adam, "flat_adam"}, **g).step_ms < E.estimate(one, fast=adam, **g).step_ms
    zero2 = catalog.get("122-gpt2xl-dp2-gbs32-zero2")
    assert E.estimate(zero2, fast={*adam, "flat_adam"}, **g).step_ms == E.estimate(zero2, fast=adam, **g).step_ms
    # dropout_add keeps a seed, not the two byte masks a layer: 2 s*b*h bytes less a layer
    big = catalog.get("111")
    off, on = E.estimate(big), E.estimate(big, fast={"dropout_add"})
    assert off.per_layer_sbh - on.per_layer_sbh == 2
    assert off.stages[0].activations_bytes - on.stages[0].activations_bytes == 2 * 48 * 15 * 1024 * 1600


def test_the_estimator_has_a_term_for_each_lever_the_table_says_it_does():
    """A lever the table marks estimated moves some prediction (step time or memory) on a model it applies to; the
    others (the clip's norm and scaling, liger_norm, cudnn_sdpa) move none."""
    models = [catalog.get(t) for t in ("111", "600", "101", "520-olmoe-dp2")]

    def seen(fast):
        out = []
        for exp in models:
            est = E.estimate(exp, fast=fast, cuda_graph=True)
            out.append((round(est.step_ms, 6), round(est.peak_gib, 6)))
        return out

    for lever in levers.TABLE:
        base = set(lever.needs) | PRICED_BESIDE.get(lever.name, set())
        moved = seen(base | {lever.name}) != seen(base)
        assert moved == lever.estimated, lever.name


# expert_stack's and moe_act's terms (steptime.moe_gather_seconds, estimate.layer_activation_sbh) price what they
# change in megalab's own MoE path, beside moe_gather's dispatcher, as the MoE default runs them; beside Megatron's
# dispatcher the old per-layer lump stands for the whole layer and they move nothing.
PRICED_BESIDE = {"expert_stack": {"moe_gather"}, "moe_act": {"moe_gather"}}


def test_moe_gather_prices_the_layer_by_its_traffic_not_the_host_sync_lump():
    """Under moe_gather (EP = ETP = 1) a MoE layer loses MOE_LAYER_MS and gains its routed copies' and expert
    gradients' HBM traffic and MOE_GATHER_LAYER_MS; without the graph the host and GPU overlap in part. Without the
    lever, or with EP > 1 (where it does not run), the old pricing stands exactly."""
    exp, g = catalog.get("510-olmoe-1gpu-gbs4"), {"gpu_name": "NVIDIA H200"}
    old = E.estimate(exp, fast={"grouped_gemm"}, **g).step
    new = E.estimate(exp, fast={"grouped_gemm", "moe_gather", "expert_stack"}, **g).step
    assert old.moe_layers == (16,) and not old.moe_s and not old.host_syncs
    assert new.moe_layers == (0,) and new.moe_gather_layers == (16,) and new.moe_s[0] > 0 and new.host_syncs
    # the traffic by hand: 16 layers x 16384 tokens x top-8 copies x (12 x 1024 + 48 x 1024) bytes (torch's GeLU and
    # multiply), and 2.15e9 expert weights x (7 - 8.6) bytes (the one micro-batch writes main_grad, in place of the
    # add every weight is priced at), at the H200's 4.8 TB/s
    routed = 16 * 16384 * 8 * (12 + 48) * 1024
    grads = 16 * 64 * 2 * 1024 * 1024 * (7 - steptime.WGRAD_ADD_BYTES)
    assert new.moe_s[0] == pytest.approx((routed + grads) / 4.8e12)
    act = E.estimate(exp, fast={"grouped_gemm", "moe_gather", "expert_stack", "moe_act"}, **g).step
    assert act.moe_s[0] == pytest.approx((routed * (12 + 18) / (12 + 48) + grads) / 4.8e12)  # moe_act's two kernels
    unstacked = E.estimate(exp, fast={"grouped_gemm", "moe_gather"}, **g).step
    assert unstacked.moe_s[0] > new.moe_s[0]  # stacking copies and DDP's adds (8 B more) against one write
    # four micro-batches: the first writes, three add (12 B), so a micro-batch costs more than 510's one
    four = E.estimate(catalog.get("513-olmoe-1gpu-gbs4-mbs1"), fast={"grouped_gemm", "moe_gather", "expert_stack"},
                      **g).step
    assert four.moe_s[0] == pytest.approx((routed / 4 + grads / (7 - steptime.WGRAD_ADD_BYTES)
                                           * ((7 + 3 * 12) / 4 - steptime.WGRAD_ADD_BYTES)) / 4.8e12)
    graph = E.estimate(exp, fast={"grouped_gemm", "moe_gather", "expert_stack"}, cuda_graph=True, **g).step
    assert not graph.host_syncs and graph.kernels == (0,)
    c = {**steptime.fitted(), **steptime.moe_fitted()}
    gpu, cpu = steptime.micro_batch_s(new, 0, c)
    assert steptime.step_seconds(new) == pytest.approx(
        math.hypot(gpu, cpu) + new.optimizer_s + steptime.STEP_OVERHEAD_MS * 1e-3)
    ep = catalog.get("522-olmoe-dp2-zero2-ep2")
    assert E.estimate(ep, fast={"grouped_gemm", "moe_gather"}).step == E.estimate(ep, fast={"grouped_gemm"}).step


def test_moe_constants_are_fitted_on_their_calibration_runs_only(steps):
    """steptime.MOE_CONSTANTS are the fit of the catalog rows' runs with today's MoE levers made by
    freeze.MOE_FROZEN_TIME, and of nothing else: no run beyond the catalog, none without expert_stack."""
    fit_on = [r for r in steps if r["moe_fit"]]
    assert fit_on and all(r["moe_default"] and not _holdout(r) for r in fit_on)
    assert V.fit_moe(steps) == V.fit_moe(fit_on) == steptime.moe_fitted()


# MoE runs with today's levers whose step time is outside 10%, each with why: the goal (issue 63, goal 5) is none.
# A run landing outside it fails here until it is explained, not tuned away.
KNOWN_MOE_STEP_MISSES: dict[str, str] = {}


def test_moe_step_time_with_todays_levers_within_10_percent(steps):
    """Every MoE run with moe_gather and expert_stack made with today's code (fitted on or not) within 10% of its
    measured step; some were not fitted on, and some are beyond the catalog (another expert count or sequence)."""
    judged = [r for r in steps if r["moe_default"] and r["code_today"]]
    catalog_shape = {r["experts"] for r in judged if r["moe_fit"]}
    assert any(not r["moe_fit"] and r["experts"] not in catalog_shape for r in judged)  # the held-out test
    misses = {r["run"]: f"{r['err']:+.1%}" for r in judged if abs(r["err"]) > 0.10}
    assert set(misses) == set(KNOWN_MOE_STEP_MISSES), misses


def test_render_names_formulas_in_gib():
    text = E.render(E.estimate(catalog.get("152-gpt2xl-dp2-gbs30-zero2")))
    assert "6 + 12/2 B/param" in text and "Korthikanti" in text and "num_floating_point_operations" in text
    assert "GiB" in text and "fits" in text
    assert all(len(line) < 300 for line in text.splitlines())


# --------------------------------------------------------------------------- validation

# The runs outside 10%, each with why. The goal is none; a miss is reported (the page's bold line, `plan
# --validate`'s exit code 1), never tuned away: the constants come from the calibration set only.
KNOWN_MISSES = {
    # Out of catalog (Llama-style at micro-batch 4, 4 query groups, the distributed optimizer at DP=1), run
    # 2026-11-23 with the CUDA graph: -9.3% with GRAPH_MEMORY_SHARE 0.02, -10.2% since the twenty-first session's two
    # graph on/off pairs beyond the catalog (+0.1% each) moved the calibration median to 1.5%, 1% by its rule.
    "results/holdout/runs/20261123_120334___600-llama1b-1gpu-gbs8",
}


def test_validation_on_committed_records(rows):
    ran = [r for r in rows if r["status"] == "ok"]
    ooms = [r for r in rows if r["status"] == "oom"]
    assert len(ran) >= 20 and ooms
    misses = {r["run"]: f"{r['err']:+.1%}" for r in ran if abs(r["err"]) > 0.10}
    assert set(misses) == KNOWN_MISSES, f"outside 10%: {misses}; known: {sorted(KNOWN_MISSES)}"
    assert all(not r["ok"] for r in ran if r["run"] in KNOWN_MISSES)  # the page counts them as misses
    assert all(not r["fits"] for r in ooms), [r["run"] for r in ooms if r["fits"]]


def test_validation_table_is_generated_markdown(table):
    text = table
    assert text.startswith("# Memory estimate vs measured")
    assert "generated by" in text.splitlines()[2]
    assert "OOM, predicted" in text


# --------------------------------------------------------------------------- CLI

def test_cli_unknown_target_exits_2(capsys):
    assert main(["plan", "999-nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("megalab: unknown target") and "\n" not in err


def test_cli_plan_prints_render(capsys):
    assert main(["plan", "111", "--spec", "local", "--gpu-mem-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "79.6 GiB" in out


def test_cli_plan_reads_the_fast_path_as_the_launcher_does(monkeypatch, capsys):
    """`plan TARGET` plans the levers a launch would use: today's default keeps the bf16 logits only
    (bf16_ce), FAST=none Megatron's fp32 copy too; an unknown lever is one line and exit 2."""
    monkeypatch.delenv("FAST", raising=False)
    assert main(["plan", "111"]) == 0
    default = capsys.readouterr().out
    monkeypatch.setenv("FAST", "none")
    assert main(["plan", "111"]) == 0
    plain = capsys.readouterr().out
    assert "bf16_ce" in default and "(2 bf16 + 4 fp32)" in plain
    peak = [float(re.search(r"= ([0-9.]+) GiB", t.split("peak at")[1]).group(1)) for t in (default, plain)]
    assert peak[0] < peak[1]
    monkeypatch.setenv("FAST", "bogus")
    assert main(["plan", "111"]) == 2
    err = capsys.readouterr().err
    assert "FAST=bogus" in err and "fix" in err and len(err.strip().splitlines()) == 1


def test_cli_validate_writes_the_table(tmp_path, capsys, monkeypatch, steps, rows):
    for d in V.RECORD_DIRS:
        (tmp_path / d).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / d).symlink_to(ROOT / d)
    # the rows of the committed records are the module's (made once, from ROOT: the same folders); the CLI must ask
    # for those of its --root
    made = {"validation_rows": rows, "step_rows": steps}
    for name, made_rows in made.items():
        monkeypatch.setattr(V, name, lambda root, _rows=made_rows: _rows if Path(root) == tmp_path else
                            pytest.fail(f"the CLI read the rows of {root}, not of its --root"))
    # exit 1 while a run is outside 10% (KNOWN_MISSES): the validation says its goal is missed
    assert main(["plan", "--validate", "--root", str(tmp_path)]) == (1 if KNOWN_MISSES else 0)
    # the committed page is up to date: what the CLI writes from the committed records, byte for byte
    assert (tmp_path / "results" / "estimate-vs-measured.md").read_text(encoding="utf-8") == \
        (ROOT / "results" / "estimate-vs-measured.md").read_text(encoding="utf-8"), \
        "run `python -m megalab plan --validate` and commit"
    out = capsys.readouterr().out
    assert "within 10%" in out and "held-out, unseen runs" in out


def test_cli_no_target_exits_2(capsys):
    assert main(["plan"]) == 2


@pytest.mark.parametrize("extra, modelled", [
    ("--num-layers 12 --micro-batch-size=2 --use-distributed-optimizer", True),
    ("--seq-length 2048 --max-position-embeddings 2048 --swiglu", True),
    ("--num-layers 12 --recompute-granularity full", False),  # a flag the plan does not read
    ("--cross-entropy-loss-fusion", False),
])
def test_records_with_only_planned_extra_args_are_modelled(extra, modelled):
    rec = RunRecord.of({"target": "x", "status": "ok", "config": {"extra_args": extra}})
    assert (V.not_modelled(rec) is None) == modelled


def test_gzipped_tensorboard_events_read_as_the_plain_file(tmp_path):
    """make tables gzips a committed run's TensorBoard events (logparse.compress_logs); the estimator's
    memory diagnosis reads them unpacked, with the same figures as from the plain file."""
    import gzip

    pytest.importorskip("tensorboard")
    gz = next(iter(sorted((ROOT / "results" / "runs").glob("*/tensorboard/*tfevents*.gz"))))
    packed = V.tensorboard_mem_mb(gz.parent.parent)
    assert packed and all(v > 0 for v in packed.values())
    plain = tmp_path / "run" / "tensorboard"
    plain.mkdir(parents=True)
    (plain / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    assert V.tensorboard_mem_mb(plain.parent) == packed
