"""`make slurm-<target>`: write an sbatch script for a target and submit it with sbatch.

sbatch allocates the nodes; `srun` starts one task per node; each task runs `make <target>` with
NNODES, NODE_RANK (= SLURM_NODEID) and MASTER_ADDR (the job's first host), so every node goes
through the same preflight, GPU monitor and run record as a one-node run, and starts one torchrun
that meets the others at MASTER_ADDR:MASTER_PORT. No launcher of our own: sbatch, srun, torchrun.

Records: each node writes its own run folder under the job folder (node0/, node1/, ...), with the
memory of its own GPUs. Megatron prints iteration lines on the last rank only (`print_rank_last`),
which torchrun places on the last node: that node's run.json holds the step times.

Environment: the job gets the make variables set at submission in the script, each quoted, and from
the submitting shell only what finds and runs Python, CUDA and NCCL there (JOB_ENV, named in the
script's `#SBATCH --export`). Never make's own variables: MAKEFLAGS would carry the submitting make's
command line to every node's make, where it overrides the node's own OUTDIR (two nodes' records in
one folder) and make reads its values once more.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from megalab.core import catalog, plan as planner
from megalab.harness import here, launch
from megalab.core.paths import ROOT
from megalab.core.catalog import Experiment
from megalab.core.variables import BY_NAME, FORWARDED, LaunchError, Options

DEFAULT_GPUS_PER_NODE = 8
# Make variables a node's `make <target>` reads (variables.py marks them forwarded): those set at
# submission are written into the script, each shlex-quoted, so that it reruns the same way
# (`sbatch job.sbatch`) and no value is ever read as shell code.

# From the submitting shell, by name (values are never written into the script: tokens stay out of it):
# the paths that find Python and its packages, the locale, the CUDA/NCCL/torch settings of the site,
# and the Hub and wandb credentials a run reads.
JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH",
           "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CUDA_HOME")
JOB_ENV_PREFIXES = ("LC_", "NCCL_", "TORCH_", "PYTORCH_", "TRITON_", "NVTE_", "UCX_", "FI_", "HF_", "WANDB_")
# make's own variables: a node's make must see only its own command line (its OUTDIR, its values).
MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKEOVERRIDES", "MAKELEVEL", "MAKEFILES")


def job_env(env=os.environ) -> list[str]:
    """The names of `env` a job takes from the submitting shell: JOB_ENV and JOB_ENV_PREFIXES, not the
    make variables (the script sets those) and not make's own."""
    return sorted(k for k in env if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and k not in BY_NAME
                  and k not in MAKE_ENV and (k in JOB_ENV or k.startswith(JOB_ENV_PREFIXES)))


@dataclasses.dataclass
class Layout:
    nodes: int
    gpus_per_node: int


