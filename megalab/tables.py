"""Result tables: one markdown page per chapter, our runs beside the published numbers.

`make tables` (python -m megalab tables) reads every committed run record
(results/runs/*/run.json), picks one per target, and writes each chapter's page
(the `table:` path of configs/experiments/NN-*.yaml, e.g. results/01-dp-zero2.md).
Pages are generated, deterministic and only rewritten when their content changes, so
`python -m megalab tables --check` can tell CI whether the committed pages are current.

Public API:
  load_reference()          published 8x H100 numbers, indexed by (chapter, row)
  load_twogpu_reference()   published 2x H200 notes, indexed by row
  load_records(root)        newest usable run record per target
  render_chapter(chapter)   one chapter's page (markdown text)
  write_tables(root)        write every chapter's page; returns the paths that changed
  cli(argv)                 `python -m megalab tables [--check]`
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from megalab import catalog
from megalab.catalog import ROOT

REFERENCE_DIR = ROOT / "configs" / "reference"
RUNS_DIR = ROOT / "results" / "runs"

# The rig these tables are measured on has one or two GPUs; targets needing more are listed
# with their reference numbers and a "not run" status.
RIG_GPUS = 2

COLUMNS = [
    "Row", "make target", "model", "GBS", "MBS", "seq", "GPUs", "DP", "ZeRO-2",
    "ref GB/GPU", "our GB/GPU", "Δ GB", "ref ms", "our ms", "Δ ms", "our p10–p90 ms",
    "TFLOP/s/GPU", "MFU", "hardware", "status",
]
_RIGHT = {"GBS", "MBS", "seq", "GPUs", "DP", "ref GB/GPU", "our GB/GPU", "Δ GB", "ref ms", "our ms",
          "Δ ms", "our p10–p90 ms", "TFLOP/s/GPU", "MFU"}

USABLE = ("ok", "oom")  # statuses preferred when picking a target's record
NO_REF = "—"  # reference cell of an analogue row: there is no published number

FOOTNOTES = [
    "Δ is ours − published: GiB for memory, percent of the published step time for ms "
    "(+ means we are slower).",
    "Memory is the peak per GPU over the whole run (GiB, NVML used memory as nvidia-smi shows it), "
    "the largest over the run's GPUs; `a / b` is GPU 0 / GPU 1 where they differ by more than 1 GiB "
    "(`lo–hi` with more GPUs).",
    "Step times are the median over steps after warm-up, with the 10th–90th percentile range; "
    "MFU is TFLOP/s/GPU over the GPU's dense bf16 peak.",
    "`~Rn` rows are 2-GPU analogues of published row Rn: they show the same trend on fewer GPUs "
    "and have no published number of their own (—).",
]


# --------------------------------------------------------------------------- inputs

def _unique_index(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    if not df.index.is_unique:
        dup = sorted({str(k) for k in df.index[df.index.duplicated()]})
        raise ValueError(f"{path}: duplicate reference rows {dup}; fix: give each row its own id")
    return df


def load_reference(path: Path | None = None) -> pd.DataFrame:
    """configs/reference/anchor_8xh100.csv indexed by (chapter, row).

    `mem_gb_per_gpu` stays text ('oom' where the reference ran out of memory); `step_ms` is a
    float (NaN where there is none).
    """
    path = path or REFERENCE_DIR / "anchor_8xh100.csv"
    df = pd.read_csv(path, dtype={"row": str, "target": str, "mem_gb_per_gpu": str, "notes": str},
                     keep_default_na=False, na_values={"step_ms": [""]})
    df["chapter"] = df["chapter"].astype(int)
    df["step_ms"] = pd.to_numeric(df["step_ms"], errors="coerce")
    return _unique_index(df.set_index(["chapter", "row"]), path)


def load_twogpu_reference(path: Path | None = None) -> pd.DataFrame:
    """configs/reference/twogpu_2xh200.csv indexed by row (T0, T1, ...)."""
    path = path or REFERENCE_DIR / "twogpu_2xh200.csv"
    df = pd.read_csv(path, dtype={"row": str, "experiment": str, "notes": str})
    return _unique_index(df.set_index("row"), path)


def _started_key(rec: dict) -> float:
    s = rec.get("started")
    if not isinstance(s, str):
        return float("-inf")
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return float("-inf")
    if t.tzinfo is None:  # records are written in UTC; a naive stamp is read as UTC too
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def load_records(root: Path | None = None) -> dict[str, dict]:
    """Newest record per target from ROOT/*/run.json.

    Per target: the newest (by `started`) record whose status is ok or oom; if it has none, the
    newest record of any status. Unreadable or malformed files are skipped with a warning on stderr.
    """
    root = Path(root) if root is not None else RUNS_DIR
    by_target: dict[str, list[tuple[float, str, dict]]] = {}
    for path in sorted(root.glob("*/run.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"megalab tables: skipping {path}: unreadable ({e})", file=sys.stderr)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("target"), str):
            print(f"megalab tables: skipping {path}: not a run record (no target)", file=sys.stderr)
            continue
        by_target.setdefault(rec["target"], []).append((_started_key(rec), path.parent.name, rec))
    out = {}
    for target, recs in sorted(by_target.items()):
        usable = [r for r in recs if r[2].get("status") in USABLE]
        out[target] = max(usable or recs, key=lambda r: (r[0], r[1]))[2]
    return out


