"""Results people can find (issue 20): results/README.md indexes every page, CSV and figure; every
chapter table has a CSV of the same rows and a tok/s/GPU column; `compare` puts an outdir's runs
beside the committed ones in a folder of its own, never in results/."""
import csv
import datetime as dt
import io
from pathlib import Path

from megalab.core import catalog
import pandas as pd

from megalab.results import columns, dataset, index, overview, tables
from megalab.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
T101 = "101-gpt2xl-dp1-gbs1-bf16"


# later than every committed run (so it is the newest), and not in the future: a record that starts there is refused
RECENT = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat(timespec="seconds")


def _write(root: Path, run: str, **fields) -> Path:
    """test_tables' fixture record, started later than every committed run (so it is the newest)."""
    from test_tables import _write as write_record

    return write_record(root, run, **{"started": RECENT, **fields})


def test_tokens_per_second_per_gpu_is_gbs_times_seq_over_step_time_and_gpus():
    exp = catalog.get("122")  # GBS 32, seq 1024, 2 GPUs
    assert columns.tokens_per_s_per_gpu(exp, 500.0) == 32 * 1024 / 0.5 / 2
    assert columns.tokens_per_s_per_gpu(exp, None) is None
    for chapter in catalog.chapters():
        assert "tok/s/GPU" in columns.columns(chapter)


def test_the_tokens_cell_reads_the_record(tmp_path):
    _write(tmp_path, "r1")
    df = tables.table_frame(1, tables.load_records(tmp_path))
    row = df[df["make target"] == T101].iloc[0]
    assert row["tok/s/GPU"] == "4,096"  # 1 x 1024 tokens / 0.25 s / 1 GPU


def test_every_chapter_page_has_a_csv_with_the_same_rows():
    for chapter, meta in catalog.chapters().items():
        page = ROOT / meta["table"]
        rows = list(csv.DictReader(io.StringIO(page.with_suffix(".csv").read_text(encoding="utf-8"))))
        df = tables.table_frame(chapter)
        assert [r["make target"] for r in rows] == list(df["make target"]), page.name
        assert list(rows[0]) == columns.columns(chapter)


def test_chapter_6_renders_every_row_not_run_with_no_published_columns():
    df = tables.table_frame(6, {})
    assert len(df) == len([e for e in catalog.catalog().values() if e.chapter == 6]) >= 7
    assert set(df["status"]) == {"not run yet"}
    assert not any(c.startswith(("ref ", "Δ")) for c in df.columns)
    page = tables.render_chapter(6, {})
    assert "No published table" in page and "Chapter 6" in page


def test_the_index_links_every_chapter_page_csv_and_figure():
    text = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    records = tables.load_records()
    frames = {ch: tables.table_frame(ch, records) for ch in catalog.chapters()}
    rows = pd.read_csv(ROOT / "results" / "rows.csv", **dataset.read_csv_args(dataset.row_columns()))
    said = overview.sentence(overview.points(rows))
    assert text == index.render(ROOT, frames, overview=said)  # current (make tables writes it)
    assert text.index("](overview.svg)") < text.index("| chapter |")  # the picture first
    for meta in catalog.chapters().values():
        name = Path(meta["table"]).name
        assert f"]({name})" in text and f"]({Path(name).with_suffix('.csv')})" in text
    for fig in (ROOT / "results" / "plots").glob("*.svg"):
        assert f"(plots/{fig.name})" in text


def test_status_summary():
    assert index.status_summary(["ok", "ok", "oom (as reference)", "not run yet", "failed"]) == \
        "5 targets: 2 ok, 1 oom, 1 not run, 1 failed"


def test_compare_writes_your_runs_beside_the_committed_ones_elsewhere(tmp_path):
    before = {p: p.read_bytes() for p in sorted((ROOT / "results").rglob("*")) if p.is_file()}
    outdir = tmp_path / "outdir"
    _write(outdir, "2099-03-01___101", step_ms_median=200.0)
    assert main(["compare", str(outdir)]) == 0
    out = outdir / "compare" / "results"
    page = (out / "01-dp-zero2.md").read_text(encoding="utf-8")
    rows = list(csv.DictReader((out / "01-dp-zero2.csv").open(encoding="utf-8")))
    mine = next(r for r in rows if r["make target"] == T101)
    assert mine["our ms"] == "200" and mine["tok/s/GPU"] == "5,120"
    committed = tables.table_frame(1)
    others = [r for r in rows if r["make target"] != T101]
    assert [r["our ms"] for r in others] == list(committed[committed["make target"] != T101]["our ms"])
    assert T101 in (out / "README.md").read_text(encoding="utf-8") and "# Chapter 1" in page
    assert {p: p.read_bytes() for p in before} == before  # results/ untouched
    assert not [p for p in (ROOT / "results").rglob("*") if p.is_file() and p not in before]


def test_compare_refuses_a_missing_outdir_and_results_itself(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert "fix:" in capsys.readouterr().err
    (tmp_path / "o").mkdir()
    assert main(["compare", str(tmp_path / "o"), "--out", str(ROOT)]) == 2


def test_the_overview_divides_ours_by_the_published_and_counts_the_rows_at_or_below():
    rows = pd.DataFrame({"target": ["101-a", "111-b", "121-c", "130-d"], "chapter": [1, 1, 1, 1],
                         "row_status": ["ok", "ok", "ok", "oom"], "step_ms": [50.0, 400.0, 380.0, float("nan")],
                         "ref_step_ms": [200.0, 380.0, float("nan"), 500.0],
                         "mem_peak_gib_max": [30.0, 70.0, 75.0, 80.0], "ref_mem_gib": [32.0, 76.0, float("nan"), 78.0],
                         "ref_oom": [False, False, True, False], "provenance": ["today", "older", "today", "older"]})
    pts = overview.points(rows)
    assert list(pts["target"]) == ["101-a", "111-b"]  # 121: the reference ran out of memory; 130: ours did
    assert list(pts["ms"].round(3)) == [0.25, 1.053] and list(pts["today"]) == [True, False]
    said = overview.sentence(pts)
    assert said.startswith("2 rows have a published number and one of ours (1 of them today's code and defaults): "
                           "1 of 2 take at most the published step time and 2 of 2 use at most")
    assert overview._draw(pts) == overview._draw(pts)  # the same bytes for the same rows, each drawn
    assert overview.draw(pts) == overview._draw(pts)  # and kept (the machine's cache)


def test_every_page_with_older_rows_says_what_they_carry():
    """A chapter page whose rows are not all today's names them and the verdicts that read them."""
    rows = pd.read_csv(ROOT / "results" / "rows.csv", **dataset.read_csv_args(dataset.row_columns()))
    for chapter, meta in catalog.chapters().items():
        mine = rows[(rows["chapter"] == chapter) & rows["ran"] & (rows["provenance"] != "today")]
        page = (ROOT / meta["table"]).read_text(encoding="utf-8")
        if mine.empty:
            assert "- older rows (" not in page
            continue
        note = next(line for line in page.splitlines() if line.startswith("- older rows ("))
        assert note.split(": ", 1)[1].split(". ")[0] == ", ".join(sorted(t.split("-", 1)[0] for t in mine["target"]))
