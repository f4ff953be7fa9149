"""results/bench/README.md from the committed bench records (configs/bench.yaml says what to compare).

Pure function of the files: `python -m megalab bench-report` rebuilds it on any machine, and a CPU
test checks the committed page is what the records give.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import sys
from pathlib import Path

from megalab.core.paths import ROOT
from megalab.core import benchruns, gpus, infile, logparse, markdown
from megalab.core.benchruns import BENCH_DIR  # noqa: F401 (the page's folder: `python -m megalab bench-report`)
from megalab.results import columns, fast_by_default, hosts, launchtime, library_trials, onegpu_goals, pageguard
from megalab.core.records import RunRecord, num, read_records
from megalab.core import catalog
from megalab.results import chapter
from megalab.core import provenance
from megalab.runtime import levers

# Loss parity tolerance (justified in the page). The first steps test the function itself: same
# initial weights, same data, so a wrong mask shows at step 1 and a wrong gradient from step 2, far
# above bf16 rounding. Later, loss spikes of early training amplify any rounding difference (even
# between two runs of one configuration: flash attention's backward is not bitwise deterministic),
# so there only the typical (median) difference is bounded.
PARITY_EARLY_STEPS = 5
PARITY_EARLY_MAX_REL = 0.001   # steps 1-5
PARITY_MEDIAN_REL = 0.015      # median over all steps
BASE_FAILS_TOO = "FAIL (so do two base runs)"  # a trial's parity cell where the base fails against itself too
# A lever that draws dropout masks of its own (bench.yaml `own_masks: true`) cannot keep the base's first losses:
# they differ from step 1 by the masks. Its pairs are judged by the median rule alone, and the cell says so; the
# function itself is checked with the same masks on the CPU (the lever's own test).
OWN_MASKS = "(median rule: own masks)"

GOALS = [  # (what, case name, step ms at most, peak GiB at most or None)
    ("T1 on 2 GPUs: gpt2-large DP=2 + ZeRO-2, GBS 64 (2-GPU reference with TE: 437 ms)",
     "T1: gpt2-large DP=2 + ZeRO-2, GBS 64", 437.0, None),
    ("row 111 (GBS 15): median step at the reference's memory", "row 111, GBS 15", 393.0, 78.5),
    ("row 111 (GBS 15): stretch", "row 111, GBS 15", 340.0, 78.5),
    ("row 101 (GBS 1): median step", "row 101, GBS 1", 220.0, None),
]
# Issue 17's goals for what a plain `make <target>` gives (today's defaults; results/fast_by_default.py's
# records): (what, target, step ms at most: None for the reference's own, whether memory must stay at or
# below the reference's).
DEFAULT_GOALS = [
    ("row 111, plain make: at or below the TE reference at no more memory", "111-gpt2xl-dp1-fit-80GB", None, True),
    ("row 111, plain make: stretch", "111-gpt2xl-dp1-fit-80GB", 340.0, False),
    ("row 101, plain make: stretch", "101-gpt2xl-dp1-gbs1-bf16", 100.0, False),
    ("T1 (002), plain make: stretch", "002-gpt2large-dp2-gbs64", 400.0, False),
]


# Issue 63's goals for mixture of experts on one GPU: the issue fixes them on the rig's GPU (an H200 capped to 80 GB),
# not the reference's kind: (what, target, step ms at most, peak GiB at most) and (what, target, over target, at most
# that many times its step). Both sides of a ratio are today's plain launches on one machine.
MOE_GOALS = [("row 510 (MoE, R0's tokens per GPU on one GPU), plain make", "510-olmoe-1gpu-gbs4", 150.0, 70.0)]
MOE_RATIOS = [("row 513: 510's work in 4 micro-batches, plain make", "513-olmoe-1gpu-gbs4-mbs1", "510-olmoe-1gpu-gbs4",
               2.0)]


def _moe_goal_rows(root: Path = ROOT) -> list[list[str]]:
    recs = fast_by_default.ok_records(root)
    out = []
    for what, target, ms_max, gib_max in MOE_GOALS:
        n = fast_by_default.now_record(catalog.get(target), recs, root)
        limit = f"<= {ms_max:g} ms at <= {gib_max:g} GiB (3 launches or more)"
        if n is None:
            out.append([what, limit, "not run with today's defaults", "-"])
            continue
        gib = max(n.mem_peak_gib or [float("nan")])
        enough = n.runs is not None and n.runs.n >= 3
        verdict = ("met" if n.step_ms <= ms_max and gib <= gib_max else "missed") if enough else \
            "no verdict: fewer than 3 launches"
        out.append([what, limit, f"{n.step_ms:.0f} ms{fast_by_default.spread(n)}, {gib:.1f} GiB "
                                 f"({fast_by_default.hardware(n)})", verdict])
    for what, target, over, most in MOE_RATIOS:
        a, b = (fast_by_default.now_record(catalog.get(t), recs, root) for t in (target, over))
        limit = f"<= {most:g}x {over.split('-')[0]}'s step"
        if a is None or b is None:
            out.append([what, limit, "not run with today's defaults (both rows)", "-"])
            continue
        same = provenance.card(a) == provenance.card(b)
        ratio = a.step_ms / b.step_ms
        verdict = ("met" if ratio <= most else "missed") if same else "no verdict: the two rows ran on different GPUs"
        out.append([what, limit, f"{a.step_ms:.0f} / {b.step_ms:.0f} ms = {ratio:.2f}x ({fast_by_default.hardware(a)})",
                    verdict])
    return out


def _default_goal_rows(root: Path = ROOT) -> list[list[str]]:
    anchor, twogpu, recs = chapter.load_reference(), chapter.load_twogpu_reference(), fast_by_default.ok_records(root)
    out = []
    for what, target, ms_max, lean in DEFAULT_GOALS:
        exp = catalog.get(target)
        ref_ms, ref_gib = fast_by_default._reference(exp, anchor, twogpu)
        ms_max = ref_ms if ms_max is None else ms_max
        limit = f"<= {ms_max:g} ms" + (f" at <= {ref_gib:.1f} GiB" if lean else "")
        n = fast_by_default.now_record(exp, recs, root)
        if n is None:
            out.append([what, limit, "not run with today's defaults", "-"])
            continue
        gib = max(n.mem_peak_gib or [float("nan")])
        met = n.step_ms <= ms_max and (not lean or gib <= ref_gib)
        verdict = ("met" if met else "missed") if fast_by_default.like_reference(n, exp) else \
            "no verdict: not the reference's GPU kind"
        shown = f"{n.step_ms:.0f} ms{fast_by_default.spread(n)}, {gib:.1f} GiB ({fast_by_default.hardware(n)})"
        out.append([what, limit, shown, verdict])
    return out


def _ref_row(case: dict) -> dict | None:
    """The published row a case compares with: the 8x H100 series (`ref`) or the 2x H200 set (`ref2`)."""
    if case.get("ref"):
        r = chapter.load_reference().loc[(1, case["ref"])]
        return {"ms": float(r["step_ms"]), "gb": float(r["mem_gb_per_gpu"])}
    if case.get("ref2"):
        r = chapter.load_twogpu_reference().loc[case["ref2"]]
        return {"ms": float(r["step_ms"]), "gb": round(float(r["mem_mib_gpu0"]) / 1024, 1)}
    return None


def _ms(r: RunRecord | None) -> str:
    """'312 (300-330)': median step and its p10-p90 of an ok run; what became of it otherwise."""
    if r is None:
        return "not run"
    if r.status != "ok":
        return "out of memory" if r.status == "oom" else r.status
    shared = " †" if r.concurrent else ""
    return f"{r.step_ms_median:.0f} ({r.step_ms_p10:.0f}-{r.step_ms_p90:.0f}){shared}"


def _gib(r: RunRecord | None) -> str:
    peaks = r.mem_peak_gib if r is not None else ()
    return f"{max(peaks):.1f}" if peaks else ""


def _gb(r: RunRecord) -> float:
    """Peak GiB: the published "GB" is nvidia-smi's MiB / 1024, as the chapter tables compare it."""
    return max(r.mem_peak_mib) / 1024


