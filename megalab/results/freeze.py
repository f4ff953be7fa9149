"""When the step-time model's fitted constants were frozen, and which runs came after.

An out-of-catalog run (results/holdout/runs: a configuration never in the catalog) is a clean test of
the step-time model only if the constants it is judged against were fixed before it ran. FROZEN_AT is
the commit whose megalab/core/steptime.py holds today's constants (tests/test_estimate.py keeps the two
equal, so a refit must move it). A run whose code descends from that commit ran with those constants:
out of sample. A run from before it was seen by the refit that set them: it counts as calibration (and
the fit uses it), and the page says how many did.

Workflow: commit A stores a refit; commit B sets FROZEN_AT to A (a commit cannot name itself).
"""
from __future__ import annotations

import functools
from pathlib import Path

from megalab.core import git
from megalab.core.paths import ROOT
from megalab.core.schema import stamp

# The commit that set today's step-time constants, and its commit time (what decides where git cannot:
# a tree copied without .git).
FROZEN_AT = "094066e4f69ceea2a66afb7cd54430fc78d09e8e"
FROZEN_TIME = "2026-11-27T06:30:48+00:00"
# The MoE constants (steptime.MOE_CONSTANTS: MoE layers under moe_gather, issue 63) are fitted on the catalog rows'
# runs with that lever and today's code that started by this time (validation.fit_moe): rows 510's and 513's three
# launches each at 06e8096 (one micro-batch and four); later ones (the trials beyond the catalog) are judged against
# them, and a refit that takes them in moves this time.
MOE_FROZEN_TIME = "2026-11-29T17:20:00+00:00"
STEPTIME_PATHS = ("megalab/core/steptime.py", "megalab/results/steptime.py")  # where the file lived


@functools.lru_cache(maxsize=256)
def _descends(commit: str, root: Path) -> bool | None:
    """Whether COMMIT contains FROZEN_AT (None where git cannot say)."""
    known = git.run(root, "cat-file", "-e", f"{commit}^{{commit}}")
    if known is None or known.returncode != 0:
        return None
    anc = git.run(root, "merge-base", "--is-ancestor", FROZEN_AT, commit)
    return None if anc is None or anc.returncode not in (0, 1) else anc.returncode == 0


def after_freeze(commit: str | None, started: str | None, root: Path = ROOT) -> bool:
    """Whether a run ran with today's step-time constants: its megalab commit (a `-dirty` tree read as
    its commit) descends from FROZEN_AT; where git does not know the commit, it started after FROZEN_TIME."""
    if commit:
        known = _descends(commit.removesuffix("-dirty"), Path(root))
        if known is not None:
            return known
    return stamp(started) > stamp(FROZEN_TIME)


def moe_fitted_on(records_dir: str, holdout_dir: str, moe_default: bool, started: str | None,
                  code_today: bool) -> bool:
    """Whether a run is one the MoE constants were fitted on: a catalog row's (not beyond the catalog) with
    today's MoE levers (moe_gather and expert_stack) and today's code, started by MOE_FROZEN_TIME."""
    return moe_default and code_today and records_dir != holdout_dir and stamp(started) <= stamp(MOE_FROZEN_TIME)


def constants_at(commit: str, names: tuple[str, ...], root: Path = ROOT) -> dict[str, float] | None:
    """The fitted constants as steptime.py stored them at COMMIT (None where git cannot read it)."""
    for path in STEPTIME_PATHS:
        shown = git.run(root, "show", f"{commit}:{path}")
        if shown is not None and shown.returncode == 0:
            out = {}
            for line in shown.stdout.splitlines():
                name, _, rest = line.partition(" = ")
                if name in names:
                    out[name] = float(rest.split("#")[0])
            return out
    return None
