"""Killing the make of `make batch` or `make campaign` ends the run in flight as `killed` and starts no
further one; nothing is left running (issue 31).

make runs the batch/campaign Python in place of the recipe's shell (exec), so make's own signal handling
decides: it passes SIGTERM on; SIGINT and SIGHUP reach the Python only when sent to the process group (a
terminal's Ctrl-C), and otherwise make.parent passes them on (makeparent.py). A fake torchrun that trains
two iterations and then hangs (tests/fixtures/fake_torchrun/) stands in for Megatron, behind the real
make, launcher, supervisor and record; PY (the Makefile's hook) is a Python that patches it in.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from megalab.harness import makeparent, supervise

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fixtures" / "fake_torchrun"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's")


def _wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _default_signals():  # make catches only the signals it did not inherit as ignored
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def _make(tmp_path, goal, **env):
    py = tmp_path / "py"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE / 'make_python.py'} \"$@\"\n")
    py.chmod(0o755)
    pids = tmp_path / "pids"
    pids.write_text("")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MAKE")}, "PY": str(py),
           "FAKE": "hang_silent.py", "FAKE_PIDS": str(pids), "OUTDIR": str(tmp_path / "out"),
           "WATCHDOG_SILENT_S": "120", "WATCHDOG_STARTUP_S": "120", **env}
    env.pop("MASTER_PORT", None)
    proc = subprocess.Popen(["make", "-s", *goal], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=_default_signals)
    return proc, pids


@pytest.mark.parametrize("goal,sig,to", [
    (["batch", "IDS=101 111"], signal.SIGTERM, "make"),
    (["batch", "IDS=101 111"], signal.SIGINT, "make"),
    (["batch", "IDS=101 111"], signal.SIGHUP, "make"),
    (["batch", "IDS=101 111"], signal.SIGINT, "group"),
    (["campaign", "IDS=101 111", "REPEATS=1"], signal.SIGTERM, "make"),
    (["campaign", "IDS=101 111", "REPEATS=1"], signal.SIGHUP, "make"),
], ids=["batch-TERM", "batch-INT", "batch-HUP", "batch-INT-group", "campaign-TERM", "campaign-HUP"])
def test_killing_make_ends_the_run_as_killed_and_starts_no_other(tmp_path, goal, sig, to):
    proc, pids = _make(tmp_path, goal)
    try:
        assert _wait_for(lambda: list((tmp_path / "out").glob("*/logs.txt"))
                         and "iteration" in next((tmp_path / "out").glob("*/logs.txt")).read_text()), "no run began"
        ours = [proc.pid, *_children(proc.pid)]  # make and the Python it execs
        run = [int(p) for p in pids.read_text().split()]
        if to == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (run_dir,) = (tmp_path / "out").iterdir()  # no second run began
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "killed" and signal.Signals(sig).name in rec["end_detail"], out
    assert "by a signal" in out and "target     111-" not in out, out  # 111's preflight never began
    assert proc.returncode != 0
    assert _wait_for(lambda: not any(supervise.alive(p) for p in ours + run), 10), "a process outlived make"


@pytest.mark.parametrize("goal", [["batch", "IDS=101 111"], ["101-gpt2xl-dp1-gbs1-bf16"]], ids=["batch", "target"])
def test_a_sigkilled_make_still_ends_the_run(tmp_path, goal):
    """make killed outright cannot pass anything on: the kernel tells the batch, or the one target's launcher
    (PR_SET_PDEATHSIG; issue 60: `make <target>` ran on under PID 1 until its watchdog, its record `incomplete`)."""
    proc, pids = _make(tmp_path, goal)
    try:
        assert _wait_for(lambda: pids.read_text().strip()), "no run began"
        ours = _children(proc.pid)
        run = [int(p) for p in pids.read_text().split()]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _wait_for(lambda: not any(supervise.alive(p) for p in ours + run), 30), "the run outlived make"
    finally:
        if proc.poll() is None:
            proc.kill()
    (run_dir,) = (tmp_path / "out").iterdir()
    assert _wait_for(lambda: (run_dir / "run.json").exists(), 10)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "killed"


# ---- the watcher alone -------------------------------------------------------------------------------

def test_make_is_dying_of_a_signal_it_no_longer_catches():
    caught_all = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGTERM - 1))
    assert makeparent.dying_of(caught_all, caught_all) == []
    assert makeparent.dying_of(caught_all, caught_all & ~(1 << (signal.SIGHUP - 1))) == [signal.SIGHUP]
    assert makeparent.dying_of(0, 0) == []  # a make that ignored SIGINT from the start: nothing to pass on


@pytest.mark.parametrize("also_to_us", [False, True])
def test_the_watcher_passes_a_signal_on_only_when_it_did_not_reach_us(monkeypatch, also_to_us):
    """Sent to make alone: passed on. Sent to the group: we have it already, and a second one would make
    the supervisor hurry (SIGKILL without the grace period)."""
    caught_all = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGHUP - 1))
    state = {"make": caught_all}
    monkeypatch.setattr(makeparent, "caught", lambda pid: state["make"])
    monkeypatch.setattr(makeparent.os, "getppid", lambda: 4242)
    sent = []
    monkeypatch.setattr(makeparent.os, "kill", lambda pid, sig: sent.append(sig))
    r, w = os.pipe()
    t = threading.Thread(target=makeparent._watch, args=(4242, caught_all, r, 0.05), daemon=True)
    t.start()
    time.sleep(0.2)
    assert not sent
    state["make"] = caught_all & ~(1 << (signal.SIGINT - 1))  # make got SIGINT
    if also_to_us:
        os.write(w, bytes([signal.SIGINT]))  # as the wakeup fd notes a signal that reached us
    t.join(5)
    assert not t.is_alive() and sent == ([] if also_to_us else [signal.SIGINT])
    os.close(w)
    os.close(r)
