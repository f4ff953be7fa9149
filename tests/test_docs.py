"""Docs stay true: every relative link and image resolves, tutorials embed the current tables."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [p for p in ROOT.rglob("*.md")
        if not any(part in (".venv", "node_modules", ".git", "outdir", "fixtures", ".pytest_cache", "data")
                       for part in p.parts)]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to missing {target}"


def test_every_chapter_tutorial_embeds_its_table():
    from megalab import catalog

    for chapter, meta in catalog.chapters().items():
        tut = ROOT / meta["tutorial"]
        if tut.exists():
            assert f"<!-- megalab:table chapter={chapter} -->" in tut.read_text(), tut.name
