"""Every comparative sentence of the tutorials is a quote, a named check or a published statement
(megalab/results/prose.py finds the ones that are none; this file keeps its allowlist short)."""
from __future__ import annotations

from pathlib import Path

import pytest

from megalab.core import catalog
from megalab.results import prose

ROOT = Path(__file__).resolve().parent.parent
IDS = [t.split("-", 1)[0] for t in catalog.catalog()]

# Sentences the detector flags that explain rather than report a measurement: (page, a unique part of the
# sentence, why). Keep it short: a new entry needs a reason a reviewer accepts.
ALLOWED = [
    ("06-modern.md", "| `611-llama3b-tp2-sp-gbs16` | TP=2 + SP | half the weights per GPU |",
     "TP=2's arithmetic: each GPU holds half of every weight matrix, by construction"),
]


@pytest.mark.parametrize("page", sorted((ROOT / "tutorials").glob("*.md")), ids=lambda p: p.name)
def test_every_comparative_sentence_is_sourced(page):
    allowed = [part for name, part, _ in ALLOWED if name == page.name]
    bare = [s for s in prose.unsourced(page.read_text(encoding="utf-8"), IDS) if not any(a in s for a in allowed)]
    assert not bare, (f"{page.name}: a comparative sentence with no quote, check or published marker: {bare[0]!r}; "
                      "fix: quote the cell (<!-- q ROW | COLUMN -->), name the check (<!-- check ID -->), mark what "
                      "the reference shows (<!-- published -->...<!-- /published -->), or reword it")


def test_the_allowlist_names_sentences_that_exist():
    for name, part, why in ALLOWED:
        assert why and part in (ROOT / "tutorials" / name).read_text(encoding="utf-8"), f"{name}: stale entry {part!r}"
        assert any(part in s for s in prose.unsourced((ROOT / "tutorials" / name).read_text(encoding="utf-8"), IDS)), \
            f"{name}: {part!r} is no longer flagged; drop it from ALLOWED"


@pytest.mark.parametrize("text", [
    "The trend holds: at a fixed per-GPU batch the step time stays nearly flat from DP=1 to DP=8 (rows 101/102/104).",
    "All four rows are † (about 10% noise), less than the gap.",
    "- **PP=2 (603)** pays the bubble and the uneven stages: the last stage holds the logits.",
    "| `601-llama1b-dp2-zero2-gbs16` | DP=2 + ZeRO-2 | less memory, same step time per GPU |",
    "Ours is fastest at m=2; the published sweep bottoms out at m=8.",
    "The paper measures 30-40% more time.",
    "It was 2.07x faster on 522.",
])
def test_the_claims_that_drifted_are_found(text):
    """The audit's false sentences (issue 33), as they were written: each one is flagged."""
    assert prose.unsourced(text, IDS) == [text.strip()]


@pytest.mark.parametrize("text", [
    "DP keeps the step time (<!-- check ch0-dp-step-flat -->PASS: 1.04<!-- /check -->).",
    "Ours takes <!-- q 101 | Δ ms -->-61%<!-- /q --> against the reference.",
    "<!-- published -->The reference's sweep bottoms out at m=8 (875 ms).<!-- /published -->",
    "A step does about 4/3 of the compute, so it is slower.",  # no row and no measurement named: textbook
    "```\nmake 102  # faster than 101\n```",  # code
    "<!-- megalab:table chapter=1 -->\n| 101 | faster |\n<!-- /megalab:table -->",  # the generated table
    "## Where we differ from the reference",  # a heading
])
def test_sourced_and_non_prose_text_is_not_flagged(text):
    assert prose.unsourced(text, IDS) == []


def test_a_sentence_is_sourced_only_by_its_own_marker():
    text = ("DP keeps the step time (<!-- check ch0-dp-step-flat -->PASS<!-- /check -->). "
            "TP (003) is slower than DP.")
    assert prose.unsourced(text, IDS) == ["TP (003) is slower than DP."]
