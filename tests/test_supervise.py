"""Every run ends in bounded time with a record, and leaves no process behind (issue 16).

Fake torchruns (tests/fixtures/fake_torchrun/) stand in for Megatron: one that trains and exits,
one that goes silent, one that hangs after the end of training, one that ignores SIGTERM, one that
spawns a worker whose child escapes the process group. Every fake notes its PIDs in FAKE_PIDS, and
each test checks by PID that none survives.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megalab.harness import supervise

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fixtures" / "fake_torchrun"
QUICK = supervise.Limits(silent_s=1, startup_s=2, exit_grace_s=1, kill_grace_s=1)


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _none_survive(pids, within=3.0) -> bool:
    # a zombie (exited, not yet reaped by whoever inherited it) holds no memory and no port
    return _wait_for(lambda: not any(supervise.alive(p) for p in pids), within)


def _supervise(tmp_path, script, limits=QUICK, **env):
    pids = tmp_path / "pids"
    pids.write_text("")
    seen = []
    out = supervise.supervise([sys.executable, str(FAKE / script)], log_path=tmp_path / "logs.txt",
                              env={**os.environ, "FAKE_PIDS": str(pids), **env}, on_line=seen.append,
                              limits=limits)
    return out, seen, _pids(pids)


# The runs that mostly wait for a watchdog or a grace time, all started at once (each in a folder of its own, its
# supervise() in a thread: off the main thread it installs no signal handlers); the tests below judge each.
# name -> (fake, limits, environment)
WAITING = {"ok": ("ok.py", QUICK, {}), "silent": ("hang_silent.py", QUICK, {}),
           "stuck": ("pretrain_gpt_stuck.py", QUICK, {}), "deaf": ("ignore_term.py", QUICK, {}),
           "exit_hang": ("exit_hang.py", supervise.Limits(silent_s=60, startup_s=60, exit_grace_s=1, kill_grace_s=1), {}),
           "spawn-0": ("spawn.py", QUICK, {"FAKE_ORPHAN": "0"}), "spawn-1": ("spawn.py", QUICK, {"FAKE_ORPHAN": "1"})}
LAUNCHED = {"launch-exit_hang": ("exit_hang.py", {}), "launch-silent": ("hang_silent.py", {})}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """name -> (the outcome, the lines seen, the PIDs, the folder) for WAITING; (the launcher, its output, the PIDs'
    file, the folder) for LAUNCHED."""
    from concurrent.futures import ThreadPoolExecutor

    dirs = {name: tmp_path_factory.mktemp(name) for name in [*WAITING, *LAUNCHED]}  # here: mktemp is not thread-safe

    def one(name):
        d = dirs[name]
        if name in LAUNCHED:
            fake, env = LAUNCHED[name]
            proc, pids = _launch(d, fake, **env)
            out, _ = proc.communicate(timeout=60)
            return proc, out, pids, d
        fake, limits, env = WAITING[name]
        return (*_supervise(d, fake, limits=limits, **env), d)

    with ThreadPoolExecutor(len(dirs)) as pool:
        return dict(zip(dirs, pool.map(one, dirs)))


def test_a_run_that_ends_by_itself_is_streamed_to_log_and_callback(ran):
    out, seen, pids, tmp_path = ran["ok"]
    assert (out.returncode, out.reason) == (0, None)
    log = (tmp_path / "logs.txt").read_text()
    assert log.count("] iteration ") == 5 and "[after training is done]" in log
    assert "".join(seen) == log
    assert out.seconds < 10 and _none_survive(pids)


def test_silent_after_training_began_is_hung(ran):
    out, _, pids, _ = ran["silent"]
    assert out.reason == "hung" and "WATCHDOG_SILENT_S" in out.detail and "after training began" in out.detail
    assert out.returncode == -signal.SIGTERM
    assert _none_survive(pids)


def test_a_hung_workers_python_stacks_reach_the_log_before_it_is_ended(ran):
    out, _, pids, tmp_path = ran["stuck"]
    log = (tmp_path / "logs.txt").read_text()
    assert out.reason == "hung"
    assert "megalab: watchdog: Python stacks of workers" in log and "stuck_in_a_collective" in log
    assert _none_survive(pids)


def test_silent_in_startup_and_deaf_to_sigterm_is_hung_and_sigkilled(ran):
    out, _, pids, _ = ran["deaf"]
    assert out.reason == "hung" and "WATCHDOG_STARTUP_S" in out.detail
    assert out.returncode == -signal.SIGKILL
    assert QUICK.startup_s + QUICK.kill_grace_s <= out.seconds < 10
    assert _none_survive(pids)


def test_alive_after_end_of_training_is_exit_hang(ran):
    # silent_s is longer than the test: only the exit grace can end it (WAITING's limits)
    out, _, pids, _ = ran["exit_hang"]
    assert out.reason == "exit_hang" and "EXIT_GRACE_S" in out.detail
    assert out.seconds < 10 and _none_survive(pids)


@pytest.mark.parametrize("orphan", ["0", "1"])
def test_worker_and_its_escaped_child_do_not_survive(ran, orphan):
    """The escapee called setsid (out of the group); with orphan=1 its parent is gone too, so only
    the run's token in its environment still ties it to the run."""
    out, _, pids, _ = ran[f"spawn-{orphan}"]
    assert len(pids) == 3, pids
    assert out.reason == "hung"
    assert _none_survive(pids)


