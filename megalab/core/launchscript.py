"""RUN_DIR/launch.sh: a run plan written as the bash script that runs it.

The script is the one copy of a run's command line: the launcher writes it into the run directory
and its supervisor executes exactly `bash RUN_DIR/launch.sh`; `DRY_RUN=1 make <target>` prints
it; `bash RUN_DIR/launch.sh` runs the same run again by hand (without the preflight, the GPU memory
samples and the record). It reads like Megatron-LM's examples: the child environment, then one bash
array per group of flags (flags.GROUPS) with a line saying why, then `exec torchrun`. Every value is
shlex-quoted, so a path or an EXTRA_ARGS item reaches torchrun as one verbatim argv item and nothing
in it is ever evaluated; running it needs bash and torchrun, nothing else.
"""
from __future__ import annotations

import shlex
import textwrap

from megalab.core.flags import GROUPS, RUN_DIR_PLACEHOLDER, WHY, parallel_why

NAME = "launch.sh"
WIDTH = 100


def _comment(text: str) -> list[str]:
    """`# ...` lines; user and catalog text may hold newlines, which would end a comment early."""
    flat = " ".join(text.split())
    return ["# " + line for line in textwrap.wrap(flat, WIDTH - 2, break_on_hyphens=False)] or ["#"]


def _rows(items: tuple[str, ...]) -> list[str]:
    """Rows of at most WIDTH characters where that can be, a flag never apart from its values."""
    flags: list[list[str]] = []
    for item in items:
        if item.startswith("--") or not flags:
            flags.append([])
        flags[-1].append(shlex.quote(item))
    rows: list[str] = []
    for words in (" ".join(f) for f in flags):
        if rows and len(rows[-1]) + 1 + len(words) <= WIDTH - 4:
            rows[-1] += " " + words
        else:
            rows.append(words)
    return rows


def _array(name: str, items: tuple[str, ...]) -> list[str]:
    if not items:
        return [f"{name}=()"]
    return [f"{name}=(", *(f"    {row}" for row in _rows(items)), ")"]


def render(plan) -> str:
    """The script of `plan` (a plan.RunPlan, which offers it as `plan.script`: plan.py imports this module)."""
    exp, opts = plan.exp, plan.opts
    here = str(plan.run_dir / NAME) if plan.run_dir is not None else f"{RUN_DIR_PLACEHOLDER}/{NAME}"
    nodes = (f"over {opts.nnodes} nodes of {plan.gpus_per_node}; this is node {opts.node_rank}'s script"
             if opts.nnodes > 1 else "on one node")
    out = ["#!/usr/bin/env bash",
           *_comment(f"megalab {exp.id}: {exp.about} ({exp.gpus} GPU(s) {nodes})."),
           *_comment("The launcher's plan (megalab/core/plan.py) as the script that runs it: `make <target>` runs "
                     "exactly this file under its supervisor (watchdog, GPU memory samples, run record); "
                     f"`bash {here}` runs it again by hand, without them. Every value is quoted: none is "
                     "evaluated."),
           "set -euo pipefail",
           "",
           *_comment("The child environment: NCCL/CUDA settings for shared rigs (multicast over NVLink off; one "
                     "connection keeps TP/SP communication ordered), megalab's fast-path levers (MEGALAB_FAST) and "
                     "GPU_MEM_GB's cap (MEGALAB_GPU_MEM_GB) for the entry point, this checkout on PYTHONPATH."),
           *(f"export {k}={shlex.quote(v)}" for k, v in plan.env.items()),
           ""]
    graph = f"{'on' if plan.cuda_graph else 'off'}, {plan.cuda_graph_reason}"
    for g in GROUPS:
        why = WHY[g].format(preset=exp.model, graph=graph, parallel=parallel_why(exp.dp, exp.zero2))
        if not plan.groups[g]:
            why += " (Nothing of this in this run.)"  # the group's comment says what it would hold
        out += [*_comment(why), *_array(f"{g}_ARGS", plan.groups[g]), ""]
    rest = [f'"${{{g}_ARGS[@]}}"' for g in GROUPS[1:]]
    out.append(f'exec torchrun "${{DISTRIBUTED_ARGS[@]}}" {shlex.quote(plan.entry)} \\')
    for i in range(0, len(rest), 4):
        out.append("    " + " ".join(rest[i:i + 4]) + (" \\" if i + 4 < len(rest) else ""))
    return "\n".join(out) + "\n"
