"""The catalog, the plan's flags, and Megatron's own verdict on every target (CPU only)."""
import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from megalab.core import catalog, plan, variables
from megalab.harness import launch, validate
from megalab.core.catalog import CatalogError, Experiment

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "configs" / "reference" / "anchor_8xh100.csv"


def _opts(**kw):
    if isinstance(kw.get("fast"), str):  # FAST as typed, parsed as the make variable is
        kw["fast"] = variables.parse("FAST", kw["fast"])
    return launch.Options(**({"iters": 20} | kw))


def _plan(exp, opts, impl="local", gpus=None):
    """The plan of exp under impl: Transformer Engine "present" or not on this (pretend) machine."""
    return plan.build(exp, opts, plan.Machine(gpus=gpus, te="x" if impl == "transformer_engine" else None))


def test_makefile_target_list_matches_catalog():
    out = subprocess.run(["make", "-s", "-pRrq", "-f", "Makefile"], cwd=ROOT, capture_output=True, text=True).stdout
    ids = list(catalog.catalog())
    for i in ids:
        assert re.search(rf"^{re.escape(i)}:", out, re.M), f"{i} is not a make target"


def _reference_rows(chapter):
    import csv

    return [r for r in csv.DictReader(open(REF)) if r["chapter"] == str(chapter)]


def _int(cell, default):
    return int(cell) if cell.strip() else default


@pytest.mark.parametrize("chapter,count", [(1, 13), (2, 19), (3, 10), (4, 15), (5, 9)])
def test_every_reference_row_has_its_target_with_the_same_numbers(chapter, count):
    rows = _reference_rows(chapter)
    assert len(rows) == count
    cat = catalog.catalog()
    for r in rows:
        assert r["target"] in cat, f"chapter {chapter} row {r['row']}: no target {r['target']}"
        exp = cat[r["target"]]
        assert (exp.chapter, exp.ref) == (chapter, r["row"])
        m = exp.model_cfg
        ours = dict(gbs=exp.gbs, mbs=exp.mbs, gpus=exp.gpus, dp=exp.dp, tp=exp.tp, pp=exp.pp, cp=exp.cp,
                    ep=exp.ep, etp=exp.etp, experts=exp.num_experts, topk=exp.router_topk if exp.num_experts else None,
                    sp=exp.sp, zero2=exp.zero2, recompute=exp.recompute,
                    layers_per_virtual_stage=exp.layers_per_virtual_stage,
                    layers=m["num_layers"], hidden=m["hidden_size"], heads=m["num_attention_heads"],
                    seq=m["seq_length"])
        theirs = dict(gbs=int(r["gbs"]), mbs=int(r["mbs"]), gpus=int(r["gpus"]), dp=int(r["dp"]), tp=int(r["tp"]),
                      pp=int(r["pp"]), cp=_int(r["cp"], 1), ep=_int(r["ep"], 1), etp=_int(r["etp"], 1),
                      experts=_int(r["experts"], None), topk=_int(r["topk"], None), sp=r["sp"] == "1",
                      zero2=r["zero2"] == "1", recompute=r["recompute"] or "none",
                      layers_per_virtual_stage=_int(r["layers_per_virtual_stage"], None),
                      layers=int(r["layers"]), hidden=int(r["hidden"]), heads=int(r["heads"]), seq=int(r["seq"]))
        assert ours == theirs, f"{exp.id} differs from row {r['row']}: " + ", ".join(
            f"{k} {ours[k]} vs {theirs[k]}" for k in ours if ours[k] != theirs[k])
    # every target that names a reference row (profile-* included) reproduces one that exists; a
    # target naming none is a measurement a check needs (113: ZeRO-2 at DP=1 beside 111), no row's
    rows_by_id = {r["row"] for r in rows}
    for exp in cat.values():
        if exp.chapter == chapter and (exp.ref or exp.analogue_of):
            assert (exp.ref or exp.analogue_of) in rows_by_id, f"{exp.id}: no row {exp.ref or exp.analogue_of}"


