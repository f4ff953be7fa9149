"""`make resume-<id>`: train, stop half way with a checkpoint, resume from it, check the seam.

Two launches of the same target with the same --train-iters (ITERS): the first stops at ITERS/2 as
an interrupted job would (--exit-interval) and saves there; the second loads that checkpoint and
trains on to ITERS. Megatron restores the weights, the optimizer state, the RNG state, the
iteration count and the learning-rate schedule, and its data loader skips the samples already
seen, so the resumed log must start at iteration ITERS/2 + 1 with a loss close to where the first
one stopped, not the ~10.8 of a fresh model. Both records are kept (target `resume-<id>`); the
second carries the check as `resume_check`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from megalab.harness import here, record
from megalab.core.catalog import Experiment
from megalab.core.variables import LaunchError
from megalab.core import logparse
from megalab.core.schema import RESUME_INCONCLUSIVE, resume_verdict


def check(saved_log, resumed_log, stop_at: int) -> dict:
    """Does the resumed run continue where the saving run stopped?

    ok when its first logged iteration is stop_at + 1 and its first loss is nearer the saving run's
    last loss than that run's first (a restart from scratch would land near the first).
    """
    saved, resumed = logparse.parse_file(saved_log), logparse.parse_file(resumed_log)
    s_loss = [it.lm_loss for it in saved.iterations if it.lm_loss is not None]
    r_its = [it for it in resumed.iterations if it.lm_loss is not None]
    out = {"stop_at": stop_at, "saved_last_iteration": saved.iterations[-1].iteration if saved.iterations else None,
           "saved_first_loss": s_loss[0] if s_loss else None, "saved_last_loss": s_loss[-1] if s_loss else None,
           "resumed_first_iteration": r_its[0].iteration if r_its else None,
           "resumed_first_loss": r_its[0].lm_loss if r_its else None}
    if not (s_loss and r_its):
        return out | {"ok": False, "why": "a log has no loss values"}
    seam = abs(out["resumed_first_loss"] - out["saved_last_loss"])
    fresh = abs(out["resumed_first_loss"] - out["saved_first_loss"])
    ok_iter = out["resumed_first_iteration"] == stop_at + 1
    # The seam tells a resume from a restart only where the saved run's loss moved away from a fresh model's
    # by more than one step swings it (mock data over a few iterations does not: 10.85 -> 10.90 in 5 steps
    # with swings of 0.12 on 101).
    drift = abs(s_loss[-1] - s_loss[0])
    swing = max((abs(b - a) for a, b in zip(s_loss, s_loss[1:])), default=0.0)
    if ok_iter and drift < swing:
        return out | {"loss_jump": round(seam, 4), "ok": False,
                      "why": f"{RESUME_INCONCLUSIVE}: the saved run's loss moved {drift:.4f} over {len(s_loss)} "
                             f"iterations, less than one step swings it ({swing:.4f}), so a restart would look the "
                             "same; fix: more iterations (e.g. ITERS=40) or real data (DATA=...)"}
    why = [] if ok_iter else [f"resumed at iteration {out['resumed_first_iteration']}, expected {stop_at + 1}"]
    if seam >= fresh:
        why.append("the resumed loss is nearer a fresh model's than the saved run's last")
    return out | {"loss_jump": round(seam, 4), "ok": not why, "why": "; ".join(why) or None}


def line(c: dict) -> str:
    if c.get("resumed_first_loss") is None or c.get("saved_last_loss") is None:
        return f"resume     FAIL: {c['why']}"
    return (f"resume     {resume_verdict(c['ok'], c['why'])}: saved at iteration {c['saved_last_iteration']} "
            f"(loss {c['saved_first_loss']:.4f} -> {c['saved_last_loss']:.4f}); resumed at iteration "
            f"{c['resumed_first_iteration']} with loss {c['resumed_first_loss']:.4f}"
            + (f" ({c['why']})" if c["why"] else ""))


def run(exp: Experiment, opts, launch) -> int:
    """Both launches; `launch` is launch.launch (passed in: launch.py imports this module)."""
    if opts.iters < 4 or opts.load:
        raise LaunchError(f"resume-{exp.id} trains ITERS/2 steps, saves, and resumes to ITERS; "
                                 f"fix: ITERS=4 or more (e.g. ITERS=40), and no LOAD (it makes its own)")
    stop = opts.iters // 2
    exp = exp.model_copy(update={"id": f"resume-{exp.id}"})
    print(f"resume     launch 1 of 2: iterations 1-{stop} of {opts.iters}, checkpoint at {stop}")
    first = launch(exp, dataclasses.replace(opts, save=True, save_interval=stop, exit_interval=stop))
    if first is None:  # DRY_RUN: the second launch's command, loading the first's checkpoint dir
        load = Path("RUN_DIR_OF_LAUNCH_1/checkpoints")
        second = here.plan_here(exp, dataclasses.replace(opts, load=load))
        print(f"resume     launch 2 of 2: iterations {stop + 1}-{opts.iters}, loading launch 1's checkpoint")
        print(second.command)
        return 0
    rec1, dir1 = first
    if rec1["status"] != "ok":
        print(f"resume     launch 1 ended {rec1['status']}: nothing to resume")
        return 1
    print(f"resume     launch 2 of 2: iterations {stop + 1}-{opts.iters} from {dir1 / 'checkpoints'}")
    rec2, dir2 = launch(exp, dataclasses.replace(opts, load=dir1 / "checkpoints"))
    rec2["resume_check"] = c = check(dir1 / "logs.txt", dir2 / "logs.txt", stop)
    record.write(rec2, dir2 / "run.json")
    print(line(c))
    return 0 if rec2["status"] == "ok" and c["ok"] else 1
