"""make campaign (megalab/harness/campaign.py): selection, pass-after-pass order, OOM not repeated, budget."""
import dataclasses

import pytest

from megalab.core import catalog
from megalab.core.records import RunRecord
from megalab.harness import campaign
from megalab.core.variables import LaunchError, Options


@pytest.fixture(autouse=True)
def _campaign_code_is_today(pin_campaign_code):
    """The committed campaign's runs as today's (tests/conftest.py), whatever changed in megalab/runtime since."""


def test_a_chapter_keeps_what_fits_and_names_what_does_not():
    run, skipped = campaign.by_gpus(campaign.choose([], 1), gpus_here=1)
    assert [e.id for e in run] == [e.id for e in catalog.catalog().values() if e.chapter == 1 and e.gpus == 1]
    assert ("104-gpt2xl-dp4-gbs4", "needs 4 GPUs, 1 here") in skipped


def test_passes_come_one_after_another():
    a, b = catalog.get("101"), catalog.get("111")
    assert [(p, e.id[:3]) for p, e in campaign.schedule([a, b], 2)] == [(1, "101"), (1, "111"), (2, "101"), (2, "111")]


def test_a_stale_row_is_topped_up_not_run_repeats_more_times():
    """A campaign stopped by BUDGET_S and started again (STALE=1) launches each row only what it lacks:
    on the rig, 004-006 with 2 ok runs each got 2 more instead of 1 (2026-11-23)."""
    a, b = catalog.get("101"), catalog.get("111")
    assert [(p, e.id[:3]) for p, e in campaign.schedule([a, b], 3, {a.id: 2})] == [
        (1, "111"), (2, "111"), (3, "101"), (3, "111")]
    launch, calls = _fake({})
    assert campaign.run([a, b], [], 3, Options(), launch=launch, have={a.id: 2, b.id: 1}) == 0
    assert [c[:3] for c in calls] == ["111", "101", "111"]


def _fake(statuses):
    calls = []

    def launch(exp, opts):
        calls.append(exp.id)
        status = statuses.get(exp.id, "ok")
        return ({"target": exp.id, "status": status, "step_ms_median": 100.0 + len(calls), "gpu_uuids": ["GPU-abc"]},
                None)
    return launch, calls


def test_an_oom_row_is_launched_once(capsys):
    launch, calls = _fake({"121-gpt2xl-dp1-gbs16-oom": "oom"})
    exps = [catalog.get("101"), catalog.get("121")]
    assert campaign.run(exps, [], 3, Options(), launch=launch) == 0
    assert calls.count("121-gpt2xl-dp1-gbs16-oom") == 1 and calls.count("101-gpt2xl-dp1-gbs1-bf16") == 3
    out = capsys.readouterr().out
    assert "101-gpt2xl-dp1-gbs1-bf16: 3 (ok, ok, ok) -> " in out and "one machine" in out


def test_the_budget_stops_new_launches_and_says_what_is_short(capsys):
    launch, calls = _fake({})
    ticks = iter([0, 0, 10, 20, 30, 40])
    rc = campaign.run([catalog.get("101")], [], 3, Options(), budget_s=15, launch=launch, clock=lambda: next(ticks))
    assert rc == 1 and len(calls) == 2
    out = capsys.readouterr().out
    assert "(short of 3)" in out and "BUDGET_S=15 spent" in out


def test_a_failed_launch_makes_the_campaign_fail():
    launch, _ = _fake({"101-gpt2xl-dp1-gbs1-bf16": "failed"})
    assert campaign.run([catalog.get("101")], [], 1, Options(), launch=launch) == 1


