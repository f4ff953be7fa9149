"""The run plan (megalab/core/plan.py), its launch script (launchscript.py) and the make-variable table
(variables.py).

The launcher writes the plan as RUN_DIR/launch.sh and runs exactly that file. These tests run the
script for every catalog target, and for the variables that change flags, with a fake torchrun on
PATH that records its argv (NUL-separated), and require it to be the plan's argv item for item.
"""
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from megalab.core import catalog, flags, plan, variables
from megalab.harness import launch, slurm
from megalab.core.variables import Options

ROOT = Path(__file__).resolve().parent.parent
TE = plan.Machine(te="2.1")


@pytest.fixture(scope="module")
def fake_torchrun(tmp_path_factory):
    """A `torchrun` that writes its argv (NUL-separated) and environment to files beside it."""
    d = tmp_path_factory.mktemp("fake")
    (d / "torchrun").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {d}/argv\nenv -0 > {d}/env\n")
    (d / "torchrun").chmod(0o755)
    return d


def _run_script(p: plan.RunPlan, fake: Path, environ=None) -> tuple[list[str], dict[str, str]]:
    """Run the plan's script as the launcher does (bash FILE) with the fake torchrun: (its argv, its env)."""
    script = fake / "launch.sh"
    script.write_text(p.script)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # valid bash
    for f in ("argv", "env"):
        (fake / f).unlink(missing_ok=True)
    env = {**(environ or {"PATH": os.environ["PATH"]})}
    env["PATH"] = f"{fake}:{env['PATH']}"
    subprocess.run(["bash", str(script)], env=env, check=True)
    argv = (fake / "argv").read_text().split("\0")[:-1]
    child = dict(kv.split("=", 1) for kv in (fake / "env").read_text().split("\0") if "=" in kv)
    return argv, child


@pytest.mark.parametrize("target", list(catalog.catalog()))
def test_the_launch_script_runs_the_plans_argv_for_every_target(target, fake_torchrun):
    p = plan.build(catalog.get(target), Options(iters=20))
    argv, _ = _run_script(p, fake_torchrun)
    assert ["torchrun", *argv] == p.argv


def _opts(**kw):
    if isinstance(kw.get("extra_args"), str):  # the text a user types, split as the make variable is
        kw["extra_args"] = variables.parse("EXTRA_ARGS", kw["extra_args"])
    if isinstance(kw.get("fast"), str):  # FAST as typed, parsed as the make variable is
        kw["fast"] = variables.parse("FAST", kw["fast"])
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
    "gpu cap": ("122", _opts(gpu_mem_gb=80.0), plan.Machine(), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_launch_script_runs_the_plans_argv_for_each_variable(case, fake_torchrun):
    target, opts, machine, run_dir = CASES[case]
    exp = catalog.get(target)
    if opts.profile:
        exp, opts = launch.profiled(exp, opts)
    p = plan.build(exp, opts, machine, run_dir=Path(run_dir) if run_dir else None)
    argv, _ = _run_script(p, fake_torchrun)
    assert ["torchrun", *argv] == p.argv


@pytest.mark.parametrize("recompute", ["selective", "full-uniform-1", "full-block-12"])
def test_recompute_flags_in_every_form(recompute, fake_torchrun):
    p = plan.build(catalog.get("101").model_copy(update={"recompute": recompute}), _opts())
    assert _run_script(p, fake_torchrun)[0] == p.argv[1:] and "--recompute-granularity" in p.argv


def test_the_launch_script_exports_the_plans_child_environment(tmp_path, fake_torchrun):
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": "/x", "NCCL_NVLS_ENABLE": "1"}
    p = plan.build(catalog.get("122"), _opts(gpu_mem_gb=80.0, wandb=True, extra_args="--seed 7"),
                   run_dir=tmp_path / "run", environ=environ)
    argv, child = _run_script(p, fake_torchrun, environ)
    assert argv == p.argv[1:]
    for k, v in p.env.items():
        assert child.get(k) == v, k
    assert child["MEGALAB_GPU_MEM_GB"] == "80"  # what the entry point's memcap.py parses
    assert child["NCCL_NVLS_ENABLE"] == "1"  # the user's own value of a default wins
    assert child["PYTHONPATH"].endswith(":/x")


def test_the_launch_script_reads_like_megatrons_examples():
    p = plan.build(catalog.get("522"), _opts(save=True), run_dir=Path("/o/run1"))
    text = p.script
    assert text.startswith("#!/usr/bin/env bash\n# megalab 522-olmoe-dp2-zero2-ep2: ") and "set -euo pipefail" in text
    for g in flags.GROUPS:  # one array per group, each under a comment saying why
        assert re.search(rf"^# .*\n{g}_ARGS=\(", text, re.M), g
    assert re.search(r"^exec torchrun \"\$\{DISTRIBUTED_ARGS\[@\]\}\" \S+/pretrain_gpt\.py \\$", text, re.M)
    assert "`bash /o/run1/launch.sh`" in text.replace("\n# ", " ")
    # bash and torchrun only: comments, exports, arrays of quoted items, and the one command
    lines = r"#.*|set -euo pipefail|export [A-Z_]+=\S+|[A-Z]+_ARGS=\(\)?|    .+|\)|exec torchrun .+|"
    assert all(re.fullmatch(lines, line) for line in text.splitlines()[1:]), text


def test_a_plan_is_frozen_and_its_intent_is_json():
    p = plan.build(catalog.get("522"), _opts())
    with pytest.raises(ValidationError):
        p.impl = "transformer_engine"
    d = json.loads(p.intent().model_dump_json())
    assert d["argv"] == p.argv and "grouped_gemm" in d["fastpath"]
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
    ("522-olmoe-dp2-zero2-ep2", "auto", False, "auto: Megatron's MoE token dispatcher synchronises"),
    ("521-olmoe-dp2-zero2", "auto", False, "auto: with the moe_gather lever MoE captures and replays on one GPU"),
    ("003-gpt2large-tp2-gbs64", "auto", False, "for the graph"),   # no room for the graph at 80 GB
])
def test_cuda_graph_is_auto_1_or_0_with_a_reason(target, value, on, why):
    opts = Options.from_env({"CUDA_GRAPH": value})
    p = plan.build(catalog.get(target), opts, plan.Machine(gpus=2, te=None, gpu_memory_gib=79.6))
    assert p.cuda_graph is on and ("--cuda-graph-impl" in p.argv) is on
    assert why in p.cuda_graph_reason and p.intent().cuda_graph_reason == p.cuda_graph_reason


