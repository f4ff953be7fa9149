"""Provenance of a table row (today's code and defaults, or not), STRICT tables, the spread across
repeated runs, and ratios only between runs of one host. Records here are invented (tmp_path)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from megalab.core import catalog, plan, variables
from megalab.core import provenance, records
from megalab.results import columns, tables
from megalab.core.records import RunRecord
from conftest import typed
from megalab.runtime import levers
from megalab.__main__ import main

T101 = "101-gpt2xl-dp1-gbs1-bf16"
T111 = "111-gpt2xl-dp1-fit-80GB"


def _rec(target: str = T101, commit: str | None = None, **kw) -> dict:
    cfg = {"transformer_impl": "local", "spec": "megalab", "fastpath": "fused_adam,foreach_norm,foreach_scale",
           "cuda_graph": False, "extra_args": "", "gpu_mem_gb": None, "model_preset": {}}
    cfg.update(kw.pop("config", {}))
    rec = {"schema": 2, "target": target, "status": "ok", "started": "2026-01-01T10:00:00+00:00",
           "step_ms_median": 100.0, "step_ms_p10": 99.0, "step_ms_p90": 101.0, "mem_peak_gib": [30.0],
           "gpu_name": "NVIDIA H100 80GB HBM3", "num_gpus": 1, "hostname": "hostA", "warmup_iters": 3,
           "config": cfg, "versions": {"megalab_commit": commit},
           "intent": _intent(target)}
    intent = kw.pop("intent", {})
    if intent is None:
        rec["intent"] = None
    else:
        rec["intent"].update(intent)
    rec.update(kw)
    return rec


def _intent(target: str, cuda_graph: str = "auto") -> dict:
    """What today's launcher plans for the target on an 80 GB H100 (provenance re-plans and compares)."""
    machine = plan.Machine(gpus=1, te=None, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.6)
    if target not in catalog.catalog():  # a made-up target (table tests): nothing to re-plan
        return {"argv": []}
    opts = plan.Options(master_port=29500, cuda_graph=cuda_graph)
    return plan.build(catalog.get(target), opts, machine, run_dir=Path("/runs/x")).intent().model_dump(mode="json")


def test_a_record_whose_plan_today_differs_is_older(repo):
    head = _git(repo, "rev-parse", "HEAD")
    rec = _rec(commit=head)
    rec["intent"]["argv"] = [*rec["intent"]["argv"], "--seed", "7"]  # a flag today's plan no longer gives
    assert provenance.of(RunRecord.of(rec), repo).cell == "older (today's plan differs (flags or CUDA graph))"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git tree with one commit of run code."""
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "megalab" / "runtime").mkdir(parents=True)
    (tmp_path / "megalab" / "runtime" / "x.py").write_text("a = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    provenance._code_state.cache_clear()
    return tmp_path


def test_defaults_mirror_the_launcher():
    assert next(v for v in variables.VARIABLES if v.name == "WARMUP").default == provenance.DEFAULT_WARMUP


def test_schema_1_is_older_without_asking_git(tmp_path):
    rec = _rec(schema=1, intent=None)
    assert provenance.of(RunRecord.of(rec), tmp_path).cell == "older (schema 1)"


@pytest.mark.parametrize("change, why", [
    ({"config": {"fastpath": "none"}, "intent": {"fastpath": "none", "cuda_graph_reason": "auto"}}, "FAST=none"),
    ({"intent": {**_intent(T101, "0"), "fastpath": list(levers.default(None, {}))}}, "CUDA_GRAPH=0"),
    ({"config": {"extra_args": "--foo"}}, "EXTRA_ARGS"),
    ({"warmup_iters": 5, "iters_logged": 25}, "WARMUP=5"),  # a record from before the setting was kept
    ({"config": {"warmup": 0}}, "WARMUP=0"),
])
def test_other_defaults_are_older(repo, change, why):
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.of(RunRecord.of(_rec(commit=head)), repo).state == provenance.CURRENT
    assert provenance.of(RunRecord.of(_rec(commit=head, **change)), repo).cell == f"older ({why})"


def test_a_forced_graph_that_auto_would_choose_is_today(repo):
    """CUDA_GRAPH=1 where auto turns the graph on too launches what plain `make` does: the row's run."""
    head = _git(repo, "rev-parse", "HEAD")
    forced = _rec(commit=head, intent={**_intent(T101, "1"), "fastpath": list(levers.default(None, {}))})
    assert forced["intent"]["cuda_graph_reason"] == "CUDA_GRAPH=1"
    assert provenance.of(RunRecord.of(forced), repo).cell == "today"


