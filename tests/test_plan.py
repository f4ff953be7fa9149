"""The run plan (megalab/core/plan.py) and the make-variable table (variables.py).

scripts/train_gpt.sh is the readable view of the flags; the launcher runs plan.argv. These tests run
the wrapper for every catalog target, and for the variables that change flags, and require its
argv to equal plan.argv item for item, so the two cannot drift.
"""
import dataclasses
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from megalab.core import catalog, plan, variables
from megalab.harness import launch, slurm
from megalab.core.variables import Options

ROOT = Path(__file__).resolve().parent.parent
TE = plan.Machine(te="2.1")


def _wrapper_argv(p: plan.RunPlan) -> list[str]:
    """The wrapper's own dry-run command for this plan's environment, as argv items."""
    env = {"PATH": os.environ["PATH"], **plan.wrapper_env(p), "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(plan.WRAPPER)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return shlex.split(out.stdout)


@pytest.mark.parametrize("target", list(catalog.catalog()))
def test_the_wrapper_builds_the_plans_argv_for_every_target(target):
    p = plan.build(catalog.get(target), Options(iters=20))
    assert _wrapper_argv(p) == p.argv


def _opts(**kw):
    return dataclasses.replace(Options(iters=20), **kw)


CASES = {
    "save+load": ("101", _opts(save=True, save_interval=7, load=Path("/ck/x y")), plan.Machine(), "/o/run 1"),
    "save at the end": ("101", _opts(save=True), plan.Machine(), "/o/run1"),
    "profile": ("282", dataclasses.replace(_opts(profile=True, iters=8)), plan.Machine(), None),
    "wandb": ("122", _opts(wandb=True, wandb_entity="team", wandb_project="p q"), plan.Machine(), None),
    "data, HF tokenizer": ("101", _opts(data="/d/owt_text_document", tokenizer_model="/d/tok", split="98,2,0"),
                           plan.Machine(), None),
    "data, GPT-2 BPE": ("101", _opts(data="/d/x", vocab_file="/v.json", merge_file="/m.txt"), plan.Machine(), None),
    "cp": ("302", _opts(), plan.Machine(), None),
    "cp a2a, TE": ("352", _opts(), TE, None),
    "moe, local": ("522", _opts(), plan.Machine(), None),
    "moe, TE": ("522", _opts(), TE, None),
    "moe, expert TP": ("531", _opts(fast="none"), plan.Machine(), None),
    "vpp": ("442", _opts(), plan.Machine(), None),
    "cuda graph": ("101", _opts(cuda_graph="1"), plan.Machine(), None),
    "spec local": ("111", _opts(spec="local"), plan.Machine(), None),
    "two nodes": ("128", _opts(nnodes=2, node_rank=1, master_addr="n0", master_port=29500), plan.Machine(), None),
    "extra args, quoted": ("101", _opts(extra_args="--seed 7 --data-cache-path '/a b' \"c'd\" '$(x)' '`y`'"),
                           plan.Machine(), None),
    "megatron-lm": ("101", _opts(megatron_lm="/src/Megatron-LM"), plan.Machine(), None),
    "fused wgrad": ("111", _opts(fast="fused_adam,fused_wgrad"), plan.Machine(), None),
    "fused wgrad, spec local": ("111", _opts(fast="fused_wgrad", spec="local"), plan.Machine(), None),
    "exit early": ("001", _opts(exit_interval=10, save=True, save_interval=10), plan.Machine(), "/o/r"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_wrapper_builds_the_plans_argv_for_each_variable(case):
    target, opts, machine, run_dir = CASES[case]
    exp = catalog.get(target)
    if opts.profile:
        exp, opts = launch.profiled(exp, opts)
    p = plan.build(exp, opts, machine, run_dir=Path(run_dir) if run_dir else None)
    assert _wrapper_argv(p) == p.argv


@pytest.mark.parametrize("recompute", ["selective", "full-uniform-1", "full-block-12"])
def test_recompute_flags_in_every_form(recompute):
    p = plan.build(dataclasses.replace(catalog.get("101"), recompute=recompute), _opts())
    assert _wrapper_argv(p) == p.argv and "--recompute-granularity" in p.argv


def test_the_wrapper_runs_torchrun_with_the_plans_argv_and_environment(tmp_path):
    """Not a dry run: a fake torchrun on PATH records what it was given, exactly (NUL-separated)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {tmp_path}/argv\nenv -0 > {tmp_path}/env\n")
    (bin_dir / "torchrun").chmod(0o755)
    environ = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": "/x"}
    p = plan.build(catalog.get("122"), _opts(gpu_mem_gb="80", wandb=True, extra_args="--seed 7"),
                   run_dir=tmp_path / "run", environ=environ)
    env = {**environ, **plan.wrapper_env(p)}
    subprocess.run(["bash", str(plan.WRAPPER)], env=env, check=True)
    assert (tmp_path / "argv").read_text().split("\0")[:-1] == p.argv[1:]
    child = dict(kv.split("=", 1) for kv in (tmp_path / "env").read_text().split("\0") if "=" in kv)
    for k, v in p.env.items():
        if k != "MEGALAB_GPU_MEM_GB":  # the launcher's own (the wrapper knows no cap)
            assert child.get(k) == v, k


def test_a_plan_is_frozen_and_its_intent_is_json():
    p = plan.build(catalog.get("522"), _opts())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.impl = "transformer_engine"
    d = json.loads(json.dumps(p.to_dict()))
    assert d["argv"] == p.argv and d["fastpath"].endswith("grouped_gemm")
    assert d["substituted_flags"] == {"--moe-grouped-gemm": "grouped_gemm"}
    assert d["dropped_flags"] == ["--moe-permute-fusion"] and d["run_dir"] is None
    assert list(d["groups"]) == list(plan.GROUPS) and p.entry_args == p.argv[p.argv.index(p.entry) + 1:]
    assert p.env["NCCL_NVLS_ENABLE"] == "0" and p.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_levers_are_computed_once_per_launch(monkeypatch, capsys):
    calls = []
    real = plan.fast_levers
    monkeypatch.setattr(plan, "fast_levers", lambda *a: calls.append(a) or real(*a))
    launch.launch(catalog.get("522"), _opts(dry_run=True))
    assert len(calls) == 1


@pytest.mark.parametrize("target,value,on,why", [
    ("101-gpt2xl-dp1-gbs1-bf16", "1", True, "CUDA_GRAPH=1"),
    ("101-gpt2xl-dp1-gbs1-bf16", "0", False, "CUDA_GRAPH=0"),
    ("101-gpt2xl-dp1-gbs1-bf16", "auto", True, "auto: predicted"),  # 33 GiB on an 80 GB card: room
    ("101-gpt2xl-dp1-gbs1-bf16", "", True, "auto: predicted"),      # auto is the default
    ("522-olmoe-dp2-zero2-ep2", "auto", False, "auto: MoE token routing"),
    ("003-gpt2large-tp2-gbs64", "auto", False, "+ graph"),         # no room for the graph at 80 GB
])
def test_cuda_graph_is_auto_1_or_0_with_a_reason(target, value, on, why):
    opts = Options.from_env({"CUDA_GRAPH": value})
    p = plan.build(catalog.get(target), opts, plan.Machine(gpus=2, te=None, gpu_memory_gib=79.6))
    assert p.cuda_graph is on and ("--cuda-graph-impl" in p.argv) is on
    assert why in p.cuda_graph_reason and p.to_dict()["cuda_graph_reason"] == p.cuda_graph_reason


def test_a_bad_choice_or_extra_args_is_one_line():
    with pytest.raises(launch.LaunchError, match="CUDA_GRAPH=maybe is not one of auto, 1, 0; fix"):
        Options.from_env({"CUDA_GRAPH": "maybe"})
    with pytest.raises(launch.LaunchError, match="EXTRA_ARGS=.* is not a shell word list.*fix"):
        plan.build(catalog.get("101"), _opts(extra_args="--seed '7"))


def test_options_come_from_the_table():
    fields = {f.name for f in dataclasses.fields(Options)}
    assert {v.field for v in variables.VARIABLES if v.field} <= fields
    opts = Options.from_env({"ITERS": "20", "SAVE": "yes", "LOAD": "/ck", "DATA": "/d/x", "WANDB_ENTITY": "t"})
    assert (opts.iters, opts.save, opts.load, opts.data, opts.wandb_entity) == (20, True, Path("/ck"), "/d/x", "t")
    assert Options.from_env({}) == Options()
    assert slurm.FORWARDED == tuple(v.name for v in variables.VARIABLES if v.forwarded)


def test_the_makefile_exports_exactly_the_table():
    text = (ROOT / "Makefile").read_text()
    line = next(l for l in text.splitlines() if l.startswith("override VARIABLES := "))
    assert line.split()[3:] == [v.name for v in variables.VARIABLES]
    assert "\nexport $(foreach v,$(VARIABLES)," in text


def test_make_help_lists_every_variable():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    for v in variables.VARIABLES:
        assert re.search(rf"^  {v.name} +\S", out, re.M), v.name


def test_show_command_and_the_dry_run_print_the_plans_command():
    # a fixed port: without MASTER_PORT each plan picks a free one (test_monitor covers that)
    p = plan.build(catalog.get("101"), Options(master_port=29517))
    env = {k: v for k, v in os.environ.items() if k not in {v.name for v in variables.VARIABLES}}
    env["MASTER_PORT"] = "29517"
    out = subprocess.run(["make", "-s", "show-command", "ID=101"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == p.command
    dry = subprocess.run(["make", "-s", "101"], cwd=ROOT, capture_output=True, text=True, env={**env, "DRY_RUN": "1"})
    assert dry.returncode == 0 and dry.stdout.strip().splitlines()[-1] == p.command


def test_placing_a_plan_in_its_run_dir_decides_nothing_again(tmp_path, monkeypatch):
    p = plan.build(catalog.get("101"), Options(master_port=29517))
    calls = []
    monkeypatch.setattr(plan, "cuda_graph", lambda *a: calls.append(a) or (True, "x"))
    placed = p.placed(tmp_path)
    assert not calls and placed.run_dir == tmp_path and placed.cuda_graph == p.cuda_graph
    # and it is what building with the run dir gives
    assert placed.argv == plan.build(catalog.get("101"), Options(master_port=29517), run_dir=tmp_path).argv


def test_extra_args_batch_and_layout_flags_are_planned():
    """--micro-batch-size in EXTRA_ARGS reaches Megatron last (it wins), so the plan, its checks and the
    estimator use it too; a layout the target's GPUs cannot hold is a one-line error."""
    p = plan.build(catalog.get("600"), _opts(extra_args="--micro-batch-size=2 --use-distributed-optimizer"))
    assert (p.exp.mbs, p.exp.grad_accum, p.exp.zero2) == (2, 4, True)
    assert p.argv[-2:] == ["--micro-batch-size=2", "--use-distributed-optimizer"]
    with pytest.raises(launch.LaunchError, match=r"^EXTRA_ARGS: .*TP x PP x CP = 2; fix"):
        plan.build(catalog.get("600"), _opts(extra_args="--tensor-model-parallel-size 2"))
    with pytest.raises(launch.LaunchError, match=r"--global-batch-size needs an int"):
        plan.build(catalog.get("600"), _opts(extra_args="--global-batch-size"))


def test_fused_wgrad_turns_megatrons_gradient_accumulation_fusion_on():
    """--no-gradient-accumulation-fusion goes exactly when megalab's stand-in for apex's kernel is installed."""
    default = plan.build(catalog.get("111"), _opts())
    fused = plan.build(catalog.get("111"), _opts(fast="fused_adam,foreach_norm,foreach_scale,fused_wgrad"))
    assert "--no-gradient-accumulation-fusion" in default.argv and "fused_wgrad" not in default.fast
    assert "--no-gradient-accumulation-fusion" not in fused.argv and fused.env["MEGALAB_FAST"].endswith("fused_wgrad")
    te = plan.build(catalog.get("111"), _opts(fast="fused_wgrad"), TE)  # TE brings its own: no levers at all
    assert te.fast == () and "--no-gradient-accumulation-fusion" not in te.argv


def test_megatron_lms_own_entry_gets_no_patch_levers():
    """Megatron-LM's pretrain_gpt.py never calls fastpath.apply: the plan must not claim (or depend on) patches;
    the spec's own levers stay, as megalab's spec reads them from MEGALAB_FAST."""
    p = plan.build(catalog.get("111"), _opts(megatron_lm="/src/Megatron-LM", fast="all"))
    assert p.fast == () and "--no-gradient-accumulation-fusion" in p.argv
    moe = plan.build(catalog.get("522"), _opts(megatron_lm="/src/Megatron-LM"))
    assert moe.fast == ("grouped_gemm",)
