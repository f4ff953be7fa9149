"""Never start on GPUs others hold, never call such a run's OOM a result, never share a port (issue 16)."""
import dataclasses
import datetime as dt
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from megalab.core import catalog, clocks, infile, plan, ports
from megalab.harness import launch, monitor, record

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


class _Nvml(types.SimpleNamespace):
    """GPUs with the compute processes and memory in use given: {index: (used GiB, [(pid, GiB)])}."""

    def __init__(self, gpus):
        super().__init__()
        self.gpus = gpus

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return len(self.gpus)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=int(self.gpus[h][0] * GIB), total=80 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=int(gib * GIB) if gib is not None else None)
                for pid, gib in self.gpus[h][1]]


@pytest.fixture
def nvml(monkeypatch):
    def install(gpus, visible=None):
        monkeypatch.setitem(sys.modules, "pynvml", _Nvml(gpus))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return install


def test_busy_gpus_names_other_processes_and_skips_our_own(nvml):
    nvml({0: (99.0, [(4101, 31.0), (4102, 68.0)]), 1: (0.5, [(os.getpid(), 0.4)]), 2: (0.3, [])})
    busy = monitor.busy_gpus([0, 1, 2])
    assert [b["gpu"] for b in busy] == [0]
    assert [p["pid"] for p in busy[0]["processes"]] == [4101, 4102]
    assert monitor.describe_busy(busy) == "GPU 0: PID 4101 (31.0 GiB), PID 4102 (68.0 GiB); 99.0 GiB in use"


def test_memory_in_use_without_a_visible_process_is_busy(nvml):
    """A container hides other containers' PIDs: memory in use above ~1 GiB is enough."""
    nvml({0: (0.5, []), 1: (68.9, [])})
    (b,) = monitor.busy_gpus([0, 1])
    assert b["gpu"] == 1 and "no process visible" in monitor.describe_busy([b])


def test_only_the_gpus_the_run_uses_are_checked(nvml):
    nvml({0: (50.0, [(7, 50.0)]), 1: (0.2, []), 2: (0.2, [])}, visible="2,1")
    assert monitor.run_gpu_indices(1) == [2] and monitor.run_gpu_indices(2) == [2, 1]
    assert monitor.busy_gpus(monitor.run_gpu_indices(2)) == []


