"""`make check`: the papers' and the tutorial's claims, tested against our committed run records.

The claims are data (configs/checks.yaml); this module knows a small fixed set of metric kinds
(KINDS) and expectations, evaluates every claim against the newest usable record per target
(records.load_records) and writes results/checks.md. Each claim ends as

  PASS     the measured value meets the expectation
  FAIL     it does not (or a target it reads ran out of memory): a finding, reported as is
  NOT RUN  a target is not in the catalog yet, has no record, or its record failed, is
           incomplete, or was run with a layout the catalog no longer has (the reason says which)

Public API:
  KINDS                       the metric kinds (claims.py: the claims file, typed)
  load_claims(path)           parse and validate configs/checks.yaml (ChecksError: one line, naming the claim)
  evaluate(claim, records, known)   one Result
  evaluate_all(claims, records, known)
  render(results)             the markdown page
  write_checks(root)          evaluate and write ROOT/results/checks.md; returns the results
  cli(argv)                   `python -m megalab check [--strict]`
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megalab.core.paths import ROOT
from megalab.core import markdown, provenance, variables
from megalab.core.records import USABLE, RunRecord, load_records, read_records, repeats, stamp
from megalab.core import catalog
from megalab.core.catalog import CatalogError
from megalab.results.claims import (  # noqa: F401  (checks.KINDS, checks.load_claims: the claims file's API)
    DEFAULT_FIELD, KINDS, ChecksError, Claim, Operand, Published, is_num, load_claims, unit_bytes)

OUTPUT = Path("results") / "checks.md"

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"

# Fields an out-of-memory run has no valid value for (it never finished a step).
OOM_INVALID = ("step_ms", "tflops", "mfu", "mem_peak", "megatron_mem", "loss")
# A record run with a layout other than the catalog's says nothing about the catalog's target.
LAYOUT_FIELDS = ("model", "gpus", "gbs", "mbs", "tp", "pp", "cp", "ep", "etp", "sp", "zero2", "recompute",
                 "layers_per_virtual_stage", "num_experts", "topk", "cp_comm")


class _NotRun(Exception):
    pass


class _Fail(Exception):
    pass


# --------------------------------------------------------------------------- evaluation

@dataclasses.dataclass
class Result:
    claim: Claim
    status: str
    measured: str  # the measured value(s) as shown, or the reason for NOT RUN
    values: list[Any] = dataclasses.field(default_factory=list)
    why: str = ""  # FAIL / NOT RUN explanation


def _record(target: str, records: Mapping[str, RunRecord], known: Mapping[str, Any]) -> RunRecord:
    """The usable record of a target, or _NotRun(reason, target) saying why there is none."""
    if target not in known:
        raise _NotRun("not in the catalog yet", target)
    rec = records.get(target)
    if rec is None:
        raise _NotRun("no record yet", target)
    if rec.status not in ("ok", "oom"):
        detail = f" ({rec.error.splitlines()[0][:100]})" if rec.error else ""
        raise _NotRun(f"its record is {rec.status}{detail}", target)
    exp = known.get(target)
    if exp is not None:
        cfg = rec.config
        for f in LAYOUT_FIELDS:  # the layout fields the record has (an older one may lack some)
            if f in cfg.model_fields_set and hasattr(exp, f) and getattr(cfg, f) != getattr(exp, f):
                raise _NotRun(f"its record ran {f}={getattr(cfg, f)}, the catalog now says {getattr(exp, f)} "
                              "(re-run it)", target)
    return rec


def _not_run_reason(reads: tuple[str, ...], records, known) -> str:
    """Why a claim cannot be evaluated ('' if every target it reads has a usable record)."""
    by_reason: dict[str, list[str]] = {}
    for t in reads:
        try:
            _record(t, records, known)
        except _NotRun as e:
            reason, target = e.args
            by_reason.setdefault(reason, []).append(target)
    return "; ".join(f"{', '.join(_short(t) for t in ts)}: {reason}" for reason, ts in by_reason.items())


def _short(target: str) -> str:
    """'101-gpt2xl-dp1-gbs1-bf16' -> '101' (what `make 101` accepts as well)."""
    return target.split("-", 1)[0]


def _field(rec: RunRecord, target: str, field: str, gpu: str | int) -> float:
    if rec.status == "oom" and field.startswith(OOM_INVALID):
        raise _Fail(f"{target} ran out of memory (no {field})")
    if field == DEFAULT_FIELD and rec.runs:
        return float(rec.runs.median_ms)  # repeated runs: the median of their medians, as the pages show
    v = rec.value(field)
    if isinstance(v, (list, tuple)):
        nums = [float(x) for x in v if is_num(x)]
        if not nums or len(nums) != len(v):
            raise _NotRun(f"its record has no usable {field}", target)
        if isinstance(gpu, int):
            if gpu >= len(nums):
                raise _NotRun(f"its record has no GPU {gpu} in {field}", target)
            return nums[gpu]
        v = _reduce(nums, gpu)
    if not is_num(v):
        raise _NotRun(f"its record has no {field}", target)
    return float(v)


def _reduce(vals: list[float], how: str) -> float:
    return {"max": max, "min": min, "sum": sum, "mean": lambda x: sum(x) / len(x)}[how](vals)


def _resolve(op: Operand, records, known) -> list[float]:
    """The operand's value(s): one per target for a vector operand, else one."""
    vals = [_field(_record(t, records, known), t, op.field, op.gpu) for t in op.targets]
    if not op.vector:
        vals = [_reduce(vals, op.across or "max")] if len(vals) > 1 else vals
    if op.minus is not None:
        m = _resolve(op.minus, records, known)[0]
        vals = [v - m for v in vals]
    return vals


