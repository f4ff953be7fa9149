"""What `make bench` runs and how its records are found again: pure data, no launching.

configs/bench.yaml names cases, levers, an ablation, parity and MoE-expert pairs; each becomes a Run
(a catalog target under a spec and levers) whose key finds its newest record. The launcher
(megalab/harness/bench.py) runs them, the report (benchreport.py) reads them.

The file is typed at the edge (BenchConfig, pydantic, strict): every section and key known, every count
at least 1, every lever, spec, case and target it names defined (a lever in `levers`, a target in the
catalog). A problem is one BenchConfigError line naming the file, the place and the fix.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from megalab.core import catalog, yamlfile
from megalab.core.infile import InputError
from megalab.core.paths import ROOT
from megalab.core.records import RunRecord, read_records
from megalab.runtime import levers as lever_names

CONFIG = ROOT / "configs" / "bench.yaml"
BENCH_DIR = ROOT / "results" / "bench"


class BenchConfigError(InputError):
    """configs/bench.yaml is not what the bench reads: one line, with the fix."""

    def __init__(self, reason: str, fix: str = "fix configs/bench.yaml"):
        super().__init__("configs/bench.yaml", reason, fix)


# --------------------------------------------------------------------------- the file, typed

Count = Annotated[int, Field(ge=1)]
Spec = Literal["local", "megalab"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Lever(_Strict):
    about: str
    fast: str | None = None  # a MEGALAB_FAST lever name (megalab/runtime/levers.py)
    args: str | None = None  # Megatron flags
    cuda_graph: bool | None = None
    own_masks: bool = False  # it draws dropout masks of its own: a trial's parity is the median rule alone


class SpecEntry(_Strict):
    spec: Spec
    levers: list[str]


class Case(_Strict):
    name: str
    target: str
    gbs: Count | None = None
    zero2: bool | None = None
    ref: str | None = None  # anchor_8xh100.csv row (chapter 1)
    ref2: str | None = None  # twogpu_2xh200.csv row
    levers: dict[str, list[str]] | None = None  # per spec name


class Ablation(_Strict):
    cases: list[str]
    steps: Annotated[list[list[str]], Field(min_length=1)]
    alternatives: list[str] = []


class Search(_Strict):
    target: str
    levers: dict[str, list[str]]
    start: dict[str, Count]
    up_to: Count


class Side(_Strict):
    target: str
    spec: Spec
    gbs: Count | None = None
    cuda_graph: bool | None = None


class Pair(_Strict):
    name: str
    gpus: Count
    a: Side
    b: Side
    iters: Count | None = None
    extra_args: str | None = None
    note: str | None = None


class Parity(_Strict):
    iters: Count
    extra_args: str
    pairs: list[Pair]


class TrialConfig(_Strict):
    """A configuration that is not a catalog row: a target with EXTRA_ARGS (a lever must pay beyond the catalog)."""
    target: str
    extra_args: Annotated[str, Field(min_length=1)]


class Trial(_Strict):
    lever: str | list[str]
    base: list[str] | None = None
    targets: Annotated[list[str | TrialConfig], Field(min_length=1)]


class ExpertPair(_Strict):
    name: str
    gpus: Count
    target: str
    a: list[str]
    b: list[str]


class Experts(_Strict):
    iters: Count
    pairs: list[ExpertPair]


class Bar(_Strict):
    """A published figure to beat (the best public implementation), with its source."""
    what: str
    tokens_per_s: Annotated[float, Field(gt=0)]
    source: str


class PastGoal(_Strict):
    target: str
    ms_max: Annotated[float, Field(gt=0)] | None = None
    gib_max: Annotated[float, Field(gt=0)] | None = None
    mfu_min: Annotated[float, Field(gt=0, lt=1)] | None = None
    bar: str | None = None  # a key of `bars`


class BeyondCatalog(_Strict):
    """Issue 32's rule for a lever that joins the default: it pays on `min_configs` configurations or more that
    are not catalog rows (megalab/results/benchreport.py, beyond_section)."""
    min_configs: Count
    issue_default: list[str]  # the levers the goals' targets ran by default when the issue was filed
    issue_graph: list[str] = []  # the goals' targets whose default ran the full-iteration CUDA graph then
    issue_commit: str  # that commit, as the page names it


class PastReference(_Strict):
    """Issue 32's one-GPU goals (megalab/results/onegpu_goals.py)."""
    min_runs: Count
    round: list[str]  # the levers this round tried: a target's base is its default fast path without them
    round_when: str  # which session's round, as the page names it
    goals: Annotated[list[PastGoal], Field(min_length=1)]
    bars: dict[str, Bar] = {}
    beyond_catalog: BeyondCatalog | None = None


