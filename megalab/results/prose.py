"""The tutorials' comparative sentences that nothing sources: what tests/test_prose.py refuses.

Every comparative or trend statement about our measurements or the reference's takes one of three
forms: a quote of a table cell (quotes.py), a named check with its verdict beside it, or a statement of
what the published reference shows, marked as such (checkmarks.py). A sentence is *comparative* when it
has a comparative or trend word (COMPARATIVE: faster, less, fits, flat, scales, %, ...) and a referent:
a row (a catalog id, a published row T0-T5 or Rn) or words that point at measurements (ours, we,
published, reference, measured, the table). It is *sourced* when it holds a quote, a check marker or a
published marker. Fenced code, the generated table blocks and HTML comments are not prose; a
hand-written table row counts as one sentence.

The detector is deliberately wide: a sentence it flags that explains rather than reports (a textbook
formula naming a row, say) goes on the test's short allowlist with the reason, so that the next claim
someone types without a source fails the test instead.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from megalab.results import checkmarks, quotes

COMPARATIVE = re.compile(
    r"\b(?:fast(?:er|est)|slow(?:er|est|s)?|quicker|long(?:er|est)|short(?:er|est)|less|least|more|fewer|"
    r"low(?:er|ers|ered|est)|high(?:er|est)|larg(?:er|est)|small(?:er|est)|bigger|"
    r"(?:above|below)(?! the table| this| is\b| in\b|[.,;:)])|beats?|beaten|"
    r"wins?|won|loses?|lost|outperforms?|fits?|fitting|out of memory|oom|flat|(?:sub)?linear(?:ly)?|scales?|"
    r"scaling|saves?|saving|costs?|cheaper|halve[sd]?|doubles?|doubled|twice|half|same (?:step )?time|"
    r"same memory|uneven|drops?|falls?|fell|rises?|rose|grows?|grew|shrinks?|improves?|gains?|hides?|"
    r"overlaps?|dominates|barely|nearly|roughly|slightly|lands? on|matches|agrees?|differs?|noisier|noise|"
    r"spread|trend|speedups?|efficien(?:t|cy)|best|worst)\b|\d+(?:\.\d+)?(?:\s?%|x\b(?! ?[A-Z]+\d))|×",
    re.I)
MEASUREMENT_WORDS = (r"ours?|we|us|published|reference(?:'s)?|measured|the table|the paper(?:'s)?|make check|rows?|"
                     r"(?:our|the|older|these|those|its|their|other|each|a|one|two) runs?|an? (?:80|141) GB (?:card|GPU)")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
TABLE_BLOCK = re.compile(r"<!-- megalab:table chapter=\d+ -->.*?<!-- /megalab:table -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
SOURCED = "\u27e6sourced\u27e7"  # what a quote, check or published marker leaves in a sentence
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?]\*\*))\s+(?=[^\s\d])")  # not before a digit: "et al. 2022"
LEAD_IN = re.compile(r"(?:- )?\*\*[^*]+\*\*")  # a list item's bold lead-in names its topic, as a heading does
CODE_SPAN = re.compile(r"`[^`]*`")  # a target name, a command: its words ("-oom") are no claim


def referent(ids: Iterable[str]) -> re.Pattern:
    """A row or a word pointing at measurements; IDS: the catalog's short ids ('101', '302', ...)."""
    rows = "|".join(sorted(set(ids), key=lambda x: (-len(x), x)))
    return re.compile(rf"(?<![\w.-])(?:{rows})(?:-[\w.-]+)?(?!\w|\.\d)|\bT[0-5]\b|\bR\d{{1,2}}\b|"
                      rf"\b(?:{MEASUREMENT_WORDS})\b", re.I)


def sentences(text: str) -> list[str]:
    """The prose of a markdown page as sentences, markers replaced by SOURCED; a table row is one."""
    text = TABLE_BLOCK.sub("\n\n", FENCE.sub("\n\n", text))
    for pattern in (quotes.QUOTE, checkmarks.CHECK, checkmarks.PUBLISHED):
        text = pattern.sub(SOURCED, text)
    text = COMMENT.sub("", text)
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        if block:
            out.extend(s.strip() for s in SENTENCE_END.split(" ".join(block)) if s.strip())
            block.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|"):  # a hand-written table: each row is one sentence, the separator none
            flush()
            if not re.fullmatch(r"[|:\-\s]+", s):
                out.append(s)
        elif not s or s.startswith("#"):  # a heading names a section, it claims nothing
            flush()
        elif s.startswith(("- ", "* ")) or re.match(r"\d+\. ", s):  # a list item starts a new block
            flush()
            block.append(s)
        else:
            block.append(s)
    flush()
    return out


def unsourced(text: str, ids: Iterable[str]) -> list[str]:
    """The comparative sentences of TEXT that hold no quote, check or published marker."""
    ref = referent(ids)
    return [s for s in sentences(text)
            if SOURCED not in s and not LEAD_IN.fullmatch(s) and COMPARATIVE.search(CODE_SPAN.sub("", s)) and ref.search(s)]
