"""Pages never shrink silently (megalab/results/pageguard.py): `make tables` refuses, in one line and writing
nothing, to drop a row or a page, or to lose a published or measured number, a tutorial's table or a quoted
row; FORCE=1 (or --force) allows it, and so does a catalog change not yet committed, for its own rows."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from megalab.__main__ import main
from megalab.core import catalog
from megalab.results import pageguard, plots, tables

ROOT = Path(__file__).resolve().parent.parent
T101 = "101-gpt2xl-dp1-gbs1-bf16"
T111 = "111-gpt2xl-dp1-fit-80GB"


def _write(runs: Path, name: str, target: str = T101, **fields) -> Path:
    rec = {"fixture": True, "target": target, "status": "ok", "started": "2025-03-01T10:00:00+00:00",
           "step_ms_median": 250.0, "step_ms_p10": 249.0, "step_ms_p90": 255.0, "step_count": 17,
           "tflops_per_gpu": 42.0, "mfu": 0.0425, "mem_peak_gib": [30.0], "gpu_name": "NVIDIA H100 80GB HBM3",
           "num_gpus": 1, "config": {"gpu_mem_gb": None}, **fields}
    d = runs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(rec))
    return d


@pytest.fixture
def pages(tmp_path, capsys):
    """A root with two rows measured and its pages written."""
    runs = tmp_path / "results" / "runs"
    _write(runs, "r1")
    _write(runs, "r2", target=T111, started="2025-03-05T10:00:00+00:00")
    assert main(["tables", "--root", str(tmp_path)]) == 0
    capsys.readouterr()
    return tmp_path


def _snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted((root / "results").rglob("*")) if p.is_file() and "runs" not in p.parts}


def test_a_row_that_loses_its_measurement_is_refused_in_one_line_and_nothing_is_written(pages, capsys, monkeypatch):
    monkeypatch.delenv("FORCE", raising=False)
    before = _snapshot(pages)
    shutil.rmtree(pages / "results" / "runs" / "r2")
    assert main(["tables", "--root", str(pages)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("megalab tables: would lose ") and "\n" not in err
    assert "results/01-dp-zero2.md: 111's `our GiB` 30.0" in err and "`our ms` 250" in err
    assert "fix: restore what is gone" in err and "FORCE=1 make tables" in err
    assert _snapshot(pages) == before  # nothing written: no page, no CSV, no figure, no index
    # told to: written as it comes out
    assert main(["tables", "--root", str(pages), "--force"]) == 0
    assert "| " + T111 in (pages / "results" / "01-dp-zero2.md").read_text()  # the row stays, not run
    assert _snapshot(pages) != before


def test_force_comes_from_the_environment_as_make_passes_it(pages, capsys, monkeypatch):
    shutil.rmtree(pages / "results" / "runs" / "r2")
    monkeypatch.setenv("FORCE", "1")
    assert main(["tables", "--root", str(pages)]) == 0
    monkeypatch.setenv("FORCE", "maybe")  # a flag's words only: never a silent no
    assert main(["tables", "--root", str(pages)]) == 2
    assert "FORCE=maybe: not a yes/no value" in capsys.readouterr().err


def test_a_damaged_newest_record_is_skipped_and_the_row_kept(pages, capsys):
    """The issue's 'bogus newest run.json blanks its row': skipped (one line), the older record stands."""
    bad = _write(pages / "results" / "runs", "r3", target=T111, started="2026-01-01T00:00:00+00:00", notes=5)
    before = _snapshot(pages)
    assert main(["tables", "--root", str(pages)]) == 0
    assert f"skipping {bad / 'run.json'}: notes:" in capsys.readouterr().err
    assert _snapshot(pages) == before


def test_losses_rules(pages):
    """Each kind: a row gone, a ref or our number gone, a page no chapter writes, a tutorial's table."""
    chapters = catalog.chapters()
    frames = {ch: tables.table_frame(ch, tables.load_records(pages / "results" / "runs", pages), tree=pages)
              for ch in chapters}
    assert pageguard.losses(pages, chapters, frames, {}) == []
    one = frames[1]
    frames[1] = one[one["make target"] != T101].copy()  # a row dropped
    frames[1].loc[frames[1]["make target"] == T111, "ref ms"] = "—"  # a published number gone
    found = pageguard.losses(pages, chapters, frames, {})
    assert [(x.what, x.target) for x in found] == [("row 101", T101), ("111's `ref ms` 393", T111)]
    # a column the code no longer draws is no input's loss
    frames[1] = one.drop(columns=["ref ms"])
    assert pageguard.losses(pages, chapters, frames, {}) == []
    frames[1] = one
    # a chapter page no chapter writes any more, and a tutorial's table of a chapter that is gone
    (pages / "results" / "07-gone.md").write_text("# Chapter 7\n\n" + pageguard.CHAPTER_PAGE + "*/run.json -->\n")
    (pages / "results" / "07-gone.csv").write_text("make target\n701-x\n")
    (pages / "tutorials").mkdir()
    tut = pages / "tutorials" / "07-gone.md"
    tut.write_text("<!-- megalab:table chapter=7 -->\nold\n<!-- /megalab:table -->\n")
    found = pageguard.losses(pages, chapters, frames, {tut: "x"})
    assert [(x.path, x.what) for x in found] == [("results/07-gone.md", "the page (no chapter writes it any more)"),
                                                 ("tutorials/07-gone.md", "the table of chapter 7")]
    assert pageguard.orphans(pages, chapters) == [pages / "results" / "07-gone.md", pages / "results" / "07-gone.csv"]


