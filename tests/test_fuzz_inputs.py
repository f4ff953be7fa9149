"""Issue 31's audit as a test: over a thousand damaged inputs, made deterministically from the committed files,
each read by every command that reads it, and not one traceback, hang, silent acceptance or lost page.

tests/fuzz_inputs.py makes the damage (run records and the logs, memory CSVs and TensorBoard files beside
them; the catalog, the model presets, checks.yaml, bench.yaml, the reference CSVs; every make variable)
and says what a right answer is; tests/fuzz_driver.py runs the commands in-process in a copy of the
repository (megalab.__main__.main: the CLI's own entry), all damaged records at once, every config damage
alone. `pytest -s -k audit tests/test_fuzz_inputs.py` prints the figures; `python tests/fuzz_inputs.py
--tree <commit>` audits another commit's code (--per-input: each damaged record alone, as the issue did).
A few answers are proved through the real CLI and make as well (subprocesses, at the end).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _tree_state() -> str:
    """What git sees of the checkout: the suite must leave it as it found it."""
    out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    before = _tree_state()
    base = tmp_path_factory.mktemp("fuzz")
    cases = fuzz_inputs.cases_for(list(fuzz_inputs.GROUPS))
    repo = fuzz_inputs.sandbox(base)
    results = fuzz_inputs.drive(repo, cases, timeout=900)
    return {"cases": cases, "results": results, "repo": repo, "base": base, "before": before}


def test_audit_figures_are_all_zero(audit):
    """Every figure of the audit: tried, tracebacks, hangs, silent acceptances, unclear refusals, pages lost."""
    figs = fuzz_inputs.figures(audit["cases"], audit["results"])
    print("\n" + fuzz_inputs.report(figs))
    bad = fuzz_inputs.failures(audit["cases"], audit["results"], limit=20)
    assert not bad, "\n".join(bad)
    total = sum((c for c in figs.values()), start=__import__("collections").Counter())
    assert all(total[k] == 0 for k in fuzz_inputs.KINDS), dict(total)


SECOND_ROUND = {"markup", "downgrade", "tutorials"}  # issue 60's families: a few inputs each, every one a family


def test_at_least_300_inputs_of_every_kind_are_tried(audit):
    figs = fuzz_inputs.figures(audit["cases"], audit["results"])
    inputs = {g: c["inputs"] for g, c in figs.items() if g != "settle"}
    assert sum(inputs.values()) >= 300, inputs
    assert set(inputs) == set(fuzz_inputs.GROUPS), inputs
    assert all(n >= (5 if g in SECOND_ROUND else 20) for g, n in inputs.items()), inputs
    # every reader of the records was asked, and every command of the variables' groups
    readers = {r["argv"][0] for r in audit["results"] if not r.get("settle")}
    assert {"tables", "check", "campaign", "plan", "compare", "refresh", "data-report", "bench-report", "integrity",
            "list", "targets", "run", "plots", "slurm", "docker-run", "show-command", "arguments", "bench",
            "batch"} <= readers


def test_every_family_of_hostile_text_reaches_a_page_escaped(audit):
    """The raw-markup figure counts only what reaches a page: each family's text must reach one (quoted, and
    escaped: the figure is 0), or the family tests nothing."""
    seen = set().union(*(r.get("quoted", []) for r in audit["results"] if r.get("quoted")))
    assert fuzz_inputs.QUOTED <= seen, sorted(fuzz_inputs.QUOTED - seen)


def test_every_damaged_record_is_named_by_every_reader_that_reads_it(audit):
    """A bad record is skipped by every reader with a line naming it (never used, never a crash): the
    batch answers name every bad file of the folders they read."""
    named = 0
    for r in audit["results"]:
        if r.get("mentions") and r.get("expect") == "skip":
            missing = [m for m in r["mentions"] if m not in r["stderr"]]
            assert not missing, (r["argv"], missing[:5])
            named += len(r["mentions"])
    assert named > 1000


def test_the_damage_is_the_same_every_time(audit):
    """Made again, the records' and the catalog's damage is the audit's."""
    a = [c for c in audit["cases"] if c["group"] in ("settle", "records", "catalog")]
    b = fuzz_inputs.cases_for(["records", "catalog"])
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_nothing_is_written_outside_the_sandbox(audit):
    assert _tree_state() == audit["before"]
    assert not (audit["base"] / "etc").exists()  # a chapter's `table: ../../etc/x.md` would have written there
    # the sandbox is as the settled pages left it: every case was undone
    assert not list((audit["repo"] / "results").glob("**/29990*"))


# --------------------------------------------------------------------------- the CLI and make, for real

