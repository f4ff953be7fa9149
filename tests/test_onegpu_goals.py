"""The bench page's "One GPU, past the reference" (megalab/results/onegpu_goals.py) and the trials of configurations
that are not catalog rows: every figure from the committed records, a goal judged only on enough launches."""
import copy

import pytest

from megalab.core import benchruns
from megalab.results import benchreport, fast_by_default, onegpu_goals
from tests.conftest import BEFORE_GRID_TUNING, GRID_TUNING_COMMIT, PIPELINED_COMMIT, TRITON_NORM_COMMITS


def _cfg():
    return benchruns.load_config()


@pytest.fixture(scope="module")
def trials():
    """The levers-tried rows of the committed bench.yaml (its trials and levers), read once for the tests that read
    them as committed (a read is every committed record and a log per pair); a test that changes either reads its own."""
    return benchreport.trial_rows(_cfg(), benchruns.BENCH_DIR)


def _by_target(rows):
    out = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


def test_goal_rows_come_from_todays_runs_one_row_per_machine(before_triton_norm):
    rows = _by_target(onegpu_goals.goal_rows(_cfg()))
    # the seventh session's launches, device_norm in the default, on two H100s, and the eighth's of 111 and 112
    # with the CUDA graph (CUDA_GRAPH=auto's new room) on a third: each machine with 3 launches or more is a row
    # of its own, named, and judged on its own; 111's and 112's launches without the graph are older now
    (a111,), (r112,) = rows["111-gpt2xl-dp1-fit-80GB"], rows["112-gpt2xl-dp1-fit-80GB-GA4"]
    assert a111[2].startswith("348 (3 runs") and a111[-1] == "missed (1x H100 80GB GPU-c9a753b8)"  # not 330
    assert a111[7] == "46.8K tok/s (328 ms)"  # llm.c's bar at 111's 15 x 1024 tokens
    assert r112[2].startswith("1339 (3 runs") and r112[-1].startswith("missed")  # 45.5% MFU, not 48%
    # 600's 45% MFU: missed on the slower card (44.1%), met on the other (45.1%): the check can go either way
    (a600, b600) = rows["600-llama1b-1gpu-gbs8"]
    assert a600[2].startswith("294 (4 runs") and a600[-1].startswith("missed (1x H100 80GB GPU-1633b835")
    assert b600[2].startswith("287 (3 runs") and b600[-1].startswith("met (1x H100 80GB GPU-177d0ba1")
    assert [r[-1].split(" (")[0] for r in rows["101-gpt2xl-dp1-gbs1-bf16"]] == ["met", "met"]  # 58 and 57 ms
    assert not any("older" in r[-1] for rs in rows.values() for r in rs)


def test_a_machine_short_of_launches_has_no_row_beside_one_with_enough(before_triton_norm):
    """111's single launch of the sixth session's code stays out; where no machine has enough, the one with the
    most launches is the row, with no verdict."""
    cfg = copy.deepcopy(_cfg())
    cfg["past_reference"]["min_runs"] = 4
    rows = _by_target(onegpu_goals.goal_rows(cfg))
    (r600,) = rows["600-llama1b-1gpu-gbs8"]  # the one machine with 4
    assert r600[2].startswith("294 (4 runs")
    (r111,) = rows["111-gpt2xl-dp1-fit-80GB"]
    assert r111[-1].startswith("no verdict: 3 launches")


def test_without_todays_run_code_the_newest_codes_launches_are_marked_older(monkeypatch):
    from megalab.core import provenance

    monkeypatch.setattr(provenance, "_code_state", lambda c, root, unused, tree: (
        provenance.OLDER, f"{provenance.CODE_CHANGED} (fastpath.py)"))
    rows = {r[0]: r for r in onegpu_goals.goal_rows(_cfg())}
    assert set(rows) == {"111-gpt2xl-dp1-fit-80GB", "101-gpt2xl-dp1-gbs1-bf16", "600-llama1b-1gpu-gbs8",
                         "112-gpt2xl-dp1-fit-80GB-GA4"}
    ran = rows  # every goal has launches with today's settings (101's since the nineteenth session)
    assert all("older (run code changed since" in r[-1] for r in ran.values())
    assert all(int(r[2].split("(")[1].split()[0]) >= 3 for r in ran.values())  # still a campaign's launches


