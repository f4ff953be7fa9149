"""`make campaign`: one measurement campaign on this machine: the selected rows, REPEATS times each.

A table row stands for what `make <target>` gives today, and one launch is one sample: identical
commands differ between runs (about 2-4% on one machine, GPU-RIG.md) and more between machines
(results/checks.md, "Between machines", from the committed runs). A campaign therefore runs every selected target
REPEATS times (default 3) on this machine alone, pass after pass (101, 111, ..., then 101, 111, ...
again), so that the machine's drift spreads over all rows instead of landing on one; the summary
says how large that drift was (last launch of each target against its first). Each launch is
exactly `make <target>` (launch.launch: the same plan, checks, watchdog and record), so `make tables`
then shows each row as the median of its runs with their range, and `make check` may compare rows
(one machine, one code).

    make campaign CHAPTER=1                  chapter 1's targets that fit the GPUs here, 3 times each
    make campaign IDS="101 111" REPEATS=5    these targets, 5 times each
    make campaign STALE=1 [CHAPTER=2]        the rows short of REPEATS ok runs of today's code and defaults
                                             on this machine (a chapter's rows compare on one machine),
                                             committed or under OUTDIR (so a stopped campaign goes on)
    BUDGET_S=1200 make campaign CHAPTER=2    start no launch after 20 minutes (the summary says what is short)
    DRY_RUN=1 make campaign CHAPTER=1        what would run, and what is skipped and why
    DRY_RUN=1 GPUS=2 make campaign STALE=1   the same, planned for 2 GPUs from a machine without them

Targets that need more GPUs than this machine has are skipped (named, with the count). A target
whose first launch ran out of memory is not launched again: its status is the result, and a repeat
adds nothing. Ctrl-C (or a kill) ends the campaign with the run in flight (its record says `killed`).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from megalab.core import catalog
from megalab.core.catalog import CatalogError, Experiment
from megalab.core.variables import LaunchError, Options
from megalab.core.paths import ROOT
from megalab.core import provenance
from megalab.core.records import RunRecord, read_records
from megalab.harness import launch as launcher
from megalab.core import estimate
from megalab.harness import makeparent, monitor

DEFAULT_REPEATS = 3
ANOTHER_MACHINE = "(another machine)"  # DRY_RUN=1 GPUS=N: the GPUs are elsewhere, a machine none of the runs came from
NO_GPU = "no GPU here (nvidia-smi/NVML found none)"


def choose(ids: list[str], chapter: int | None, every: bool = False) -> list[Experiment]:
    """The targets named (IDS), of a chapter, or (`every`, for STALE=1) the whole catalog, in that order
    and once each. Raises LaunchError (or CatalogError) for no or an unknown selection."""
    if ids:
        exps = [catalog.get(i) for i in ids]  # CatalogError names an unknown id and the fix
    elif chapter is not None:
        if chapter not in catalog.chapters():
            raise LaunchError(f"campaign: no chapter {chapter}; fix: CHAPTER= one of "
                              f"{', '.join(str(c) for c in sorted(catalog.chapters()))}")
        exps = [e for e in catalog.catalog().values() if e.chapter == chapter]
    elif every:
        exps = list(catalog.catalog().values())
    else:
        raise LaunchError('campaign: nothing selected; fix: CHAPTER=1, IDS="101 111" or STALE=1')
    return list(dict.fromkeys(exps))  # once each, in the order given


def by_gpus(exps: list[Experiment], gpus_here: int) -> tuple[list[Experiment], list[tuple[str, str]]]:
    """(the targets that fit the GPUs here, the others with why)."""
    run, skipped = [], []
    for e in exps:
        if e.gpus > gpus_here:
            skipped.append((e.id, f"needs {e.gpus} GPUs, {gpus_here} here"))
        else:
            run.append(e)
    return run, skipped


def todays_runs(root=None, machine: str | None = None, outdir=None) -> dict[str, tuple[int, bool]]:
    """target -> (its ok runs whose provenance is `today`, on `machine` (provenance.host_key) or, without
    one, on the machine with the most of them; whether a `today` run ran out of memory, on any machine):
    what a table row stands on now (megalab/core/provenance.py), counting the committed runs and those
    under OUTDIR (a campaign stopped by BUDGET_S goes on where it stopped)."""
    import itertools

    root = root or ROOT
    ok: dict[str, Counter] = {}  # target -> machine -> ok runs
    oom: set[str] = set()
    dirs = [root / "results" / "runs"]
    if outdir is not None and Path(outdir).resolve() != dirs[0].resolve():
        dirs.append(Path(outdir))
    seen: set[str] = set()  # a run folder copied from OUTDIR into results/runs (and kept there) counts once
    for r in itertools.chain.from_iterable(read_records(d, "megalab campaign") for d in dirs):
        if r.run_dir.name in seen or r.status not in ("ok", "oom") or provenance.of(r, root).state != provenance.CURRENT:
            continue
        seen.add(r.run_dir.name)
        if r.status == "oom":
            oom.add(r.target)
        elif machine is None or provenance.host_key(r) == machine:
            ok.setdefault(r.target, Counter())[provenance.host_key(r)] += 1
    return {t: (max(ok[t].values()) if t in ok else 0, t in oom) for t in set(ok) | oom}


def this_machine(inventory: dict) -> str | None:
    """This machine as provenance.host_key names a record's (host name, first GPU, its UUID); None
    without GPUs."""
    import socket

    if not inventory.get("count"):
        return None
    return provenance.machine_key(socket.gethostname(), inventory["names"][0], inventory.get("uuids") or [])


def stale(exps: list[Experiment], repeats: int, today: dict[str, tuple[int, bool]]) -> list[Experiment]:
    """The targets whose row lacks `repeats` ok runs of today's code (todays_runs: on this machine) (an
    out-of-memory run of today's code completes a row: it is the result)."""
    def short(e: Experiment) -> bool:
        runs, oom = today.get(e.id, (0, False))
        return not oom and runs < repeats

    return [e for e in exps if short(e)]


