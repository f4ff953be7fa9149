"""megalab/results/quotes.py: the tutorials quote table cells, and `make tables` keeps the quotes equal to them."""
from __future__ import annotations

import pytest

from megalab.results import quotes
from megalab.__main__ import main

def _row(ms, gib="", p="1111–1221", status="ok", machine="m1", provenance="today", tok=""):
    return {"our ms": ms, "our GiB": gib, "our p10–p90 ms": p, "status": status, "machine": machine,
            "provenance": provenance, "tok/s/GPU": tok, "ref ms": "373", "Δ GiB": "+0.0"}


ROWS = {"520": _row("1196"), "521": _row("1243"), "531": _row("", "33.0 / 34.5"), "526": _row("", "28.6"),
        "500": _row("", status="not run: needs 8 GPUs"), "301": _row("", "77.1", status="oom"),
        "520-olmoe-dp2": _row("1196", tok="13,700"), "522": _row("1107", machine="m2"),
        "523": _row("1100", provenance="older (schema 1)"), "524": _row("1000", provenance="older (FAST=none)"),
        "525": _row("900", provenance="older (schema 1)")}


def row(target):
    return ROWS.get(target)


@pytest.mark.parametrize("rows,column,want", [
    ("520", "our ms", "1196"),
    ("520", "our p10–p90 ms", "1111–1221"),  # a range is shown as it is, its en dash is not a minus
    ("520-olmoe-dp2", "tok/s/GPU", "13,700"),  # full ids have hyphens
    ("521/520", "our ms", "1.04"),
    ("521%520", "our ms", "+4%"),
    ("520%521", "our ms", "-4%"),
    ("520%520", "our ms", "+0%"),  # never "-0%"
    ("531 - 526", "our GiB", "5.9"),  # per-GPU cells count as their largest, as the pages' memory does
    ("500", "our ms", "not run"),
    ("521/500", "our ms", "not run"),
    ("301", "our ms", "out of memory"),  # an empty cell says why
    ("521/301", "our ms", "out of memory"),
    ("520/531", "Δ GiB", "n/a (divides by zero)"),
    ("522/521", "our ms", "0.89 (two machines or codes: not comparable)"),  # as the tables' efficiency columns
    ("523%521", "our ms", "-12% (two machines or codes: not comparable)"),
    ("524%523", "our ms", "-9% (two machines or codes: not comparable)"),  # two older codes are not one code
    ("525%523", "our ms", "-18%"),
    ("522/521", "ref ms", "1.00"),  # the published numbers are one set
])
def test_a_quote_shows_the_cell_or_what_two_cells_give(rows, column, want):
    assert quotes.value(rows, column, row) == want


@pytest.mark.parametrize("rows,column", [("999", "our ms"), ("520", "our speed"), ("520 / ", "our ms"),
                                         ("520-521", "our ms")])  # a difference needs spaces: ' - '
def test_a_quote_of_no_row_or_column_is_one_line_with_the_fix(rows, column):
    with pytest.raises(quotes.QuoteError, match="fix: ") as e:
        quotes.value(rows, column, row)
    assert "\n" not in str(e.value)


def test_fill_updates_the_values_and_names_the_ones_that_moved():
    text = ("ZeRO-2 takes <!-- q 521%520 | our ms -->+9%<!-- /q --> against DP "
            "(<!-- q 520 | our ms -->1196<!-- /q --> ms), fresh: <!-- q 521 | our ms --><!-- /q -->.")
    new, moved = quotes.fill(text, row)
    assert new == ("ZeRO-2 takes <!-- q 521%520 | our ms -->+4%<!-- /q --> against DP "
                   "(<!-- q 520 | our ms -->1196<!-- /q --> ms), fresh: <!-- q 521 | our ms -->1243<!-- /q -->.")
    assert moved == ["`521%520 | our ms` now +4% (was +9%)", "`521 | our ms` now 1243 (was empty)"]
    assert quotes.fill(new, row) == (new, [])


def test_make_tables_refuses_a_tutorial_quote_of_an_unknown_row(tmp_path, capsys):
    import shutil

    from megalab.core.paths import ROOT

    root = tmp_path / "root"
    shutil.copytree(ROOT / "configs", root / "configs")
    (root / "results" / "runs").mkdir(parents=True)
    (root / "tutorials").mkdir()
    tut = root / "tutorials" / "09-x.md"
    tut.write_text("It takes <!-- q 999 | our ms -->1<!-- /q --> ms.\n")
    assert main(["tables", "--root", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("megalab tables: tutorials/09-x.md: quote '999 | our ms': no row '999'") and "\n" not in err
    assert tut.read_text() == "It takes <!-- q 999 | our ms -->1<!-- /q --> ms.\n"  # nothing overwritten
    tut.write_text("It takes <!-- q 101 | our ms -->1<!-- /q --> ms.\n")
    assert main(["tables", "--root", str(root)]) == 0
    assert tut.read_text() == "It takes <!-- q 101 | our ms -->not run<!-- /q --> ms.\n"
    assert "`101 | our ms` now not run (was 1): re-read the sentence around it" in capsys.readouterr().out


def test_the_tutorials_quote_their_measurements():
    from megalab.core.paths import ROOT

    n = 0
    for path in sorted((ROOT / "tutorials").glob("*.md")):
        n += len(quotes.QUOTE.findall(path.read_text(encoding="utf-8")))
    assert n >= 30  # chapters 0 and 5 quote their measurements; test_results checks they are current
