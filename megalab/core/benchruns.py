"""What `make bench` runs and how its records are found again: pure data, no launching.

configs/bench.yaml names cases, levers, an ablation, parity and MoE-expert pairs; each becomes a Run
(a catalog target under a spec and levers) whose key finds its newest record. The launcher
(megalab/harness/bench.py) runs them, the report (benchreport.py) reads them.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from megalab.core.paths import ROOT
from megalab.core.records import RunRecord, read_records
from megalab.core import catalog

CONFIG = ROOT / "configs" / "bench.yaml"
BENCH_DIR = ROOT / "results" / "bench"


def load_config(path: Path = CONFIG) -> dict:
    return yaml.safe_load(path.read_text())


@dataclasses.dataclass(frozen=True)
class Run:
    """One launch: a catalog target, optionally at another batch size, under a spec and levers."""

    target: str
    spec: str
    fast: str = "none"  # MEGALAB_FAST, comma-separated patch names
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
            exp = dataclasses.replace(exp, id=self.id, zero2=self.zero2, ref=None, analogue_of=None)
        if self.gbs is None or self.gbs == exp.gbs:
            return exp
        dp = exp.dp
        return dataclasses.replace(exp, id=self.id, gbs=self.gbs * dp, mbs=self.gbs, ref=None, analogue_of=None)

    def label(self) -> str:
        extra = [self.fast] if self.fast != "none" else []
        extra += ["cuda_graph"] if self.cuda_graph else []
        extra += [self.extra_args] if self.extra_args else []
        return f"{self.id} [{self.spec}{': ' + ' + '.join(extra) if extra else ''}]"


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
    return Run(target=target, spec=spec, fast=",".join(fast) or "none", cuda_graph=graph, gbs=gbs,
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
    fast_levers = [n for n in cfg["specs"]["megalab"]["levers"] if not cfg["levers"][n].get("cuda_graph")]
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
    return (c.id, c.spec or "local", c.fastpath or "none", bool(c.cuda_graph), c.iters, c.extra_args or "")


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
