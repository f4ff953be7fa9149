"""Measured numbers quoted in the tutorials' prose, kept equal to the table cells they come from.

A tutorial that says "ZeRO-2 (521) is 4% slower than 520" quotes two table rows, and the next
campaign re-measures both. So the prose quotes a cell of a chapter table instead of a typed number:

    <!-- q 520 | our ms -->1196<!-- /q -->        the cell as the row's chapter table shows it
    <!-- q 522/521 | our ms -->0.89<!-- /q -->    the ratio of two rows' cells (2 decimals)
    <!-- q 521%520 | our ms -->+4%<!-- /q -->     the first against the second, in percent
    <!-- q 531 - 526 | our GiB -->5.9<!-- /q -->  the difference, its minus between spaces (ids have hyphens)

Rows are target ids (`520` or the full `520-olmoe-dp2`), columns the table's headers
(tables.table_frame). A cell with one number per GPU ("85.1 / 87.1") counts as its largest in
arithmetic, as the pages' memory does. `make tables` rewrites the text between the markers (GitHub
does not show the comments) and names every quoted value that changed: a number follows the data by
itself, but a word around it ("slower") may have to change too, so the sentence gets re-read.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from megalab.core import markdown

QUOTE = re.compile(r"<!-- q ([^|>]+?) \| ([^>]+?) -->(.*?)<!-- /q -->")
ROWS = re.compile(r"^\s*([\w.-]+?)\s*(?:([/%])\s*([\w.-]+)|\s(-)\s+([\w.-]+))?\s*$")  # A, A/B, A%B, A - B
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
NOT_RUN = "not run"

Row = Callable[[str], "dict[str, str] | None"]  # target id -> its table row (column -> cell); None: no such row
# two target ids -> what their rows' runs differ in besides the layout ('' where like for like: alike.py)
Unlike = Callable[[str, str], str]
OTHER_MACHINE = "(two machines or codes: not comparable)"


class QuoteError(ValueError):
    """A quote that names no row or column: one line, with the fix."""


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(cell.replace(",", ""))]


def _decimals(cell: str) -> int:
    return max((len(x.split(".")[1]) if "." in x else 0 for x in NUMBER.findall(cell.replace(",", ""))), default=0)


def _missing(row: dict) -> str:
    """What a quote shows for a row with no number in the column: its outcome in words."""
    return "out of memory" if str(row.get("status", "")).startswith("oom") else NOT_RUN


def value(rows: str, column: str, row: Row, unlike: Unlike | None = None) -> str:
    """The text a quote shows: a cell, or the ratio, change or difference of two rows' cells. A row with
    nothing in the column says why ('not run', 'out of memory'); two rows whose runs are not like for like
    (UNLIKE names what differs; without it: the machine column or the provenance cell) are marked, as the
    tables' ratio columns are, so that the sentence around says what the number mixes in."""
    m = ROWS.match(rows)
    if not m:
        raise QuoteError(f"quote '{rows} | {column}': rows must be A, A/B, A%B or A - B (target ids); "
                         "fix: e.g. <!-- q 522/521 | our ms -->")
    a, op, b = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5)
    found = []
    for target in (a, b) if op else (a,):
        r = row(target)
        if r is None or column not in r:
            raise QuoteError(f"quote '{rows} | {column}': no row {target!r} with a column {column!r}; fix: a "
                             "target of the catalog and a column header of its chapter table")
        found.append(r)
    cells = [str(r[column]).strip() for r in found]
    if not op:
        return cells[0] or _missing(found[0])
    for r, c in zip(found, cells):
        if not _numbers(c):
            return _missing(r)
    x, y = max(_numbers(cells[0])), max(_numbers(cells[1]))
    if op == "-":
        out = f"{x - y:.{max(_decimals(c) for c in cells)}f}"
    elif y == 0:
        return "n/a (divides by zero)"
    else:
        out = f"{x / y:.2f}" if op == "/" else f"{round((x / y - 1) * 100):+d}%"  # round: no "-0%"
    ours = column.startswith(("our", "Δ")) or column in ("TFLOP/s/GPU", "MFU", "tok/s/GPU")
    if not ours:
        return out
    if unlike is not None:
        differ = unlike(a, b)
        return f"{out} (not like for like: {differ})" if differ else out
    where = [(r.get("machine"), str(r.get("provenance", ""))) for r in found]
    return f"{out} {OTHER_MACHINE}" if where[0] != where[1] else out


def fill(text: str, row: Row, *, keep_missing: bool = False, unlike: Unlike | None = None) -> tuple[str, list[str]]:
    """TEXT with every quote's value brought up to date, and one line per value that changed. A quote of a
    row or column that is not there is a QuoteError; keep_missing (make tables FORCE=1): it keeps its text,
    and a line says so."""
    changes: list[str] = []

    def sub(m: re.Match) -> str:
        rows, column, old = m.group(1).strip(), m.group(2).strip(), m.group(3)
        try:
            new = markdown.escape(value(rows, column, row, unlike))  # a cell's text, quoted into prose
        except QuoteError as e:
            if not keep_missing:
                raise
            changes.append(f"{str(e).split('; fix:')[0]}: kept as it was (FORCE=1): mend the quote")
            return m.group(0)
        if new != old:
            changes.append(f"`{rows} | {column}` now {new} (was {old or 'empty'})")
        return f"<!-- q {m.group(1)} | {m.group(2)} -->{new}<!-- /q -->"

    return QUOTE.sub(sub, text), changes
