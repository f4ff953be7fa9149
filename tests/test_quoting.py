"""User values are data, never shell code: make, the launcher's argv and its launch script, the sbatch
script, docker-run.

Each value below would create the file `pwned` if any shell ever read it as code. They travel
through the environment (as `VAR=... make ...` passes them) and must arrive verbatim.
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.core import catalog, plan, variables
from megalab.core.variables import Options

ROOT = Path(__file__).resolve().parent.parent


def _payloads(tmp_path):
    p = tmp_path / "pwned"
    return p, [f"x; touch {p}", f"$(touch {p})", f"`touch {p}`", "a'b\"c d", f"x && touch {p} #",
               f"line\ntouch {p}\n", f"${{IFS}}touch {p}", f"\\'; touch {p}; '"]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


def _make(*args, **env):
    megatron_verdict(args[0], env)  # speed only: Megatron's verdict reached in this process first (conftest)
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PY": sys.executable, **env})


def test_the_plans_argv_keeps_every_value_as_one_item(tmp_path):
    pwned, values = _payloads(tmp_path)
    extra = " ".join(f"--data-cache-path {shlex.quote(v)}" for v in values)
    opts = Options(extra_args=variables.parse("EXTRA_ARGS", extra), data=values[0], tokenizer_model=values[1],
                   load=Path(values[2]))
    p = plan.build(catalog.get("101"), opts, run_dir=tmp_path / values[3])
    for v in values:
        assert v in p.argv
    assert p.argv[p.argv.index("--data-path") + 1] == values[0]
    assert p.argv[p.argv.index("--load") + 1] == values[2]
    assert shlex.split(p.command) == p.argv
    assert not pwned.exists()


def test_the_launch_script_hands_every_value_to_torchrun_verbatim(tmp_path):
    """RUN_DIR/launch.sh is bash: each hostile value (in EXTRA_ARGS, DATA, TOKENIZER_MODEL, LOAD, the run dir,
    WANDB_*, MEGATRON_LM, MASTER_ADDR) must reach torchrun as the one argv item it was, and run nothing."""
    pwned, values = _payloads(tmp_path)
    extra = " ".join(f"--data-cache-path {shlex.quote(v)}" for v in values)
    opts = Options(iters=20, extra_args=variables.parse("EXTRA_ARGS", extra), data=values[0],
                   tokenizer_model=values[1], load=Path(values[2]), wandb=True, wandb_project=values[4],
                   wandb_entity=values[5], megatron_lm=str(tmp_path / values[6]), master_addr=values[7])
    p = plan.build(catalog.get("101"), opts, run_dir=tmp_path / f"out {values[3]}" / "run 'x'")
    p.run_dir.mkdir(parents=True)
    script = p.run_dir / "launch.sh"
    script.write_text(p.script)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "torchrun", f"printf '%s\\0' \"$@\" > {shlex.quote(str(tmp_path / 'argv'))}\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "WANDB_API_KEY": "x"}
    subprocess.run(["bash", str(script)], env=env, check=True, cwd=tmp_path)
    assert ["torchrun", *(tmp_path / "argv").read_text().split("\0")[:-1]] == p.argv
    for v in values:
        assert v in p.groups["EXTRA"]
    assert not pwned.exists()


def test_dry_run_make_target_executes_no_value(tmp_path):
    pwned, values = _payloads(tmp_path)
    extra = " ".join(f"--data-cache-path {shlex.quote(v)}" for v in values)
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", ITERS="5", EXTRA_ARGS=extra,
                OUTDIR=str(tmp_path / values[1]), WANDB_PROJECT=values[2])
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout.split("command    (DRY_RUN=1, not started)\n", 1)[1])  # a value may hold a newline
    assert all(v in argv for v in values)
    # Megatron's own check refuses these as a tokenizer (one line); no shell ever sees them
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", DATA=values[0], TOKENIZER_MODEL=values[2])
    assert f"--data-path {shlex.quote(values[0])}" in out.stdout or "Megatron rejects" in out.stderr
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", LOAD=values[1])  # refused, in one line
    assert out.returncode == 2 and "no such directory" in out.stderr
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", EXTRA_ARGS="--seed '7")
    assert out.returncode == 2 and "not a shell word list" in out.stderr
    assert not pwned.exists()


def test_slurm_script_quotes_every_value_and_they_arrive_verbatim(tmp_path):
    pwned, values = _payloads(tmp_path)
    outdir = tmp_path / values[1]
    env = {"DRY_RUN": "1", "OUTDIR": str(outdir), "EXTRA_ARGS": f"--data-cache-path {shlex.quote(values[0])}",
           "LOAD": values[2], "MEGATRON_LM": values[3], "WANDB_ENTITY": values[4],
           "SBATCH_ARGS": f"--comment={shlex.quote(values[0])}", "SRUN_ARGS": f"--container-image={shlex.quote(values[1])}"}
    out = _make("slurm-101-gpt2xl-dp1-gbs1-bf16", **env)
    assert out.returncode == 0, out.stderr
    (job,) = (outdir / "slurm").iterdir()
    script = job / "job.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert f"not submitted) sbatch {shlex.quote('--comment=' + values[0])} " in out.stdout

    # Run the script itself with a fake srun and scontrol: what reaches the node task?
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "scontrol", "echo node-a\n")
    _fake(bin_dir, "srun", f"printf '%s\\0' \"$@\" > {tmp_path}/srun.argv\nenv -0 > {tmp_path}/srun.env\n")
    slurm_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node-a",
                 "SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "4", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], env=slurm_env, check=True, cwd=tmp_path)
    node_env = dict(kv.split("=", 1) for kv in (tmp_path / "srun.env").read_text().split("\0") if "=" in kv)
    for k in ("EXTRA_ARGS", "LOAD", "MEGATRON_LM", "WANDB_ENTITY"):
        assert node_env[k] == env[k], k
    srun_argv = (tmp_path / "srun.argv").read_text().split("\0")[:-1]
    assert f"--container-image={values[1]}" in srun_argv
    node_cmd = srun_argv[srun_argv.index("-c") + 1]
    assert shlex.split(node_cmd)[1] == f"OUTDIR={job}/node$SLURM_NODEID"  # one word, as the node's shell sees it
    assert not pwned.exists()


def test_docker_run_gets_its_argv_without_a_shell(tmp_path):
    pwned, values = _payloads(tmp_path)
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "docker", f"printf '%s\\0' \"$@\" > {tmp_path}/docker.argv\n")
    outdir = tmp_path / values[0]
    out = _make("docker-run", PATH=f"{bin_dir}:{os.environ['PATH']}", OUTDIR=str(outdir),
                DOCKER_ARGS=f"-e X={shlex.quote(values[1])} --name {shlex.quote(values[3])}",
                DOCKER_CMD=f"make 101 EXTRA_ARGS={shlex.quote(values[2])}")
    assert out.returncode == 0, out.stderr
    argv = (tmp_path / "docker.argv").read_text().split("\0")[:-1]
    assert argv[:2] == ["run", "--rm"] and f"{outdir}:/outdir" in argv
    for flag in ("--gpus", "--ipc=host", "--shm-size=16g", "memlock=-1", "stack=67108864", f"{ROOT}:/workspace/megalab"):
        assert flag in argv
    i = argv.index("megalab")  # the image, then DOCKER_CMD's words
    assert argv[i - 4:i] == ["-e", f"X={values[1]}", "--name", values[3]]
    assert argv[i + 1:] == ["make", "101", f"EXTRA_ARGS={values[2]}"]
    assert not pwned.exists()


@pytest.mark.parametrize("goal", ["999-nope; touch PWNED", "$(touch PWNED)"])
def test_an_unknown_goal_is_not_run_as_code(tmp_path, goal):
    goal = goal.replace("PWNED", str(tmp_path / "pwned"))
    out = _make(goal)
    assert out.returncode != 0 and not (tmp_path / "pwned").exists()
