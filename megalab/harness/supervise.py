"""Run one command to its end in bounded time, and leave none of its processes behind.

The command (torchrun and its workers) runs in its own session and process group, so one signal
reaches all of it. While it runs, SIGINT/SIGTERM/SIGHUP to the launcher end the whole group (the
launcher then writes its record), and a watchdog ends a run that went silent or that is still
alive long after Megatron's end-of-training line. Ending is SIGTERM, a grace period, then SIGKILL,
to the group and to any descendant that escaped it (setsid), found with psutil: by parentage, and
by a token put in the command's environment that every descendant inherits. If the launcher is
killed outright (SIGKILL), the kernel ends the command instead (deathsig.py).
"""
from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

from megalab.core.logparse import end_of_training, parse_iteration_line

TOKEN_VAR = "MEGALAB_RUN_TOKEN"  # marks every process of one supervised run (inherited environment)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TICK_S = 0.2  # how often the loop looks at signals and deadlines when the log is quiet


@dataclasses.dataclass(frozen=True)
class Limits:
    """Watchdog limits, seconds (make variables WATCHDOG_SILENT_S, WATCHDOG_STARTUP_S, EXIT_GRACE_S)."""

    silent_s: float = 300  # no output for this long after the first iteration line: hung
    startup_s: float = 900  # ... before it (imports, compilation, data, CUDA graph capture)
    exit_grace_s: float = 120  # alive and silent this long after the end-of-training line: exit_hang
    kill_grace_s: float = 10  # SIGTERM, then SIGKILL after this long


@dataclasses.dataclass
class Outcome:
    returncode: int | None  # the command's exit status (negative: the signal that ended it)
    reason: str | None  # None (it ended by itself) | "killed" | "hung" | "exit_hang" | "unwritable" (its log)
    detail: str  # one line, for the record and the terminal
    seconds: float
    signal: int | None = None  # the signal the launcher received ("killed")

    @property
    def exit_code(self) -> int:
        """What the launcher exits with after a kill: 128 + the signal, as a shell would."""
        return 128 + self.signal if self.signal else 1


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie holds no memory and no port)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _has_token(p: psutil.Process, token: str) -> bool:
    try:
        return p.environ().get(TOKEN_VAR) == token
    except psutil.Error:  # gone, or not ours to read
        return False


