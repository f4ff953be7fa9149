"""A chapter's inputs: its experiments, its run records, the published table it is diffed against.

The chapter pages (tables.py) and their figures (plots.py) read the same Context; both import this
module and neither the other's internals.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import sys
from pathlib import Path

import pandas as pd

from megalab.core import catalog, infile, yamlfile
from megalab.core.infile import InputError
from megalab.core.paths import ROOT
from megalab.core import provenance
from megalab.core.records import RecordError, RunRecord, num
from megalab.results import hosts as machines

REFERENCE_DIR = ROOT / "configs" / "reference"
RUNS_DIR = ROOT / "results" / "runs"

# The 8x H100 reference's memory column is nvidia-smi MiB / 1000 (configs/reference/README.md, "Memory
# unit"): "GB" 80.3 and 80.6 cannot be GiB on a 79.65 GiB card, and read as 1e9 bytes its "largest
# batch that fits" rows would leave 5-6 GiB free. In GiB, our unit: published x 1000 / 1024.
REF_GB_TO_GIB = 1000 / 1024

# The most GPUs the rig these tables are measured on lends: a row needing more is listed with its
# reference numbers, "not run" and the estimator's prediction (predicted.py).
RIG_GPUS = 2

# What a missing input raises inside a cell (an unknown model preset, a None, ...): the cell is empty.
MISSING = (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError, IndexError)


# --------------------------------------------------------------------------- published tables

class ReferenceTableError(InputError):
    """A reference CSV that is not the table it should be: one line naming the file, the line and the column."""


# Each reference CSV's columns and what a cell of each may hold (_cell): the door every published number
# comes in by. A cut file (its last line without its newline), a missing or unknown column, a row of the
# wrong length, text or a negative, infinite or NaN number where a number belongs, a row id given twice:
# each is one ReferenceTableError line, and no page is made from the table.
ANCHOR_COLUMNS = {
    "chapter": "count", "row": "id", "target": "text", "model": "text", "layers": "size", "hidden": "size",
    "heads": "size", "seq": "size", "gbs": "size", "mbs": "size", "gpus": "size", "dp": "size", "tp": "size",
    "pp": "size", "layers_per_virtual_stage": "size?", "cp": "size", "cp_comm": "text?", "ep": "size",
    "etp": "size", "experts": "size?", "topk": "size?", "sp": "bit", "zero2": "bit", "recompute": "text",
    "mem_gb_per_gpu": "amount|oom", "step_ms": "amount?", "notes": "text?"}
TWOGPU_COLUMNS = {
    "row": "id", "experiment": "text", "model": "text", "layers": "size", "hidden": "size", "heads": "size",
    "seq": "size", "gbs": "size", "mbs": "size", "gpus": "size", "dp": "size", "tp": "size", "pp": "size",
    "cp": "size", "sp": "bit", "mem_mib_gpu0": "amount", "mem_mib_gpu1": "amount?", "step_ms": "amount",
    "notes": "text?"}
_KINDS = {"id": "a row id", "text": "text", "count": "a whole number", "size": "a whole number of at least 1",
          "bit": "0 or 1", "amount": "a finite number of at least 0", "amount|oom": "a number of at least 0 or 'oom'"}


def _cell(kind: str, text: str) -> bool:
    """Whether TEXT is a cell of KIND (a trailing ? : or empty)."""
    if kind.endswith("?"):
        if text == "":
            return True
        kind = kind[:-1]
    if kind in ("id", "text"):
        return text.strip() != ""
    if kind == "bit":
        return text in ("0", "1")
    if kind in ("count", "size"):
        return text.isdigit() and int(text) >= (kind == "size")
    if kind == "amount|oom" and text == "oom":
        return True
    try:
        x = float(text)
    except ValueError:
        return False
    return math.isfinite(x) and x >= 0


def _checked_text(path: Path, columns: dict[str, str], key: tuple[str, ...]) -> str:
    """The CSV's text, once every cell is what its column holds (ReferenceTableError, one line, else)."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    fix = f"restore it (git checkout -- {shown}) or mend the line named"
    try:
        text = infile.text(path)
    except InputError as e:
        raise ReferenceTableError(shown, e.reason, fix) from None
    if not text.strip():
        raise ReferenceTableError(shown, "empty", fix)
    if not text.endswith("\n"):
        raise ReferenceTableError(shown, "its last line has no newline (the file is cut short?)", fix)
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise ReferenceTableError(shown, f"not CSV ({e})", fix) from None
    header = rows[0]
    if header != list(columns):
        missing = [c for c in columns if c not in header]
        unknown = [c for c in header if c not in columns]
        what = (f"missing column(s) {missing}" if missing else f"unknown column(s) {unknown}" if unknown
                else "its columns are out of order")
        raise ReferenceTableError(shown, f"{what} (expected: {','.join(columns)})", fix)
    seen: dict[tuple, int] = {}
    for n, row in enumerate(rows[1:], 2):
        if len(row) != len(header):
            raise ReferenceTableError(shown, f"line {n} has {len(row)} fields, the header {len(header)}", fix)
        for col, cell in zip(header, row):
            if not _cell(columns[col], cell):
                raise ReferenceTableError(shown, f"line {n}, column {col}: {cell[:40]!r} is not "
                                                 f"{_KINDS.get(columns[col].rstrip('?'), columns[col])}", fix)
        k = tuple(row[header.index(c)] for c in key)
        if k in seen:
            raise ReferenceTableError(shown, f"line {n}: row {'/'.join(k)} is also line {seen[k]}; "
                                             "each row has its own id", fix)
        seen[k] = n
    if len(rows) < 2:
        raise ReferenceTableError(shown, "no rows", fix)
    return text


