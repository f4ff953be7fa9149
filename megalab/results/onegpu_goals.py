"""One GPU, past the reference (issue 32): what plain `make <target>` gives on one GPU against the goals,
the Transformer Engine reference and the best public implementation, and what each lever added.

Read from configs/bench.yaml's `past_reference` block and the records: a target's row is today's default
(provenance `today`) as the median of its launches on one machine and code, with the launch count, one row
per machine that has enough of them (the machine named); a goal needs `min_runs` launches or more before it
is called met or missed. The lever steps below it are the
same target's runs with the fast paths the trials compared (one machine and code), so each lever's gain
sits beside tokens/s/GPU and MFU. Nothing here is typed by hand: every figure is a record's, except the
published bars (the TE reference's rows and `bars`, each with its source).
"""
from __future__ import annotations

import math
import statistics

from megalab.core import benchruns, catalog, clocks, markdown, provenance
from megalab.core.paths import ROOT
from megalab.core.records import RunRecord, read_records
from megalab.results import chapter, fast_by_default
from megalab.runtime import levers


def _tokens(exp) -> int:
    return exp.gbs * int(exp.model_cfg["seq_length"])


def _tok_s(exp, ms: float) -> float:
    return _tokens(exp) / (ms / 1000) / exp.gpus


def _today(exp, recs: dict[str, list], root, min_runs: int = 1) -> list[list[RunRecord]]:
    """Today's default runs of a target, one list per machine and code: every machine with min_runs launches or
    more (a goal counts several; machines of one kind differ by a few percent, so each is judged on its own),
    oldest first; where none has that many, the one with the most, the newest on a tie. Where no run has today's
    code: the runs with today's defaults whose run code alone has changed since, at the newest such code (a
    refactor after the measurements leaves them readable, marked older)."""
    mine = [(r, provenance.of(r, root)) for r in recs.get(exp.id, [])
            if fast_by_default.like_reference(r, exp) and r.gpu_name]
    now = [r for r, p in mine if p.state == provenance.CURRENT]
    if not now:
        older = [r for r, p in mine if p.why.startswith(provenance.CODE_CHANGED)]
        code = provenance.code_key(max(older, key=lambda r: r.started or ""), root) if older else None
        now = [r for r in older if provenance.code_key(r, root) == code]
    groups: dict = {}
    for r in now:
        groups.setdefault(provenance.setup_key(r, root), []).append(r)
    if not groups:
        return []
    enough = sorted((rs for rs in groups.values() if len(rs) >= min_runs), key=lambda rs: min(r.started or "" for r in rs))
    return enough or [max(groups.values(), key=lambda rs: (len(rs), max(r.started or "" for r in rs)))]


def goal_runs(block: dict, root) -> dict[str, list[list[RunRecord]]]:
    """_today of every goal's target, from one read of the records."""
    recs = fast_by_default.ok_records(root)
    return {g["target"]: _today(catalog.get(g["target"]), recs, root, block["min_runs"]) for g in block["goals"]}


def _ms(runs: list[RunRecord]) -> float:
    return statistics.median(r.step_ms_median for r in runs)


def spread(runs: list[RunRecord]) -> str:
    """'median (n runs, lowest–highest)' of the runs' median steps, the bench page's one way to write it."""
    ms = sorted(r.step_ms_median for r in runs)
    return f"{_ms(runs):.0f} ({len(ms)} run{'s' if len(ms) > 1 else ''}" + (
        f", {ms[0]:.0f}–{ms[-1]:.0f})" if len(ms) > 1 else ")")


def _mfu(runs: list[RunRecord]) -> float | None:
    vals = [r.mfu for r in runs if r.mfu is not None]
    return statistics.median(vals) if vals else None


def goal_rows(cfg: dict, root=ROOT, todays: dict | None = None) -> list[list[str]]:
    block = cfg["past_reference"]
    anchor, twogpu = chapter.load_reference(), chapter.load_twogpu_reference()
    todays = goal_runs(block, root) if todays is None else todays
    bars = block.get("bars", {})
    rows = []
    for goal in block["goals"]:
        exp = catalog.get(goal["target"])
        limit = []
        if goal.get("ms_max"):
            limit.append(f"<= {goal['ms_max']:g} ms")
        if goal.get("gib_max"):
            limit.append(f"<= {goal['gib_max']:g} GiB")
        if goal.get("mfu_min"):
            limit.append(f"MFU >= {goal['mfu_min']:.0%}")
        ref = fast_by_default._reference(exp, anchor, twogpu)
        te = f"{ref[0]:.0f} ms, {_tok_s(exp, ref[0]) / 1000:.1f}K tok/s" if ref and not math.isnan(ref[0]) else "-"
        bar = bars.get(goal.get("bar", ""), None)
        best = f"{bar['tokens_per_s'] / 1000:.1f}K tok/s ({_tokens(exp) / bar['tokens_per_s'] * 1000:.0f} ms)" if bar else "-"
        if not todays[goal["target"]]:
            rows.append([exp.id, ", ".join(limit), "not run with today's defaults", "", "", "", te, best, "not run"])
            continue
        for runs in todays[goal["target"]]:
            ms, mfu = _ms(runs), _mfu(runs)
            gib = max(max(r.mem_peak_gib or [math.nan]) for r in runs)
            met = ((not goal.get("ms_max") or ms <= goal["ms_max"]) and (not goal.get("gib_max") or gib <= goal["gib_max"])
                   and (not goal.get("mfu_min") or (mfu is not None and mfu >= goal["mfu_min"])))
            verdict = ("met" if met else "missed") if len(runs) >= block["min_runs"] else \
                f"no verdict: {len(runs)} launch{'es' if len(runs) > 1 else ''}, the goal counts {block['min_runs']} or more"
            state = provenance.of(runs[0], root)
            older = "" if state.state == provenance.CURRENT else f"; {state.cell}"
            rows.append([exp.id, ", ".join(limit), spread(runs), f"{gib:.1f}", f"{_tok_s(exp, ms) / 1000:.1f}K",
                         f"{mfu:.1%}" if mfu is not None else "-", te, best,
                         f"{verdict} ({fast_by_default.hardware(runs[0])}{older})"])
    return rows