def test_a_failing_callback_still_ends_the_run(tmp_path):
    pids = tmp_path / "pids"
    pids.write_text("")

    def broken(line):
        raise RuntimeError("progress line broke")

    with pytest.raises(RuntimeError, match="progress line broke"):
        supervise.supervise([sys.executable, str(FAKE / "hang_silent.py")], env={**os.environ, "FAKE_PIDS": str(pids)},
                            log_path=tmp_path / "logs.txt", on_line=broken, limits=QUICK)
    assert _none_survive(_pids(pids))


def test_previous_signal_handlers_are_restored(tmp_path):
    mine = lambda *a: None  # noqa: E731
    old = signal.signal(signal.SIGTERM, mine)
    try:
        _supervise(tmp_path, "ok.py")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


LAUNCHER = """
import os, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from megalab.harness import supervise
out = supervise.supervise([sys.executable, {fake!r}], env=dict(os.environ), log_path=Path({log!r}),
                          limits=supervise.Limits(silent_s=60, startup_s=60, exit_grace_s=60, kill_grace_s=1))
print(out.reason, out.signal, flush=True)
sys.exit(out.exit_code)
"""


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_launcher_ends_every_worker(tmp_path, sig, code):
    pids = tmp_path / "pids"
    pids.write_text("")
    src = LAUNCHER.format(root=str(ROOT), fake=str(FAKE / "spawn.py"), log=str(tmp_path / "logs.txt"))
    launcher = subprocess.Popen([sys.executable, "-c", src], env={**os.environ, "FAKE_PIDS": str(pids)},
                                stdout=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: "iteration" in (tmp_path / "logs.txt").read_text()
                         if (tmp_path / "logs.txt").exists() else False)
        workers = _pids(pids)
        assert len(workers) == 3
        t0 = time.monotonic()
        launcher.send_signal(sig)
        rc = launcher.wait(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert rc == code and launcher.stdout.read().split() == ["killed", str(int(sig))]
    assert _none_survive(workers)


# ---- end to end: launch.run() with a fake torchrun in place of scripts/train_gpt.sh ---------------
def _launch(tmp_path, fake, **env):
    pids = tmp_path / "pids"
    pids.write_text("")
    env = {**os.environ, "OUTDIR": str(tmp_path / "out"), "FAKE_PIDS": str(pids), "ITERS": "5",
           "WATCHDOG_SILENT_S": "1", "WATCHDOG_STARTUP_S": "3", "EXIT_GRACE_S": "1", **env}
    env.pop("MASTER_PORT", None)
    return subprocess.Popen([sys.executable, str(FAKE / "launch_fake.py"), fake, "101"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), pids


def _record(tmp_path) -> dict:
    (run_json,) = (tmp_path / "out").glob("*/run.json")
    return json.loads(run_json.read_text())


def test_launch_records_an_exit_hang_as_ok_with_a_note(ran):
    proc, out, pids, tmp_path = ran["launch-exit_hang"]
    rec = _record(tmp_path)
    assert proc.returncode == 0, out
    assert rec["status"] == "ok" and rec["ended_by"] == "exit_hang"
    assert [n for n in rec["notes"] if n.startswith("exit_hang: still running, silent for 1 s")]
    assert "port       torchrun --standalone" in out
    assert _none_survive(_pids(pids))


def test_launch_records_a_silent_run_as_hung_with_the_log_tail(ran):
    proc, out, pids, tmp_path = ran["launch-silent"]
    rec = _record(tmp_path)
    assert proc.returncode == 1
    assert rec["status"] == "hung" and "WATCHDOG_SILENT_S" in rec["end_detail"]
    assert "log         [" in out and "result     101-gpt2xl-dp1-gbs1-bf16: hung" in out
    assert _none_survive(_pids(pids))


def test_sigterm_to_the_launcher_writes_a_killed_record_and_exits_143(tmp_path):
    proc, pids = _launch(tmp_path, "spawn.py", WATCHDOG_SILENT_S="60", WATCHDOG_STARTUP_S="60")
    try:
        assert _wait_for(lambda: len(_pids(pids)) == 3, timeout=20)
        assert _wait_for(lambda: any("iteration" in p.read_text() for p in (tmp_path / "out").glob("*/logs.txt")))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    rec = _record(tmp_path)
    assert proc.returncode == 143, out
    assert rec["status"] == "killed" and rec["ended_by"] == "killed" and "SIGTERM" in rec["end_detail"]
    assert "log        " in out  # the tail, as for any run that did not end ok
    assert _none_survive(_pids(pids))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_does_not_outlive_a_sigkilled_launcher(tmp_path):
    """kill -9 of the launcher leaves it no chance to end the run: the kernel must (deathsig.py)."""
    pids = tmp_path / "pids"
    pids.write_text("")
    code = ("import os, sys; from pathlib import Path; from megalab.harness import supervise; "
            f"supervise.supervise([sys.executable, {str(FAKE / 'hang_silent.py')!r}], log_path=Path({str(tmp_path / 'logs.txt')!r}), "
            f"env={{**os.environ, 'FAKE_PIDS': {str(pids)!r}}}, limits=supervise.Limits(silent_s=600, startup_s=600))")
    launcher = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        assert _wait_for(lambda: _pids(pids), 20), "the fake run never started"
        run = _pids(pids)
        assert all(supervise.alive(p) for p in run)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(5)
        assert _none_survive(run, within=5)
    finally:
        launcher.kill()
        for p in _pids(pids):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_command_that_cannot_start_fails_in_its_log_with_the_fix(tmp_path):
    out = supervise.supervise(["no-such-torchrun-here", "--nproc_per_node", "1"], log_path=tmp_path / "logs.txt",
                              env=dict(os.environ), limits=QUICK)
    log = (tmp_path / "logs.txt").read_text()
    assert out.returncode == 127 and log.count("\n") == 1
    assert "cannot start no-such-torchrun-here" in log and "fix:" in log


# ---- a full disk (issue 60): /dev/full answers every write with ENOSPC ----------------------------------
full_disk = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's")


@full_disk
def test_a_log_the_disk_refuses_ends_the_run_and_leaves_no_process(tmp_path):
    (tmp_path / "logs.txt").symlink_to("/dev/full")
    out, seen, pids = _supervise(tmp_path, "spawn.py", limits=supervise.Limits(silent_s=60, startup_s=60))
    assert out.reason == "unwritable" and "No space left on device" in out.detail and out.seconds < 30
    assert _none_survive(pids)


@full_disk
@pytest.mark.parametrize("where", ["logs.txt", "run.json.tmp", "launch.sh"])
def test_a_full_disk_during_a_launch_ends_in_a_record_or_one_line(tmp_path, monkeypatch, capsys, where):
    """The log refused: a `failed` record saying why. The record refused: one line with the run's result, exit 2,
    no half file. The launch script refused: one line, nothing started. Never a traceback, never a process left."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML (launch_fake says so as it is imported): undone after
    monkeypatch.syspath_prepend(str(FAKE))
    import launch_fake

    from megalab.harness import launch

    pids = tmp_path / "pids"
    pids.write_text("")
    monkeypatch.setenv("OUTDIR", str(tmp_path / "out"))
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    monkeypatch.setenv("ITERS", "5")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("PATH", os.environ["PATH"])  # fake_torchrun prepends its folder: undone after the test
    (tmp_path / "bin").mkdir()
    launch_fake.fake_torchrun(tmp_path / "bin", "ok.py")
    for name in ("check_gpus", "check_megatron_installed", "megatron_check", "plan_lines"):
        monkeypatch.setattr(launch, name, getattr(launch, name))  # patch() replaces them: put back after
    launch_fake.patch()
    made = launch.make_run_dir

    def full(outdir, target):
        run_dir = made(outdir, target)
        (run_dir / where).symlink_to("/dev/full")
        return run_dir
    monkeypatch.setattr(launch, "make_run_dir", full)
    if where == "logs.txt":
        assert launch.run("101") == 1
        rec = _record(tmp_path)
        assert rec["status"] == "failed" and rec["ended_by"] == "unwritable" and "No space left" in rec["end_detail"]
    else:
        with pytest.raises(launch.LaunchError) as e:
            launch.run("101")
        line = str(e.value)
        assert "\n" not in line and "No space left on device" in line and "fix: free space" in line
        assert ("it ended so: 101-gpt2xl-dp1-gbs1-bf16: ok" in line) if where == "run.json.tmp" \
            else ("nothing was started" in line)
        assert not list((tmp_path / "out").glob("*/run.json"))
    assert "Traceback" not in capsys.readouterr().err
    assert _none_survive(_pids(pids))
