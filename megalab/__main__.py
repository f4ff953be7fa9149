"""`python -m megalab <command>`: what the Makefile calls.

  run TARGET     preflight, launch, monitor, record (make <target>; DRY_RUN=1 prints the plan)
  campaign       every selected row REPEATS times on this machine, pass after pass (make campaign CHAPTER=1)
  show-command TARGET   the exact torchrun command of a target, nothing else (make show-command ID=...)
  python         the Python and torch make runs targets with (make which-python)
  variables      the make variables, their defaults and meaning (make help; --names: names only)
  docker-run     a container of docker/Dockerfile's image with the GPUs (make docker-run)
  slurm TARGET   write an sbatch script (one torchrun per node via srun) and submit it (make slurm-<target>)
  list           every target: id, GPUs, what it shows (make list)
  targets        target ids only, one per line (the Makefile reads these)
  parse LOG      summarise a Megatron log (--json for the record fields)
  tables         rebuild results/*.md and their figures from committed run records (make tables)
  compare OUTDIR your outdir's runs beside the committed ones, pages in OUTDIR/compare (make compare)
  plots          redraw the figures only, results/plots/*.svg (make plots; --out DIR)
  data-report    rebuild results/data/README.md from the real-data run records (make tables)
  plan TARGET    predict per-GPU memory, FLOPs and step time before a run (--validate: vs records)
  check          evaluate the papers' trend claims against the records (make check)
  prepare-data   tokenize a corpus into Megatron's .bin/.idx (make prepare-data; --help)
  refresh DIR..  recompute run records' measured fields from their raw log and memory CSV
  arguments      Megatron's flags, by group (--count: how many; PATTERN: only matching ones)
"""
from __future__ import annotations

import importlib
import sys

# Commands that are one module's own `cli(argv)`, imported only when asked for.
MODULE_COMMANDS = {"parse": "core.logparse", "prepare-data": "harness.data", 
                   "check": "results.checks", "plots": "results.plots", "arguments": "harness.arguments",
                   "tables": "results.tables", "data-report": "results.datareport", "integrity": "results.integrity",
                   "variables": "core.variables", "docker-run": "harness.docker", "python": "harness.pyinfo",
                   "compare": "results.index", "campaign": "harness.campaign"}


def _list() -> int:
    from megalab.core import catalog

    chapters = catalog.chapters()
    rows = [["target", "GPUs", "reproduces", "what it shows"]]
    for exp in catalog.catalog().values():
        kind = f"ref {exp.ref}" if exp.ref else (f"2-GPU analogue of {exp.analogue_of}" if exp.analogue_of else "")
        rows.append([exp.id, str(exp.gpus), kind, exp.about])
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    rows.insert(1, ["-" * w for w in widths])
    for r in rows:  # GPUs right-aligned, as a number column
        print("  ".join(r[c].rjust(widths[c]) if c == 1 else r[c].ljust(widths[c]) for c in range(4)).rstrip())
    print(f"\n{len(rows) - 2} targets in {len(chapters)} chapter(s). Run one: make <target>  "
          "(DRY_RUN=1 prints the plan; ITERS=, GPU_MEM_GB=, NNODES= see `make help`)")
    return 0


def _show_command(target: str) -> int:
    """The plan's command alone, for scripts and for reading (make show-command ID=...)."""
    import dataclasses

    from megalab.core import plan
    from megalab.harness import launch

    exp, variant = launch.resolve(target)
    opts = launch.Options.from_env()
    if variant == "profile":
        exp, opts = launch.profiled(exp, opts)
    if variant == "resume":
        raise launch.LaunchError(f"{target} is two launches; fix: DRY_RUN=1 make {target} shows both commands")
    print(plan.build(exp, dataclasses.replace(opts, dry_run=True), plan.Machine.here()).command)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    from megalab.core.catalog import CatalogError
    from megalab.core.variables import LaunchError

    try:
        if cmd in MODULE_COMMANDS:
            return importlib.import_module(f"megalab.{MODULE_COMMANDS[cmd]}").cli(rest)
        if cmd == "plan":  # --validate: the estimator against the records; else one target's prediction
            if "--validate" in rest:
                from megalab.results import validation

                return validation.cli(rest)
            from megalab.harness import launch

            return launch.plan_cli(rest)
        if cmd == "bench":  # the GPU benchmark's runs, then its page (make bench)
            from megalab.harness import bench
            from megalab.results import benchreport

            rc = bench.main(rest)
            if rest[:1] == ["run"] and rc == 0:
                benchreport.write(benchreport.BENCH_DIR)
            return rc
        if cmd == "bench-report":
            from megalab.results import benchreport

            print(benchreport.write(benchreport.BENCH_DIR))
            return 0
        if cmd == "run":
            if len(rest) != 1:
                raise LaunchError("usage: python -m megalab run TARGET")
            from megalab.harness import launch

            return launch.run(rest[0])
        if cmd == "show-command":
            if len(rest) != 1:
                raise LaunchError("usage: python -m megalab show-command TARGET (make show-command ID=...)")
            return _show_command(rest[0])
        if cmd == "slurm":
            if len(rest) != 1:
                raise LaunchError("usage: python -m megalab slurm TARGET")
            from megalab.harness import slurm

            return slurm.submit(rest[0])
        if cmd == "list":
            return _list()
        if cmd == "targets":
            from megalab.core import catalog

            print("\n".join(catalog.catalog()))
            return 0
        if cmd == "refresh":
            from pathlib import Path

            from megalab.harness import record

            for d in rest:
                print(record.one_line(record.refresh(Path(d))))
            return 0
    except (CatalogError, LaunchError) as e:
        print(f"megalab: {e}", file=sys.stderr)
        return 2
    print(f"megalab: unknown command '{cmd}'; fix: python -m megalab --help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
