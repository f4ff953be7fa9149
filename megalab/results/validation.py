"""`python -m megalab plan --validate`: the estimator (megalab/core/estimate.py) against every
committed run, written to results/estimate-vs-measured.md.

Memory: the predicted peak per GPU against the NVML peak of every record under RECORD_DIRS, with a
note where a run is further off than NOTE_ABOVE saying where the difference sits (Megatron's own
memory line, its TensorBoard series). Step time: the step-time model (megalab/core/steptime.py) with
constants fitted on the calibration set only (its runs made before the constants' freeze: later ones wait for
the next refit), reported separately on the held-out and out-of-catalog sets.

Honest sets (issue 33): a held-out run whose model input equals a calibration run's (a twin: one
prediction for both) is counted apart from the unseen ones; the memory allowances come from the
calibration set by written rules (allowances.py); an out-of-catalog run counts as out of sample only
if it ran after the step-time constants were frozen (freeze.py), else it was seen by the refit and is
calibration.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from megalab.core import catalog, flags, gpus, infile, logparse, markdown, provenance, steptime, tfrecord
from megalab.core import estimate as E
from megalab.core.estimate import (ALLOCATOR_SLACK, CUDA_CONTEXT_MIB, DEFAULT_MFU, MIB, NCCL_CP_MIB, NCCL_MIB,
                                   NCCL_PP_MIB, RING_STRANDED_CHUNKS_PER_STEP, Estimate, estimate, gpu_spec,
                                   nccl_mib)
from megalab.runtime.memcap import nominal_gb_to_gib
from megalab.core.records import RunRecord, read_records
from megalab.results import allowances, freeze
from megalab.runtime import levers

RECORD_DIRS = ("results/runs", "results/bench/runs", "results/holdout/runs")
# The split of the records into a calibration set and a held-out set, fixed: a record is held out when
# the SHA-1 of its target id (a bench variant such as 101-...gbs4 is a target of its own) is 0 modulo
# HELD_OUT_EVERY. Every run of a target falls on one side. Only the calibration set may fit a constant.
HELD_OUT_EVERY = 3
CALIBRATION, HELD_OUT = "calibration", "held-out"
# Configurations that were never catalog targets (other models, batch sizes and layouts, through EXTRA_ARGS'
# model and layout flags): the clean out-of-sample set, for memory always (the allowances are derived
# from the calibration set alone), for step time where the run came after the constants' freeze
# (freeze.py; a run from before it was seen by the refit and counts as calibration).
OUT_OF_CATALOG = "out-of-catalog"
HOLDOUT_DIR = "results/holdout/runs"
SETS = (CALIBRATION, HELD_OUT, OUT_OF_CATALOG)


def set_of(records_dir: str, target: str) -> str:
    """The memory set: OUT_OF_CATALOG for the holdout runs, else split(target)."""
    return OUT_OF_CATALOG if records_dir == HOLDOUT_DIR else split(target)


def step_set_of(records_dir: str, target: str, after_freeze: bool) -> str:
    """The step-time set: a holdout run is OUT_OF_CATALOG when it ran after the freeze of today's
    constants (freeze.after_freeze), else CALIBRATION (a refit saw it); the rest split(target)."""
    if records_dir != HOLDOUT_DIR:
        return split(target)
    return OUT_OF_CATALOG if after_freeze else CALIBRATION


def split(target: str) -> str:
    """CALIBRATION or HELD_OUT for a target id (fixed, documented above)."""
    return HELD_OUT if int(hashlib.sha1(target.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0 else CALIBRATION
# Rows further off than this get a note saying where the difference sits (from the run's own figures).
NOTE_ABOVE = 0.05


def _record_layout(rec: RunRecord) -> tuple[catalog.Experiment, dict[str, Any], str]:
    cfg = rec.config
    given = cfg.model_dump(exclude_unset=True)  # the fields the record has (an older one lacks some)
    # the record's extra_args is the user's EXTRA_ARGS (text); the entry's own flags are catalog_extra_args
    lay = catalog.Experiment.model_construct(**{n: given[n] for n in catalog.Experiment.model_fields
                                                if n in given and n != "extra_args"},
                                             extra_args=tuple(cfg.catalog_extra_args or ()))
    preset = cfg.model_preset or catalog.models()[lay.model]
    extra = tuple(shlex.split(cfg.extra_args or ""))
    if extra:  # flags the launcher of an older record did not yet read into its config (e.g. --moe-router-topk)
        try:
            lay, preset = flags.effective_experiment(lay, extra), flags.effective_model(preset, extra)
        except catalog.CatalogError:
            pass  # the record's own config stands
    spec = "local" if cfg.spec == "local" and cfg.transformer_impl != "transformer_engine" else "megalab"
    return lay, preset, spec


def record_capacity_gib(rec: RunRecord) -> float:
    if rec.gpu_mem_cap:  # GPU_MEM_GB (0: uncapped)
        return nominal_gb_to_gib(rec.gpu_mem_cap)
    if rec.gpu_memory_mib:
        return rec.gpu_memory_mib / 1024
    return gpu_spec(rec.gpu_name)[0]


def estimate_record(rec: RunRecord) -> Estimate:
    lay, preset, spec = _record_layout(rec)
    return estimate(lay, spec=spec, gpu_name=rec.gpu_name, gpu_mem_gib=record_capacity_gib(rec),
                    model_cfg=preset, cuda_graph=bool(rec.config.cuda_graph), fast=rec.config.fastpath or ())


def megatron_mem_by_rank(rec: RunRecord) -> dict[int, dict[str, float]]:
    """Megatron's memory line per logged rank (its last report), from the raw log beside the record
    (Megatron prints rank 0 and, with PP, the last stage's first rank), else from the record; the
    last rank's maxima then from its TensorBoard series. The log line stops after iteration 2, and
    the allocator may still reserve more after it: the series runs to the last iteration."""
    try:
        mem = {int(r): v for r, v in logparse.megatron_mem(logparse.read_text(rec.log_path)).items()}
    except logparse.LogReadError:
        mem = {}
    if not mem:
        mem = dict(rec.megatron_mem_by_rank) or ({0: rec.megatron_mem} if rec.megatron_mem else {})
    tb = tensorboard_mem_mb(rec.run_dir)
    if "mem-reserved-bytes" in tb and "mem-max-allocated-bytes" in tb:
        last = int(rec.config.gpus or rec.num_gpus or 1) - 1
        old = mem.get(last, {})
        mem[last] = {**old, "max_reserved_mb": max(old.get("max_reserved_mb", 0.0), tb["mem-reserved-bytes"]),
                     "max_allocated_mb": max(old.get("max_allocated_mb", 0.0), tb["mem-max-allocated-bytes"]),
                     "to_last_iteration": True}
    return mem


def tensorboard_mem_mb(run_dir: Path) -> dict[str, float]:
    """Max over iterations of Megatron's TensorBoard memory scalars (mem-reserved-bytes, ...), in MB;
    the last rank writes them every iteration. {} without the event files, or without the
    tensorboard package (a dev dependency: then only the log's figures are used, and said so)."""
    paths = sorted(run_dir.glob("tensorboard/*tfevents*"))
    if not paths:
        return {}
    try:  # the events as written (core/tfrecord.py's records), never migrated to the tensor form: the same numbers
        # in half the time (a legacy scalar's simple_value is the float32 its migrated tensor holds)
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.util import tensor_util
    except ImportError:
        print("megalab plan: tensorboard is not installed, so max reserved comes from the log line only "
              "(fix: pip install tensorboard)", file=sys.stderr)
        return {}
    out: dict[str, float] = {}
    for path in paths:
        maxima: dict[str, float] = {}
        try:
            data = infile.read(path, infile.LOG_LIMIT)  # the file door; a .gz unpacked (to its limit)
            key = hashlib.sha256(data).hexdigest()
            if key in _TB_MAXIMA:  # each file's bytes parsed once a process
                maxima = _TB_MAXIMA[key]
            else:
                # only the events that hold a memory tag are decoded (its name is in their bytes as written), and
                # the first, the file's version: a file of other records than events is refused there, as before
                found = tfrecord.records(data)
                for event in map(Event.FromString, [r for i, r in enumerate(found) if not i or b"mem-" in r]):
                    for v in event.summary.value:
                        if v.tag.startswith("mem-"):
                            x = float(tensor_util.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
                            maxima[v.tag] = max(maxima.get(v.tag, 0.0), x / MIB)
                _TB_MAXIMA[key] = maxima
        except Exception as e:  # a truncated or foreign file: what it held up to there, then skipped
            print(f"megalab plan: skipping {path}: {e}", file=sys.stderr)
        for tag, x in maxima.items():
            out[tag] = max(out.get(tag, 0.0), x)
    return out


# An event file's bytes (sha256) -> its memory maxima (MB), for a process that reads them again.
_TB_MAXIMA: dict[str, dict[str, float]] = {}


def _diagnose(rec: RunRecord, est: Estimate, mem: dict[int, dict[str, float]]) -> str:
    """Where nvidia-smi's peak went beyond the estimate, from the run's own allocator figures. Memory
    outside the allocator is the same on every GPU of a layout: it is measured on the rank whose max
    reserved runs to the last iteration (TensorBoard's), else on the busiest logged rank. The slack is
    that of the GPU with the highest peak: its peak less that outside memory, over its max allocated
    (or its stage's logged rank's). A note, not a fit."""
    peaks = rec.mem_peak_mib
    logged = [r for r in mem if r < len(peaks)]
    if not logged:
        return ""
    per_stage = est.gpus // est.pp
    ref = max(logged, key=lambda r: (bool(mem[r].get("to_last_iteration")), mem[r]["max_reserved_mb"]))
    outside = peaks[ref] - mem[ref]["max_reserved_mb"]
    parts = []
    assumed = (CUDA_CONTEXT_MIB + nccl_mib(est.gpus, est.pp, est.cp)) / 1024
    if outside / 1024 > assumed + 0.5:
        why = ""
        if est.zero2 and est.dp > 1:
            why = " (NCCL buffers beyond NCCL_MIB: ZeRO-2's reduce-scatter/all-gather" + (
                ", the experts' all-to-all)" if est.ep > 1 else ")")
        parts.append(f"outside the allocator {outside / 1024:.1f} GiB vs {assumed:.1f} assumed{why}")
    top = max(range(len(peaks)), key=peaks.__getitem__)
    stage_ranks = [r for r in mem if r // per_stage == top // per_stage]
    if not stage_ranks:
        return "; ".join(parts)
    last = top // per_stage == est.pp - 1
    stage = est.stages[min(top // per_stage, est.pp - 1)]
    slack = (peaks[top] - outside) / mem[top if top in mem else stage_ranks[0]]["max_allocated_mb"] - 1
    assumed_slack = ALLOCATOR_SLACK + stage.ring_slack_bytes / stage.allocated_bytes
    if slack > assumed_slack + 0.02:
        why = ""
        if stage.ring_slack_bytes:
            why = " (ring attention's K/V chunks held by NCCL, RING_STRANDED_CHUNKS_PER_STEP)"
        elif est.spec == "local":
            why = " (Megatron's local attention allocates and frees b x heads x s x s scores in every layer)"
        elif est.pp > 1 and last:
            why = (" (the last stage's multi-GiB logits blocks: once the Adam state, created after "
                   "iteration 1, has taken cached blocks, iteration 2 reserves new ones for them)")
        elif est.zero2:
            why = " (every gpt2-xl ZeRO-2 run here is above the 5% median)"
        elif est.num_microbatches > 1:
            why = " (gradient accumulation: activations re-allocated around the held grads)"
        parts.append(f"allocator slack {slack:.1%} vs {assumed_slack:.0%} assumed{why}")
    return "; ".join(parts)


def not_modelled(rec: RunRecord) -> str | None:
    """Why a run is outside what the estimator models (so it is not validated against it), or None."""
    extra = rec.config.extra_args
    if extra and not _only_planned_flags(extra):
        return f"extra Megatron flags ({markdown.escape(extra)})"
    return None


def _only_planned_flags(extra: str) -> bool:
    """EXTRA_ARGS made only of flags the plan reads into the record (flags.only_planned)."""
    try:
        return flags.only_planned(shlex.split(extra))
    except ValueError:
        return False


def _committed_records(root: Path):
    """(records dir, RunRecord) for every readable committed record."""
    for d in RECORD_DIRS:
        for rec in read_records(root / d, "megalab plan"):
            yield d, rec


def left_out(root: Path) -> list[str]:
    return [f"{d}/{rec.run_dir.name}: {why}" for d, rec in _committed_records(root) if (why := not_modelled(rec))]


def validation_rows(root: Path | None = None, detail: bool = True) -> list[dict[str, Any]]:
    """Every committed ok or out-of-memory run the memory model covers: predicted and measured peak, its
    set, and (detail) Megatron's own allocator figures, which the notes and allowances.py read (from the
    TensorBoard series: the slow part; detail=False leaves them empty)."""
    root = Path(root) if root is not None else catalog.ROOT
    rows = []
    for d, rec in _committed_records(root):
        if rec.fixture or not rec.config.model_fields_set or not rec.mem_peak_mib:
            continue
        if rec.status not in ("ok", "oom") or not_modelled(rec):
            continue
        est = estimate_record(rec)
        meas = max(rec.mem_peak_mib) / 1024
        mem = megatron_mem_by_rank(rec) if detail else {}
        oom = rec.status == "oom"
        err = (est.peak_gib - meas) / meas
        ok = (not est.fits) if oom else abs(err) <= 0.10
        cfg = rec.config
        rows.append({
            "run": f"{d}/{rec.run_dir.name}", "target": rec.target, "status": rec.status, "set": set_of(d, rec.target),
            "spec": est.spec, "gpu": rec.gpu_name or "?", "gpus": est.gpus,
            "layout": _layout_text(est), "capacity_gib": est.gpu_mem_gib,
            "pred_gib": est.peak_gib, "meas_gib": meas, "err": None if oom else err,
            "pred_alloc_mb": est.allocated_gib * 1024,
            "meas_alloc_mb": max((v["max_allocated_mb"] for v in mem.values()), default=None),
            "fits": est.fits, "ok": ok,
            "note": "" if oom or abs(err) <= NOTE_ABOVE or not detail else _diagnose(rec, est, mem),
            # what the allowances are derived from (allowances.py) and what makes two runs twins
            "est": est, "mem": mem, "peaks_mib": list(rec.mem_peak_mib), "graph": bool(cfg.cuda_graph),
            "pair_key": (rec.target, rec.gpu_name, rec.num_gpus, cfg.fastpath, cfg.extra_args, cfg.gpu_mem_gb),
            "model_key": (tuple(round(st.peak_bytes) for st in est.stages), round(est.gpu_mem_gib, 3), est.gpus),
        })
    return rows


def step_rows(root: Path | None = None) -> list[dict[str, Any]]:
    """Every committed ok run with a step time the model covers: predicted (the stored constants) and
    measured ms, its set, and the model's inputs (for fitting). Profiled runs (their timers slow the
    step) and extra flags the plan does not read are left out, as for memory. `code_today`: the run's code is
    today's (no net change to the code inside torchrun since its commit: provenance.code_state), whatever its
    settings."""
    root = Path(root) if root is not None else catalog.ROOT
    rows = []
    for d, rec in _committed_records(root):
        if rec.fixture or not rec.config.model_fields_set or rec.status != "ok" or rec.step_ms_median is None:
            continue
        if rec.target.startswith("profile-") or not_modelled(rec):
            continue
        est = estimate_record(rec)
        old = estimate(_record_layout(rec)[0], spec=est.spec, gpu_name=rec.gpu_name, mfu=DEFAULT_MFU,
                       model_cfg=_record_layout(rec)[1])
        after = freeze.after_freeze(rec.versions.megalab_commit, rec.started, root)  # the fit never saw it
        step_set = step_set_of(d, rec.target, after)
        # MoE layers under moe_gather (steptime.moe_gather_seconds), and with expert_stack too: today's MoE default
        gather = bool(est.step.moe_s)
        moe_default = gather and levers.EXPERT_STACK in (rec.config.fastpath or ())
        sh = E.Shape.of(*reversed(_record_layout(rec)[:2])) if gather else None
        # judged against this checkout's code (git), wherever the records are read from
        code_today = provenance.code_state(rec.versions.megalab_commit,
                                           unused=provenance.unused_files(rec.config))[0] == provenance.CURRENT
        rows.append({"run": f"{d}/{rec.run_dir.name}", "target": rec.target, "set": step_set,
                     "moe_gather": gather, "moe_default": moe_default, "graph": bool(rec.config.cuda_graph),
                     "experts": f"{sh.num_experts} experts top-{sh.topk}, seq {sh.seq}" if sh else "",
                     "moe_fit": freeze.moe_fitted_on(d, HOLDOUT_DIR, moe_default, rec.started, code_today),
                     "seen": d == HOLDOUT_DIR and step_set == CALIBRATION,  # out of catalog, before the freeze
                     "after_freeze": after,
                     "gpu": rec.gpu_name or "?", "gpus": est.gpus, "layout": _layout_text(est),
                     "fastpath": levers.text(rec.config.fastpath or ()),
                     "features": est.step, "model_key": dataclasses.astuple(est.step),
                     "pred_ms": est.step_ms, "meas_ms": rec.step_ms_median,
                     "mfu_ms": old.step_ms, "err": est.step_ms / rec.step_ms_median - 1,
                     "code_today": code_today})
    return rows


def fit_steptime(rows: list[dict[str, Any]], since_freeze: bool = False) -> dict[str, float]:
    """steptime's constants fitted on the calibration rows only (the held-out rows never enter), one point per
    model input (`model_key`) at the median of its runs' steps: runs of one input are repeats of one measurement,
    and counted one by one a target launched dozens of times while its levers were tried would outweigh the rest
    (the twelfth session's refit, counting runs, lost held-out accuracy: median 6.8% to 10.3%). The calibration
    runs made before the freeze (freeze.FROZEN_AT) set today's constants; those made since wait for the next refit
    and freeze (`since_freeze`: with them)."""
    points: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r["set"] == CALIBRATION and (since_freeze or not r["after_freeze"]):
            points.setdefault(r["model_key"], []).append(r)
    return steptime.fit([rs[0]["features"] for rs in points.values()],
                        [statistics.median(r["meas_ms"] for r in rs) / 1e3 for rs in points.values()])


def fit_moe(rows: list[dict[str, Any]]) -> dict[str, float]:
    """steptime.MOE_CONSTANTS fitted on the MoE calibration runs only (`moe_fit`: catalog rows' runs with
    moe_gather's MoE layers made by freeze.MOE_FROZEN_TIME), one point per model input as fit_steptime; {} (the
    stored constants stand) without such runs."""
    points: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("moe_fit"):
            points.setdefault(r["model_key"], []).append(r)
    if not points:
        return {}
    return steptime.fit_moe([rs[0]["features"] for rs in points.values()],
                            [statistics.median(r["meas_ms"] for r in rs) / 1e3 for rs in points.values()])


def twins(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Held-out run -> the calibration target whose model input it repeats (`model_key`: the step-time
    model's whole input, or the memory model's per-stage peaks on one capacity and GPU count). Two runs
    with one input get one prediction, so the model has in effect seen a twin."""
    seen: dict[tuple, str] = {}
    for r in rows:
        if r["set"] == CALIBRATION or r.get("moe_fit"):  # the MoE constants' own runs were fitted on too
            seen.setdefault(r["model_key"], r["target"])
    return {r["run"]: seen[r["model_key"]] for r in rows
            if r["set"] == HELD_OUT and not r.get("moe_fit") and r["model_key"] in seen}


def by_set(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(label, rows) per set, the held-out set split into its twins and its unseen runs."""
    twin = twins(rows)
    held = [r for r in rows if r["set"] == HELD_OUT]
    seen = {r["run"] for r in held if r["run"] in twin or r.get("moe_fit")}  # a twin, or a run the MoE constants fit
    moe = " or fitted on by the MoE constants" if any(r.get("moe_fit") for r in held) else ""
    return [(CALIBRATION, [r for r in rows if r["set"] == CALIBRATION]),
            (f"{HELD_OUT} with a calibration twin (identical model input){moe}", [r for r in held if r["run"] in seen]),
            (f"{HELD_OUT}, unseen", [r for r in held if r["run"] not in seen]),
            (OUT_OF_CATALOG, [r for r in rows if r["set"] == OUT_OF_CATALOG])]


def set_cell(r: dict[str, Any], twin: dict[str, str]) -> str:
    """The table's set cell: a twin names its calibration target, a seen holdout run says so."""
    if r.get("moe_fit"):
        return f"{r['set']} (MoE constants fitted on it)"
    if r["run"] in twin:
        return f"{HELD_OUT} (twin of {twin[r['run']].split('-')[0]})"
    if r.get("seen"):
        return f"{CALIBRATION} (out of catalog, run before the freeze)"
    return r["set"]


def error_summary(errs: list[float]) -> str:
    """'median |error| 12% and worst -40% over 31 runs' (errors as fractions, signed)."""
    if not errs:
        return "no runs"
    worst = max(errs, key=abs)
    return (f"median |error| {statistics.median(abs(e) for e in errs):.1%}, worst {worst:+.1%} "
            f"over {len(errs)} run{'s' * (len(errs) != 1)}")


def _layout_text(est: Estimate) -> str:
    parts = [f"MBS{est.mbs}"]
    for k in ("tp", "pp", "cp", "dp"):
        val = getattr(est, k)
        if val > 1:
            parts.append(f"{k.upper()}{val}")
    if est.sp:
        parts.append("SP")
    if est.zero2:
        parts.append("ZeRO-2")
    if est.num_microbatches > 1:
        parts.append(f"GA{est.num_microbatches}")
    if est.recompute != "none":
        parts.append(est.recompute)
    return " ".join(parts)


def _where(run: str) -> str:
    return "bench" if "/bench/" in run else ("holdout" if "/holdout/" in run else "runs")


def _allowance_cells(ran: list[dict[str, Any]]) -> list[list[str]]:
    """One row per derived allowance: committed value, the calibration set's figure, its rule."""
    calib = [r for r in ran if r["set"] == CALIBRATION]
    return [[name, f"{committed:g}", "no runs" if figure is None else f"{figure:.4g}", rule, what]
            for name, (figure, what, rule, _, committed) in allowances.check(calib).items()]


def _validation_cells(r: dict[str, Any], twin: dict[str, str] | None = None) -> list[str]:
    err = "OOM" if r["err"] is None else f"{r['err']:+.1%}"
    meas_alloc = f"{r['meas_alloc_mb']:.0f}" if r["meas_alloc_mb"] else "-"
    if r["status"] == "oom":
        verdict = "OOM, predicted" if r["ok"] else "MISS: OOM not predicted"
    else:
        verdict = "ok" if r["ok"] else "MISS (outside 10%)"
    where = _where(r["run"])
    return [f"{r['run'].split('/')[-1]} ({where})", set_cell(r, twin or {}), r["spec"],
            f"{r['gpus']} x {gpus.short_gpu_name(r['gpu'])}",
            r["layout"], f"{r['capacity_gib']:.1f}", f"{r['pred_gib']:.1f}", f"{r['meas_gib']:.1f}", err,
            f"{r['pred_alloc_mb']:.0f} / {meas_alloc}", "fits" if r["fits"] else "does not fit", verdict, r["note"]]


def validation_table(records_root: Path | None = None, rows: list[dict[str, Any]] | None = None,
                     steps: list[dict[str, Any]] | None = None) -> str:
    """Markdown: predicted vs measured peak memory (max over GPUs) and step time for every committed
    record, each on the calibration and the held-out set (`rows`, `steps`: validation_rows and
    step_rows of records_root, when the caller already has them)."""
    rows = validation_rows(records_root) if rows is None else rows
    steps = step_rows(records_root) if steps is None else steps
    ran = [r for r in rows if r["status"] == "ok"]
    ooms = [r for r in rows if r["status"] == "oom"]
    misses = [r for r in rows if not r["ok"]]
    out = [
        "# Memory estimate vs measured",
        "",
        "<!-- generated by `python -m megalab plan --validate` (megalab/results/validation.py): do not edit by hand -->",
        "",
        "Predicted peak memory per GPU from `megalab/core/estimate.py` (Korthikanti activations with "
        "SDPA's logsumexp in place of the s x s scores for the megalab spec, 18 or 6 + 12/DP bytes "
        "per parameter, the b s V/t x 6 B logits, AdamW's step temporary, and the named allowances "
        f"CUDA_CONTEXT_MIB={CUDA_CONTEXT_MIB}, NCCL_MIB={NCCL_MIB} (+ NCCL_PP_MIB={NCCL_PP_MIB} with PP, "
        f"NCCL_CP_MIB={NCCL_CP_MIB} with CP), ALLOCATOR_SLACK={ALLOCATOR_SLACK:.0%}, and ring attention's "
        f"K/V chunks held by NCCL, RING_STRANDED_CHUNKS_PER_STEP={RING_STRANDED_CHUNKS_PER_STEP:g} per step per layer) "
        "against the nvidia-smi peak (max over GPUs) of every committed run record in results/runs "
        "(runs), results/bench/runs (bench) and results/holdout/runs (holdout). `alloc` puts the allocator-level prediction (busiest "
        "stage) beside Megatron's own `max allocated` (max over the ranks its log reports, and the last "
        "rank's TensorBoard series). Goal: within 10% where the run ran, and every out-of-memory run "
        "predicted not to fit.",
        "",
        f"**{sum(r['ok'] for r in ran)} of {len(ran)} runs within 10%"
        + (f" (worst {max(ran, key=lambda r: abs(r['err']))['err']:+.1%})" if ran else "")
        + f"; {sum(r['ok'] for r in ooms)} of {len(ooms)} out-of-memory runs predicted not to fit"
        + (f"; misses: {', '.join(r['target'] for r in misses)}" if misses else "") + ".**",
        "",
        "## Calibration and held-out records",
        "",
        f"The records are split once, by target: a run is held out when the SHA-1 of its target id is 0 "
        f"modulo {HELD_OUT_EVERY} (`validation.split`; a bench variant such as `101-...gbs4` is a target of its "
        "own), so every run of a target sits on one side. A held-out run whose model input equals a "
        "calibration run's is a *twin*: one prediction serves both, so the model has in effect seen it "
        "(for memory the same predicted peak per stage on the same capacity and GPU count; for step time "
        "the same step-time model input, `steptime.Features`). Twins are counted apart from the unseen "
        "held-out runs, and a twin's set cell names its calibration target. The out-of-catalog set: "
        f"configurations never in the catalog ({HOLDOUT_DIR}: other layer counts, widths, sequence lengths, "
        "batch sizes, query groups, ZeRO-2 at DP=1, each a catalog target with EXTRA_ARGS' model and layout "
        "flags).",
        "",
        "Memory allowances, derived from the calibration set only (megalab/results/allowances.py: the "
        "figure each is measured as in the calibration records, and the rule that rounds it; "
        "tests/test_estimate.py keeps every committed constant equal to its rule's value), so the "
        "held-out and out-of-catalog memory errors below are out of sample:",
        "",
        *markdown.table(["allowance", "committed", "calibration figure", "rule", "measured as"],
                        _allowance_cells(ran), [None, "right", "right", None, None]),
        "",
        *[f"- {name}={getattr(E, name):g} is not derived: {why}." for name, why in allowances.NOT_DERIVED.items()],
        "",
    ]
    for label, sel in by_set(ran):
        out.append(f"- memory, {label}: {error_summary([r['err'] for r in sel])}")
    mem_twins = twins(ran)
    out += [""]
    out += markdown.table(
        ["run", "set", "spec", "GPUs", "layout", "capacity GiB", "predicted GiB", "measured GiB", "error",
         "alloc MB pred / Megatron", "predicted", "verdict", "where the difference sits"],
        (_validation_cells(r, mem_twins) for r in rows), [None] * 5 + ["right"] * 5 + [None] * 3)
    out += step_section(steps)
    skipped = left_out(Path(records_root) if records_root is not None else catalog.ROOT)
    if skipped:
        out += ["", f"Not validated ({len(skipped)} runs outside what the estimator models; the benchmark's "
                "levers and parity runs):", ""] + [f"- {x}" for x in skipped]
    out += [
        "",
        "Notes",
        "",
        f"- The last column is filled where the error exceeds {NOTE_ABOVE:.0%}: it compares the run's own "
        "figures (nvidia-smi peak minus Megatron's max reserved = memory outside PyTorch's allocator; "
        "max reserved / max allocated = allocator slack) with the allowances. It explains; nothing is "
        "tuned per row.",
        "- `predicted` is the estimate against the run's capacity (the GPU_MEM_GB cap, else the GPU's "
        "memory). On a capped H200 only PyTorch's allocator is capped; NCCL and the CUDA context are "
        "not, so nvidia-smi may exceed the H100's 79.65 GiB on a run that completed.",
        "- For an out-of-memory run the measured peak is the card's limit, so only the verdict counts.",
    ]
    return "\n".join(out) + "\n"


def _signed_median(errs: list[float]) -> str:
    if not errs:
        return "no runs"
    med = statistics.median(errs)
    return f"{med if round(med, 3) else 0.0:+.1%} over {len(errs)} run{'s' * (len(errs) != 1)}"  # no -0.0%


# The levers whose terms the page's "What the levers' terms explain" tests, group by group: the loss's and the bias
# add's (default since 26e1d33), and the layer's kernels (triton_norm first, 2026-11-26's ninth session).
LOSS_LEVERS = ("bf16_ce", "addmm_bias")
LAYER_LEVERS = ("triton_norm", "norm_residual", "bias_gelu", "dropout_add", "qkv_pack")


def lever_bias(steps: list[dict[str, Any]], consts: dict[str, float] | None = None,
               features=lambda r: r["features"], group=LOSS_LEVERS) -> tuple[list[float], list[float]]:
    """Signed errors of the 1-GPU H100 runs (one machine kind, no parallelism) with any lever of `group` on and with
    none of them (an older fast path)."""
    on, off = [], []
    for r in steps:
        if r["gpus"] == 1 and "H100" in r["gpu"]:
            err = steptime.step_seconds(features(r), consts) * 1e3 / r["meas_ms"] - 1
            (on if set(group) & set(r["fastpath"].split(",")) else off).append(err)
    return on, off


def code_today_line(steps: list[dict[str, Any]]) -> list[str]:
    """The model against today's code alone: the constants are fitted on runs of every code version, so a signed
    error far from zero on the runs of today's code says today's code runs faster (negative: slower) than they
    price it, whatever the error over all runs."""
    errs = [r["err"] for r in steps if r["code_today"]]
    return [
        "Against today's code alone (runs whose code inside torchrun has not changed since their commit, any "
        "settings, every set): "
        + (f"{error_summary(errs)}; signed median {statistics.median(errs):+.1%}" if errs else "no runs")
        + ". The constants are fitted on runs of every code version since the catalog began; a positive error here "
        "means today's code runs faster than they price it.",
        "",
    ]


def _no_lever_terms(r: dict[str, Any]) -> steptime.Features:
    return dataclasses.replace(r["features"], hbm_s=tuple(0.0 for _ in r["features"].hbm_s))


def _waiting_note(waiting: list[dict[str, Any]], later: dict[str, float], consts: dict[str, float]) -> str:
    """How many calibration runs came after the freeze, and the constants a refit with them would change."""
    if not waiting:
        return ""
    n = len(waiting)
    moved = ", ".join(f"{k}={later[k]:g}" for k in steptime.CONSTANTS if later[k] != consts[k])
    return (f" {n} calibration run{'s' * (n != 1)} made since the freeze wait{'s' * (n == 1)} for the next refit and "
            f"freeze, which with them would give {moved or 'the same'}.")


def step_section(steps: list[dict[str, Any]]) -> list[str]:
    """The page's step-time part: the model, its constants (stored and refitted) and their freeze, error
    per set (twins apart), what the levers' terms explain, rows."""
    consts = steptime.fitted()
    calib = [r for r in steps if r["set"] == CALIBRATION]
    refit = fit_steptime(steps) if calib else consts
    waiting = [r for r in calib if r["after_freeze"]]
    later = fit_steptime(steps, since_freeze=True) if waiting else consts
    seen = [r for r in steps if r.get("seen")]
    after = [r for r in steps if r["set"] == OUT_OF_CATALOG]
    out = [
        "",
        "## Step time",
        "",
        "Predicted step time from `megalab/core/steptime.py` (not a constant MFU): every GEMM at "
        "`peak x GEMM_EFF_MAX x mnk / (mnk + GEMM_HALF_MNK)` (forward once, backward twice, recomputed "
        "forwards again), the memory-bound kernels by their HBM bytes over the datasheet bandwidth "
        f"(ELEMENTWISE_BYTES per token, hidden unit and layer, {steptime.ELEMENTWISE_OUTSIDE_TP:.0%} of it on the "
        "whole hidden state that TP splits only with SP; the loss's "
        f"{steptime.LOSS_BYTES_PER_LOGIT} bytes per logit, {steptime.LOSS_BYTES_PER_LOGIT_BF16_CE} with bf16_ce; "
        f"the QKV bias add's {steptime.BIAS_ADD_BYTES} per element, none with addmm_bias; the layer's norms, "
        "bias-GeLU, bias-dropout-adds and QKV split where megalab's kernels for them do not run, from their "
        "microbenchmarks: steptime.layer_lever_bytes; fused AdamW over Megatron's per-tensor list without flat_adam), "
        "the stage's kernel "
        "launches at LAUNCH_US each (a micro-batch takes the larger of GPU and CPU time: small batches are "
        "launch-bound), tensor/context/expert-parallel traffic by bytes over the datasheet link bandwidth, the "
        "pipeline's (m + (p - 1)/v) slots, the optimizer's HBM traffic, the DP reduction the backward does not "
        "hide, COMM_CALL_US per collective or p2p call outside a CUDA graph (bounded to "
        f"{steptime.BOUNDS['COMM_CALL_US'][1]:g} us: a host's cost per call), MOE_LAYER_MS per MoE layer and "
        "micro-batch, and STEP_OVERHEAD_MS per step. Fitted on the calibration set only, one point per model "
        "input at the median of its runs (mean |log(predicted / measured)|, coordinate descent on the constants' "
        "logarithms). That point-per-input rule was chosen after a refit counting every run (2026-11-26, twelfth "
        "session) raised the held-out unseen median error from 6.8% to 10.3%: the held-out figures below informed "
        "that one choice, so they are not wholly blind to it. Constants: "
        + ", ".join(f"{k}={consts[k]:g}" for k in steptime.CONSTANTS)
        + (" (a refit on the calibration records made before the freeze gives the same)." if refit == consts else
           " (a refit on the calibration records made before the freeze gives "
           + ", ".join(f"{k}={refit[k]:g}" for k in steptime.CONSTANTS) + ": store them in steptime.py).")
        + _waiting_note(waiting, later, consts),
        "",
        f"The constants were frozen at commit {freeze.FROZEN_AT[:7]} ({freeze.FROZEN_TIME[:16].replace('T', ' ')} "
        "UTC; megalab/results/freeze.py, which tests/test_estimate.py keeps at the commit whose steptime.py "
        "holds them). An out-of-catalog run is judged against them only if its code descends from that commit "
        f"(where git does not know its commit: if it started later): {len(after)} ran after it. "
        f"{len(seen)} out-of-catalog run{'s' * (len(seen) != 1)} ran before it and {'were' if len(seen) != 1 else 'was'} "
        "seen by the refit that set these constants, so "
        f"{'they count' if len(seen) != 1 else 'it counts'} as calibration (fitted on; set cell "
        "`calibration (out of catalog, run before the freeze)`). "
        + (f"The {len(after)} that ran after it are the clean test (set `out-of-catalog` below); fresh ones "
           "add to it." if after else "Fresh out-of-catalog runs on today's code are the next clean test."),
        "",
    ]
    for label, sel in by_set(steps):
        out.append(f"- step time, {label}: " + (
            f"{error_summary([r['err'] for r in sel])}; the old constant {DEFAULT_MFU:.0%} MFU guess on the same "
            f"runs: {error_summary([r['mfu_ms'] / r['meas_ms'] - 1 for r in sel])}" if sel else "no runs yet"))
    on, off = lever_bias(steps)
    lay, unlay = lever_bias(steps, group=LAYER_LEVERS)
    fitted_on = [r for r in calib if not r["after_freeze"]]  # what set today's constants
    bare = (steptime.fit([_no_lever_terms(r) for r in fitted_on], [r["meas_ms"] / 1e3 for r in fitted_on])
            if fitted_on else consts)
    on0, off0 = lever_bias(steps, bare, _no_lever_terms)
    lay0, unlay0 = lever_bias(steps, bare, _no_lever_terms, LAYER_LEVERS)
    out += [
        "",
        "What the levers' terms explain: bf16_ce and addmm_bias (default since 26e1d33) remove the loss's fp32 "
        "passes over the logits and the QKV bias add, work that changes no FLOPs. Priced through GEMM_EFF_MAX "
        "alone, the model cannot see them go. Signed median error of the 1-GPU H100 runs (one GPU kind, "
        f"no parallelism): with either lever {_signed_median(on)}, with neither {_signed_median(off)}; the "
        "same model without its memory-bound lever terms (every one steptime prices by bytes a lever removes), refit "
        f"on the same calibration set: {_signed_median(on0)} and {_signed_median(off0)}. The layer's kernel levers "
        f"({', '.join(LAYER_LEVERS)}; their terms since 2026-11-27's seventeenth session) the same way: with any of "
        f"them {_signed_median(lay)}, with none {_signed_median(unlay)}; without the lever terms {_signed_median(lay0)} "
        f"and {_signed_median(unlay0)}.",
        "",
        *code_today_line(steps),
        *moe_lines(steps),
    ]
    twin = twins(steps)
    out += markdown.table(
        ["run", "set", "GPUs", "layout", "predicted ms", "measured ms", "error", f"{DEFAULT_MFU:.0%} MFU ms"],
        ([f"{r['run'].split('/')[-1]} ({_where(r['run'])})", set_cell(r, twin),
          f"{r['gpus']} x {gpus.short_gpu_name(r['gpu'])}", r["layout"], f"{r['pred_ms']:.0f}",
          f"{r['meas_ms']:.0f}", f"{r['err']:+.1%}", f"{r['mfu_ms']:.0f}"] for r in steps),
        [None] * 4 + ["right"] * 4)
    return out


def moe_lines(steps: list[dict[str, Any]]) -> list[str]:
    """The page's part on MoE layers under moe_gather (issue 63, goal 5): the term the model lacked, the MoE constants
    and the runs they were fitted on, the error on the runs they were not (beyond the catalog; catalog runs since
    the freeze), and every such run."""
    gather = [r for r in steps if r["moe_gather"]]
    if not gather:
        return []
    fit_on = [r for r in gather if r["moe_fit"]]
    refit = fit_moe(steps)
    stored = steptime.moe_fitted()
    default = [r for r in gather if r["moe_default"]]
    beyond = [r for r in default if _where(r["run"]) == "holdout"]
    since = [r for r in default if not r["moe_fit"] and _where(r["run"]) != "holdout"]
    partial = [r for r in gather if not r["moe_default"]]
    today = [r for r in gather if r["code_today"]]
    today_judged = [r for r in today if not r["moe_fit"]]
    within = sum(abs(r["err"]) <= 0.10 for r in today)
    consts = ", ".join(f"{k}={v:g}" for k, v in stored.items())
    return [
        "",
        "### MoE layers with today's levers (issue 63)",
        "",
        "The term that was missing: what a MoE layer moves through HBM. The model priced every MoE layer at "
        f"MOE_LAYER_MS={steptime.MOE_LAYER_MS:g} ms a micro-batch, a lump fitted on runs whose token dispatcher "
        "synced with the host in every layer, and had no term for the layer's memory-bound traffic. moe_gather "
        "removes the syncs and keeps the traffic, so the lump read today's runs 2-3x high. Under moe_gather (EP = "
        "ETP = 1) the lump goes and the layer is priced beside its grouped GEMMs (their FLOPs at the GEMM "
        "efficiency, as one GEMM over all experts) by the bytes its kernels move, per routed copy and unit of width: "
        f"the gathers and combine (MOE_ROUTED_BYTES={steptime.MOE_ROUTED_BYTES} over h), the activation times the "
        f"router's probability (MOE_ACT_BYTES={steptime.MOE_ACT_BYTES} with moe_act, "
        f"MOE_ACT_TORCH_BYTES={steptime.MOE_ACT_TORCH_BYTES} in torch's kernels, over the fc1 output); and per expert "
        "weight its gradient into main_grad, which the step's first micro-batch writes "
        f"(EXPERT_GRAD_FIRST_BYTES={steptime.EXPERT_GRAD_FIRST_BYTES}) and each later one adds to "
        f"(EXPERT_GRAD_ADD_BYTES={steptime.EXPERT_GRAD_ADD_BYTES}) with expert_stack: a per-micro-batch cost "
        "whatever the micro-batch's size, the term 513 (four micro-batches) needed. The byte figures come from row "
        "510's profiles (megalab/core/steptime.py says which), not from timed runs. Then the optimizer over every "
        "expert weight as before, MOE_GATHER_LAYER_MS per layer and micro-batch for the router's and dispatcher's "
        "small kernels, and, without the CUDA graph, host and GPU overlapping only in part (the layers' stream "
        "syncs remain): sqrt(GPU^2 + CPU^2) a micro-batch, not the larger. A run without moe_gather keeps the old "
        "pricing.",
        "",
        f"MoE constants: {consts}, fitted on the {len(fit_on)} catalog-row run{'s' * (len(fit_on) != 1)} with "
        f"moe_gather and expert_stack and today's code made by {freeze.MOE_FROZEN_TIME[:16].replace('T', ' ')} UTC "
        f"(freeze.MOE_FROZEN_TIME): {', '.join(r['run'].split('/')[-1] for r in fit_on) or 'none'}"
        + (" (a refit on them gives the same)." if refit in ({}, stored) else
           f" (a refit on them gives {', '.join(f'{k}={v:g}' for k, v in refit.items())}: store it in steptime.py).")
        + " Every other run is judged against them.",
        "",
        f"- MoE step time, every run under moe_gather made with today's code (issue 63's goal 5): {within} of "
        f"{len(today)} within 10%; those not fitted on: {error_summary([r['err'] for r in today_judged])}",
        f"- fitted on: {error_summary([r['err'] for r in fit_on])}",
        f"- held out, beyond the catalog (other expert counts, top-k, sequence lengths, micro-batches): "
        f"{error_summary([r['err'] for r in beyond])}",
        f"- catalog rows' runs since the freeze: {error_summary([r['err'] for r in since])}",
        f"- moe_gather without expert_stack (lever trials; its per-expert weights' host work is not priced): "
        f"{error_summary([r['err'] for r in partial])}",
        "- Runs of older code are listed below with the error today's constants give them: their dispatcher, "
        "activation and gradient kernels moved other bytes than today's (the profiles on the bench page).",
        "",
        *markdown.table(
            ["run", "MoE", "layout", "levers", "CUDA graph", "predicted ms", "measured ms", "error", "code", "role"],
            ([f"{r['run'].split('/')[-1]} ({_where(r['run'])})", r["experts"], r["layout"],
              ", ".join(x for x in ("moe_gather", "expert_stack", "moe_act") if x in r["fastpath"].split(",")),
              "on" if r["graph"] else "off",
              f"{r['pred_ms']:.0f}", f"{r['meas_ms']:.0f}", f"{r['err']:+.1%}", "today" if r["code_today"] else "older",
              "fitted on" if r["moe_fit"] else ("held out" if _where(r["run"]) == "holdout" else "judged")]
             for r in gather),
            [None] * 5 + ["right"] * 3 + [None, None]),
        "",
    ]


def write_validation(root: Path | None = None, rows: list[dict[str, Any]] | None = None,
                     steps: list[dict[str, Any]] | None = None) -> Path:
    root = Path(root) if root is not None else catalog.ROOT
    path = root / "results" / "estimate-vs-measured.md"
    markdown.write_if_changed(path, validation_table(root, rows, steps))
    return path




def main(args: argparse.Namespace) -> int:
    """`python -m megalab plan --validate`: write results/estimate-vs-measured.md and print the errors."""
    rows = validation_rows(args.root)
    steps = step_rows(args.root)
    path = write_validation(args.root, rows, steps)
    ran = [r for r in rows if r["status"] == "ok"]
    for what, table in (("step time", steps), ("memory", ran)):
        for label, sel in by_set(table)[2:]:  # the out-of-sample figures: held-out unseen, out of catalog
            print(f"megalab plan: {what}, {label} runs: {error_summary([r['err'] for r in sel])}")
    ooms = [r for r in rows if r["status"] == "oom"]
    worst = max(ran, key=lambda r: abs(r["err"]), default=None)
    print(f"megalab plan: {sum(r['ok'] for r in ran)}/{len(ran)} runs within 10%"
          + (f" (worst {worst['err']:+.1%}, {worst['target']})" if worst else "")
          + f"; {sum(r['ok'] for r in ooms)}/{len(ooms)} OOM runs predicted not to fit; wrote {path}")
    return 0 if all(r["ok"] for r in rows) else 1
