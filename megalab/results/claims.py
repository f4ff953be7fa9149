"""configs/checks.yaml, typed: the claims `make check` tests, each parsed once into a Claim.

The file's shape is the models below (pydantic, as the run record's schema: a wrong type, a missing or
unknown key is refused with the field's name); what a claim means across its keys (`reads` lists the
targets its metric reads, an expectation its kind allows, a bytes_per_param field in MiB or GiB, a
field a run record has) is checked by their validators. Every problem is one line naming the file,
the claim and the fix: ChecksError.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, Strict, ValidationError,
                      model_validator)

from megalab.core import yamlfile
from megalab.core.infile import InputError
from megalab.core.paths import ROOT
from megalab.core.schema import field_known
from megalab.results.alike import NAMES

CLAIMS_PATH = ROOT / "configs" / "checks.yaml"

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
_CMP = re.compile(r"^\s*(<=|>=|<|>|==)\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$")


# A claim's verdict (checks.py evaluates it; checkmarks.py renders it into the prose that teaches it)
PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"


class ChecksError(ValueError):
    """A malformed claims file: one line naming the claim and the fix (a general one where none is given)."""

    def __init__(self, msg: str):
        super().__init__(msg if "fix:" in msg else f"{msg}; fix: mend configs/checks.yaml (its header says what "
                                                    "each key takes)")


# --------------------------------------------------------------------------- field types

def _gpu(v: Any) -> str | int:
    if v in REDUCE or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    raise ValueError(f"gpu '{v}' is not one of {', '.join(REDUCE)} or a GPU index")


def _kind(v: str) -> str:
    if v not in KINDS:
        raise ValueError(f"unknown metric kind '{v}'; fix: use one of {', '.join(KINDS)}")
    return v


def _field(v: str) -> str:
    if not field_known(v):
        raise ValueError(f"field '{v}' is not a run record field; fix: name one of megalab/core/schema.py "
                         "RunRecord's (a dotted name for a part: megatron_mem.max_allocated_mb)")
    return v


def _facet(v: str) -> str:
    if v not in NAMES:  # the facets two compared runs must share (alike.py)
        raise ValueError(f"differs: '{v}' is no facet of a run; fix: name one of {', '.join(NAMES)}")
    return v


def _sentence(v: str) -> str:
    if not v.strip():
        raise ValueError("must be a non-empty sentence")
    return v.strip()


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


Str = Annotated[str, Strict()]
Gpu = Annotated[Union[str, int], PlainValidator(_gpu)]
FieldName = Annotated[str, Strict(), AfterValidator(_field)]
Targets = Annotated[tuple[Str, ...], Field(min_length=1)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- the parts of a claim

class Operand(_Frozen):
    """What a metric reads: one value per target (a vector) or one over them (`across`), less `minus`.
    Written as a target id, a list of ids or {target | targets, field, gpu, across, minus}; field and
    gpu default to the metric's (the parent's, for `minus`)."""
    targets: Targets
    field: FieldName
    gpu: Gpu = "max"
    across: Literal[REDUCE] | None = None  # reduce over targets; None: one value per target
    minus: Operand | None = None

    @model_validator(mode="before")
    @classmethod
    def _spelled(cls, v: Any) -> Any:
        return _inheriting(v, {}, "operand")

    @model_validator(mode="after")
    def _one_minus(self) -> Operand:
        if self.minus is not None and self.minus.vector:
            raise ValueError("minus must be one value (one target, or targets with `across`)")
        return self

    @property
    def vector(self) -> bool:
        return len(self.targets) > 1 and self.across is None

    def all_targets(self) -> list[str]:
        return list(self.targets) + (self.minus.all_targets() if self.minus else [])


def _inheriting(spec: Any, defaults: dict, where: str) -> Any:
    """An operand as written (an id, a list of ids, a mapping) as a mapping with its targets, and the
    field and gpu it inherits (from the metric, or for `minus` from its operand) where it sets none."""
    if isinstance(spec, str):
        return {"targets": (spec,), **defaults}
    if isinstance(spec, list) and spec and all(isinstance(t, str) for t in spec):
        return {"targets": tuple(spec), **defaults}
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a target id, a list of target ids or a mapping; got {spec!r}")
    v = dict(spec)
    if ("target" in v) == ("targets" in v):
        raise ValueError(f"{where} needs exactly one of `target` and `targets`")
    if "target" in v:
        v["targets"] = (v.pop("target"),)
    if not isinstance(v["targets"], (list, tuple)) or not v["targets"]:
        raise ValueError(f"{where}: targets must be target ids")
    v = {**defaults, **v}
    if "minus" in v:
        v["minus"] = _inheriting(v["minus"], {k: v[k] for k in ("field", "gpu") if k in v}, f"{where}.minus")
    return v


class Metric(_Frozen):
    """`metric`: its kind, the field it reads (default step_ms_median) and how a per-GPU list is reduced
    (`gpu`), set for every operand, and the operands: a, b (numeric kinds) or targets."""
    kind: Annotated[Str, AfterValidator(_kind)]
    field: FieldName = DEFAULT_FIELD
    gpu: Gpu = "max"
    a: Operand | None = None
    b: Operand | None = None
    targets: Operand | None = None  # monotonic and status: the targets, in order
    tolerance: Annotated[float, Strict()] = 0.0  # monotonic: relative slack allowed between neighbours
    params: FieldName = "params_total"  # bytes_per_param: the parameter count's field

    @model_validator(mode="before")
    @classmethod
    def _keys_of_kind(cls, v: Any) -> Any:
        if not isinstance(v, dict) or "kind" not in v:
            raise ValueError("`metric` must be a mapping with a `kind`")
        kind = v["kind"]
        if kind not in KINDS:
            return v  # the kind's own error
        required, optional = KINDS[kind]
        missing = [k for k in required if k not in v]
        unknown = set(v) - {"kind", "field", "gpu", *required, *optional}
        if missing or unknown:
            what = (f"needs {', '.join(missing)}" if missing else "") + ("; " if missing and unknown else "") \
                + (f"has unknown keys {sorted(unknown)}" if unknown else "")
            raise ValueError(f"metric kind {kind} {what}")
        v = dict(v)
        defaults = {"field": v.get("field", DEFAULT_FIELD), "gpu": v.get("gpu", "max")}
        if kind in ("monotonic", "status"):
            t = v["targets"]
            if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
                raise ValueError("metric.targets must be a list of target ids")
            if kind == "monotonic" and len(t) < 2:
                raise ValueError("monotonic needs at least two targets")
            v["targets"] = {"targets": tuple(t), **defaults}
        for key in ("a", "b"):
            if key in v:
                v[key] = _inheriting(v[key], defaults, f"metric.{key}")
        return v

    @model_validator(mode="after")
    def _operands_fit(self) -> Metric:
        a, b = self.a, self.b
        if a is not None and b is not None and a.vector and b.vector and len(a.targets) != len(b.targets):
            raise ValueError("metric.a and metric.b list different numbers of targets")
        if self.kind == "bytes_per_param" and a is not None:
            if a.vector or len(a.targets) != 1:
                raise ValueError("bytes_per_param reads one target (metric.a, less an optional `minus`)")
            if unit_bytes(a.field) is None:
                raise ValueError(f"bytes_per_param needs a memory field in MiB or GiB (a name, or a parent's, "
                                 f"ending _mb, _mib, _gb or _gib); got '{a.field}'")
        if not is_num(self.tolerance) or self.tolerance < 0:
            raise ValueError("metric.tolerance must be a number >= 0")
        return self

    @property
    def operands(self) -> dict[str, Operand]:
        """a and b (numeric kinds) or targets (monotonic, status)."""
        return {k: op for k in ("a", "b", "targets") if (op := getattr(self, k)) is not None}


class Expect(_Frozen):
    """`expect`: a comparison, a band, increasing/decreasing or the statuses, in words."""
    op: Literal["<", "<=", ">", ">=", "==", "between", "approx", "increasing", "decreasing", "equals"]
    args: tuple = ()

    @classmethod
    def parse(cls, kind: str, spec: Any) -> Expect:
        """The expectation SPEC as written for a claim of KIND; ValueError (one line) where it is none."""
        if isinstance(spec, str):
            s = spec.strip()
            if s in ("increasing", "decreasing"):
                if kind != "monotonic":
                    raise ValueError(f"expect '{s}' is for kind monotonic, not {kind}")
                return cls(op=s)
            m = _CMP.match(s)
            if m and kind in NUMERIC_KINDS:
                return cls(op=m.group(1), args=(float(m.group(2)),))
        elif isinstance(spec, dict) and len(spec) in (1, 2):
            if set(spec) == {"between"} and kind in NUMERIC_KINDS:
                lo_hi = spec["between"]
                if (isinstance(lo_hi, list) and len(lo_hi) == 2 and all(is_num(v) for v in lo_hi)
                        and lo_hi[0] <= lo_hi[1]):
                    return cls(op="between", args=(float(lo_hi[0]), float(lo_hi[1])))
            if set(spec) == {"approx", "rel"} and kind in NUMERIC_KINDS:
                if is_num(spec["approx"]) and is_num(spec["rel"]) and spec["rel"] >= 0:
                    return cls(op="approx", args=(float(spec["approx"]), float(spec["rel"])))
            if set(spec) == {"equals"} and kind == "status":
                vals = spec["equals"]
                if isinstance(vals, list) and vals and all(v in STATUSES for v in vals):
                    return cls(op="equals", args=tuple(vals))
        allowed = {"monotonic": "increasing | decreasing", "status": "{equals: [ok|oom|failed|incomplete, ...]}"}
        raise ValueError(f"expect {spec!r} is not valid for kind {kind}; fix: use "
                         + allowed.get(kind, '"< x", "<= x", "> x", ">= x", "== x", {between: [lo, hi]} '
                                             "or {approx: x, rel: r}"))

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


class Published(_Frozen):
    """`published`: the published figure (value), where it is from, a note; or a bare source string."""
    value: Any = None
    source: Str
    note: Str | None = None

    @model_validator(mode="before")
    @classmethod
    def _spelled(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"value": None, "source": v}
        if not isinstance(v, dict) or "source" not in v or set(v) - {"value", "source", "note"}:
            raise ValueError("`published` must be {value, source, note} (value and note optional) or a string")
        return v


class Claim(_Frozen):
    """One entry of configs/checks.yaml."""
    id: Str
    claim: Annotated[Str, AfterValidator(lambda v: " ".join(_sentence(v).split()))]  # one line on the page
    source: Annotated[Str, AfterValidator(_sentence)]
    reads: Targets  # every target the metric reads (checked: the same set)
    metric: Metric
    expect: Expect
    published: Published
    # differences between the runs it compares that the claim accepts (alike.NAMES -> why): shown on the page
    differs: dict[Annotated[str, AfterValidator(_facet)], Annotated[Str, AfterValidator(_sentence)]] = {}

    @model_validator(mode="before")
    @classmethod
    def _expectation(cls, v: Any) -> Any:
        """`expect` read for the metric's kind (what it may say depends on the kind)."""
        if not isinstance(v, dict):
            return v
        kind = v.get("metric", {}).get("kind") if isinstance(v.get("metric"), dict) else None
        if kind in KINDS and "expect" in v and not isinstance(v["expect"], Expect):
            v = {**v, "expect": Expect.parse(kind, v["expect"])}
        return v

    @model_validator(mode="after")
    def _reads_what_it_reads(self) -> Claim:
        if self.kind == "status" and len(self.expect.args) != len(self.operands["targets"].targets):
            raise ValueError("expect.equals must list one status per target")
        used = {t for op in self.operands.values() for t in op.all_targets()}
        if set(self.reads) != used:
            extra, absent = sorted(set(self.reads) - used), sorted(used - set(self.reads))
            raise ValueError("`reads` must list exactly the targets the metric reads"
                             + (f"; not read: {extra}" if extra else "")
                             + (f"; not listed: {absent}" if absent else ""))
        return self

    @property
    def kind(self) -> str:
        return self.metric.kind

    @property
    def operands(self) -> dict[str, Operand]:
        return self.metric.operands

    @property
    def tolerance(self) -> float:
        return self.metric.tolerance

    @property
    def params_field(self) -> str:
        return self.metric.params


