"""The terminal's view of a run: one progress line per iteration, with the time left.

The full log (every rank, every line) goes to the run's `logs.txt`; the terminal gets where the run
is, its pace and an ETA. On a terminal the line is rewritten in place (`\\r`); into a file or a pipe
(CI, nohup) it is a plain line about every tenth of the run instead, so the capture stays short.
VERBOSE=1 streams the whole log, as `tail -f logs.txt` would.
"""
from __future__ import annotations

import statistics
import sys
from typing import TextIO

from megalab.core.logparse import parse_iteration_line

PACE_WINDOW = 10  # recent steps the ETA is based on: a median, so a slow checkpoint step does not swing it


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Progress:
    def __init__(self, out: TextIO | None = None, tty: bool | None = None, verbose: bool = False):
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.verbose = verbose
        self.steps: list[float] = []
        self.lines = 0
        self.last_printed: int | None = None
        self.open_line = False  # a `\r` line is on screen and needs its newline

    def line(self, it) -> str:
        total = it.train_iters or it.iteration
        parts = [f"iteration {it.iteration}/{total}"]
        if self.steps:
            pace = statistics.median(self.steps[-PACE_WINDOW:])
            parts.append(f"{pace:.0f} ms/step")
        if it.lm_loss is not None:
            parts.append(f"loss {it.lm_loss:.4f}")
        if self.steps:
            parts.append(f"ETA {_clock((total - it.iteration) * pace / 1000)}")
        return "progress   " + " | ".join(parts)

    def feed(self, raw: str) -> None:
        """One line of the log, as the run prints it."""
        if self.verbose:
            self.out.write(raw if raw.endswith("\n") else raw + "\n")
            self.out.flush()
            return
        self.lines += 1
        it = parse_iteration_line(raw)
        if it is None:
            if self.tty and self.last_printed is None and self.lines % 50 == 1:
                self._show(f"starting   Megatron initialising ({self.lines} log lines so far)")
            return
        if it.elapsed_ms is not None and it.iteration > 1:  # iteration 1 carries start-up costs
            self.steps.append(it.elapsed_ms)
        if self.tty:
            self._show(self.line(it))
        else:
            total = it.train_iters or it.iteration
            every = max(1, total // 10)
            if self.last_printed is None or it.iteration % every == 0 or it.iteration >= total:
                self.out.write(self.line(it) + "\n")
        self.last_printed = it.iteration
        self.out.flush()

    def _show(self, text: str) -> None:
        self.out.write("\r" + text + "\x1b[K")  # \x1b[K: clear what a longer previous line left
        self.out.flush()
        self.open_line = True

    def close(self) -> None:
        if self.open_line:
            self.out.write("\n")
            self.out.flush()
            self.open_line = False
