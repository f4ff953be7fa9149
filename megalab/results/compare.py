"""`python -m megalab compare OUTDIR` (`make compare`): the committed records plus an outdir's own runs
as results pages in a folder of their own; results/ itself is never written."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megalab.core.paths import ROOT
from megalab.core.records import stamp
from megalab.results import tables


def compare(outdir: Path, out: Path | None = None) -> list[Path]:
    """The committed records plus OUTDIR's runs (newest per target wins) as results pages in OUT
    (default OUTDIR/compare/results/): results/ itself is never written."""

    outdir = Path(outdir)
    if not outdir.is_dir():
        raise FileNotFoundError(f"compare: {outdir} is not a folder; fix: give the OUTDIR your runs went to "
                                "(make <target> writes outdir/<time>___<target>/run.json)")
    out = Path(out) if out is not None else outdir / "compare"
    if out.resolve() == ROOT.resolve() or ROOT.resolve() / "results" in (out / "results").resolve().parents \
            or (out / "results").resolve() == (ROOT / "results").resolve():
        raise ValueError(f"compare: {out} would overwrite the committed results/; fix: --out another folder")
    committed = tables.load_records()
    yours = tables.load_records(outdir)
    records = dict(committed)
    for target, rec in yours.items():  # the newer record of a target stands in its row
        if target not in records or stamp(rec.started) >= stamp(records[target].started):
            records[target] = rec
    mine = sorted(t for t in yours if records.get(t) is yours[t])
    intro = (f"Your runs from `{outdir}` ({len(mine)} row(s): {', '.join(mine) or 'none'}) with the committed "
             "records of results/runs for every other row.")
    # the pages are compare's own scratch (OUTDIR/compare): written as they come out (force)
    return tables.write_tables(out, records=records, force=True,
                               index_page={"title": "Results: your runs beside the committed ones", "intro": intro})


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("outdir", type=Path, metavar="OUTDIR", help="your run folders (make's OUTDIR)")
    ap.add_argument("--out", type=Path, default=None, help="where the pages go (default OUTDIR/compare)")


def main(args: argparse.Namespace) -> int:
    """`python -m megalab compare OUTDIR [--out DIR]` (make compare OUTDIR=...)."""
    try:
        changed = compare(args.outdir, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"megalab: {e}", file=sys.stderr)
        return 2
    out = args.out or args.outdir / "compare"
    print(f"compare: wrote {len(changed)} file(s); open {out / 'results' / 'README.md'}")
    return 0