def test_analogues_run_on_the_gpus_the_rig_lends():
    for exp in catalog.catalog().values():
        if exp.analogue_of:
            assert exp.gpus in (1, 2) and exp.ref is None, exp.id


def test_chapter2_sweeps_have_their_1_and_2_gpu_points_as_reference_rows():
    # these are the chapter's 2-GPU runs of the four TP sweeps (no second name for the same run)
    cat = catalog.catalog()
    for prefix in ("211", "212", "221", "222", "231", "232", "241", "242"):
        exp = catalog.get(prefix)
        assert exp.ref and exp.gpus <= 2 and exp.tp == exp.gpus
    assert {e.id for e in cat.values() if e.analogue_of in ("C1", "C2", "C3")} >= {
        "285-gpt2-1.2B-tp2-gbs24-len2048-oom", "286-gpt2-1.2B-tp2-gbs24-len2048-sp",
        "287-gpt2-1.2B-tp2-gbs24-len2048-ra"}


def test_chapter3_cp_targets_and_their_2gpu_points():
    cat = catalog.catalog()
    # 300/301/302 need 1-2 GPUs: run as they are, no second name; the analogues cover the rest
    for prefix in ("300", "301", "302"):
        assert catalog.get(prefix).ref and catalog.get(prefix).gpus <= 2
    ch3 = [e for e in cat.values() if e.chapter == 3]
    two = {e.id for e in ch3 if e.analogue_of}
    assert two == {"312-cp2-gpt2-1.2B-gbs8-len4096-ag", "322-cp2-gpt2-1.2B-gbs8-len4096-a2a",
                   "330-dp2-gpt2-1.2B-gbs8-len32k-oom", "331-dp2-gpt2-1.2B-gbs8-len32k-ra",
                   "332-cp2-gpt2-1.2B-gbs8-len32k", "342-cp2-gpt2-1.2B-gbs8-len32k-ag",
                   "352-cp2-gpt2-1.2B-gbs8-len32k-a2a"}
    # the three modes at CP=2, at 4096 and at 32768
    for seq in (4096, 32768):
        assert {e.cp_comm for e in ch3 if e.cp == 2 and e.seq_length == seq} == {"p2p", "all_gather", "a2a"}
    # megalab's ring attention has no attention dropout: every chapter-3 row (baselines too) runs without
    for e in ch3:
        assert launch.attention_dropout(_plan(e, _opts())) == 0.0, e.id
        assert launch.cp_problem(_plan(e, _opts())) is None, e.id


def test_cp_flags_reach_megatron():
    for target, mode in (("302", "p2p"), ("312", "all_gather"), ("352", "a2a")):
        exp = catalog.get(target)
        args = validate.validate(_plan(exp, _opts()).entry_args, exp.gpus)
        assert (args.context_parallel_size, args.cp_comm_type, args.attention_dropout) == (2, [mode], 0.0)


def test_profile_targets_turn_on_megatrons_timers():
    for target in ("profile-282", "profile-283", "profile-286", "profile-287"):
        plain, variant = launch.resolve(target)  # the chapter's rows, profiled: one catalog entry each
        assert variant == "profile" and plain.id.startswith(target.split("-", 1)[1] + "-")
        exp, _ = launch.profiled(plain, _opts())
        assert exp.model_copy(update={"id": plain.id, "timing_log_level": 0}) == plain
        p = _plan(exp, _opts())
        assert "--timing-log-level 2" in p.command
        assert validate.validate(p.entry_args, exp.gpus).timing_log_level == 2
    assert "--timing-log-level" not in _plan(catalog.get("282"), _opts()).command


