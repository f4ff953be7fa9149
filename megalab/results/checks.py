"""`make check`: the papers' and the tutorial's claims, tested against our committed run records.

The claims are data (configs/checks.yaml); this module knows a small fixed set of metric kinds
(KINDS) and expectations, evaluates every claim against the newest usable record per target
(records.load_records) and writes results/checks.md. Each claim ends as

  PASS     the measured value meets the expectation
  FAIL     it does not (or a target it reads ran out of memory): a finding, reported as is
  NOT RUN  a target is not in the catalog yet, has no record, or its record failed, is
           incomplete, or was run with a layout the catalog no longer has (the reason says which)

Public API:
  KINDS                       the metric kinds
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
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from megalab.core.paths import ROOT
from megalab.core import markdown, provenance
from megalab.core.records import USABLE, RunRecord, load_records, read_records, repeats, stamp
from megalab.core import catalog
from megalab.core.catalog import CatalogError

CLAIMS_PATH = ROOT / "configs" / "checks.yaml"
OUTPUT = Path("results") / "checks.md"

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"

# kind -> (required keys, optional keys) of its `metric` mapping (besides `kind`, `field`, `gpu`)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "value": (("a",), ()),
    "ratio": (("a", "b"), ()),
    "difference": (("a", "b"), ()),
    "relative_change": (("a", "b"), ()),
    "bytes_per_param": (("a",), ("params",)),
    "monotonic": (("targets",), ("tolerance",)),
    "status": (("targets",), ()),
}
NUMERIC_KINDS = ("value", "ratio", "difference", "relative_change", "bytes_per_param")
CLAIM_KEYS = ("id", "claim", "source", "reads", "metric", "expect", "published")
REDUCE = ("max", "min", "sum", "mean")
STATUSES = ("ok", "oom", "failed", "incomplete")
DEFAULT_FIELD = "step_ms_median"
# Fields an out-of-memory run has no valid value for (it never finished a step).
OOM_INVALID = ("step_ms", "tflops", "mfu", "mem_peak", "megatron_mem", "loss")
# A record run with a layout other than the catalog's says nothing about the catalog's target.
LAYOUT_FIELDS = ("model", "gpus", "gbs", "mbs", "tp", "pp", "cp", "ep", "etp", "sp", "zero2", "recompute",
                 "layers_per_virtual_stage", "num_experts", "topk", "cp_comm")
_CMP = re.compile(r"^\s*(<=|>=|<|>|==)\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$")


class ChecksError(ValueError):
    """A malformed claims file: one line naming the claim and the fix."""


class _NotRun(Exception):
    pass


class _Fail(Exception):
    pass


# --------------------------------------------------------------------------- the claims file

@dataclasses.dataclass(frozen=True)
class Operand:
    targets: tuple[str, ...]
    field: str
    gpu: str | int = "max"
    across: str | None = None  # reduce over targets; None: one value per target
    minus: Operand | None = None

    @property
    def vector(self) -> bool:
        return len(self.targets) > 1 and self.across is None

    def all_targets(self) -> list[str]:
        return list(self.targets) + (self.minus.all_targets() if self.minus else [])


@dataclasses.dataclass(frozen=True)
class Expect:
    op: str  # < <= > >= == between approx increasing decreasing equals
    args: tuple = ()

    def text(self) -> str:
        g = "{:g}".format  # thresholds as written: 1, 0.85, 0.4167
        if self.op == "between":
            return f"between {g(self.args[0])} and {g(self.args[1])}"
        if self.op == "approx":
            return f"{g(self.args[0])} ± {g(self.args[1] * 100)}%"
        if self.op == "equals":
            return ", ".join(self.args)
        if self.op in ("increasing", "decreasing"):
            return self.op
        return f"{self.op} {g(self.args[0])}"

    def fails_text(self, kind: str, tolerance: float = 0.0, vector: bool = False) -> str:
        """What result makes the claim FAIL, from the expectation: 'FAIL if the ratio is outside 0.9–1.1'."""
        g = "{:g}".format
        what = {"ratio": "the ratio", "difference": "the difference", "relative_change": "the relative change",
                "bytes_per_param": "the bytes per parameter", "value": "the value"}.get(kind, "the value")
        if vector:
            what = "any " + what.replace("the ", "", 1)
        op, a = self.op, self.args
        if op == "between":
            return f"FAIL if {what} is outside {g(a[0])}–{g(a[1])}"
        if op == "approx":
            lo, hi = a[0] - abs(a[0]) * a[1], a[0] + abs(a[0]) * a[1]
            return f"FAIL if {what} is outside {g(a[0])} ± {g(a[1] * 100)}% ({g(round(lo, 6))}–{g(round(hi, 6))})"
        if op in ("increasing", "decreasing"):
            step = "rise" if op == "increasing" else "fall"
            slack = f" (a {'fall' if op == 'increasing' else 'rise'} within {g(tolerance * 100)}% is allowed)" \
                if tolerance else ""
            return f"FAIL if any next target does not {step}{slack}"
        if op == "equals":
            return "FAIL if the statuses are not " + ", ".join(a) + " in this order"
        negated = {"<": "≥", "<=": ">", ">": "≤", ">=": "<", "==": "≠"}[op]
        return f"FAIL if {what} is {negated} {g(a[0])}"

    def holds(self, x: float) -> bool:
        op, a = self.op, self.args
        if op == "between":
            return a[0] <= x <= a[1]
        if op == "approx":
            return abs(x - a[0]) <= abs(a[0]) * a[1] + 1e-12
        return {"<": x < a[0], "<=": x <= a[0], ">": x > a[0], ">=": x >= a[0],
                "==": math.isclose(x, a[0], rel_tol=1e-9, abs_tol=1e-12)}[op]


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    source: str
    reads: tuple[str, ...]
    kind: str
    operands: dict[str, Operand]  # a, b (numeric kinds) or targets (monotonic, status)
    expect: Expect
    published: dict[str, Any]
    tolerance: float = 0.0  # monotonic only
    params_field: str = "params_total"  # bytes_per_param only


def _err(cid: str, msg: str) -> ChecksError:
    return ChecksError(f"configs/checks.yaml: claim {cid}: {msg}")


def _operand(cid: str, spec: Any, field: str, gpu: str | int, where: str) -> Operand:
    if isinstance(spec, str):
        return Operand((spec,), field, gpu)
    if isinstance(spec, list) and spec and all(isinstance(t, str) for t in spec):
        return Operand(tuple(spec), field, gpu)
    if not isinstance(spec, dict):
        raise _err(cid, f"{where} must be a target id, a list of target ids or a mapping; got {spec!r}")
    unknown = set(spec) - {"target", "targets", "field", "gpu", "across", "minus"}
    if unknown:
        raise _err(cid, f"{where} has unknown keys {sorted(unknown)}; fix: use target/targets, field, gpu, "
                        "across, minus")
    if ("target" in spec) == ("targets" in spec):
        raise _err(cid, f"{where} needs exactly one of `target` and `targets`")
    targets = (spec["target"],) if "target" in spec else spec["targets"]
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) for t in targets):
        raise _err(cid, f"{where}: targets must be target ids")
    across = spec.get("across")
    if across is not None and across not in REDUCE:
        raise _err(cid, f"{where}: across '{across}' is not one of {', '.join(REDUCE)}")
    field_ = spec.get("field", field)
    gpu_ = spec.get("gpu", gpu)
    _check_gpu(cid, gpu_, where)
    minus = None
    if "minus" in spec:
        minus = _operand(cid, spec["minus"], field_, gpu_, f"{where}.minus")
        if minus.vector:
            raise _err(cid, f"{where}.minus must be one value (one target, or targets with `across`)")
    return Operand(tuple(targets), str(field_), gpu_, across, minus)


def _check_gpu(cid: str, gpu: Any, where: str) -> None:
    if not (gpu in REDUCE or (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0)):
        raise _err(cid, f"{where}: gpu '{gpu}' is not one of {', '.join(REDUCE)} or a GPU index")


def _expect(cid: str, kind: str, spec: Any) -> Expect:
    if isinstance(spec, str):
        s = spec.strip()
        if s in ("increasing", "decreasing"):
            if kind != "monotonic":
                raise _err(cid, f"expect '{s}' is for kind monotonic, not {kind}")
            return Expect(s)
        m = _CMP.match(s)
        if m and kind in NUMERIC_KINDS:
            return Expect(m.group(1), (float(m.group(2)),))
    elif isinstance(spec, dict) and len(spec) in (1, 2):
        if set(spec) == {"between"} and kind in NUMERIC_KINDS:
            lo_hi = spec["between"]
            if (isinstance(lo_hi, list) and len(lo_hi) == 2 and all(_is_num(v) for v in lo_hi)
                    and lo_hi[0] <= lo_hi[1]):
                return Expect("between", (float(lo_hi[0]), float(lo_hi[1])))
        if set(spec) == {"approx", "rel"} and kind in NUMERIC_KINDS:
            if _is_num(spec["approx"]) and _is_num(spec["rel"]) and spec["rel"] >= 0:
                return Expect("approx", (float(spec["approx"]), float(spec["rel"])))
        if set(spec) == {"equals"} and kind == "status":
            vals = spec["equals"]
            if isinstance(vals, list) and vals and all(v in STATUSES for v in vals):
                return Expect("equals", tuple(vals))
    allowed = {"monotonic": "increasing | decreasing", "status": "{equals: [ok|oom|failed|incomplete, ...]}"}
    raise _err(cid, f"expect {spec!r} is not valid for kind {kind}; fix: use "
                    + allowed.get(kind, '"< x", "<= x", "> x", ">= x", "== x", {between: [lo, hi]} '
                                        "or {approx: x, rel: r}"))


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _operands(cid: str, kind: str, metric: dict, required: tuple, field: str, gpu: Any) -> dict[str, Operand]:
    """The targets a claim's metric reads (a list for monotonic/status, else metric.a and metric.b)."""
    operands: dict[str, Operand] = {}
    if kind in ("monotonic", "status"):
        t = metric["targets"]
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            raise _err(cid, "metric.targets must be a list of target ids")
        if kind == "monotonic" and len(t) < 2:
            raise _err(cid, "monotonic needs at least two targets")
        operands["targets"] = Operand(tuple(t), field, gpu)
    else:
        for key in required:
            operands[key] = _operand(cid, metric[key], field, gpu, f"metric.{key}")
        a, b = operands["a"], operands.get("b")
        if b is not None and a.vector and b.vector and len(a.targets) != len(b.targets):
            raise _err(cid, "metric.a and metric.b list different numbers of targets")
        if kind == "bytes_per_param":
            if a.vector or len(a.targets) != 1:
                raise _err(cid, "bytes_per_param reads one target (metric.a, less an optional `minus`)")
            if _unit_bytes(a.field) is None:
                raise _err(cid, f"bytes_per_param needs a memory field in MiB or GiB (a name, or a "
                                f"parent's, ending _mb, _mib, _gb or _gib); got '{a.field}'")
    return operands