def _env(tmp_path) -> dict[str, str]:
    """The commands' environment: none of this session's megalab or make settings, a home and caches of
    the test's own, FORCE=1 (the copy's first build may drop what the sandbox left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGALAB_", "MAKE"))}
    env.update(HOME=str(tmp_path / "home"), MEGALAB_CACHE_DIR=str(tmp_path / "cache"), FORCE="1",
               MPLCONFIGDIR=str(tmp_path / "mpl"))
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A sandbox whose pages `megalab tables` made (FORCE: the copy's first build may drop what the sandbox left
    out), once for the module's tests (one xdist group, tests/conftest.py), and its figure cache."""
    base = tmp_path_factory.mktemp("built")
    repo = fuzz_inputs.sandbox(base)
    subprocess.run([sys.executable, "-m", "megalab", "tables"], cwd=repo, env=_env(base), check=True,
                   capture_output=True)
    return base


@pytest.fixture
def sandbox(built, tmp_path):
    """A copy of `built` of the test's own (the pages name no path of theirs), two folders down as any sandbox."""
    repo = tmp_path / "sandbox" / "repo"
    shutil.copytree(built / "sandbox" / "repo", repo, symlinks=True)
    shutil.copytree(built / "cache", tmp_path / "cache", symlinks=True)  # figures, keyed by what they show
    env = _env(tmp_path)
    env.pop("FORCE")
    return repo, env


def _cli(repo, env, *argv, **more):
    return subprocess.run([sys.executable, "-m", "megalab", *argv], cwd=repo, env={**env, **more},
                          capture_output=True, text=True, timeout=300)


def test_the_cli_skips_a_bad_record_in_one_line(sandbox):
    repo, env = sandbox
    src = fuzz_inputs.sources(repo)[-1]
    bad = src.parent / "29990101_000000___101-gpt2xl-dp1-gbs1-bf16"
    shutil.copytree(src, bad)
    (bad / "run.json").write_text(json.dumps({**json.loads((src / "run.json").read_text()), "notes": 5}))
    for argv in (["tables"], ["check"], ["integrity", "--check"]):
        out = _cli(repo, env, *argv)
        lines = [ln for ln in out.stderr.splitlines() if bad.name in ln]
        assert "Traceback" not in out.stderr and len(lines) == 1 and "notes:" in lines[0] and "fix:" in lines[0], out.stderr


def test_make_refuses_a_broken_catalog_in_one_line(sandbox):
    repo, env = sandbox
    chapter = repo / "configs" / "experiments" / "01-dp-zero2.yaml"
    chapter.write_text(chapter.read_text().replace("gpus: 1, gbs: 1,", "gpus: 1, gbs: 1, mbs: 0,", 1))
    out = subprocess.run(["make", "-s", "101-gpt2xl-dp1-gbs1-bf16", f"PY={sys.executable}"], cwd=repo,
                         env={**env, "DRY_RUN": "1"}, capture_output=True, text=True, timeout=300)
    err = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("make")]
    assert out.returncode != 0 and len(err) == 1, out.stderr
    assert "01-dp-zero2.yaml" in err[0] and "mbs" in err[0] and "fix" in err[0] and "Traceback" not in out.stderr


def test_make_tables_refuses_to_lose_a_row_unless_forced(sandbox):
    """A run folder removed: its row would go from measured to not run; make tables says so in one line,
    writes nothing, and writes it all with FORCE=1."""
    repo, env = sandbox
    src = next(s for s in fuzz_inputs.sources(repo) if s.parent.name == "runs" and s.parent.parent.name == "results")
    shutil.rmtree(src)
    pages = {p: p.read_bytes() for p in (repo / "results").glob("*.*")}
    out = subprocess.run(["make", "-s", "tables", f"PY={sys.executable}"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=300)
    err = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("make")]
    assert out.returncode != 0 and len(err) == 1 and "would lose" in err[0] and "FORCE=1" in err[0], out.stderr
    assert {p: p.read_bytes() for p in pages} == pages
    out = subprocess.run(["make", "-s", "tables", f"PY={sys.executable}", "FORCE=1"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert {p: p.read_bytes() for p in pages} != pages


def test_a_tree_with_no_records_builds_its_pages_without_a_made_up_figure(tmp_path):
    """Every run folder gone (a fork starting afresh): the pages' commands answer, none with a traceback,
    and the estimator page says `no runs` where a figure would need one (no median of nothing)."""
    repo = fuzz_inputs.sandbox(tmp_path, runs=[])
    env = _env(tmp_path)
    for argv in (["tables"], ["check"], ["plan", "--validate"], ["integrity"], ["bench-report"]):
        out = _cli(repo, env, *argv)
        assert out.returncode in (0, 1) and "Traceback" not in out.stderr, (argv, out.stderr[-2000:])
    page = (repo / "results" / "estimate-vs-measured.md").read_text()
    assert "no runs" in page and "0/0 runs" not in page.split("\n", 1)[0]