def test_a_bad_choice_or_extra_args_is_one_line():
    with pytest.raises(launch.LaunchError, match="CUDA_GRAPH=maybe: not one of auto, 1, 0; fix"):
        Options.from_env({"CUDA_GRAPH": "maybe"})
    with pytest.raises(launch.LaunchError, match="EXTRA_ARGS=--seed '7: not a shell word list.*fix"):
        Options.from_env({"EXTRA_ARGS": "--seed '7"})


@pytest.mark.parametrize("env,message", [
    ({"ITERS": "0"}, "ITERS=0: must be at least 1; fix: a whole number, e.g. ITERS=100"),
    ({"ITERS": "-1"}, "ITERS=-1: must be at least 1; fix"),
    ({"ITERS": "many"}, "ITERS=many: not a number; fix"),
    ({"WARMUP": "-1"}, "WARMUP=-1: must be at least 0; fix"),
    ({"WARMUP": "20", "ITERS": "20"}, "WARMUP=20: must be below ITERS=20"),
    ({"GPU_MEM_GB": "-5"}, "GPU_MEM_GB=-5: must be above 0; fix: a number, e.g. GPU_MEM_GB=80"),
    ({"GPU_MEM_GB": "nan"}, "GPU_MEM_GB=nan: not a finite number; fix"),
    ({"GPU_MEM_GB": "inf"}, "GPU_MEM_GB=inf: not a finite number; fix"),
    ({"GPU_MEM_GB": "abc"}, "GPU_MEM_GB=abc: not a number; fix"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: must be at most 65535; fix"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT=0: must be at least 1; fix"),
    ({"NNODES": "0"}, "NNODES=0: must be at least 1; fix"),
    ({"NODE_RANK": "-1"}, "NODE_RANK=-1: must be at least 0; fix"),
    ({"NODE_RANK": "2", "NNODES": "2"}, "NODE_RANK=2: must be below NNODES=2"),
    ({"SAVE_INTERVAL": "0"}, "SAVE_INTERVAL=0: must be at least 1; fix"),
    ({"WATCHDOG_SILENT_S": "nan"}, "WATCHDOG_SILENT_S=nan: not a finite number; fix"),
    ({"WATCHDOG_STARTUP_S": "0"}, "WATCHDOG_STARTUP_S=0: must be above 0; fix"),
    ({"EXIT_GRACE_S": "-1"}, "EXIT_GRACE_S=-1: must be above 0; fix"),
    ({"GPUS_PER_NODE": "0"}, "GPUS_PER_NODE=0: must be at least 1; fix"),
    ({"DRY_RUN": "maybe"}, "DRY_RUN=maybe: not a yes/no value"),
    ({"SPEC": "te"}, "SPEC=te: not one of megalab, local; fix: e.g. SPEC=megalab"),
    ({"ITERS": "1\n2"}, "ITERS='1\\n2': not a number; fix"),
])
def test_a_bad_variable_value_is_one_line_naming_it_the_value_and_the_fix(env, message):
    with pytest.raises(launch.LaunchError) as e:
        Options.from_env(env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value) and "; fix: " in str(e.value)


