"""The launcher's commands: `run`, `show-command`, `script` and `plan TARGET` (their arguments, declared
once, and what each does). `python -m megalab` (megalab/__main__.py) builds its argparse tree from them.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from megalab.core import ports, variables
from megalab.core.variables import LaunchError, Options
from megalab.harness import here, launch, makeparent


def add_target(p: argparse.ArgumentParser, nargs: str | None = None) -> None:
    p.add_argument("target", nargs=nargs, help="a catalog id or its number (101), or profile-<id> / resume-<id>")


def _one_launch(target: str, opts: Options, what: str):
    """(experiment, options) of a target or its profile- variant; resume-<id> is two launches."""
    exp, variant = launch.resolve(target)
    if variant == "profile":
        exp, opts = launch.profiled(exp, opts)
    if variant == "resume":
        raise LaunchError(f"{target} is two launches; fix: DRY_RUN=1 make {target} shows both {what}")
    return exp, opts


def run_main(args: argparse.Namespace) -> int:
    """make <target>: preflight, launch, monitor, record (DRY_RUN=1 prints the plan and its script). Under make, a
    signal to make, or make killed outright, ends the run as `killed` (makeparent.py), as in make batch."""
    makeparent.follow()
    return launch.run(args.target)


def show_command_main(args: argparse.Namespace) -> int:
    """The plan's torchrun command alone, on one line (make show-command ID=...), planned as `make <target>` plans
    it here."""
    exp, opts = _one_launch(args.target, Options.from_env(), "commands")
    print(here.plan_here(exp, dataclasses.replace(opts, dry_run=True)).command)
    return 0


def script_arguments(p: argparse.ArgumentParser) -> None:
    add_target(p)
    p.add_argument("--run-dir", type=Path, default=None,
                   help="the run directory its paths name (checkpoints, TensorBoard, traces); default RUN_DIR")


def script_main(args: argparse.Namespace) -> int:
    """The target's RUN_DIR/launch.sh, planned for this machine as `make <target>` would plan it, on
    stdout (scripts/train_gpt.sh runs it). A layout this machine cannot run is refused, unless DRY_RUN."""
    opts = Options.from_env()
    exp, opts = _one_launch(args.target, opts, "scripts")
    exp.validate()
    opts = launch.check_options(opts)
    opts = dataclasses.replace(opts, master_port=ports.master_port(opts.master_port, opts.nnodes))
    plan = here.plan_here(exp, opts, run_dir=args.run_dir)
    problem = launch.cp_problem(plan) or launch.data_problem(plan)
    if problem and not opts.dry_run:
        raise LaunchError(problem)
    print(plan.script, end="")
    return 0


def plan_arguments(p: argparse.ArgumentParser) -> None:
    add_target(p, nargs="?")
    p.add_argument("assignments", nargs="*", metavar="VAR=value",
                   help="make variables as on a make line (GPU=h100 GPU_MEM_GB=80): as if set in the environment")
    p.add_argument("--gpu-mem-gb", type=lambda text: _parsed("GPU_MEM_GB", text), default=None,
                   help="memory to fit in, nominal GB as GPU_MEM_GB (80 = 81559 MiB, an H100 80GB)")
    p.add_argument("--spec", choices=("megalab", "local"), default=None, help="as SPEC=")
    p.add_argument("--gpu", default=None, help="GPU key (h100, h200, a100, ...) or NVML name, as GPU=")
    p.add_argument("--mfu", type=float, default=None, help="step time at this constant MFU instead of the model")
    # --validate is results/validation.py's (the command tree runs it): declared here, where `plan`'s
    # arguments are, so that planning one target never imports the pages' side
    p.add_argument("--validate", action="store_true",
                   help="the estimator against every committed record: write results/estimate-vs-measured.md")
    p.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)  # tests: another tree


def _parsed(name: str, text: str):
    """An option read as its make variable is: a bad value is argparse's one-line usage error."""
    try:
        return variables.parse(name, text)
    except LaunchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _assigned(words) -> dict[str, str]:
    """`VAR=value` words (the documented `plan TARGET GPU=h100`) as environment entries; a name that is no make
    variable, or a second target, is one line with the fix."""
    out = {}
    for w in words:
        name, eq, text = w.partition("=")
        if not eq:
            raise LaunchError(f"plan takes one TARGET, then VAR=value words; got '{w}' as well; fix: python -m "
                              "megalab plan 101 GPU=h100")
        if name not in variables.BY_NAME:
            raise LaunchError(f"{name}: not a make variable; fix: name one `make help` lists, e.g. GPU=h100")
        out[name] = text
    return out


def plan_main(args: argparse.Namespace) -> int:
    """`python -m megalab plan TARGET`: the preflight's prediction alone, from the same plan a launch
    would build here (the make variables GPU, GPU_MEM_GB, FAST, CUDA_GRAPH, EXTRA_ARGS, SPEC included);
    the options override those variables."""
    words = [w for w in (args.target, *args.assignments) if w]
    target = next((w for w in words if "=" not in w), None)
    if not target:
        raise LaunchError("plan needs a TARGET (or --validate); fix: python -m megalab plan 101 GPU=h100")
    overrides = {k: v for k, v in (("gpu_mem_gb", args.gpu_mem_gb), ("spec", args.spec), ("gpu", args.gpu))
                 if v is not None}
    opts = dataclasses.replace(Options.from_env({**os.environ, **_assigned(w for w in words if w != target)}),
                               dry_run=True, **overrides)
    exp, variant = launch.resolve(target)
    if variant == "profile":
        exp, opts = launch.profiled(exp, opts)
    exp.validate()
    print(launch.plan_lines(here.plan_here(exp, opts), mfu=args.mfu))
    return 0
