"""Everyday commands around a run: checkpoints and resume, wandb, profiling, progress, make help."""
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.__main__ import main
from megalab.harness import launch, progress, resume
from megalab.core import catalog, logparse, plan

ROOT = Path(__file__).resolve().parent.parent


def _script(target="001", **kw) -> str:
    """The launch script of a target's plan (what a run writes into its run dir and runs), each array's
    rows joined into one line."""
    run_dir = kw.pop("run_dir", None)
    exp = catalog.get(target)
    opts = dataclasses.replace(launch.Options(iters=20), **kw)
    if opts.profile:
        exp, opts = launch.profiled(exp, opts)
    return plan.build(exp, opts, plan.Machine(), run_dir=Path(run_dir) if run_dir else None).script.replace("\n    ", " ")


def _make(*args, **env):
    megatron_verdict(args[0], env)  # speed only: Megatron's verdict reached in this process first (conftest)
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})


def _error(stderr: str, prefix: str = "megalab:") -> str:
    lines = [l for l in stderr.splitlines() if l.startswith(prefix)]
    assert len(lines) == 1 and "fix" in lines[0], stderr
    return lines[0]


# ---- RUN_DIR/launch.sh: the flags, in their own arrays ---------------------------------------------------

def test_no_checkpoint_wandb_or_profile_flags_by_default():
    script = _script()
    for flag in ("--save", "--load", "--wandb-project", "--profile", "--exit-interval", "--tensorboard-dir"):
        assert f"{flag} " not in script
    assert "CHECKPOINT_ARGS=()" in script and "PROFILE_ARGS=()" in script


def test_save_load_wandb_profile_flags():
    script = _script(save=True, load=Path("/ck"), wandb=True, wandb_entity="team", profile=True, iters=5,
                     run_dir="/o/run1")
    assert "--save /o/run1/checkpoints --save-interval 5 " in script  # default: the end of the run
    assert "--load /ck --exit-on-missing-checkpoint --ckpt-format torch_dist" in script
    assert "--tensorboard-dir /o/run1/tensorboard" in script  # Megatron's wandb logs only beside TensorBoard
    assert "--wandb-project megalab --wandb-exp-name run1 --wandb-save-dir /o/run1/wandb --wandb-entity team" in script
    assert "--profile --use-pytorch-profiler --profile-step-start 3 --profile-step-end 5" in script
    assert "--save-interval 7" in _script(save=True, save_interval=7)


def test_wandb_without_a_run_dir_still_sets_the_tensorboard_dir():
    assert "--tensorboard-dir RUN_DIR/tensorboard" in _script(wandb=True)


# ---- the launcher: one-line errors before any GPU time -------------------------------------------------

def test_load_dir_missing_or_without_checkpoint(tmp_path):
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", LOAD=str(tmp_path / "nope"))
    assert out.returncode == 2 and "no such directory" in _error(out.stderr)
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", LOAD=str(tmp_path))
    assert out.returncode == 2 and "holds no Megatron checkpoint" in _error(out.stderr)


def test_load_accepts_a_run_dir_or_its_checkpoints(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / launch.TRACKER).write_text("10")
    for given in (tmp_path, tmp_path / "checkpoints"):
        assert launch.checkpoint_dir(given) == (tmp_path / "checkpoints").resolve()


def test_wandb_missing_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(launch.LaunchError, match=r"WANDB=1 needs the wandb package.*fix: pip install wandb"):
        launch.check_options(launch.Options(wandb=True))


