"""Exec a command that dies with its launcher, even when the launcher is SIGKILLed.

The supervised run (torchrun and its workers) lives in its own session, so that one signal reaches all
of it (supervise.py). The other side of that: if the launcher itself is killed with SIGKILL (an OOM
killer, `kill -9`, a SLURM step ending hard), it has no chance to end the run, and torchrun would keep
the GPUs. Linux's PR_SET_PDEATHSIG closes that gap: the kernel sends the child SIGTERM when its parent
dies, and torchrun answers SIGTERM by ending its workers. The setting survives exec, so this shim sets
it, checks the launcher is still there (it may have died before), and execs the command in place:
same PID, same session, nothing else changes.

    python -S deathsig.py LAUNCHER_PID -- torchrun ...

Standard library only, run with -S (no site): it starts in a few tens of milliseconds. Elsewhere than
Linux it only execs.
"""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def arm(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for `sig` when our parent dies; False where that is not possible. Exits at once
    (status 128+sig, as if the signal came) if the parent `parent` is already gone."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        ok = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the launcher died before the request took effect: nobody will tell us
        os._exit(128 + int(sig))
    return ok


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: deathsig.py LAUNCHER_PID -- COMMAND [ARG...]")
    arm(int(argv[0]))
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as e:  # the run's log gets one line, and the record a failed run, not a traceback
        print(f"megalab: cannot start {argv[2]}: {e.strerror}; fix: put it on PATH (torchrun comes with "
              "torch: use the Python that has torch)", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