@pytest.mark.parametrize("env, match", [
    ({}, "nothing selected; fix"),
    ({"CHAPTER": "9"}, "no chapter 9; fix"),
    ({"CHAPTER": "-1"}, "CHAPTER=-1 must be at least 0; fix"),
    ({"GPUS": "2", "CHAPTER": "0"}, "GPUS= plans for GPUs that are not here, so it needs DRY_RUN=1; fix"),
    ({"CHAPTER": "1", "REPEATS": "0"}, "REPEATS=0 must be at least 1; fix"),
])
def test_bad_input_is_one_line(env, match):
    with pytest.raises(LaunchError, match=match):
        campaign.cli([], environ=env)


def test_a_launch_is_timed_from_committed_runs_else_the_estimate():
    durations = campaign.committed_durations()
    secs, source, once = campaign.launch_seconds(catalog.get("101"), Options(iters=25), durations)
    assert source.startswith("median of") and 20 < secs < 200 and not once
    # A record of ITERS=25 times a launch of ITERS=100 too: start-up once, the step 75 more times
    # (the default ITERS is 100; the committed campaigns ran 25, so a plain median underestimated 2x).
    longer, _, _ = campaign.launch_seconds(catalog.get("112"), Options(iters=100), durations)
    shorter, _, _ = campaign.launch_seconds(catalog.get("112"), Options(iters=25), durations)
    assert 75 * 1.2 < longer - shorter < 75 * 1.6  # 112 steps in about 1.4 s on the committed hosts
    never_run = catalog.get("612").model_copy(update={"id": "612-never-run"})
    secs, source, once = campaign.launch_seconds(never_run, Options(iters=25), durations)
    assert source.startswith("estimate:") and secs > campaign.STARTUP_GUESS_S and not once


def test_a_refused_launch_ends_the_campaign_after_saying_what_ran(capsys):
    launch, calls = _fake({})

    def refusing(exp, opts):
        if calls:
            raise LaunchError("GPU 0 is busy; fix: wait")
        return launch(exp, opts)
    with pytest.raises(LaunchError, match="busy"):
        campaign.run([catalog.get("101")], [], 3, Options(), launch=refusing)
    assert "101-gpt2xl-dp1-gbs1-bf16: 1 (ok)" in capsys.readouterr().out


def test_the_summary_says_how_far_the_machine_drifted_between_passes():
    """This session's H100 campaign: 101 86 -> 93 ms and 113 405 -> 425 ms from the first pass to the last."""
    def rec(target, status, ms=None):
        return RunRecord.of({"target": target, "status": status, "step_ms_median": ms})

    res = {"101": [rec("101", "ok", 86.0), rec("101", "ok", 93.0)],
           "113": [rec("113", "ok", 405.0), rec("113", "ok", 425.0)],
           "301": [rec("301", "oom")]}
    drift = [ln for ln in campaign.summary(res, [], 2) if "drift" in ln]
    assert drift == ["campaign   drift: last launch against the first, median over 2 targets +6.5% (from +4.9% to +8.1%)"]
    assert not [ln for ln in campaign.summary({"101": res["101"][:1]}, [], 1) if "drift" in ln]  # one pass: nothing


def test_stale_keeps_the_rows_short_of_repeats_todays_runs():
    a, b, c, d = (catalog.get(i) for i in ("101", "111", "121", "301"))
    today = {a.id: (3, False), b.id: (2, False), d.id: (0, True)}  # c: nothing of today's code
    assert [e.id[:3] for e in campaign.stale([a, b, c, d], 3, today)] == ["111", "121"]
    assert [e.id[:3] for e in campaign.stale([a, b, c, d], 2, today)] == ["121"]


