"""Where a launch goes: the wall time of one `make <target>`, phase by phase, from its record and log.

A table row times the median *step*; a user waits for the whole *launch*. On the rig a 25-iteration
run of 101 trains for about 5 s of a launch several times longer (the section's table says how long).
The phases come from what every run already leaves: the record's `preflight_s`, `started` and
`ended` (the launcher) and Megatron's print_datetime markers in the log (the entry point's start, its
imports, Megatron's initialisation, the first and last training step). Nothing is timed twice; a
phase whose markers are missing stays empty.
"""
from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path

from megalab.core import logparse, markdown, provenance
from megalab.core.records import RunRecord, read_records

# (phase, what it is, start marker, end marker); "started"/"ended" are the record's own times.
PHASES = (
    ("torchrun", "torchrun starts the worker process", "started", "before library-setup"),
    ("imports", "the entry point imports torch and megalab.runtime", "before library-setup", "after library-setup"),
    ("Megatron args", "importing megatron.training, parsing and validating the arguments",
     "after library-setup", "before megatron-init"),
    ("Megatron init", "process groups, JIT fusion warm-up", "before megatron-init", "after megatron is initialized"),
    ("model + data", "building the model, optimizer and datasets",
     "after megatron is initialized", "before the start of training step"),
    ("training", "every iteration (warm-up, CUDA graph capture, timed steps)",
     "before the start of training step", "after training is done"),
    ("exit", "shutdown, process exit, the record", "after training is done", "ended"),
)


def _when(text: str | None) -> dt.datetime | None:
    """A record's ISO time or a Megatron datetime ('2026-11-23 12:15:07.855707', the rig's UTC clock)."""
    if not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def phases(rec: RunRecord) -> dict[str, float | None]:
    """Seconds per phase of one launch (preflight first, where the record has it)."""
    try:
        marks = dict(logparse.parse_file(rec.log_path).marks)
    except logparse.LogReadError:
        marks = {}
    times = {k: _when(v) for k, v in marks.items()}
    times["started"], times["ended"] = _when(rec.started), _when(rec.ended)
    out: dict[str, float | None] = {"preflight": rec.preflight_s}
    for name, _, a, b in PHASES:
        ta, tb = times.get(a), times.get(b)
        out[name] = round((tb - ta).total_seconds(), 1) if ta and tb else None
    return out


def rows(root: Path) -> list[list[str]]:
    """One row per target with ok records of today's code and defaults: the median of each phase."""
    by_target: dict[str, list[dict]] = {}
    for r in read_records(root / "results" / "runs", "megalab bench-report"):
        if r.status == "ok" and provenance.of(r, root).state == provenance.CURRENT:
            by_target.setdefault(r.target, []).append(phases(r) | {"_gpus": r.num_gpus, "_gpu": r.gpu_name,
                                                                   "_total": r.duration_s})
    out = []
    for target, runs in sorted(by_target.items()):
        def med(key):
            vals = [x[key] for x in runs if x.get(key) is not None]
            return f"{statistics.median(vals):.1f}" if vals else ""
        out.append([target, str(len(runs)), f"{runs[0]['_gpus']} x {runs[0]['_gpu']}", med("preflight"),
                    *(med(name) for name, *_ in PHASES), med("_total")])
    return out


def section(root: Path) -> list[str]:
    body = rows(root)
    if not body:
        return []
    legend = "; ".join(f"**{name}**: {what}" for name, what, *_ in PHASES)
    return ["## Where a launch goes", "",
            "Seconds of wall time per phase of a plain `make <target>` (median over the target's `today` runs in "
            "results/runs), from each record's times and Megatron's datetime markers in its log "
            "(megalab/results/launchtime.py). **preflight**: the launcher's plan and checks before the run "
            f"starts (records made before it was kept leave it empty); {legend}. `launch` is the record's "
            "`duration_s` (started to ended, the preflight not included).", "",
            *markdown.table(["target", "runs", "GPUs", "preflight", *(name for name, *_ in PHASES), "launch"], body),
            "",
            "Before 2026-11-23 the imports were the largest phase of a short run on the rig: its Python sets "
            "PYTHONDONTWRITEBYTECODE=1 over a torch installed without bytecode, so every process (the launcher's "
            "Megatron check and each worker) compiled torch from source ([import-torch-transcript.txt]"
            "(import-torch-transcript.txt) times `import torch` there, without and with the bytecode cache). "
            "The preflight's python line "
            "now says so (megalab/harness/pyinfo.py `recompiles`); the rig sessions unset it since 2026-11-23, and the "
            "imports column above is of those runs.", ""]
