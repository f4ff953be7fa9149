"""Check verdicts in the prose: a sentence that teaches a claim of configs/checks.yaml shows its verdict.

A tutorial's comparative sentence is a quote of a table cell (quotes.py), a statement of what the
published reference shows (a published marker), or a named check whose verdict is rendered beside it:

    DP keeps the step time (<!-- check ch0-dp-step-flat -->PASS: 1.042 (401.4 / 385.5); today, ...<!-- /check -->)
    ... 2.1 B/param (<!-- check ch1-distopt-saves-6-bytes-per-param-at-dp2 fail older -->FAIL: ...<!-- /check -->)
    <!-- published -->the reference's sweep bottoms out at m=8<!-- /published -->

`make tables` and `make check` rewrite the text between a check's markers from the evaluation that writes
results/checks.md: its verdict, the measured value and what it stands on (provenance, machine, commit).
An unknown check id is an error. The words after the id say what the sentence around the marker tells
its reader, so that a verdict it does not account for is found:

    fail      the sentence explains why the claim FAILs
    not-run   it says that the claim cannot be evaluated yet, and what is missing
    older     it says that the verdict rests on runs of older code or defaults (or several machines)

A FAIL, a NOT RUN or older runs without the word, or the word where the verdict no longer needs it
(the sentence would explain what is no longer so), is one line of `unsaid`; both commands print them,
and STRICT=1 makes them errors. A published marker is not filled: it says that the words inside are
the reference's (the papers, configs/reference), not ours; tests/test_prose.py counts it as sourced.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megalab.core import infile, markdown
from megalab.results.claims import FAIL, NOT_RUN, PASS

CHECK = re.compile(r"<!-- check ([^\s>]+)((?: [^\s>]+)*) -->(.*?)<!-- /check -->", re.S)
PUBLISHED = re.compile(r"<!-- published -->(.*?)<!-- /published -->", re.S)
FLAGS = ("fail", "not-run", "older")


class CheckMarkError(ValueError):
    """A check marker that names no claim or an unknown word: one line, with the fix."""


@dataclasses.dataclass(frozen=True)
class Mark:
    """One check marker of a page: where it is, the claim it names and what the sentence says."""
    where: str  # 'tutorials/01-dp-zero2.md:107'
    id: str
    flags: frozenset[str]


# Hand-written pages besides the tutorials that teach a claim (make check fills them; make tables fills
# the tutorials, with their quotes)
PAGES = ("configs/reference/README.md",)


def docs(root: Path) -> list[Path]:
    """The pages whose check markers are filled: the tutorials and PAGES."""
    root = Path(root)
    return sorted((root / "tutorials").glob("*.md")) + [p for rel in PAGES if (p := root / rel).exists()]


def verdict(result: Any) -> str:
    """The text a marker shows for a checks.Result: the verdict, the value and what it stands on."""
    if result.status == NOT_RUN:
        text = f"{NOT_RUN}: {result.why}"
    elif result.status == FAIL:
        text = f"{FAIL}: {result.measured}, expected {result.claim.expect.text()}; {result.stands_on}"
    else:
        text = f"{PASS}: {result.measured}; {result.stands_on}"
    # one line, and nothing that ends the comment or a table cell it may sit in, nor a tag a record's text holds
    return markdown.escape(" ".join(text.split()).replace("-->", "->").replace("|", "/"))


def fill(text: str, results: Mapping[str, Any], where: str = "") -> tuple[str, list[Mark]]:
    """TEXT with every check marker's verdict brought up to date, and its marks. CheckMarkError for a
    marker naming no claim of RESULTS (claim id -> checks.Result) or a word that is no flag."""
    marks: list[Mark] = []

    def sub(m: re.Match) -> str:
        cid, words = m.group(1), m.group(2).split()
        line = f"{where}:{text.count(chr(10), 0, m.start()) + 1}" if where else str(text.count("\n", 0, m.start()) + 1)
        unknown = [w for w in words if w not in FLAGS]
        if unknown:
            raise CheckMarkError(f"{line}: check marker '{cid}' has unknown word(s) {unknown}; fix: after the id "
                                 f"write only {', '.join(FLAGS)}")
        if cid not in results:
            raise CheckMarkError(f"{line}: no claim '{cid}' in configs/checks.yaml; fix: name a claim id of that "
                                 "file, or add the claim")
        marks.append(Mark(line, cid, frozenset(words)))
        return f"<!-- check {cid}{m.group(2)} -->{verdict(results[cid])}<!-- /check -->"

    return CHECK.sub(sub, text), marks


def unsaid(marks: list[Mark], results: Mapping[str, Any]) -> list[str]:
    """One line per mark whose sentence does not account for its claim's verdict (see the module doc)."""
    out = []
    for m in marks:
        r = results[m.id]
        head = f"{m.where}: `{m.id}` is {r.status}"
        if r.status == FAIL and "fail" not in m.flags:
            out.append(f"{head} and the sentence does not say so; fix: explain the FAIL beside the marker and "
                       f"mark it <!-- check {m.id} fail -->")
        elif r.status == NOT_RUN and "not-run" not in m.flags:
            out.append(f"{head} ({r.why}) and the sentence does not say so; fix: say what is missing and mark it "
                       f"<!-- check {m.id} not-run -->")
        for flag, status in (("fail", FAIL), ("not-run", NOT_RUN)):
            if flag in m.flags and r.status != status:
                out.append(f"{head} now, and the sentence explains a {status}; fix: re-read it and drop `{flag}`")
        if r.status == NOT_RUN:
            continue
        if not r.basis.today and "older" not in m.flags:
            out.append(f"{head} on runs that are not all today's code and defaults ({r.basis.text}) and the sentence "
                       f"does not say so; fix: say so and mark it <!-- check {m.id} older -->, or re-run them")
        elif r.basis.today and "older" in m.flags:
            out.append(f"{head} on today's runs now, and the sentence says they are older; fix: re-read it and "
                       "drop `older`")
    return out


def untaught_fails(marks: list[Mark], results: Mapping[str, Any]) -> list[str]:
    """One line per FAIL that no page's sentence explains (no marker of it with `fail`)."""
    explained = {m.id for m in marks if "fail" in m.flags}
    return [f"`{cid}` FAILs ({r.why}) and no page explains it; fix: explain it where the claim is taught and "
            f"mark it <!-- check {cid} fail -->" for cid, r in results.items() if r.status == FAIL and cid not in explained]


def taught(marks: list[Mark]) -> dict[str, list[str]]:
    """Claim id -> the pages that teach it (their paths, in order, once each)."""
    out: dict[str, list[str]] = {}
    for m in marks:
        page = m.where.rsplit(":", 1)[0]
        if page not in out.setdefault(m.id, []):
            out[m.id].append(page)
    return out


def fill_docs(root: Path, results: Mapping[str, Any], *, write: bool = True,
              check: bool = False) -> tuple[list[Path], list[Mark]]:
    """Fill the check markers of ROOT's pages (docs); write the pages whose text changed unless WRITE is
    False (check=True: write nothing, return the paths that would change). Returns (changed, marks)."""
    changed, marks = [], []
    for path in docs(root):
        text, found = fill(infile.text(path), results, str(path.relative_to(root)))
        marks += found
        if write and markdown.write_if_changed(path, text, check=check):
            changed.append(path)
    return changed, marks
