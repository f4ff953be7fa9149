"""Pages out: the one escaping function, the one markdown pipe-table helper, the one page writer
(write_if_changed), the --check tail.

Every generated page (chapter tables, checks, estimate-vs-measured, bench, data) goes through here.
Two table looks exist in committed pages and are kept byte for byte: `padded` (the chapter and checks
pages: tabulate's `pipe` format, columns padded to one width under `:---` / `---:` alignment rows) and
plain (`| a | b |` under `| --- | --- |`, the hand-read report pages), which tabulate cannot draw: it
always pads a column to its widest cell, and these pages never did.

Text a page quotes from its inputs (records, the catalog, checks.yaml, the presets, the reference CSVs,
a profile's kernel names) passes `escape` on its way in: every table cell does (table() escapes them all),
and so does every such text put into a sentence, a heading or a link.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

from tabulate import tabulate

from megalab.core import infile


# What could end a line or a table row: every C0/C1 control (newline, tab, escape, NUL, ...) and the Unicode
# line and paragraph separators (str.splitlines breaks at each of them too)
_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# A `<` that may open raw HTML, a comment or an autolink (CommonMark: a letter, `/`, `!` or `?` after it);
# `<= 330 ms` and `<128, 4>` stay as they are
_TAG = re.compile(r"<(?=[A-Za-z/!?])")
# A pipe preceded by an even number of backslashes (none included) splits a table row: GFM's rule
_PIPE = re.compile(r"(?<!\\)((?:\\\\)*)\|")


def escape(text: object, *, cell: bool = True) -> str:
    """TEXT as a page may quote it, whatever it holds: on one line (controls as spaces), no `<` that opens a
    tag, comment or link (`&lt;`) and, unless CELL is False (a line of prose that can be no table row), no `|`
    that splits a table cell (`\\|`, which renders as `|`). Idempotent, and the identity on text holding none
    of these (what the committed pages quote), so a page of clean inputs is unchanged by it. None is ''."""
    if text is None:
        return ""
    s = str(text)
    if _BREAKS.search(s):
        s = _BREAKS.sub(" ", s)
    if "<" in s:
        s = _TAG.sub("&lt;", s)
    if cell and "|" in s:
        s = _PIPE.sub(lambda m: m.group(1) + "\\|", s)
    return s


def link(text: object, target: str) -> str:
    """A markdown link whose text is quoted input (escape, and its brackets too: a `]` would end the text)."""
    return "[" + re.sub(r"([\[\]])", r"\\\1", escape(text)) + f"]({target})"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None,
          *, padded: bool = False) -> list[str]:
    """A markdown pipe table as lines: header, alignment row, one line per row.

    align: per column 'left', 'right', 'center' or None/'' (plain: `---`, padded: left). Cells are str()'d
    (None: empty) and escaped (escape: one line, no cell-splitting pipe, no raw tag); padded cells are
    stripped and padded to their column's width (tabulate's rule: at least the header plus two). A padded
    table of no rows has tabulate's plain `---` rule.
    """
    header = [escape(h) for h in header]
    body = [[escape(c) for c in row] for row in rows]
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


_DELIMITER = re.compile(r"\|(\s*:?-+:?\s*\|)+\s*")
_DELIMITER_LIKE = re.compile(r"[\s:-]*\|[\s|:-]*-[\s|:-]*|[\s:-]*-[\s:-]*\|[\s|:-]*")  # pipes, dashes, colons
_ALIGN = {(False, False): "", (True, False): "left", (False, True): "right", (True, True): "center"}


def quoted(text: str) -> list[str]:
    """A markdown fragment read from an input file (a profile's trace summary), as a page may embed it: its
    pipe tables drawn again by table() (every cell escaped, every row as many cells as its header), every
    other line escaped. A fragment table() drew in the first place comes out as it was."""
    lines, out, i = text.removesuffix("\n").split("\n"), [], 0  # a file's last newline ends its last line
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and _DELIMITER.fullmatch(lines[i + 1]):
            header = cells(lines[i])
            align = [_ALIGN[(c.startswith(":"), c.endswith(":"))] for c in cells(lines[i + 1])]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                row = cells(lines[i])  # a row of more cells than its header keeps the rest in its last cell
                row = row[:len(header) - 1] + [" | ".join(row[len(header) - 1:])] if len(row) > len(header) \
                    else row + [""] * (len(header) - len(row))
                rows.append(row)
                i += 1
            out += table(header, rows, (align + [""] * len(header))[:len(header)])
        else:  # prose: its pipes split nothing, unless the line could be the delimiter row of a table
            out.append(escape(lines[i], cell=bool(_DELIMITER_LIKE.fullmatch(lines[i]))))
            i += 1
    return out


def cells(line: str) -> list[str]:
    """A pipe-table row's cells, split where GFM splits them (at a pipe after an even number of backslashes),
    stripped; the row's outer pipes are no cells."""
    cells, cell, slashes = [], "", 0
    for ch in line.strip():
        if ch == "|" and slashes % 2 == 0:
            cells.append(cell)
            cell = ""
        else:
            cell += ch
        slashes = slashes + 1 if ch == "\\" else 0
    cells.append(cell)
    if cells and not cells[0].strip():
        cells = cells[1:]
    if cells and not cells[-1].strip():
        cells = cells[:-1]
    return [c.strip() for c in cells]