def test_wandb_dry_run_with_wandb_installed_opens_nothing(tmp_path):
    fake = tmp_path / "site" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def init(**kw):\n    raise SystemExit('wandb.init called in a dry run')\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path / 'site'}", "DRY_RUN": "1", "WANDB": "1", "SAVE": "1"}
    env.pop("WANDB_API_KEY", None)
    env.pop("WANDB_MODE", None)
    work = tmp_path / "cwd"
    work.mkdir()
    out = subprocess.run([sys.executable, "-m", "megalab", "run", "001"], cwd=work, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "wandb      project megalab, mode offline" in out.stdout
    assert "parse_and_validate_args accepts" in out.stdout
    assert list(work.iterdir()) == []  # checking the flags opened no wandb run and no event file


def test_records_keep_the_checkpoint_and_logging_settings(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x")
    cfg = launch.outputs_config(launch.Options(iters=40, save=True, wandb=True))
    assert cfg["save"] and cfg["save_interval"] == 40 and cfg["load"] is None
    assert cfg["wandb"]["mode"] == "online" and cfg["profile"] is False


# ---- profile-<id> and resume-<id> -----------------------------------------------------------------------

def test_profile_variant_of_any_target():
    out = _make("profile-101", DRY_RUN="1", ITERS="8")
    assert out.returncode == 0, out.stderr
    assert "target     profile-101-gpt2xl-dp1-gbs1-bf16" in out.stdout
    assert "torch profiler trace of steps 6-7" in out.stdout
    cmd = out.stdout.strip().splitlines()[-1]
    assert "--timing-log-level 2" in cmd and "--use-pytorch-profiler --profile-step-start 6 --profile-step-end 8" in cmd
    exp, variant = launch.resolve("profile-282")  # by numeric prefix, as `make 282` is
    assert exp.id == "282-gpt-22B-tp8-gbs4-len2048-sp" and variant == "profile"
    bad = _make("profile-101", DRY_RUN="1", ITERS="2")
    assert bad.returncode == 2 and "ITERS=2 is too few" in _error(bad.stderr)


def test_resume_variant_dry_run_shows_both_launches():
    out = _make("resume-001", DRY_RUN="1", ITERS="40")
    assert out.returncode == 0, out.stderr
    cmds = [l for l in out.stdout.splitlines() if l.startswith("torchrun ")]
    assert len(cmds) == 2
    assert "--train-iters 40 " in cmds[0] and "--train-iters 40 " in cmds[1]  # one LR schedule for both
    assert "--save RUN_DIR/checkpoints --save-interval 20 " in cmds[0] and "--exit-interval 20" in cmds[0]
    assert "--load RUN_DIR_OF_LAUNCH_1/checkpoints --exit-on-missing-checkpoint" in cmds[1]
    assert "--save " not in cmds[1] and "--exit-interval" not in cmds[1]


# A stand-in for torchrun, given the plan's argv: Megatron's iteration lines, a checkpoint when saving
# (--save), resuming from --load.
STAND_IN = r"""
import os, pathlib, sys
argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1] if name in argv else None
total, stop, load = int(flag("--train-iters")), flag("--exit-interval"), flag("--load")
first = int(pathlib.Path(load, "latest_checkpointed_iteration.txt").read_text()) + 1 if load else 1
first -= int(os.environ.get("FAKE_RESTART_FROM_SCRATCH", 0)) * (first - 1)
last = int(stop) if stop else total
for i in range(first, last + 1):
    print(f" [2026-01-01 00:00:00.000000] iteration {i:8d}/{total:8d} | elapsed time per iteration (ms): 400.0 |"
          f" lm loss: {10.8 - 0.1 * i:.6E} |", flush=True)
if flag("--save"):
    ck = pathlib.Path(flag("--save")); ck.mkdir()
    (ck / "latest_checkpointed_iteration.txt").write_text(str(last))
print(f"[exiting program at iteration {last}] datetime: 2026-01-01 00:00:01" if stop
      else "[after training is done] datetime: 2026-01-01 00:00:01")
"""


@pytest.fixture
def fake_gpu_run(monkeypatch, tmp_path_factory):
    """GPUs that are not there, and a `torchrun` first on PATH that is STAND_IN: RUN_DIR/launch.sh
    execs it with the plan's argv."""
    from megalab.harness import monitor

    monkeypatch.setattr(monitor, "gpu_inventory",
                        lambda: {"count": 1, "names": ["NVIDIA H100"], "memory_mib": [81559], "driver": "580"})
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "stand_in.py").write_text(STAND_IN)
    (bin_dir / "torchrun").write_text(f"#!/bin/sh\nexec {sys.executable} {bin_dir / 'stand_in.py'} \"$@\"\n")
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("DRY_RUN", raising=False)


def _records(outdir):
    """The saving run's record, then the resumed run's (same second: names alone do not order them)."""
    recs = [json.loads(p.read_text()) for p in outdir.glob("*/run.json")]
    return sorted(recs, key=lambda r: r["config"]["load"] is not None)


def test_resume_runs_twice_and_checks_the_seam(fake_gpu_run, tmp_path, capsys):
    assert launch.run("resume-001", launch.Options(iters=10, outdir=tmp_path)) == 0
    first, second = _records(tmp_path)
    assert first["target"] == second["target"] == "resume-001-gpt2large-1gpu-gbs32"
    assert first["config"]["save"] and first["config"]["exit_interval"] == 5 and first["status"] == "ok"
    assert second["config"]["load"].endswith("/checkpoints")
    c = second["resume_check"]
    assert c["ok"] and c["resumed_first_iteration"] == 6 and c["saved_last_iteration"] == 5
    out = capsys.readouterr().out
    assert "resume     ok: saved at iteration 5" in out
    assert out.count("result     resume-001") == 2


def test_resume_check_catches_a_restart_from_scratch(fake_gpu_run, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RESTART_FROM_SCRATCH", "1")
    assert launch.run("resume-001", launch.Options(iters=10, outdir=tmp_path)) == 1
    c = _records(tmp_path)[1]["resume_check"]
    assert not c["ok"] and "expected 6" in c["why"] and "fresh model" in c["why"]


def test_a_run_shows_progress_not_the_log(fake_gpu_run, tmp_path, capsys):
    launch.run("001", launch.Options(iters=20, outdir=tmp_path))
    out = capsys.readouterr().out
    assert "iteration 1/20" in out and "ETA" in out and "lm loss" not in out  # the log is in logs.txt
    assert "lm loss" in next(tmp_path.glob("*/logs.txt")).read_text()
    assert out.strip().splitlines()[-1].startswith("result     001-gpt2large-1gpu-gbs32: ok")


# ---- progress line ----------------------------------------------------------------------------------------

def _iter_line(i, total=20, ms=500.0):
    return f" [2026-01-01 00:00:00] iteration {i:8d}/{total:8d} | elapsed time per iteration (ms): {ms} | lm loss: 9.5E+00 |\n"


def test_progress_rewrites_one_line_on_a_terminal():
    buf = io.StringIO()
    p = progress.Progress(out=buf, tty=True)
    p.feed("> building GPT model ...\n")
    for i in range(1, 21):
        p.feed(_iter_line(i))
    p.close()
    text = buf.getvalue()
    assert text.count("\r") == 21 and text.count("\n") == 1  # one line, rewritten; a newline at the end
    assert "iteration 20/20 | 500 ms/step | loss 9.5000 | ETA 0:00:00" in text
    assert "iteration 10/20 | 500 ms/step | loss 9.5000 | ETA 0:00:05" in text


def test_progress_prints_plain_periodic_lines_into_a_file():
    buf = io.StringIO()
    p = progress.Progress(out=buf, tty=False)
    for i in range(1, 101):
        p.feed(_iter_line(i, total=100))
    p.close()
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue() and len(lines) == 11  # iteration 1, then every tenth
    assert lines[-1].startswith("progress   iteration 100/100")


def test_verbose_streams_the_whole_log():
    buf = io.StringIO()
    progress.Progress(out=buf, tty=True, verbose=True).feed("anything\n")
    assert buf.getvalue() == "anything\n"


# ---- Megatron's timers: the step breakdown ------------------------------------------------------------

def test_level2_timers_give_a_forward_backward_optimizer_other_breakdown():
    lines = []
    for i in range(1, 7):
        lines += [_iter_line(i, total=6, ms=100.0).rstrip("\n"),
                  "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
                  "    forward-backward ...............................: (80.00, 85.00)",
                  "    forward-compute ................................: (25.00, 30.00)",
                  "    backward-compute ...............................: (50.00, 52.00)",
                  "    optimizer ......................................: (9.00, 10.00)"]
    f = logparse.summary_fields(logparse.parse_log("\n".join(lines) + "\n"))
    assert f["timers_ms"]["forward-backward"] == 85.0  # the max over ranks
    assert f["breakdown_ms"] == {"forward": 30.0, "backward": 52.0, "optimizer": 10.0, "other": 8.0}


def test_startup_timers_are_not_step_timers():
    log = ("INFO:megatron.core.timers:(min, max) time across ranks (ms):\n"
           "    model-and-optimizer-setup ......................: (309.09, 309.11)\n" + _iter_line(1, total=1))
    s = logparse.parse_log(log)
    assert s.timers == {} and logparse.summary_fields(s)["breakdown_ms"] is None


# ---- show-arguments / count-arguments ----------------------------------------------------------------

@pytest.fixture(scope="module")
def megatron_groups():
    from megalab.harness import arguments

    return arguments.groups(arguments.parser())


def test_megatron_arguments_grouped(megatron_groups):
    ckpt = {o for a in megatron_groups["checkpointing"] for o in a.option_strings}
    assert {"--save", "--load", "--save-interval", "--ckpt-format", "--exit-on-missing-checkpoint"} <= ckpt
    assert "--use-pytorch-profiler" in {o for a in megatron_groups["profiling"] for o in a.option_strings}
    assert sum(len(v) for v in megatron_groups.values()) > 500
    assert not any("-h" in a.option_strings for v in megatron_groups.values() for a in v)


def test_show_arguments_filters(capsys, monkeypatch, megatron_groups):
    from megalab.harness import arguments

    monkeypatch.setattr(arguments, "parser", lambda: None)
    monkeypatch.setattr(arguments, "groups", lambda p: megatron_groups)
    assert main(["arguments", "wandb-pro"]) == 0
    out = capsys.readouterr().out
    assert "## logging (1)\n  --wandb-project" in out and out.strip().endswith("megatron-core 0.19.2")
    assert main(["arguments", "--count"]) == 0
    assert "checkpointing" in capsys.readouterr().out


# ---- make: help, monitor-gpu, tensorboard, clean ---------------------------------------------------------

def test_help_lists_every_everyday_command():
    out = _make("help").stdout
    phony = subprocess.run(["make", "-pnq"], cwd=ROOT, capture_output=True, text=True).stdout
    declared = next(l for l in phony.splitlines() if l.startswith(".PHONY:")).split()[1:]
    everyday = {t for t in declared if not t[0].isdigit() and not t.startswith("profile-") and t != "help"}
    for t in everyday | {"profile-<id>", "resume-<id>"}:
        assert f"  make {t} " in out, t


def test_monitor_gpu_without_gpu_and_with_nvidia_smi(tmp_path):
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PY": "false"}  # PY=false: no nvitop
    out = _make("monitor-gpu", **env)
    if shutil.which("nvidia-smi", path=env["PATH"]) is None:
        assert out.returncode != 0 and "no NVIDIA GPU here" in _error(out.stderr, "monitor-gpu:")
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "nvidia-smi $*"\n')
    fake.chmod(0o755)
    out = _make("monitor-gpu", **env)
    assert out.returncode == 0 and out.stdout.strip() == "nvidia-smi -l 1"


def test_tensorboard_serves_outdir_on_localhost_and_port(tmp_path):
    py = tmp_path / "py"  # a Python that has tensorboard and prints what it was asked to serve
    py.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\nprintf "%s\\n" "$@"\n')
    py.chmod(0o755)
    served = _make("tensorboard", PY=str(py), PORT="7007", OUTDIR="", HOST="").stdout.split("\n")
    assert served[:8] == ["-m", "tensorboard.main", "--logdir", "outdir", "--host", "127.0.0.1", "--port", "7007"]
    served = _make("tensorboard", PY=str(py), OUTDIR="my runs", HOST="0.0.0.0", PORT="").stdout.split("\n")
    assert served[2:8] == ["--logdir", "my runs", "--host", "0.0.0.0", "--port", "6006"]
    out = _make("tensorboard", PY="false")
    assert out.returncode != 0 and "fix: pip install tensorboard" in _error(out.stderr, "tensorboard:")


def test_clean_never_deletes_results(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    record = tmp_path / "results" / "runs" / "x" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    (tmp_path / "outdir" / "run").mkdir(parents=True)
    for env in ({}, {"OUTDIR": "results"}):
        subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True,
                       env={**os.environ, **env})
        assert record.exists() and not (tmp_path / "outdir").exists()


def test_resume_check_reads_logs(tmp_path):
    saved, resumed = tmp_path / "a.txt", tmp_path / "b.txt"
    saved.write_text("".join(_iter_line(i, 4).replace("9.5E+00", f"{10 - i}") for i in (1, 2)))
    resumed.write_text("".join(_iter_line(i, 4).replace("9.5E+00", f"{10 - i}") for i in (3, 4)))
    c = resume.check(saved, resumed, 2)
    assert c["ok"] and c["loss_jump"] == 1.0 and "resumed at iteration 3 with loss 7.0000" in resume.line(c)


def test_resume_check_is_inconclusive_where_the_saved_loss_has_not_moved(tmp_path):
    """Mock data over a few steps (101 on an H100, ITERS=10: 10.854, 10.857, 10.777, 10.777, 10.901, then 10.764):
    the saved run's loss moved less than one step swings it, so the seam cannot tell a resume from a restart."""
    def log(path, start, losses):
        path.write_text("".join(f" [2026-01-01 00:00:00] iteration {start + i:8d}/{10:8d} | elapsed time per iteration "
                                f"(ms): 70.0 | lm loss: {v:.6E} |\n" for i, v in enumerate(losses)))
        return path
    saved = log(tmp_path / "a.txt", 1, [10.85406, 10.85701, 10.77670, 10.77668, 10.90134])
    resumed = log(tmp_path / "b.txt", 6, [10.76381, 10.68790])
    c = resume.check(saved, resumed, 5)
    assert not c["ok"] and c["why"].startswith("inconclusive") and "ITERS=40" in c["why"]
    assert resume.line(c).startswith("resume     inconclusive: saved at iteration 5")
    # a saved run whose loss fell well beyond its swings is judged: a resume near its last loss passes
    saved = log(tmp_path / "c.txt", 1, [10.8, 9.9, 9.1, 8.4, 7.8])
    assert resume.check(saved, log(tmp_path / "d.txt", 6, [7.7, 7.6]), 5)["ok"]
    assert not resume.check(saved, log(tmp_path / "e.txt", 6, [10.7, 10.6]), 5)["ok"]  # a restart from scratch
