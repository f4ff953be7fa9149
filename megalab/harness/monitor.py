"""GPU memory monitor: samples every GPU of a run through NVML from launch to exit.

Why not Megatron's own "memory (MB) | ... max reserved" line: it is printed once, early, and counts
only PyTorch's allocator, leaving out the CUDA context, NCCL buffers and cuBLAS workspaces. The
reference tables report what nvidia-smi shows, so we read the same counter (NVML's used memory,
per device) for the whole run and keep the peak per GPU.

Beside memory, each sample has what the card ran at: its SM clock, its power draw and what held its clock
down (NVML's clock-event reasons: the power cap, thermal slowdowns). A step slower in a run than its kernels
add up to in a profile can be a card held under its top clock by its power cap; `python -m megalab bench
clocks RUN_DIR` sums these columns up. Each is read on its own: one that NVML cannot read is a blank cell,
and the sample (its memory) is kept.
"""
from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path

from megalab.core.clocks import CLOCK_COLUMNS  # what the card ran at: written here, read there


def _nvml():
    import pynvml  # from nvidia-ml-py

    pynvml.nvmlInit()
    return pynvml


def visible_gpu_indices(nvml) -> list[int]:
    """NVML indices of the GPUs this process may use (honours CUDA_VISIBLE_DEVICES)."""
    count = nvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return list(range(count)) if visible is None else []
    out = []
    for tok in visible.split(","):
        tok = tok.strip()
        if tok.isdigit():
            if int(tok) < count:
                out.append(int(tok))
        else:  # a UUID (or prefix) as nvidia-smi -L prints it
            for i in range(count):
                uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                if uuid.startswith(tok):
                    out.append(i)
    return out


# More in use than an idle GPU shows (the driver's own reservation, well under 1 GiB): another
# process's memory, even where NVML lists no process (a container hides other containers' PIDs).
BUSY_BASELINE_MIB = 1024


def run_gpu_indices(num_gpus: int | None = None) -> list[int]:
    """NVML indices of the GPUs a run of `num_gpus` per node uses: torchrun takes the first visible."""
    try:
        return visible_gpu_indices(_nvml())[:num_gpus]
    except Exception:  # no driver: no GPU to be busy
        return []