def schedule(exps: list[Experiment], repeats: int, have: dict[str, int] | None = None) -> list[tuple[int, Experiment]]:
    """(pass, target) in launch order: every target once per pass, passes one after another. `have`: the ok
    runs a target already has (STALE=1), so it is topped up to `repeats`, not launched `repeats` more times."""
    have = have or {}
    return [(p, e) for p in range(1, repeats + 1) for e in exps if p > have.get(e.id, 0)]


def summary(results: dict[str, list[RunRecord]], skipped: list[tuple[str, str]], repeats: int,
            have: dict[str, int] | None = None) -> list[str]:
    """One line per target: its launches' statuses and, over the ok ones, median step and range; `have`:
    the ok runs it had before (STALE=1), counted towards `repeats`."""
    have = have or {}
    lines = ["campaign   target: launches (statuses) -> median of the ok runs' median step [lowest-highest]"]
    ok_ms = {target: [r.step_ms_median for r in recs if r.status == "ok" and r.step_ms_median]
             for target, recs in results.items()}  # in launch order
    for target, recs in results.items():
        statuses = [r.status for r in recs]
        ms = ok_ms[target]
        what = (f"{statistics.median(ms):.0f} ms [{min(ms):.0f}-{max(ms):.0f}]" if ms else "no ok run")
        before = have.get(target, 0)
        short = "" if before + len(recs) >= repeats or "oom" in statuses else f"  (short of {repeats})"
        lines.append(f"campaign   {target}: {len(recs)} ({', '.join(statuses)}) -> {what}{short}"
                     + (f"  (+{before} ok before)" if before else ""))
    for target, why in skipped:
        lines.append(f"campaign   {target}: skipped ({why})")
    drift = [ms[-1] / ms[0] - 1 for ms in ok_ms.values() if len(ms) > 1]
    if drift:  # passes run one after another: a shift common to every target is the machine's, not the rows'
        lines.append(f"campaign   drift: last launch against the first, median over {len(drift)} targets "
                     f"{statistics.median(drift):+.1%} (from {min(drift):+.1%} to {max(drift):+.1%})")
    machines = {u for recs in results.values() for r in recs for u in (r.gpu_uuids or [])[:1]}
    if machines:
        lines.append(f"campaign   machine: first GPU {', '.join(sorted(m[:13] for m in machines))} "
                     "(one machine: its rows may be compared)")
    return lines


