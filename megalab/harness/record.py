"""The run record (`run.json`): what ran, what it measured, and where every number comes from.

The fields are megalab/core/schema.py's RunRecord: a record is built as that model and written as its
dump, so what is written is what every reader accepts. Measured numbers are computed from the raw
log and memory CSV kept beside the record, never typed in.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from megalab.core.paths import ROOT
from megalab.core.gpus import peak_tflops  # the one GPU datasheet table (MFU = measured / peak)

from pydantic import ValidationError

from megalab.core.schema import COMMIT, MEASURED, SCHEMA, RecordError, RunRecord, finite_or_none, lever_names  # 2 adds `intent`, `observed`
from megalab.core import git, infile, logparse
from megalab.core.provenance import CODE_PATHS
from megalab.harness.monitor import describe_busy


def _git_commit(root: Path = ROOT) -> str | None:
    # A copied working tree (a GPU rig, a container) may have no .git: the launching side can
    # pass the commit in MEGALAB_COMMIT.
    if os.environ.get("MEGALAB_COMMIT") and COMMIT.fullmatch(os.environ["MEGALAB_COMMIT"]):  # else: git's own
        return os.environ["MEGALAB_COMMIT"]
    sha = git.run(root, "rev-parse", "HEAD")  # None, not a hang, where git cannot answer (core/git.py)
    if sha is None or sha.returncode != 0 or not sha.stdout.strip():
        return None
    # `-dirty`: the run code differs from the commit's, which makes the record's code unknown. Only the
    # paths provenance compares (CODE_PATHS) count: pages `make tables` rewrote, or committed records a
    # copied tree left out, change nothing that runs.
    dirty = git.run(root, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    return sha.stdout.strip() + ("-dirty" if dirty is None or dirty.returncode != 0 or dirty.stdout.strip() else "")


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
             peak: float | None, one_node: bool = True, ended_by: str | None = None,
             end_detail: str = "", busy: bool = False, summary=None) -> dict:
    """The record's measured fields, all derived from the raw log and the memory peaks.

    The status is the log's, corrected by what the log cannot know: a run stopped by the user is
    `incomplete`, a clean-looking log whose process exited non-zero is `failed`. A node of a multi-node
    run sees part of the story (Megatron prints its arguments and the end of training on rank 0, the
    iterations on the last rank): there a clean exit code decides between `incomplete` and `ok`.

    The launcher's supervisor (supervise.py) knows what the log cannot: `ended_by` "killed" (a
    signal to the launcher), "hung" (the watchdog), "exit_hang" (alive after the end of training:
    `ok` with a note when every iteration ran, else `hung`). A run that started on GPUs other
    processes held (`busy`) and ran out of memory is `oom_busy`, never a plain `oom`: not a result.
    """
    summary = summary or logparse.parse_file(log)
    fields = logparse.summary_fields(summary, warmup=warmup)
    status = fields.pop("status")
    notes = []
    if status in ("empty", "incomplete") and not one_node and returncode == 0:
        status = "ok"
    elif status == "empty" or (status == "ok" and returncode not in (0, None)):
        status = "failed"
    if interrupted:
        status = "incomplete"
    if ended_by in ("killed", "hung"):
        status = ended_by
    elif ended_by == "unwritable":  # its log could not be written (a full disk): ended, and no measurement
        status = "failed"
    elif ended_by == "exit_hang":
        last = summary.iterations[-1].iteration if summary.iterations else None
        done = summary.finished or bool(summary.train_iters and last and last >= summary.train_iters)
        status = "ok" if done else "hung"
        notes.append(f"exit_hang: {end_detail}")
    if busy and status == "oom":
        status = "oom_busy"
    tflops = fields.get("tflops_per_gpu")
    return {"status": status, **fields, "notes": notes,
            "mfu": round(tflops / peak, 4) if (tflops and peak) else None,
            "mem_peak_mib": used_mib, "mem_peak_gib": [round(u / 1024, 2) for u in used_mib]}


def busy_note(busy: list[dict]) -> str:
    return (f"busy_gpus: started beside other processes ({describe_busy(busy)}); its memory and step "
            "times are not its own (ALLOW_BUSY_GPUS=1)")


def observed(lines: dict) -> dict:
    """The entry point's `megalab: k=v` lines as the record keeps them: text as logged, its levers as a list."""
    fast = lines.get("fastpath")
    return {**lines, "fastpath": list(lever_names(fast))} if fast is not None else dict(lines)


