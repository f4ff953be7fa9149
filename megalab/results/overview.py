"""The picture a newcomer looks at first (results/overview.svg, atop results/README.md): every chapter row that
has a published number and one of ours, ours over theirs, for the step time and for the memory per GPU.

A ratio below 1 is faster or smaller than the published run. It is no like-for-like measurement of a
parallelism idea: the published runs had Transformer Engine on 8x H100 or 2x H200, ours run without it on
the rig's machines. It says how far megalab's TE-free runs are from the published ones, row by row, and
which rows are today's code and defaults (their colour). Everything comes from rows.csv's typed frame
(dataset.rows_frame), the page's own numbers.
"""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from megalab.core import markdown
from megalab.results import plots

FIGURE = "overview.svg"  # beside results/README.md (results/plots/ holds the chapter figures only)
COLOURS = {True: "C2", False: "C7"}  # today's code and defaults / older


def points(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per chapter row with a published number and our measurement of it: target, chapter, the step
    time ratio and the memory ratio (NaN where one side lacks it: an out-of-memory run has no peak to divide),
    and whether its run is today's."""
    ok = rows[rows["row_status"] == "ok"]
    ms = ok["step_ms"] / ok["ref_step_ms"]
    mem = ok["mem_peak_gib_max"] / ok["ref_mem_gib"].where(~ok["ref_oom"])
    out = pd.DataFrame({"target": ok["target"], "chapter": ok["chapter"], "ms": ms, "mem": mem,
                        "today": ok["provenance"] == "today"})
    return out[out["ms"].notna() | out["mem"].notna()].reset_index(drop=True)


def sentence(pts: pd.DataFrame) -> str:
    """The line under the figure: how many rows are at or below the reference, for time and for memory."""
    ms, mem = pts["ms"].dropna(), pts["mem"].dropna()
    today = int(pts["today"].sum())
    return (f"{len(pts)} rows have a published number and one of ours ({today} of them today's code and defaults): "
            f"{int((ms <= 1).sum())} of {len(ms)} take at most the published step time and {int((mem <= 1).sum())} "
            f"of {len(mem)} use at most the published memory per GPU. The published runs had Transformer Engine "
            "(8x H100, or 2x H200 for chapter 0), ours have not: a ratio says how far megalab is from them, not what "
            "a parallelism idea does (the chapters' checks compare like runs for that).")


def draw(pts: pd.DataFrame) -> bytes:
    """Two panels, step time and memory, one dot per row (its short id), coloured today / older; SVG bytes,
    the same for the same points: kept in the machine's cache as the chapter figures are (plots.kept_drawing)."""
    return plots.kept_drawing(plots.drawing_digest(Path(__file__), pts.to_csv(index=False)), "svg", lambda: _draw(pts))


def _draw(pts: pd.DataFrame) -> bytes:
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    labels = [f"{t.split('-', 1)[0]}" for t in pts["target"]]
    ys = list(range(len(pts)))[::-1]
    with matplotlib.style.context("default"), matplotlib.rc_context(plots.STYLE):
        f = Figure(figsize=(9.0, max(4.0, 0.16 * len(pts) + 1.2)), dpi=plots.DPI, layout="constrained")
        axes = f.subplots(1, 2, sharey=True)
        for ax, col, what in zip(axes, ("ms", "mem"), ("step time", "memory per GPU")):
            for today, colour in COLOURS.items():
                sel = (pts["today"] == today) & pts[col].notna()
                ax.plot(pts.loc[sel, col], [ys[i] for i in pts.index[sel]], ls="none", marker="o", markersize=4,
                        color=colour)
            ax.axvline(1.0, color="0.3", lw=1, ls="--")
            ax.set(xlabel=f"ours / published, {what}", title=f"{what}: left of 1 = below the published")
        axes[0].set_yticks(ys, labels, fontsize=6)
        axes[0].set_ylim(-1, len(pts))
        handles = [Line2D([], [], ls="none", marker="o", color=COLOURS[True], label="today's code and defaults"),
                   Line2D([], [], ls="none", marker="o", color=COLOURS[False], label="older runs")]
        f.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
        buf = io.BytesIO()
        f.savefig(buf, format="svg", metadata=plots.SVG_META)
    return buf.getvalue()


def write(results: Path, rows: pd.DataFrame, *, check: bool = False) -> tuple[list, str]:
    """Draw RESULTS/overview.svg from ROWS (rows.csv's frame); (the paths changed, the sentence under it)."""
    pts = points(rows)
    path = results / FIGURE
    changed = [path] if markdown.write_if_changed(path, draw(pts), check=check) else []
    return changed, sentence(pts)