def _published(cid: str, published: Any) -> dict:
    """`published`: {value, source, note}, or a bare source string."""
    if isinstance(published, str):
        published = {"value": None, "source": published}
    if not isinstance(published, dict) or "source" not in published or \
            set(published) - {"value", "source", "note"}:
        raise _err(cid, "`published` must be {value, source, note} (value and note optional) or a string")
    return published


def _claim(entry: Any, index: int) -> Claim:
    if not isinstance(entry, dict):
        raise ChecksError(f"configs/checks.yaml: claim #{index + 1} is not a mapping")
    cid = str(entry.get("id") or f"#{index + 1}")
    missing = [k for k in CLAIM_KEYS if k not in entry]
    if missing:
        raise _err(cid, f"missing {', '.join(missing)}; fix: every claim has {', '.join(CLAIM_KEYS)}")
    unknown = set(entry) - set(CLAIM_KEYS)
    if unknown:
        raise _err(cid, f"unknown keys {sorted(unknown)}")
    for key in ("claim", "source"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise _err(cid, f"`{key}` must be a non-empty sentence")
    reads = entry["reads"]
    if not isinstance(reads, list) or not reads or not all(isinstance(t, str) for t in reads):
        raise _err(cid, "`reads` must be a list of target ids")
    metric = entry["metric"]
    if not isinstance(metric, dict) or "kind" not in metric:
        raise _err(cid, "`metric` must be a mapping with a `kind`")
    kind = metric["kind"]
    if kind not in KINDS:
        raise _err(cid, f"unknown metric kind '{kind}'; fix: use one of {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    missing = [k for k in required if k not in metric]
    unknown = set(metric) - {"kind", "field", "gpu", *required, *optional}
    if missing or unknown:
        what = (f"needs {', '.join(missing)}" if missing else "") + \
               ("; " if missing and unknown else "") + (f"has unknown keys {sorted(unknown)}" if unknown else "")
        raise _err(cid, f"metric kind {kind} {what}")
    field = metric.get("field", DEFAULT_FIELD)
    if not isinstance(field, str):
        raise _err(cid, "`field` must be a record field name")
    gpu = metric.get("gpu", "max")
    _check_gpu(cid, gpu, "metric")

    operands = _operands(cid, kind, metric, required, field, gpu)
    expect = _expect(cid, kind, entry["expect"])
    if kind == "status" and len(expect.args) != len(operands["targets"].targets):
        raise _err(cid, "expect.equals must list one status per target")
    tolerance = metric.get("tolerance", 0.0)
    if not _is_num(tolerance) or tolerance < 0:
        raise _err(cid, "metric.tolerance must be a number >= 0")

    used = {t for op in operands.values() for t in op.all_targets()}
    if set(reads) != used:
        extra, absent = sorted(set(reads) - used), sorted(used - set(reads))
        raise _err(cid, "`reads` must list exactly the targets the metric reads"
                        + (f"; not read: {extra}" if extra else "") + (f"; not listed: {absent}" if absent else ""))
    published = _published(cid, entry["published"])
    return Claim(cid, " ".join(entry["claim"].split()), entry["source"].strip(), tuple(reads), kind, operands,
                 expect, published, float(tolerance), str(metric.get("params", "params_total")))


def load_claims(path: Path | None = None) -> list[Claim]:
    """Parse and validate the claims file; ChecksError (one line, naming the claim) if malformed."""
    path = Path(path) if path is not None else CLAIMS_PATH
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ChecksError(f"{path.name}: unreadable ({first})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise ChecksError(f"{path.name}: expected a top-level `claims:` list")
    claims = [_claim(e, i) for i, e in enumerate(doc["claims"])]
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise ChecksError(f"{path.name}: duplicate claim id {c.id}")
        seen.add(c.id)
    return claims


# --------------------------------------------------------------------------- evaluation

@dataclasses.dataclass
class Result:
    claim: Claim
    status: str
    measured: str  # the measured value(s) as shown, or the reason for NOT RUN
    values: list[Any] = dataclasses.field(default_factory=list)
    why: str = ""  # FAIL / NOT RUN explanation


def _unit_bytes(field: str) -> int | None:
    """Bytes per unit of a memory field, from the last part of its dotted path that names one
    (theoretical_mem_mb.weight_and_optimizer is in MiB, as Megatron's "MB" are)."""
    for part in reversed(field.lower().split(".")):
        if part.endswith(("_mib", "_mb")):
            return 2 ** 20
        if part.endswith(("_gib", "_gb")):
            return 2 ** 30
    return None


def _record(target: str, records: Mapping[str, dict], known: Mapping[str, Any]) -> dict:
    """The usable record of a target, or _NotRun(reason, target) saying why there is none."""
    if target not in known:
        raise _NotRun("not in the catalog yet", target)
    rec = records.get(target)
    if rec is None:
        raise _NotRun("no record yet", target)
    status = rec.get("status")
    if status not in ("ok", "oom"):
        err = rec.get("error")
        detail = f" ({str(err).splitlines()[0][:100]})" if err else ""
        raise _NotRun(f"its record is {status}{detail}", target)
    exp = known.get(target)
    cfg = rec.get("config")
    if exp is not None and isinstance(cfg, dict):
        for f in LAYOUT_FIELDS:
            if f in cfg and hasattr(exp, f) and cfg[f] != getattr(exp, f):
                raise _NotRun(f"its record ran {f}={cfg[f]}, the catalog now says {getattr(exp, f)} "
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


def _field(rec: dict, target: str, field: str, gpu: str | int) -> float:
    if rec.get("status") == "oom" and field.startswith(OOM_INVALID):
        raise _Fail(f"{target} ran out of memory (no {field})")
    if field == DEFAULT_FIELD and (runs := RunRecord.of(rec).runs):
        return float(runs["median_ms"])  # repeated runs: the median of their medians, as the pages show
    v: Any = rec
    for part in field.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if isinstance(v, list):
        nums = [float(x) for x in v if _is_num(x)]
        if not nums or len(nums) != len(v):
            raise _NotRun(f"its record has no usable {field}", target)
        if isinstance(gpu, int):
            if gpu >= len(nums):
                raise _NotRun(f"its record has no GPU {gpu} in {field}", target)
            return nums[gpu]
        v = _reduce(nums, gpu)
    if not _is_num(v):
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
            out.append(_record(t, records, known).get("status"))
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
        v = a[0] * _unit_bytes(c.operands["a"].field) / params
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
    return "MiB" if _unit_bytes(field) == 2 ** 20 else "GiB"


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


def other_hosts(c: Claim, records: Mapping[str, dict]) -> str:
    """'' when every record a comparing claim reads ran on one host (or says none), else the reason:
    a ratio of two hosts' runs mixes the hosts' difference (5-23% on identical commands) into it."""
    if c.kind == "status":
        return ""
    hosts = {t: h for t in c.reads if (h := provenance.comparable_key(records[t])) is not None}
    if len(set(hosts.values())) <= 1:
        return ""
    return "runs on different hosts or code (" + ", ".join(f"{_short(t)}: {h}" for t, h in hosts.items()) + \
        "); re-run them on one host with today's code"


def machine_groups(root: Path, setup) -> dict[str, dict[str, dict]]:
    """provenance.comparable_key (one machine, one code) -> the newest usable record per target among
    that key's runs in ROOT/results/runs, with its repeats (`_runs`), as load_records gives the newest
    overall."""
    groups: dict[str, list[RunRecord]] = {}
    for r in read_records(root / "results" / "runs", None):
        if r.status in USABLE and (key := provenance.comparable_key(r, root)) is not None:
            groups.setdefault(key, []).append(r)
    out: dict[str, dict[str, dict]] = {}
    for key, recs in groups.items():
        newest: dict[str, RunRecord] = {}
        for r in sorted(recs, key=lambda r: (stamp(r.started), r.run_dir.name if r.run_dir else "")):
            newest[r.target] = r
        out[key] = {t: {**r.raw, "_runs": runs} if (runs := repeats(r, recs, setup)) else dict(r.raw)
                    for t, r in newest.items()}
    return out


def one_machine(c: Claim, groups: Mapping[str, Mapping[str, dict]], known) -> tuple[str, Mapping[str, dict]] | None:
    """Where the newest records of a comparing claim ran on different machines or code: the group of runs
    on one machine with one code that has a usable record of every target it reads; of several, today's
    code first, then the group whose runs are newest. None if no machine has them all."""
    fits = [(key, recs) for key, recs in groups.items() if not _not_run_reason(c.reads, recs, known)]
    if not fits:
        return None
    return max(fits, key=lambda kr: (kr[0].endswith("@ today"), max(stamp(kr[1][t].get("started")) for t in c.reads)))


def evaluate(c: Claim, records: Mapping[str, dict], known: Mapping[str, Any],
             groups: Mapping[str, Mapping[str, dict]] | None = None) -> Result:
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


def _evaluate(c: Claim, records: Mapping[str, dict], known: Mapping[str, Any]) -> Result:
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


def evaluate_all(claims: list[Claim], records: Mapping[str, dict], known: Mapping[str, Any],
                 groups: Mapping[str, Mapping[str, dict]] | None = None) -> list[Result]:
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


def _published_text(p: dict) -> str:
    v = p.get("value")
    if isinstance(v, list):
        v = ", ".join(str(x) for x in v)
    parts = [str(v)] if v is not None else []
    parts.append(str(p.get("source", "")))
    text = " — ".join(x for x in parts if x)
    if p.get("note"):
        text += f"; {p['note']}"
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
    records = load_records(root / "results" / "runs", setup)
    return evaluate_all(load_claims(claims_path), records, catalog.catalog(), machine_groups(root, setup))


def write_checks(root: Path | None = None, claims_path: Path | None = None) -> tuple[list[Result], bool]:
    """Evaluate every claim on ROOT's records and write ROOT/results/checks.md.

    Returns (results, changed). The page is only rewritten when its content changes.
    """
    root = Path(root) if root is not None else ROOT
    results = evaluate_root(root, claims_path)
    text = render(results)
    path = root / OUTPUT
    try:
        old = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        old = None
    if old != text:
        markdown.write_atomic(path, text)
    return results, old != text


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--strict", action="store_true", help="exit 1 if any claim FAILs (make check STRICT=1)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--claims", type=Path, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Test the published claims (configs/checks.yaml) against the committed run records; write results/checks.md."""
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
    return 1 if (args.strict and counts[FAIL]) else 0