@pytest.mark.parametrize("rec", [
    {"status": "oom", "warmup_iters": 0, "iters_logged": 0, "step_ms_median": None},  # no step to drop
    {"status": "oom", "warmup_iters": 0, "iters_logged": 0, "config": {"warmup": 3}},
    {"warmup_iters": 1, "iters_logged": 3},  # fewer steps than WARMUP: all kept, and that is no setting
])
def test_a_run_with_no_steps_to_drop_is_not_a_warmup_change(repo, rec):
    """warmup_iters counts the steps dropped: an OOM before the first step drops none under the default."""
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.of(RunRecord.of(_rec(commit=head, **rec)), repo).state == provenance.CURRENT


def test_moe_default_adds_grouped_gemm_and_the_moe_levers():
    rec = RunRecord.of(_rec(config={"num_experts": 8, "model_preset": {"moe_grouped_gemm": True}}))
    assert provenance.default_fastpath(rec)[-4:] == ("grouped_gemm", "moe_gather", "expert_stack", "moe_act")


def test_code_changed_since_the_record_is_older(repo):
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("docs only\n")  # not run code: still current
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "docs")
    assert provenance.of(RunRecord.of(_rec(commit=old)), repo).state == provenance.CURRENT
    (repo / "megalab" / "runtime" / "x.py").write_text("a = 2\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "code")
    provenance._code_state.cache_clear()
    assert provenance.of(RunRecord.of(_rec(commit=old)), repo).cell == "older (run code changed since (x.py))"


def test_no_git_or_unknown_commit_is_unknown(tmp_path, repo):
    assert provenance.of(RunRecord.of(_rec(commit="abc1234")), tmp_path / "nogit").state == provenance.UNKNOWN
    assert provenance.of(RunRecord.of(_rec(commit="0" * 40)), repo).state == provenance.UNKNOWN


def _write(root: Path, name: str, rec: dict) -> None:
    d = root / "results" / "runs" / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(rec))


def test_strict_tables_refuse_rows_not_from_today(repo, capsys):
    head = _git(repo, "rev-parse", "HEAD")
    _write(repo, "a", _rec(commit=head))
    _write(repo, "b", _rec(T111, schema=1, intent=None))
    assert main(["tables", "--root", str(repo), "--strict"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "1 row(s)" in err and "older (schema 1): 111" in err and "101" not in err.split("fix")[0]
    assert not (repo / "results" / "01-dp-zero2.md").exists()  # refused: nothing written


def test_page_marks_each_row_and_has_the_legend(repo):
    head = _git(repo, "rev-parse", "HEAD")
    recs = {T101: _rec(commit=head), T111: _rec(T111, schema=1, intent=None)}
    text = tables.render_chapter(1, typed(recs), tree=repo)
    row = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| R")}
    assert "| today " in row[T101] and "| older (schema 1) " in row[T111]
    assert provenance.LEGEND in text and "Unit: every memory figure on this page is GiB" in text


def test_repeats_give_median_of_medians_and_range(tmp_path):
    runs = tmp_path / "runs"
    for i, ms in enumerate((100.0, 130.0, 110.0)):
        d = runs / f"r{i}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(_rec(commit="c1c1", step_ms_median=ms,
                                                    started=f"2026-01-0{i + 1}T10:00:00+00:00")))
    other = runs / "r9"  # another host: not a repeat of the same measurement
    other.mkdir()
    (other / "run.json").write_text(json.dumps(_rec(commit="c1c1", step_ms_median=500.0, hostname="hostB",
                                                    started="2025-12-01T10:00:00+00:00")))
    rec = records.load_records(runs)[T101]
    assert rec.runs.n == 3 and (rec.runs.lo_ms, rec.runs.hi_ms) == (100.0, 130.0)
    assert rec.measured[0] == 110.0  # median of the three medians, not the newest (110 by chance)
    rec = rec.grouped(rec.runs.model_copy(update={"median_ms": 111.0}))
    r = {c: v for c, v in tables.table_frame(1, {T101: rec}).set_index("make target").loc[T101].items()}
    assert (r["our ms"], r["runs"]) == ("111", "3 (100–130)")