# --------------------------------------------------------------------------- formatting

def _num(v: Any) -> float | None:
    """A finite float, or None (None, NaN, text, bools)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _round(x: float, ndigits: int = 0) -> float:
    """Round half away from zero (so hand-checked numbers agree with the table)."""
    m = 10 ** ndigits
    return math.copysign(math.floor(abs(x) * m + 0.5), x) / m


def _fixed(x: float, ndigits: int) -> str:
    r = _round(x, ndigits)
    if r == 0:
        r = 0.0  # no '-0.0'
    return f"{r:.{ndigits}f}"


def fmt_delta_gb(ours: float | None, ref: float | None) -> str:
    """'+1.2' / '-0.4' / '+0.0'; empty when either side is missing."""
    if ours is None or ref is None:
        return ""
    d = _round(ours, 1) - _round(ref, 1)
    return ("+" if _round(d, 1) >= 0 else "") + _fixed(d, 1)


def fmt_delta_pct(ours: float | None, ref: float | None) -> str:
    """Signed percent of the reference: '+12%', '-3%', '+0%'; empty when either side is missing."""
    if ours is None or ref is None or ref == 0:
        return ""
    pct = int(_round((ours - ref) / ref * 100))
    return f"{pct:+d}%"


def fmt_mem(gib: list | None) -> tuple[str, float | None]:
    """(cell, max GiB) for a record's per-GPU peaks."""
    vals = [v for v in (_num(x) for x in (gib or [])) if v is not None]
    if not vals:
        return "", None
    top = max(vals)
    if len(vals) > 1 and top - min(vals) > 1.0:
        if len(vals) == 2:
            return " / ".join(_fixed(v, 1) for v in vals), top
        return f"{_fixed(min(vals), 1)}–{_fixed(top, 1)}", top
    return _fixed(top, 1), top