def _pairs(a: list[float], b: list[float]) -> list[tuple[float, float]]:
    if len(a) == len(b):
        return list(zip(a, b))
    if len(b) == 1:
        return [(x, b[0]) for x in a]
    return [(a[0], y) for y in b]


def _compute(c: Claim, records, known) -> tuple[list[Any], str]:
    """(values, measured text). Raises _NotRun / _Fail."""
    if c.kind == "status":
        out = []
        for t in c.operands["targets"].targets:
            out.append(_record(t, records, known).status)
        return out, ", ".join(f"{_short(t)} {st}" for t, st in zip(c.operands["targets"].targets, out))
    if c.kind == "monotonic":
        op = c.operands["targets"]
        vals = [_field(_record(t, records, known), t, op.field, op.gpu) for t in op.targets]
        signs = ["<" if y > x else (">" if y < x else "=") for x, y in zip(vals, vals[1:])]
        text = _fmt(vals[0]) + "".join(f" {s} {_fmt(v)}" for s, v in zip(signs, vals[1:]))
        return vals, text
    a = _resolve(c.operands["a"], records, known)
    if c.kind == "value":
        return a, ", ".join(_fmt(x) for x in a)
    if c.kind == "bytes_per_param":
        t = c.operands["a"].targets[0]
        params = _field(_record(t, records, known), t, c.params_field, "max")
        if params <= 0:
            raise _NotRun(f"{c.params_field} is {params}", t)
        v = a[0] * unit_bytes(c.operands["a"].field) / params
        what = _fmt(a[0]) if c.operands["a"].minus is None else f"a difference of {_fmt(a[0])}"
        return [v], f"{_fmt(v)} B/param ({what} {_unit_name(c.operands['a'].field)} / {params / 1e9:.4g}e9 params)"
    b = _resolve(c.operands["b"], records, known)
    out, parts = [], []
    for x, y in _pairs(a, b):
        if c.kind == "difference":
            v, how = x - y, f"{_fmt(x)} − {_fmt(y)}"
        else:
            if y == 0:
                raise _NotRun(f"the denominator of {c.kind} is 0")
            v = x / y if c.kind == "ratio" else (x - y) / y
            how = f"{_fmt(x)} / {_fmt(y)}" if c.kind == "ratio" else f"{_fmt(x)} vs {_fmt(y)}"
        out.append(v)
        parts.append(f"{_fmt(v, signed=c.kind == 'relative_change')} ({how})")
    return out, "; ".join(parts)


def _unit_name(field: str) -> str:
    return "MiB" if unit_bytes(field) == 2 ** 20 else "GiB"


def _meets(c: Claim, values: list[Any]) -> bool:
    e = c.expect
    if c.kind == "status":
        return list(values) == list(e.args)
    if c.kind == "monotonic":
        slack = c.tolerance
        if e.op == "decreasing":
            return all(y < x * (1 + slack) if slack else y < x for x, y in zip(values, values[1:]))
        return all(y > x * (1 - slack) if slack else y > x for x, y in zip(values, values[1:]))
    return all(e.holds(v) for v in values)