class BenchConfig(_Strict):
    """configs/bench.yaml."""
    iters: Count
    levers: Annotated[dict[str, Lever], Field(min_length=1)]
    specs: dict[str, SpecEntry]
    cases: list[Case]
    ablation: Ablation
    search: Search
    parity: Parity
    trials: list[Trial] = []
    experts: Experts | None = None
    past_reference: PastReference | None = None

    @model_validator(mode="after")
    def _names_are_defined(self) -> "BenchConfig":
        """Every lever, spec, case and target named is defined: the page and the launcher look each up."""
        def levers(names, where):
            if bad := [n for n in names if n not in self.levers]:
                raise ValueError(f"{where}: unknown lever(s) {bad} (levers: {', '.join(self.levers)})")

        def specs(names, where):
            if bad := [n for n in names if n not in self.specs]:
                raise ValueError(f"{where}: unknown spec(s) {bad} (specs: {', '.join(self.specs)})")

        if set(self.specs) != {"local", "megalab"}:
            raise ValueError("specs: the two contenders are `local` and `megalab`")
        for name, lever in self.levers.items():
            if lever.fast and lever.fast not in lever_names.NAMES and lever.fast not in lever_names.RETIRED:
                raise ValueError(f"levers.{name}.fast: {lever.fast!r} is not a fast-path lever "
                                 f"({', '.join(lever_names.NAMES)})")
        for name, spec in self.specs.items():
            levers(spec.levers, f"specs.{name}")
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError(f"cases: a name given twice ({sorted({n for n in names if names.count(n) > 1})})")
        for c in self.cases:
            specs(c.levers or {}, f"cases '{c.name}'")
            for spec, ls in (c.levers or {}).items():
                levers(ls, f"cases '{c.name}' levers.{spec}")
        if bad := [n for n in self.ablation.cases if n not in names]:
            raise ValueError(f"ablation.cases: no case named {bad}")
        for step in self.ablation.steps:
            levers(step, "ablation.steps")
        levers(self.ablation.alternatives, "ablation.alternatives")
        specs(self.search.levers, "search.levers")
        specs(self.search.start, "search.start")
        for spec, ls in self.search.levers.items():
            levers(ls, f"search.levers.{spec}")
        for t in self.trials:
            levers(t.lever if isinstance(t.lever, list) else [t.lever], "trials")
            levers(t.base or [], "trials base")
        if self.past_reference:
            for g in self.past_reference.goals:
                if g.bar and g.bar not in self.past_reference.bars:
                    raise ValueError(f"past_reference: goal {g.target}: no bar named {g.bar!r}")
            levers(self.past_reference.round, "past_reference.round")
            if self.past_reference.beyond_catalog:
                rule = self.past_reference.beyond_catalog
                levers(rule.issue_default, "past_reference.beyond_catalog.issue_default")
                if bad := sorted(set(rule.issue_graph) - {g.target for g in self.past_reference.goals}):
                    raise ValueError(f"past_reference.beyond_catalog.issue_graph: {bad} are no goals' targets")
        for pair in self.experts.pairs if self.experts else []:
            levers(pair.a + pair.b, f"experts '{pair.name}'")
        return self

    def targets(self) -> list[str]:
        """Every catalog target the file names."""
        out = [c.target for c in self.cases] + [self.search.target]
        out += [side.target for p in self.parity.pairs for side in (p.a, p.b)]
        out += [t if isinstance(t, str) else t.target for trial in self.trials for t in trial.targets]
        out += [p.target for p in (self.experts.pairs if self.experts else [])]
        out += [g.target for g in (self.past_reference.goals if self.past_reference else [])]
        return out


def load_config(path: Path = CONFIG) -> dict:
    """configs/bench.yaml as written (the launcher and the page read it by key), every part of it checked
    (BenchConfig, and each target a catalog id); BenchConfigError, one line, else."""
    try:
        raw = yamlfile.load(path, fix="fix configs/bench.yaml")
    except InputError as e:
        raise BenchConfigError(e.reason) from None
    if not isinstance(raw, dict):
        raise BenchConfigError("expected a mapping of sections (iters, levers, specs, cases, ...)")
    try:
        cfg = BenchConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "the file"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise BenchConfigError(f"{where}: {msg}") from None
    for target in cfg.targets():
        try:
            catalog.get(target)
        except catalog.CatalogError:
            raise BenchConfigError(f"target {target!r} is not a catalog target", "a target of `make list`") from None
    return raw