def _group(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def run_processes(root: int, token: str | None) -> set[psutil.Process]:
    """Every live process of the run: `root`, the members of its process group (it leads one), their
    descendants whatever group or session they moved to, and any process holding the run's token."""
    everyone = list(psutil.process_iter())
    ours: set[psutil.Process] = set()
    for p in everyone:
        if p.pid == root or _group(p) == root:
            ours.add(p)
            try:
                ours.update(p.children(recursive=True))
            except psutil.Error:
                pass
    if token:
        ours.update(p for p in everyone if p not in ours and _has_token(p, token))
    return {p for p in ours if p.pid != os.getpid() and _live(p)}


def _live(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_all(proc: subprocess.Popen, procs: set[psutil.Process], sig: int) -> None:
    if proc.returncode is None:  # the group at once (catches a fork since the scan); once the
        try:                     # leader is reaped its id may be reused: then only the processes found
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.send_signal(sig)  # psutil checks the process is still the one found (no reused PID)
        except psutil.Error:
            pass


def terminate(proc: subprocess.Popen, token: str | None, grace_s: float, hurry=lambda: False) -> None:
    """SIGTERM the run's processes, SIGKILL what is left after `grace_s` (or at once if `hurry()`)."""
    procs = run_processes(proc.pid, token)  # before the parent dies and its children are re-parented
    _signal_all(proc, procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not hurry():
        proc.poll()
        if not any(_live(p) for p in procs | run_processes(proc.pid, token)):
            break
        time.sleep(0.1)
    for _ in range(3):  # SIGKILL cannot be ignored; a few rounds catch late forks
        left = {p for p in procs | run_processes(proc.pid, token) if _live(p)}
        if not left:
            break
        _signal_all(proc, left, signal.SIGKILL)
        time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # unkillable (D state): report it rather than wait forever
        pass


DEATHSIG = Path(__file__).with_name("deathsig.py")


def dies_with_us(argv: list[str]) -> list[str]:
    """argv behind deathsig.py: the command gets SIGTERM from the kernel if this process dies, even by
    SIGKILL, when nothing here can end it (Linux; elsewhere the shim only execs)."""
    return [sys.executable, "-S", str(DEATHSIG), str(os.getpid()), "--", *argv]


def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, b""):
        q.put(line)
    q.put(None)


def supervise(argv: list[str], *, env: dict[str, str], log_path: Path,
              on_line: Callable[[str], None] = lambda line: None, limits: Limits = Limits()) -> Outcome:
    """Run `argv` (no shell) to its end: every line to `log_path` (flushed) and to `on_line`."""
    token = uuid.uuid4().hex
    caught: list[int] = []

    def on_signal(signum, frame):  # only a note: the loop below acts within TICK_S
        caught.append(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(dies_with_us(argv), env={**env, TOKEN_VAR: token}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        reason, detail = None, ""
        try:
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_reader, args=(proc.stdout, lines), name="run-log", daemon=True).start()
            reason, detail = _watch(proc, lines, log_path, on_line, limits, caught)
        finally:  # also when the log or the callback failed: the run never outlives its supervisor
            if reason or proc.poll() is None:
                terminate(proc, token, limits.kill_grace_s, hurry=lambda: len(caught) > 1)
            else:  # ended by itself: still nothing of it may outlive it (a worker torchrun left behind)
                terminate(proc, token, min(limits.kill_grace_s, 2.0))
        if caught and reason is None and proc.returncode not in (0, None):
            reason, detail = "killed", f"{signal.Signals(caught[0]).name} while the run was ending"
        return Outcome(proc.returncode, reason, detail, round(time.monotonic() - t0, 1),
                       signal=caught[0] if reason == "killed" else None)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _watch(proc, lines: queue.Queue, log_path: Path, on_line, limits: Limits, caught: list[int]):
    """Stream the log until the command ends or must be ended: (reason, detail). A log that cannot be written
    (a full disk, a file made unwritable) ends the run: nothing could be measured from it."""
    try:
        log = open(log_path, "wb")
    except OSError as e:
        return "unwritable", _unwritable(log_path, e)
    try:
        return _stream(proc, lines, _Log(log), on_line, limits, caught)
    except _LogUnwritable as e:
        return "unwritable", _unwritable(log_path, e.error)
    finally:
        try:
            log.close()
        except OSError:  # flushed line by line: what it held is written, or was said to be lost
            pass


class _LogUnwritable(Exception):
    def __init__(self, error: OSError):
        self.error = error


class _Log:
    """The run's log file, whose OSError (ENOSPC, EIO, EDQUOT) is told apart from a callback's."""

    def __init__(self, f):
        self.f = f

    def write(self, data: bytes) -> None:
        try:
            self.f.write(data)
        except OSError as e:
            raise _LogUnwritable(e) from None

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            raise _LogUnwritable(e) from None


def _unwritable(log_path: Path, e: OSError) -> str:
    return f"its log {log_path.name} could not be written ({e.strerror or e}); ended by the launcher"


def _stream(proc, lines: queue.Queue, log, on_line, limits: Limits, caught: list[int]):
    last_out = time.monotonic()
    iterating = False
    end_seen: float | None = None
    exited_at: float | None = None
    eof = False
    while True:
        if caught:
            return "killed", f"{signal.Signals(caught[0]).name} to the launcher"
        try:
            line = lines.get(timeout=TICK_S)
        except queue.Empty:
            line = b""
        now = time.monotonic()
        if line is None:  # end of output: the command and everything holding its pipe closed it
            eof = True
            line = b""
        elif line:
            log.write(line)
            log.flush()
            text = line.decode("utf-8", errors="replace")
            on_line(text)
            last_out = now
            if not iterating and parse_iteration_line(text) is not None:
                iterating = True
            # the exit grace counts from the last output after the end of training: Megatron
            # may still save a final checkpoint then, and says so
            if end_seen is not None or end_of_training(text):
                end_seen = now
        if proc.poll() is not None:
            # it exited; what is still in the pipe arrives at once, unless an escaped
            # process holds the pipe open: then stop reading after a second of quiet
            exited_at = exited_at or now
            if eof or now - max(exited_at, last_out) > 1.0:
                return None, ""
            continue
        # the watchdog (also when the command closed its output but runs on)
        if end_seen is not None and now - end_seen > limits.exit_grace_s:
            _dump_stacks(proc, lines, log)
            return "exit_hang", (f"still running, silent for {limits.exit_grace_s:g} s after Megatron's "
                                 "end-of-training line; ended by the launcher (EXIT_GRACE_S)")
        quiet = limits.silent_s if iterating else limits.startup_s
        if now - last_out > quiet:
            _dump_stacks(proc, lines, log)
            where = "after training began" if iterating else "during start-up"
            var = "WATCHDOG_SILENT_S" if iterating else "WATCHDOG_STARTUP_S"
            return "hung", f"no output for {quiet:g} s {where}; ended by the launcher ({var})"


WORKER_MARK = "pretrain_gpt"  # the entry point registers faulthandler on SIGUSR1 (megalab/runtime/pretrain_gpt.py)


def _dump_stacks(proc, lines: queue.Queue, log, wait_s: float = 3.0) -> None:
    """Before a hung run is ended: every worker's Python stacks into the log, so the record shows
    where it hung. Only the training workers get SIGUSR1 (torchrun would die of it)."""
    workers = []
    for p in run_processes(proc.pid, None):
        try:
            if any(WORKER_MARK in part for part in p.cmdline()):
                workers.append(p)
        except psutil.Error:
            continue
    if not workers:
        return
    log.write(f"megalab: watchdog: Python stacks of workers {' '.join(str(p.pid) for p in workers)} follow\n"
              .encode())
    for p in workers:
        try:
            p.send_signal(signal.SIGUSR1)
        except psutil.Error:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            break
        log.write(line)
    log.flush()