def test_an_orphan_page_is_refused_then_removed_with_force(pages, capsys):
    (pages / "results" / "07-gone.md").write_text("# Chapter 7\n\n" + pageguard.CHAPTER_PAGE + "*/run.json -->\n")
    (pages / "results" / "07-gone.csv").write_text("make target\n701-x\n")
    assert main(["tables", "--root", str(pages), "--check"]) == 1
    assert "out of date: results/07-gone.md" in capsys.readouterr().out
    assert main(["tables", "--root", str(pages)]) == 1
    assert "results/07-gone.md: the page (no chapter writes it any more)" in capsys.readouterr().err
    assert main(["tables", "--root", str(pages), "--force"]) == 0
    assert "removed results/07-gone.md" in capsys.readouterr().out
    assert not (pages / "results" / "07-gone.md").exists() and not (pages / "results" / "07-gone.csv").exists()


def test_a_quote_of_a_row_that_is_gone_is_an_error_unless_forced(pages, capsys):
    (pages / "tutorials").mkdir()
    tut = pages / "tutorials" / "09-x.md"
    tut.write_text("It takes <!-- q 999 | our ms -->1<!-- /q --> ms.\n")
    assert main(["tables", "--root", str(pages)]) == 1
    assert "quote '999 | our ms': no row '999'" in capsys.readouterr().err
    assert main(["tables", "--root", str(pages), "--force"]) == 0
    assert tut.read_text() == "It takes <!-- q 999 | our ms -->1<!-- /q --> ms.\n"  # kept as it was, and said
    assert "kept as it was (FORCE=1): mend the quote" in capsys.readouterr().out


def test_compare_writes_its_own_pages_as_they_come(tmp_path):
    """compare's pages are its scratch: a row of the outdir gone next time is no refusal there."""
    from megalab.results import compare

    out = tmp_path / "outdir"
    run = _write(out, "20250101_000000___" + T101, started="2026-01-01T00:00:00+00:00")
    compare.compare(out)
    shutil.rmtree(run)
    compare.compare(out)  # no WouldShrink