def base_fast(block: dict, exp) -> set[str]:
    """A target's fast path before the round: its launcher default without the round's levers."""
    return set(levers.default(exp.num_experts, exp.model_cfg)) - set(block["round"])


def _added(r, base: set[str], graph: list[str]) -> str | None:
    """The round's levers a run has over the base ('' for the base itself), or None where it is neither: its fast
    path beyond the base, and `graph` (the round's CUDA-graph lever, where it tried one: the base then runs
    without the graph) where the run had the graph."""
    fast = set(r.config.fastpath or ())
    if not base <= fast:
        return None
    return ",".join(sorted(fast - base) + (graph if r.config.cuda_graph else []))


def code_label(key: str, r: RunRecord) -> str:
    """A code key (provenance.code_key) as the bench page names it: today's code, or the commit of a run `r` with it."""
    return "today's code" if key == provenance.CURRENT else f"code at {str(r.versions.megalab_commit)[:7]}"


def _step_row(exp, today: list[RunRecord], label: str, runs: list[RunRecord], ratio: str) -> list[str]:
    """A row of the lever and code tables: target, machine (today's runs'), what ran, its steps, the ratio given,
    tokens/s/GPU and MFU."""
    mfu = _mfu(runs)
    return [exp.id, fast_by_default.hardware(today[0]), label, spread(runs), ratio,
            f"{_tok_s(exp, _ms(runs)) / 1000:.1f}K", f"{mfu:.1%}" if mfu is not None else "-"]


def lever_rows(cfg: dict, root=ROOT, todays: dict | None = None) -> list[list[str]]:
    """Per goal target, the fast paths its trial runs used on one machine and code (that of today's
    default runs), from the round's base upwards: ms, tokens/s/GPU, MFU and the step against the base."""
    block = cfg["past_reference"]
    runs = [r for d in (root / "results" / "runs", root / "results" / "bench" / "runs")
            for r in read_records(d, "megalab bench-report")]
    # the round's CUDA-graph lever, known as the trials know it (a lever with `cuda_graph: true`)
    graph = [n for n in block["round"] if n in benchruns.graph_levers(cfg)]
    out = []
    todays = goal_runs(block, root) if todays is None else todays
    for goal, today in ((g, rs) for g in block["goals"] for rs in todays[g["target"]]):
        exp = catalog.get(goal["target"])
        base = base_fast(block, exp)
        # one code for the round's runs with and without its levers (a lever's own file counts for the base too)
        fast = levers.default(exp.num_experts, exp.model_cfg)
        host, code = provenance.host_key(today[0]), provenance.shared_code_key(today[0], fast, root)
        groups: dict[str, list] = {}
        for r in runs:
            if (r.target != exp.id or r.status != "ok" or not r.step_ms_median or r.config.extra_args
                    or r.config.spec != "megalab" or provenance.host_key(r) != host
                    or provenance.shared_code_key(r, fast, root) != code):
                continue
            if (added := _added(r, base, graph)) is not None:
                groups.setdefault(added, []).append(r)
        if "" not in groups:
            continue
        base_ms = _ms(groups[""])
        for added, rs in sorted(groups.items(), key=lambda kv: (kv[0] != "", -_ms(kv[1]))):
            out.append(_step_row(exp, today, " + ".join(f"`{n}`" for n in added.split(",")) if added else "base", rs,
                                 f"{base_ms / _ms(rs):.3f}x" if added else ""))
    return out


