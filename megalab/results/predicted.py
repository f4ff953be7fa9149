"""What to expect before renting 8 GPUs: the estimator's prediction for the published rows no machine
here runs (more GPUs than the rig lends), beside the published number.

A prediction is what `python -m megalab plan TARGET GPU=h100` prints: the plan `make TARGET` would build
on an H100 80GB machine without Transformer Engine (megalab's TE-free spec, today's default levers,
CUDA_GRAPH=auto), and the estimator's peak memory and step time for it (plan.estimate_of, the preflight's
own code path). It is labelled predicted wherever it appears and never stands in a measured column, a
Δ, a check or a quote. The page says how far the estimator is off on the runs that were measured, from
results/estimate-vs-measured.md's computation (validation.py).
"""
from __future__ import annotations

import functools
import statistics

from megalab.core import catalog, plan
from megalab.core.estimate import Estimate
from megalab.core.gpus import short_gpu_name
from megalab.core.variables import LaunchError, Options
from megalab.results import validation
from megalab.results.chapter import RIG_GPUS

GPU = "h100"  # the card the predictions are for (GPU=h100): the published tables' own


def wanted(exp: catalog.Experiment) -> bool:
    """A row no machine here can run gets a prediction."""
    return exp.gpus > RIG_GPUS


@functools.lru_cache(maxsize=None)
def _options() -> tuple[Options, plan.Machine]:
    opts = Options(gpu=GPU, dry_run=True, master_port=6000)  # a fixed port: planning only, nothing binds
    name, memory, _ = plan.planning_gpu([], [], opts)
    return opts, plan.Machine(te=None, gpu_name=name, gpu_memory_gib=memory)


@functools.lru_cache(maxsize=None)
def _predicted(target: str) -> Estimate | None:
    opts, machine = _options()
    try:
        return plan.estimate_of(plan.build(catalog.get(target), opts, machine, environ={}))
    except (LaunchError, NotImplementedError, KeyError, ValueError, ZeroDivisionError):
        return None  # no plan for this layout: the cell stays empty


def predicted(exp: catalog.Experiment) -> Estimate | None:
    """The estimate `plan TARGET GPU=h100` prints for a row that needs more GPUs than the rig lends."""
    return _predicted(exp.id) if wanted(exp) else None


def machine_text(exp: catalog.Experiment) -> str:
    """'8x H100 80GB': what a row's prediction is for."""
    return f"{exp.gpus}x {short_gpu_name(_options()[1].gpu_name)}"


@functools.lru_cache(maxsize=None)
def errors() -> dict[str, tuple[float, float, int]]:
    """How far the estimator is off on measured runs it was not fitted on (results/estimate-vs-measured.md's
    held-out unseen runs): {"step time", "step time, 2+ GPUs", "memory"} -> (median |error|, worst, runs).
    A set with no runs (a tree with few records) is left out: no figure is made up for it."""
    steps = validation.step_rows()
    mem = [r for r in validation.validation_rows(detail=False) if r["status"] == "ok"]
    step_unseen = validation.by_set(steps)[2][1]
    out = {}
    for name, sel in (("step time", step_unseen), ("step time, 2+ GPUs", [r for r in step_unseen if r["gpus"] > 1]),
                      ("memory", validation.by_set(mem)[2][1])):
        errs = [r["err"] for r in sel]
        if not errs:
            continue
        out[name] = (statistics.median(abs(e) for e in errs), max(errs, key=abs), len(errs))
    return out


def note() -> str:
    """The footnote of a page with predicted columns."""
    figures = "; ".join(f"{name} median |error| {med:.1%} (worst {worst:+.1%}, {n} runs)"
                        for name, (med, worst, n) in errors().items()) or "no such runs among the records yet"
    _, machine = _options()
    return ("`predicted GiB` / `predicted ms` (predicted, not measured): for the rows that need more GPUs than "
            f"the rig lends ({RIG_GPUS}), the estimator's peak memory per GPU and step time on "
            f"{short_gpu_name(machine.gpu_name)} cards without Transformer Engine (megalab's TE-free spec, "
            "today's default levers, CUDA_GRAPH=auto), exactly what `.venv/bin/python -m megalab plan <make target> "
            "GPU=h100` prints; beside the published TE numbers, never in our measured columns, a Δ, a check or a "
            "quote. How far the estimator is off on measured runs it was not fitted on (the held-out unseen "
            f"runs of [results/estimate-vs-measured.md](../results/estimate-vs-measured.md)): {figures}.")