def other_hosts(c: Claim, records: Mapping[str, RunRecord]) -> str:
    """'' when every record a comparing claim reads ran on one host (or says none), else the reason:
    a ratio of two hosts' runs mixes the hosts' difference (5-23% on identical commands) into it."""
    if c.kind == "status":
        return ""
    hosts = {t: h for t in c.reads if (h := provenance.comparable_key(records[t])) is not None}
    if len(set(hosts.values())) <= 1:
        return ""
    return "runs on different hosts or code (" + ", ".join(f"{_short(t)}: {h}" for t, h in hosts.items()) + \
        "); re-run them on one host with today's code"


def machine_groups(root: Path, setup) -> dict[str, dict[str, RunRecord]]:
    """provenance.comparable_key (one machine, one code) -> the newest usable record per target among
    that key's runs in ROOT/results/runs, with its repeats (`runs`), as load_records gives the newest
    overall."""
    groups: dict[str, list[RunRecord]] = {}
    for r in read_records(root / "results" / "runs", "megalab check"):
        if r.status in USABLE and (key := provenance.comparable_key(r, root)) is not None:
            groups.setdefault(key, []).append(r)
    out: dict[str, dict[str, RunRecord]] = {}
    for key, recs in groups.items():
        newest: dict[str, RunRecord] = {}
        for r in sorted(recs, key=lambda r: (stamp(r.started), r.run_dir.name if r.run_dir else "")):
            newest[r.target] = r
        out[key] = {t: r.grouped(repeats(r, recs, setup)) for t, r in newest.items()}
    return out


def one_machine(c: Claim, groups: Mapping[str, Mapping[str, RunRecord]], known
                ) -> tuple[str, Mapping[str, RunRecord]] | None:
    """Where the newest records of a comparing claim ran on different machines or code: the group of runs
    on one machine with one code that has a usable record of every target it reads; of several, today's
    code first, then the group whose runs are newest. None if no machine has them all."""
    fits = [(key, recs) for key, recs in groups.items() if not _not_run_reason(c.reads, recs, known)]
    if not fits:
        return None
    return max(fits, key=lambda kr: (kr[0].endswith("@ today"), max(stamp(kr[1][t].started) for t in c.reads)))


def evaluate(c: Claim, records: Mapping[str, RunRecord], known: Mapping[str, Any],
             groups: Mapping[str, Mapping[str, RunRecord]] | None = None) -> Result:
    """One claim against the records. `known`: target id -> catalog Experiment (or None). `groups`
    (machine_groups): where the newest records compare runs of two machines, the claim reads the runs
    of one machine that has them all instead, and says which."""
    why = _not_run_reason(c.reads, records, known)
    where = ""
    if not why and (why := other_hosts(c, records)) and groups and (found := one_machine(c, groups, known)):
        where, records, why = found[0], {**records, **found[1]}, ""
    if why:
        return Result(c, NOT_RUN, "", why=why)
    result = _evaluate(c, records, known)
    if where and result.status != NOT_RUN:
        result = dataclasses.replace(result, measured=f"{result.measured} (runs on {where})")
    return result


def _evaluate(c: Claim, records: Mapping[str, RunRecord], known: Mapping[str, Any]) -> Result:
    try:
        values, text = _compute(c, records, known)
    except _NotRun as e:
        why = f"{_short(e.args[1])}: {e.args[0]}" if len(e.args) == 2 else str(e.args[0])
        return Result(c, NOT_RUN, "", why=why)
    except _Fail as e:
        return Result(c, FAIL, str(e), why=str(e))
    if _meets(c, values):
        return Result(c, PASS, text, values)
    return Result(c, FAIL, text, values, why=f"measured {text}; expected {c.expect.text()}")


def evaluate_all(claims: list[Claim], records: Mapping[str, RunRecord], known: Mapping[str, Any],
                 groups: Mapping[str, Mapping[str, RunRecord]] | None = None) -> list[Result]:
    return [evaluate(c, records, known, groups) for c in claims]


# --------------------------------------------------------------------------- the page

def _fmt(x: Any, signed: bool = False) -> str:
    if isinstance(x, str):
        return x
    x = float(x)
    if abs(x) >= 1000:
        s = f"{x:.0f}"
    else:
        s = f"{x:#.4g}"
        if "e" in s:
            s = f"{x:.2e}"
    if signed and x >= 0:
        s = "+" + s
    return s


def _published_text(p: Published) -> str:
    v = p.value
    if isinstance(v, list):
        v = ", ".join(str(x) for x in v)
    parts = [str(v)] if v is not None else []
    parts.append(p.source)
    text = " — ".join(x for x in parts if x)
    if p.note:
        text += f"; {p.note}"
    return text