def test_a_code_change_run_against_run_on_one_machine_shows_then_and_now(pin_code, before_gelu_epilogue):
    """Today's code (the eighteenth session's) ran no earlier commit on its goals' machine: no rows. With the fifteenth
    session's code pinned as today's, and its default (before gelu_epilogue), its 111 ran twice at the commit before
    its change (0c57b23) between three launches of its own code on one H100: that is the one before and after; 101,
    112 and 600 ran no earlier commit there. With the fourteenth session's code pinned, its own pair (7f7d795 against
    80644e5) on its machine is read the same way."""
    assert onegpu_goals.code_rows(onegpu_goals.goal_runs(_cfg()["past_reference"], benchruns.ROOT)) == []
    pin_code(GRID_TUNING_COMMIT)
    todays = onegpu_goals.goal_runs(_cfg()["past_reference"], benchruns.ROOT)
    machine = "1x H100 80GB GPU-147ea2cb"
    rows = [r for r in onegpu_goals.code_rows(todays) if r[1] == machine]
    assert [r[:3] for r in rows] == [["111-gpt2xl-dp1-fit-80GB", machine, "code at 0c57b23"],
                                     ["111-gpt2xl-dp1-fit-80GB", machine, "today's code"]]
    then, now = rows
    assert then[3] == "334 (2 runs, 334–335)" and now[3].startswith("334 (3 runs")
    assert float(then[4].rstrip("x")) > 1 and now[4] == ""
    pin_code(PIPELINED_COMMIT)
    todays = onegpu_goals.goal_runs(_cfg()["past_reference"], benchruns.ROOT)
    machine = "1x H100 80GB GPU-ec840fa9"
    rows = [r for r in onegpu_goals.code_rows(todays) if r[1] == machine]
    assert [r[2] for r in rows] == ["code at 7f7d795", "today's code"]
    assert rows[0][3] == "335 (2 runs, 335–335)" and rows[1][3].startswith("333 (3 runs")


def test_code_rows_need_an_earlier_commit_on_the_goals_machine(pin_code, before_gelu_epilogue):
    """Where the earlier commits' runs count as today's code too, there is no before: no rows (and 111's goal rows,
    under the default before gelu_epilogue, then hold all five launches of each of the two machines; the eighteenth
    session's two launches without it are its round's base, not goal launches)."""
    pin_code(GRID_TUNING_COMMIT, BEFORE_GRID_TUNING, PIPELINED_COMMIT, "7f7d7951750d1134e192f9a1db97487e09502be5")
    todays = onegpu_goals.goal_runs(_cfg()["past_reference"], benchruns.ROOT)
    assert onegpu_goals.code_rows(todays) == []
    assert sorted(len(rs) for rs in todays["111-gpt2xl-dp1-fit-80GB"]) == [5, 5]


def test_a_goal_can_be_met_and_needs_its_launches():
    cfg = copy.deepcopy(_cfg())
    for g in cfg["past_reference"]["goals"]:
        g.pop("ms_max", None), g.pop("mfu_min", None), g.pop("gib_max", None)
    rows = {r[0]: r for r in onegpu_goals.goal_rows(cfg)}
    assert rows["111-gpt2xl-dp1-fit-80GB"][-1].startswith("met")
    cfg["past_reference"]["min_runs"] = 4
    rows = {r[0]: r for r in onegpu_goals.goal_rows(cfg)}
    assert rows["111-gpt2xl-dp1-fit-80GB"][-1].startswith("no verdict: 3 launches")


def test_lever_rows_show_each_step_over_the_base_on_one_machine(before_triton_norm):
    cfg = copy.deepcopy(_cfg())
    cfg["past_reference"]["round"] = ["device_norm"]  # the seventh session's round
    rows = onegpu_goals.lever_rows(cfg)
    mine = [r for r in rows if r[0] == "101-gpt2xl-dp1-gbs1-bf16"]
    assert [r[1:3] for r in mine] == [["1x H100 80GB GPU-1633b835", "base"],
                                       ["1x H100 80GB GPU-1633b835", "`device_norm`"]]  # the round's lever
    assert float(mine[1][4].rstrip("x")) > 1  # its step faster than the base
    # the second machine's launches have no base run beside them: no lever rows there
    assert not [r for r in rows if "GPU-177d0ba1" in r[1]]
    # 111's and 112's goal machine (the eighth session's, with the graph) ran no launch without device_norm
    assert {r[0] for r in rows} == {"101-gpt2xl-dp1-gbs1-bf16", "600-llama1b-1gpu-gbs8"}