@dataclasses.dataclass(frozen=True)
class Run:
    """One launch: a catalog target, optionally at another batch size, under a spec and levers."""

    target: str
    spec: str
    fast: tuple[str, ...] = ()  # the fast-path levers (megalab/runtime/levers.py)
    cuda_graph: bool = False
    gbs: int | None = None  # None: the target's own
    iters: int = 15
    extra_args: str = ""
    zero2: bool | None = None  # None: the target's own

    @property
    def id(self) -> str:
        base = self.target if self.gbs is None else f"{self.target}.gbs{self.gbs}"
        return base + ("" if self.zero2 is None else (".zero2" if self.zero2 else ".nozero2"))

    def key(self) -> tuple:
        return (self.id, self.spec, self.fast, self.cuda_graph, self.iters, self.extra_args)

    def experiment(self):
        exp = catalog.get(self.target)
        if self.zero2 is not None and self.zero2 != exp.zero2:
            exp = exp.model_copy(update={"id": self.id, "zero2": self.zero2, "ref": None, "analogue_of": None})
        if self.gbs is None or self.gbs == exp.gbs:
            return exp
        dp = exp.dp
        return exp.model_copy(update={"id": self.id, "gbs": self.gbs * dp, "mbs": self.gbs, "ref": None,
                                      "analogue_of": None})

    def label(self) -> str:
        extra = [lever_names.text(self.fast)] if self.fast else []
        extra += ["cuda_graph"] if self.cuda_graph else []
        extra += [self.extra_args] if self.extra_args else []
        return f"{self.id} [{self.spec}{': ' + ' + '.join(extra) if extra else ''}]"


def graph_levers(cfg: dict) -> set[str]:
    """The levers that are the full-iteration CUDA graph (bench.yaml `cuda_graph: true`): a run's side of them is its
    CUDA_GRAPH, not a fast path or a flag."""
    return {n for n, v in cfg["levers"].items() if v.get("cuda_graph")}


def make_run(cfg: dict, target: str, spec: str, levers=(), gbs=None, iters=None, extra_args="",
             zero2=None) -> Run:
    fast, graph, args = [], False, [extra_args] if extra_args else []
    for name in levers:
        lever = cfg["levers"][name]
        if lever.get("fast"):
            fast.append(lever["fast"])
        if lever.get("args"):
            args.append(lever["args"])
        graph = graph or bool(lever.get("cuda_graph"))
    return Run(target=target, spec=spec, fast=tuple(fast), cuda_graph=graph, gbs=gbs,
               iters=iters or cfg["iters"], extra_args=" ".join(args), zero2=zero2)


def spec_run(cfg: dict, case: dict, spec_name: str) -> Run:
    spec = cfg["specs"][spec_name]
    levers = case.get("levers", {}).get(spec_name, spec["levers"])
    return make_run(cfg, case["target"], spec["spec"], levers, case.get("gbs"), zero2=case.get("zero2"))


def ablation_runs(cfg: dict) -> list[tuple[str, list[str], Run]]:
    """(case name, levers, run) for every ablation step and alternative."""
    ab = cfg["ablation"]
    cases = {c["name"]: c for c in cfg["cases"]}
    out = []
    for name in ab["cases"]:
        case = cases[name]
        for levers in ab["steps"]:
            out.append((name, list(levers), make_run(cfg, case["target"], "megalab", levers, case.get("gbs"))))
        for alt in ab.get("alternatives", []):
            levers = list(ab["steps"][-1]) + [alt]
            out.append((name, levers, make_run(cfg, case["target"], "megalab", levers, case.get("gbs"))))
    return out


def parity_runs(cfg: dict) -> list[tuple[dict, Run, Run]]:
    """(pair, a, b): megalab's side runs the spec's fast path; its CUDA graph only where the pair says."""
    par = cfg["parity"]
    fast_levers = [n for n in cfg["specs"]["megalab"]["levers"] if n not in graph_levers(cfg)]
    out = []
    for pair in par["pairs"]:
        a, b = (make_run(cfg, side["target"], side["spec"],
                         ([] if side["spec"] == "local" else fast_levers) + (["cuda_graph"] if side.get("cuda_graph") else []),
                         side.get("gbs"), pair.get("iters", par["iters"]), pair.get("extra_args", par["extra_args"]))
                for side in (pair["a"], pair["b"]))
        out.append((pair, a, b))
    return out


def expert_runs(cfg: dict) -> list[tuple[dict, Run, Run]]:
    """(pair, SequentialMLP run, GroupedMLP run) for each MoE experts pair."""
    ex = cfg.get("experts") or {"pairs": []}
    return [(pair, *(make_run(cfg, pair["target"], "megalab", pair[side], iters=ex["iters"]) for side in "ab"))
            for pair in ex["pairs"]]


def record_key(rec: RunRecord) -> tuple:
    c = rec.config
    return (c.id, c.spec or "local", tuple(c.fastpath or ()), bool(c.cuda_graph), c.iters, c.extra_args or "")


def load_runs(runs_dir: Path) -> dict[tuple, RunRecord]:
    """Newest record per run key, from the bench's runs and the table rows' (a parity pair may compare
    two catalog runs as they are)."""
    found: dict[tuple, RunRecord] = {}
    table_runs = ROOT / "results" / "runs"
    dirs = [runs_dir] + ([table_runs] if runs_dir.resolve() != table_runs.resolve() else [])
    for rec in (r for d in dirs for r in read_records(d, "megalab bench")):
        k = record_key(rec)
        if k not in found or (rec.started or "") >= (found[k].started or ""):
            found[k] = rec
    return found


def fits(rec: RunRecord | None) -> bool | None:
    if rec is None:
        return None
    if rec.status == "ok":
        return True
    if rec.status == "oom":
        return False
    return None