def test_todays_runs_count_the_committed_campaign(before_triton_norm):
    """The committed runs of today's code and defaults: the seventh session of 2026-11-26 (device_norm in the
    default) ran three ok runs of 101 and four of 600 on one H100 (three more of each on a second), one of 300,
    301's out-of-memory run, and the two-GPU tour one run each on 2x H200; the eighth, after CUDA_GRAPH=auto gave
    111, 112 and 113 the graph, three of 111 and 112 and one of 113 on another H100, and the two- and four-GPU
    rows once each on 4x H100 (285 out of memory). 8-GPU rows never ran with today's code."""
    today = campaign.todays_runs()
    assert today[catalog.get("111").id] == (3, False)
    assert today[catalog.get("101").id] == (3, False)
    assert today[catalog.get("600").id] == (4, False)
    assert today[catalog.get("112").id] == (3, False)
    assert today[catalog.get("300").id] == (1, False)
    assert today[catalog.get("301").id] == (0, True)
    assert today[catalog.get("285").id] == (0, True)
    for row in ("002", "003", "005", "006", "212", "214", "304"):
        assert today[catalog.get(row).id] == (1, False)
    assert catalog.get("118").id not in today
    # 004 ran with the CUDA graph, which today's plan leaves off for sequence parallel with dropout
    assert catalog.get("004").id not in today


def test_todays_runs_are_the_one_h200_sessions_plain_launches():
    """Today's code (492756b, issue 59's and 63's runtime) ran on one H200 capped to 80 GB: 111, 600, 510 and 513 three
    times, 101, 113, 121, 211, 221, 231, 241 and 001 (uncapped) once; then on one 2x H200 (a0454da, the same runtime)
    302 three times and 002-006 (uncapped), 142, 152, 212, 312 and 601-604 once (004 with CUDA_GRAPH=0 and 604 with
    CUDA_GRAPH=1, what auto chooses for them today); nothing older counts as today's."""
    today = campaign.todays_runs()
    once = ("001", "101", "113", "121", "211", "221", "231", "241", "002", "003", "004", "005", "006", "142", "152",
            "212", "312", "601", "602", "603", "604")
    assert today == {catalog.get(t).id: n for t, n in
                     (("111", (3, False)), ("600", (3, False)), ("510", (3, False)), ("513", (3, False)),
                      ("302", (3, False)), *((t, (1, False)) for t in once))}


H100_RUN_BY_THE_CAMPAIGN = "GPU-c9a753b8-0000-0000-0000-000000000000"  # the first 13 characters name the machine


def _on_machine(monkeypatch, uuid: str) -> None:
    import socket

    from megalab.harness import monitor

    monkeypatch.setattr(monitor, "gpu_inventory", lambda: {"count": 1, "names": ["NVIDIA H100 80GB HBM3"],
                                                           "memory_mib": [81559], "uuids": [uuid]})
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")  # every rig machine's name
    monkeypatch.setenv("DRY_RUN", "1")  # Options.from_env reads the process environment: nothing may start
    monkeypatch.setenv("OUTDIR", "/nonexistent/outdir")  # only the committed runs count


def test_stale_selects_across_the_catalog_before_the_gpu_count(before_triton_norm, monkeypatch, capsys):
    _on_machine(monkeypatch, H100_RUN_BY_THE_CAMPAIGN)  # the H100 that ran chapter 1's one-GPU rows last
    assert campaign.cli([], environ={"STALE": "1", "CHAPTER": "1"}) == 0
    out = capsys.readouterr().out
    assert "on this machine (vm NVIDIA H100 80GB HBM3/GPU-c9a753b8-)" in out
    assert "113-gpt2xl-dp1-gbs15-zero2 (1 GPU(s))" in out  # 1 run of today's code: short of 3
    assert "112-gpt2xl-dp1-fit-80GB-GA4" not in out  # 3 runs: done, neither run nor named as skipped
    assert "122-gpt2xl-dp2-gbs32-zero2: skipped (needs 2 GPUs, 1 here)" in out