def test_the_ninth_sessions_round_shows_triton_norm_over_its_base_on_the_goals_machine(pin_code,
                                                                                     before_layer_levers):
    """triton_norm joined the default, and the goals' machine (GPU-14b492fb) ran 111, 112 and 600 once without it:
    each a base row and a triton_norm row; 101 had no launch without it there, so no rows."""
    pin_code(*TRITON_NORM_COMMITS)
    cfg = _cfg()
    cfg["past_reference"]["round"] = ["triton_norm"]  # that session's round
    rows = onegpu_goals.lever_rows(cfg)
    by = _by_target(rows)
    assert set(by) == {"111-gpt2xl-dp1-fit-80GB", "112-gpt2xl-dp1-fit-80GB-GA4", "600-llama1b-1gpu-gbs8"}
    for target, (base, lever) in by.items():
        assert base[1] == lever[1] == "1x H100 80GB GPU-14b492fb" and (base[2], lever[2]) == ("base", "`triton_norm`")
        assert base[3].endswith("(1 run)") and lever[3].startswith(tuple("0123456789")) and "(3 runs" in lever[3]
    assert by["111-gpt2xl-dp1-fit-80GB"][0][3] == "353 (1 run)" and by["111-gpt2xl-dp1-fit-80GB"][1][4] == "1.014x"
    assert float(by["112-gpt2xl-dp1-fit-80GB-GA4"][1][4].rstrip("x")) > 1.01  # four micro-batches of norms
    goals = _by_target(onegpu_goals.goal_rows(_cfg()))
    assert goals["111-gpt2xl-dp1-fit-80GB"][0][-1] == "missed (1x H100 80GB GPU-14b492fb)"  # 348 ms, not 330


