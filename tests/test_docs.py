"""Docs stay true: every relative link and image resolves, tutorials embed the current tables."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [p for p in ROOT.rglob("*.md")
        if not any(part in (".venv", "node_modules", ".git", "outdir", "fixtures", ".pytest_cache")
                       for part in p.parts) and p.relative_to(ROOT).parts[0] != "data"]  # data/: corpora
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to missing {target}"


def test_every_chapter_tutorial_embeds_its_table():
    from megalab.core import catalog

    for chapter, meta in catalog.chapters().items():
        tut = ROOT / meta["tutorial"]
        if tut.exists():
            assert f"<!-- megalab:table chapter={chapter} -->" in tut.read_text(), tut.name


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img\s[^>]*src=[\"']([^\"']+)[\"']")
PAGES = sorted([*ROOT.glob("results/*.md"), ROOT / "results" / "data" / "README.md", *ROOT.glob("tutorials/*.md")])


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_images_resolve(doc):
    """A results page or tutorial never shows a broken image (markdown or <img>, relative links)."""
    for md, html in IMAGE.findall(doc.read_text(encoding="utf-8")):
        target = md or html
        if re.match(r"[a-z]+://", target):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_file() and path.stat().st_size > 0, f"{doc.relative_to(ROOT)} shows missing image {target}"
        assert path.suffix in (".svg", ".png", ".jpg", ".gif"), f"{doc.relative_to(ROOT)}: {target} is not an image"


def test_every_plot_is_shown_on_a_page():
    shown = {(doc.parent / (md or html)).resolve() for doc in PAGES
             for md, html in IMAGE.findall(doc.read_text(encoding="utf-8"))}
    orphans = [p.name for p in sorted((ROOT / "results" / "plots").glob("*")) if p.resolve() not in shown]
    assert not orphans, f"results/plots has figures no page shows: {orphans}; fix: make tables"


def test_the_readme_keeps_one_short_line_per_variable_and_points_at_the_lever_reference():
    """README's variable table is read in a glance: every row short, every run variable of the table named (make help
    lists all of them), FAST's row pointing at docs/levers.md, which names every lever (tests/test_levers.py)."""
    from megalab.core import variables

    rows = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("| `") and ln.count(" | ") >= 2]
    long = [r[:40] for r in rows if len(r) > 200]
    assert not long, f"README rows longer than 200 characters: {long}"
    named = set(re.findall(r"`([A-Z_]+)(?:=1)?`", "\n".join(r.split(" | ")[0] for r in rows)))
    run = {v.name for v in variables.VARIABLES if v.group in ("run", "outputs", "nodes")}
    assert run - {"WARMUP"} <= named, sorted(run - named)
    (fast,) = [r for r in rows if r.startswith("| `FAST` |")]
    assert "docs/levers.md" in fast


def test_every_doc_link_resolves():
    """README and docs/ link each other and the pages by relative path: each target exists."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not target.startswith("http") and not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, missing


# A benchmark file named in prose: a microbenchmark's output or script, or the graph-wait diagnostics
BENCH_FILE = re.compile(r"(?:results/bench/)?((?:[A-Za-z0-9_.-]+-microbench|mb-[a-z0-9-]+|[a-z0-9-]+-waits)\.(?:txt|py))")


def _cited_bench_files(text: str) -> set[str]:
    return set(BENCH_FILE.findall(text))


def test_every_benchmark_file_named_in_code_configs_and_pages_is_committed():
    """Comments and texts cite their evidence by file name (triton_norm.py: "results/bench/grid-tuning-
    microbench.txt"); a name with no file behind it is a claim nothing backs."""
    assert _cited_bench_files("see results/bench/no-such-microbench.txt and mb-gone.py") == {
        "no-such-microbench.txt", "mb-gone.py"}  # what the check would flag
    have = {p.name for folder in ("results/bench", "benchmarks") for p in (ROOT / folder).iterdir()}
    sources = [*ROOT.glob("megalab/**/*.py"), *ROOT.glob("configs/**/*.yaml"), *ROOT.glob("benchmarks/*.py"),
               *ROOT.glob("tutorials/*.md"), *ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "results/bench/README.md"]
    missing = sorted(f"{p.relative_to(ROOT)}: {name}" for p in sources
                     for name in _cited_bench_files(p.read_text(encoding="utf-8")) - have)
    assert not missing, missing


def test_results_hold_data_and_pages_and_the_benchmarks_public_names():
    """results/ holds records, their data and generated pages; the micro-benchmarks that made some of that data are
    code, in benchmarks/, and they use megalab's public names only (a private one may change under them unseen)."""
    import ast

    assert not [p.name for p in (ROOT / "results").rglob("*.py")], "fix: move scripts to benchmarks/"
    private = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith("megalab") for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megalab"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in modules):
                private.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not private, private