def load_reference(path: Path | None = None) -> pd.DataFrame:
    """configs/reference/anchor_8xh100.csv indexed by (chapter, row), every cell checked (ANCHOR_COLUMNS).

    `mem_gb_per_gpu` stays text ('oom' where the reference ran out of memory); `step_ms` is a
    float (NaN where there is none).
    """
    path = path or REFERENCE_DIR / "anchor_8xh100.csv"
    df = pd.read_csv(io.StringIO(_checked_text(path, ANCHOR_COLUMNS, ("chapter", "row"))),
                     dtype={"row": str, "target": str, "mem_gb_per_gpu": str, "notes": str},
                     keep_default_na=False, na_values={"step_ms": [""]})
    df["chapter"] = df["chapter"].astype(int)
    df["step_ms"] = pd.to_numeric(df["step_ms"], errors="coerce")
    return df.set_index(["chapter", "row"])


def load_twogpu_reference(path: Path | None = None) -> pd.DataFrame:
    """configs/reference/twogpu_2xh200.csv indexed by row (T0, T1, ...), every cell checked (TWOGPU_COLUMNS)."""
    path = path or REFERENCE_DIR / "twogpu_2xh200.csv"
    df = pd.read_csv(io.StringIO(_checked_text(path, TWOGPU_COLUMNS, ("row",))),
                     dtype={"row": str, "experiment": str, "notes": str})
    return df.set_index("row")


