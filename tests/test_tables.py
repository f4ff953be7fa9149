"""megalab.tables: record selection, cell formatting, the chapter page (golden) and --check.

The records under tests/fixtures/records are invented test fixtures ("fixture": true), not
measurements. Regenerate the golden page after an intended format change with
MEGALAB_UPDATE_GOLDEN=1 pytest tests/test_tables.py, then read the diff before committing it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from megalab import catalog, tables

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "records"
GOLDEN = FIXTURES / "golden" / "01-dp-zero2.md"

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


def _row(target: str, records: dict) -> dict:
    df = tables.table_frame(1, records)
    return df[df["make target"] == target].iloc[0].to_dict()


# --------------------------------------------------------------------------- fixtures and golden

def test_fixture_records_are_marked_as_fixtures():
    paths = sorted(RECORDS.glob("*/run.json"))
    assert len(paths) == 4
    for p in paths:
        assert json.loads(p.read_text())["fixture"] is True, p


def test_golden_chapter_1():
    text = tables.render_chapter(1, tables.load_records(RECORDS))
    if os.environ.get("MEGALAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_table_rows_follow_catalog_order():
    df = tables.table_frame(1, {})
    assert list(df.columns) == tables.COLUMNS
    assert list(df["make target"]) == [e.id for e in catalog.catalog().values() if e.chapter == 1]


def test_hand_checked_rows():
    recs = tables.load_records(RECORDS)
    r = _row(T101, recs)  # ours 30.12 GiB, 251.4 ms vs published 33.3 GB, 220 ms
    assert (r["Row"], r["ref GB/GPU"], r["our GB/GPU"], r["Δ GB"]) == ("R1", "33.3", "30.1", "-3.2")
    assert (r["ref ms"], r["our ms"], r["Δ ms"], r["our p10–p90 ms"]) == ("220", "251", "+14%", "250–255")
    assert (r["MFU"], r["hardware"], r["status"]) == ("4.2%", "1x H100 80GB", "ok")
    r = _row(T122, recs)  # two GPUs 73.42 / 75.08 GiB, 448.7 ms vs 74.9 GB, 423 ms, 80 GB cap
    assert (r["our GB/GPU"], r["Δ GB"], r["our ms"], r["Δ ms"]) == ("73.4 / 75.1", "+0.2", "449", "+6%")
    assert r["hardware"] == "2x H200, capped 80 GB"
    r = _row(T121, recs)  # oom on both sides
    assert (r["ref GB/GPU"], r["our ms"], r["Δ GB"], r["status"]) == ("oom", "", "", "oom (as reference)")


# --------------------------------------------------------------------------- load_records

def test_newest_ok_record_wins_over_newer_failed(tmp_path):
    _write(tmp_path, "a", status="ok", started="2025-03-01T10:00:00+00:00", step_ms_median=111.0)
    _write(tmp_path, "b", status="ok", started="2025-03-02T10:00:00+00:00", step_ms_median=222.0)
    _write(tmp_path, "c", status="failed", started="2025-03-03T10:00:00+00:00", step_ms_median=None)
    assert tables.load_records(tmp_path)[T101]["step_ms_median"] == 222.0


def test_newest_of_any_status_when_none_usable(tmp_path):
    _write(tmp_path, "a", status="failed", started="2025-03-01T10:00:00+00:00", returncode=1)
    _write(tmp_path, "b", status="incomplete", started="2025-03-02T10:00:00+00:00", returncode=2)
    assert tables.load_records(tmp_path)[T101]["status"] == "incomplete"


def test_oom_counts_as_usable(tmp_path):
    _write(tmp_path, "a", target=T121, status="oom", started="2025-03-01T10:00:00+00:00")
    _write(tmp_path, "b", target=T121, status="failed", started="2025-03-02T10:00:00+00:00")
    assert tables.load_records(tmp_path)[T121]["status"] == "oom"


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
    assert tables.not_run_reason(cat["118-gpt2xl-dp8-fit-8x80GB"]) == "not run: needs 8 GPUs"
    assert tables.not_run_reason(cat["104-gpt2xl-dp4-gbs4"]) == "not run: needs 4 GPUs"
    assert tables.not_run_reason(cat["102-gpt2xl-dp2-gbs2"]) == "not run yet"
    assert tables.not_run_reason(cat[T101]) == "not run yet"
    r = _row("102-gpt2xl-dp2-gbs2", {})
    assert (r["Row"], r["ref GB/GPU"], r["ref ms"]) == ("~R2", "—", "—")
    assert r["our GB/GPU"] == r["our ms"] == r["hardware"] == ""
    assert _row("118-gpt2xl-dp8-fit-8x80GB", {})["status"] == "not run: needs 8 GPUs"


@pytest.mark.parametrize("ours, ref, want", [
    (251, 220, "+14%"), (200, 220, "-9%"), (220, 220, "+0%"), (219.5, 220, "+0%"),
    (231, 220, "+5%"), (None, 220, ""), (250, None, ""),
])
def test_delta_percent(ours, ref, want):
    assert tables.fmt_delta_pct(ours, ref) == want


@pytest.mark.parametrize("ours, ref, want", [
    (30.12, 33.3, "-3.2"), (79.61, 78.5, "+1.1"), (33.3, 33.3, "+0.0"), (33.26, 33.3, "+0.0"),
    (None, 33.3, ""), (30.0, None, ""),
])
def test_delta_gb(ours, ref, want):
    assert tables.fmt_delta_gb(ours, ref) == want


def test_memory_cell():
    assert tables.fmt_mem([]) == ("", None)
    assert tables.fmt_mem([70.0, 70.9]) == ("70.9", 70.9)
    assert tables.fmt_mem([60.0, 70.04]) == ("60.0 / 70.0", 70.04)
    assert tables.fmt_mem([60.0, 61.0, 65.0, 62.0])[0] == "60.0–65.0"


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


def test_reference_tables_load():
    ref = tables.load_reference()
    assert ref.loc[(1, "R1"), "step_ms"] == 220
    assert ref.loc[(1, "R7"), "mem_gb_per_gpu"] == "oom"
    two = tables.load_twogpu_reference()
    assert two.loc["T1", "step_ms"] == pytest.approx(437.2)


# --------------------------------------------------------------------------- writing and --check

def test_write_and_check(tmp_path, capsys):
    root = tmp_path
    runs = root / "results" / "runs"
    _write(runs, "r1")
    pages = [root / m["table"] for m in catalog.chapters().values()]

    assert tables.cli(["--check", "--root", str(root)]) == 1  # nothing written yet
    out = capsys.readouterr().out
    assert "out of date: results/01-dp-zero2.md" in out
    assert not any(p.exists() for p in pages)

    assert tables.cli(["--root", str(root)]) == 0
    assert "wrote results/01-dp-zero2.md" in capsys.readouterr().out
    assert all(p.exists() for p in pages)
    assert list(pages[0].parent.glob("*.tmp")) == []
    mtimes = [p.stat().st_mtime_ns for p in pages]

    assert tables.cli(["--check", "--root", str(root)]) == 0
    assert tables.write_tables(root) == []  # unchanged: nothing rewritten
    assert [p.stat().st_mtime_ns for p in pages] == mtimes

    _write(runs, "r2", target=T111, started="2025-03-05T10:00:00+00:00")
    assert tables.cli(["--check", "--root", str(root)]) == 1
    assert "out of date: results/01-dp-zero2.md" in capsys.readouterr().out
    assert tables.write_tables(root) == [pages[0]]
    assert T111 in pages[0].read_text()
