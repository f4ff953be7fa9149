"""The run record (`run.json`): what ran, what it measured, and where every number comes from.

Field names other tools rely on: target, status, step_ms_median, step_ms_p10, step_ms_p90,
tflops_per_gpu, mfu, mem_peak_gib (one per GPU), gpu_name, num_gpus. Measured numbers are
computed from the raw log and memory CSV kept beside the record, never typed in.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
from pathlib import Path

from megalab.harness.catalog import ROOT
from megalab.results.gpus import peak_tflops  # the one GPU datasheet table (MFU = measured / peak)

SCHEMA = 1


def _git_commit() -> str | None:
    # A copied working tree (a GPU rig, a container) may have no .git: the launching side can
    # pass the commit in MEGALAB_COMMIT.
    if os.environ.get("MEGALAB_COMMIT"):
        return os.environ["MEGALAB_COMMIT"]
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return None


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def versions(driver: str | None) -> dict:
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
    except Exception:
        pass
    return {
        "megalab_commit": _git_commit(),
        "megatron_core": _version("megatron-core"),
        "torch": _version("torch"),
        "transformer_engine": _version("transformer-engine") or _version("transformer_engine"),
        "cuda": cuda,
        "driver": driver,
        "python": platform.python_version(),
    }


def measured(log: Path, warmup: int, returncode, interrupted: bool, used_mib: list[int],
             peak: float | None, one_node: bool = True) -> dict:
    """The record's measured fields, all derived from the raw log and the memory peaks.

    The status is the log's, corrected by what the log cannot know: a run stopped by the user is
    `incomplete`, a clean-looking log whose process exited non-zero is `failed`. A node of a multi-node
    run sees part of the story (Megatron prints its arguments and the end of training on rank 0, the
    iterations on the last rank): there a clean exit code decides between `incomplete` and `ok`.
    """
    from megalab.results import logparse

    fields = logparse.summary_fields(logparse.parse_file(log), warmup=warmup)
    status = fields.pop("status")
    if status in ("empty", "incomplete") and not one_node and returncode == 0:
        status = "ok"
    elif status == "empty" or (status == "ok" and returncode not in (0, None)):
        status = "failed"
    if interrupted:
        status = "incomplete"
    tflops = fields.get("tflops_per_gpu")
    return {"status": status, **fields,
            "mfu": round(tflops / peak, 4) if (tflops and peak) else None,
            "mem_peak_mib": used_mib, "mem_peak_gib": [round(u / 1024, 2) for u in used_mib]}


def build(*, exp, opts, impl, command, run_dir: Path, returncode, interrupted, monitor, inventory,
          started, ended, hostname, dropped_flags=(), substituted_flags=None, outputs=None) -> dict:
    from megalab.harness.launch import fast_patches  # launch imports this module

    gpu_name = inventory["names"][0] if inventory.get("names") else None
    peak = peak_tflops(gpu_name)
    meas = measured(run_dir / "logs.txt", opts.warmup, returncode, interrupted, monitor.peak_mib or [], peak,
                    one_node=opts.nnodes == 1)
    config = dataclasses.asdict(exp) | {
        "dp": exp.dp, "grad_accum": exp.grad_accum, "model_preset": exp.model_cfg,
        "iters": opts.iters, "gpu_mem_gb": opts.gpu_mem_gb, "transformer_impl": impl,
        "spec": opts.spec if impl == "local" else None, "nnodes": opts.nnodes,
        "node_rank": opts.node_rank,
        # the catalog's own extra flags, and the user's EXTRA_ARGS (the bench and the estimator key on it)
        "catalog_extra_args": list(exp.extra_args), "extra_args": opts.extra_args,
        "fastpath": fast_patches(opts, impl, exp), "cuda_graph": opts.cuda_graph,
        "data": os.environ.get("DATA") or "mock",
        "dropped_flags": list(dropped_flags),
        # TE-only preset flags megalab ran without TE: flag -> the fast-path lever (launch.py)
        "substituted_flags": dict(substituted_flags or {}),
        **(outputs or {}),  # save / load / exit_interval / wandb / profile (launch.outputs_config)
        # whose context parallelism ran: TE's attention, or megalab/runtime/cp_attention.py without TE
        "cp_impl": None if exp.cp <= 1 else ("transformer_engine" if impl == "transformer_engine" else "megalab"),
    }
    rec = {
        "schema": SCHEMA,
        "target": exp.id,
        "status": meas.pop("status"),
        "returncode": returncode,
        **meas,
        "peak_tflops": peak,
        "mem_baseline_mib": monitor.baseline_mib,
        "mem_samples": monitor.samples,
        "monitor_error": monitor.error,
        "gpu_name": gpu_name,
        "num_gpus": exp.gpus,
        "gpus_on_node": inventory.get("count"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_memory_mib": inventory.get("memory_mib", [None])[0] if inventory.get("memory_mib") else None,
        "hostname": hostname,
        "started": started.isoformat(timespec="seconds"),
        "ended": ended.isoformat(timespec="seconds"),
        "duration_s": round((ended - started).total_seconds(), 1),
        "command": command,
        "config": config,
        "versions": versions(inventory.get("driver")),
        "files": {"log": "logs.txt", "memory": "gpu_memory.csv",
                  **({"traces": sorted(str(p.relative_to(run_dir)) for p in run_dir.glob("torch_profile/*"))}
                     if (run_dir / "torch_profile").is_dir() else {})},
    }
    return rec


def write(rec: dict, path: Path) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(rec, indent=2, default=str) + "\n")
    tmp.replace(path)


def load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def one_line(rec: dict) -> str:
    step = rec.get("step_ms_median")
    mem = rec.get("mem_peak_gib") or []
    parts = [
        f"result     {rec['target']}: {rec['status']}",
        f"step {step:.0f} ms (p10 {rec['step_ms_p10']:.0f}, p90 {rec['step_ms_p90']:.0f}, n={rec['step_count']})"
        if step else "step n/a",
        f"{rec['tflops_per_gpu']:.0f} TFLOP/s/GPU, MFU {rec['mfu']:.1%}" if rec.get("tflops_per_gpu") and rec.get("mfu")
        else "",
        f"peak memory {' / '.join(f'{m:.1f}' for m in mem)} GiB" if mem else "peak memory n/a",
    ]
    return " | ".join(p for p in parts if p)


def profile_lines(rec: dict, run_dir: Path) -> list[str]:
    """The step breakdown (Megatron's timers) and where the profiler traces are, when there are any."""
    out = []
    b = rec.get("breakdown_ms")
    if b:
        out.append("breakdown  median ms per step: " + " | ".join(f"{k} {v:.1f}" for k, v in b.items()))
    for trace in rec.get("files", {}).get("traces", []):
        out.append(f"trace      {run_dir / trace}  (open it in https://ui.perfetto.dev)")
    return out


def memory_peaks_from_csv(csv_path: Path, num_gpus: int) -> list[int]:
    """Peak used MiB per GPU from a monitor CSV, for the first `num_gpus` GPUs sampled."""
    import csv

    peaks: dict[int, int] = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            g = int(row["gpu"])
            peaks[g] = max(peaks.get(g, 0), int(row["mem_used_mib"]))
    return [peaks[g] for g in sorted(peaks)[:num_gpus]]


def refresh(run_dir: Path) -> dict:
    """Recompute a record's measured fields from the raw log and memory CSV beside it.

    For records written by an older megalab (a parser fix, a monitor that sampled GPUs the run
    did not use): every measured number is derived again from the raw files, none is typed in.
    """
    import datetime as dt

    run_dir = Path(run_dir)
    rec = load(run_dir / "run.json")
    cfg = rec.get("config") or {}
    used = memory_peaks_from_csv(run_dir / rec["files"]["memory"], rec["num_gpus"])
    # the log cannot tell a user's interrupt: keep `incomplete` as the launcher recorded it
    rec.update(measured(run_dir / rec["files"]["log"], rec.get("warmup_iters") or 3, rec.get("returncode"),
                        rec.get("status") == "incomplete", used, rec.get("peak_tflops"),
                        one_node=cfg.get("nnodes", 1) == 1),
               mem_baseline_mib=(rec.get("mem_baseline_mib") or [])[: rec["num_gpus"]])
    rec.setdefault("refreshed", []).append(
        {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "by": "megalab refresh"})
    write(rec, run_dir / "run.json")
    return rec