def code_rows(todays: dict, root=ROOT) -> list[list[str]]:
    """Per goal row of today's code (`todays`: goal_runs), the same target's runs on its machine with today's settings
    at an earlier commit (a code change measured before and after, run against run): one row per earlier code, then
    today's."""
    recs = fast_by_default.ok_records(root)
    out = []
    for target, groups in todays.items():
        exp = catalog.get(target)
        for today in groups:
            if provenance.of(today[0], root).state != provenance.CURRENT:
                continue
            host, then = provenance.host_key(today[0]), {}
            for r in recs.get(target, []) if host else ():  # a machine without a name matches none
                why = provenance.of(r, root).why
                if provenance.host_key(r) == host and why.startswith(provenance.CODE_CHANGED):
                    then.setdefault(provenance.code_key(r, root), []).append(r)
            for key, rs in sorted(then.items(), key=lambda kr: min(r.started or "" for r in kr[1])):
                out.append(_step_row(exp, today, code_label(key, rs[0]), rs, f"{_ms(rs) / _ms(today):.3f}x"))
            if then:
                out.append(_step_row(exp, today, code_label(provenance.CURRENT, today[0]), today, ""))
    return out


NOT_SAMPLED = "not sampled (monitor before clocks)"
CLOCK_HEADER = ["target", "machine", "runs sampled", "SM MHz, median (range), all GPUs pooled", "power W, median",
                "clock held down by (share of busy samples)"]


def clock_rows(todays: dict) -> list[list[str]]:
    """Per goal row (`todays`: goal_runs), what its runs' cards ran at while busy (core.clocks): the busy samples of
    every sampled run and GPU pooled, their SM clock's median and range, the power's median and the share of them
    each reason held the clock down in. Runs without clock samples are left out, counted in "runs sampled"."""
    out = []
    for target, groups in todays.items():
        for runs in groups:
            sampled = [b for b in (clocks.pooled(r.run_dir) for r in runs) if b is not None]
            row = [target, fast_by_default.hardware(runs[0]), f"{len(sampled)} of {len(runs)}"]
            if not sampled:
                out.append([*row, NOT_SAMPLED, "-", "-"])
                continue
            fig = sum(sampled, clocks.Busy()).figures()
            if not fig["busy"]:
                out.append([*row, "no busy sample", "-", "-"])
                continue
            out.append([*row, clocks.mhz_cell(fig), clocks.power_cell(fig), clocks.held_cell(fig)])
    return out


def section(cfg: dict, root=ROOT, todays: dict | None = None) -> list[str]:
    if "past_reference" not in cfg:
        return []
    block = cfg["past_reference"]
    bars = "; ".join(f"{b['what']}: {b['tokens_per_s'] / 1000:.1f}K tokens/s/GPU ({b['source']})"
                     for b in block.get("bars", {}).values())
    todays = goal_runs(block, root) if todays is None else todays  # every table judges the same runs
    return ["## One GPU, past the reference", "",
            "Issue 32's goals for plain `make <target>` on one GPU with today's defaults: the median of the "
            f"launches on one machine and code (a goal counts {block['min_runs']} launches or more), one row for "
            "each machine with that many (two cards of one kind differ by a few percent, so each is judged on its "
            "own and the machine is named: GPU count, model and first GPU's UUID), tokens/s/GPU "
            "(GBS x sequence / step) and MFU (Megatron's FLOPs over the datasheet peak) beside the Transformer "
            f"Engine reference's row and the best public implementation. {bars}. Comparable only where the "
            "hardware matches: the reference rows and the bar were measured on H100s. Where no launch has today's "
            "run code, a row is the newest code's launches with today's settings, its verdict marked older with why.",
            "",
            *markdown.table(["target", "goal", "default ms", "GiB", "tok/s/GPU", "MFU", "TE reference",
                             "best public (llm.c)", "verdict (hardware)"], goal_rows(cfg, root, todays)), "",
            "What each lever of the last round measured beside the goals added "
            f"({', '.join(f'`{n}`' for n in block['round'])}, {block['round_when']}), run against run "
            "on the machine and code of the rows above (base: each target's default, less those levers where they "
            "joined it; the verdicts "
            "by the two-a-side rule are in \"Levers tried against the default\"; a goal whose machine and code has no base run "
            "has no row):", "",
            *(markdown.table(["target", "machine", "levers over the base", "ms", "base / with", "tok/s/GPU", "MFU"], rows)
              if (rows := lever_rows(cfg, root, todays)) else ["No base run on the machine and code of any row above."]), "",
            "What a change of the run code bought, where a goal's machine also ran an earlier commit with today's "
            "settings (run against run, so the change is the only difference; then / now is the earlier code's "
            "step over today's):", "",
            *(markdown.table(["target", "machine", "code", "ms", "then / now", "tok/s/GPU", "MFU"], rows)
              if (rows := code_rows(todays, root)) else ["No goal's machine ran an earlier commit."]), "",
            f"What the card ran at while busy (the monitor's samples with utilisation >= {clocks.BUSY_UTIL_PCT}%: SM "
            "clock, board power, and what NVML says held the clock down; `python -m megalab bench clocks <run>` for "
            "one run). A card at its power cap clocks down to stay under it, so a kernel made faster in a "
            "microbenchmark gains less inside a full step:", "",
            *(markdown.table(CLOCK_HEADER, rows) if (rows := clock_rows(todays))
              else ["No goal run was sampled for clocks."]), ""]