def busy_gpus(indices: list[int], own_pids: set[int] | None = None) -> list[dict]:
    """The GPUs among `indices` (NVML) that other processes use: compute processes (our own PID
    excluded) or memory in use above BUSY_BASELINE_MIB. One dict per busy GPU:
    {'gpu': index, 'used_mib': memory in use, 'processes': [{'pid', 'used_mib' (None if hidden)}]}."""
    own = own_pids if own_pids is not None else {os.getpid()}
    try:
        nvml = _nvml()
    except Exception:
        return []
    busy = []
    for i in indices:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        try:  # nvidia-ml-py's name for the compute processes on a device
            running = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except Exception:  # an old driver or a container that hides them: memory in use still tells
            running = []
        procs = [{"pid": p.pid, "used_mib": p.usedGpuMemory // 2**20 if p.usedGpuMemory else None}
                 for p in running if p.pid not in own]
        used = nvml.nvmlDeviceGetMemoryInfo(h).used // 2**20
        if procs or used > BUSY_BASELINE_MIB:
            busy.append({"gpu": i, "used_mib": used, "processes": procs})
    return busy


def describe_busy(busy: list[dict]) -> str:
    """'GPU 0: PID 41 (30.1 GiB), PID 42 (68.0 GiB); 98.9 GiB in use', one clause per GPU."""
    out = []
    for b in busy:
        pids = ", ".join(f"PID {p['pid']}" + (f" ({p['used_mib'] / 1024:.1f} GiB)" if p["used_mib"] else "")
                         for p in b["processes"]) or "no process visible (another container?)"
        out.append(f"GPU {b['gpu']}: {pids}; {b['used_mib'] / 1024:.1f} GiB in use")
    return "; ".join(out)


def gpu_inventory() -> dict:
    """{'count', 'names', 'memory_mib', 'driver'} for the visible GPUs; count 0 without NVML/GPUs."""
    try:
        nvml = _nvml()
    except Exception as e:  # no driver, no library: a CPU machine
        return {"count": 0, "names": [], "memory_mib": [], "driver": None, "why": str(e).strip()}
    idx = visible_gpu_indices(nvml)
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in idx]
    return {
        "count": len(idx),
        "names": [_text(nvml.nvmlDeviceGetName(h)) for h in handles],
        "memory_mib": [nvml.nvmlDeviceGetMemoryInfo(h).total // 2**20 for h in handles],
        "driver": _text(nvml.nvmlSystemGetDriverVersion()),
        # which physical GPUs: the rig's machines all call themselves "vm", so the host name alone
        # cannot tell two hosts apart; the GPUs' UUIDs can
        "uuids": [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles],
        # every GPU of the node, CUDA_VISIBLE_DEVICES or not: two runs on other GPUs of one node shared it
        "node_uuids": _optional(lambda: [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
                                         for i in range(nvml.nvmlDeviceGetCount())]) or None,
    }


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


COLUMNS = ["t_s", "gpu", "mem_used_mib", *CLOCK_COLUMNS]  # core.clocks reads the clock columns back
# NVML's clock-event reasons that slow a busy card (nvml.h, nvmlClocksEventReason*), as `held_by` names them
# ('+' between several); idle, application-clock and sync-boost reasons are left out.
HELD_BY = {0x4: "power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "power_brake"}
NVML_CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM


def _held_by(nvml, h) -> str:
    """The reasons holding the card's clock down, '+'-joined ('' for none); newer nvidia-ml-py names the call
    ClocksEvent, older ClocksThrottle."""
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = read(h)
    return "+".join(name for bit, name in HELD_BY.items() if mask & bit)


def _optional(read):
    """One reading NVML may not have on this card or driver (read: a function of none, so that a call nvidia-ml-py
    lacks fails inside it): '' where it fails, a blank cell, never a lost sample."""
    try:
        return read()
    except Exception:
        return ""


class GpuMemoryMonitor:
    """Background sampler. Use as a context manager; `peak_mib` holds one peak per GPU."""

    def __init__(self, csv_path: Path, interval_s: float = 0.2, num_gpus: int | None = None):
        self.csv_path = Path(csv_path)
        self.num_gpus = num_gpus  # torchrun uses the first N visible GPUs; sample only those
        self.interval_s = interval_s
        self.peak_mib: list[int] = []
        self.baseline_mib: list[int] = []
        self.samples = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        try:
            self._nvml = _nvml()
            self._idx = visible_gpu_indices(self._nvml)[: self.num_gpus]
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in self._idx]
        except Exception as e:
            self.error = f"NVML unavailable: {e}"
            return self
        self.peak_mib = [0] * len(self._handles)
        self.baseline_mib = [self._used(h) for h in self._handles]  # in use before the run starts
        self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)
        self._thread.start()
        return self

    @property
    def gpu_indices(self) -> list[int]:
        """NVML indices of the sampled GPUs (baseline_mib and peak_mib follow this order)."""
        return list(getattr(self, "_idx", []))

    def busy_at_start(self) -> list[dict]:
        """GPUs whose memory in use when the run started was above BUSY_BASELINE_MIB."""
        return [{"gpu": i, "used_mib": mib, "processes": []}
                for i, mib in zip(self.gpu_indices, self.baseline_mib) if mib > BUSY_BASELINE_MIB]

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        return False

    def _used(self, h) -> int:
        return self._nvml.nvmlDeviceGetMemoryInfo(h).used // 2**20

    def _loop(self):
        """Sample until stopped, each sample a row of the CSV; a CSV that cannot be written (a full disk) stops
        the rows, never the samples: the peaks go on in memory, and `error` says so."""
        t0 = time.monotonic()
        rows = _Rows(self.csv_path, self)
        try:
            rows.writerow(COLUMNS)
            while not self._stop.is_set():
                t = round(time.monotonic() - t0, 2)
                for k, h in enumerate(self._handles):
                    try:
                        used = self._used(h)
                        util = self._nvml.nvmlDeviceGetUtilizationRates(h).gpu
                    except Exception as e:  # a sample lost is not a run lost
                        self.error = str(e)
                        continue
                    self.peak_mib[k] = max(self.peak_mib[k], used)
                    nvml = self._nvml
                    mhz = _optional(lambda: nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM))
                    watts = _optional(lambda: round(nvml.nvmlDeviceGetPowerUsage(h) / 1000, 1))  # NVML: mW
                    rows.writerow([t, self._idx[k], used, util, mhz, watts, _optional(lambda: _held_by(nvml, h))])
                self.samples += 1
                rows.flush()
                self._stop.wait(self.interval_s)
        finally:
            rows.close()


class _Rows:
    """The monitor's CSV: rows written while the disk takes them; the first OSError (opening, a write, a flush)
    goes into the monitor's `error`, and no row is written after it."""

    def __init__(self, path: Path, monitor: GpuMemoryMonitor):
        self.monitor, self.f, self.w = monitor, None, None
        self._do(lambda: setattr(self, "f", open(path, "w", newline="")))
        if self.f is not None:
            self.w = csv.writer(self.f)

    def _do(self, act) -> None:
        try:
            act()
        except OSError as e:
            self.monitor.error = f"memory CSV not written ({e.strerror or e}): the peaks are the samples' in memory"
            self.w = None

    def writerow(self, row) -> None:
        if self.w is not None:
            self._do(lambda: self.w.writerow(row))

    def flush(self) -> None:
        if self.w is not None:
            self._do(self.f.flush)

    def close(self) -> None:
        if self.f is not None:
            try:
                self.f.close()
            except OSError:
                pass
