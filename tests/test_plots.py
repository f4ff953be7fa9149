"""megalab.results.plots: the figures build from the committed records, redraw byte for byte, plot the numbers
the tables show, and a chapter without rows gets no figure (and no link) instead of an error.

The data series are checked (not pixels): they are what a figure says. Expected values are computed
from configs/reference and the run records, never typed in.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from megalab.core import catalog
from megalab.results import columns, plots, tables
from megalab.core.catalog import Experiment
from conftest import typed
from megalab.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def _figure(chapter: int, name: str, **kw):
    return next(d for f, d in plots.chapter_figures(chapter, **kw) if f.name == name)


def _expected_files() -> set[str]:
    chapters = catalog.chapters()
    return {plots.file_name(f, chapters[f.chapter]["table"]) for f in plots.FIGURES if f.chapter in chapters}


def test_build_from_committed_records_is_deterministic(tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):  # each drawn by matplotlib: a cache of its own (draw() keeps what it drew)
        monkeypatch.setenv("MEGALAB_CACHE_DIR", str(tmp_path / f"cache-{out.name}"))
        assert main(["plots", "--out", str(out)]) == 0
    names = {p.name for p in a.iterdir()}
    assert names == _expected_files() and {"01-dp-zero2-memory.svg", "04-pp-vpp-pp-bubble.svg"} <= names
    for p in a.iterdir():
        svg = p.read_bytes()
        assert svg == (b / p.name).read_bytes(), f"{p.name} differs between two draws"
        assert b"<svg" in svg and b"<dc:date>" not in svg and b"Matplotlib v" not in svg
    capsys.readouterr()
    assert main(["plots", "--out", str(a)]) == 0  # unchanged inputs: nothing rewritten
    assert capsys.readouterr().out == "plots up to date\n"


def test_bad_out_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    assert main(["plots", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fix:" in err


def test_memory_series_are_the_reference_and_the_records():
    d = _figure(1, "memory")
    ref = tables.load_reference()
    pub = d[(d["source"] == "published") & ~d["oom"]]
    assert len(pub) >= 5
    for _, r in pub.iterrows():  # total = per-GPU published figure (nvidia-smi MiB / 1000) in GiB x GPUs
        assert r["y"] == pytest.approx(float(ref.loc[(1, r["row"]), "mem_gb_per_gpu"]) * 1000 / 1024 * r["x"])
    assert set(d[d["source"] == "published"]["row"]) >= {"R3", "R5", "R12", "R7"}
    assert d[d["row"] == "R7"]["oom"].iloc[0]  # the reference's oom, drawn as such
    records = tables.load_records()
    ours = d[d["source"] == "megalab"]
    assert len(ours) and ours["analogue"].any()
    for _, r in ours.iterrows():
        assert r["y"] == pytest.approx(sum(records[r["target"]].mem_peak_gib))
    assert (d["m"] == 1).all() and (d[["tp", "pp"]] == 1).all().all()  # pure DP, no accumulation


def test_no_sharing_line_is_dp_times_the_dp1_memory():
    d = _figure(1, "memory")
    for series, xs, ys in plots._no_sharing(d):
        base = ys[xs.index(1)]
        assert ys == pytest.approx([base * x for x in xs])
        assert base in set(d[(d["series"] == series) & (d["x"] == 1)]["y"])


@pytest.mark.parametrize("name,column,scale", [("weak-scaling", "weak eff.", 100),
                                               ("strong-scaling", "strong eff.", 1)])
def test_efficiencies_match_the_table(name, column, scale):
    d = _figure(2, name)
    table = tables.table_frame(2).set_index("make target")  # the committed records' table
    assert (d["source"] == "published").sum() >= 8
    for _, r in d.iterrows():
        side = 0 if r["source"] == "published" else 1  # cells read `published / ours`
        cell = table.loc[r["target"], column].split(" / ")[side].rstrip("%")
        assert columns._fixed(r["y"], 0 if scale == 100 else 2) == cell


def test_bubble_model_starts_at_the_smallest_m():
    d = _figure(4, "pp-bubble")
    assert (d["pp"] > 1).all() and (d["tp"] == 1).all() and (d["v"] == 1).all()
    for series, xs, ys in plots._bubble_model(d):
        g = d[d["series"] == series].sort_values("x")
        p, m0, t0 = g["pp"].iloc[0], g["x"].iloc[0], g["y"].iloc[0]
        assert xs[0] == m0 and ys[0] == pytest.approx(t0)
        t_c = t0 / (1 + (p - 1) / m0)
        assert ys[-1] == pytest.approx(t_c * (1 + (p - 1) / xs[-1]))


def test_moe_memory_series():
    d = _figure(5, "moe-memory")
    assert set(d["series"]) >= {"DP only", "ZeRO-2", "ZeRO-2 + EP=8"}
    assert d[(d["series"] == "ZeRO-2") & (d["x"] == 256)]["oom"].all()


# ---------------------------------------------------------------- a chapter being written (CP)

def _cp(id_: str, ref: str | None, cp: int, comm: str | None, gpus: int = 8, **kw) -> Experiment:
    return Experiment(id=id_, chapter=3, about="", model="gpt2-1.2B", gpus=gpus, gbs=8, mbs=8, cp=cp,
                      cp_comm=comm, ref=ref, **kw)


CP_EXPS = [_cp("300-base", "R0", 1, "p2p", gpus=1, recompute="full-uniform-1"),
           _cp("301-oom", "R1", 1, "p2p", gpus=1), _cp("302", "R2", 2, "p2p", gpus=2),
           _cp("308", "R4", 8, "p2p"), _cp("318", "R5", 8, "all_gather"), _cp("328", "R6", 8, "a2a")]


def test_cp_published_only_figure():
    figs = plots.chapter_figures(3, {}, exps=CP_EXPS)
    assert [f.name for f, _ in figs] == ["cp-speedup"]
    fig, d = figs[0]
    ref = tables.load_reference()
    for _, r in d.iterrows():
        assert r["y"] == pytest.approx(ref.loc[(3, "R0"), "step_ms"] / ref.loc[(3, r["row"]), "step_ms"])
    assert list(d[d["cp"] == 8].sort_values("x")["xtick"]) == ["p2p", "all_gather", "a2a"]
    assert "published points only" in plots.title(fig, d)
    assert plots.draw(fig, d).startswith(b"<?xml")


def test_cp_with_a_measured_row():
    rec = {"target": "302", "status": "ok", "step_ms_median": 500.0, "gpu_name": "NVIDIA H200",
           "mem_peak_gib": [40.0, 40.0], "config": {}}
    base = {**rec, "target": "300-base", "step_ms_median": 900.0, "mem_peak_gib": [38.0]}
    _, d = plots.chapter_figures(3, typed({"302": rec, "300-base": base}), exps=CP_EXPS)[0]
    ours = d[d["source"] == "megalab"]
    assert list(ours["y"]) == [pytest.approx(900.0 / 500.0)]
    fig = plots.FIGURES[[f.name for f in plots.FIGURES].index("cp-speedup")]
    assert "published points only" not in plots.title(fig, d)
    assert plots._source_label("megalab", False, d, "anchor") == "megalab (H200, no TE)"


@pytest.mark.parametrize("exps", [[], CP_EXPS[:2]], ids=["no rows", "no speedup to show"])
def test_missing_rows_give_no_figure(exps):
    assert plots.chapter_figures(3, {}, exps=exps) == []


def test_chapter_without_figures_links_none():
    assert "![" not in tables.render_chapter(0, {})
    assert "](plots/01-dp-zero2-memory.svg)" in tables.render_chapter(1, {})


def test_stale_figure_is_removed_and_check_sees_it(tmp_path):
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    assert {p.name for p in plots.write_plots(tmp_path, check=True)} == _expected_files()
    stale = tmp_path / "results" / "plots" / "09-gone-figure.svg"
    assert plots.write_plots(tmp_path)  # published points only: still every figure
    stale.write_text("<svg/>")
    assert plots.write_plots(tmp_path, check=True) == [stale]
    assert plots.write_plots(tmp_path) == [stale] and not stale.exists()
    (runs / "r1").mkdir()
    (runs / "r1" / "run.json").write_text(json.dumps(
        {"target": "111-gpt2xl-dp1-fit-80GB", "status": "ok", "mem_peak_gib": [70.0], "gpu_name": "NVIDIA H200"}))
    assert [p.name for p in plots.write_plots(tmp_path)] == ["01-dp-zero2-memory.svg"]


def test_a_drawing_is_kept_in_the_cache_and_a_damaged_one_is_drawn_again(tmp_path, monkeypatch):
    """draw() keeps its bytes in the machine's cache under what they depend on: the same inputs read them
    back (no matplotlib), other data draws anew, and a cache file whose bytes no longer match its name is
    never used."""
    monkeypatch.setenv("MEGALAB_CACHE_DIR", str(tmp_path))
    fig, data = next((f, d) for f, d in plots.chapter_figures(1) if len(d))
    drawn = []
    real = plots._draw
    monkeypatch.setattr(plots, "_draw", lambda *a: drawn.append(a) or real(*a))
    first = plots.draw(fig, data)
    assert plots.draw(fig, data) == first and len(drawn) == 1
    (kept,) = (tmp_path / "plots").glob("*.svg")
    kept.write_bytes(first.replace(b"</svg>", b"<!-- x --></svg>"))
    assert plots.draw(fig, data) == first and len(drawn) == 2  # damaged: drawn again, the cache mended
    assert kept.read_bytes() == first
    other = data.assign(y=data["y"] * 2)
    assert plots.draw(fig, other) != first and len(drawn) == 3