def check_refs(reference: pd.DataFrame, twogpu: pd.DataFrame) -> None:
    """ReferenceTableError (one line) for a catalog entry whose `ref` names no row of its chapter's published
    table: its row would show no published number (make tables refuses; a cell elsewhere warns once); and for a
    published row whose `target` is no catalog target of its chapter, or not the one whose `ref` names it (a
    target renamed on one side only)."""
    cat = catalog.catalog()
    for (chapter, row), target in reference["target"].items():
        users = [e.id for e in cat.values() if e.chapter == chapter and e.ref == row]
        exp = cat.get(target)
        if exp is None and not users:  # the catalog has no row for it (an entry removed): said, not refused
            print(f"megalab: configs/reference/anchor_8xh100.csv: row {row} of chapter {chapter} names target "
                  f"{target}, which is no catalog target, and no entry has ref {row}: its published numbers show on "
                  "no page; fix: give the entry that reproduces it `ref: " + row + "`, or leave it unmatched",
                  file=sys.stderr)
        elif exp is None or exp.chapter != chapter or (users and target not in users):
            what = "no catalog target" if exp is None else "not the catalog entry that names it"
            known = f"{', '.join(users)} has ref {row}" if users else f"no entry of chapter {chapter} has ref {row}"
            raise ReferenceTableError("configs/reference/anchor_8xh100.csv", f"row {row} of chapter {chapter} names "
                                      f"target {target!r}, which is {what} ({known})",
                                      "name the catalog target that reproduces it (make list), as its `ref` names the row")
    for exp in cat.values():
        kind = reference_kind(exp.chapter)
        if not exp.ref or kind == "none":
            continue
        table, key, name = (twogpu, exp.ref, "twogpu_2xh200.csv") if kind == "twogpu" else \
            (reference, (exp.chapter, exp.ref), "anchor_8xh100.csv")
        if key not in table.index:
            raise ReferenceTableError(yamlfile.shown(catalog.chapters()[exp.chapter]["file"]), f"{exp.id}: ref {exp.ref} is no row of "
                                      f"chapter {exp.chapter} in configs/reference/{name}",
                                      "name the row it reproduces (or drop `ref`)")


# --------------------------------------------------------------------------- the chapter

REFERENCE_KINDS = catalog.REFERENCES  # anchor, twogpu, none: no published table (chapter 6), our rows only


@dataclasses.dataclass
class Context:
    """What a cell may look at: the chapter's experiments (catalog order), records, references."""
    chapter: int
    kind: str  # which published table the chapter is diffed against (REFERENCE_KINDS)
    exps: list[catalog.Experiment]
    records: dict[str, RunRecord]
    reference: pd.DataFrame | None  # anchor_8xh100.csv, by (chapter, row)
    twogpu: pd.DataFrame | None  # twogpu_2xh200.csv, by row
    tree: Path = ROOT  # the checkout whose git history judges the records' code (provenance)
    hosts: machines.Hosts | None = None  # which machine each run ran on, who ran beside it (hosts.py)
    _warned: set = dataclasses.field(default_factory=set)
    _refs: dict = dataclasses.field(default_factory=dict)  # ref_row's answers: a page's cells ask each row often
    figures: list | None = None  # plots.figures_of's, once made: the page links them, write_plots draws them

    def rec(self, exp: catalog.Experiment) -> RunRecord | None:
        return self.records.get(exp.id)

    def ref_row(self, exp: catalog.Experiment) -> pd.Series | None:
        """The published row `exp.ref` names (None without one; warns once if it is missing)."""
        if not exp.ref:
            return None
        if self.kind == "twogpu":
            table, key, name = self.twogpu, exp.ref, "twogpu_2xh200.csv"
        else:
            table, key, name = self.reference, (exp.chapter, exp.ref), "anchor_8xh100.csv"
        if key not in table.index:
            if exp.id not in self._warned:
                self._warned.add(exp.id)
                print(f"megalab tables: {exp.id}: reference row {exp.ref} of chapter {exp.chapter} not in "
                      f"{name}", file=sys.stderr)
            return None
        if key not in self._refs:
            self._refs[key] = table.loc[key]
        return self._refs[key]

    def ref_ms(self, exp: catalog.Experiment) -> float | None:
        ref = self.ref_row(exp)
        return None if ref is None else num(ref["step_ms"])

    def our_ms(self, exp: catalog.Experiment) -> float | None:
        return measured(self.rec(exp))[0]

    def runs(self, exp: catalog.Experiment) -> list[RunRecord]:
        """The runs a row stands on: its record's repeats (the median of their medians), else the record."""
        rec = self.rec(exp)
        return [] if rec is None else runs_behind(rec)