def test_virtual_stages_are_counted_both_ways():
    exp = catalog.get("442")
    assert (exp.layers_per_virtual_stage, exp.virtual_stages) == (9, 2)
    assert catalog.get("498").virtual_stages == 9 and catalog.get("481").virtual_stages == 18
    for e in catalog.catalog().values():
        if e.layers_per_virtual_stage:
            assert f"{e.layers_per_virtual_stage} layer" in e.about and f"{e.virtual_stages} virtual stages" in e.about


@pytest.mark.parametrize("target", list(catalog.catalog()))
def test_every_target_dry_runs_and_megatron_accepts_it(target):
    exp = catalog.get(target)
    exp.validate()
    p = _plan(exp, _opts())
    cmd = p.command
    assert cmd.startswith("torchrun ") and f"--nproc_per_node {exp.gpus}" in cmd
    args = validate.validate(p.entry_args, exp.gpus)
    assert args.data_parallel_size == exp.dp
    assert args.global_batch_size == exp.gbs and args.micro_batch_size == exp.mbs
    assert args.use_distributed_optimizer == exp.zero2
    assert args.transformer_impl == "local" and args.spec == ["megalab.runtime.spec", "megalab_layer_spec"]
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (exp.tp, exp.pp)
    assert args.sequence_parallel == exp.sp
    assert args.virtual_pipeline_model_parallel_size == exp.virtual_stages
    assert (args.num_experts, args.expert_model_parallel_size) == (exp.num_experts, exp.ep)
    if exp.num_experts:
        assert (args.expert_tensor_parallel_size, args.moe_router_topk) == (exp.etp, exp.router_topk)
        # Megatron's TE-only flags stay off on the local path; grouped GEMM is megalab's own
        # substitute (MEGALAB_FAST=...,grouped_gemm, read by megalab/runtime/spec.py)
        assert not args.moe_grouped_gemm and not args.moe_permute_fusion
        assert ("grouped_gemm" in p.env["MEGALAB_FAST"].split(",")) == plan.wants_grouped_gemm(exp)
    # The model config Megatron builds next (TransformerConfig.__post_init__ has checks of its own,
    # e.g. MoE biases only with ETP=1, fused permutation only with TE).
    from megatron.training.argument_utils import gpt_config_from_args

    gpt_config_from_args(args)


