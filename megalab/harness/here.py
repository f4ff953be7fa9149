"""A target planned for this machine: the one door every command plans through (`make <target>` and its dry run,
show-command, script, plan, resume, slurm), so each prints what `make <target>` runs here. The GPUs found (NVML:
their count, name and memory) decide the planning GPU; without one GPU= does, else the H100 80GB (plan.machine_of).
"""
from __future__ import annotations

from pathlib import Path

from megalab.core import plan as planner
from megalab.core.catalog import Experiment
from megalab.core.plan import RunPlan
from megalab.core.variables import Options
from megalab.harness import monitor


def machine(opts: Options, inventory: dict | None = None) -> planner.Machine:
    """This machine as a plan sees it: `inventory` (monitor.gpu_inventory's, read here where None)."""
    inv = monitor.gpu_inventory() if inventory is None else inventory
    return planner.machine_of(gpus=inv["count"], names=inv.get("names") or (), memory_mib=inv.get("memory_mib") or (),
                              opts=opts)


def plan_here(exp: Experiment, opts: Options, run_dir: Path | None = None, inventory: dict | None = None) -> RunPlan:
    """`exp` under `opts`, planned for this machine."""
    return planner.build(exp, opts, machine(opts, inventory), run_dir=run_dir)