def test_ratios_only_between_runs_of_one_host():
    exps = [catalog.Experiment(id="211-weak-tp1", chapter=2, about="", model="gpt2-large", gpus=1, gbs=8, ref="R1"),
            catalog.Experiment(id="212-weak-tp2", chapter=2, about="", model="gpt2-xl", gpus=2, gbs=8, tp=2, ref="R2")]
    recs = {"211-weak-tp1": _rec("211-weak-tp1", step_ms_median=100.0),
            "212-weak-tp2": _rec("212-weak-tp2", step_ms_median=125.0, hostname="hostB")}
    df = tables.table_frame(2, typed(recs), exps=exps).set_index("make target")
    assert df.loc["212-weak-tp2", "weak eff."] == f"77% / {columns.UNLIKE}"
    recs["212-weak-tp2"]["hostname"] = "hostA"
    df = tables.table_frame(2, typed(recs), exps=exps).set_index("make target")
    assert df.loc["212-weak-tp2", "weak eff."] == "77% / 80%"


def test_checks_compare_runs_of_one_host_only():
    from megalab.results import checks

    claim = next(c for c in checks.load_claims() if c.id == "ch0-dp-step-flat")
    a, b = claim.reads
    known = catalog.catalog()
    recs = {a: _rec(a, step_ms_median=100.0), b: _rec(b, step_ms_median=100.0, hostname="hostB")}
    for r in recs.values():
        r["config"] = {}
    res = checks.evaluate(claim, typed(recs), known)
    assert res.status == checks.NOT_RUN and res.why.startswith("unlike runs, machine: ")
    assert "H100x1-noid on hostA" in res.why and "H100x1-noid on hostB" in res.why
    recs[b]["hostname"] = "hostA"
    assert checks.evaluate(claim, typed(recs), known).status == checks.PASS


def test_checks_read_the_rows_runs_and_no_other(tmp_path):
    """The newest rows ran on two hosts; an older like pair on hostA is not read in their place (a verdict and
    the table row beside it come from the same runs): the claim refuses, naming the difference, and its basis
    is the rows' runs once they are like."""
    from megalab.results import checks

    claim = next(c for c in checks.load_claims() if c.id == "ch0-dp-step-flat")  # ratio b / a in 0.9-1.1
    a, b = claim.reads
    known = catalog.catalog()
    runs = tmp_path / "results" / "runs"
    for name, target, host, ms, day in (("a-old", a, "hostA", 100.0, 1), ("b-A", b, "hostA", 105.0, 2),
                                        ("a-new", a, "hostB", 100.0, 3), ("b-C", b, "hostC", 150.0, 4)):
        (runs / name).mkdir(parents=True)
        (runs / name / "run.json").write_text(json.dumps(_rec(target, commit="c1c1", step_ms_median=ms, hostname=host,
                                                          started=f"2026-01-0{day}T10:00:00+00:00", config={})))
    newest = records.load_records(runs)
    res = checks.evaluate(claim, newest, known)
    assert res.status == checks.NOT_RUN and "H100x1-noid on hostB" in res.why and "H100x1-noid on hostC" in res.why
    (runs / "b-B").mkdir()
    (runs / "b-B" / "run.json").write_text(json.dumps(_rec(b, commit="c1c1", step_ms_median=110.0, hostname="hostB",
                                                        started="2026-01-05T10:00:00+00:00", config={})))
    res = checks.evaluate(claim, records.load_records(runs), known)
    assert res.status == checks.PASS and res.measured.startswith("1.100")  # hostB's rows, 110 / 100
    assert res.basis.folders == ((a[:3], ("a-new",)), (b[:3], ("b-B",)))


