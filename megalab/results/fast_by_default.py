"""Fast by default (issue 17): every 1-2 GPU row with a published Transformer Engine time, against
what a plain `make <target>` gives.

One row per such target: the reference (ms, memory), ours before (the newest ok record made before
today's defaults: a schema-1 record), ours now (the newest ok record whose provenance is `today`:
today's defaults, today's plan, today's code), the ratio now / reference and the verdict the issue
asks for: at or below the reference's time at no more memory. Hardware is named per row: a ratio is
only meaningful on the GPU kind the reference used (H100 for R rows, 2x H200 for T rows; 2-GPU R rows
run on 2x H200 capped to 80 GB). Rows with no `today` record say "not run".
"""
from __future__ import annotations

import math

from megalab.core import catalog
from megalab.core.paths import ROOT
from megalab.core import markdown, provenance
from megalab.results import chapter
from megalab.results.columns import fmt_cap
from megalab.core.gpus import short_gpu_name
from megalab.core.records import RunRecord, read_records, repeats


def _reference(exp, anchor, twogpu) -> tuple[float, float] | None:
    """(ms, GiB per GPU) the reference published for this target, or None."""
    ref = exp.ref or ""
    if ref.startswith("T") and ref in twogpu.index:
        r = twogpu.loc[ref]
        mib = max(float(r["mem_mib_gpu0"]), float(r["mem_mib_gpu1"]) if str(r["mem_mib_gpu1"]) not in ("", "nan") else 0)
        return float(r["step_ms"]), mib / 1024
    if ref and (exp.chapter, ref) in anchor.index:
        r = anchor.loc[(exp.chapter, ref)]
        try:
            gib = float(r["mem_gb_per_gpu"]) * chapter.REF_GB_TO_GIB
        except ValueError:
            gib = math.nan
        return float(r["step_ms"]), gib
    return None


def like_reference(r: RunRecord, exp) -> bool:
    """Whether a run is on the GPU kind its reference used: T rows on H200s (uncapped: the 2x H200 set);
    R rows on H100s, or for 2-GPU R rows on H200s capped to 80 GB (the rig has no 2x H100)."""
    name, cap = r.gpu_name or "", r.gpu_mem_cap
    if (exp.ref or "").startswith("T"):
        return "H200" in name and not cap
    if "H100" in name:
        return True
    return exp.gpus > 1 and "H200" in name and cap is not None and cap <= 80


def ok_records(root=ROOT) -> dict[str, list]:
    recs: dict[str, list] = {}
    for r in read_records(root / "results" / "runs", "megalab bench-report"):
        if r.status == "ok" and r.step_ms_median:
            recs.setdefault(r.target, []).append(r)
    return recs


def now_record(exp, recs: dict[str, list], root=ROOT) -> RunRecord | None:
    """What a plain `make <target>` gives today: the newest `today` record (on the reference's GPU kind
    first) with its repeats (same host, code, settings) folded in, so step_ms is their median."""
    mine = sorted(recs.get(exp.id, []), key=lambda r: r.started or "")
    now = [r for r in mine if provenance.of(r, root).state == provenance.CURRENT]
    now = [r for r in now if like_reference(r, exp)] or now
    if not now:
        return None
    n = now[-1]
    return n.grouped(repeats(n, now, lambda r: provenance.setup_key(r, root)))


def per_gpu_references(exp, anchor) -> list[str]:
    """The 8x H100 reference rows whose per-GPU work a one-GPU analogue carries: its chapter, model, experts and
    top-k, each GPU's share of the global batch equal to its batch, in micro-batches of its size (510: R0-R2)."""
    if exp.gpus != 1 or not exp.analogue_of:
        return []
    return [row for (ch, row), r in anchor.iterrows()
            if ch == exp.chapter and r["model"] == exp.model and int(r["gpus"]) > 1
            and int(r["gbs"]) == exp.gbs * int(r["gpus"]) and int(r["mbs"]) == exp.mbs
            and str(r["experts"]) == str(exp.num_experts or "") and str(r["topk"]) == str(exp.topk or "")]


PER_GPU = ("no verdict: the reference's tokens per GPU on one GPU, no communication (the reference's time "
           "includes it)")
NOT_RUN = ["not run", "", "", "", "not run with today's defaults"]


def _now_cells(n: RunRecord, ref_ms: float, verdict: str) -> list[str]:
    """The row's cells for today's record: ms (with its repeats), GiB, the ratio to the reference, the graph, verdict."""
    return [f"{n.step_ms:.0f}{spread(n)}", f"{max(n.mem_peak_gib or [math.nan]):.1f}", f"{n.step_ms / ref_ms:.2f}",
            "on" if n.intent and n.intent.cuda_graph else "off", f"{verdict} ({hardware(n)})"]