def unit_bytes(field: str) -> int | None:
    """Bytes per unit of a memory field, from the last part of its dotted path that names one
    (theoretical_mem_mb.weight_and_optimizer is in MiB, as Megatron's "MB" are)."""
    for part in reversed(field.lower().split(".")):
        if part.endswith(("_mib", "_mb")):
            return 2 ** 20
        if part.endswith(("_gib", "_gb")):
            return 2 ** 30
    return None


# --------------------------------------------------------------------------- the file

def parse(entry: Any, index: int) -> Claim:
    """One claim of the file (the INDEX-th); ChecksError (one line, naming the claim) if malformed."""
    if not isinstance(entry, dict):
        raise ChecksError(f"configs/checks.yaml: claim #{index + 1} is not a mapping")
    cid = str(entry.get("id") or f"#{index + 1}")
    try:
        return Claim.model_validate(entry)
    except ValueError as e:  # a ValidationError, or Expect.parse before validation began
        raise ChecksError(f"configs/checks.yaml: claim {cid}: {_one_line(e)}") from None


def _one_line(e: ValueError) -> str:
    """What is wrong with a claim, from pydantic's errors: missing keys, unknown keys, else the first."""
    if not isinstance(e, ValidationError):
        return str(e)
    errs = e.errors()
    where = lambda err: ".".join(str(p) for p in err["loc"])  # noqa: E731
    missing = [where(x) for x in errs if x["type"] == "missing"]
    if missing and all("." not in m for m in missing):
        return f"missing {', '.join(missing)}; fix: every claim has {', '.join(CLAIM_KEYS)}"
    unknown = [x for x in errs if x["type"] == "extra_forbidden"]
    if unknown:
        parent = ".".join(str(p) for p in unknown[0]["loc"][:-1])
        keys = sorted(str(x["loc"][-1]) for x in unknown if x["loc"][:-1] == unknown[0]["loc"][:-1])
        return (f"{parent} has " if parent else "") + f"unknown keys {keys}"
    first = errs[0]
    msg = first["msg"].removeprefix("Value error, ")
    loc = where(first)
    named = loc and re.search(rf"\b{re.escape(loc.split('.')[-1])}\b", msg)  # the message may name it itself
    return f"{loc}: {msg}" if loc and not named else msg


def load_claims(path: Path | None = None) -> list[Claim]:
    """Parse and validate the claims file; ChecksError (one line, naming the claim) if malformed."""
    path = Path(path) if path is not None else CLAIMS_PATH
    try:  # the YAML door: a regular UTF-8 file, no key twice, no aliases
        doc = yamlfile.load(path, fix="mend configs/checks.yaml")
    except InputError as e:
        raise ChecksError(str(e)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise ChecksError(f"{path.name}: expected a top-level `claims:` list")
    claims = [parse(e, i) for i, e in enumerate(doc["claims"])]
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise ChecksError(f"{path.name}: duplicate claim id {c.id}; fix: give each claim its own id")
        seen.add(c.id)
    return claims