def test_bench_and_data_ratios_only_between_runs_of_one_host():
    from megalab.results import benchreport, datareport

    a = RunRecord.of({"target": T101, "status": "ok", "step_ms_median": 200.0, "hostname": "hostA"})
    b = RunRecord.of({"target": T101, "status": "ok", "step_ms_median": 100.0, "hostname": "hostA"})
    assert benchreport._speedup(a, b) == "2.00x" and datareport._ratio(a, b, 50257) == "2.00x"
    b = b.model_copy(update={"hostname": "hostB"})
    assert benchreport._speedup(a, b) == "≠host" and datareport._ratio(a, b, 50257) == "≠host"


def test_the_checkouts_path_is_not_a_decision(repo):
    """A record made in one checkout (the rig's copy) is today's in another (a fresh clone)."""
    head = _git(repo, "rev-parse", "HEAD")
    rec = _rec(commit=head)
    rec["intent"]["argv"] = [a.replace(str(plan.ROOT), "/elsewhere/megalab") for a in rec["intent"]["argv"]]
    assert any(a.startswith("/elsewhere/megalab") for a in rec["intent"]["argv"])
    assert provenance.of(RunRecord.of(rec), repo).state == provenance.CURRENT


def test_a_feature_file_counts_only_for_runs_that_use_it(repo):
    """Changing context parallelism's attention leaves a CP=1 record current, a CP=2 record older."""
    (repo / "megalab" / "runtime" / "cp_attention.py").write_text("v = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "cp")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "megalab" / "runtime" / "cp_attention.py").write_text("v = 2\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "cp faster")
    provenance._code_state.cache_clear()
    assert provenance.of(RunRecord.of(_rec(commit=old)), repo).state == provenance.CURRENT  # _rec: CP=1
    cp2 = _rec(commit=old)
    cp2["config"]["cp"] = 2
    assert provenance.of(RunRecord.of(cp2), repo).cell == "older (run code changed since (cp_attention.py))"


def test_without_git_a_run_of_the_trees_own_commit_is_todays_code(monkeypatch, repo):
    """On the GPU rig the tree has no .git of ours and MEGALAB_COMMIT names its commit: a run made there from it
    is today's code (so `make campaign STALE=1` there counts the runs it just made); another commit is unknown.
    Where git can compare, git decides: a leftover MEGALAB_COMMIT of an older commit does not make it today's."""
    def state(commit, root=plan.ROOT):
        provenance._code_state.cache_clear()  # the cache does not know git.run was patched
        return provenance.code_state(commit, root)

    try:
        monkeypatch.setattr(provenance.git, "run", lambda root, *args: None)  # no git here
        monkeypatch.setenv("MEGALAB_COMMIT", "abc1234")
        assert state("abc1234") == (provenance.CURRENT, "")
        assert state("def5678") == (provenance.UNKNOWN, "no git")
        monkeypatch.delenv("MEGALAB_COMMIT")
        assert state("abc1234") == (provenance.UNKNOWN, "no git")
        monkeypatch.undo()  # this clone's git, which has no commit abc1234 (the rig's stale copy of a .git)
        monkeypatch.setenv("MEGALAB_COMMIT", "abc1234")
        assert state("abc1234") == (provenance.CURRENT, "")
        monkeypatch.delenv("MEGALAB_COMMIT")
        assert state("abc1234") == (provenance.UNKNOWN, "commit abc1234 not in this clone")
        # a commit git knows, older than HEAD in run code: git's answer stands, whatever MEGALAB_COMMIT says
        first = _git(repo, "rev-parse", "HEAD")
        (repo / "megalab" / "runtime" / "x.py").write_text("a = 2\n")
        _git(repo, "commit", "-qam", "two")
        monkeypatch.setenv("MEGALAB_COMMIT", first)
        older = state(first, repo)
        monkeypatch.delenv("MEGALAB_COMMIT")
        assert older == state(first, repo) and older[0] == provenance.OLDER
    finally:
        provenance._code_state.cache_clear()