def run(exps: list[Experiment], skipped: list[tuple[str, str]], repeats: int, opts: Options,
        budget_s: float | None = None, launch=None, clock=time.monotonic, have: dict[str, int] | None = None) -> int:
    """Launch the schedule (topping each target up from `have` ok runs to `repeats`); print the summary. 0
    when every planned launch ran and ended ok or oom."""
    if launch is None:
        launch = launcher.launch
    start = clock()
    results: dict[str, list[RunRecord]] = {e.id: [] for e in exps}
    out_of_time = False
    for p, exp in schedule(exps, repeats, have):
        if any(r.status == "oom" for r in results[exp.id]):
            continue  # an out-of-memory row is its result; a repeat adds nothing
        if budget_s is not None and clock() - start > budget_s:
            out_of_time = True
            break
        print(f"campaign   pass {p}/{repeats}: {exp.id}", flush=True)
        try:
            done = launch(exp, opts)
        except LaunchError:  # refused before it started (busy GPUs, ...): say what ran, then the error
            for line in summary(results, skipped, repeats, have):
                print(line)
            raise
        except (SystemExit, KeyboardInterrupt) as stop:  # a kill: the launcher ended the run in flight
            for line in summary(results, skipped, repeats, have):
                print(line)
            print(f"campaign   stopped at {exp.id} by a signal: no launch started after it", flush=True)
            raise SystemExit((stop.code or 1) if isinstance(stop, SystemExit) else 130) from None
        if done is not None:  # (the record the launcher wrote, its folder)
            results[exp.id].append(RunRecord.of(done[0], done[1]))
    for line in summary(results, skipped, repeats, have):
        print(line)
    if out_of_time:
        print(f"campaign   BUDGET_S={budget_s:g} spent: no launch started after it")
    bad = any(r.status not in ("ok", "oom") for recs in results.values() for r in recs)
    return 1 if bad or out_of_time else 0


STARTUP_GUESS_S = 40.0  # a launch without training, where no record says better (results/bench: "Where a launch goes")


OOM = "oom"  # the key under which committed_durations keeps the out-of-memory runs (start-up only)


def committed_durations() -> dict[str, list[tuple[float, float]]]:
    """target -> (start-up s, s per iteration) of each committed ok run (results/runs), and (OOM, target)
    -> the same of its out-of-memory runs; read once for a whole campaign. A run's duration is start-up
    plus its iterations at its median step, so a record of ITERS=25 still times a launch of ITERS=100."""
    out: dict = {}
    for r in read_records(ROOT / "results" / "runs", "megalab campaign"):
        if r.status not in ("ok", "oom") or not r.duration_s:
            continue
        per_iter = (r.step_ms_median or 0) / 1e3 if r.status == "ok" else 0.0
        startup = max(r.duration_s - per_iter * (r.train_iters or 0), 0.0)
        out.setdefault(r.target if r.status == "ok" else (OOM, r.target), []).append((startup, per_iter))
    return out


def launch_seconds(exp: Experiment, opts: Options, durations: dict) -> tuple[float, str, bool]:
    """(seconds, source, runs once) for one launch of exp: the median over its committed ok runs of
    start-up + ITERS x step time (`committed_durations`), else its out-of-memory runs' start-up, else
    the estimator's step time x ITERS plus STARTUP_GUESS_S (start-up alone where it predicts out of
    memory). `runs once`: an out-of-memory row, which the campaign launches once."""
    past = durations.get(exp.id)
    if past:  # each record's start-up plus this campaign's ITERS at its step time
        secs = statistics.median(up + per_iter * opts.iters for up, per_iter in past)
        return secs, f"median of {len(past)} committed run(s) at ITERS={opts.iters}", False
    if past_oom := durations.get((OOM, exp.id)):  # it ends at the first step: start-up only
        secs = statistics.median(up for up, _ in past_oom)
        return secs, f"out of memory: median of {len(past_oom)} committed run(s); runs once", True
    try:
        est = estimate.estimate(exp)
    except Exception:
        return STARTUP_GUESS_S, "no record, no estimate", False
    if not est.fits:  # it ends at the first step: start-up only, and the campaign launches it once
        return STARTUP_GUESS_S, "estimate: out of memory at the first step; runs once", True
    step = est.step_ms
    return (STARTUP_GUESS_S + step * opts.iters / 1e3,
            f"estimate: {step:.0f} ms x {opts.iters} + {STARTUP_GUESS_S:.0f} s", False)


def _int_env(name: str, default: int | None, environ, least: int = 1) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"campaign: {name}={raw!r} is not a whole number; fix: e.g. {name}=3") from None
    if value < least:
        raise LaunchError(f"campaign: {name}={value} must be at least {least}; fix: e.g. {name}=3")
    return value


