"""megalab.results.tables: record selection, cell formatting, the chapter pages (golden), chapter-specific
columns and --check.

The records under tests/fixtures/records are invented test fixtures ("fixture": true), not
measurements. After an intended format change, regenerate the golden pages as docs/adding-an-experiment.md's "Add an
experiment" says (step 6)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from megalab.core import catalog
from megalab.core.records import RunRecord
from megalab.results import chapter as chapters, columns, tables
from conftest import typed
from megalab.__main__ import main

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "records"
GOLDEN = FIXTURES / "golden" / "01-dp-zero2.md"
GOLDEN0 = FIXTURES / "golden" / "00-two-gpu-tour.md"

T101 = "101-gpt2xl-dp1-gbs1-bf16"
T111 = "111-gpt2xl-dp1-fit-80GB"
T121 = "121-gpt2xl-dp1-gbs16-oom"
T122 = "122-gpt2xl-dp2-gbs32-zero2"


def _write(root: Path, run: str, **fields) -> Path:
    rec = {"fixture": True, "target": T101, "status": "ok", "started": "2025-03-01T10:00:00+00:00",
           "step_ms_median": 250.0, "step_ms_p10": 249.0, "step_ms_p90": 255.0, "step_count": 17,
           "tflops_per_gpu": 42.0, "mfu": 0.0425, "mem_peak_gib": [30.0],
           "gpu_name": "NVIDIA H100 80GB HBM3", "num_gpus": 1, "config": {"gpu_mem_gb": None}}
    rec.update(fields)
    d = root / run
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(rec))
    return d / "run.json"


def _row(target: str, records: dict, chapter: int = 1) -> dict:
    df = tables.table_frame(chapter, typed(records))
    return df[df["make target"] == target].iloc[0].to_dict()


# --------------------------------------------------------------------------- fixtures and golden

def test_fixture_records_are_marked_as_fixtures():
    paths = sorted(RECORDS.glob("*/run.json"))
    assert len(paths) == 9
    for p in paths:
        assert json.loads(p.read_text())["fixture"] is True, p


@pytest.fixture
def pinned_errors(monkeypatch):
    """The predicted columns' footnote quotes the estimator's error on the committed records, which every
    new committed run moves: the golden page pins it (the figures are tested in test_prediction.py)."""
    from megalab.results import predicted

    monkeypatch.setattr(predicted, "errors", lambda: {"step time": (0.05, -0.2, 10), "memory": (0.02, 0.09, 10)})


def test_golden_chapter_1(pinned_errors):
    text = tables.render_chapter(1, tables.load_records(RECORDS))
    if os.environ.get("MEGALAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_golden_chapter_0():
    text = tables.render_chapter(0, tables.load_records(RECORDS))
    if os.environ.get("MEGALAB_UPDATE_GOLDEN"):
        GOLDEN0.write_text(text)
    assert text == GOLDEN0.read_text()


@pytest.mark.parametrize("chapter", sorted(catalog.chapters()))
def test_table_rows_follow_catalog_order(chapter):
    df = tables.table_frame(chapter, {})
    assert list(df.columns) == columns.columns(chapter)
    assert list(df["make target"]) == [e.id for e in catalog.catalog().values() if e.chapter == chapter]
    assert (df["status"] != "").all()


def test_hand_checked_rows():
    recs = tables.load_records(RECORDS)
    r = _row(T101, recs)  # ours 30.12 GiB, 251.4 ms vs published 33.3 (nvidia-smi MiB / 1000 = 32.5 GiB), 220 ms
    assert (r["Row"], r["ref GB (pub.)"], r["ref GiB"], r["our GiB"], r["Δ GiB"]) == ("R1", "33.3", "32.5", "30.1", "-2.4")
    assert (r["ref ms"], r["our ms"], r["Δ ms"], r["our p10–p90 ms"]) == ("220", "251", "+14%", "250–255")
    assert (r["MFU"], r["hardware"], r["status"]) == ("4.2%", "1x H100 80GB", "ok")
    r = _row(T122, recs)  # two GPUs 73.42 / 75.08 GiB, 448.7 ms vs 74.9 GB, 423 ms, 80 GB cap
    assert (r["our GiB"], r["Δ GiB"], r["our ms"], r["Δ ms"]) == ("73.4 / 75.1", "+2.0", "449", "+6%")
    assert r["hardware"] == "2x H200, capped 80 GB"
    r = _row(T121, recs)  # oom on both sides
    assert (r["ref GB (pub.)"], r["our ms"], r["Δ GiB"], r["status"]) == ("oom", "", "", "oom (as reference)")


# --------------------------------------------------------------------------- load_records

def test_newest_ok_record_wins_over_newer_failed(tmp_path):
    _write(tmp_path, "a", status="ok", started="2025-03-01T10:00:00+00:00", step_ms_median=111.0)
    _write(tmp_path, "b", status="ok", started="2025-03-02T10:00:00+00:00", step_ms_median=222.0)
    _write(tmp_path, "c", status="failed", started="2025-03-03T10:00:00+00:00", step_ms_median=None)
    assert tables.load_records(tmp_path)[T101].step_ms_median == 222.0


def test_a_plain_make_record_wins_over_a_newer_lever_trials_launch(tmp_path, monkeypatch):
    """A lever trial launches a catalog target with other settings (its base: the default less the lever) into
    results/runs too. The row is what plain `make <target>` gives: the newest record with today's settings, and a
    trial's launch only where the target has none."""
    from megalab.core import provenance

    monkeypatch.setattr(provenance, "settings_differ", lambda r: "" if r.config.fastpath == ("plain",) else "FAST=x")
    _write(tmp_path, "a", started="2025-03-01T10:00:00+00:00", step_ms_median=111.0, config={"fastpath": "plain"})
    _write(tmp_path, "b", started="2025-03-02T10:00:00+00:00", step_ms_median=222.0, config={"fastpath": "base"})
    _write(tmp_path, "c", target=T121, started="2025-03-02T10:00:00+00:00", step_ms_median=333.0,
           config={"fastpath": "base"})
    recs = tables.load_records(tmp_path)
    assert recs[T101].step_ms_median == 111.0
    assert recs[T121].step_ms_median == 333.0