def test_bad_values_stop_make_before_anything_runs(tmp_path):
    """issue 31: these passed with exit 0, or ended in a traceback inside the plan."""
    env = {k: v for k, v in os.environ.items() if k not in variables.BY_NAME}
    for var, bad in (("GPU_MEM_GB", "abc"), ("NNODES", "0"), ("ITERS", "0"), ("WATCHDOG_SILENT_S", "nan")):
        out = subprocess.run(["make", "-s", "101"], cwd=ROOT, capture_output=True, text=True,
                             env={**env, "DRY_RUN": "1", "OUTDIR": str(tmp_path), var: bad})
        assert out.returncode == 2 and out.stdout == "", (var, out.stdout)
        ours = [line for line in out.stderr.splitlines() if not line.startswith("make: ")]  # make adds its own
        assert len(ours) == 1 and ours[0].startswith(f"megalab: {var}={bad}: ") and "; fix: " in ours[0], out.stderr


def test_a_flag_variable_reads_yes_and_no_words():
    o = Options.from_env({"SAVE": "yes", "VERBOSE": "On", "WANDB": "0", "DRY_RUN": "false"})
    assert (o.save, o.verbose, o.wandb, o.dry_run) == (True, True, False, False)


def test_extra_args_are_split_once_at_the_edge():
    o = Options.from_env({"EXTRA_ARGS": "--seed 7 --data-cache-path '/a b'", "GPU_MEM_GB": "80"})
    assert o.extra_args == ("--seed", "7", "--data-cache-path", "/a b") and o.gpu_mem_gb == 80.0
    assert o.extra_args_text == "--seed 7 --data-cache-path '/a b'"  # what the record keeps
    assert plan.build(catalog.get("101"), o).groups["EXTRA"] == list(o.extra_args)
    with pytest.raises(TypeError, match="parse text"):  # text is parsed at the edge, never read char by char
        Options(extra_args="--seed 7")


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
    # read as Megatron's parser reads them: the last one wins, no abbreviation, `--flag=value` too
    p = plan.build(catalog.get("600"), _opts(extra_args="--micro-batch-size 4 --micro-batch-size=2 --micro-batch 8"))
    assert p.exp.mbs == 2


def test_a_model_extra_args_cannot_split_is_one_line():
    with pytest.raises(launch.LaunchError, match=r"^EXTRA_ARGS: --num-query-groups 7 must divide the 32 attention "
                                                 r"heads and split over TP=1; fix: "):
        plan.build(catalog.get("600"), _opts(extra_args="--num-query-groups 7"))
    with pytest.raises(launch.LaunchError, match=r"^EXTRA_ARGS: 25 attention heads cannot be split over TP=2; fix"):
        plan.build(catalog.get("212"), _opts(extra_args="--num-attention-heads 25 --hidden-size 1600"))
    assert plan.build(catalog.get("600"), _opts(extra_args="--num-query-groups 4")).model["num_query_groups"] == 4


def test_fused_wgrad_turns_megatrons_gradient_accumulation_fusion_on():
    """--no-gradient-accumulation-fusion goes exactly when megalab's stand-in for apex's kernel is installed:
    by default for a dense model, not for a MoE one (not tried there) nor where FAST leaves it out."""
    default = plan.build(catalog.get("111"), _opts())
    unfused = plan.build(catalog.get("111"), _opts(fast="fused_adam,foreach_norm,foreach_scale"))
    moe = plan.build(catalog.get("522"), _opts())
    assert "--no-gradient-accumulation-fusion" not in default.argv and "fused_wgrad" in default.env["MEGALAB_FAST"].split(",")
    assert "--no-gradient-accumulation-fusion" in unfused.argv and "fused_wgrad" not in unfused.fastpath
    assert "--no-gradient-accumulation-fusion" in moe.argv and "fused_wgrad" not in moe.fastpath
    te = plan.build(catalog.get("111"), _opts(fast="fused_wgrad"), TE)  # TE brings its own: no levers at all
    assert te.fastpath == () and "--no-gradient-accumulation-fusion" not in te.argv


