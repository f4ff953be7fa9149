"""`python -m megalab <command>`: what the Makefile calls. One argparse tree, one subcommand per command.

`python -m megalab --help` lists the commands and `python -m megalab COMMAND --help` one command's
arguments. Each command's module declares its arguments (`add_arguments(parser)`) and runs it
(`main(args)`); the module is imported only when its command runs, so `make help` (`variables`) and
`list` never load pandas, torch or Megatron. A few commands parse their own argv (`cli(argv)`):
prepare-data, docker-run, campaign, batch.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import importlib
import sys


@dataclasses.dataclass(frozen=True)
class Command:
    help: str
    module: str | None = None  # megalab.<module>; None: a function of this file
    arguments: str | None = "add_arguments"  # the module's function that declares the command's arguments
    main: str = "main"  # the module's function that runs it: main(args) -> exit status
    passthrough: bool = False  # the module parses its own argv: main(argv)
    reader: bool = False  # reads records and git and writes pages only: each git question and records folder once

    def functions(self):
        module = importlib.import_module(f"megalab.{self.module}") if self.module else sys.modules[__name__]
        return (getattr(module, self.arguments) if self.arguments else None), getattr(module, self.main)


COMMANDS = {
    "run": Command("preflight, launch, monitor, record (make <target>; DRY_RUN=1 prints the plan and its "
                   "launch script)", "harness.commands", "add_target", "run_main"),
    "show-command": Command("the exact torchrun command of a target, nothing else (make show-command ID=...)",
                            "harness.commands", "add_target", "show_command_main"),
    "script": Command("a target's RUN_DIR/launch.sh, planned for this machine, on stdout (scripts/train_gpt.sh)",
                      "harness.commands", "script_arguments", "script_main"),
    "plan": Command("predict per-GPU memory, FLOPs and step time before a run (--validate: against the records)",
                    None, "_plan_arguments", "_plan", reader=True),
    "batch": Command("several targets in a row (make batch IDS=\"101 111\"), past failures; a kill ends the run in "
                     "flight and starts no further one", "harness.batch", None, "cli", passthrough=True),
    "campaign": Command("every selected row REPEATS times on this machine, pass after pass (make campaign "
                        "CHAPTER=1)", "harness.campaign", None, "cli", passthrough=True),
    "slurm": Command("write an sbatch script (one torchrun per node via srun) and submit it (make slurm-<target>)",
                     None, "_target", "_slurm"),
    "docker-run": Command("a container of docker/Dockerfile's image with the GPUs (make docker-run; --print: "
                          "the docker command only)", "harness.docker", None, "cli", passthrough=True),
    "list": Command("every target: id, GPUs, what it shows (make list)", None, None, "_list"),
    "targets": Command("target ids only, one per line (the Makefile reads these)", None, None, "_targets"),
    "parse": Command("summarise a Megatron log (--json for the record fields)", "core.logparse"),
    "tables": Command("rebuild results/*.md and their figures from committed run records (make tables)",
                      None, "_tables_arguments", "_tables"),  # no reader: write_tables is one (a skip stays light)
    "compare": Command("your outdir's runs beside the committed ones, pages in OUTDIR/compare (make compare)",
                       "results.compare", reader=True),
    "plots": Command("redraw the figures only, results/plots/*.svg (make plots; --out DIR)", "results.plots",
                     reader=True),
    "data-report": Command("rebuild results/data/README.md from the real-data run records (make tables)",
                           "results.datareport", reader=True),
    "check": Command("evaluate the papers' trend claims against the records (make check)", "results.checks",
                     reader=True),
    "transcript": Command("regenerate results/quickstart/transcript.txt from the quickstart page's commands "
                          "(--check; --gpu: on a GPU machine, the run too)", "results.transcript"),
    "prepare-data": Command("tokenize a corpus into Megatron's .bin/.idx (make prepare-data; --help)",
                            "harness.data", None, "cli", passthrough=True),
    "refresh": Command("recompute run records' measured fields from their raw log and memory CSV", None,
                       "_refresh_arguments", "_refresh"),
    "arguments": Command("Megatron's flags, by group (--count: how many; PATTERN: only matching ones)",
                         "harness.arguments"),
    "variables": Command("the make variables, their defaults and meaning (make help; NAME: one variable, FAST: "
                         "the lever table; --names: names only)", "core.variables"),
    "levers": Command("rewrite docs/levers.md, the lever reference, from the lever table (--check: only say whether "
                      "it is up to date)", "core.leverdoc"),
    "python": Command("the Python and torch make runs targets with (make which-python)", "harness.pyinfo", None),
    "integrity": Command("rebuild results/integrity/README.md (--check: only say whether it is up to date)",
                         "results.integrity", reader=True),
    "bench": Command("the GPU benchmark (make bench: `bench run`, then its page)", None, "_bench_arguments",
                     "_bench"),
    "bench-report": Command("rebuild results/bench/README.md from the bench's records (make bench-report)",
                            None, None, "_bench_report", reader=True),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The tree: every command's subparser; only `command`'s arguments are declared (its module imported)."""
    return _tree(command)[0]