def test_newest_of_any_status_when_none_usable(tmp_path):
    _write(tmp_path, "a", status="failed", started="2025-03-01T10:00:00+00:00", returncode=1)
    _write(tmp_path, "b", status="incomplete", started="2025-03-02T10:00:00+00:00", returncode=2)
    assert tables.load_records(tmp_path)[T101].status == "incomplete"


def test_oom_counts_as_usable(tmp_path):
    _write(tmp_path, "a", target=T121, status="oom", started="2025-03-01T10:00:00+00:00")
    _write(tmp_path, "b", target=T121, status="failed", started="2025-03-02T10:00:00+00:00")
    assert tables.load_records(tmp_path)[T121].status == "oom"


def test_broken_json_is_skipped_with_warning(tmp_path, capsys):
    _write(tmp_path, "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text('{"target": "101-gpt2')
    (tmp_path / "notarecord").mkdir()
    (tmp_path / "notarecord" / "run.json").write_text("[1, 2]")
    recs = tables.load_records(tmp_path)
    assert list(recs) == [T101]
    err = capsys.readouterr().err
    assert "broken/run.json" in err and "notarecord/run.json" in err


def test_missing_runs_dir_gives_no_records(tmp_path):
    assert tables.load_records(tmp_path / "nope") == {}


# --------------------------------------------------------------------------- cells

def test_not_run_reasons():
    cat = catalog.catalog()
    assert columns.not_run_reason(cat["118-gpt2xl-dp8-fit-8x80GB"]) == "not run: needs 8 GPUs"
    assert columns.not_run_reason(cat["104-gpt2xl-dp4-gbs4"]) == "not run: needs 4 GPUs"
    assert columns.not_run_reason(cat["102-gpt2xl-dp2-gbs2"]) == "not run yet"
    assert columns.not_run_reason(cat[T101]) == "not run yet"
    r = _row("102-gpt2xl-dp2-gbs2", {})
    assert (r["Row"], r["ref GB (pub.)"], r["ref GiB"], r["ref ms"]) == ("~R2", "—", "—", "—")
    assert r["our GiB"] == r["our ms"] == r["hardware"] == ""
    assert _row("118-gpt2xl-dp8-fit-8x80GB", {})["status"] == "not run: needs 8 GPUs"


@pytest.mark.parametrize("ours, ref, want", [
    (251, 220, "+14%"), (200, 220, "-9%"), (220, 220, "+0%"), (219.5, 220, "+0%"),
    (231, 220, "+5%"), (None, 220, ""), (250, None, ""),
])
def test_delta_percent(ours, ref, want):
    assert columns.fmt_delta_pct(ours, ref) == want


@pytest.mark.parametrize("ours, ref, want", [
    (30.12, 33.3, "-3.2"), (79.61, 78.5, "+1.1"), (33.3, 33.3, "+0.0"), (33.26, 33.3, "+0.0"),
    (None, 33.3, ""), (30.0, None, ""),
])
def test_delta_gb(ours, ref, want):
    assert columns.fmt_delta_gb(ours, ref) == want


def test_memory_cell():
    assert columns.fmt_mem([]) == ("", None)
    assert columns.fmt_mem([70.0, 70.9]) == ("70.9", 70.9)
    assert columns.fmt_mem([60.0, 70.04]) == ("60.0 / 70.0", 70.04)
    assert columns.fmt_mem([60.0, 61.0, 65.0, 62.0])[0] == "60.0–65.0"


def test_status_against_reference_oom():
    oom_on_ok_ref = {T101: {"target": T101, "status": "oom", "mem_peak_gib": [79.0], "num_gpus": 1,
                            "gpu_name": "NVIDIA H100 80GB HBM3", "step_ms_median": 300.0}}
    r = _row(T101, oom_on_ok_ref)
    assert (r["status"], r["our ms"], r["Δ ms"]) == ("oom", "", "")
    ok_on_oom_ref = {T121: {"target": T121, "status": "ok", "mem_peak_gib": [78.0], "num_gpus": 1,
                            "gpu_name": "NVIDIA H200", "step_ms_median": 480.2,
                            "config": {"gpu_mem_gb": "80"}}}
    r = _row(T121, ok_on_oom_ref)
    assert (r["status"], r["our ms"], r["Δ ms"], r["hardware"]) == (
        "ok (reference: oom)", "480", "", "1x H200, capped 80 GB")
    failed = {T101: {"target": T101, "status": "failed", "num_gpus": 1}}
    assert _row(T101, failed)["status"] == "failed"


def test_a_capped_run_whose_nvml_peak_passed_the_cap_is_marked():
    def rec(status, peak_mib, cap="80"):  # the cap as schema 1 and 2 launchers wrote it: text
        return RunRecord.of({"target": T101, "status": status, "mem_peak_mib": [1000, peak_mib], "num_gpus": 2,
                             "gpu_name": "NVIDIA H200", "config": {"gpu_mem_gb": cap}})
    # 80 nominal GB = 81559 MiB (an H100 80GB): NCCL's buffers outside the allocator can push past it
    assert columns.over_cap_gib(rec("ok", 83885)) == pytest.approx((83885 - 81559) / 1024)
    assert columns.fmt_hardware(rec("ok", 83885)) == "2x H200, capped 80 GB ‡"
    assert columns.over_cap_gib(rec("ok", 81000)) is None
    assert columns.over_cap_gib(rec("oom", 84679)) is None  # an OOM says so itself
    assert columns.over_cap_gib(rec("ok", 90000, cap=None)) is None  # uncapped: nothing to pass
    assert columns.fmt_hardware(rec("ok", 81000)) == "2x H200, capped 80 GB"
    assert columns.fmt_hardware(rec("ok", 81000, cap=80.0)) == "2x H200, capped 80 GB"  # a number now: the same


def test_reference_tables_load():
    ref = tables.load_reference()
    assert ref.loc[(1, "R1"), "step_ms"] == 220
    assert ref.loc[(1, "R7"), "mem_gb_per_gpu"] == "oom"
    two = tables.load_twogpu_reference()
    assert two.loc["T1", "step_ms"] == pytest.approx(437.2)


# --------------------------------------------------------------------------- chapter 0 (2x H200 reference)

def test_chapter_0_is_diffed_against_the_twogpu_reference():
    assert chapters.reference_kind(0) == "twogpu" and chapters.reference_kind(1) == "anchor"
    cols = columns.columns(0)
    for name in ("idea", "ref GiB GPU0", "ref GiB GPU1", "our GiB GPU0", "our GiB GPU1", "Δ GiB"):
        assert name in cols
    assert "our GiB" not in cols and "ZeRO-2" not in cols


def test_chapter_0_catalog_matches_its_reference_rows():
    two = tables.load_twogpu_reference()
    for e in (e for e in catalog.catalog().values() if e.chapter == 0):
        r = two.loc[e.ref]
        assert (e.gbs, e.mbs, e.gpus, e.dp, e.tp, e.pp, e.cp, int(e.sp)) == \
            tuple(int(r[k]) for k in ("gbs", "mbs", "gpus", "dp", "tp", "pp", "cp", "sp")), e.id
        assert (e.model, e.seq_length) == (r["model"], r["seq"]), e.id


def test_chapter_0_hand_checked_rows():
    recs = tables.load_records(RECORDS)
    # T5, PP=2: published 61249 / 88299 MiB = 59.81 / 86.23 GiB, 817.4 ms; fixture 59.06 / 88.9 GiB, 829.5 ms
    r = _row("006-gpt2large-pp2-gbs64-m1", recs, 0)
    assert (r["Row"], r["idea"], r["GBS"], r["MBS"]) == ("T5", "PP=2 m=1", "64", "64")
    assert (r["ref GiB GPU0"], r["ref GiB GPU1"], r["our GiB GPU0"], r["our GiB GPU1"], r["Δ GiB"]) == \
        ("59.8", "86.2", "59.1", "88.9", "-0.7 / +2.7")
    assert (r["ref ms"], r["our ms"], r["Δ ms"], r["our p10–p90 ms"]) == ("817", "830", "+2%", "820–842")
    assert (r["MFU"], r["hardware"], r["status"]) == ("19.7%", "2x H200", "ok")
    # T0, one GPU: published 80161 MiB = 78.28 GiB, 437.5 ms; GPU 1 columns stay empty
    r = _row("001-gpt2large-1gpu-gbs32", recs, 0)
    assert (r["idea"], r["ref GiB GPU0"], r["ref GiB GPU1"], r["our GiB GPU0"], r["our GiB GPU1"]) == \
        ("baseline", "78.3", "", "75.3", "")
    assert (r["Δ GiB"], r["ref ms"], r["our ms"], r["Δ ms"]) == ("-3.0", "438", "441", "+1%")
    # T2 ran out of memory: memory kept, no step time
    r = _row("003-gpt2large-tp2-gbs64", recs, 0)
    assert (r["our GiB GPU0"], r["our GiB GPU1"], r["Δ GiB"], r["our ms"], r["Δ ms"], r["status"]) == \
        ("139.9", "139.9", "", "", "", "oom")
    assert _row("004-gpt2large-tp2-sp-gbs64", recs, 0)["idea"] == "TP=2 + SP"
    assert _row("002-gpt2large-dp2-gbs64", recs, 0)["idea"] == "DP=2"


def test_context_parallel_runs_without_te_so_only_the_gpu_count_stops_it():
    r = _row("005-gpt2large-cp2-gbs64", {}, 0)
    assert (r["idea"], r["ref GiB GPU0"], r["ref GiB GPU1"], r["status"]) == ("CP=2", "80.0", "79.6", "not run yet")
    other = catalog.Experiment(id="999-anything", chapter=3, about="", model="gpt2-large", gpus=2, gbs=8,
                               mbs=8, cp=2)
    assert columns.not_run_reason(other) == "not run yet"
    assert columns.not_run_reason(other.model_copy(update={"gpus": 8, "cp": 8})) == "not run: needs 8 GPUs"


def test_chapter3_speedup_is_against_the_recompute_row_of_the_same_sequence(tmp_path):
    recs = {"300-cp1-gpt2-1.2B-gbs8-len4096-ra": {"status": "ok", "step_ms_median": 1000.0},
            "312-cp2-gpt2-1.2B-gbs8-len4096-ag": {"status": "ok", "step_ms_median": 400.0},
            "332-cp2-gpt2-1.2B-gbs8-len32k": {"status": "ok", "step_ms_median": 900.0}}
    col = "speedup vs recompute"
    assert _row("300-cp1-gpt2-1.2B-gbs8-len4096-ra", recs, 3)[col] == "1.00x / 1.00x"
    assert _row("302-cp2-gpt2-1.2B-gbs8-len4096", recs, 3)[col] == "2.09x / —"  # published 995 / 475 ms
    assert _row("312-cp2-gpt2-1.2B-gbs8-len4096-ag", recs, 3)[col] == "— / 2.50x"
    assert _row("332-cp2-gpt2-1.2B-gbs8-len32k", recs, 3)[col] == ""  # neither side has 331 timed here
    assert _row("338-cp8-gpt2-1.2B-gbs8-len16k", recs, 3)[col] == ""  # no recompute row at 16k


# --------------------------------------------------------------------------- chapter-specific columns

def _exp(id_: str, chapter: int, model: str = "gpt2-large", **kw) -> catalog.Experiment:
    kw.setdefault("gpus", kw.get("tp", 1) * kw.get("pp", 1))
    kw.setdefault("gbs", 8)
    kw.setdefault("mbs", kw["gbs"])
    return catalog.Experiment(id=id_, chapter=chapter, about="", model=model, **kw)


def _ok(target: str, ms: float) -> dict:
    return {"target": target, "status": "ok", "step_ms_median": ms, "num_gpus": 1, "mem_peak_gib": [40.0]}


def test_chapter_2_efficiencies_and_tp_arithmetic():
    exps = [  # weak series GBS 8 (refs R1, R2: 209 / 273 ms), strong series on gpt2-large (R11, R12: 210 / 200 ms)
        _exp("211-weak-tp1", 2, ref="R1"), _exp("212-weak-tp2", 2, "gpt2-xl", tp=2, ref="R2"),
        _exp("215-weak-tp2-analogue", 2, "gpt2-xl", tp=2, analogue_of="R2"),
        _exp("221-weak-tp1-gbs20", 2, gbs=20),
        _exp("231-strong-tp1", 2, ref="R11"), _exp("232-strong-tp2", 2, tp=2, ref="R12"),
        _exp("232-strong-tp2-other-model", 2, "gpt2-xl", tp=2),
        _exp("281-no-series", 2, "gpt2-xl", tp=2, gbs=4, sp=True),
    ]
    recs = {e.id: _ok(e.id, ms) for e, ms in zip(exps, (100.0, 125.0, 160.0, None, 300.0, 200.0, 50.0, 80.0))
            if ms is not None}
    df = tables.table_frame(2, typed(recs), exps=exps).set_index("make target")
    weak, strong = df["weak eff."], df["strong eff."]
    assert weak["211-weak-tp1"] == "100% / 100%"
    assert weak["212-weak-tp2"] == "77% / 80%"  # 209/273 and 100/125
    assert weak["215-weak-tp2-analogue"] == "— / 63%"  # no published number; 100/160
    assert weak["221-weak-tp1-gbs20"] == ""  # its own series (GBS 20), no step time on either side
    assert strong["231-strong-tp1"] == "1.00 / 1.00"
    assert strong["232-strong-tp2"] == "0.53 / 0.75"  # 210/(2*200) and 300/(2*200)
    assert strong["232-strong-tp2-other-model"] == ""  # another model: no TP1 row in its series
    assert weak["231-strong-tp1"] == strong["211-weak-tp1"] == weak["281-no-series"] == ""
    # b*s*h*4h/TP: 8*1024*1280*5120/1e9 = 53.7 GMAC; 2*b*s*h = 2*8*1024*1280 B = 21.0 MB
    assert (df.loc["211-weak-tp1", "GMAC/rank (MLP up)"], df.loc["211-weak-tp1", "all-reduce MB/call"]) == ("53.7", "")
    assert df.loc["232-strong-tp2", "GMAC/rank (MLP up)"] == "26.8"
    assert df.loc["232-strong-tp2", "all-reduce MB/call"] == "21.0"
    # gpt2-xl, b=4: 4*1024*1600*6400/2/1e9 = 20.97; 2*4*1024*1600/1e6 = 13.1
    assert (df.loc["281-no-series", "GMAC/rank (MLP up)"], df.loc["281-no-series", "all-reduce MB/call"]) == \
        ("21.0", "13.1")
    assert (df.loc["281-no-series", "TP"], df.loc["281-no-series", "SP"]) == ("2", "yes")
    assert list(df.columns[:11]) == ["Row", "model", "GBS", "MBS", "seq", "GPUs", "DP", "TP", "SP", "recompute",
                                     "GMAC/rank (MLP up)"]


def test_chapter_4_pipeline_columns():
    exps = [  # gpt2-large: 36 layers
        _exp("401-pp2-m1", 4, pp=2, gbs=8, mbs=8),
        _exp("404-pp2-m4", 4, pp=2, gbs=8, mbs=2),
        _exp("406-pp2-v3-m4", 4, pp=2, gbs=8, mbs=2, layers_per_virtual_stage=6),
        _exp("420-tp2", 4, tp=2, sp=True),
    ]
    df = tables.table_frame(4, {}, exps=exps).set_index("make target")
    assert list(df.loc["401-pp2-m1", ["m", "v", "bubble"]]) == ["1", "1", "100.0%"]
    assert list(df.loc["404-pp2-m4", ["m", "v", "bubble"]]) == ["4", "1", "25.0%"]
    assert list(df.loc["406-pp2-v3-m4", ["m", "v", "bubble"]]) == ["4", "3", "8.3%"]  # 18 layers/stage / 6
    assert list(df.loc["420-tp2", ["TP", "SP", "PP", "m", "v", "bubble"]]) == ["2", "yes", "1", "1", "1", ""]
    assert columns.bubble_fraction(exps[0]) == 1.0


def test_chapter_5_expert_columns():
    exps = [_exp("502-ep8", 5, gpus=8, gbs=32, mbs=4, num_experts=64, topk=8, ep=8, zero2=True),
            _exp("511-ep4-etp2", 5, gpus=8, gbs=32, mbs=4, num_experts=256, topk=8, ep=4, etp=2),
            _exp("599-dense", 5, gpus=2, gbs=8, mbs=4)]
    df = tables.table_frame(5, {}, exps=exps).set_index("make target")
    cols = ["experts", "top-k", "EP", "ETP", "experts/GPU", "ZeRO-2"]
    assert list(df.loc["502-ep8", cols]) == ["64", "8", "8", "1", "8", "yes"]
    assert list(df.loc["511-ep4-etp2", cols]) == ["256", "8", "4", "2", "64", "no"]
    assert list(df.loc["599-dense", cols]) == ["", "", "1", "1", "", "no"]
    assert df.loc["502-ep8", "status"] == "not run: needs 8 GPUs"


@pytest.mark.parametrize("chapter", [0, 1, 2, 3, 4, 5, 7])
def test_missing_inputs_give_empty_cells(chapter):
    bad = catalog.Experiment(id="299-no-such-model", chapter=chapter, about="", model="no-such-model",
                             gpus=2, gbs=8, mbs=4, tp=2, pp=1, ref="R999",
                             layers_per_virtual_stage=3)
    df = tables.table_frame(chapter, typed({bad.id: {"status": "ok"}}), exps=[bad])  # a record without numbers
    row = df.iloc[0]
    assert row["make target"] == bad.id and row["status"] == "ok"
    for name in ("GMAC/rank (MLP up)", "all-reduce MB/call", "v", "bubble", "experts/GPU", "seq"):
        if name in df.columns:
            assert row[name] == "", name


def test_chapter_footnotes_explain_computed_columns():
    for chapter, cols in columns.CHAPTER_COLUMNS.items():
        assert len({c.name for c in cols}) == len(cols), chapter
    notes = " ".join(c.note or "" for c in columns.CHAPTER_COLUMNS[2])
    assert "TP1 ms / TPN ms" in notes and "b·s·h·4h" in notes


# --------------------------------------------------------------------------- writing and --check

def test_write_and_check(tmp_path, capsys):
    """Pages from nothing in one pass (the index after the data page and the overview it lists), then
    unchanged; --check sees what a new record moves."""
    root = tmp_path
    runs = root / "results" / "runs"
    _write(runs, "r1")
    (root / "results" / "data" / "runs").mkdir(parents=True)
    pages = {ch: root / m["table"] for ch, m in catalog.chapters().items()}

    assert main(["tables", "--check", "--root", str(root)]) == 1  # nothing written yet
    out = capsys.readouterr().out
    assert "out of date: results/01-dp-zero2.md" in out and "out of date: results/00-two-gpu-tour.md" in out
    assert not any(p.exists() for p in pages.values())

    assert main(["tables", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "wrote results/01-dp-zero2.md" in out and "wrote results/00-two-gpu-tour.md" in out
    assert all(p.exists() for p in pages.values())
    index = (root / "results" / "README.md").read_text()
    assert "[data/README.md](data/README.md)" in index and (root / "results" / "data" / "README.md").exists()
    assert index.split("\n")[4] == "![Every row with a published number: ours over theirs, step time and memory per " \
        "GPU](overview.svg)" and (root / "results" / "overview.svg").exists()
    assert list(pages[1].parent.glob("*.tmp")) == []
    mtimes = [p.stat().st_mtime_ns for p in pages.values()]

    assert main(["tables", "--check", "--root", str(root)]) == 0
    assert tables.write_tables(root) == []  # unchanged: nothing rewritten
    assert [p.stat().st_mtime_ns for p in pages.values()] == mtimes

    _write(runs, "r2", target=T111, started="2025-03-05T10:00:00+00:00")
    assert main(["tables", "--check", "--root", str(root)]) == 1
    assert "out of date: results/01-dp-zero2.md" in capsys.readouterr().out
    # the chapter's figure shows the new point too, and is redrawn before the page that links it
    # (then the page's CSV of the same rows and the index's status line)
    assert tables.write_tables(root) == [root / "results" / "plots" / "01-dp-zero2-memory.svg", pages[1],
                                         pages[1].with_suffix(".csv"), root / "results" / "runs.csv",
                                         root / "results" / "rows.csv", root / "results" / "overview.svg",
                                         root / "results" / "README.md"]
    assert T111 in pages[1].read_text()