def test_trials_of_configurations_outside_the_catalog_pair_only_their_own_runs(trials):
    lines = [ln for ln in benchreport.trials_section(_cfg(), benchruns.BENCH_DIR, rows=trials)
             if "(not a catalog row)" in ln and "510-olmoe" not in ln]  # issue 63's MoE trials: the test below
    assert len(lines) == 45  # gelu_epilogue's two (eighteenth session) pay: neither noisy nor lone
    # the CUDA graph's two (twenty-first session, two a side against CUDA_GRAPH=0, alternating) pay: 252 against
    # 263 ms at 24 x 2048 and 315 against 350 at micro-batch 14, at +0.1% memory or less
    graph = [ln for ln in lines if ln.startswith("| `cuda_graph` + `no_rerun` |")]
    assert len(graph) == 2 and all(ln.rstrip(" |").endswith(benchreport.PAYS) for ln in graph)
    # every one pays but sdpa_gqa on the 24-layer configuration, device_norm on two of its configurations over
    # the fourth session's default, no_rerun on Llama-style 8 x 2560 and triton_norm on GPT-2 24 x 2048 (its
    # second machine: 263, 263 against 263, 267 ms), where the runs overlap: the check can fail
    noisy = sorted(ln.split("|")[1].strip() + " " + ln.split("|")[2] for ln in lines if "within noise" in ln)
    assert len(noisy) == 5
    assert "`device_norm`" in noisy[0] and "--num-layers 36" in noisy[0]
    assert "`device_norm`" in noisy[1] and "`--global-batch-size 1`" in noisy[1]
    assert "`no_rerun`" in noisy[2] and "--num-layers 8 --hidden-size 2560" in noisy[2]
    assert "`sdpa_gqa`" in noisy[3] and "--num-layers 24" in noisy[3]
    assert "`triton_norm`" in noisy[4] and "--num-layers 24 --hidden-size 2048" in noisy[4]
    # where a machine holds one run of a side (the fifth session ran out of device time; the ninth tried
    # compiled_norm once a side beyond the catalog), no verdict at all; bias_gelu's tenth-session lone runs are on
    # older code, and the eleventh's two a side on today's decide its rows
    lone = [ln for ln in lines if "no verdict" in ln]
    assert len(lone) == 5 and all("one run on a side" in ln for ln in lone)
    assert sorted(ln.split("|")[1].strip() for ln in lone) == (["`compiled_norm`"] * 2 + ["`no_rerun` + `device_norm`"] * 2
                                                               + ["`sdpa_gqa`"])
    # sdpa_gqa tried again over the seventeenth session's default: it pays on the two configurations it ran twice a
    # side (Llama-style 8 x 2560 and 600 at sequence 4096), as a lever that joins the default must
    again = [ln for ln in lines if ln.startswith("| `sdpa_gqa` |") and "flat_adam" in ln]
    assert len(again) == 3 and sum(ln.rstrip(" |").endswith("pays") for ln in again) == 2
    # the eleventh, twelfth and thirteenth sessions' levers beyond the catalog, two launches a side on one machine:
    # each pays on both
    for lever in ("bias_gelu", "norm_residual", "dropout_add", "qkv_pack"):
        rows = [ln for ln in lines if ln.startswith(f"| `{lever}` |")]
        assert len(rows) == 2 and all(ln.rstrip(" |").endswith("pays") for ln in rows), rows
    # triton_norm beyond the catalog: two configurations pay on one machine, two launches a side (101 at
    # micro-batch 14, GPT-2 1.2B at micro-batch 16), as a lever that joins the default must
    paid = [ln for ln in lines if ln.startswith("| `triton_norm` |") and ln.rstrip(" |").endswith("pays")]
    assert len(paid) == 2 and {"--micro-batch-size 14" in ln for ln in paid} == {True, False}
    # device_norm over the sixth session's default on Llama-style 8 x 2560: the seventh session's two a side pay
    (llama,) = [ln for ln in lines if ln.startswith("| `device_norm` |") and "fused_wgrad,`no_rerun` |" in ln
                and "--hidden-size 2560" in ln]
    assert llama.rstrip(" |").endswith("pays")
    # compiled_norm on GPT-2 24 x 2048 at 111's batch (with the CUDA graph): 264 against 266-267 ms
    (norm,) = [ln for ln in lines if ln.startswith("| `compiled_norm` |") and "device_norm" not in ln]
    assert "--num-layers 24 --hidden-size 2048" in norm and norm.rstrip(" |").endswith("pays")
    # the configuration chosen for no_rerun before any run of it (GPT-2 24 x 2048) ran in the sixth session: it
    # pays, and so does device_norm there over the new default (a base that names the flag lever it had)
    (chosen,) = [ln for ln in lines if ln.startswith("| `no_rerun` |") and "--num-layers 24 --hidden-size 2048" in ln]
    (over,) = [ln for ln in lines if "fused_wgrad,`no_rerun` |" in ln and "--num-layers 24" in ln
               and ln.startswith("| `device_norm` |")]
    assert chosen.rstrip(" |").endswith("pays") and over.startswith("| `device_norm` |") and "--num-layers 24" in over
    assert over.rstrip(" |").endswith("pays")
    assert not [ln for ln in lines if ln.rstrip(" |").endswith("not run")]
    assert all(ln.rstrip(" |").endswith("pays") for ln in lines
               if not any(w in ln for w in ("within noise", "no verdict", "not run", benchreport.NOT_COMPARED)))
    cfg = copy.deepcopy(_cfg())
    for t in cfg["trials"]:
        for e in t["targets"]:
            if isinstance(e, dict):
                e["extra_args"] += " --seed 7"  # no run had these flags: nothing to compare
    lines = [ln for ln in benchreport.trials_section(cfg, benchruns.BENCH_DIR) if "(not a catalog row)" in ln]
    assert len(lines) == 56 and all(ln.rstrip(" |").endswith("not run") for ln in lines)  # 45, and issue 63's 11


def test_the_cuda_graph_is_a_lever_whose_side_is_the_runs_cuda_graph(trials):
    """The full-iteration graph tried against CUDA_GRAPH=0 (the eighth session, one H100): the two sides differ
    in the run's CUDA graph, which otherwise both sides of a trial share; on 111 two launches a side, all with
    the graph faster (348-350 against 365-368 ms), on 112 one a side: no verdict."""
    rows = {ln.split("|")[2].strip(): ln for ln in benchreport.trials_section(_cfg(), benchruns.BENCH_DIR, rows=trials)
            if ln.startswith("| `cuda_graph` + `no_rerun` |")}
    assert rows["111-gpt2xl-dp1-fit-80GB"].rstrip(" |").endswith("| PASS | pays")
    assert "| 366 (2 runs, 365–368) | 349 (2 runs, 348–350) |" in rows["111-gpt2xl-dp1-fit-80GB"]
    assert rows["112-gpt2xl-dp1-fit-80GB-GA4"].rstrip(" |").endswith("no verdict: one run on a side")
    cfg = copy.deepcopy(_cfg())
    cfg["levers"]["cuda_graph"] = {"about": "as a setting both sides share"}  # not a lever: no pairs across it
    rows = [ln for ln in benchreport.trials_section(cfg, benchruns.BENCH_DIR) if ln.startswith("| `cuda_graph` + `no_rerun` |")]
    assert all("pays" not in ln for ln in rows)