def _cell(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def fails_if(c: Claim) -> str:
    """The claim's failing results in words, generated from its `expect` (and, for numeric fields an
    out-of-memory run lacks, that case too)."""
    vector = any(op.vector for k, op in c.operands.items() if k in ("a", "b"))
    text = c.expect.fails_text(c.kind, c.tolerance, vector)
    fields = {op.field for op in c.operands.values()}
    if c.kind != "status" and any(f.startswith(OOM_INVALID) for f in fields):
        text += ", or if a target it reads ran out of memory"
    return text


def summary(results: list[Result]) -> dict[str, int]:
    return {s: sum(r.status == s for r in results) for s in (PASS, FAIL, NOT_RUN)}


def render(results: list[Result]) -> str:
    """results/checks.md: counts, the table, one footnote per FAIL."""
    counts = summary(results)
    rows, notes = [], []
    for r in results:
        status = r.status
        if r.status == FAIL:
            notes.append(f"[{len(notes) + 1}] `{r.claim.id}`: {r.why}. A finding, reported as is: "
                         "the expectation is not loosened to make it pass.")
            status = f"FAIL [{len(notes)}]"
        elif r.status == NOT_RUN:
            status = f"NOT RUN: {r.why}"
        rows.append({"claim": f"`{r.claim.id}`: {r.claim.claim}", "source": r.claim.source,
                     "expected": r.claim.expect.text(), "fails if": fails_if(r.claim),
                     "published": _published_text(r.claim.published),
                     "measured": r.measured, "status": status})
    header = ["claim", "source", "expected", "fails if", "published", "measured", "status"]
    table = "\n".join(markdown.table(header, ([_cell(r[h]) for h in header] for r in rows), padded=True)) \
        if rows else "(no claims)"
    lines = [
        "# Checks: published claims against our runs",
        "",
        "<!-- generated by `make check` from configs/checks.yaml and results/runs/*/run.json; "
        "do not edit by hand -->",
        "",
        f"{len(results)} claims: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN.",
        "",
        "Each claim is computed from the newest ok/oom record per target (memory: NVML peak per GPU, "
        "the largest over the run's GPUs unless stated; time: median step, or the median of the runs' "
        "medians where the target was repeated on one machine with the same code and settings). `published` is the same "
        "metric on the published rows where it names the tutorial or the two-GPU notes. NOT RUN: a "
        "target it reads is not in the catalog yet, has no record, or its record failed, or the records it "
        "compares ran on different machines or code and no one machine with one code has them all. Where the "
        "newest records differ in machine but one machine has every target's run, the claim reads that "
        "machine's runs (today's code first, then the newest) and `measured` names it. `fails if` is generated from the expectation: every claim can "
        "fail (tests/test_checks.py builds, for each, a record set that makes it FAIL). "
        "The claims are data: configs/checks.yaml.",
        "",
        table,
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def evaluate_root(root: Path = ROOT, claims_path: Path | None = None) -> list[Result]:
    """Every claim against ROOT's committed records: the newest per target, or one machine's runs."""
    setup = lambda r: provenance.setup_key(r, root)  # noqa: E731
    records = load_records(root / "results" / "runs", setup, "megalab check")
    return evaluate_all(load_claims(claims_path), records, catalog.catalog(), machine_groups(root, setup))


def write_checks(root: Path | None = None, claims_path: Path | None = None) -> tuple[list[Result], bool]:
    """Evaluate every claim on ROOT's records and write ROOT/results/checks.md.

    Returns (results, changed). The page is only rewritten when its content changes.
    """
    root = Path(root) if root is not None else ROOT
    results = evaluate_root(root, claims_path)
    return results, markdown.write_if_changed(root / OUTPUT, render(results))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--strict", action="store_true", help="exit 1 if any claim FAILs (make check STRICT=1)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--claims", type=Path, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Test the published claims (configs/checks.yaml) against the committed run records; write results/checks.md."""
    strict = args.strict or variables.value("STRICT")  # make passes --strict for STRICT=1: other words, here
    try:
        results, _ = write_checks(args.root, args.claims)
    except (ChecksError, CatalogError) as e:
        print(f"megalab check: {e}", file=sys.stderr)
        return 2
    counts = summary(results)
    for r in results:
        if r.status == FAIL:
            print(f"FAIL {r.claim.id}: {r.why}")
    print(f"checks: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN "
          f"({len(results)} claims) -> {OUTPUT}")
    return 1 if (strict and counts[FAIL]) else 0