def _tree(command: str | None, only: bool = False) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser | None]:
    """(the tree, `command`'s own parser); ONLY: the tree of that one command (what running it parses, and its usage
    and errors say: thirty subparsers cost a command 3 ms)."""
    own = None
    top = argparse.ArgumentParser(prog="python -m megalab", description="megalab's commands (what the Makefile calls).",
                                  epilog="`python -m megalab COMMAND --help` for one command's arguments.",
                                  formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=24,
                                                                                      width=110))
    sub = top.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, c in COMMANDS.items():
        if only and name != command:
            continue
        p = sub.add_parser(name, help=c.help, description=c.help, add_help=not c.passthrough)
        if name == command:
            declare, run = c.functions()
            if declare:
                declare(p)
            p.set_defaults(run=run)
            own = p
    return top, own


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name = argv[0] if argv else None
    if name in (None, "help"):
        parser().print_help()
        return 0
    if name.startswith("-"):  # -h / --help; any other option before a command is argparse's usage error
        try:
            parser().parse_args(argv[:1])
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 2
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        print(f"megalab: unknown command '{name}'" + (f" (closest: {close[0]})" if close else "")
              + "; fix: python -m megalab --help lists the commands", file=sys.stderr)
        return 2
    from megalab.core.catalog import CatalogError
    from megalab.core.infile import InputError
    from megalab.core.variables import LaunchError

    try:
        top, own = _tree(name, only=True)
        args, rest = top.parse_known_args(argv)
        if COMMANDS[args.command].passthrough:
            return args.run(rest)
        if rest:  # the command's own usage, and what it did not recognise (exits 2)
            own.error(f"unrecognized arguments: {' '.join(rest)}")
        if not COMMANDS[args.command].reader:
            return args.run(args)
        from megalab.core import git, records

        with git.asked_once(), records.read_once():  # nothing commits or writes a record while it reads
            return args.run(args)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except (CatalogError, LaunchError, InputError) as e:  # a bad input: one line, its fix
        print(f"megalab: {e}", file=sys.stderr)
        return 2


# ---- the commands of no module of their own -------------------------------------------------------------

def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="a catalog id or its number (101)")


def _slurm(args) -> int:
    from megalab.harness import slurm

    return slurm.submit(args.target)


def _list(args) -> int:
    from megalab.core import catalog

    chapters = catalog.chapters()
    rows = [["target", "GPUs", "reproduces", "what it shows"]]
    for exp in catalog.catalog().values():
        kind = f"ref {exp.ref}" if exp.ref else (f"{exp.gpus}-GPU analogue of {exp.analogue_of}" if exp.analogue_of else "")
        rows.append([exp.id, str(exp.gpus), kind, exp.about])
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    rows.insert(1, ["-" * w for w in widths])
    for r in rows:  # GPUs right-aligned, as a number column
        print("  ".join(r[c].rjust(widths[c]) if c == 1 else r[c].ljust(widths[c]) for c in range(4)).rstrip())
    print(f"\n{len(rows) - 2} targets in {len(chapters)} chapter(s). Run one: make <target>  "
          "(DRY_RUN=1 prints the plan; ITERS=, GPU_MEM_GB=, NNODES= see `make help`)")
    return 0


def _targets(args) -> int:
    from megalab.core import catalog

    print("\n".join(catalog.catalog()))
    return 0


def _tables_arguments(p: argparse.ArgumentParser) -> None:
    from megalab.results import uptodate

    uptodate.add_arguments(p)


def _tables(args) -> int:
    """The pages' build, skipped where nothing it reads changed since it last ran (results/uptodate.py): pandas and
    the records are loaded only for a build."""
    from megalab.results import uptodate

    def build(args) -> int:
        from megalab.results import tables

        return tables.main(args)

    return uptodate.main(args, build)


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    from megalab.harness import commands

    commands.plan_arguments(p)


def _plan(args) -> int:
    """--validate: the estimator against the records (results/validation.py); else one target's prediction."""
    if args.validate:
        from megalab.results import validation

        return validation.main(args)
    from megalab.harness import commands

    return commands.plan_main(args)


def _refresh_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="DIR", help="a run directory (its run.json, logs.txt, CSV)")
    p.add_argument("--force", action="store_true", help="write a record that loses a status or measurements (FORCE=1)")


def _refresh(args) -> int:
    """Each DIR's record derived again; a DIR whose record, log or memory CSV cannot be read is one line
    (the others are refreshed), and the exit status 2."""
    from pathlib import Path

    from megalab.core.logparse import LogReadError
    from megalab.core.schema import RecordError
    from megalab.core.variables import value
    from megalab.harness import record

    rc, force = 0, args.force or value("FORCE")
    for d in args.run_dirs:
        try:
            print(record.one_line(record.refresh(Path(d), force)))
        except (RecordError, LogReadError) as e:
            fix = "" if "fix:" in str(e) else "; fix: restore the run's raw log (or leave the record as it is)"
            print(f"megalab refresh: {e}{fix}", file=sys.stderr)
            rc = 2
    return rc


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from megalab.harness import bench

    bench.add_arguments(p)


def _bench(args) -> int:
    """The GPU benchmark's runs, then its page (make bench)."""
    from megalab.harness import bench
    from megalab.results import benchreport

    rc = bench.main(args)
    if args.cmd == "run" and rc == 0:
        benchreport.write(benchreport.BENCH_DIR)
    return rc


def _bench_report(args) -> int:
    from megalab.results import benchreport

    print(benchreport.write(benchreport.BENCH_DIR))
    return 0


def _exit(rc) -> None:
    """Exit with RC. A process that imported Megatron (for its argument check) would then spend ~1 s tearing
    down its 3,000 modules, a fifth of a first dry run: the exit handlers run and the streams are flushed, as at
    any exit, and the process ends without the teardown."""
    if "megatron.core" in sys.modules and isinstance(rc, int):
        import atexit
        import os

        atexit._run_exitfuncs()  # logging's flush, weakref.finalize (temporary folders), the libraries' own
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken pipe: nothing more to say there
                stream.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    _exit(main())
