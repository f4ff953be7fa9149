"""Pages out: the one markdown pipe-table helper, the one page writer (write_if_changed), the --check tail.

Every generated page (chapter tables, checks, estimate-vs-measured, bench, data) goes through here.
Two table looks exist in committed pages and are kept byte for byte: `padded` (the chapter and checks
pages: tabulate's `pipe` format, columns padded to one width under `:---` / `---:` alignment rows) and
plain (`| a | b |` under `| --- | --- |`, the hand-read report pages), which tabulate cannot draw: it
always pads a column to its widest cell, and these pages never did.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

from tabulate import tabulate

from megalab.core import infile


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None,
          *, padded: bool = False) -> list[str]:
    """A markdown pipe table as lines: header, alignment row, one line per row.

    align: per column 'left', 'right', 'center' or None/'' (plain: `---`, padded: left). Cells are str()'d
    (None: empty); padded cells are stripped and padded to their column's width (tabulate's rule: at
    least the header plus two). A padded table of no rows has tabulate's plain `---` rule.
    """
    header = [str(h) for h in header]
    body = [["" if c is None else str(c) for c in row] for row in rows]
    align = list(align) if align is not None else [""] * len(header)
    if padded:
        return tabulate(body, header, tablefmt="pipe", disable_numparse=True,
                        colalign=[a or "left" for a in align]).split("\n")
    marks = {"left": ":---", "right": "---:", "center": ":---:"}
    return [_line(header), _line([marks.get(a or "", "---") for a in align]), *(_line(r) for r in body)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write a page or figure through a temporary file, so a reader never sees half of it. Where it cannot
    (a directory where the page goes, a read-only folder): infile.InputError, one line."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise infile.InputError(path, f"cannot be written ({e.strerror or e})",
                                "remove what is in its place, or make its folder writable") from None


def write_if_changed(path: Path, content: str | bytes, *, check: bool = False) -> bool:
    """Write PATH (write_atomic) unless it holds CONTENT already; True when it did not. check=True
    writes nothing and says whether it would: every generator's --check."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:  # the file door: a FIFO or a directory where a page should be is replaced, never read (or hung on)
        same = infile.read(path, None) == data
    except OSError:
        same = False
    if not same and not check:
        write_atomic(path, data)
    return not same


def report_changes(changed: list[Path], root: Path, *, check: bool, what: str, fix: str, detail: str = "") -> int:
    """The CLI tail of a generator: with --check, list stale files and exit 1; else say what was written
    (DETAIL follows "up to date", e.g. how many files were compared)."""
    if check and changed:
        for p in changed:
            print(f"out of date: {_rel(p, root)}")
        print(f"fix: {fix} and commit the result", file=sys.stderr)
        return 1
    for p in changed:
        print(f"{'wrote' if p.exists() else 'removed'} {_rel(p, root)}")
    if not changed:
        print(f"{what} up to date{detail}")
    return 0


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