def test_megatron_lms_own_entry_gets_no_patch_levers():
    """Megatron-LM's pretrain_gpt.py never calls fastpath.apply: the plan must not claim (or depend on) patches;
    the spec's own levers stay, as megalab's spec reads them from MEGALAB_FAST."""
    p = plan.build(catalog.get("111"), _opts(megatron_lm="/src/Megatron-LM", fast="all"))
    assert p.fastpath == () and "--no-gradient-accumulation-fusion" in p.argv
    moe = plan.build(catalog.get("522"), _opts(megatron_lm="/src/Megatron-LM"))
    assert moe.fastpath == ("grouped_gemm", "moe_gather", "expert_stack", "moe_act")


def test_scripts_train_gpt_sh_renders_the_plan_and_runs_it(tmp_path, fake_torchrun):
    """The wrapper writes no Megatron flag: `DRY_RUN=1 scripts/train_gpt.sh TARGET` prints the target's launch
    script, and without DRY_RUN it runs it (torchrun gets the plan's argv)."""
    wrapper = ROOT / "scripts" / "train_gpt.sh"
    assert "--micro-batch-size" not in wrapper.read_text() and "--num-layers" not in wrapper.read_text()
    env = {k: v for k, v in os.environ.items() if k not in variables.BY_NAME}
    env.update(PY=os.environ.get("PY", "python3"), MASTER_PORT="29517", ITERS="20", SAVE="1",
               RUN_DIR=str(tmp_path / "run 1"), EXTRA_ARGS="--seed 7 --data-cache-path '$(touch x)'")
    p = plan.build(catalog.get("101"), Options.from_env(env), plan.machine_of(gpus=0),
                   run_dir=tmp_path / "run 1")
    dry = subprocess.run(["bash", str(wrapper), "101"], env={**env, "DRY_RUN": "1"}, capture_output=True,
                         text=True, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == p.script
    env["PATH"] = f"{fake_torchrun}:{env['PATH']}"
    (fake_torchrun / "argv").unlink(missing_ok=True)
    subprocess.run(["bash", str(wrapper), "101"], env=env, check=True, cwd=tmp_path)
    assert ["torchrun", *(fake_torchrun / "argv").read_text().split("\0")[:-1]] == p.argv
    assert not (tmp_path / "x").exists()
    out = subprocess.run(["bash", str(wrapper)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("usage: scripts/train_gpt.sh TARGET")


def test_one_file_knows_megatrons_flags():
    """issue 30: the argv is written once (core/flags.py), not in a script and a plan kept equal by a test."""
    out = subprocess.run(["grep", "-rl", "--exclude-dir=__pycache__", "--", "--micro-batch-size", "megalab", "scripts",
                          "Makefile"], cwd=ROOT, capture_output=True, text=True)  # the sources, not their bytecode
    assert out.stdout.split() == ["megalab/core/flags.py"]


def test_two_levers_that_replace_the_norm_are_refused_together():
    """liger_norm and triton_norm both swap the norm's kernels: named together, the launch stops with one
    line naming both and the fix; FAST=all keeps both (the spec's Norm takes triton_norm's)."""
    both = "fused_adam,liger_norm,triton_norm"
    with pytest.raises(variables.LaunchError, match=r"liger_norm and triton_norm both replace.*fix: keep one"):
        plan.build(catalog.get("111"), _opts(fast=both))
    assert {"liger_norm", "triton_norm"} <= set(plan.build(catalog.get("111"), _opts(fast="all")).fastpath)
    assert plan.build(catalog.get("111"), _opts(fast="fused_adam,triton_norm")).fastpath == ("fused_adam", "triton_norm")


def test_norm_residual_without_triton_norm_is_refused():
    """norm_residual's add lives in triton_norm's backward kernel: named without it, the launch stops with one
    line naming both and the fix."""
    with pytest.raises(variables.LaunchError, match=r"norm_residual .*triton_norm is not in the list; fix: add"):
        plan.build(catalog.get("111"), _opts(fast="fused_adam,norm_residual"))
    assert plan.build(catalog.get("111"), _opts(fast="triton_norm,norm_residual")).fastpath == ("triton_norm",
                                                                                          "norm_residual")