def layout(exp: Experiment, env=os.environ) -> Layout:
    """Nodes x GPUs per node for a target: GPUS_PER_NODE (default 8) or NNODES, never both at odds."""
    def number(name: str) -> int | None:
        v = env.get(name, "")
        if v == "":
            return None
        if not v.isdigit() or int(v) < 1:
            raise LaunchError(f"{name}={v} is not a positive whole number; fix: e.g. {name}=8")
        return int(v)

    per, nnodes = number("GPUS_PER_NODE"), number("NNODES")
    if per is None and nnodes is not None:
        per = planner.gpus_per_node(exp, Options(nnodes=nnodes))
    per = min(exp.gpus, per or DEFAULT_GPUS_PER_NODE)  # a 2-GPU target takes 2 GPUs of one node
    if exp.gpus % per:
        raise LaunchError(f"target {exp.id} needs {exp.gpus} GPUs, which do not fill nodes of "
                          f"GPUS_PER_NODE={per}; fix: GPUS_PER_NODE dividing {exp.gpus}")
    out = Layout(nodes=exp.gpus // per, gpus_per_node=per)
    if nnodes is not None and nnodes != out.nodes:
        raise LaunchError(f"NNODES={nnodes} and GPUS_PER_NODE={per} disagree for target {exp.id} "
                          f"({exp.gpus} GPUs = {out.nodes} x {per}); fix: set only one of them")
    return out


def words(name: str, env=os.environ) -> list[str]:
    """A variable holding more flags (SBATCH_ARGS, SRUN_ARGS), split as a shell word list."""
    try:
        return shlex.split(env.get(name, ""))
    except ValueError as e:
        raise LaunchError(f"{name}={env.get(name)!r} is not a shell word list ({e}); fix: balance its quotes") from None


def script(exp: Experiment, lay: Layout, job_dir: Path, env=os.environ) -> str:
    """The sbatch script: one srun task per node, each running `make <target>` for its NODE_RANK."""
    forwarded = [f"export {k}={shlex.quote(env[k])}" for k in FORWARDED if env.get(k)]
    port = shlex.quote(env["MASTER_PORT"]) if env.get("MASTER_PORT") else "$((20000 + SLURM_JOB_ID % 20000))"
    srun_args = shlex.join(words("SRUN_ARGS", env))
    node_cmd = (f"NODE_RANK=$SLURM_NODEID OUTDIR={shlex.quote(str(job_dir))}/node$SLURM_NODEID "
                f"exec make --no-print-directory {shlex.quote(exp.id)}")
    return "\n".join([
        "#!/bin/bash",
        f"# megalab target {exp.id}: {lay.nodes} node(s) x {lay.gpus_per_node} GPU(s), written by "
        f"`make slurm-{exp.id}` on {dt.datetime.now():%Y-%m-%d %H:%M}.",
        "# Submit again with `sbatch` and this file. Each node runs `make <target>` (preflight, GPU",
        "# monitor, run record in node<N>/); the last node's record holds the step times.",
        "# The repo and OUTDIR must sit on a file system every node sees.",
        f"#SBATCH --job-name=megalab-{exp.id}",
        f"#SBATCH --nodes={lay.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={lay.gpus_per_node}",
        "#SBATCH --exclusive",
        "# --exclusive: a measurement wants no neighbours on its nodes.",
        f"#SBATCH --output={shlex.quote(str(job_dir / 'slurm-%j.out'))}",
        f"#SBATCH --export={','.join(job_env(env)) or 'NIL'}",
        "# --export: of the submitting shell only what finds Python, CUDA and NCCL (make's values: below).",
        "set -euo pipefail",
        f"unset {' '.join(MAKE_ENV)}",
        f"cd {shlex.quote(str(ROOT))}",
        "export NNODES=$SLURM_NNODES",
        '# torchrun rendezvous on the first node; a port from the job id keeps two jobs on one node apart.',
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export MASTER_PORT={port}",
        *forwarded,
        "# One task per node, given all of the node's CPUs (torchrun starts one process per GPU), and this",
        "# script's environment (--export=ALL: sbatch's --export would otherwise hold for srun too).",
        "srun --export=ALL --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_ON_NODE --kill-on-bad-exit=1"
        + (f" {srun_args}" if srun_args else "")
        + f" bash -c {shlex.quote(node_cmd)}",
        "",
    ])


def node_commands(exp: Experiment, lay: Layout, opts: Options, machine: planner.Machine) -> list[str]:
    """The torchrun command of node 0 and of the last node, as the script's tasks will run them
    (with the variables set at submission, which the script forwards). The rendezvous address and
    port are the script's shell variables: shown as such, every other item quoted."""
    shown = {"--master_addr": "$MASTER_ADDR", "--master_port": "$MASTER_PORT"}
    lines = []
    for rank in sorted({0, lay.nodes - 1}):
        argv = planner.build(exp, dataclasses.replace(opts, nnodes=lay.nodes, node_rank=rank), machine).argv
        items = [shown.get(argv[i - 1]) or shlex.quote(a) if i else a for i, a in enumerate(argv)]
        lines.append(f"node {rank}     {' '.join(items)}")
    return lines


def _submission(target: str, env) -> tuple[Experiment, Layout, Options]:
    exp = catalog.get(target)
    exp.validate()
    lay = layout(exp, env)
    return exp, lay, dataclasses.replace(Options.from_env(env), nnodes=lay.nodes, node_rank=0)


def _node_plan(exp: Experiment, opts: Options) -> tuple[planner.Machine, planner.RunPlan]:
    plan = here.plan_here(exp, opts)  # each node plans again for its own GPUs when its `make <target>` runs
    return plan.machine, plan


def planned(target: str, env=os.environ) -> planner.RunPlan:
    """Node 0's plan of a submission of TARGET: the one its preflight and Megatron check read."""
    exp, _, opts = _submission(target, env)
    return _node_plan(exp, opts)[1]


def submit(target: str, env=os.environ) -> int:
    exp, lay, opts = _submission(target, env)
    dry = opts.dry_run
    sbatch = shutil.which("sbatch")
    if not dry and sbatch is None:
        raise LaunchError("sbatch not found: this machine is not a SLURM login node; fix: run "
                          f"`make slurm-{exp.id}` where sbatch is, or DRY_RUN=1 to write the script only")
    machine, plan = _node_plan(exp, opts)
    print("\n".join(launch.preflight(plan)))
    print(launch.megatron_check(plan))
    te_problem = launch.cp_problem(plan)
    if te_problem:  # the login node may lack TE while the job's image has it: each node checks again
        print(f"warning    here: {te_problem}")

    sbatch_args = words("SBATCH_ARGS", env)
    words("SRUN_ARGS", env)  # refused here, before a job folder is made
    if any(c in str(opts.outdir) for c in "\n\r"):  # the script names it in #SBATCH and comment lines
        raise LaunchError("OUTDIR holds a line break, which an sbatch script cannot name; fix: OUTDIR=a path "
                          "without one")
    job_dir = launch.make_run_dir(opts.outdir / "slurm", exp.id)
    path = job_dir / "job.sbatch"
    path.write_text(script(exp, lay, job_dir, env))
    sbatch_cmd = ["sbatch", *sbatch_args, str(path)]
    print(f"slurm      {lay.nodes} node(s) x {lay.gpus_per_node} GPU(s); one srun task per node runs "
          f"`make {exp.id}` with NODE_RANK=$SLURM_NODEID")
    print("\n".join(node_commands(exp, lay, opts, machine)))
    print(f"script     {path}")
    print(path.read_text().rstrip())
    if dry:
        print(f"submit     (DRY_RUN=1, not submitted) {shlex.join(sbatch_cmd)}")
        return 0
    # sbatch reads SBATCH_EXPORT over the script's #SBATCH --export; make's variables are no job's business
    clean = {k: v for k, v in os.environ.items() if k not in MAKE_ENV and k != "SBATCH_EXPORT"}
    out = subprocess.run([sbatch, *sbatch_cmd[1:]], capture_output=True, text=True, env=clean)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise LaunchError(f"sbatch refused the job: {last}; fix: SBATCH_ARGS='--partition=... "
                          f"--account=...' (the script is kept in {path})")
    print(f"submit     {shlex.join(sbatch_cmd)}: {out.stdout.strip()}")
    print(f"follow     tail -f {job_dir}/slurm-<jobid>.out; records in {job_dir}/node*/")
    return 0
