"""The make that started us: a signal to make ends our run in flight as a signal to us does.

`make batch` and `make campaign` exec one Python in place of the recipe's shell, so make is its parent.
GNU make passes SIGTERM on to the recipe it runs. SIGINT and SIGHUP reach the recipe only when they are
sent to the whole process group, as a terminal's Ctrl-C or hang-up is; sent to make alone (kill -INT
PID), make waits for the recipe to end and then dies of the signal, and a batch would start launch
after launch meanwhile. On Linux a process's caught signals show in /proc/PID/status (SigCgt), and make
stops catching such a signal once it has it (to die of it after waiting). `follow()` watches for that
and passes the signal on to us, unless it reached us as well within a moment (a signal to the group):
the run in flight ends `killed` (supervise.py) and the launcher raises SystemExit, so no further launch
starts. If make dies outright (SIGKILL), the kernel sends us SIGTERM (deathsig.py). Elsewhere than
Linux, or under another parent, there is nothing to watch.
"""
from __future__ import annotations

import os
import select
import signal
import threading
from pathlib import Path

from megalab.harness import deathsig

PASSED_ON = (signal.SIGINT, signal.SIGHUP)  # make passes SIGTERM on by itself
POLL_S = 0.2
GROUP_S = 0.5  # a signal to make's process group reaches us too, within this


def caught(pid: int) -> int | None:
    """The signals process `pid` catches, as the bit mask of /proc/PID/status (signal n: bit n-1); None
    where that cannot be read (gone, not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def is_make(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("make", "gmake")
    except OSError:
        return False


def dying_of(before: int, now: int) -> list[int]:
    """The PASSED_ON signals make caught before and no longer catches: it got them."""
    return [s for s in PASSED_ON if before >> (s - 1) & 1 and not now >> (s - 1) & 1]


def follow(poll_s: float = POLL_S) -> threading.Thread | None:
    """Under make (our parent), from the main thread: arm the parent-death signal and start the watcher
    thread; None where there is no make to watch."""
    parent = os.getppid()
    if threading.current_thread() is not threading.main_thread() or not is_make(parent):
        return None
    before = caught(parent)
    if before is None:
        return None
    deathsig.arm(parent)
    # Every signal that reaches us (with a Python handler: the launcher's, or Ctrl-C's) is written as
    # one byte to this pipe: how the watcher tells a signal to the group from one to make alone.
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    t = threading.Thread(target=_watch, args=(parent, before, r, poll_s), name="make-parent", daemon=True)
    t.start()
    return t


def _watch(parent: int, before: int, r: int, poll_s: float) -> None:
    got: set[int] = set()

    def collect(timeout: float) -> None:
        if select.select([r], [], [], timeout)[0]:
            got.update(os.read(r, 64))

    while True:
        collect(poll_s)
        now = caught(parent)
        if now is None or os.getppid() != parent:  # make is gone: deathsig.py took it from here
            return
        dying = dying_of(before, now)
        if dying:
            collect(GROUP_S)
            sig = dying[0]
            if sig not in got:
                os.kill(os.getpid(), sig)
            return