def test_older_commits_with_the_same_run_code_are_one_code(repo):
    """code_key: commits whose run code (megalab/runtime) is the same are one code, whatever else changed;
    a change to a feature file the run did not use (CP attention, for a CP=1 run) does not split them."""
    runtime = repo / "megalab" / "runtime"
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("docs only\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "docs")
    docs = _git(repo, "rev-parse", "HEAD")
    (runtime / "cp_attention.py").write_text("ring = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "cp")
    cp = _git(repo, "rev-parse", "HEAD")
    (runtime / "x.py").write_text("a = 2\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "run code")
    provenance._code_content.cache_clear()
    keys = {c: provenance.code_key(RunRecord.of(_rec(commit=c)), repo) for c in (first, docs, cp)}
    assert keys[first] == keys[docs] != provenance.CURRENT and keys[first].startswith("code ")
    assert keys[cp] == keys[first]  # cp_attention.py is not this CP=1 run's code
    def cp2_run(commit):  # a CP=2 run executes cp_attention.py: the change splits its code
        return provenance.code_key(RunRecord.of(_rec(commit=commit, config={"cp": 2})), repo)

    assert cp2_run(cp) != cp2_run(first)
    assert provenance.code_key(RunRecord.of(_rec(commit=_git(repo, "rev-parse", "HEAD"))), repo) == provenance.CURRENT


def test_a_lever_and_its_base_at_one_commit_share_one_code_after_the_levers_file_changes(repo):
    """A trial's two sides ran one commit: once the lever's own file changes, code_key splits them (the base
    never ran the file), shared_code_key, over the files either side ran, does not; the old and the new
    version of the file stay two codes."""
    norm = repo / "megalab" / "runtime" / "norm.py"
    norm.write_text("v = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "norm")
    old = _git(repo, "rev-parse", "HEAD")
    norm.write_text("v = 2\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "norm faster")
    new = _git(repo, "rev-parse", "HEAD")
    provenance._code_state.cache_clear()
    provenance._code_content.cache_clear()
    base, lever = "fused_adam", "fused_adam,compiled_norm"
    side = {f: RunRecord.of(_rec(commit=old, config={"fastpath": f})) for f in (base, lever)}
    assert provenance.code_key(side[base], repo) != provenance.code_key(side[lever], repo)
    both = {"compiled_norm", "fused_adam"}
    assert provenance.shared_code_key(side[base], both, repo) == provenance.shared_code_key(side[lever], both, repo)
    today = RunRecord.of(_rec(commit=new, config={"fastpath": lever}))
    assert provenance.shared_code_key(today, both, repo) != provenance.shared_code_key(side[lever], both, repo)


def test_the_compiled_norm_file_counts_only_for_runs_with_the_lever():
    """megalab/runtime/norm.py runs only under FAST=...,compiled_norm (or all): a change to it leaves other runs'
    code as it was, and does not for a run that used it."""
    def unused(fast):
        return provenance.unused_files(RunRecord.of(_rec(config={"fastpath": fast})).config)

    norm = "megalab/runtime/norm.py"
    assert norm in unused("fused_adam,device_norm") and norm in unused(None)
    assert norm not in unused("fused_adam,compiled_norm") and norm not in unused("all")
    assert norm in unused("compiled_norms")  # a name, not a prefix
    # a retired lever's deleted file and a new opt-in lever's file count only for the runs that used them
    assert "megalab/runtime/zero_overlap.py" in unused("fused_adam") and "megalab/runtime/liger_norm.py" in unused(None)
    assert "megalab/runtime/liger_norm.py" not in unused("fused_adam,liger_norm")


def test_a_machine_without_a_gpu_uuid_is_also_known_by_its_gpu_count():
    """Every rig machine is called `vm`: without a UUID, a 2x and an 8x H200 host would be one machine."""
    two = RunRecord.of(_rec(hostname="vm", gpus_on_node=2, num_gpus=2))
    eight = RunRecord.of(_rec(hostname="vm", gpus_on_node=8, num_gpus=8))
    assert provenance.host_key(two) == provenance.host_key(eight)
    assert provenance.machine_of(two) != provenance.machine_of(eight)
    assert provenance.comparable_key(two) != provenance.comparable_key(eight)
    uuid = RunRecord.of(_rec(hostname="vm", gpus_on_node=2, gpu_uuids=["GPU-446032a4-0000"]))
    assert provenance.machine_of(uuid) == provenance.host_key(uuid)  # the UUID names the machine


def test_a_record_is_dirty_only_where_its_run_code_differs_from_the_commit(monkeypatch, repo):
    """`-dirty` marks what provenance compares (CODE_PATHS): a page `make tables` rewrote, or committed records a
    copied tree (the GPU rig's) left out, leave the record at its commit; an edit to run code makes it -dirty, and
    such a record's code is unknown, named as uncommitted rather than as a commit this clone lacks."""
    from megalab.harness import record

    monkeypatch.delenv("MEGALAB_COMMIT", raising=False)
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "results").mkdir()
    (repo / "results" / "page.md").write_text("a page\n")
    (repo / "README.md").write_text("docs\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pages")
    head = _git(repo, "rev-parse", "HEAD")
    assert record._git_commit(repo) == head
    (repo / "results" / "page.md").unlink()  # a tree copied without its records
    (repo / "README.md").write_text("rebuilt\n")  # a page rewritten
    assert record._git_commit(repo) == head
    (repo / "megalab" / "runtime" / "x.py").write_text("a = 3\n")  # the run code itself
    dirty = record._git_commit(repo)
    assert dirty == head + "-dirty"
    provenance._code_state.cache_clear()
    assert provenance.code_state(dirty, repo) == (
        provenance.UNKNOWN, f"run code changed before the run, uncommitted ({head[:7]}-dirty)")


def test_a_records_commit_comes_from_git_with_a_timeout_or_from_megalab_commit(monkeypatch):
    """record._git_commit asks git through core/git.py (a timeout, no exception): where git cannot answer (not
    installed, hung, no .git) the record says None instead of the run hanging; MEGALAB_COMMIT names it on a rig."""
    import subprocess

    from megalab.core import git
    from megalab.harness import record

    monkeypatch.delenv("MEGALAB_COMMIT", raising=False)
    head = git.run(record.ROOT, "rev-parse", "HEAD").stdout.strip()
    assert record._git_commit() in (head, head + "-dirty")
    class Hang(BaseException):
        """What a call without a timeout would do: never return (no `except Exception` stops it)."""

    def hung_git(*a, **k):  # a git that never answers: only a call with a timeout comes back
        if not k.get("timeout"):
            raise Hang
        raise subprocess.TimeoutExpired("git", k["timeout"])

    monkeypatch.setattr(subprocess, "run", hung_git)
    assert record._git_commit() is None  # timed out: no commit, no crash
    monkeypatch.setenv("MEGALAB_COMMIT", "abc1234")
    assert record._git_commit() == "abc1234"