def test_dry_run_128_shows_8_processes_distributed_optimizer_and_preflight():
    out = subprocess.run(["make", "-s", "128-gpt2xl-dp8-gbs128-zero2"], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    assert "--nproc_per_node 8" in out.stdout and "--use-distributed-optimizer" in out.stdout
    assert "needs 8" in out.stdout and "DP=8" in out.stdout and "accepts the flags with WORLD_SIZE=8" in out.stdout
    assert "verdict cached" not in out.stdout  # Megatron's check of its own, in a fresh process (not warmed)


def test_prefix_lookup_and_unknown_target():
    assert catalog.get("101").id == "101-gpt2xl-dp1-gbs1-bf16"
    with pytest.raises(CatalogError, match="unknown target '999'.*make list"):
        catalog.get("999")


def _bad(**kw):
    base = dict(id="x", chapter=1, about="", model="gpt2-xl", gpus=2, gbs=32, mbs=16)
    return Experiment(**(base | kw))


@pytest.mark.parametrize("kw,msg", [
    (dict(gbs=30, mbs=16), "not divisible by micro batch x DP"),
    (dict(gpus=3, tp=2), "not divisible by TP x PP x CP"),
    (dict(gpus=2, tp=2, gbs=16), "25 attention heads cannot be split over TP=2"),
    (dict(gpus=2, pp=2, layers_per_virtual_stage=5, gbs=16), "virtual stages"),
    (dict(sp=True), "sequence parallel needs TP >= 2"),
    (dict(recompute="sometimes"), "recompute"),
    (dict(model="gpt2-large", gpus=8, gbs=8, mbs=8, cp=8, cp_comm="a2a"), "a2a gives each of TP x CP = 8 GPUs whole heads"),
    (dict(model="gpt2-large", cp=2, cp_comm="ring"), "not one of Megatron's --cp-comm-type"),
    (dict(model="gpt2-large", gpus=3, gbs=8, mbs=8, cp=3), "must divide into 2 x CP = 6 chunks"),
])
def test_layouts_megatron_would_reject_fail_early_with_a_fix(kw, msg):
    with pytest.raises(CatalogError, match=msg) as e:
        _bad(**kw).validate()
    assert "fix" in str(e.value) and "\n" not in str(e.value)


def test_megatron_rejection_is_reported_in_one_line(monkeypatch):
    exp = _bad(gbs=32, mbs=16, extra_args=("--no-such-flag",))
    with pytest.raises(launch.LaunchError, match="target x: its extra_args flag --no-such-flag is not a Megatron "
                                                 "flag.*fix: correct it in configs/experiments/") as e:
        launch.megatron_check(_plan(exp, _opts()))
    assert "\n" not in str(e.value)
    # a bad value: from the catalog, or from EXTRA_ARGS (the same run without them passes)
    exp = _bad(gbs=32, mbs=16, extra_args=("--seed", "x"))
    with pytest.raises(launch.LaunchError, match=r"^Megatron rejects x on 2 GPUs: argument --seed: invalid int "
                                                 r"value: 'x'; fix the layout in configs/experiments/$"):
        launch.megatron_check(_plan(exp, _opts()))
    with pytest.raises(launch.LaunchError, match=r"^EXTRA_ARGS: Megatron rejects x with --seed x: argument --seed: "
                                                 r"invalid int value: 'x'; fix: change or drop those EXTRA_ARGS$"):
        launch.megatron_check(_plan(exp.model_copy(update={"extra_args": ()}), _opts(extra_args=("--seed", "x"))))


def test_moe_preset_becomes_flags_and_te_only_ones_are_substituted_or_dropped_without_te():
    exp = catalog.get("522")
    local = _plan(exp, _opts(), "local").command
    te = _plan(exp, _opts(), "transformer_engine").command
    for flag in ("--num-experts 64", "--moe-router-topk 8", "--expert-model-parallel-size 2",
                 "--expert-tensor-parallel-size 1", "--moe-token-dispatcher-type alltoall",
                 "--moe-ffn-hidden-size 1024", "--moe-router-force-load-balancing", "--disable-bias-linear"):
        assert flag in local and flag in te
    assert "--moe-grouped-gemm" not in local and "--moe-permute-fusion" not in local
    assert "--moe-grouped-gemm --moe-permute-fusion" in te
    # without TE: grouped GEMM by megalab's GroupedMLP (the grouped_gemm lever), permute fusion dropped
    assert dict(_plan(exp, _opts(), "local").substituted_flags) == {"--moe-grouped-gemm": "grouped_gemm"}
    assert list(_plan(exp, _opts(), "local").dropped_flags) == ["--moe-permute-fusion"]
    assert list(_plan(exp, _opts(), "transformer_engine").dropped_flags) == [] and dict(_plan(exp, _opts(), "transformer_engine").substituted_flags) == {}
    assert list(_plan(catalog.get("212"), _opts(), "local").dropped_flags) == []
    assert "--disable-bias-linear" not in _plan(catalog.get("212"), _opts()).command
    lines = launch.preflight(_plan(exp, _opts(), gpus=2))
    assert any(l.startswith("substitute --moe-grouped-gemm") for l in lines)
    assert any(l.startswith("dropped    --moe-permute-fusion: need Transformer Engine") for l in lines)
    # FAST=none (or SPEC=local): no substitute, both dropped, SequentialMLP experts
    assert list(_plan(exp, _opts(fast="none"), "local").dropped_flags) == ["--moe-grouped-gemm", "--moe-permute-fusion"]
    assert any(l.startswith("dropped    --moe-grouped-gemm --moe-permute-fusion")
               for l in launch.preflight(_plan(exp, _opts(fast="none"), gpus=2)))


def test_a_run_records_the_dropped_and_substituted_flags(monkeypatch, tmp_path, capsys):
    import json
    import os

    from megalab.harness import monitor

    monkeypatch.setattr(monitor, "gpu_inventory",
                        lambda: {"count": 2, "names": ["NVIDIA H200"], "memory_mib": [143771], "driver": "580"})
    # the training run itself: a `torchrun` first on PATH (RUN_DIR/launch.sh execs it) that prints one line
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").write_text("#!/bin/sh\necho 'megalab: stand-in for torchrun'\n")
    (tmp_path / "bin" / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv("DRY_RUN", raising=False)
    launch.run("522", launch.Options(iters=2, outdir=tmp_path / "out"))
    rec = json.load(open(next((tmp_path / "out").glob("*/run.json"))))
    assert rec["config"]["dropped_flags"] == ["--moe-permute-fusion"]
    assert rec["config"]["substituted_flags"] == {"--moe-grouped-gemm": "grouped_gemm"}
    assert "grouped_gemm" in rec["config"]["fastpath"]
    assert "--moe-grouped-gemm" not in rec["command"]
    out = capsys.readouterr().out
    assert "substitute --moe-grouped-gemm" in out and "dropped    --moe-permute-fusion" in out


@pytest.mark.parametrize("kw,msg", [
    (dict(model="olmoe-like", gbs=32, mbs=16), "sets no num_experts"),
    (dict(ep=2), "needs a MoE model"),
    (dict(model="olmoe-like", num_experts=63, ep=2, gbs=32, mbs=16), "63 experts cannot be split over EP=2"),
    (dict(model="olmoe-like", num_experts=64, topk=80, gbs=32, mbs=16), "top-k 80"),
    (dict(model="olmoe-like", num_experts=64, tp=2, gbs=16, mbs=16), "need sequence parallelism"),
    (dict(model="gpt2-large", gpus=2, pp=2, gbs=3, mbs=1, layers_per_virtual_stage=9), "multiple of PP=2, got 3"),
])
def test_moe_and_virtual_pipeline_layouts_megatron_would_reject_fail_early(kw, msg):
    with pytest.raises(CatalogError, match=msg) as e:
        _bad(**kw).validate()
    assert "fix" in str(e.value) and "\n" not in str(e.value)


def test_a_number_out_of_its_range_is_no_experiment():
    """timing_log_level is Megatron's 0, 1 or 2, a size at least 1: the model refuses others as it is made (a catalog
    entry's is one CatalogError line naming the file: tests/test_doors.py)."""
    from pydantic import ValidationError

    for kw in (dict(timing_log_level=3), dict(mbs=0), dict(gpus="2")):
        with pytest.raises(ValidationError):
            _bad(**kw)


def test_the_flags_megalab_reads_back_are_read_as_megatrons_parser_reads_them():
    """core/flags.py reads EXTRA_ARGS' model and layout flags with a parser of its own (Megatron may be
    absent): each must be Megatron's flag, a value of the same type or a switch as Megatron has it."""
    from megalab.core import flags

    actions = {o: a for a in validate.parser()._actions for o in a.option_strings}
    for flag, (_, kind) in {**flags.MODEL_FLAGS, **flags.LAYOUT_FLAGS, **flags.CHECKED_FLAGS}.items():
        action = actions[flag]
        assert (action.nargs == 0) if kind is None else (action.type is kind and action.nargs is None), flag


def test_clip_in_adam_without_fused_adam_is_refused_with_the_fix():
    """clip_in_adam only works through fused AdamW's kernel: asked for alone, the launch stops and says so."""
    exp = catalog.get("101")
    with pytest.raises(launch.LaunchError, match="clip_in_adam.*fix: add fused_adam"):
        _plan(exp, _opts(fast="foreach_norm,clip_in_adam"))
    assert "clip_in_adam" in _plan(exp, _opts(fast="fused_adam,clip_in_adam")).env["MEGALAB_FAST"].split(",")