def test_make_plots_refuses_to_remove_a_figure_unless_forced(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FORCE", raising=False)
    folder = tmp_path / "results" / "plots"
    folder.mkdir(parents=True)
    (folder / "99-gone.svg").write_text("<svg/>")
    (tmp_path / "results" / "runs").mkdir()
    assert main(["plots", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "plots/99-gone.svg: the figure (no longer drawn)" in err and "FORCE=1 make plots" in err
    assert (folder / "99-gone.svg").exists()
    monkeypatch.setenv("FORCE", "1")
    assert main(["plots", "--root", str(tmp_path)]) == 0
    assert not (folder / "99-gone.svg").exists()
    assert plots.write_plots(tmp_path) == []  # make tables draws after its own judgement: force by default


# --------------------------------------------------------------------------- a catalog change in the same commit

def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(repo)})


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git checkout of configs/ whose catalog megalab reads, committed."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "configs", repo / "configs")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "catalog")
    monkeypatch.setattr(catalog, "CONFIGS", repo / "configs")
    for f in (catalog.models, catalog.chapters, catalog.catalog, catalog._chapter_files):
        f.cache_clear()
    yield repo
    for f in (catalog.models, catalog.chapters, catalog.catalog, catalog._chapter_files):
        f.cache_clear()


def test_the_catalog_change_not_yet_committed_explains_its_own_rows(checkout):
    assert pageguard.catalog_change() == (set(), set())
    path = checkout / "configs" / "experiments" / "01-dp-zero2.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["experiments"] = [e for e in doc["experiments"] if e["id"] != T101]  # 101 removed
    doc["experiments"][0]["about"] = "changed"  # the first left (104) changed
    path.write_text(yaml.safe_dump(doc))
    changed, gone = pageguard.catalog_change()
    assert changed == {T101, doc["experiments"][0]["id"]} and gone == set()
    rows = [pageguard.Loss("results/01-dp-zero2.md", "row 101", T101, 1),
            pageguard.Loss("results/01-dp-zero2.md", "111's `our ms` 250", T111, 1)]
    assert pageguard.unexplained(rows, (changed, gone)) == rows[1:]  # 111's entry is as HEAD has it
    # a chapter file removed: its page needs no FORCE; a tutorial's table always does (prose)
    (checkout / "configs" / "experiments" / "06-modern.yaml").unlink()
    changed, gone = pageguard.catalog_change()
    assert gone == {"results/06-modern.md"}
    page = pageguard.Loss("results/06-modern.md", "the page (no chapter writes it any more)")
    table = pageguard.Loss("tutorials/06-modern.md", "the table of chapter 6", None, 6)
    assert pageguard.unexplained([page, table], (changed, gone)) == [table]


def test_once_committed_the_catalog_change_needs_force(checkout):
    path = checkout / "configs" / "experiments" / "01-dp-zero2.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["experiments"] = [e for e in doc["experiments"] if e["id"] != T101]
    path.write_text(yaml.safe_dump(doc))
    _git(checkout, "commit", "-qam", "101 gone")
    assert pageguard.catalog_change() == (set(), set())
    row = pageguard.Loss("results/01-dp-zero2.md", "row 101", T101, 1)
    assert pageguard.unexplained([row], pageguard.catalog_change()) == [row]


def test_without_git_nothing_is_explained(tmp_path):
    assert pageguard.catalog_change(tmp_path) is None
    row = pageguard.Loss("results/01-dp-zero2.md", "row 101", T101, 1)
    assert pageguard.unexplained([row], None) == [row]


def _drop(checkout: Path, target: str) -> None:
    path = checkout / "configs" / "experiments" / "01-dp-zero2.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["experiments"] = [e for e in doc["experiments"] if e["id"] != target]
    path.write_text(yaml.safe_dump(doc))
    for f in (catalog.models, catalog.chapters, catalog.catalog, catalog._chapter_files):
        f.cache_clear()


def test_make_tables_drops_the_row_of_an_uncommitted_catalog_removal_but_not_a_committed_one(checkout, tmp_path,
                                                                                           capsys, monkeypatch):
    monkeypatch.delenv("FORCE", raising=False)
    pages = tmp_path / "pages"
    _write(pages / "results" / "runs", "r1")
    assert main(["tables", "--root", str(pages)]) == 0
    csv = pages / "results" / "01-dp-zero2.csv"
    assert T101 in csv.read_text()
    before = csv.read_bytes()
    _drop(checkout, T101)  # removed in the working tree, not committed: the pages go with it
    assert main(["tables", "--root", str(pages)]) == 0
    assert T101 not in csv.read_text()
    # the same removal committed first, then pages that still have the row: nothing explains the loss
    _git(checkout, "commit", "-qam", "101 gone")
    csv.write_bytes(before)
    capsys.readouterr()
    assert main(["tables", "--root", str(pages)]) == 1
    assert "results/01-dp-zero2.md: row 101" in capsys.readouterr().err and csv.read_bytes() == before


# --------------------------------------------------------------------------- tutorials and links (issue 60)

def test_a_tutorial_cut_short_or_without_a_region_head_has_is_a_loss(tmp_path):
    """Against HEAD (git decides): a tutorial emptied or cut, or one that lost a table, a quote or a check's
    verdict, is refused; a check's flags, the sentence's to change, and prose edits are not."""
    repo = tmp_path / "repo"
    tut = repo / "tutorials" / "01-x.md"
    tut.parent.mkdir(parents=True)
    text = ("Intro.\n<!-- megalab:table chapter=1 -->\nrows\n<!-- /megalab:table -->\nIt takes <!-- q 101 | our ms -->"
            "5<!-- /q --> ms. <!-- check c1 older -->PASS<!-- /check -->\nThe end.\n")
    tut.write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tutorial")
    found = {}
    for what, now in (("as committed", text), ("emptied", ""), ("cut", text[:60]),
                      ("quote gone", text.replace("<!-- q 101 | our ms -->5<!-- /q -->", "5")),
                      ("flags and prose changed", text.replace("c1 older", "c1 older fail").replace("Intro", "Hi"))):
        tut.write_text(now)
        found[what] = [loss.what for loss in pageguard._against_head(repo)]
    assert found == {"as committed": [], "emptied": ["its end (cut short against HEAD: 0 of 6 lines)"],
                     "cut": ["its end (cut short against HEAD: 3 of 6 lines)"],
                     "quote gone": ["the quote `101 | our ms` (HEAD has it)"], "flags and prose changed": []}
    assert [k for k, _ in pageguard._unclosed(text[:60])] == ["table"] and pageguard._unclosed(text) == []