def cli(argv: list[str], environ=os.environ) -> int:
    """make campaign: CHAPTER / IDS / STALE select, REPEATS (3), BUDGET_S (none), the run variables as for make <target>."""
    if argv:
        raise LaunchError("usage: make campaign CHAPTER=N | IDS=\"101 111\" | STALE=1 [REPEATS=3] [BUDGET_S=seconds]")
    ids = environ.get("IDS", "").split()
    chapter = _int_env("CHAPTER", None, environ, least=0) if not ids else None  # chapter 0: the two-GPU tour
    repeats = _int_env("REPEATS", DEFAULT_REPEATS, environ)
    budget = _int_env("BUDGET_S", None, environ)
    only_stale = environ.get("STALE", "").strip().lower() not in ("", "0", "false", "no")
    opts = Options.from_env()
    inventory = monitor.gpu_inventory()
    gpus_here, machine = inventory["count"] or 0, this_machine(inventory)
    if environ.get("GPUS", "").strip():
        if not opts.dry_run:
            raise LaunchError("campaign: GPUS= plans for GPUs that are not here, so it needs DRY_RUN=1; fix: "
                              "DRY_RUN=1 GPUS=2 make campaign ..., or drop GPUS= to run on the GPUs found")
        gpus_here, machine = _int_env("GPUS", None, environ), ANOTHER_MACHINE
    chosen = choose(ids, chapter, every=only_stale)
    have: dict[str, int] = {}  # STALE=1: ok runs of today's code a target has here, topped up to REPEATS
    if only_stale:  # before the GPU count: the skipped list then names only rows that need a run
        # on this machine: the rows a chapter compares (speedups, `make check`) must share one machine
        today = todays_runs(machine=machine, outdir=opts.outdir)
        short = stale(chosen, repeats, today)
        have = {e.id: today.get(e.id, (0, False))[0] for e in short}
        where = ("on a machine that has none of them yet (GPUS= plans for another machine)" if machine == ANOTHER_MACHINE
                 else f"on this machine ({machine})" if machine else "on any one machine (no GPU here to count on)")
        print(f"campaign   STALE=1: {len(short)} of {len(chosen)} target(s) short of {repeats} ok run(s) of today's "
              f"code and defaults {where} (a `today` out-of-memory run completes a row)")
        if not short:
            print("campaign   nothing to do")
            return 0
        chosen = short
    exps, skipped = by_gpus(chosen, gpus_here)
    if opts.dry_run:
        if not gpus_here:  # GPUS= would have set a count: none was found here
            print(f"campaign   {NO_GPU}: every target is skipped; GPUS=N plans for N GPUs, e.g. "
                  "DRY_RUN=1 GPUS=8 make campaign ...")
        print(f"campaign   {len(exps)} target(s) x {repeats} pass(es) on the {gpus_here} GPU(s) here "
              f"(DRY_RUN=1: nothing starts{'; each topped up from the ok runs it has' if any(have.values()) else ''})")
        total, launches, durations = 0.0, 0, committed_durations()
        for e in exps:
            secs, source, once = launch_seconds(e, opts, durations)
            n = 1 if once else repeats - have.get(e.id, 0)
            total, launches = total + secs * n, launches + n
            print(f"campaign   {e.id} ({e.gpus} GPU(s)): about {secs:.0f} s a launch ({source})")
        for target, why in skipped:
            print(f"campaign   {target}: skipped ({why})")
        if exps:
            print(f"campaign   about {total / 60:.0f} min for {launches} launches (an OOM row runs "
                  "once; the launcher's checks come on top)")
        return 0
    if not gpus_here:
        raise LaunchError(f"campaign: {NO_GPU}; fix: run it on the GPU machine, or plan it here with "
                          "DRY_RUN=1 GPUS=8 make campaign ...")
    if not exps:
        raise LaunchError(f"campaign: none of the selected targets fits the {gpus_here} GPU(s) here "
                          f"({'; '.join(f'{t}: {w}' for t, w in skipped)}); fix: run it on a machine with more GPUs")
    makeparent.follow()  # a signal to make ends the run in flight, as one to us does
    return run(exps, skipped, repeats, opts, budget, have=have)


if __name__ == "__main__":
    try:
        sys.exit(cli(sys.argv[1:]))
    except (CatalogError, LaunchError) as e:
        print(f"megalab: {e}", file=sys.stderr)
        sys.exit(2)
