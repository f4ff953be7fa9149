"""megalab/results/checkmarks.py: a tutorial sentence that teaches a claim shows its verdict, and a verdict
the sentence does not account for (a FAIL, NOT RUN or older runs it does not mention) is reported by
`make tables` and `make check`, an error with STRICT=1."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from megalab.__main__ import main
from megalab.core import git, provenance
from megalab.results import checkmarks, checks, tables

ROOT = Path(__file__).resolve().parent.parent
TODAY = checks.Basis((("001", "today", "2x H200 GPU-446032a4", "41ddb22"),))
OLDER = checks.Basis((("142", "older (schema 1)", "2x H200 (no GPU UUID)", "0aa8761"),))


def result(status, basis=TODAY, measured="1.04 (401 / 385)", why=""):
    return SimpleNamespace(status=status, basis=basis, measured=measured, why=why or "measured x; expected y",
                           stands_on=basis.text,
                           claim=SimpleNamespace(expect=SimpleNamespace(text=lambda: "between 0.9 and 1.1")))


def test_a_marker_shows_the_verdict_its_value_and_what_it_stands_on():
    text = "DP keeps the step (<!-- check c -->stale<!-- /check -->), TP not (<!-- check d fail older --><!-- /check -->)."
    new, marks = checkmarks.fill(text, {"c": result("PASS"), "d": result("FAIL", OLDER)}, "t.md")
    assert new == ("DP keeps the step (<!-- check c -->PASS: 1.04 (401 / 385); today, 2x H200 GPU-446032a4, "
                   "commit 41ddb22<!-- /check -->), TP not (<!-- check d fail older -->FAIL: 1.04 (401 / 385), "
                   "expected between 0.9 and 1.1; older (schema 1), 2x H200 (no GPU UUID), commit 0aa8761"
                   "<!-- /check -->).")
    assert [(m.where, m.id, m.flags) for m in marks] == [("t.md:1", "c", frozenset()),
                                                        ("t.md:1", "d", frozenset({"fail", "older"}))]
    assert checkmarks.fill(new, {"c": result("PASS"), "d": result("FAIL", OLDER)}, "t.md")[0] == new


@pytest.mark.parametrize("text,needle", [
    ("<!-- check nope --><!-- /check -->", "no claim 'nope' in configs/checks.yaml; fix:"),
    ("x\n<!-- check c failed --><!-- /check -->", "t.md:2: check marker 'c' has unknown word(s) ['failed']; fix:"),
])
def test_an_unknown_claim_or_word_is_one_line_with_the_fix(text, needle):
    with pytest.raises(checkmarks.CheckMarkError) as e:
        checkmarks.fill(text, {"c": result("PASS")}, "t.md")
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("status,basis,flags,said", [
    ("PASS", TODAY, "", True),
    ("FAIL", TODAY, "", False),  # a FAIL the sentence does not explain
    ("FAIL", TODAY, "fail", True),
    ("PASS", TODAY, "fail", False),  # it explains a FAIL that is gone
    ("NOT RUN", TODAY, "", False),
    ("NOT RUN", TODAY, "not-run", True),
    ("PASS", TODAY, "not-run", False),
    ("PASS", OLDER, "", False),  # older runs the sentence does not mention
    ("PASS", OLDER, "older", True),
    ("PASS", TODAY, "older", False),  # it says older, the runs are today's now
    ("FAIL", OLDER, "fail older", True),
])
def test_a_verdict_the_sentence_does_not_account_for_is_reported(status, basis, flags, said):
    _, marks = checkmarks.fill(f"<!-- check c {flags} --><!-- /check -->".replace("c  -->", "c -->"),
                               {"c": result(status, basis)}, "t.md")
    lines = checkmarks.unsaid(marks, {"c": result(status, basis)})
    assert (lines == []) == said, lines
    assert all(line.startswith("t.md:1: `c` is ") and "; fix: " in line for line in lines)


def test_a_fail_no_page_explains_is_reported():
    results = {"c": result("FAIL"), "d": result("FAIL"), "e": result("PASS")}
    _, marks = checkmarks.fill("<!-- check c fail --><!-- /check --> <!-- check d --><!-- /check -->", results, "t.md")
    assert [line.split(" FAILs")[0] for line in checkmarks.untaught_fails(marks, results)] == ["`d`"]


def test_the_committed_pages_account_for_every_verdict():
    """The prose accounts for every verdict as the records read now: the runs that issue 59's and 63's changes under
    megalab/runtime made older are marked so where a sentence teaches them."""
    results, marks, _ = checks.page(ROOT)
    by_id = {r.claim.id: r for r in results}
    assert checkmarks.unsaid(marks, by_id) == []
    assert checkmarks.untaught_fails(marks, by_id) == []
    assert {m.id for m in marks} >= {r.claim.id for r in results if r.status == checks.FAIL}
    assert len({m.id for m in marks}) >= 60  # the tutorials teach most claims


# --------------------------------------------------------------------------- a taught claim made false

@pytest.fixture()
def copy(tmp_path, monkeypatch):
    """A copy of the repository's configs, tutorials and results to mutate; git (the records' provenance)
    still read from this checkout, whose history the copy shares."""
    root = tmp_path / "root"
    for part in ("configs", "tutorials", "results"):
        shutil.copytree(ROOT / part, root / part)
    run = git.run
    monkeypatch.setattr(git, "run", lambda _root, *args: run(ROOT, *args))
    provenance._code_state.cache_clear()
    provenance._code_content.cache_clear()
    yield root
    provenance._code_state.cache_clear()
    provenance._code_content.cache_clear()


def _slow_down(root: Path, target: str, factor: float) -> None:
    for path in (root / "results" / "runs").glob(f"*___{target}*/run.json"):
        rec = json.loads(path.read_text())
        rec["step_ms_median"] *= factor
        path.write_text(json.dumps(rec))


def test_a_record_that_makes_a_taught_claim_false_is_reported_and_strict_fails(copy, capsys, monkeypatch):
    """ch1-zero2-step-time-flat-dp1 is taught in chapter 1 (113 keeps 111's step time, today's runs of one machine);
    slowing 113's runs by 30% makes it FAIL, which `make check` and `make tables` report and STRICT=1 refuses."""
    assert main(["check", "--root", str(copy), "--strict"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert re.search(r"FAILs the prose explains: \d+, does not: 0$", out.rstrip())  # the last line counts them
    _slow_down(copy, "113-gpt2xl-dp1-gbs15-zero2", 1.3)
    assert main(["check", "--root", str(copy)]) == 0
    out = capsys.readouterr()
    where = next(n for n, text in enumerate((copy / "tutorials" / "01-dp-zero2.md").read_text().split("\n"), 1)
                 if "<!-- check ch1-zero2-step-time-flat-dp1 -->" in text)
    line = f"tutorials/01-dp-zero2.md:{where}: `ch1-zero2-step-time-flat-dp1` is FAIL and the sentence does not say so"
    assert line in out.out
    assert "`ch1-zero2-step-time-flat-dp1` FAILs" in out.out  # and no page explains it
    assert re.search(r"FAILs the prose explains: \d+, does not: 1$", out.out.rstrip())
    page = (copy / "tutorials" / "01-dp-zero2.md").read_text()
    assert "<!-- check ch1-zero2-step-time-flat-dp1 -->FAIL: " in page and "expected between 0.9 and 1.1; today" in page
    assert main(["check", "--root", str(copy), "--strict"]) == 1
    assert line in capsys.readouterr().err
    # make tables fills the same verdicts and reports the same sentences
    assert main(["tables", "--root", str(copy)]) == 0
    assert line in capsys.readouterr().out
    monkeypatch.setattr(tables, "not_today", lambda records, tree: {})  # STRICT's other refusal, set aside
    with pytest.raises(checkmarks.CheckMarkError, match="verdict\\(s\\) unsaid where taught"):
        tables.write_tables(copy, strict=True, check=True)