def build(*, plan, returncode, interrupted, monitor, inventory, started, ended, hostname, outputs=None,
          outcome=None, busy_gpus=None, preflight_s: float | None = None) -> dict:
    """The record of one launch of `plan` (megalab/core/plan.py) into plan.run_dir.

    `outcome`: the supervisor's (supervise.Outcome); `busy_gpus`: what the preflight found busy
    (monitor.busy_gpus) when ALLOW_BUSY_GPUS=1 let the run start anyway.

    Schema 2 keeps every field of schema 1 (readers rely on them) and adds `intent`, the plan, and
    `observed`, what the entry point reported it ran (its `megalab: k=v` line: impl, fast path, CP
    mode, expert kernel); the two differ when, e.g., a lever found nothing to replace.
    """
    exp, opts, impl, run_dir = plan.exp, plan.opts, plan.impl, plan.run_dir
    gpu_name = inventory["names"][0] if inventory.get("names") else None
    peak = peak_tflops(gpu_name)
    try:  # this launch's own log: never refused for size
        summary = logparse.parse_file(run_dir / "logs.txt", limit=None)
    except logparse.LogReadError:  # none could be written (a full disk): the record says how the run ended
        summary = logparse.parse_log("")
    busy = list(busy_gpus or [])
    if hasattr(monitor, "busy_at_start"):  # memory in use at start with no process listed counts too
        busy += [b for b in monitor.busy_at_start() if b["gpu"] not in {x["gpu"] for x in busy}]
    ended_by = outcome.reason if outcome else None
    meas = measured(run_dir / "logs.txt", opts.warmup, returncode, interrupted, monitor.peak_mib or [], peak,
                    one_node=opts.nnodes == 1, ended_by=ended_by,
                    end_detail=outcome.detail if outcome else "", busy=bool(busy), summary=summary)
    if busy:
        meas["notes"].append(busy_note(busy))
    config = dict(
        exp.model_dump(exclude={"extra_args"}),  # the catalog entry as run (EXTRA_ARGS' layout flags applied)
        # the user's EXTRA_ARGS (the bench and the estimator key on it), and the catalog's own extra flags
        extra_args=opts.extra_args_text, catalog_extra_args=list(exp.extra_args),
        dp=exp.dp, grad_accum=exp.grad_accum,
        model_preset=dict(plan.model),  # the model as built: the preset with EXTRA_ARGS' model flags (the estimator)
        iters=opts.iters, warmup=opts.warmup, gpu_mem_gb=opts.gpu_mem_gb, transformer_impl=impl, spec=plan.spec,
        nnodes=opts.nnodes, node_rank=opts.node_rank, fastpath=plan.fastpath, cuda_graph=plan.cuda_graph,
        data=opts.data, dropped_flags=plan.dropped_flags,
        substituted_flags=plan.substituted_flags,  # TE-only preset flags run without TE: flag -> its lever
        **(outputs or {}),  # save / load / exit_interval / wandb / profile (launch.outputs_config)
        # whose context parallelism ran: TE's attention, or megalab/runtime/cp_attention.py without TE
        cp_impl=None if exp.cp <= 1 else ("transformer_engine" if impl == "transformer_engine" else "megalab"),
    )
    fields = finite_or_none(dict(  # a diverged loss (NaN) is written as null: JSON has no NaN
        schema=SCHEMA, target=exp.id, status=meas.pop("status"), returncode=returncode,
        # how the run ended, when the launcher ended it: killed (a signal), hung or exit_hang (watchdog)
        ended_by=ended_by, end_detail=outcome.detail if outcome and outcome.reason else None, busy_gpus=busy,
        **meas, peak_tflops=peak, mem_baseline_mib=monitor.baseline_mib, mem_samples=monitor.samples,
        monitor_error=monitor.error, gpu_name=gpu_name, num_gpus=exp.gpus, gpus_on_node=inventory.get("count"),
        gpu_uuids=inventory.get("uuids"),  # the physical GPUs: what tells two hosts apart (provenance)
        node_gpu_uuids=inventory.get("node_uuids"),  # the node's every GPU: which runs may share it
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        gpu_memory_mib=inventory.get("memory_mib", [None])[0] if inventory.get("memory_mib") else None,
        hostname=hostname, started=started.isoformat(timespec="seconds"), ended=ended.isoformat(timespec="seconds"),
        duration_s=round((ended - started).total_seconds(), 1),
        # the launcher's checks before `started` (plan, Megatron's argument check, GPUs): part of a launch
        preflight_s=None if preflight_s is None else round(preflight_s, 1),
        command=plan.command, config=config, intent=plan.intent().model_dump(mode="json"),
        observed=observed(summary.megalab), versions=versions(inventory.get("driver")),
        files={"log": "logs.txt", "memory": "gpu_memory.csv",
               **({"traces": sorted(str(p.relative_to(run_dir)) for p in run_dir.glob("torch_profile/*"))}
                  if (run_dir / "torch_profile").is_dir() else {})},
    ))
    try:
        return RunRecord(**fields).dump()  # the model the readers read: what is written is a record every reader takes
    except ValidationError:
        return fields  # never lose a run's measurements: write() writes it as it is, and says why no reader will


