"""Pages out: the one markdown pipe-table helper, the one atomic page writer, the --check tail.

Every generated page (chapter tables, checks, estimate-vs-measured, bench, data) goes through here.
Two table looks exist in committed pages and are kept byte for byte: `padded` (the chapter and
checks pages: columns padded to one width, `:---` / `---:` alignment rows, as tabulate's `pipe`
format draws them) and plain (`| a | b |` under `| --- | --- |`, the hand-read report pages).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

MIN_PADDING = 2  # a padded column is at least its header plus two: tabulate's rule, kept for the bytes


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None,
          *, padded: bool = False) -> list[str]:
    """A markdown pipe table as lines: header, alignment row, one line per row.

    align: per column 'left', 'right', 'center' or None/'' (plain: `---`, padded: left). Cells are str()'d;
    padded cells are stripped and padded to their column's width.
    """
    header = [str(h) for h in header]
    body = [["" if c is None else str(c) for c in row] for row in rows]
    align = list(align) if align is not None else [""] * len(header)
    if not padded:
        marks = {"left": ":---", "right": "---:", "center": ":---:"}
        return [_line(header), _line([marks.get(a or "", "---") for a in align]), *(_line(r) for r in body)]
    align = [a or "left" for a in align]
    body = [[c.strip() for c in row] for row in body]
    widths = [max([len(h) + MIN_PADDING, *(len(r[i]) for r in body)]) for i, h in enumerate(header)]
    rule = [_rule(a, w) for a, w in zip(align, widths)]
    return ["|" + "|".join(f" {_pad(h, a, w)} " for h, a, w in zip(header, align, widths)) + "|",
            "|" + "|".join(rule) + "|",
            *("|" + "|".join(f" {_pad(c, a, w)} " for c, a, w in zip(r, align, widths)) + "|" for r in body)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _pad(text: str, align: str, width: int) -> str:
    if align == "right":
        return text.rjust(width)
    if align == "center":
        return text.center(width)
    return text.ljust(width)


def _rule(align: str, width: int) -> str:
    """The alignment cell of a padded column: as wide as the column with its two spaces."""
    if align == "right":
        return "-" * (width + 1) + ":"
    if align == "center":
        return ":" + "-" * width + ":"
    return ":" + "-" * (width + 1)


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write a page or figure through a temporary file, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    os.replace(tmp, path)


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