def test_stale_counts_the_runs_of_this_machine(before_triton_norm, monkeypatch, capsys):
    """Another H100: the chapter's rows are re-run here, so that its speedups and checks compare runs of one
    machine; today's out-of-memory rows (301, 285) stay done: memory does not depend on the machine's speed."""
    _on_machine(monkeypatch, "GPU-11111111-2222-3333-4444-555555555555")
    assert campaign.cli([], environ={"STALE": "1", "IDS": "111 112 301"}) == 0
    out = capsys.readouterr().out
    assert "2 of 3 target(s) short of 3" in out and "on this machine (vm NVIDIA H100 80GB HBM3/GPU-11111111-)" in out
    assert "111-gpt2xl-dp1-fit-80GB (1 GPU(s))" in out and "301-" not in out
    assert campaign.todays_runs(machine="vm NVIDIA H100 80GB HBM3/GPU-11111111-") == {
        catalog.get("301").id: (0, True), catalog.get("285").id: (0, True)}


def test_chapter_0_is_a_chapter(monkeypatch, capsys):
    """The two-GPU tour is chapter 0: `make campaign CHAPTER=0` must select it (it once said 'at least 1')."""
    monkeypatch.setenv("DRY_RUN", "1")
    assert campaign.cli([], environ={"CHAPTER": "0", "GPUS": "2", "REPEATS": "1"}) == 0
    out = capsys.readouterr().out
    assert "002-gpt2large-dp2-gbs64 (2 GPU(s))" in out and "x 1 pass(es) on the 2 GPU(s) here" in out


def test_a_dry_run_counts_an_out_of_memory_row_once(monkeypatch, capsys):
    monkeypatch.setenv("DRY_RUN", "1")
    assert campaign.cli([], environ={"IDS": "301 300", "GPUS": "1"}) == 0
    out = capsys.readouterr().out
    assert "301-cp1-gpt2-1.2B-gbs8-len4096-oom (1 GPU(s)): about" in out and "runs once" in out
    assert "for 4 launches" in out  # 300 three times, 301 once


def test_a_dry_run_for_gpus_elsewhere_plans_a_machine_with_no_runs(before_triton_norm, monkeypatch, capsys):
    """DRY_RUN=1 GPUS=N plans for another machine (the rig lends a fresh one each time): every row is short
    there, but today's out-of-memory row stays done."""
    monkeypatch.setenv("DRY_RUN", "1")
    assert campaign.cli([], environ={"STALE": "1", "IDS": "101 301", "GPUS": "1"}) == 0
    out = capsys.readouterr().out
    assert "1 of 2 target(s) short of 3" in out and "on a machine that has none of them yet" in out
    assert "101-gpt2xl-dp1-gbs1-bf16 (1 GPU(s))" in out and "301-" not in out


def test_stale_counts_the_runs_under_outdir_too(before_triton_norm, monkeypatch, tmp_path, capsys):
    """A campaign stopped by BUDGET_S goes on where it stopped: the runs it left under OUTDIR count."""
    import shutil

    from megalab.core.paths import ROOT

    _on_machine(monkeypatch, H100_RUN_BY_THE_CAMPAIGN)
    target = catalog.get("113").id
    gpu = H100_RUN_BY_THE_CAMPAIGN[:13]
    machine = f"vm NVIDIA H100 80GB HBM3/{gpu}"
    runs = sorted(d for d in (ROOT / "results" / "runs").glob(f"*___{target}")  # that machine's runs
                  if gpu in (d / "run.json").read_text())
    assert campaign.todays_runs(machine=machine)[target][0] == 1
    shutil.copytree(runs[-1], tmp_path / runs[-1].name)  # a run copied into results/runs and kept in OUTDIR
    assert campaign.todays_runs(machine=machine, outdir=tmp_path)[target][0] == 1
    for stamp in ("20991231_000000", "20991231_000100"):  # two more launches, left in OUTDIR
        shutil.copytree(runs[-1], tmp_path / f"{stamp}___{target}")
    assert campaign.todays_runs(machine=machine, outdir=tmp_path)[target][0] == 3
    monkeypatch.setenv("OUTDIR", str(tmp_path))
    assert campaign.cli([], environ={"STALE": "1", "IDS": "113"}) == 0
    assert "campaign   nothing to do" in capsys.readouterr().out