def write(rec: dict | RunRecord, path: Path) -> None:
    """Write a record through the schema (the launcher's dict, e.g. with resume.py's `resume_check`
    added, or a RunRecord), keeping its keys' order. A record the schema refuses is still written, as
    it is, so a run's measurements are never lost, and the refusal is said in one line."""
    try:
        data = rec.dump() if isinstance(rec, RunRecord) else RunRecord.of(finite_or_none(rec)).dump(like=rec)
    except RecordError as e:
        print(f"megalab: {path}: written as measured, but no reader will use it: {e}; fix: report this "
              "(the launcher wrote a field the schema refuses)", file=sys.stderr)
        data = finite_or_none(rec)
    tmp = Path(str(path) + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(path)
    except OSError:  # a full disk: no half record left behind (the caller says so, in one line)
        tmp.unlink(missing_ok=True)
        raise


def one_line(rec: dict | RunRecord) -> str:
    try:
        r = rec if isinstance(rec, RunRecord) else RunRecord.of(rec)
    except RecordError as e:  # write() has said so already; the terminal line still says how it ended
        return f"result     a record no reader takes: {e}"
    step, mem = r.step_ms_median, r.mem_peak_gib
    parts = [
        f"result     {r.target}: {r.status}",
        f"step {step:.0f} ms (p10 {r.step_ms_p10:.0f}, p90 {r.step_ms_p90:.0f}, n={r.step_count})"
        if step else "step n/a",
        f"{r.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {r.mfu:.1%}" if r.tflops_per_gpu and r.mfu else "",
        f"peak memory {' / '.join(f'{m:.1f}' for m in mem)} GiB" if mem else "peak memory n/a",
    ]
    return " | ".join(p for p in parts if p)


def profile_lines(rec: dict | RunRecord, run_dir: Path) -> list[str]:
    """The step breakdown (Megatron's timers) and where the profiler traces are, when there are any."""
    try:
        r = rec if isinstance(rec, RunRecord) else RunRecord.of(rec)
    except RecordError:
        return []
    out = []
    if b := r.breakdown_ms:
        out.append("breakdown  median ms per step: " + " | ".join(
            f"{k} {v:.1f}" for k, v in b.model_dump().items()))
    for trace in r.files.traces:
        out.append(f"trace      {run_dir / trace}  (open it in https://ui.perfetto.dev)")
    return out


def memory_peaks_from_csv(csv_path: Path, num_gpus: int) -> list[int]:
    """Peak used MiB per GPU from a monitor CSV, for the first `num_gpus` GPUs sampled. The file comes in
    by core/infile.py (a regular file of bounded size); a row whose GPU or memory is no whole number at
    or above 0 is a RecordError naming the file, the line and the cell."""
    import csv
    import io

    peaks: dict[int, int] = {}
    try:
        text = infile.text(csv_path, infile.LOG_LIMIT)
    except infile.InputError as e:
        raise RecordError(f"{e.path}: {e.reason}; fix: restore the run's memory CSV") from None
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
        try:
            g, used = int(row["gpu"]), int(row["mem_used_mib"])
            if g < 0 or used < 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise RecordError(f"{csv_path}: line {line} has no GPU index and used MiB (gpu, mem_used_mib) as "
                              "whole numbers; fix: restore the run's memory CSV") from None
        peaks[g] = max(peaks.get(g, 0), used)
    return [peaks[g] for g in sorted(peaks)[:num_gpus]]


class Downgrade(RecordError):
    """refresh would rewrite a record as a worse one (a status, measurements lost): one line, nothing written."""


# What a refresh may change but never lose: the measured fields (a value, a list, a mapping), and how far the log went
MEASURED_FIELDS = ("step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_min", "step_ms_max", "tflops_per_gpu",
                   "mfu", "loss_first", "loss_last", "params_total", "megatron_mem", "megatron_mem_by_rank",
                   "theoretical_mem_mb", "timers_ms", "breakdown_ms", "mem_peak_mib", "mem_peak_gib")
COUNTS = ("step_count", "iters_logged", "train_iters")


def losses(old: dict, new: dict) -> list[str]:
    """What NEW, a record derived again, lacks that OLD had: a status no longer ok (or no longer measured), a
    measured field gone or with fewer values, a count lower."""
    out = []
    if old.get("status") != new.get("status") and (old.get("status") == "ok" or (
            old.get("status") in MEASURED and new.get("status") not in MEASURED)):
        out.append(f"status {old.get('status')} -> {new.get('status')}")
    for k in MEASURED_FIELDS:
        before, after = old.get(k), new.get(k)
        if before not in (None, [], {}) and (after in (None, [], {}) or (
                isinstance(before, (list, dict)) and isinstance(after, (list, dict)) and len(after) < len(before))):
            out.append(k)
    out += [f"{k} {old[k]} -> {new.get(k)}" for k in COUNTS if isinstance(old.get(k), int)
            and not (isinstance(new.get(k), int) and new[k] >= old[k])]
    return out


def refresh(run_dir: Path, force: bool = False) -> dict:
    """Recompute a record's measured fields from the raw log and memory CSV beside it.

    For records written by an older megalab (a parser fix, a monitor that sampled GPUs the run
    did not use): every measured number is derived again from the raw files, none is typed in. A record
    it would make worse (its log cut short: a status no longer ok, measurements lost) is a Downgrade and
    stays as it is, unless FORCE.
    """
    import datetime as dt

    run_dir = Path(run_dir)
    path = run_dir / "run.json"
    try:
        old = RunRecord.load(path)
    except RecordError as e:
        raise RecordError(f"{path}: {e}; fix: mend it first (refresh derives the measurements, "
                          "not the rest)") from None
    raw = json.loads(path.read_text(encoding="utf-8"))  # its keys' order, kept when rewritten
    cfg = old.config
    if old.files.memory is None or old.num_gpus is None:
        raise RecordError(f"{path}: no memory CSV or GPU count to derive the peaks from; fix: nothing to refresh")
    used = memory_peaks_from_csv(run_dir / old.files.memory, old.num_gpus)
    # the log cannot tell a user's interrupt or the watchdog: keep what the launcher recorded
    # the WARMUP setting; older records: what was dropped
    warmup = cfg.warmup if "warmup" in cfg.model_fields_set else (old.warmup_iters or 3)
    meas = measured(run_dir / old.files.log, warmup, old.returncode, old.status == "incomplete", used,
                    old.peak_tflops, one_node=(cfg.nnodes if cfg.nnodes is not None else 1) == 1,
                    ended_by=old.ended_by, end_detail=old.end_detail or "", busy=bool(old.busy_gpus))
    meas["notes"] += [n for n in old.notes if not n.startswith("exit_hang:")]
    stamp = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "by": "megalab refresh"}
    new = finite_or_none({**raw, **meas, "mem_baseline_mib": list(old.mem_baseline_mib[: old.num_gpus]),
                          "refreshed": [*old.refreshed, stamp]})
    out = RunRecord.of(new).dump(like=new)
    worse = losses(old.dump(), out)
    if worse and not force:
        shown = ", ".join(worse[:8]) + (f" and {len(worse) - 8} more" if len(worse) > 8 else "")
        raise Downgrade(f"{path}: refreshed from raw files that say less than it (a log cut short?), it would lose "
                        f"{shown}; nothing written; fix: restore the run's raw log and memory CSV, or FORCE=1 megalab "
                        "refresh DIR to write it as they say")
    write(out, path)
    return out