def test_a_round_that_tried_the_cuda_graph_runs_its_base_without_it(before_triton_norm):
    """With `cuda_graph` in the round, a target's base is its default launched with CUDA_GRAPH=0 and the graph
    a step over it: on 111's second machine of the eighth session (two launches a side, goals counting 2),
    365-368 ms without the graph and 348-350 with it."""
    cfg = copy.deepcopy(_cfg())
    cfg["past_reference"]["round"], cfg["past_reference"]["min_runs"] = ["cuda_graph"], 2
    rows = [r for r in onegpu_goals.lever_rows(cfg) if r[0] == "111-gpt2xl-dp1-fit-80GB"]
    assert [r[1:4] for r in rows] == [["1x H100 80GB GPU-56d5749e", "base", "366 (2 runs, 365–368)"],
                                      ["1x H100 80GB GPU-56d5749e", "`cuda_graph`", "349 (2 runs, 348–350)"]]
    assert rows[1][4] == "1.050x"
    # without the graph in the round, runs with and without it are one group: there is no base/lever split
    cfg["past_reference"]["round"] = ["device_norm"]
    assert not [r for r in onegpu_goals.lever_rows(cfg) if "`cuda_graph`" in r[2]]


def test_todays_runs_come_before_older_code(before_triton_norm):
    """Where launches of today's run code exist, they are the row, with no older mark."""
    rows = _by_target(onegpu_goals.goal_rows(_cfg()))
    assert [r[-1] for r in rows["600-llama1b-1gpu-gbs8"]] == ["missed (1x H100 80GB GPU-1633b835)",
                                                             "met (1x H100 80GB GPU-177d0ba1)"]


def test_a_flag_lever_counts_by_the_command_a_run_passed(monkeypatch):
    """A lever of Megatron flags (`args:`) is judged by each run's Megatron command, not its EXTRA_ARGS: once
    the flags join the launcher's default, a plain run passes them and counts with the lever, not the base."""
    from megalab.core.records import read_records

    cfg = copy.deepcopy(_cfg())
    cfg["trials"] = [t for t in cfg["trials"] if t["lever"] == "no_rerun"][:1]
    cfg["trials"][0]["targets"] = ["101-gpt2xl-dp1-gbs1-bf16"]
    machine = "GPU-cd4294e6"  # the second round's machine: two runs a side
    real = [r for d in ("results/runs", "results/bench/runs") for r in read_records(benchreport.ROOT / d)
            if r.target == "101-gpt2xl-dp1-gbs1-bf16" and (r.gpu_uuids or [""])[0].startswith(machine)]

    def row(records):
        monkeypatch.setattr(benchreport, "read_records", lambda d, who=None: iter(
            [r for r in records if str(r.run_dir).startswith(str(d))]))
        (line,) = [ln for ln in benchreport.trials_section(cfg, benchruns.BENCH_DIR) if ln.startswith("| `no_rerun`")]
        return [c.strip() for c in line.split("|")[1:-1]]

    before = row(real)
    assert before[3].startswith("1x H100 80GB GPU-cd4294e6, ")  # the machine and code the row compares on
    assert before[4] == "61 (2 runs, 61–61)" and before[5] == "59 (2 runs, 59–59)" and before[-1] == "pays"
    plain = next(r for r in real if not r.config.extra_args)
    adopted = plain.model_copy(update={"intent": plain.intent.model_copy(
        update={"argv": [*plain.intent.argv, "--rerun-mode", "disabled"]})})
    after = row([*real, adopted])
    assert after[4] == "61 (2 runs, 61–61)"  # the base side is as it was
    assert after[5].startswith("59 (3 runs")  # the plain run that passed the flags sits with the lever