def rows(root=ROOT) -> list[list[str]]:
    anchor, twogpu = chapter.load_reference(), chapter.load_twogpu_reference()
    recs = ok_records(root)
    out = []
    for exp in catalog.catalog().values():
        refs = per_gpu_references(exp, anchor)
        n = now_record(exp, recs, root) if refs else None
        for row in refs:
            r = anchor.loc[(exp.chapter, row)]
            cells = [f"{row} (per GPU)", exp.id, f"{float(r['step_ms']):.0f}",
                     f"{float(r['mem_gb_per_gpu']) * chapter.REF_GB_TO_GIB:.1f}", "-"]
            out.append(cells + (NOT_RUN if n is None else _now_cells(n, float(r["step_ms"]), PER_GPU)))
    for exp in catalog.catalog().values():
        if exp.gpus > 2:
            continue
        ref = _reference(exp, anchor, twogpu)
        if ref is None or math.isnan(ref[0]):
            continue
        before = [r for r in sorted(recs.get(exp.id, []), key=lambda r: r.started or "") if r.schema == 1]
        b, n = (before[-1] if before else None), now_record(exp, recs, root)
        ref_ms, ref_gib = ref
        cells = [exp.ref, exp.id, f"{ref_ms:.0f}", "-" if math.isnan(ref_gib) else f"{ref_gib:.1f}",
                 f"{b.step_ms_median:.0f}" if b else "-"]
        if n is None:
            out.append(cells + NOT_RUN)
            continue
        fast, lean = n.step_ms <= ref_ms, math.isnan(ref_gib) or max(n.mem_peak_gib or [math.nan]) <= ref_gib
        verdict = "met" if fast and lean else ("faster, more memory" if fast else "slower")
        if not like_reference(n, exp):
            verdict = "no verdict: not the reference's GPU kind"
        out.append(cells + _now_cells(n, ref_ms, verdict))
    return out


def spread(n: RunRecord) -> str:
    """' (5 runs, 378–393)' for a now_record with repeats, else ''."""
    return f" ({n.runs.n} runs, {n.runs.lo_ms:.0f}–{n.runs.hi_ms:.0f})" if n.runs else ""


def hardware(n: RunRecord) -> str:
    """'1x H100 80GB GPU-177d0ba1', or '2x H200 GPU-88308c2d, capped 80 GB': the machine named by its first GPU's
    UUID where the record has one (two cards of one kind differ by a few percent: a figure is that machine's)."""
    card = provenance.card(n)
    return f"{n.num_gpus}x {short_gpu_name(n.gpu_name)}" + (f" {card}" if card else "") + (
        fmt_cap(n.gpu_mem_cap) if n.gpu_mem_cap else "")


HEADER = ["row", "target", "ref ms", "ref GiB", "ours before ms", "ours now ms", "now GiB", "now / ref",
          "CUDA graph", "verdict (hardware)"]


def section(root=ROOT) -> list[str]:
    body = rows(root)
    judged = [r for r in body if not r[0].endswith("(per GPU)")]  # per-GPU rows get no verdict
    met = sum(1 for r in judged if r[-1].startswith("met"))
    measured = sum(1 for r in judged if r[5] != "not run")
    return ["## Fast by default: every 1-2 GPU row with a published TE time", "",
            "A plain `make <target>` (CUDA_GRAPH=auto, the default fast path) against the Transformer Engine "
            "reference. *Before*: the newest record made before today's defaults (schema 1); *now*: the records "
            "whose provenance is `today` (megalab/core/provenance.py): the newest run, or where it was repeated on "
            "the same host with the same code, the median of the runs' medians with the number of runs and their "
            "range. Memory in GiB (the 8x H100 "
            "reference converted as on the chapter pages). A ratio compares like hardware only: R rows were "
            "published on H100s, T rows on 2x H200; the 2-GPU R rows ran on 2x H200 capped to 80 GB. Of today's "
            "runs a row shows those on the reference's GPU kind (`fast_by_default.like_reference`) where there are any "
            "(a chapter re-measured on one machine may hold a row's runs on another kind too); a row measured "
            "on another kind only gets no verdict.", "",
            "A row marked *per GPU* is a one-GPU analogue carrying an 8-GPU reference row's work per GPU (its "
            "tokens, in micro-batches of the same size): the ratio shows how far one GPU's compute is from the "
            "reference's whole step, never a verdict.", "",
            f"{met} of {measured} rows measured now are at or below the reference's time at no more memory; "
            f"{len(judged) - measured} of {len(judged)} are not run with today's defaults yet.", "",
            *markdown.table(HEADER, body), ""]