def _ok(r: RunRecord | None) -> bool:
    return r is not None and r.status == "ok"


def _losses(r: RunRecord) -> dict[int, float]:
    text = logparse.read_text(r.log_path)
    key = hashlib.sha256(text.encode()).hexdigest()
    if key not in _LOSSES:  # each log's text parsed once a process: the trials read the same pairs' logs again
        _LOSSES[key] = {it.iteration: it.lm_loss for it in logparse.iterations(text) if it.lm_loss is not None}
    return dict(_LOSSES[key])


_LOSSES: dict[str, dict[int, float]] = {}  # a log's text's digest -> its losses


def parity(a: RunRecord, b: RunRecord, own_masks: bool = False) -> dict:
    """The bench's loss rule for two runs: steps 1-PARITY_EARLY_STEPS within PARITY_EARLY_MAX_REL and the median
    over every common step within PARITY_MEDIAN_REL; with own_masks (one side draws dropout masks of its own, so
    its first losses differ by the masks) the median rule alone."""
    la, lb = _losses(a), _losses(b)
    common = sorted(set(la) & set(lb))
    rel = [abs(la[i] - lb[i]) / abs(la[i]) for i in common]
    early = [r for i, r in zip(common, rel) if i <= PARITY_EARLY_STEPS]
    apart = [i for i, r in zip(common, rel) if r > PARITY_EARLY_MAX_REL]
    out = {"steps": len(common), "max_rel": max(rel) if rel else None,
           "early_max_rel": max(early) if early else None,
           "median_rel": sorted(rel)[len(rel) // 2] if rel else None,
           "first_apart": apart[0] if apart else None,
           "first": (la[common[0]], lb[common[0]]) if common else None,
           "last": (la[common[-1]], lb[common[-1]]) if common else None}
    early_ok = len(early) == PARITY_EARLY_STEPS and out["early_max_rel"] <= PARITY_EARLY_MAX_REL
    out["pass"] = ((own_masks or early_ok) and out["median_rel"] is not None
                   and out["median_rel"] <= PARITY_MEDIAN_REL)
    return out


def _speedup(slow: RunRecord | None, fast: RunRecord | None) -> str:
    """'1.23x': slow's step time over fast's, where both ended ok; '' otherwise; '≠host' where the two
    ran on different machines or code (one command moves between machines, results/checks.md "Between
    machines": no ratio is made)."""
    if not (_ok(slow) and _ok(fast)):
        return ""
    ka, kb = provenance.comparable_key(slow), provenance.comparable_key(fast)
    if ka and kb and ka != kb:  # one rule for every ratio: one host, one code and defaults
        return columns.OTHER_HOST
    return f"{slow.step_ms_median / fast.step_ms_median:.2f}x"


def _comparable(slow: RunRecord | None, fast: RunRecord | None) -> bool:
    """Both ended ok, and _speedup would give their ratio."""
    return _speedup(slow, fast) not in ("", columns.OTHER_HOST)


def _findings(cfg: dict, get) -> list[str]:
    """What the ablation says, in words computed from it: the biggest lever per case, and the
    alternatives that did not pay (not kept in megalab's spec)."""
    out = []
    ab = cfg["ablation"]
    runs = benchruns.ablation_runs(cfg)
    for name in ab["cases"]:
        steps = [get(run) for n, lv, run in runs if n == name and lv in ab["steps"]]
        alts = [(lv[-1], get(run)) for n, lv, run in runs if n == name and lv not in ab["steps"]]
        # only the ratios the table gives (_speedup): one host, one code and defaults
        gains = [(steps[i - 1].step_ms_median / steps[i].step_ms_median, ab["steps"][i][-1])
                 for i in range(1, len(steps)) if _comparable(steps[i - 1], steps[i])]
        apart = [ab["steps"][i][-1] for i in range(1, len(steps))
                 if _speedup(steps[i - 1], steps[i]) == columns.OTHER_HOST]
        if gains:
            g, lever = max(gains)
            out.append(f"- {name}: the largest single gain is `{lever}` ({g:.2f}x over the step before it)"
                       + (f", of the steps whose runs share a host and code; not compared: {', '.join(apart)}"
                          if apart else "") + ".")
        last = steps[-1]
        for alt, rec in alts:
            if rec is None or not _ok(last):
                continue
            if rec.status == "oom":
                out.append(f"- {name}: `{alt}` on top ran out of memory: not kept.")
            elif _comparable(last, rec):
                x = last.step_ms_median / rec.step_ms_median
                verdict = "kept out of the default: within noise" if x < 1.02 else "pays"
                out.append(f"- {name}: `{alt}` on top gives {x:.2f}x ({verdict}).")
    return (["Findings (computed from the table):", ""] + out + [""]) if out else []


def checked(cfg: dict) -> dict:
    """CFG, once what the page itself reads in it is there: the cases its goals name (GOALS) and every
    case's published row (`ref`: chapter 1 of anchor_8xh100.csv, `ref2`: twogpu_2xh200.csv) with a
    number for its step time and memory, and the published rows of the default goals' targets;
    benchruns.BenchConfigError or chapter.ReferenceTableError (one line) else."""
    names = {c["name"] for c in cfg["cases"]}
    if missing := sorted({case for _, case, *_ in GOALS} - names):
        raise benchruns.BenchConfigError(f"cases: no case named {missing} (the page's goals read them)")
    anchor, twogpu = chapter.load_reference(), chapter.load_twogpu_reference()
    chapter.check_refs(anchor, twogpu)  # the catalog's refs, which the default goals read
    for _, target, ms_max, _ in DEFAULT_GOALS:
        if ms_max is None and fast_by_default._reference(catalog.get(target), anchor, twogpu) is None:
            raise benchruns.BenchConfigError(f"{target} has no published row, and the page's goal for it is the "
                                             "published step time", "give the target its `ref` in the catalog")
    for case in cfg["cases"]:
        for key, table, index, cols in (("ref", anchor, lambda r: (1, r), ("step_ms", "mem_gb_per_gpu")),
                                        ("ref2", twogpu, lambda r: r, ("step_ms", "mem_mib_gpu0"))):
            if case.get(key) is None:
                continue
            if index(case[key]) not in table.index:
                raise benchruns.BenchConfigError(f"cases '{case['name']}': {key} {case[key]} is no published row "
                                                 f"({'chapter 1 of anchor_8xh100.csv' if key == 'ref' else 'twogpu_2xh200.csv'})")
            row = table.loc[index(case[key])]
            if any(num(row[c]) is None for c in cols):
                raise benchruns.BenchConfigError(f"cases '{case['name']}': {key} {case[key]} has no published step "
                                                 "time and memory to compare with")
    return cfg


def render(bench_dir: Path, cfg: dict | None = None) -> str:
    """The page: the header, then one section per part of configs/bench.yaml, then the runs it read."""
    cfg = checked(cfg or benchruns.load_config())
    recs = hosts.mark(benchruns.load_runs(bench_dir / "runs"), bench_dir.parent, "megalab bench-report")
    get = lambda run: recs.get(run.key())  # noqa: E731
    mm_path = bench_dir / "matmul.json"
    mm = _matmul(mm_path)
    largest, search_lines = _search_section(cfg, recs)
    root = bench_dir.parent.parent
    trials = trial_rows(cfg, bench_dir, root)
    # the goals' launches, read once for "One GPU, past the reference" and its beyond-the-catalog table
    todays = onegpu_goals.goal_runs(cfg["past_reference"], root) if cfg.get("past_reference") else None
    L = [*_header(recs, mm), *_contenders_section(cfg, get, mm["tflops"] if mm else None), *search_lines,
         *_ablation_section(cfg, get), *trials_section(cfg, bench_dir, rows=trials), *_parity_section(cfg, get),
         *_experts_section(cfg, get),
         *_goals_section(cfg, get, largest, root), *fast_by_default.section(root),
         *onegpu_goals.section(cfg, root, todays),
         *beyond_section(cfg, trials, root, todays),
         *_profiles_section(bench_dir, recs), *_cp_section(bench_dir),
         *library_trials.section(bench_dir, _text), *launchtime.section(root)]
    if any(r.concurrent for r in recs.values()):
        L += [columns.SHARED_NOTE, ""]
    if any(f"| {columns.OTHER_HOST} |" in line for line in L):
        L += [columns.OTHER_HOST_NOTE, ""]
    L += _runs_section(cfg, recs, bench_dir)
    return "\n".join(L) + "\n"


def _text(path: Path) -> str:
    """A committed text file of the bench, through the file door; '' (and a line) where it is no file."""
    try:
        return infile.text(path)
    except OSError as e:
        print(f"megalab bench-report: skipping {e}", file=sys.stderr)
        return ""


def _matmul(path: Path) -> dict | None:
    """The GPU's measured matmul rate (bench matmul's JSON), or None: none there, or not that JSON (said)."""
    if not path.exists():
        return None
    try:
        mm = json.loads(infile.read(path))
        if isinstance(mm, dict) and isinstance(mm.get("gpu_name"), str) and all(
                num(mm.get(k)) is not None for k in ("tflops", "tflops_best", "n", "iters")):
            return mm
        why = "not bench matmul's JSON (gpu_name, tflops, tflops_best, n, iters)"
    except (OSError, ValueError) as e:
        why = str(e)
    print(f"megalab bench-report: skipping {path}: {why}; fix: run `make bench` again or remove it", file=sys.stderr)
    return None


def _header(recs: dict, mm: dict | None) -> list[str]:
    L = ["# Fast without Transformer Engine: the benchmark", "",
         "Generated by `python -m megalab bench-report` from the records in `runs/` (configs/bench.yaml "
         "says what is compared); `make bench` measures them on a GPU (the 2-GPU case where two are present). Every run is an ordinary megalab "
         "launch (same wrapper, monitor and record as a table row); step times are medians after 3 "
         "warm-up iterations with the p10-p90 spread in brackets, memory the NVML peak in GiB.", ""]
    names = sorted({r.gpu_name for r in recs.values() if r.gpu_name})
    L += [f"GPU: {markdown.escape(', '.join(names)) or 'none yet'}. No Transformer Engine, no apex (pip megatron-core 0.19.2, "
          "PyTorch's SDPA). The TE reference is the published row with TE: the 8x H100 tutorial series (R rows) or the 2x H200 set (T rows).", ""]
    if mm and (peak := gpus.peak_tflops(mm["gpu_name"])):
        L += [f"Ceiling: a bf16 {mm['n']}^3 matmul runs at **{mm['tflops']} TFLOP/s** (median of {mm['iters']}; "
              f"best {mm['tflops_best']}) on {markdown.escape(mm['gpu_name'])}, {mm['tflops'] / peak:.0%} of the "
              f"{peak:.0f} TFLOP/s datasheet peak.", ""]
    return L


def _contenders_section(cfg: dict, get, ceiling: float | None) -> list[str]:
    rows = []
    for case in cfg["cases"]:
        a, b = get(benchruns.spec_run(cfg, case, "local")), get(benchruns.spec_run(cfg, case, "megalab"))
        ref = _ref_row(case)
        ratio = _speedup(a, b) or ("(a) out of memory" if a and a.status == "oom" and _ok(b) else "")
        tf = round(b.tflops_per_gpu, 1) if _ok(b) else None
        peak = gpus.peak_tflops(b.gpu_name) if tf else None
        rows.append([case["name"], f"{ref['ms']:.0f} / {ref['gb']}" if ref else "-", _ms(a), _gib(a), _ms(b), _gib(b),
                     ratio, tf if tf is not None else "", f"{tf / peak:.1%}" if tf and peak else "",
                     f"{tf / ceiling:.1%}" if tf and ceiling else ""])
    lev = " + ".join(cfg["specs"]["megalab"]["levers"])
    return ["## Stock local spec vs megalab's spec", "",
            f"(a) Megatron's stock local spec (`SPEC=local`, as pip Megatron runs without TE); (b) megalab's spec "
            f"(`SPEC=megalab`) with {lev}.", "",
            *markdown.table(["case", "TE reference ms / GB", "(a) local ms", "(a) GiB", "(b) megalab ms", "(b) GiB",
                             "a/b", "(b) TFLOP/s/GPU", "MFU (datasheet)", "MFU (matmul)"], rows), ""]


def _search_section(cfg: dict, recs: dict) -> tuple[dict, list[str]]:
    """(largest GBS that fits per spec, the section): the sizes tried are whatever records exist."""
    s = cfg["search"]
    largest, rows = {}, []
    for spec_name, levers in s["levers"].items():
        spec = cfg["specs"][spec_name]
        tried = {}
        same = benchruns.make_run(cfg, s["target"], spec["spec"], levers, None).key()[1:]  # all but the id
        for run_key, rec in recs.items():
            if run_key[1:] == same and run_key[0].startswith(s["target"]):
                tried[rec.config.mbs] = benchruns.fits(rec)
        fit = [g for g, ok in tried.items() if ok]
        nofit = [g for g, ok in tried.items() if ok is False]
        best = max(fit) if fit and nofit and min(nofit) == max(fit) + 1 else None
        largest[spec_name] = best
        desc = ", ".join(f"{g}: {'fits' if ok else ('oom' if ok is False else '?')}" for g, ok in sorted(tried.items()))
        rows.append([spec_name, " + ".join(levers) or "none",
                     best if best else (">= " + str(max(fit)) if fit else "not run"), desc])
    return largest, ["## Largest GBS that fits", "",
                     f"{s['target']} with GBS = MBS (one micro-batch per step), bisection from a size known to fit.", "",
                     *markdown.table(["spec", "levers", "largest GBS that fits", "sizes tried (fits / out of memory)"],
                                     rows), ""]


def _ablation_section(cfg: dict, get) -> list[str]:
    rows, prev = [], {}
    for name, levers, run in benchruns.ablation_runs(cfg):
        rec = get(run)
        rows.append([name, " + ".join(levers) or "none (spec only)", _ms(rec), _gib(rec), _speedup(prev.get(name), rec)])
        if levers in cfg["ablation"]["steps"]:
            prev[name] = rec
    return ["## What each lever buys (ablation)", "",
            "megalab's spec with the levers added one at a time; alternatives are tried on top and kept only if "
            "they pay.", "", *markdown.table(["case", "levers", "ms", "GiB", "vs previous step"], rows),
            "", "Levers:", "", *(f"- `{k}`: {markdown.escape(v['about'])}" for k, v in cfg["levers"].items()), "",
            *_findings(cfg, get)]


PAYS = "pays"  # a trial's verdict where every run with the lever beat every run without it


def _trial_verdict(on: list[float], off: list[float]) -> str:
    """'pays' only if every run with the lever beat every run without it (and 'slower' the other way
    round), with two runs or more on each side: one command's launches spread by several percent, and a
    machine drifts over a session, so a ratio of medians alone would call noise a gain."""
    if min(len(on), len(off)) < 2:
        return "no verdict: one run on a side"
    if max(on) < min(off):
        return PAYS
    if min(on) > max(off):
        return "slower"
    return "within noise (the runs overlap)"


def _find(tokens: list[str], seq: list[str]) -> int | None:
    """Where `seq` first stands in `tokens` as a run of items, or None."""
    return next((i for i in range(len(tokens) - len(seq) + 1) if tokens[i:i + len(seq)] == seq), None)


def _flag_levers(rec: RunRecord, flag_levers: dict[str, list[str]]) -> tuple[str, frozenset[str]]:
    """A trial run's EXTRA_ARGS less the levers' Megatron flags, and the levers (of `flag_levers`: name ->
    flags) whose flags its Megatron command holds. The command decides, where the record keeps one: once a
    lever's flags join the launcher's default, a plain run passes them without EXTRA_ARGS and runs with it."""
    ex = (rec.config.extra_args or "").split()
    argv = [str(a) for a in rec.intent.argv] if rec.intent and rec.intent.argv else ex
    on = frozenset(n for n, flags in flag_levers.items() if _find(argv, flags) is not None)
    for n in on:
        if (at := _find(ex, flag_levers[n])) is not None:
            ex = ex[:at] + ex[at + len(flag_levers[n]):]
    return " ".join(ex), on


NOT_RUN, NOT_COMPARED = "not run", "not compared: no machine and code with both"  # a trial row without a measurement


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One row of "Levers tried against the default": the levers (bench.yaml names), the configuration (a catalog
    target, and the EXTRA_ARGS that make it no catalog row, '' for the row itself), the table's cells."""
    levers: tuple[str, ...]
    target: str
    extra: str
    cells: tuple[str, ...]

    @property
    def verdict(self) -> str:
        return self.cells[-1]

    @property
    def compared(self) -> bool:
        """Whether runs with and without the levers met on one machine and code (the verdict is a measurement's)."""
        return self.verdict not in (NOT_RUN, NOT_COMPARED)


def trial_rows(cfg: dict, bench_dir: Path, root: Path = ROOT) -> list[TrialRow]:
    """Each trial's levers (one, or a set) against its base fast path (`base`: the default when it was
    tried; today's default if unnamed), per target: the runs with the base and the runs with the levers
    added, on the machine, code, CUDA-graph setting and ITERS where both sides ran (today's code where both sides
    have it, else the newest with two runs a side, else the most runs on the thinner side). Step time as the
    median of the runs' medians (range, n), peak memory, with / without, and the loss parity of the first pair
    (the bench's rule)."""
    # configurations that are not catalog rows live in results/holdout/runs (the estimator's out-of-catalog set)
    runs: dict[str, list[RunRecord]] = {}  # target -> its runs, in the folders' order
    for d in (root / "results" / "runs", bench_dir / "runs", root / "results" / "holdout" / "runs"):
        for r in read_records(d, "megalab bench-report"):
            runs.setdefault(r.target, []).append(r)
    flag_levers = _flag_lever_args(cfg)
    flagged_of: dict[int, tuple[str, frozenset[str]]] = {}  # id(run) -> _flag_levers: a run meets many trials
    rows = []
    for trial in cfg.get("trials", []):
        names = trial["lever"] if isinstance(trial["lever"], list) else [trial["lever"]]
        # a lever is a fast-path patch (FAST) or Megatron flags (args: in EXTRA_ARGS, or in the launcher's
        # default once they joined it); `base` names FAST patches and, where the base had them, flag levers
        added = {cfg["levers"][n]["fast"] for n in names if cfg["levers"][n].get("fast")}
        added_flags = frozenset(n for n in names if cfg["levers"][n].get("args"))
        # the CUDA graph as a lever: its side is the run's CUDA_GRAPH, not a setting both sides share
        graph = bool(benchruns.graph_levers(cfg) & set(names))
        own_masks = any(cfg["levers"][n].get("own_masks") for n in names)
        asked = set(trial.get("base", levers.EVERY))
        base_flags = frozenset(n for n in asked if cfg["levers"].get(n, {}).get("args"))
        base = asked - base_flags - added
        label = " + ".join(f"`{n}`" for n in names)
        for entry in trial["targets"]:
            target, extra = (entry, "") if isinstance(entry, str) else (entry["target"], " ".join(entry["extra_args"].split()))
            sides: dict[tuple, dict[bool, list]] = {}
            for r in runs.get(target, ()):
                fast = set((r.intent.fastpath if r.intent else None) or ())
                if r.status != "ok" or not r.step_ms_median or r.config.spec != "megalab":
                    continue
                if id(r) not in flagged_of:
                    flagged_of[id(r)] = _flag_levers(r, flag_levers)
                ex, flagged = flagged_of[id(r)]
                if ex != extra or not base_flags <= flagged:
                    continue
                with_graph = bool(r.config.cuda_graph)
                if fast == base | added and added_flags <= flagged and (with_graph or not graph):
                    side = True
                elif fast == base and not added_flags & flagged and not (graph and with_graph):
                    side = False
                else:
                    continue
                # both sides share the flag levers beside the trial's (one the default took since is in every run);
                # one code: the files either side ran (the lever's own file counts for its base too: one commit)
                # and one length: runs of another ITERS (a plain launch beside a trial's shorter ones) never mix
                key = (provenance.host_key(r), provenance.shared_code_key(r, base | added, root),
                       None if graph else with_graph, flagged - added_flags, r.config.iters)
                sides.setdefault(key, {True: [], False: []})[side].append(r)
            both = [(k, s) for k, s in sides.items() if s[True] and s[False]]
            where = f"{target} + `{extra}` (not a catalog row)" if extra else target
            shown = ",".join([*sorted(base), *(f"`{n}`" for n in sorted(base_flags))])
            if not both:
                rows.append(TrialRow(tuple(names), target, extra, (label, where, shown, *[""] * 7,
                                                                    NOT_COMPARED if sides else NOT_RUN)))
                continue
            # today's code first (a lever whose own file changed since is judged as it is now), then one that can give
            # a verdict (two a side), the newest such (the lever as it was last measured), then the most runs
            def rank(ks):
                thinner = min(len(ks[1][True]), len(ks[1][False]))
                newest = max(r.started or "" for side in ks[1].values() for r in side)
                return (ks[0][1] == provenance.CURRENT, thinner >= 2, newest if thinner >= 2 else "", thinner,
                        len(ks[1][True]) + len(ks[1][False]))

            key, s = max(both, key=rank)
            on, off = (sorted(s[k], key=lambda r: r.started or "") for k in (True, False))
            # a step time compares only within one machine and code: the row names both (an older code by the commit
            # of the lever's first run; the page's provenance rule says which changes count)
            code = onegpu_goals.code_label(key[1], on[0])
            med = {k: statistics.median([r.step_ms_median for r in v]) for k, v in ((True, on), (False, off))}
            x = med[True] / med[False]
            par = parity(on[0], off[0], own_masks)
            verdict = _trial_verdict([r.step_ms_median for r in on], [r.step_ms_median for r in off])
            # a failed pair beside two base runs that fail the same rule: the configuration's losses cannot tell
            base_too = not par["pass"] and len(off) > 1 and not parity(off[1], off[0])["pass"]
            cell = "PASS" if par["pass"] else BASE_FAILS_TOO if base_too else "FAIL"
            rows.append(TrialRow(tuple(names), target, extra, (
                label, where, shown, f"{fast_by_default.hardware(on[0])}, {code}",
                onegpu_goals.spread(off), onegpu_goals.spread(on),
                f"{x:.3f}", f"{max(off[0].mem_peak_gib):.1f} / {max(on[0].mem_peak_gib):.1f}",
                f"{par['early_max_rel']:.1e}" if par["early_max_rel"] is not None else "-",
                f"{cell} {OWN_MASKS}" if own_masks else cell, verdict)))
    return rows


def trials_section(cfg: dict, bench_dir: Path, root: Path = ROOT, rows: list[TrialRow] | None = None) -> list[str]:
    """The table of trial_rows (read once by the caller where another section reads them too)."""
    rows = trial_rows(cfg, bench_dir, root) if rows is None else rows
    if not rows:
        return []
    return ["## Levers tried against the default", "",
            "A lever, or a set of them, added to a base fast path (the default when it was tried) against that base, "
            "per target: plain `make <target>` launches with FAST set (a lever of Megatron flags: with EXTRA_ARGS; "
            "the flags in a run's Megatron command decide its side; a base names in `backticks` the flag levers it "
            "had), on one machine with one code (today's where both sides ran it, else the newest with two runs a side; "
            "a table row's records count on the side whose levers they ran with), both named: a step time compares "
            "only with one of the same machine and code. ms: the median of the runs' median steps "
            "(runs, lowest–highest). Parity: the first "
            f"pair's losses by the bench's rule (steps 1-{PARITY_EARLY_STEPS} within {PARITY_EARLY_MAX_REL:.1%}, and the "
            f"median over every step within {PARITY_MEDIAN_REL:.1%}); `{BASE_FAILS_TOO}`: two runs without the lever "
            "fail that rule against each other too, so that configuration's later losses cannot tell a lever (its "
            "early training amplifies rounding; the first steps' column still can). "
            f"`{OWN_MASKS}`: the lever draws dropout masks of its own, so its losses differ from the base's from "
            "the first step by the masks alone; its pair is judged by the median rule only, and the function is "
            "checked with the same masks in the lever's own test (tests/test_dropout_add.py, on the CPU). "
            "Verdict: `pays` where every run with the lever beat every run without it, two runs or more a side "
            "(a ratio of medians alone would call the machine's drift a gain). A lever joins the default only "
            "where it pays." + (" The kernels alone, outside a step: [fused-wgrad-microbench.txt](fused-wgrad-microbench.txt) "
                                "(`python -m megalab bench wgrad <target>`)." if (bench_dir / "fused-wgrad-microbench.txt").exists() else ""), "",
            *markdown.table(["lever", "target", "base (FAST, `flag levers`)", "machine, code", "base ms",
                             "with the lever ms", "with / without",
                             "GiB without / with", "first steps: largest rel. diff", "parity", "verdict"],
                            [list(r.cells) for r in rows]), ""]


def _flag_lever_args(cfg: dict) -> dict[str, list[str]]:
    """The levers of Megatron flags (bench.yaml `args`): name -> the flags, as a run's command holds them."""
    return {n: v["args"].split() for n, v in cfg["levers"].items() if v.get("args")}


def _run_levers(r: RunRecord, cfg: dict) -> set[str]:
    """The bench.yaml levers a run ran with: its fast path, the flag levers its Megatron command holds, and the
    CUDA-graph lever where it ran the graph."""
    by_fast = {v["fast"]: n for n, v in cfg["levers"].items() if v.get("fast")}
    fast = (r.intent.fastpath if r.intent else None) or ()
    flags = _flag_levers(r, _flag_lever_args(cfg))[1]
    graph = benchruns.graph_levers(cfg) if r.config.cuda_graph else set()
    return {by_fast.get(f, f) for f in fast if f} | flags | graph


def beyond_rows(cfg: dict, rows: list[TrialRow], root: Path = ROOT, todays: dict | None = None) -> list[list[str]]:
    """Issue 32's rule, per lever that a goal's plain launch runs now and did not when the issue was filed
    (`beyond_catalog.issue_default`): the configurations beyond the catalog (trials with EXTRA_ARGS) it was tried on,
    those where it paid (the two-a-side verdict; a set of levers counts for each of them where all joined the
    default), and whether they reach `min_configs`. A lever no trial tried beyond the catalog is a row too. TODAYS:
    onegpu_goals.goal_runs, where the caller has read them already."""
    block = cfg["past_reference"]
    rule = block["beyond_catalog"]
    graph = benchruns.graph_levers(cfg)
    todays = onegpu_goals.goal_runs(block, root) if todays is None else todays
    joined_at: dict[str, list[str]] = {}  # lever -> the goals whose default it joined
    for g in block["goals"]:
        runs = [r for group in todays[g["target"]] for r in group]
        had = set(rule["issue_default"]) | (graph if g["target"] in rule.get("issue_graph", []) else set())
        if runs:
            for n in _run_levers(max(runs, key=lambda r: r.started or ""), cfg) - had:
                joined_at.setdefault(n, []).append(g["target"].split("-")[0])
    joined = set(joined_at)
    out = []
    for n in sorted(joined):
        mine = [t for t in rows if t.extra and n in t.levers and t.compared]
        tried = {(t.target, t.extra) for t in mine}
        paid: dict[tuple, list[str]] = {}
        for t in mine:
            if t.verdict == PAYS and set(t.levers) <= joined:
                paid.setdefault((t.target, t.extra), []).extend(o for o in t.levers if o != n)
        where = "; ".join(f"{target.split('-')[0]} + `{extra}`" + (f" (with {', '.join(sorted({f'`{o}`' for o in w}))})"
                                                                   if w else "") for (target, extra), w in sorted(paid.items()))
        verdict = ("met" if len(paid) >= rule["min_configs"] else
                   "missed: not tried beyond the catalog" if not tried else
                   f"missed: pays on {len(paid)} of {len(tried)}")
        out.append([f"`{n}`", ", ".join(joined_at[n]), f"{len(paid)} of {len(tried)}", where or "-", verdict])
    return out


def beyond_section(cfg: dict, rows: list[TrialRow], root: Path = ROOT, todays: dict | None = None) -> list[str]:
    if not (cfg.get("past_reference") or {}).get("beyond_catalog"):
        return []
    rule = cfg["past_reference"]["beyond_catalog"]
    table = beyond_rows(cfg, rows, root, todays)
    if not table:  # said, not an empty table: no goal ran with today's settings, or none runs a lever it lacked then
        return [f"Beyond the catalog: no goal's plain launch with today's settings runs a lever its default lacked when "
                f"issue 32 was filed ({rule['issue_commit']}), so no lever has the rule to meet.", ""]
    met = sum(r[-1] == "met" for r in table)
    return [f"Beyond the catalog: issue 32 lets a lever join the default only if it also pays on {rule['min_configs']} "
            "configurations or more that are not catalog rows (a target with EXTRA_ARGS: another hidden size, depth, "
            "sequence or batch). Each lever a goal's newest plain launch runs that its default did not have when the "
            f"issue was filed ({rule['issue_commit']}: {', '.join(rule['issue_default'])}, and the full-iteration CUDA "
            f"graph at {', '.join(t.split('-')[0] for t in rule.get('issue_graph', [])) or 'none'}), with the rows of \"Levers "
            "tried against the default\" beyond the catalog: the configurations it paid on (the two-a-side verdict) of "
            "those it was tried on. A set of levers tried together counts for each where all of them joined. "
            f"{met} of {len(table)} meet the rule.", "",
            *markdown.table(["lever", "joined the default of", "beyond the catalog: pays / tried", "where it paid",
                             "verdict"], table), ""]


def _parity_row(pair: dict, a_run, b_run, get) -> list:
    a, b = get(a_run), get(b_run)
    if not (_ok(a) and _ok(b)):
        why = "not run" if a is None or b is None else f"{a.status} / {b.status}"
        return [pair["name"], a_run.label(), b_run.label(), *[""] * 7, why]
    r = parity(a, b)
    return [pair["name"], a_run.label(), b_run.label(), r["steps"],
            f"{r['first'][0]:.4f} / {r['first'][1]:.4f}", f"{r['last'][0]:.4f} / {r['last'][1]:.4f}",
            f"{r['early_max_rel']:.3%}", r["first_apart"] or "none", f"{r['median_rel']:.2%}", f"{r['max_rel']:.1%}",
            "PASS" if r["pass"] else "FAIL"]


def _parity_section(cfg: dict, get) -> list[str]:
    par = cfg["parity"]
    return ["## Loss parity", "",
            f"Same seed and mock data, dropout off, {par['iters']} steps (30 for the CP pairs); relative difference of the logged loss per "
            f"step. Pass: steps 1-{PARITY_EARLY_STEPS} within {PARITY_EARLY_MAX_REL:.1%} and the median over all steps "
            f"within {PARITY_MEDIAN_REL:.1%}. Why: the first steps test the function itself (same initial weights and "
            "data, so a wrong mask shows at step 1 and a wrong gradient from step 2, far above bf16 rounding). After "
            "that, the loss spikes of early training amplify any rounding difference chaotically, even between two runs "
            "of the same math with different kernel order (the CUDA-graph pair), so the largest single-step difference "
            "is reported, not bounded; the median stays near bf16 rounding when nothing is wrong.", "",
            *markdown.table(["pair", "(a)", "(b)", "steps", "first loss a / b", "last loss a / b", "steps 1-5 max",
                             "first step apart > 0.1%", "median", "max (any step)", "verdict"],
                            (_parity_row(pair, a, b, get) for pair, a, b in benchruns.parity_runs(cfg))),
            "", *(f"- {pair['name']}: {pair['note']}" for pair, _, _ in benchruns.parity_runs(cfg) if pair.get("note")),
            ""]


def _experts_section(cfg: dict, get) -> list[str]:
    rows = [[pair["name"], _ms(a), _gib(a), _ms(b), _gib(b), _speedup(a, b)]
            for pair, a, b in ((p, get(x), get(y)) for p, x, y in benchruns.expert_runs(cfg))]
    return ["## MoE experts without TE: SequentialMLP vs GroupedMLP", "",
            "Without Transformer Engine, Megatron's MoE experts are `SequentialMLP`, a loop of two small GEMMs per "
            "local expert; megalab's `GroupedMLP` (megalab/runtime/grouped_experts.py) runs each of the two as one "
            "`torch._grouped_mm` over all local experts and is the launcher's default where the preset asks for "
            "`--moe-grouped-gemm`. Same model, weights and flags otherwise.", "",
            *markdown.table(["pair", "(a) SequentialMLP ms", "(a) GiB", "(b) GroupedMLP ms", "(b) GiB", "a/b"], rows), ""]


def _goal_row(cfg: dict, get, what: str, case_name: str, ms_max: float, gib_max: float | None) -> list[str]:
    """The best megalab-spec run of a case (the spec's levers, each ablation step, each alternative) against a goal."""
    case = {c["name"]: c for c in cfg["cases"]}[case_name]
    runs = [benchruns.spec_run(cfg, case, "megalab")] + [r for n, _, r in benchruns.ablation_runs(cfg) if n == case_name]
    ok = [(get(r), r) for r in runs if _ok(get(r))]
    limit = f"<= {ms_max:g} ms" + (f" at <= {gib_max:g} GiB" if gib_max else "")
    if not ok:
        return [what, limit, "not run", "-"]
    meets = [(rec, r) for rec, r in ok if rec.step_ms_median <= ms_max and (not gib_max or _gb(rec) <= gib_max)]
    rec, r = min(meets or ok, key=lambda x: x[0].step_ms_median)
    return [what, limit, f"{rec.step_ms_median:.0f} ms, {_gb(rec):.1f} GiB ({r.label()})", "met" if meets else "missed"]


def _goals_section(cfg: dict, get, largest: dict, root: Path = ROOT) -> list[str]:
    rows = [_goal_row(cfg, get, *goal) for goal in GOALS] + _default_goal_rows(root) + _moe_goal_rows(root)
    g4 = {c["name"]: c for c in cfg["cases"]}.get("GBS 4")
    if g4:
        a, b = get(benchruns.spec_run(cfg, g4, "local")), get(benchruns.spec_run(cfg, g4, "megalab"))
        what = "faster than the stock local spec at GBS 4"
        if _ok(a) and _ok(b):
            x = a.step_ms_median / b.step_ms_median
            rows.append([what, ">= 1.3x", f"{x:.2f}x", "met" if x >= 1.3 else "missed"])
        else:
            rows.append([what, ">= 1.3x", "not run", "-"])
    what = "largest GBS vs the stock local spec"
    if largest.get("local") and largest.get("megalab"):
        x = largest["megalab"] / largest["local"]
        rows.append([what, ">= 2x", f"{largest['megalab']} vs {largest['local']} = {x:.2f}x", "met" if x >= 2 else "missed"])
    else:
        rows.append([what, ">= 2x", "search incomplete", "-"])
    return ["## Goals", "", *markdown.table(["goal", "target", "measured", "verdict"], rows), ""]


CP_MICROBENCH = "cp-ring-microbench.txt"


def _cp_section(bench_dir: Path) -> list[str]:
    """Context-parallel attention's compute on one GPU (`python -m megalab bench cp <target>`): the
    rig's output as it printed it, its '# ' notes (where and on which code it ran) left out."""
    path = bench_dir / CP_MICROBENCH
    if not path.exists():
        return []
    body = []
    for ln in markdown.quoted(_text(path)):  # the rig's output: quoted, never raw
        if not ln.startswith("# ") and (ln.strip() or (body and body[-1].strip())):  # no '# ' notes, one blank
            body.append(ln)
    return ["## Context-parallel attention without TE: what the ring costs besides communication", "",
            "megalab's ring attention (megalab/runtime/cp_attention.py, `cp_comm_type p2p`) on one GPU: one rank's "
            "work per layer, forward and backward, with the ring's transfers replaced by local copies, against "
            "1/CP of one flash-attention call over the whole sequence (what a fused CP kernel does at best per "
            "rank; TE's is one). The ratio is the ring's own cost, before any communication: smaller blocks per "
            "flash call, the fp32 merges of partial results and the gradient buffers. Where the bench split a run's "
            "GPU time, `flash kernels` is what a fused CP attention also runs and `other kernels` is the ring's "
            "own work (conversions, copies, merges, gradient sums) plus the local copies standing in for transfers; "
            "where the wall time is well above both, as at CP=8, the host's kernel launches lead. Rank 0's blocks. "
            f"[{CP_MICROBENCH}]({CP_MICROBENCH}) says where and on which code each table ran.", "", *body, ""]


def _profiles_section(bench_dir: Path, recs: dict) -> list[str]:
    """Where a step goes: each `make profile-<id>` run kept here with the trace summary made on the rig
    (`python -m megalab bench trace <trace>` -> trace-summary.md beside its record)."""
    out = []
    for rec in sorted(recs.values(), key=lambda r: r.run_dir.name):
        d = rec.run_dir / "trace-summary.md"
        if rec.run_dir.parent != bench_dir / "runs" or not d.exists():
            continue
        timers = rec.timers_ms or {}
        shown = ("forward-compute", "backward-compute", "optimizer", "optimizer-inner-step",
                 "optimizer-copy-main-to-model-params", "optimizer-copy-to-main-grad", "all-grads-sync")
        out += [f"### {rec.target} on {rec.num_gpus} x {markdown.escape(rec.gpu_name)}", "",
                f"Run [{d.parent.name}](runs/{d.parent.name}/run.json): median step {rec.step_ms_median:.0f} ms "
                "profiled (timers synchronise, kernels launch one by one, no CUDA graph). Megatron's timers, median "
                "ms per step: " + ", ".join(f"{k} {timers[k]:.1f}" for k in shown if k in timers) + "."
                + f" Fast path: `{markdown.escape(levers.text(rec.fastpath or ()))}`."
                + ("" if all((d.parent / t).exists() for t in rec.files.traces)
                   else " The trace itself was not kept (summarised, then deleted).")
                + (f" Every kernel of the two steps: [kernels.txt](runs/{d.parent.name}/kernels.txt)."
                   if (d.parent / "kernels.txt").exists() else "")
                + "".join(f" Where the GPU waited for the host, gap by gap (`python -m megalab bench gaps`"
                          f"{', gzipped' if name.endswith('.gz') else ''}): [{name}](runs/{d.parent.name}/{name})."
                          for name in ("gaps.txt", "gaps.txt.gz") if (d.parent / name).exists()), "",
                "The two profiled steps by the GPU kernels they ran (the trace's summary; kinds by "
                "`bench.KERNEL_KINDS`). GPU-busy well below wall time means the host (Python, launches) leads; "
                "`elementwise / other` is what fusions remove (TE fuses bias+GeLU, bias+dropout+add and the "
                "weight-gradient accumulation into fp32 main_grad; without TE or apex Megatron runs them as "
                "separate kernels, `--no-gradient-accumulation-fusion`, unless `FAST=...,fused_wgrad`: see "
                "\"Levers tried against the default\").", "",
                *markdown.quoted(_text(d).strip()), ""]  # a file of the run's folder: quoted, never raw
    intro = ("Two default fast-path levers came from row 111's kernel list (below, with the fast path it was "
             "profiled with): `bf16_ce` removed the loss's fp32 copy, max, exp, sum, divide and gradient kernels over "
             "the [tokens, vocabulary] logits ([mb-loss-and-bias.txt](mb-loss-and-bias.txt) times both losses per call "
             "in isolation), and `addmm_bias` the QKV projection's separate bf16 bias add (the "
             "`CUDAFunctor_add<c10::BFloat16>` calls in the kernel list). A profile made with an older fast path "
             "still lists them. So did `qkv_pack` (2026-11-26): the QKV gradient's `CatArrayBatchedCopy` and the "
             "bf16 `reduce_kernel` of its bias's sum, 8.3 ms a step in the last profile below, are one pass with it "
             "([qkv-split-microbench.txt](qkv-split-microbench.txt)). And `gelu_epilogue` (2026-11-27): the "
             "eighteenth session's profile of 111 lists `triton_poi_fused_add_mul_tanh_0` (Megatron's compiled "
             "bias-GeLU forward) and `_bias_gelu_backward`; the last one below, made with it, has fc1's GEMM with "
             "the GELU_AUX_BIAS epilogue (`..._geluauxbias_...`) and fc2's input-gradient GEMM with DGELU "
             "(`..._aux_bf16_dg`) in their place, and fc1's bias gradient as a bf16 `reduce_kernel` of its own "
             "([gelu-epilogue-microbench.txt](gelu-epilogue-microbench.txt)); summing that gradient in the "
             "weight-gradient GEMM's epilogue costs more than it saves, and cuBLASLt's first algorithm is already its "
             "fastest for both epilogues ([epilogue-algorithms-microbench.txt](epilogue-algorithms-microbench.txt)). "
             "That profile ran while nvmath still logged every GEMM call, which slows the host, not the kernels.")
    if (bench_dir / GRAPH_WAITS).exists():  # a profile here runs without the graph, so its optimizer reads slow
        intro += (f" These profiles run without the CUDA graph and with synchronising timers, so they overstate "
                  f"some kernels (`_adamw_flat`: 23 ms here, 15.8 ms timed inside a plain run) and cannot show where "
                  f"a graphed step waits; [{GRAPH_WAITS}]({GRAPH_WAITS}) does both, for rows 101 and 600, and says where "
                  f"a graphed step of 111 waits.")
    return ["## Where a step goes (profiles)", "", intro, "", *out] if out else []


GRAPH_WAITS = "graph-step-waits.txt"  # a graphed step's GPU idle time and AdamW in a plain run (issue 32)


def _runs_section(cfg: dict, recs: dict, bench_dir: Path) -> list[str]:
    """Every record a section read: the bench's own, and the table rows a pair compares as they are."""
    pair_keys = {r.key() for pairs in (benchruns.parity_runs(cfg), benchruns.expert_runs(cfg)) for _, a, b in pairs
                 for r in (a, b)}
    rows = []
    for k, rec in sorted(recs.items(), key=lambda kv: kv[1].started or ""):
        own = rec.run_dir.parent == bench_dir / "runs"
        if not own and k not in pair_keys:
            continue  # a table row no bench section uses
        link = f"runs/{rec.run_dir.name}" if own else f"../{rec.run_dir.relative_to(bench_dir.parent)}"
        rows.append([f"{k[0]} [{k[1]}; fast={levers.text(k[2])}; cuda_graph={k[3]}; iters={k[4]}{'; ' + k[5] if k[5] else ''}]",
                     f"[{rec.run_dir.name}]({link}/run.json)"])
    return ["## Runs", "", *markdown.table(["run", "record"], rows)]


def write(bench_dir: Path) -> str:
    pageguard.write_page(bench_dir.parent.parent, bench_dir / "README.md", render(bench_dir), "make bench-report")
    return str(bench_dir / "README.md")