WIDE = "111-gpt2xl-dp1-fit-80GB + `--num-layers 24 --hidden-size 2048 --num-attention-heads 16` (not a catalog row)"
MB14 = "101-gpt2xl-dp1-gbs1-bf16 + `--micro-batch-size 14 --global-batch-size 14` (not a catalog row)"


def _parity_cells(trials=None) -> dict[tuple[str, str], tuple[str, str]]:
    """The levers-tried table's parity columns: (lever, target) -> (first steps' largest difference, parity cell);
    of TRIALS, or of rows read now."""
    rows = [ln.split("|") for ln in benchreport.trials_section(_cfg(), benchruns.BENCH_DIR, rows=trials)
            if ln.startswith("| `")]
    return {(r[1].strip(), r[2].strip()): (r[-4].strip(), r[-3].strip()) for r in rows}


def test_a_parity_fail_says_where_two_base_runs_fail_it_too(trials):
    """The median rule over 100 steps: norm_residual's pairs at GPT-2 24 x 2048 and 600 fail it, as two base runs
    of one code do against each other there (their early training amplifies rounding), and the cell says so;
    layer_graphs, whose first steps are already 2% apart, stays a plain FAIL: the check can fail."""
    cell = {key: parity for key, (_, parity) in _parity_cells(trials).items()}
    assert cell[("`norm_residual`", "600-llama1b-1gpu-gbs8")] == benchreport.BASE_FAILS_TOO
    assert cell[("`norm_residual`", WIDE)] == benchreport.BASE_FAILS_TOO
    assert cell[("`norm_residual`", "111-gpt2xl-dp1-fit-80GB")] == "PASS"
    assert cell[("`layer_graphs`", "111-gpt2xl-dp1-fit-80GB")] == "FAIL"


def test_a_lever_with_its_own_masks_is_judged_by_the_median_rule(trials, monkeypatch):
    """dropout_add draws dropout masks of its own, so its pairs' first losses differ by the masks (1.7e-3 at 111,
    1.1e-2 at 101 with micro-batch 14: the first-steps rule would FAIL them): the median rule alone judges them and
    the cell says so. That rule can fail too: with a median bound below the pairs' medians they FAIL."""
    cells = _parity_cells(trials)

    def cell(target):
        return cells[("`dropout_add`", target)]

    own = benchreport.OWN_MASKS
    assert cell("111-gpt2xl-dp1-fit-80GB")[1] == f"PASS {own}"
    assert cell(MB14)[1] == f"PASS {own}"
    assert float(cell("111-gpt2xl-dp1-fit-80GB")[0]) > benchreport.PARITY_EARLY_MAX_REL  # the first steps' rule would fail
    assert cell(WIDE)[1] == f"{benchreport.BASE_FAILS_TOO} {own}"
    monkeypatch.setattr(benchreport, "PARITY_MEDIAN_REL", 1e-5)
    failed = _parity_cells()[("`dropout_add`", "111-gpt2xl-dp1-fit-80GB")][1]  # read again under the new bound
    assert failed.startswith("FAIL") and failed.endswith(own), failed


def _runs_with_csvs(tmp_path, csvs: dict[str, str | None]) -> dict[str, object]:
    """Run folders under tmp_path, each a committed goal launch's run.json beside the memory CSV given (None:
    none), read back as the pages read records: {folder: RunRecord}."""
    import shutil

    from megalab.core.records import read_records

    src = next(r for r in read_records(benchruns.ROOT / "results" / "runs")
               if r.target == "111-gpt2xl-dp1-fit-80GB" and r.status == "ok" and r.gpu_name)
    for name, text in csvs.items():
        (tmp_path / name).mkdir()
        shutil.copy(src.run_dir / "run.json", tmp_path / name / "run.json")
        if text is not None:
            (tmp_path / name / "gpu_memory.csv").write_text(text)
    return {r.run_dir.name: r for r in read_records(tmp_path)}


CLOCKS_HEAD = "t_s,gpu,mem_used_mib,util_pct,sm_mhz,power_w,held_by\n"


