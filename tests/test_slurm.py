"""Beyond one node: `make slurm-<target>` writes an sbatch script (srun -> one torchrun per node)."""
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.core import catalog
from megalab.harness import launch, record, slurm

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def exp16():
    """Target 128 doubled: DP=16 on 2 nodes x 8 GPUs (no catalog target needs 16 GPUs yet)."""
    return catalog.get("128").model_copy(update={"id": "168-gpt2xl-dp16-test", "gpus": 16, "gbs": 256})


def test_two_nodes_of_eight_exact_commands(exp16, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(catalog, "get", lambda target: exp16)
    env = {"DRY_RUN": "1", "GPUS_PER_NODE": "8", "OUTDIR": str(tmp_path), "ITERS": "20",
           "PATH": os.environ["PATH"]}
    assert slurm.submit(exp16.id, env) == 0
    out = capsys.readouterr().out
    (job,) = (tmp_path / "slurm").iterdir()
    text = (job / "job.sbatch").read_text()
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 f"#SBATCH --output={job}/slurm-%j.out", "export NNODES=$SLURM_NNODES",
                 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 "export ITERS=20",
                 "srun --export=ALL --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_ON_NODE --kill-on-bad-exit=1 bash -c "
                 f"'NODE_RANK=$SLURM_NODEID OUTDIR={job}/node$SLURM_NODEID exec make --no-print-directory {exp16.id}'"]:
        assert line in text.splitlines(), line
    assert "GPUs       needs 16 (2 node(s) x 8)" in out
    assert "parse_and_validate_args accepts the flags with WORLD_SIZE=16" in out
    for rank in (0, 1):
        assert (f"node {rank}     torchrun --nproc_per_node 8 --nnodes 2 --node_rank {rank} "
                "--master_addr $MASTER_ADDR --master_port $MASTER_PORT ") in out
    assert f"submit     (DRY_RUN=1, not submitted) sbatch {job}/job.sbatch" in out


def test_make_slurm_target_dry_run_splits_by_gpus_per_node(tmp_path):
    env = {"DRY_RUN": "1", "GPUS_PER_NODE": "4", "OUTDIR": str(tmp_path), "SBATCH_ARGS": "--partition=gpu"}
    megatron_verdict("slurm-128-gpt2xl-dp8-gbs128-zero2", env)  # speed only (conftest)
    out = subprocess.run(["make", "-s", "slurm-128-gpt2xl-dp8-gbs128-zero2"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=2" in out.stdout and "#SBATCH --gpus-per-node=4" in out.stdout
    assert "--nproc_per_node 4 --nnodes 2 --node_rank 1" in out.stdout
    assert "not submitted) sbatch --partition=gpu " in out.stdout


@pytest.mark.parametrize("env,nodes,per", [({}, 1, 8), ({"GPUS_PER_NODE": "4"}, 2, 4),
                                           ({"NNODES": "4"}, 4, 2), ({"GPUS_PER_NODE": "16"}, 1, 8)])
def test_layout(env, nodes, per):
    assert slurm.layout(catalog.get("128"), env) == slurm.Layout(nodes, per)


@pytest.mark.parametrize("env,msg", [({"GPUS_PER_NODE": "3"}, "do not fill nodes of GPUS_PER_NODE=3"),
                                     ({"GPUS_PER_NODE": "4", "NNODES": "4"}, "disagree"),
                                     ({"GPUS_PER_NODE": "eight"}, "not a positive whole number")])
def test_layout_errors_are_one_line(env, msg):
    with pytest.raises(launch.LaunchError, match=msg) as e:
        slurm.layout(catalog.get("128"), env)
    assert "\n" not in str(e.value) and "fix:" in str(e.value)


def test_sbatch_missing_is_one_line_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(launch.LaunchError, match="sbatch not found") as e:
        slurm.submit("128", {"OUTDIR": str(tmp_path)})
    assert "fix:" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "slurm").exists()


def test_submits_with_sbatch(monkeypatch, tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\necho "Submitted batch job 42"\n')
    fake.chmod(0o755)
    env = {"OUTDIR": str(tmp_path / "out"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SBATCH_ARGS": "--time=0:30:00"}
    monkeypatch.setenv("PATH", env["PATH"])
    assert slurm.submit("101", env) == 0
    (job,) = (tmp_path / "out" / "slurm").iterdir()
    assert (tmp_path / "args").read_text().split() == ["--time=0:30:00", str(job / "job.sbatch")]
    assert "Submitted batch job 42" in capsys.readouterr().out


def test_preflight_counts_gpus_across_nodes(exp16):
    assert launch.check_gpus(exp16, launch.Options(nnodes=2), {"count": 8}) == 8
    with pytest.raises(launch.LaunchError) as e:
        launch.check_gpus(exp16, launch.Options(nnodes=1), {"count": 8})
    msg = str(e.value)
    assert "needs 16 GPUs per node, found 8: 1 node(s) x 8 = 8 of 16 GPUs" in msg
    assert f"fix: NNODES=2 with NODE_RANK and MASTER_ADDR on each node, or make slurm-{exp16.id} GPUS_PER_NODE=8" in msg


def test_a_node_of_a_multi_node_run_is_judged_by_its_exit_code(tmp_path):
    """Rank 0 prints the arguments and the end, the last rank the iterations: each node's log is partial."""
    log = tmp_path / "logs.txt"
    log.write_text(" [2026-11-22 10:00:00] iteration        1/      20 | elapsed time per iteration (ms): 500.0 |"
                   " throughput per GPU (TFLOP/s/GPU): 300.0 | lm loss: 1.0E+01 |\n")
    assert record.measured(log, 3, 0, False, [1000], None)["status"] == "incomplete"
    assert record.measured(log, 3, 0, False, [1000], None, one_node=False)["status"] == "ok"
    assert record.measured(log, 3, 1, False, [1000], None, one_node=False)["status"] == "incomplete"


def test_the_shown_node_commands_and_the_script_keep_the_variables_set_at_submission(tmp_path, capsys):
    env = {"DRY_RUN": "1", "OUTDIR": str(tmp_path), "GPUS_PER_NODE": "4", "ITERS": "20", "FAST": "none",
           "EXTRA_ARGS": "--seed 7"}
    assert slurm.submit("128", env) == 0
    out = capsys.readouterr().out
    nodes = [line for line in out.splitlines() if line.startswith("node ")]
    assert len(nodes) == 2 and all("--train-iters 20" in n and "--seed 7" in n for n in nodes)
    assert "export ITERS=20" in out and "export FAST=none" in out
    assert "MEGALAB_FAST" not in out.split("#!/bin/bash", 1)[1]  # the make variable travels, not its product