def _load(path: Path) -> RunRecord | None:
    try:
        return RunRecord.load(path)
    except RecordError:
        return None


def runs_behind(rec: RunRecord) -> list[RunRecord]:
    """The runs a row's step time is the median of: its repeats (records.repeats, read from beside it), else
    the record itself; the record stands for its own folder among them (what a reader changed in it counts)."""
    if rec.runs is None or rec.run_dir is None:
        return [rec]
    found = [r for name in rec.runs.runs if (r := _load(rec.run_dir.parent / name / "run.json")) is not None]
    return [rec if r.run_dir == rec.run_dir else r for r in found] or [rec]


def measured(rec: RunRecord | None) -> tuple[float | None, ...]:
    """(median ms, p10, p90, TFLOP/s/GPU, MFU) of a record; all None unless the steps are valid
    (an oom, failed, killed or hung run has no step time: records.MEASURED)."""
    return (None,) * 5 if rec is None else rec.measured


def row_id(exp: catalog.Experiment) -> str:
    if exp.ref:
        return exp.ref
    return f"~{exp.analogue_of}" if exp.analogue_of else ""


def reference_kind(chapter: int) -> str:
    """Which published table a chapter is diffed against: its YAML's `reference:` (default anchor)."""
    kind = catalog.chapters().get(chapter, {}).get("reference") or "anchor"
    if kind not in REFERENCE_KINDS:
        raise ValueError(f"chapter {chapter}: reference '{kind}' is not one of {', '.join(REFERENCE_KINDS)}; "
                         "fix the chapter's `reference:` key")
    return kind


def context(chapter: int, records: dict[str, RunRecord] | None, reference: pd.DataFrame | None,
            twogpu: pd.DataFrame | None, exps: list[catalog.Experiment] | None, tree: Path = ROOT,
            hosts: machines.Hosts | None = None) -> Context:
    """A chapter's Context. HOSTS default: every committed record's where the records are the committed rows,
    else the given records' own (a test's)."""
    kind = reference_kind(chapter)
    if hosts is None:
        hosts = machines.committed(RUNS_DIR.parent) if records is None else machines.Hosts(records.values())
    return Context(
        chapter=chapter, kind=kind,
        exps=[e for e in catalog.catalog().values() if e.chapter == chapter] if exps is None else list(exps),
        records=provenance.load_rows(RUNS_DIR, "megalab") if records is None else records,
        reference=load_reference() if reference is None and kind == "anchor" else reference,
        twogpu=load_twogpu_reference() if twogpu is None and kind == "twogpu" else twogpu,
        tree=tree, hosts=hosts,
    )


# --------------------------------------------------------------------------- layout facts shared by cells and figures

def virtual_stages(exp: catalog.Experiment) -> float:
    """Virtual pipeline stages per device: layers per stage / layers per virtual stage, or 1."""
    if not exp.layers_per_virtual_stage:
        return 1
    return exp.model_cfg["num_layers"] / exp.pp / exp.layers_per_virtual_stage


_WEAK_ID = re.compile(r"2[12]\d-")
_STRONG_ID = re.compile(r"2[34]\d-")


def scaling_series(exp: catalog.Experiment, exps: list[catalog.Experiment]
                   ) -> tuple[str, list[catalog.Experiment]] | None:
    """('weak' | 'strong', the rows of exp's series) for chapter 2's scaling rows, else None.

    Weak: ids 21x/22x with the same GBS (the model grows with TP). Strong: ids 23x/24x with the
    same model and GBS.
    """
    if _WEAK_ID.match(exp.id):
        return "weak", [e for e in exps if _WEAK_ID.match(e.id) and e.gbs == exp.gbs]
    if _STRONG_ID.match(exp.id):
        return "strong", [e for e in exps if _STRONG_ID.match(e.id) and e.gbs == exp.gbs
                          and e.model == exp.model]
    return None