def test_clock_rows_pool_the_busy_samples_of_a_goals_runs(tmp_path, monkeypatch):
    """A goal row's clocks: every sampled run's busy samples pooled (not a median of the runs' medians), the runs
    without clock columns counted out, a damaged CSV a run not sampled, never an error."""
    runs = _runs_with_csvs(tmp_path, {
        "a": CLOCKS_HEAD + "0.0,0,500,0,345,70,power_cap\n"  # idle: not counted, whatever held it
                           "0.2,0,70000,100,1500,600,power_cap\n0.4,0,70000,100,1600,650,power_cap\n"
                           "0.6,0,70000,100,1700,700,\n",
        "b": CLOCKS_HEAD + "0.2,0,70000,100,1800,690,power_cap\n0.2,1,70000,100,1900,700,power_cap\n",  # two GPUs
        "old": "t_s,gpu,mem_used_mib,util_pct\n0.2,0,70000,100\n",  # a monitor before the clocks
        "none": None,  # no memory CSV at all
        "bad": CLOCKS_HEAD + "0.2,0,70000,100,fast,690,power_cap\n",  # damaged: sm_mhz no number
    })
    target = runs["a"].target
    machine = fast_by_default.hardware(runs["a"])
    todays = {target: [[runs["a"], runs["b"], runs["old"]], [runs["old"], runs["none"]], [runs["bad"], runs["a"]]]}
    pooled, unsampled, damaged = onegpu_goals.clock_rows(todays)
    # 1500..1900 pooled: 1700 (the runs' medians, 1600 and 1850, would give 1725); power_cap in 4 of 5 busy samples
    assert pooled == [target, machine, "2 of 3", "1700 (1500-1900)", "690", "power_cap 80%"]
    assert unsampled == [target, machine, "0 of 2", onegpu_goals.NOT_SAMPLED, "-", "-"]
    assert damaged == [target, machine, "1 of 2", "1600 (1500-1700)", "650", "power_cap 67%"]
    from megalab.core import clocks

    assert clocks.pooled(None) is None  # a record read without its run directory: no samples, no error
    # the page: the table after the code table, the same rows; with no goal run at all, one line instead
    goals = {g["target"]: [] for g in _cfg()["past_reference"]["goals"]}
    monkeypatch.setattr(onegpu_goals, "goal_runs", lambda block, root: {**goals, **todays})
    page = onegpu_goals.section(_cfg())
    head = page.index("| " + " | ".join(onegpu_goals.CLOCK_HEADER) + " |")
    assert [[c.strip() for c in ln.split("|")[1:-1]] for ln in page[head + 2:head + 5]] == [pooled, unsampled, damaged]
    assert page[head - 2].startswith("What the card ran at while busy") and page[head + 5] == ""
    monkeypatch.setattr(onegpu_goals, "goal_runs", lambda block, root: goals)
    assert "No goal run was sampled for clocks." in onegpu_goals.section(_cfg())


# ---- beyond the catalog: a lever that joined the default pays on configurations that are not catalog rows ----

def _beyond(cfg=None, trials=None):
    """The beyond-the-catalog rows by lever, of CFG (the committed bench.yaml) and its trial rows (TRIALS, where CFG's
    trials and levers are the committed ones; else read now)."""
    cfg = cfg or _cfg()
    rows = benchreport.trial_rows(cfg, benchruns.BENCH_DIR) if trials is None else trials
    return {r[0].strip("`"): r for r in benchreport.beyond_rows(cfg, rows)}


def _on_catalog_rows_only(cfg, lever):
    """CFG with LEVER's trials (alone or in a set) on catalog rows only: for the CUDA graph, as they were until the
    twentieth session planned two configurations beyond the catalog."""
    cfg = copy.deepcopy(cfg)
    for trial in cfg["trials"]:
        if lever in (trial["lever"] if isinstance(trial["lever"], list) else [trial["lever"]]):
            trial["targets"] = [t for t in trial["targets"] if isinstance(t, str)]
    return cfg


