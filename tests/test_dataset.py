"""results/runs.csv and results/rows.csv (megalab/results/dataset.py): read with pandas, every column in
the type its schema names, every committed record and every chapter-table row present, and the rows
agreeing with the pages they come from."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pandas.api import types

from megalab.core import catalog
from megalab.core.records import read_records
from megalab.results import dataset as D

ROOT = Path(__file__).resolve().parent.parent


def _read(path: str, spec: list[D.Col]) -> pd.DataFrame:
    """As results/README.md says to read it: text columns as text (a version such as CUDA's 13.0 would
    otherwise read as a number), times parsed."""
    df = pd.read_csv(ROOT / path, **D.read_csv_args(spec))
    plain = pd.read_csv(ROOT / path)  # with no hints at all, numbers and booleans still read as typed
    for col in spec:
        if col.kind in ("int", "number", "bool"):
            assert plain[col.name].dtype == df[col.name].dtype, col.name
    return df


@pytest.fixture(scope="module")
def runs():
    return _read(D.RUNS_CSV, [c for c, _ in D.run_columns()])


@pytest.fixture(scope="module")
def rows():
    return _read(D.ROWS_CSV, D.row_columns())


def _check_types(df: pd.DataFrame, spec: list[D.Col]) -> None:
    assert list(df.columns) == [c.name for c in spec]
    for col in spec:
        s = df[col.name]
        if col.kind == "int":
            assert s.dtype == "int64", col.name
        elif col.kind == "number":
            assert s.dtype == "float64", col.name  # NaN where missing: never text such as `oom` or `1,234`
        elif col.kind == "bool":
            assert s.dtype == bool, col.name
        elif col.kind == "time":
            present = s.dropna()
            assert types.is_datetime64_any_dtype(s) and str(s.dt.tz) == "UTC", col.name
            assert len(present) > 0
        else:
            assert not types.is_numeric_dtype(s) or s.isna().all(), col.name


def test_runs_csv_types_and_every_committed_record(runs):
    _check_types(runs, [c for c, _ in D.run_columns()])
    committed = {(k, r.run_dir.name) for k, d in D.RUN_DIRS.items() for r in read_records(ROOT / d)}
    assert set(zip(runs["collection"], runs["run"])) == committed and len(runs) == len(committed)
    assert set(runs["status"]) <= {"ok", "oom", "failed", "incomplete", "killed", "hung", "oom_busy"}
    # a run without a step time has none in the file (its status says why), and memory is per GPU too
    assert runs.loc[runs["status"].isin(["oom", "failed", "killed", "hung"]), "step_ms_median"].isna().all()
    ok = runs[runs["status"] == "ok"]
    assert (ok["mem_peak_gib_max"] >= ok["mem_peak_gib_gpu0"]).all() and (ok["timed_steps"] > 0).all()
    # a record is today's or older (unknown where git cannot say); after a change to megalab/runtime every
    # record is older until the rows are run again
    assert "older" in set(runs["provenance"]) and set(runs["provenance"]) <= {"today", "older", "unknown"}


def test_rows_csv_types_and_every_table_row(rows):
    _check_types(rows, D.row_columns())
    assert list(rows["target"]) == [e.id for ch in catalog.chapters() for e in catalog.catalog().values()
                                    if e.chapter == ch]
    for chapter, meta in catalog.chapters().items():
        page = pd.read_csv(ROOT / Path(meta["table"]).with_suffix(".csv"), dtype=str, keep_default_na=False)
        mine = rows[rows["chapter"] == chapter].reset_index(drop=True)
        assert list(page["make target"]) == list(mine["target"])
        for (_, cell), (_, r) in zip(page.iterrows(), mine.iterrows()):
            # the same row as the page shows it: step time, runs, timed steps, provenance
            assert cell["our ms"] == ("" if pd.isna(r["step_ms"]) else f"{r['step_ms']:.0f}") or \
                abs(float(cell["our ms"]) - r["step_ms"]) <= 0.5
            assert cell["runs"].split(" ")[0] == ("" if r["runs"] == 0 else str(r["runs"]))
            steps = "" if pd.isna(r["timed_steps_min"]) else (
                f"{r['timed_steps_min']:.0f}" if r["timed_steps_min"] == r["timed_steps_max"]
                else f"{r['timed_steps_min']:.0f}–{r['timed_steps_max']:.0f}")
            assert cell["timed steps"] == steps
            assert cell["provenance"].split(" ")[0] == r["provenance"] if r["ran"] else cell["provenance"] == ""
            assert cell["machine"] == r["machine"]  # one key for a machine, page and file alike
            # the runs of the median, named: as many as `runs` counts, the row's own run among them
            names = r["median_of"].split()
            assert len(names) == r["runs"] or (r["runs"] == 0 and len(names) <= 1)
            assert not r["ran"] or r["run"] in names
            if "predicted GiB" in page.columns:
                assert (cell["predicted GiB"] == "") == pd.isna(r["predicted_mem_gib"])
    # predictions only for rows no machine here runs, and never in a measured column
    assert rows.loc[rows["gpus"] <= 2, "predicted_mem_gib"].isna().all()
    assert rows.loc[rows["gpus"] > 2, "predicted_mem_gib"].notna().all()
    assert rows.loc[~rows["ran"], "step_ms"].isna().all()


def test_the_readme_one_liner_runs_as_written():
    """results/README.md's pandas line, run as a reader pastes it (from the checkout's root)."""
    import os
    import re

    line = re.search(r"`(pd\.read_csv\('results/runs\.csv'[^`]*)`", (ROOT / "results" / "README.md").read_text()).group(1)
    here = os.getcwd()
    try:
        os.chdir(ROOT)
        df = eval(line, {"pd": pd})  # noqa: S307  (our own page's example)
    finally:
        os.chdir(here)
    assert str(df["started"].dt.tz) == "UTC" and df["cuda"].map(type).eq(str).all()
    assert {"loss_first", "loss_last", "machine"} <= set(df.columns) and df["loss_last"].notna().any()


def test_the_schema_is_documented_in_results_readme():
    text = (ROOT / "results" / "README.md").read_text()
    assert "## Data" in text
    for col in [c for c, _ in D.run_columns()] + D.row_columns():
        assert f"| `{col.name}` | {col.kind} |" in text, col.name
    assert {c.kind for c, _ in D.run_columns()} | {c.kind for c in D.row_columns()} <= set(D.KINDS)


def test_the_clock_columns_are_the_monitors_busy_samples(runs, tmp_path):
    """sm_mhz_busy and power_capped_share: each run's busy samples (core.clocks, all GPUs pooled), as `bench clocks`
    reads them; NaN for a run whose monitor sampled no clocks or whose CSV is damaged, never an error."""
    from megalab.core import clocks

    sampled = runs[runs["sm_mhz_busy"].notna()]
    assert len(sampled) > 0 and runs["sm_mhz_busy"].isna().any()  # monitors from before the clocks: NaN
    assert (runs["sm_mhz_busy"].notna() == runs["power_capped_share"].notna()).all()
    assert sampled["power_capped_share"].between(0, 1).all()
    for _, row in sampled.iterrows():
        folder = ROOT / D.RUN_DIRS[row["collection"]] / row["run"]
        fig = clocks.pooled(folder).figures()
        assert row["sm_mhz_busy"] == round(fig["sm_mhz"]) and row["power_capped_share"] == round(
            fig["held"].get("power_cap", 0.0), 3), row["run"]
    D._clock_figures.cache_clear()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "gpu_memory.csv").write_text("t_s,gpu,mem_used_mib,util_pct,sm_mhz,power_w,held_by\n0,0,1,100,fast,1,\n")
    assert D._clock_figures(bad) == {} and D._clock_figures(None) == {}
    (bad / "gpu_memory.csv").write_text("t_s,gpu,mem_used_mib,util_pct,sm_mhz,power_w,held_by\n0,0,1,100,1500,690,\n")
    D._clock_figures.cache_clear()
    assert D._clock_figures(bad)["sm_mhz"] == 1500 and D._clock_figures(bad)["held"] == {}
