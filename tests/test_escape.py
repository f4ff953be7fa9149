"""Pages escape what they quote (issue 60): markdown.escape, the one function every text from the inputs passes on
its way into a page, keeps any text on one line, in one table cell, with no tag, comment or link of its own, and
leaves clean text as it is. One test loops over every hostile text and lists every offender (tests/fuzz_inputs.py
runs the same texts through every page writer; this is the function alone, in-process)."""
from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

from megalab.core import markdown

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_inputs  # noqa: E402

RAW = re.compile(r"<[A-Za-z/!?]")
BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\x1b\t\x7f"


def _values() -> list[str]:
    """The audit's hostile texts, and more: every run of backslashes before a pipe, every kind of line break,
    tags of every shape, our own page markers, entities, a long text, text that only looks hostile."""
    out = [h.format(t="x") for h in fuzz_inputs.HOSTILE]
    out += ["\\" * n + "|" + "\\" * m for n, m in itertools.product(range(5), range(3))]
    out += [f"a{c}b|c{c}" for c in BREAKS]
    out += ["<b>", "</b>", "<B >", "<a\nhref=x>", "<!---->", "<?php ?>", "<![CDATA[x]]>", "<http://x.y>", "<x@y.z>",
            "<!-- megalab:table chapter=1 -->", "<!-- /q -->", "<!-- check ch0-dp-step-flat -->", "&lt;b&gt;&#124;",
            "|" * 9, "| --- | --- |", "<" * 50 + "|" * 50, "x" * 5000 + "<i>|", "\ufeff<b>\u200b|", "`|` <`b`>"]
    return out


CLEAN = ["GPT-2 XL, 48 layers", "<= 330 ms, <= 76.7 GiB", "a < b and c > d", "elementwise_kernel<128, 4>",
         "NVIDIA H100 80GB HBM3", "[csv](01-dp-zero2.csv)", "`make 101`", "–", "x*y_z", ""]


def _cells(line: str) -> int:
    """How many cells GFM makes of a table row (a pipe after an odd number of backslashes splits nothing)."""
    n, slashes = 0, 0
    for ch in line:
        n += ch == "|" and slashes % 2 == 0
        slashes = slashes + 1 if ch == "\\" else 0
    return n - 1


def test_every_hostile_text_stays_one_line_one_cell_and_no_tag():
    offenders = []
    for v in _values():
        e = markdown.escape(v)
        if len(e.splitlines()) > 1 or any(c in e for c in BREAKS):
            offenders.append(f"{v!r}: a line break left in {e!r}")
        if RAW.search(e):
            offenders.append(f"{v!r}: a tag left in {e!r}")
        if _cells(f"| {e} |") != 1:
            offenders.append(f"{v!r}: {_cells(f'| {e} |')} cells in {e!r}")
        if markdown.escape(e) != e:
            offenders.append(f"{v!r}: escaped twice is {markdown.escape(e)!r}, not {e!r}")
        for padded in (False, True):
            lines = markdown.table(["a", "b"], [[v, "x"], ["y", v]], padded=padded)
            if len(lines) != 4 or any(_cells(line) != 2 for line in lines):
                offenders.append(f"{v!r}: a table of it (padded={padded}) is {lines!r}")
        link = markdown.link(v, "x.md")
        if not link.endswith("](x.md)") or re.search(r"(?<!\\)\]", link[1:-len("](x.md)")]):
            offenders.append(f"{v!r}: a link of it is {link!r}")
    assert not offenders, f"{len(offenders)} offenders:\n" + "\n".join(offenders[:40])


def test_clean_text_is_left_as_it_is():
    assert [markdown.escape(v) for v in CLEAN] == CLEAN
    assert markdown.escape(None) == "" and markdown.escape(3.5) == "3.5"
    assert markdown.escape("a | b", cell=False) == "a | b"  # a line of prose: its pipes split nothing


def test_a_quoted_fragment_keeps_its_tables_and_escapes_the_rest():
    """A trace summary as the rig wrote it comes out as it was; a damaged one keeps its tables' shape."""
    clean = "| kernel | ms |\n| --- | ---: |\n| gemm | 1.0 |\n\nsome prose with |pipes|"
    assert markdown.quoted(clean + "\n") == clean.split("\n")
    damaged = "| kernel | ms |\n| --- | --- |\n| k<float> | 1 | 2 | 3 |\n| lone |\n<script>x</script>\nx | y\n--- | ---"
    out = markdown.quoted(damaged)
    assert [_cells(line) for line in out[:4]] == [2, 2, 2, 2] and not any(RAW.search(line) for line in out), out
    assert out[2] == "| k&lt;float> | 1 \\| 2 \\| 3 |" and out[-1] == "--- \\| ---"  # no table of its own