def short_gpu_name(name: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB'; 'NVIDIA H200' -> 'H200'."""
    if not name:
        return "GPU"
    words = [w for w in name.split() if not w.upper().startswith("HBM")]
    if words and words[0].upper() == "NVIDIA" and len(words) > 1:
        words = words[1:]
    return " ".join(words)


def fmt_hardware(rec: dict) -> str:
    n = rec.get("num_gpus")
    hw = f"{n}x {short_gpu_name(rec.get('gpu_name'))}" if n else short_gpu_name(rec.get("gpu_name"))
    cap = (rec.get("config") or {}).get("gpu_mem_gb")
    if cap not in (None, ""):
        hw += f", capped {cap} GB"
    return hw


def not_run_reason(exp: catalog.Experiment) -> str:
    if exp.gpus > RIG_GPUS:
        return f"not run: needs {exp.gpus} GPUs"
    return "not run yet"


def _status(rec: dict | None, exp: catalog.Experiment, ref_oom: bool) -> str:
    if rec is None:
        return not_run_reason(exp)
    st = str(rec.get("status") or "unknown")
    if st == "oom":
        return "oom (as reference)" if ref_oom else "oom"
    if st == "ok" and ref_oom:
        return "ok (reference: oom)"
    return st


# --------------------------------------------------------------------------- rendering

def _reference_row(exp: catalog.Experiment, reference: pd.DataFrame) -> pd.Series | None:
    if not exp.ref:
        return None
    key = (exp.chapter, exp.ref)
    if key not in reference.index:
        print(f"megalab tables: {exp.id}: reference row {exp.ref} of chapter {exp.chapter} not in "
              "anchor_8xh100.csv", file=sys.stderr)
        return None
    return reference.loc[key]


def _row(exp: catalog.Experiment, rec: dict | None, reference: pd.DataFrame) -> dict[str, str]:
    ref = _reference_row(exp, reference)
    ref_mem_text = "" if ref is None else str(ref["mem_gb_per_gpu"]).strip()
    ref_oom = ref_mem_text.lower() == "oom"
    ref_mem = None if ref_oom else _num(ref_mem_text)
    ref_ms = None if ref is None else _num(ref["step_ms"])

    if exp.ref:
        row_id = exp.ref
    elif exp.analogue_of:
        row_id = f"~{exp.analogue_of}"
    else:
        row_id = ""

    cells = {
        "Row": row_id, "make target": exp.id, "model": exp.model,
        "GBS": str(exp.gbs), "MBS": str(exp.mbs), "seq": str(exp.seq_length),
        "GPUs": str(exp.gpus), "DP": str(exp.dp), "ZeRO-2": "yes" if exp.zero2 else "no",
    }
    if exp.ref:
        cells["ref GB/GPU"] = "oom" if ref_oom else ("" if ref_mem is None else _fixed(ref_mem, 1))
        cells["ref ms"] = "" if ref_ms is None else _fixed(ref_ms, 0)
    elif exp.analogue_of:
        cells["ref GB/GPU"] = cells["ref ms"] = NO_REF
    else:
        cells["ref GB/GPU"] = cells["ref ms"] = ""

    mem_cell, our_mem = ("", None)
    ms = p10 = p90 = tflops = mfu = None
    if rec is not None:
        mem_cell, our_mem = fmt_mem(rec.get("mem_peak_gib"))
        if rec.get("status") in ("ok", "incomplete"):  # an oom or failed run has no valid step time
            ms, p10, p90 = (_num(rec.get(k)) for k in ("step_ms_median", "step_ms_p10", "step_ms_p90"))
            tflops, mfu = _num(rec.get("tflops_per_gpu")), _num(rec.get("mfu"))
    cells["our GB/GPU"] = mem_cell
    cells["Δ GB"] = fmt_delta_gb(our_mem, ref_mem)
    cells["our ms"] = "" if ms is None else _fixed(ms, 0)
    cells["Δ ms"] = fmt_delta_pct(_round(ms) if ms is not None else None, ref_ms)
    cells["our p10–p90 ms"] = f"{_fixed(p10, 0)}–{_fixed(p90, 0)}" if (p10 is not None and p90 is not None) else ""
    cells["TFLOP/s/GPU"] = "" if tflops is None else _fixed(tflops, 0)
    cells["MFU"] = "" if mfu is None else f"{_fixed(mfu * 100, 1)}%"
    cells["hardware"] = "" if rec is None else fmt_hardware(rec)
    cells["status"] = _status(rec, exp, ref_oom)
    return cells


def _ours_sentence(recs: list[dict]) -> str:
    gpus = sorted({short_gpu_name(r.get("gpu_name")) for r in recs if r.get("gpu_name")})
    impls = {(r.get("config") or {}).get("transformer_impl") for r in recs}
    impls.discard(None)
    if "transformer_engine" in impls:
        te = "with Transformer Engine" if impls == {"transformer_engine"} else \
            "with and without Transformer Engine (see each run.json)"
    else:
        te = "without Transformer Engine"
    where = " and ".join(gpus) if gpus else "our rig (no runs recorded yet)"
    return (f"ours on {where}, {te}, on mock data, timing the median step after warm-up and reading "
            "nvidia-smi-style peak memory per GPU through NVML")


def table_frame(chapter: int, records: dict[str, dict] | None = None,
                reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The chapter's table as a DataFrame of strings (one row per catalog target, catalog order)."""
    records = load_records() if records is None else records
    reference = load_reference() if reference is None else reference
    exps = [e for e in catalog.catalog().values() if e.chapter == chapter]
    rows = [_row(e, records.get(e.id), reference) for e in exps]
    return pd.DataFrame(rows, columns=COLUMNS, dtype=str)


def render_chapter(chapter: int, records: dict[str, dict] | None = None,
                   reference: pd.DataFrame | None = None) -> str:
    """Markdown page for one chapter: title, provenance sentence, table, footnotes."""
    meta = catalog.chapters()[chapter]
    records = load_records() if records is None else records
    df = table_frame(chapter, records, reference)
    targets = set(df["make target"])
    recs = [records[t] for t in sorted(targets & set(records))]
    table = df.to_markdown(index=False, disable_numparse=True,
                           colalign=["right" if c in _RIGHT else "left" for c in COLUMNS])
    lines = [
        f"# Chapter {chapter}: {meta.get('title', '')}".rstrip(),
        "",
        "<!-- generated by `make tables` from results/runs/*/run.json and "
        "configs/reference/anchor_8xh100.csv; do not edit by hand -->",
        "",
        "Published numbers are from the tutorial series \"Megatron, Transformed!\" (Chua, 2025) on "
        "8x H100 80GB with Megatron core_r0.14 and Transformer Engine "
        "([configs/reference](../configs/reference/README.md)); " + _ours_sentence(recs) + ".",
        "",
        table,
        "",
        *(f"- {note}" for note in FOOTNOTES),
    ]
    if meta.get("tutorial") and (catalog.ROOT / meta["tutorial"]).exists():
        lines += ["", f"Tutorial: [{meta['tutorial']}](../{meta['tutorial']}). "
                      "Run a row with `make <make target>`, then `make tables`."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- output

def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_tables(root: Path | None = None, *, check: bool = False) -> list[Path]:
    """Write every chapter's table page under ROOT; return the paths whose content changed.

    Records come from ROOT/results/runs; a page whose content is unchanged is not touched. With
    check=True nothing is written and the returned paths are those that *would* change.
    """
    root = Path(root) if root is not None else ROOT
    records = load_records(root / "results" / "runs")
    reference = load_reference()
    changed = []
    for chapter, meta in catalog.chapters().items():
        path = root / meta["table"]
        text = render_chapter(chapter, records, reference)
        try:
            old = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            old = None
        if old == text:
            continue
        if not check:
            _write_atomic(path, text)
        changed.append(path)
    return changed


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m megalab tables",
                                 description="Rebuild results/*.md from results/runs/*/run.json.")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if any table is out of date (for CI)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    root = args.root
    changed = write_tables(root, check=args.check)
    n = len(catalog.chapters())
    if args.check:
        if changed:
            for p in changed:
                print(f"out of date: {_rel(p, root)}")
            print("fix: run `make tables` and commit the result", file=sys.stderr)
            return 1
        print(f"tables up to date ({n} file{'s' * (n != 1)})")
        return 0
    for p in changed:
        print(f"wrote {_rel(p, root)}")
    if not changed:
        print(f"tables up to date ({n} file{'s' * (n != 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
