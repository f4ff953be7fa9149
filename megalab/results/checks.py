"""`make check`: the papers' and the tutorial's claims, tested against our committed run records.

The claims are data (configs/checks.yaml); this module knows a small fixed set of metric kinds
(KINDS) and expectations, evaluates every claim against the newest usable record per target
(provenance.load_rows), writes results/checks.md and fills the verdict beside every tutorial
sentence that teaches a claim (checkmarks.py). Each claim ends as

  PASS     the measured value meets the expectation
  FAIL     it does not (or a target it reads ran out of memory): a finding, reported as is
  NOT RUN  a target is not in the catalog yet, has no record, or its record failed, is
           incomplete, or was run with a layout the catalog no longer has; or the claim pairs runs
           (a ratio, a difference, an order) and no one machine with one code has them all
           (the reason says which)

and says what it stands on (Basis): each record's provenance (`today` or `older (why)`), machine and
commit.

Public API:
  KINDS                       the metric kinds (claims.py: the claims file, typed)
  load_claims(path)           parse and validate configs/checks.yaml (ChecksError: one line, naming the claim)
  evaluate(claim, records, known, groups, root)   one Result
  evaluate_all(claims, records, known, groups, root)
  evaluate_root(root)         every claim against ROOT's committed records
  render(results, taught, spread)   the markdown page
  page(root)                  the results, the pages' check markers and the page's text
  write_checks(root)          write ROOT/results/checks.md and the pages' verdicts
  main(args)                  `python -m megalab check [--strict]`
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megalab.core.paths import ROOT
from megalab.core import markdown, provenance, variables
from megalab.core.records import RunRecord, read_records, settings
from megalab.core import catalog
from megalab.core.catalog import CatalogError
from megalab.results import alike, checkmarks
from megalab.results.chapter import runs_behind
from megalab.results.hosts import Hosts
from megalab.results.claims import (  # noqa: F401  (checks.KINDS, checks.load_claims: the claims file's API)
    DEFAULT_FIELD, FAIL, KINDS, NOT_RUN, PASS, ChecksError, Claim, Operand, Published, is_num, load_claims,
    unit_bytes)

OUTPUT = Path("results") / "checks.md"

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

@dataclasses.dataclass(frozen=True)
class Basis:
    """What a verdict stands on: for every target it read, the record's provenance (`today`, or `older
    (why)`: provenance.py), its machine and its megalab commit, and the run folders behind it (the row's
    repeats: every run its page's row stands on)."""
    runs: tuple[tuple[str, str, str, str], ...] = ()  # (short target id, provenance cell, machine, commit)
    folders: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (short target id, its runs' folder names)

    @property
    def today(self) -> bool:
        """Every record read is today's code and defaults."""
        return bool(self.runs) and all(cell == provenance.MARK[provenance.CURRENT] for _, cell, _, _ in self.runs)

    @property
    def text(self) -> str:
        """'today, 1 GPU on H100-aed36c01, commit 6f90183', or per group of targets where they differ."""
        groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for target, cell, machine, commit in self.runs:
            targets, commits = groups.setdefault((cell, machine), ([], []))
            targets.append(target)
            if commit not in commits:
                commits.append(commit)
        parts = []
        for (cell, machine), (targets, commits) in groups.items():
            what = f"{cell}, {machine}, commit{'s' * (len(commits) > 1)} {', '.join(commits)}"
            parts.append(what if len(groups) == 1 else f"{', '.join(targets)}: {what}")
        return "; ".join(parts)


def machine_label(r: RunRecord, hosts: Hosts) -> str:
    """Where a record ran, in words: its GPUs and its machine's key (hosts.py), '2 GPUs on H100-4fab5618'."""
    n = r.num_gpus or 0
    return f"{n or '?'} GPU{'s' * (n != 1)} on {hosts.key(r)}"


behind = runs_behind  # the runs a row stands on (its repeats), what a verdict reads


def basis(targets: tuple[str, ...], records: Mapping[str, RunRecord], hosts: Hosts, root: Path = ROOT) -> Basis:
    """The Basis of the records TARGETS name (those with a record)."""
    recs = [(t, r) for t in dict.fromkeys(targets) if (r := records.get(t)) is not None]
    return Basis(tuple((_short(t), provenance.of(r, root).cell, machine_label(r, hosts),
                        str(r.versions.megalab_commit or "no commit")[:7]) for t, r in recs),
                 tuple((_short(t), tuple(x.run_dir.name for x in behind(r) if x.run_dir is not None)) for t, r in recs))


@dataclasses.dataclass
class Result:
    claim: Claim
    status: str
    measured: str  # the measured value(s) as shown, or the reason for NOT RUN
    values: list[Any] = dataclasses.field(default_factory=list)
    why: str = ""  # FAIL / NOT RUN explanation
    basis: Basis = Basis()  # the records it read (PASS, FAIL): provenance, machine, commit, run folders
    declared: tuple[str, ...] = ()  # the differences between its runs that the claim declares, with why

    @property
    def stands_on(self) -> str:
        """What the verdict stands on, with the differences its claim declares (the page shows them)."""
        return self.basis.text + "".join(f"; declared difference: {d}" for d in self.declared)


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


def _sets(op) -> list[frozenset[str]]:
    """The targets behind each value an operand gives: one per target of a vector, else one, with `minus`'s."""
    less = frozenset(op.minus.all_targets()) if op.minus is not None else frozenset()
    return [frozenset({t}) | less for t in op.targets] if op.vector else [frozenset(op.targets) | less]


def compared(c: Claim) -> list[frozenset[str]]:
    """The sets of targets whose runs a claim sets against each other (divides, subtracts, ranks, takes the
    largest of): one per value it computes that reads two targets or more. A status claim, a value of each
    target on its own, or a ratio of one run's own GPUs compares no runs."""
    if c.kind == "status":
        return []
    if c.kind == "monotonic":
        groups = [frozenset(c.operands["targets"].targets)]
    elif "b" in c.operands:
        groups = [x | y for x, y in _pairs(_sets(c.operands["a"]), _sets(c.operands["b"]))]
    else:
        groups = _sets(c.operands["a"])
    return list(dict.fromkeys(g for g in groups if len(g) > 1))


def pairs_runs(c: Claim) -> bool:
    """Whether a claim sets runs of two targets or more against each other (compared)."""
    return bool(compared(c))


def unlike(c: Claim, records: Mapping[str, RunRecord], hosts: Hosts, root: Path = ROOT) -> tuple[str, tuple[str, ...]]:
    """('', declared) when the runs a claim compares differ only in the idea under test (alike.py) or in what
    the claim declares (`differs`: the page shows it), else the one line that names the difference and the fix."""
    diffs: list[alike.Difference] = []
    for group in compared(c):
        targets = [t for t in dict.fromkeys(c.reads) if t in group]
        diffs += [d for d in alike.differences({t: behind(records[t]) for t in targets}, hosts, root) if d not in diffs]
    declared = tuple(f"{d.text} ({c.differs[d.facet]})" for d in diffs if d.facet in c.differs)
    undeclared = [d for d in diffs if d.facet not in c.differs]
    if not undeclared:
        return "", declared
    ids = " ".join(_short(t) for t in dict.fromkeys(c.reads))
    return (f"unlike runs, {'; '.join(d.text for d in undeclared)}; fix: run them one at a time on one machine "
            f"with today's code (make campaign IDS=\"{ids}\"), or declare the difference in configs/checks.yaml "
            f"(differs: {{{undeclared[0].facet}: why}}) and the page shows it"), declared


def evaluate(c: Claim, records: Mapping[str, RunRecord], known: Mapping[str, Any], hosts: Hosts | None = None,
             root: Path = ROOT) -> Result:
    """One claim against the records the pages' rows stand on (provenance.load_rows: target -> its row's
    record). `known`: target id -> catalog Experiment (or None). A claim that compares runs reads them only
    where they are like for like (unlike); `hosts` (default: the records given) says which machine each ran
    on and which ran beside another. The result's `basis` names the provenance, machine, commit and run
    folders of every record it read; ROOT's git judges the code."""
    hosts = hosts if hosts is not None else Hosts(records.values())
    why = _not_run_reason(c.reads, records, known)
    declared: tuple[str, ...] = ()
    if not why:
        why, declared = unlike(c, records, hosts, root)
    if why:
        return Result(c, NOT_RUN, "", why=why)
    return dataclasses.replace(_evaluate(c, records, known), basis=basis(c.reads, records, hosts, root),
                               declared=declared)


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
                 hosts: Hosts | None = None, root: Path = ROOT) -> list[Result]:
    hosts = hosts if hosts is not None else Hosts(records.values())
    return [evaluate(c, records, known, hosts, root) for c in claims]


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
    return " ".join(str(s).split())  # on one line, spaces single (table() escapes the rest)


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


def between_machines(root: Path = ROOT, hosts: Hosts | None = None) -> list[tuple[str, float]]:
    """How far one command's step time moves between machines, from the committed runs: for every target
    run ok on two or more machines (hosts.py's keys, a record without a GPU UUID left out: its machine is not
    known) with the same run code (provenance.code_key) and settings, (short id, highest / lowest of the
    machines' median step times - 1), smallest first."""
    hosts = hosts if hosts is not None else Hosts.under(Path(root) / "results", "megalab check")
    by_command: dict[tuple, dict[str, list[float]]] = {}
    for r in read_records(root / "results" / "runs", "megalab check"):
        if r.status == "ok" and r.step_ms_median is not None and r.gpu_uuids:
            key = (r.target, provenance.code_key(r, root), repr(settings(r)))
            by_command.setdefault(key, {}).setdefault(hosts.key(r), []).append(float(r.step_ms_median))
    out = []
    for (target, *_), machines in by_command.items():
        if len(machines) > 1:
            medians = [statistics.median(v) for v in machines.values()]
            out.append((_short(target), max(medians) / min(medians) - 1))
    return sorted(out, key=lambda x: (x[1], x[0]))


def between_machines_text(spread: list[tuple[str, float]]) -> str:
    if not spread:
        return ("No target has runs of one command (the same run code and settings) on two machines yet, so "
                "how far a step moves between machines is not measured here.")
    pct = lambda x: f"{x * 100:.1f}%"  # noqa: E731
    return (f"{len(spread)} target(s) have runs of one command (the same run code and settings) on two or more "
            f"machines; their machines' median step times are {pct(spread[0][1])}–{pct(spread[-1][1])} apart ("
            + ", ".join(f"{t}: {pct(x)}" for t, x in spread) + "). A ratio of two runs made on different machines "
            "carries such a difference in it, and one of two codes what changed between them (results/bench "
            "measures today's levers and CUDA graph): the claims above, the chapter tables' ratio columns and the "
            "tutorials' quotes compare like runs only (megalab/results/alike.py).")


INTRO = (
    "Each claim is computed from the records the chapter pages' rows stand on and from no other run "
    "(provenance.load_rows: per target the newest ok/oom record of a plain `make <target>`, with its repeats; "
    "memory: NVML peak per GPU, the largest over the run's GPUs unless stated; time: median step, or the median "
    "of the repeats' medians, as `our ms` shows). `published` is the same metric on the published rows where it "
    "names the tutorial or the two-GPU notes. A claim that compares runs (a ratio, a difference, an order) is "
    "evaluated only where its runs are like for like: the same machine (the GPUs' UUIDs, megalab/results/hosts.py; "
    "a record without one is assumed one machine with the others of its GPU model, count and commit), run code, "
    "FAST levers, CUDA graph, ITERS, WARMUP, precision, GPU_MEM_GB cap, layer spec, EXTRA_ARGS and torch / "
    "megatron-core, and none of them run while another run may have shared its machine "
    "(megalab/results/alike.py). Otherwise it is NOT RUN with the difference and the fix in one line, unless the "
    "claim declares that difference (`differs` in configs/checks.yaml), which `runs` then shows. `runs` names what "
    "a verdict stands on: each record's provenance (`today`, or `older (why)` as on the chapter pages), machine and "
    "megalab commit; \"Runs behind each verdict\" lists their folders under results/runs. NOT RUN also: a target "
    "it reads is not in the catalog yet, has no record, or its record failed. `fails if` is generated from the "
    "expectation: every claim can fail (tests/test_checks.py builds, for each, a record set that makes it FAIL). "
    "`taught in`: the pages whose prose teaches the claim, with its verdict beside the sentence "
    "(`<!-- check ID -->`, megalab/results/checkmarks.py). The claims are data: configs/checks.yaml.")


def render(results: list[Result], taught: Mapping[str, list[str]] | None = None,
           spread: list[tuple[str, float]] | None = None) -> str:
    """results/checks.md: counts, the table, one footnote per FAIL (where it is explained, TAUGHT: claim
    id -> the pages whose prose teaches it), the run folders behind every verdict, and how far one command
    moves between machines (SPREAD)."""
    taught = taught or {}
    counts = summary(results)
    rows, notes = [], []
    for r in results:
        status = r.status
        pages = ", ".join(taught.get(r.claim.id, []))
        if r.status == FAIL:
            where = f"Explained where it is taught: {pages}." if pages else "No page teaches it yet."
            notes.append(f"[{len(notes) + 1}] `{r.claim.id}`: {r.why} ({r.stands_on}). {where} A finding, "
                         "reported as is: the expectation is not loosened to make it pass.")
            status = f"FAIL [{len(notes)}]"
        elif r.status == NOT_RUN:
            status = f"NOT RUN: {r.why}"
        rows.append({"claim": f"`{r.claim.id}`: {r.claim.claim}", "source": r.claim.source,
                     "expected": r.claim.expect.text(), "fails if": fails_if(r.claim),
                     "published": _published_text(r.claim.published),
                     "measured": r.measured, "runs": r.stands_on if r.status != NOT_RUN else "",
                     "status": status, "taught in": pages})
    header = ["claim", "source", "expected", "fails if", "published", "measured", "runs", "status", "taught in"]
    table = "\n".join(markdown.table(header, ([_cell(r[h]) for h in header] for r in rows), padded=True)) \
        if rows else "(no claims)"
    evaluated = [r for r in results if r.status != NOT_RUN]
    older = sum(not r.basis.today for r in evaluated)
    refused = sum(r.why.startswith("unlike runs") for r in results)
    lines = [
        "# Checks: published claims against our runs",
        "",
        "<!-- generated by `make check` from configs/checks.yaml and results/runs/*/run.json; "
        "do not edit by hand -->",
        "",
        f"{len(results)} claims: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN "
        f"({refused} of them because the runs they would compare are not like for like). "
        f"Of the {len(evaluated)} evaluated, {len(evaluated) - older} read runs of today's code and defaults "
        f"only and {older} read older runs (`runs` says which).",
        "",
        INTRO,
        "",
        table,
    ]
    if notes:
        lines += ["", *notes]
    lines += ["", "## Runs behind each verdict", "",
              "The run folders (results/runs/) of every PASS and FAIL: the runs its page's rows stand on, a row's "
              "repeats included.", ""]
    lines += [f"- `{r.claim.id}` ({r.status}): " + "; ".join(f"{t}: {', '.join(names) or '(no folder)'}"
                                                           for t, names in r.basis.folders)
              for r in results if r.status != NOT_RUN] \
        or ["None."]
    if spread is not None:
        lines += ["", "## Between machines", "", between_machines_text(spread)]
    return "\n".join(lines) + "\n"


class Verdicts(Mapping):
    """Claim id -> Result of ROOT's committed records, evaluated on first use (make tables: only where a
    page has a check marker)."""

    def __init__(self, root: Path = ROOT, claims_path: Path | None = None, hosts: Hosts | None = None):
        self.root, self.claims_path, self.hosts, self._results = Path(root), claims_path, hosts, None

    @property
    def results(self) -> dict[str, Result]:
        if self._results is None:
            self._results = {r.claim.id: r for r in evaluate_root(self.root, self.claims_path, self.hosts)}
        return self._results

    def __getitem__(self, cid: str) -> Result:
        return self.results[cid]

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


def claims_file(root: Path) -> Path | None:
    """ROOT's configs/checks.yaml where it has one (a test's copy), else the default."""
    path = Path(root) / "configs" / "checks.yaml"
    return path if path.exists() else None


def evaluate_root(root: Path = ROOT, claims_path: Path | None = None, hosts: Hosts | None = None) -> list[Result]:
    """Every claim against ROOT's committed records: each target's row record (provenance.load_rows), the
    runs the pages' rows stand on and no other."""
    records = provenance.load_rows(root / "results" / "runs", "megalab check", root)
    claims = load_claims(claims_path or claims_file(root))
    hosts = hosts if hosts is not None else Hosts.under(Path(root) / "results", "megalab check")
    return evaluate_all(claims, records, catalog.catalog(), hosts, root)


def page(root: Path = ROOT, claims_path: Path | None = None) -> tuple[list[Result], list[checkmarks.Mark], str]:
    """ROOT's claims evaluated, the check markers of its pages (checkmarks.docs, filled in memory) and
    results/checks.md's text."""
    hosts = Hosts.under(Path(root) / "results", "megalab check")
    results = evaluate_root(root, claims_path, hosts)
    _, marks = checkmarks.fill_docs(root, {r.claim.id: r for r in results}, write=False)
    return results, marks, render(results, checkmarks.taught(marks), between_machines(root, hosts))


def write_checks(root: Path | None = None, claims_path: Path | None = None
                 ) -> tuple[list[Result], list[str], bool]:
    """Evaluate every claim on ROOT's records, write ROOT/results/checks.md and fill the check markers of
    ROOT's pages. Returns (results, the unsaid lines (checkmarks.unsaid and untaught FAILs), changed).
    A file is only rewritten when its content changes."""
    root = Path(root) if root is not None else ROOT
    results, marks, text = page(root, claims_path)
    by_id = {r.claim.id: r for r in results}
    changed = markdown.write_if_changed(root / OUTPUT, text)
    changed |= bool(checkmarks.fill_docs(root, by_id)[0])
    return results, checkmarks.unsaid(marks, by_id) + checkmarks.untaught_fails(marks, by_id), changed


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 if a FAIL, a NOT RUN or older runs are not said where the claim is taught, or a "
                         "FAIL is explained nowhere (make check STRICT=1)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--claims", type=Path, default=None, help=argparse.SUPPRESS)


def explained(results: list[Result], unsaid: list[str]) -> tuple[int, int]:
    """(FAILs the prose explains, FAILs it does not): a FAIL is explained where a page's sentence says so
    (its marker has `fail`), and no line of UNSAID (checkmarks.untaught_fails) names it."""
    fails = [r.claim.id for r in results if r.status == FAIL]
    untold = [cid for cid in fails if any(line.startswith(f"`{cid}` FAILs") for line in unsaid)]
    return len(fails) - len(untold), len(untold)


def main(args: argparse.Namespace) -> int:
    """Test the published claims (configs/checks.yaml) against the committed run records; write results/checks.md
    and the verdicts beside the tutorials' sentences that teach them."""
    strict = args.strict or variables.value("STRICT")  # make passes --strict for STRICT=1: other words, here
    try:
        results, unsaid, _ = write_checks(args.root, args.claims)
    except (ChecksError, CatalogError, checkmarks.CheckMarkError) as e:
        print(f"megalab check: {e}", file=sys.stderr)
        return 2
    counts = summary(results)
    for r in results:
        if r.status == FAIL:
            print(f"FAIL {r.claim.id}: {r.why} ({r.stands_on})")
    for line in unsaid:
        print(f"megalab check: {line}", file=sys.stderr if strict else sys.stdout)
    told, untold = explained(results, unsaid)
    print(f"checks: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN "
          f"({len(results)} claims) -> {OUTPUT}" + (f"; {len(unsaid)} verdict(s) unsaid where taught" if unsaid else "")
          + f"; FAILs the prose explains: {told}, does not: {untold}")
    return 1 if (strict and unsaid) else 0