def test_every_lever_that_joined_a_goals_default_has_a_row_and_the_graph_can_miss(trials):
    """The levers a goal's newest plain launch runs that its default lacked at 12e8ae4 (the issue's commit): each a row,
    none of the issue's own; the CUDA graph joined 111's and 112's default only (CUDA_GRAPH=auto found room at 101 and
    600 then), and with no trial of it beyond the catalog its row misses: the rule is a check that can fail."""
    rows = _beyond(trials=trials)
    assert not set(rows) & {"fused_adam", "foreach_norm", "foreach_scale", "bf16_ce", "addmm_bias"}
    assert {"gelu_epilogue", "triton_norm", "no_rerun", "sdpa_gqa", "cuda_graph"} <= set(rows)
    assert rows["cuda_graph"][1] == "111, 112"
    graph = _beyond(_on_catalog_rows_only(_cfg(), "cuda_graph"))["cuda_graph"]
    assert graph[1:] == ["111, 112", "0 of 0", "-", "missed: not tried beyond the catalog"]
    assert rows["gelu_epilogue"][1] == "111, 101, 112" and rows["gelu_epilogue"][-1] == "met"
    assert rows["sdpa_gqa"][1] == "600" and rows["sdpa_gqa"][2] == "2 of 3"  # one configuration within noise


def test_a_lever_misses_without_enough_configurations_that_paid(trials):
    cfg = copy.deepcopy(_cfg())
    cfg["past_reference"]["beyond_catalog"]["min_configs"] = 3
    rows = _beyond(cfg, trials)  # the rule changed, not the trials
    assert rows["bias_gelu"][-1] == "missed: pays on 2 of 2" and rows["fused_wgrad"][-1] == "met"  # 3 of 3
    cfg = _on_catalog_rows_only(_cfg(), "gelu_epilogue")
    assert _beyond(cfg)["gelu_epilogue"][-1] == "missed: not tried beyond the catalog"


def test_a_set_of_levers_counts_only_where_all_of_them_joined(trials):
    """fused_wgrad paid on two Llama-style configurations together with compiled_rope: those count for fused_wgrad
    while compiled_rope joined 600's default too, and not where compiled_rope had been the issue's default."""
    rows = _beyond(trials=trials)
    assert rows["fused_wgrad"][2] == "3 of 3" and "(with `compiled_rope`)" in rows["fused_wgrad"][3]
    cfg = copy.deepcopy(_cfg())
    cfg["past_reference"]["beyond_catalog"]["issue_default"].append("compiled_rope")
    rows = _beyond(cfg, trials)
    assert "compiled_rope" not in rows and rows["fused_wgrad"][2] == "1 of 3"
    assert rows["fused_wgrad"][-1] == "missed: pays on 1 of 3"


def test_the_committed_page_shows_the_beyond_the_catalog_table(trials):
    text = (benchruns.BENCH_DIR / "README.md").read_text(encoding="utf-8")
    section = text.split("## One GPU, past the reference")[1].split("\n## ")[0]
    assert "Beyond the catalog: issue 32 lets a lever join the default" in section
    rows = _beyond(trials=trials)
    for r in rows.values():
        assert "| " + " | ".join(r) + " |" in section
    met = sum(r[-1] == "met" for r in rows.values())
    assert f"{met} of {len(rows)} meet the rule." in section


def test_without_a_goals_launch_the_beyond_the_catalog_part_says_so(monkeypatch):
    monkeypatch.setattr(onegpu_goals, "goal_runs", lambda block, root: {g["target"]: [] for g in block["goals"]})
    cfg = _cfg()
    lines = benchreport.beyond_section(cfg, benchreport.trial_rows(cfg, benchruns.BENCH_DIR))
    assert lines[0].startswith("Beyond the catalog: no goal's plain launch") and not any(ln.startswith("|") for ln in lines)


def test_the_moe_levers_trials_beyond_the_catalog_are_shown_with_one_run_a_side(trials):
    """Issue 63's trials (one launch a side on one H200 per call): no verdict on the page, each row says so; the
    three levers that joined the MoE default are faster without exception where both sides ran on one machine and
    code."""
    lines = [ln for ln in benchreport.trials_section(_cfg(), benchruns.BENCH_DIR, rows=trials)
             if "510-olmoe" in ln and "(not a catalog row)" in ln]
    assert len(lines) == 11
    compared = [ln for ln in lines if "no machine and code with both" not in ln]
    assert compared and all("no verdict: one run on a side" in ln for ln in compared)
    ratio = {}
    for ln in compared:
        cells = [c.strip() for c in ln.split("|")]
        ratio.setdefault(cells[1], []).append(float(cells[7]))
    assert all(x < 0.85 for x in ratio["`moe_gather`"] + ratio["`expert_stack`"]), ratio
    assert ratio["`moe_act`"] and all(x < 1.0 for x in ratio["`moe_act`"]), ratio