def test_without_nvml_nothing_is_busy(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert monitor.run_gpu_indices(1) == [] and monitor.busy_gpus([0]) == []


def test_preflight_refuses_busy_gpus_in_one_line_unless_allowed(nvml, capsys):
    nvml({0: (69.0, [(4101, 68.9)])})
    with pytest.raises(launch.LaunchError) as e:
        launch.check_busy(1, launch.Options())
    line = str(e.value)
    assert "\n" not in line and "GPU 0: PID 4101 (68.9 GiB)" in line
    assert "fix: wait for them to end, kill them, or ALLOW_BUSY_GPUS=1" in line
    opts = launch.Options.from_env({"ALLOW_BUSY_GPUS": "1"})
    assert [b["gpu"] for b in launch.check_busy(1, opts)] == [0]
    assert "warning    ALLOW_BUSY_GPUS=1" in capsys.readouterr().out


def _build(tmp_path, log, busy=None, baseline=(), outcome=None):
    shutil.copy(ROOT / "tests/fixtures/logs" / log, tmp_path / "logs.txt")
    mon = monitor.GpuMemoryMonitor(tmp_path / "m.csv")
    mon._idx, mon.baseline_mib = list(range(len(baseline))), list(baseline)
    now = dt.datetime.now(dt.timezone.utc)
    from megalab.core import plan

    p = plan.build(catalog.get("101"), launch.Options(), plan.Machine(gpus=1, te=None), run_dir=tmp_path)
    return record.build(plan=p, returncode=1, interrupted=False, monitor=mon, inventory={},
                        started=now, ended=now, hostname="h", busy_gpus=busy, outcome=outcome)


def test_an_oom_on_busy_gpus_is_not_a_plain_oom(tmp_path):
    assert _build(tmp_path, "oom_rank1.txt")["status"] == "oom"
    busy = [{"gpu": 0, "used_mib": 70000, "processes": [{"pid": 4101, "used_mib": 70000}]}]
    rec = _build(tmp_path, "oom_rank1.txt", busy=busy)
    assert rec["status"] == "oom_busy" and rec["busy_gpus"] == busy
    assert any(n.startswith("busy_gpus: started beside other processes (GPU 0: PID 4101") for n in rec["notes"])
    from megalab.core import records

    assert "oom_busy" not in records.USABLE  # never picked as a target's result


def test_memory_in_use_at_start_marks_the_record_busy(tmp_path):
    """The monitor's baseline, taken as the run starts, catches what the preflight could not see."""
    rec = _build(tmp_path, "oom_rank1.txt", baseline=[70550])
    assert rec["status"] == "oom_busy" and rec["busy_gpus"] == [{"gpu": 0, "used_mib": 70550, "processes": []}]
    assert _build(tmp_path, "oom_rank1.txt", baseline=[500])["status"] == "oom"


def test_statuses_the_supervisor_decides(tmp_path):
    from megalab.harness.supervise import Outcome

    ok_log = "ok_1gpu_v019.txt"
    killed = _build(tmp_path, ok_log, outcome=Outcome(-15, "killed", "SIGTERM to the launcher", 3.0, 15))
    assert killed["status"] == "killed" and killed["end_detail"] == "SIGTERM to the launcher"
    hang = Outcome(-15, "exit_hang", "still running 120 s after Megatron's end-of-training line", 9.0)
    rec = _build(tmp_path, ok_log, outcome=hang)
    assert rec["status"] == "ok" and rec["notes"] == [f"exit_hang: {hang.detail}"]
    # an exit hang before every iteration ran is a hang
    assert _build(tmp_path, "truncated_midline.txt", outcome=hang)["status"] == "hung"
    silent = Outcome(-9, "hung", "no output for 300 s after training began", 400.0)
    assert _build(tmp_path, ok_log, outcome=silent)["status"] == "hung"


def test_refresh_keeps_what_the_supervisor_recorded(tmp_path):
    from megalab.harness.supervise import Outcome

    hang = Outcome(-15, "exit_hang", "still running 1 s after the end", 9.0)
    rec = _build(tmp_path, "ok_1gpu_v019.txt", outcome=hang)
    (tmp_path / "m.csv").write_text("t_s,gpu,mem_used_mib,util_pct\n0,0,1000,5\n")
    rec["files"]["memory"] = "m.csv"
    record.write(rec, tmp_path / "run.json")
    again = record.refresh(tmp_path)
    assert again["status"] == "ok" and again["notes"] == rec["notes"]


# ---- the rendezvous port -------------------------------------------------------------------------
def test_one_node_lets_torchrun_bind_the_port_and_master_port_wins():
    """A port picked here and bound by torchrun later can be taken in between (a launch failed so with
    EADDRINUSE): on one node torchrun --standalone binds port 0 itself."""
    assert launch.Options.from_env({}).master_port is None
    assert ports.master_port(None, nnodes=1) is None
    assert ports.master_port(29500, nnodes=1) == 29500
    assert ports.master_port(None, nnodes=2) == ports.DEFAULT_PORT
    assert launch.Options.from_env({"MASTER_PORT": "29500"}).master_port == 29500
    assert "--standalone" in ports.describe(None, None, 1)
    one = plan.build(catalog.get("101"), launch.Options(dry_run=True), plan.Machine(gpus=1))
    assert one.groups["DISTRIBUTED"][:3] == ["--standalone", "--local-addr", "localhost"]
    assert "--master_port" not in one.groups["DISTRIBUTED"]
    asked = plan.build(catalog.get("101"), launch.Options(dry_run=True, master_port=29500), plan.Machine(gpus=1))
    assert asked.groups["DISTRIBUTED"][-2:] == ["--master_port", "29500"] and "--standalone" not in asked.argv


def test_dry_run_shows_the_port_it_would_use(capsys, monkeypatch):
    monkeypatch.setattr(launch, "megatron_check", lambda plan, *a: "megatron   skipped")
    monkeypatch.setattr(launch, "plan_lines", lambda *a: "plan       skipped")
    launch.launch(catalog.get("101"), launch.Options(dry_run=True, master_port=29511))
    out = capsys.readouterr().out
    assert "port       29511 (MASTER_PORT)" in out and "--master_port 29511" in out
    two = dataclasses.replace(launch.Options(dry_run=True), nnodes=2)
    launch.launch(catalog.get("122"), two)
    assert "--master_port 6000" in capsys.readouterr().out


def test_watchdog_variables_are_read_as_numbers():
    o = launch.Options.from_env({"WATCHDOG_SILENT_S": "60", "WATCHDOG_STARTUP_S": "600", "EXIT_GRACE_S": "30"})
    assert (o.watchdog_silent_s, o.watchdog_startup_s, o.exit_grace_s) == (60, 600, 30)
    assert (launch.Options().watchdog_silent_s, launch.Options().exit_grace_s) == (300, 120)
    with pytest.raises(launch.LaunchError, match="not a number"):
        launch.Options.from_env({"EXIT_GRACE_S": "soon"})


def test_every_nvml_call_exists_in_the_installed_nvidia_ml_py():
    """The fakes above stand in for NVML; this keeps their names honest (a misspelt call only fails on a GPU)."""
    import re

    pynvml = pytest.importorskip("pynvml")
    called = set(re.findall(r"\bnvml\.(nvml\w+)", (ROOT / "megalab/harness/monitor.py").read_text()))
    assert called and not [n for n in called if not hasattr(pynvml, n)]


class _ClockNvml(types.SimpleNamespace):
    """One GPU that reports its SM clock, power and clock-event reasons (the power cap on even reads)."""

    def __init__(self, reasons=True):
        super().__init__()
        self.reads = 0
        if reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x20 if self.reads % 2 == 0 else 0x1

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUtilizationRates(self, h): return types.SimpleNamespace(gpu=90)
    def nvmlDeviceGetClockInfo(self, h, kind): return 1755 if kind == monitor.NVML_CLOCK_SM else 0
    def nvmlDeviceGetPowerUsage(self, h): return 699_450  # mW

    def nvmlDeviceGetMemoryInfo(self, h):
        self.reads += 1
        return types.SimpleNamespace(used=(1000 + self.reads) * 2**20, total=81559 * 2**20)


def test_monitor_samples_the_clock_power_and_what_held_the_clock_down(monkeypatch, tmp_path):
    import csv
    import time

    monkeypatch.setitem(sys.modules, "pynvml", _ClockNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with monitor.GpuMemoryMonitor(tmp_path / "m.csv", interval_s=0.01) as mon:
        time.sleep(0.1)
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert len(rows) >= 2 and mon.error is None
    assert {(r["sm_mhz"], r["power_w"]) for r in rows} == {("1755", "699.5")}
    # idle (0x1) is no slowdown: only the power cap and the software thermal slowdown are named
    assert {r["held_by"] for r in rows} == {"power_cap+sw_thermal", ""}


def test_a_reading_nvml_lacks_is_a_blank_cell_not_a_lost_sample(monkeypatch, tmp_path):
    """An older driver or nvidia-ml-py without the clock-event call (nor its older name): memory still sampled."""
    import csv
    import time

    fake = _ClockNvml(reasons=False)
    fake.nvmlDeviceGetPowerUsage = lambda h: (_ for _ in ()).throw(RuntimeError("NVML_ERROR_NOT_SUPPORTED"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with monitor.GpuMemoryMonitor(tmp_path / "m.csv", interval_s=0.01) as mon:
        time.sleep(0.05)
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert rows and mon.error is None and mon.peak_mib[0] > 1000
    assert all(r["sm_mhz"] == "1755" and r["power_w"] == "" and r["held_by"] == "" for r in rows)


def _clocks_csv(tmp_path, lines):
    (tmp_path / "gpu_memory.csv").write_text(",".join(monitor.COLUMNS) + "\n" + "\n".join(lines) + "\n")
    return tmp_path


def test_clock_summary_counts_the_busy_samples_only(tmp_path):
    run = _clocks_csv(tmp_path, [
        "0.0,0,500,0,345,70,power_cap",  # idle, before the run: not counted, whatever held it
        "0.2,0,70000,100,1980,650,",
        "0.4,0,70000,100,1755,700,power_cap",
        "0.6,0,70000,99,1700,,power_cap+hw_slowdown",  # power unread: counts for the clock, not the watts
        "0.8,0,70000,98,,690,power_cap",
    ])
    (g,) = clocks.summary(run)
    assert (g["samples"], g["busy"]) == (5, 4)
    assert g["sm_mhz"] == 1755 and g["sm_mhz_range"] == (1700, 1980) and g["power_w"] == 690
    assert g["held"] == {"hw_slowdown": 0.25, "power_cap": 0.75}
    from megalab.harness import bench

    table = bench.render_clocks([g])
    assert "| 0 | 4 of 5 | 1755 (1700-1980) | 690 | hw_slowdown 25%, power_cap 75% |" in table


def test_clock_summary_refuses_what_it_cannot_read_in_one_line(tmp_path, capsys):
    from megalab.harness import bench

    with pytest.raises(infile.InputError, match="gpu_memory.csv: no such file; fix: name a run directory or its"):
        clocks.summary(ROOT / "tests/fixtures/logs")  # no CSV there
    old = tmp_path / "old"
    old.mkdir()
    (old / "gpu_memory.csv").write_text("t_s,gpu,mem_used_mib,util_pct\n0,0,1000,5\n")  # before the clocks
    with pytest.raises(infile.InputError, match="no util_pct, sm_mhz, power_w and held_by columns.*fix: run the "):
        clocks.summary(old)
    bad = _clocks_csv(tmp_path, ["0.0,0,500,100,fast,70,"])
    with pytest.raises(infile.InputError, match="line 2: gpu, util_pct, sm_mhz or power_w is not a number; fix: "):
        clocks.summary(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    _clocks_csv(empty, [])
    with pytest.raises(infile.InputError, match="no samples; fix: run the target again"):
        clocks.summary(empty)
    import argparse

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.main(p.parse_args(["clocks", str(bad)])) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "line 2" in err and "fix: restore the run's memory CSV" in err


def test_clock_summary_reads_a_memory_csv_past_the_config_limit(tmp_path):
    """A long multi-GPU run's memory CSV passes 4 MiB (infile.CONFIG_LIMIT): read as record.py reads it."""
    line = "0.2,0,70000,100,1980,650,power_cap"
    n = infile.CONFIG_LIMIT // len(line) + 1000
    run = _clocks_csv(tmp_path, [line] * n)
    assert (run / "gpu_memory.csv").stat().st_size > infile.CONFIG_LIMIT
    (g,) = clocks.summary(run)
    assert g["busy"] == n and g["held"] == {"power_cap": 1.0}
    assert monitor.COLUMNS[-len(clocks.CLOCK_COLUMNS):] == list(clocks.CLOCK_COLUMNS)  # the columns it writes


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's")
def test_a_memory_csv_the_disk_refuses_keeps_the_samples_and_says_so(monkeypatch, tmp_path):
    """A full disk (/dev/full answers every write with ENOSPC) stops the CSV's rows, never the samples: the peaks
    go on, the monitor's error says why, and no thread dies with a traceback (issue 60)."""
    import time

    monkeypatch.setitem(sys.modules, "pynvml", _ClockNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "m.csv").symlink_to("/dev/full")
    with monitor.GpuMemoryMonitor(tmp_path / "m.csv", interval_s=0.01) as mon:
        time.sleep(0.1)
        assert mon._thread.is_alive()
    assert mon.samples >= 2 and mon.peak_mib[0] > 1001
    assert mon.error.startswith("memory CSV not written (No space left on device)")
