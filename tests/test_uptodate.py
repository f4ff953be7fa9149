"""`make tables` with nothing to do is skipped (megalab/results/uptodate.py), and any change to what a build
reads builds again: a new record, an edited catalog, a new commit, a page deleted or edited, a file rewritten
within its mtime's tick; --check, STRICT and FORCE always build, and a build that said a note is not remembered.
Correctness only: how fast the skip is, benchmarks/everyday_commands.py measures."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from megalab.__main__ import main
from megalab.core import catalog
from megalab.core.paths import ROOT
from megalab.results import tables, uptodate
from tests.test_pageguard import _write

T101 = "101-gpt2xl-dp1-gbs1-bf16"
SKIPPED = "no input changed since the last build"


def _record(root: Path, name: str, target: str = T101, **fields) -> Path:
    return _write(root / "results" / "runs", name, target, **fields)  # test_pageguard's fixture record


def _tables(root: Path, capsys, *argv: str) -> str:
    assert main(["tables", "--root", str(root), *argv]) == 0
    return capsys.readouterr().out


@pytest.fixture
def built(tmp_path, capsys, monkeypatch):
    """A root with one row measured, its pages built once (and so remembered)."""
    monkeypatch.delenv("STRICT", raising=False)
    monkeypatch.delenv("FORCE", raising=False)
    _record(tmp_path, "r1")
    assert SKIPPED not in _tables(tmp_path, capsys)
    return tmp_path


def test_a_build_with_nothing_to_do_is_skipped_and_every_change_builds_again(built, capsys):
    assert SKIPPED in _tables(built, capsys)
    _record(built, "r2", target="111-gpt2xl-dp1-fit-80GB", started="2025-03-05T10:00:00+00:00")  # a new record
    out = _tables(built, capsys)
    assert SKIPPED not in out and "wrote results/01-dp-zero2.md" in out
    assert SKIPPED in _tables(built, capsys)
    page = built / "results" / "01-dp-zero2.md"
    page.unlink()  # a page deleted
    assert SKIPPED not in _tables(built, capsys) and page.exists()
    page.write_text(page.read_text() + "edited by hand\n")  # a page edited
    assert SKIPPED not in _tables(built, capsys) and "edited by hand" not in page.read_text()


@pytest.mark.parametrize("argv,env", [(["--check"], {}), (["--force"], {}), ([], {"FORCE": "1"})])
def test_check_and_force_always_build(built, capsys, monkeypatch, argv, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert SKIPPED not in _tables(built, capsys, *argv)


def test_strict_always_builds(built, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(tables, "main", lambda args: calls.append(args.strict) or 0)
    monkeypatch.setenv("STRICT", "1")
    assert main(["tables", "--root", str(built)]) == 0 and calls == [False]  # STRICT from the environment
    monkeypatch.delenv("STRICT")
    assert main(["tables", "--root", str(built), "--strict"]) == 0 and calls == [False, True]


def test_a_build_that_said_a_note_or_a_warning_is_not_remembered(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("STRICT", raising=False)
    monkeypatch.delenv("FORCE", raising=False)
    for note in ("megalab tables: tutorials/x.md:3: `c` is FAIL and the sentence does not say so\n", None):
        uptodate.stamp_path(tmp_path).unlink(missing_ok=True)

        def build(args, note=note):
            print("tables up to date (7 files)")
            if note:
                print(note, end="")
            else:
                import sys
                print("UserWarning: something", file=sys.stderr)
            return 0
        monkeypatch.setattr(tables, "main", build)
        assert main(["tables", "--root", str(tmp_path)]) == 0
        assert uptodate.built(tmp_path) is None
    monkeypatch.setattr(tables, "main", lambda args: print("wrote results/01-dp-zero2.md") or 0)
    assert main(["tables", "--root", str(tmp_path)]) == 0
    assert uptodate.built(tmp_path) is not None  # a report alone: remembered
    monkeypatch.setattr(tables, "main", lambda args: 1)
    uptodate.stamp_path(tmp_path).unlink()
    assert main(["tables", "--root", str(tmp_path)]) == 1 and uptodate.built(tmp_path) is None  # a refusal


# ---- the fingerprint, without a build ----------------------------------------------------------------------

def test_the_inputs_are_the_pages_root_the_catalog_and_the_code(tmp_path):
    folders = uptodate.inputs(tmp_path)
    for need in (tmp_path / "results", tmp_path / "tutorials", Path(catalog.CONFIGS), ROOT / "megalab"):
        assert need.resolve() in folders


def test_an_edited_catalog_builds_again(tmp_path, monkeypatch):
    configs = tmp_path / "configs-copy"
    shutil.copytree(catalog.CONFIGS, configs)
    monkeypatch.setattr(catalog, "CONFIGS", configs)
    (tmp_path / "results").mkdir()
    uptodate.remember(tmp_path, 7)
    assert uptodate.built(tmp_path) == 7
    chapter = next((configs / "experiments").glob("*.yaml"))
    chapter.write_text(chapter.read_text() + "\n# edited\n")
    assert uptodate.built(tmp_path) is None


def test_a_new_commit_builds_again(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "one")
    uptodate.remember(tmp_path, 7)
    assert uptodate.built(tmp_path) == 7
    git("commit", "-q", "--allow-empty", "-m", "two")  # no file changed: provenance is judged against HEAD
    assert uptodate.built(tmp_path) is None


def test_a_file_rewritten_within_its_mtime_is_known_by_content(tmp_path):
    rec = _record(tmp_path, "r1") / "run.json"
    uptodate.remember(tmp_path, 7)
    assert uptodate.built(tmp_path) == 7
    st = rec.stat()
    rec.write_text(rec.read_text().replace("250.0", "251.0"))  # same size
    os.utime(rec, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime, as a coarse clock would leave it
    assert uptodate.built(tmp_path) is None


def test_a_removed_record_a_new_file_and_megalab_commit_build_again(tmp_path, monkeypatch):
    d = _record(tmp_path, "r1")
    uptodate.remember(tmp_path, 7)
    (tmp_path / "tutorials").mkdir()
    (tmp_path / "tutorials" / "new.md").write_text("x\n")
    assert uptodate.built(tmp_path) is None
    uptodate.remember(tmp_path, 7)
    shutil.rmtree(d)
    assert uptodate.built(tmp_path) is None
    uptodate.remember(tmp_path, 7)
    monkeypatch.setenv("MEGALAB_COMMIT", "abc1234")
    assert uptodate.built(tmp_path) is None


@pytest.mark.parametrize("damage", ["", "{", '{"digest": 3}', "[]", '{"digest": "x", "racy": [], "chapters": 7}'])
def test_a_missing_or_damaged_stamp_builds(tmp_path, damage):
    path = uptodate.stamp_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(damage)
    assert uptodate.built(tmp_path) is None
