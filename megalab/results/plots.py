"""Figures for the results pages: the published points beside ours, one idea per figure.

`make plots` (python -m megalab plots) draws every chapter's figures into results/plots/*.svg
from the same inputs as the tables (run records, the catalog, configs/reference); `make tables`
redraws them too, because the pages link them. A figure exists when it has at least one point:
with no runs of ours yet it shows the published points only and says so in its title; a chapter
without a catalog (or without the rows a figure needs) gets no figure and no link.

Files are deterministic (fixed size, SVG with a fixed hash salt and no date or version), so a
redraw from unchanged inputs rewrites nothing. pyplot is never imported: figures are matplotlib
Figure objects saved straight to SVG, so no display, backend or global state is involved. `--check` compares the set of files, not their
bytes: another matplotlib may lay text out differently, while the numbers behind a figure are the
ones its page's table shows, which `tables --check` already compares.

Public API:
  FIGURES                         every figure: chapter, name, title, axes, data and model lines
  points(ctx)                     one chapter's published and measured points (a DataFrame)
  chapter_figures(chapter, ...)   [(Figure, its data)] for the figures a chapter has
  page_links(ctx, page)           the markdown image lines of a chapter page
  write_plots(root, ...)          draw every figure; returns the paths that changed
  cli(argv)                       `python -m megalab plots [--out DIR] [--check]`
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from megalab.core import catalog
from megalab.core import provenance, gpus, infile, markdown, records as run_records, variables
from megalab.results import alike, chapter as chapters, hosts as machines, pageguard
from megalab.results.hosts import Hosts
from megalab.core.paths import ROOT, cache_root

PLOTS = "plots"  # folder beside the pages (results/plots), linked as plots/NAME.svg
SIZE, DPI = (9.0, 4.5), 100
# One look on every machine: matplotlib's defaults, not the user's matplotlibrc. Text stays text
# (svg.fonttype none) so the bytes do not depend on the font's glyph outlines.
STYLE = {"svg.hashsalt": "megalab", "svg.fonttype": "none", "font.size": 9,
         "axes.grid": True, "grid.alpha": 0.3}
SVG_META = {"Date": None, "Creator": None}  # no timestamp, no matplotlib version in the file

PUBLISHED_RIG = {"anchor": "8x H100, TE", "twogpu": "2x H200, TE"}
# Marker by where a point comes from; colour is the series.
MARKERS = {
    ("published", False): dict(marker="o", markersize=6),
    ("megalab", False): dict(marker="s", markersize=7, markerfacecolor="none", markeredgewidth=1.5),
    ("megalab", True): dict(marker="^", markersize=8, markerfacecolor="none", markeredgewidth=1.5),
}
COLUMNS = ["source", "analogue", "row", "target", "model", "seq", "gbs", "mbs", "gpus", "dp", "tp",
           "pp", "cp", "cp_comm", "ep", "etp", "experts", "zero2", "recompute", "m", "v", "scaling",
           "mem_gpu", "mem_total", "oom", "step_ms", "gpu", "te", "host"]


# --------------------------------------------------------------------------- points

def _safe(fn: Callable, default=None):
    try:
        return fn()
    except chapters.MISSING:  # an unknown model preset: the field is just unknown
        return default


def _layout(exp: catalog.Experiment, ctx: chapters.Context) -> dict:
    series = chapters.scaling_series(exp, ctx.exps)
    return {"row": chapters.row_id(exp), "target": exp.id, "model": exp.model,
            "seq": _safe(lambda: exp.seq_length), "gbs": exp.gbs, "mbs": exp.mbs, "gpus": exp.gpus,
            "dp": exp.dp, "tp": exp.tp, "pp": exp.pp, "cp": exp.cp, "cp_comm": exp.cp_comm, "ep": exp.ep,
            "etp": exp.etp, "experts": exp.num_experts, "zero2": exp.zero2, "recompute": exp.recompute,
            "m": exp.num_microbatches, "v": _safe(lambda: chapters.virtual_stages(exp)),
            "scaling": series[0] if series else None}


def _published(ref: pd.Series, kind: str, gpus: int) -> dict:
    if kind == "twogpu":  # MiB per GPU, GPU 0 and GPU 1
        mem = [v / 1024 for i in range(min(gpus, 2)) if (v := run_records.num(ref[f"mem_mib_gpu{i}"])) is not None]
        oom = False
    else:  # nvidia-smi MiB / 1000 per GPU (the largest), or 'oom': in GiB like ours (chapter.REF_GB_TO_GIB)
        text = str(ref["mem_gb_per_gpu"]).strip().lower()
        oom = text == "oom"
        one = run_records.num(text)
        mem = [] if one is None else [one * chapters.REF_GB_TO_GIB] * gpus
    return {"mem_gpu": max(mem) if mem else None, "mem_total": sum(mem) if mem else None,
            "oom": oom, "step_ms": run_records.num(ref["step_ms"]), "gpu": None, "te": True, "host": "published"}


def _ours(r: run_records.RunRecord, ctx: chapters.Context) -> dict:
    oom = r.status == "oom"  # its peak is the card's limit, not what the run needed
    mem = [] if oom else list(r.mem_peak_gib)
    return {"mem_gpu": max(mem) if mem else None, "mem_total": sum(mem) if mem else None, "oom": oom,
            "step_ms": r.measured[0], "gpu": gpus.short_gpu_name(r.gpu_name),
            "te": r.transformer_impl == "transformer_engine",
            "host": alike.key(r, ctx.hosts, ctx.tree)}  # a ratio divides like runs only (alike.py)


def points(ctx: chapters.Context) -> pd.DataFrame:
    """Published and measured points of a chapter, catalog order, one row each.

    A published row appears once (the first target naming it); a measured one when its target has a
    record that ran (ok, oom or incomplete). Profiled twins (timing_log_level) are left out: their
    timers slow the step.
    """
    rows, seen = [], set()
    for exp in ctx.exps:
        if exp.timing_log_level:
            continue
        layout = _layout(exp, ctx)
        if exp.ref and exp.ref not in seen and (ref := ctx.ref_row(exp)) is not None:
            seen.add(exp.ref)
            rows.append({**layout, **_published(ref, ctx.kind, exp.gpus), "source": "published",
                         "analogue": False})
        rec = ctx.rec(exp)
        if rec is not None and rec.status in ("ok", "oom", "incomplete"):
            rows.append({**layout, **_ours(rec, ctx), "source": "megalab",
                         "analogue": bool(exp.analogue_of and not exp.ref)})
    return pd.DataFrame(rows, columns=COLUMNS)


# --------------------------------------------------------------------------- figures
# A figure's `data` picks its points and adds `series` (legend text, one colour each), `x` and `y`
# (and `xtick` for a categorical axis); `model` returns the dashed lines a lesson's formula draws:
# (series or None for grey, xs, ys).

Lines = list[tuple[str | None, list, list]]


@dataclasses.dataclass(frozen=True)
class Figure:
    chapter: int
    name: str  # file: results/plots/<page stem>-<name>.svg
    title: str
    xlabel: str
    ylabel: str
    data: Callable[[pd.DataFrame], pd.DataFrame]
    model: Callable[[pd.DataFrame], Lines] | None = None
    model_label: str | None = None
    log2_x: bool = False  # x doubles from point to point


def _select(pts: pd.DataFrame, mask: pd.Series, series: pd.Series, x, y) -> pd.DataFrame:
    d = pts[mask].copy()
    d["series"], d["x"], d["y"] = series[mask], x[mask], y[mask]
    return d[d["oom"] | d["y"].notna()]


def _dp_memory(pts: pd.DataFrame) -> pd.DataFrame:
    # Pure data parallel, no gradient accumulation: memory per GPU should stay flat as DP grows, so
    # the total grows like DP without ZeRO-2 and slower with it.
    mask = ((pts[["tp", "pp", "cp", "ep", "m"]] == 1).all(axis=1))
    label = pts["zero2"].map({True: "ZeRO-2", False: "no ZeRO-2"}) + ", " + pts["model"] + \
        ", MBS " + pts["mbs"].astype(str)
    d = _select(pts, mask, label, pts["dp"], pts["mem_total"])
    return d[d.groupby("series")["x"].transform("nunique") >= 2]  # a lone point shows no trend


def _no_sharing(d: pd.DataFrame) -> Lines:
    """DP copies of the DP=1 run, nothing shared: the series' DP=1 memory times DP."""
    out = []
    for series, g in d.groupby("series", sort=False):
        base = g[(g["x"] == 1) & ~g["oom"]].sort_values("source", ascending=False)  # published first
        if len(base):
            xs = sorted(g["x"].unique())
            out.append((series, xs, [base["y"].iloc[0] * x for x in xs]))
    return out


def _efficiency(want: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def data(pts: pd.DataFrame) -> pd.DataFrame:
        d = pts[(pts["scaling"] == want) & pts["step_ms"].notna()].copy()
        # a point divides by the TP=1 run of its own host only (host: 'published' for the reference)
        key = ["source", "host", "gbs"] + (["model"] if want == "strong" else [])
        base = d[d["tp"] == 1].drop_duplicates(key).set_index(key)["step_ms"]
        d = d.join(base.rename("base"), on=key).dropna(subset=["base"])
        if d.empty:
            return d
        d["series"] = ("batch " + d["gbs"].astype(str)) if want == "weak" else \
            (d["model"] + ", batch " + d["gbs"].astype(str))
        d["x"] = d["tp"]
        d["y"] = d["base"] / d["step_ms"] * 100 if want == "weak" else d["base"] / (d["tp"] * d["step_ms"])
        return d.drop(columns="base")
    return data


def _ideal(value: float) -> Callable[[pd.DataFrame], Lines]:
    return lambda d: [(None, sorted(d["x"].unique()), [value] * d["x"].nunique())]


CP_MODES = ["p2p", "all_gather", "a2a"]  # Megatron's --cp-comm-type, in the tutorial's order


def _cp_speedup(pts: pd.DataFrame) -> pd.DataFrame:
    # Speedup of each CP run over the CP=1 run of the same model and sequence, from the same source
    # and host (a ratio of two hosts' runs is not drawn).
    key = ["source", "host", "model", "seq"]
    d = pts[pts["step_ms"].notna()].copy()
    d["seq"] = d["seq"].fillna(-1)  # an unknown sequence length groups with itself
    base = d[d["cp"] == 1].drop_duplicates(key).set_index(key)["step_ms"]
    d = d[d["cp"] > 1].join(base.rename("base"), on=key).dropna(subset=["base"])
    if d.empty:
        return d
    d["cp_comm"] = d["cp_comm"].fillna("p2p")  # Megatron's default
    modes = CP_MODES + sorted(set(d["cp_comm"]) - set(CP_MODES))
    d["series"] = "CP=" + d["cp"].astype(str) + ", " + d["model"] + \
        d["seq"].map(lambda s: f", seq {int(s)}" if s > 0 else "")
    d["x"] = d["cp_comm"].map(modes.index)
    d["xtick"] = d["cp_comm"]
    d["y"] = d["base"] / d["step_ms"]
    return d.drop(columns="base")


def _pp_steps(pts: pd.DataFrame) -> pd.DataFrame:
    # Plain pipelines (no TP, no virtual stages) over the microbatch count m.
    mask = (pts["pp"] > 1) & (pts["tp"] == 1) & (pts["v"].fillna(1) == 1)
    label = "PP=" + pts["pp"].astype(str) + ", " + pts["model"]
    return _select(pts, mask, label, pts["m"], pts["step_ms"])


def _bubble_model(d: pd.DataFrame) -> Lines:
    """t(m) = t_c (1 + (p - 1) / m), t_c from the smallest m measured: the bubble and nothing else."""
    out = []
    for (series, _), g in d[~d["oom"]].groupby(["series", "source"], sort=False):
        first = g.sort_values("x").iloc[0]
        p, m0 = first["pp"], first["x"]
        t_c = first["y"] / (1 + (p - 1) / m0)
        xs = list(np.geomspace(g["x"].min(), g["x"].max(), 40)) if g["x"].nunique() > 1 else [m0]
        out.append((series, xs, [t_c * (1 + (p - 1) / m) for m in xs]))
    return out


def _moe_memory(pts: pd.DataFrame) -> pd.DataFrame:
    def label(r: pd.Series) -> str:
        parts = (["ZeRO-2"] if r["zero2"] else []) + ([f"EP={r['ep']}"] if r["ep"] > 1 else []) + \
            ([f"ETP={r['etp']}"] if r["etp"] > 1 else [])
        return " + ".join(parts) or "DP only"

    mask = pts["experts"].notna()
    if not mask.any():
        return pts[mask]
    return _select(pts, mask, pts.apply(label, axis=1), pts["experts"], pts["mem_gpu"])


FIGURES = [
    Figure(1, "memory", "Ch. 1: memory over all GPUs vs DP, with and without ZeRO-2", "data-parallel size (GPUs)",
           "memory, sum over GPUs (GiB)", _dp_memory, _no_sharing,
           "no sharing: DP × the DP=1 memory"),
    Figure(2, "weak-scaling", "Ch. 2: weak scaling (the model grows with TP)", "tensor-parallel size",
           "weak-scaling efficiency, TP1 ms / TPN ms (%)", _efficiency("weak"), _ideal(100), "ideal"),
    Figure(2, "strong-scaling", "Ch. 2: strong scaling (one model split over TP GPUs)", "tensor-parallel size",
           "strong-scaling efficiency, TP1 ms / (N · TPN ms)", _efficiency("strong"), _ideal(1), "ideal"),
    Figure(3, "cp-speedup", "Ch. 3: context-parallel speedup by communication mode", "CP communication mode",
           "speedup over CP=1 (same model and sequence)", _cp_speedup, _ideal(1), "CP=1"),
    Figure(4, "pp-bubble", "Ch. 4: pipeline step time vs microbatches m", "microbatches per step m",
           "step time (ms)", _pp_steps, _bubble_model,
           "bubble model: t_c · (1 + (p − 1)/m), fitted at the smallest m", log2_x=True),
    Figure(5, "moe-memory", "Ch. 5: MoE memory per GPU vs number of experts", "experts per MoE layer",
           "memory per GPU (GiB)", _moe_memory),
]


# --------------------------------------------------------------------------- chapter figures

def figures_of(ctx: chapters.Context) -> list[tuple[Figure, pd.DataFrame]]:
    """The chapter's figures that have at least one point, each with its data (made once a Context)."""
    if ctx.figures is None:
        ctx.figures = _figures_of(ctx)
    return ctx.figures


def _figures_of(ctx: chapters.Context) -> list[tuple[Figure, pd.DataFrame]]:
    specs = [f for f in FIGURES if f.chapter == ctx.chapter]
    if not specs:
        return []
    pts = points(ctx)
    if pts.empty:
        return []
    out = []
    for fig in specs:
        d = fig.data(pts)
        if len(d):
            out.append((fig, d.reset_index(drop=True)))
    return out


def chapter_figures(chapter: int, records: dict[str, run_records.RunRecord] | None = None,
                    reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                    exps: list[catalog.Experiment] | None = None) -> list[tuple[Figure, pd.DataFrame]]:
    """figures_of() for one chapter; `exps` replaces the catalog's targets (tests build their own)."""
    return figures_of(chapters.context(chapter, records, reference, twogpu, exps))


def file_name(fig: Figure, page: str) -> str:
    return f"{Path(page).stem}-{fig.name}.svg"


def title(fig: Figure, data: pd.DataFrame) -> str:
    if (data["source"] == "megalab").any():
        return fig.title
    return fig.title + "\n(published points only: no megalab runs yet)"


def page_links(ctx: chapters.Context, page: str) -> list[str]:
    """Markdown image lines for a chapter page at `page` (e.g. results/01-dp-zero2.md)."""
    return [f"![{fig.title}]({PLOTS}/{file_name(fig, page)})" for fig, _ in figures_of(ctx)]


# --------------------------------------------------------------------------- drawing

def _source_label(source: str, analogue: bool, data: pd.DataFrame, kind: str) -> str:
    if source == "published":
        return f"published ({PUBLISHED_RIG[kind]})"
    ours = data[(data["source"] == "megalab") & (data["analogue"] == analogue)]
    gpus = " / ".join(sorted(set(ours["gpu"].dropna()))) or "GPU"
    te = {True: "TE", False: "no TE"}
    impl = " / ".join(te[t] for t in sorted(set(ours["te"])))
    return f"megalab{' 2-GPU analogue' if analogue else ''} ({gpus}, {impl})"


def drawing_key(fig: Figure, data: pd.DataFrame, kind: str, fmt: str) -> str:
    """What draw()'s bytes depend on, hashed: this file (the drawing code, its style and sizes), the
    matplotlib version, the figure's words, its data and its model's lines."""
    parts = [fmt, kind, data.to_csv(index=False),
             repr((fig.chapter, fig.name, fig.title, fig.xlabel, fig.ylabel, fig.model_label, fig.log2_x))]
    for series, xs, ys in (fig.model(data) if fig.model else []):
        parts += [str(series), np.asarray(xs, dtype=float).tobytes(), np.asarray(ys, dtype=float).tobytes()]
    return drawing_digest(Path(__file__), *parts)


def drawing_digest(code: Path, *parts: bytes | str) -> str:
    """A drawing's key for kept_drawing: the file CODE that draws it and this one (the style, the sizes), the
    matplotlib version, and PARTS, what it shows, hashed."""
    import matplotlib

    h = hashlib.sha256()
    for part in (Path(code).read_bytes(), Path(__file__).read_bytes(), matplotlib.__version__, *parts):
        h.update(hashlib.sha256(part if isinstance(part, bytes) else str(part).encode()).digest())
    return h.hexdigest()


def draw(fig: Figure, data: pd.DataFrame, kind: str = "anchor", fmt: str = "svg") -> bytes:
    """The figure as SVG bytes (same inputs, same bytes); fmt="png" for a quick look.

    Drawing is the slow part of `make tables` (matplotlib's layout, about 0.2 s a figure), and most
    rebuilds draw what they drew before: the bytes are kept in the machine's cache (core/paths.cache_root,
    plots/) under drawing_key, and a figure whose inputs are unchanged is read back, not drawn again."""
    return kept_drawing(drawing_key(fig, data, kind, fmt), fmt, lambda: _draw(fig, data, kind, fmt))


def kept_drawing(key: str, fmt: str, make: Callable[[], bytes]) -> bytes:
    """MAKE()'s bytes, kept in the machine's cache under KEY (a hash of everything they depend on): read back
    where they were made before."""
    folder = cache_root() / "plots"
    for memo in sorted(folder.glob(f"{key}-*.{fmt}")) if folder.is_dir() else []:
        try:  # the name holds the bytes' hash too: a damaged cache file is drawn again, never used
            kept = infile.read(memo, None)
        except OSError:
            continue
        if memo.name == f"{key}-{hashlib.sha256(kept).hexdigest()[:16]}.{fmt}":
            return kept
    out = make()
    try:  # the cache is a convenience: a read-only or full disk only costs the drawing next time
        markdown.write_atomic(folder / f"{key}-{hashlib.sha256(out).hexdigest()[:16]}.{fmt}", out)
    except OSError:
        pass
    return out


def _draw(fig: Figure, data: pd.DataFrame, kind: str, fmt: str) -> bytes:
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        f = MplFigure(figsize=SIZE, dpi=DPI, layout="constrained")
        ax = f.add_subplot()
        colors = {s: f"C{i % 10}" for i, s in enumerate(dict.fromkeys(data["series"]))}
        top = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y at the top edge
        for (series, source), g in data.groupby(["series", "source"], sort=False):
            ok = g[~g["oom"]].sort_values("x")
            ax.plot(ok["x"], ok["y"], color=colors[series], lw=1, alpha=0.5)
            for (src, analogue), h in ok.groupby(["source", "analogue"], sort=False):
                ax.plot(h["x"], h["y"], ls="none", color=colors[series], **MARKERS[(src, analogue)])
            oom = g[g["oom"]]
            ax.plot(oom["x"], [0.96] * len(oom), ls="none", marker="x", markersize=9, mew=2,
                    color=colors[series], transform=top, clip_on=False)
            for x in oom["x"]:
                ax.annotate("oom", (x, 0.96), xycoords=top, xytext=(7, -3), textcoords="offset points",
                            fontsize=8, color=colors[series])
        for series, xs, ys in (fig.model(data) if fig.model else []):
            ax.plot(xs, ys, ls="--", lw=1, color=colors.get(series, "0.5"))
        xs = sorted(data["x"].unique().tolist())
        if fig.log2_x:
            ax.set_xscale("log", base=2)
        if "xtick" in data:  # categorical: x is the category's position
            ticks = data.drop_duplicates("x").sort_values("x")
            ax.set_xticks(ticks["x"].tolist(), ticks["xtick"].tolist())
            ax.set_xlim(ticks["x"].min() - 0.5, ticks["x"].max() + 0.5)
        else:
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set(xlabel=fig.xlabel, ylabel=fig.ylabel, title=title(fig, data))
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)

        handles = [Line2D([], [], color=c, lw=2, label=s) for s, c in colors.items()]
        for (src, analogue) in MARKERS:
            if ((data["source"] == src) & (data["analogue"] == analogue)).any():
                style = {**MARKERS[(src, analogue)], "markerfacecolor": MARKERS[(src, analogue)]
                         .get("markerfacecolor", "0.3")}
                handles.append(Line2D([], [], ls="none", color="0.3", **style,
                                      label=_source_label(src, analogue, data, kind)))
        if data["oom"].any():
            handles.append(Line2D([], [], ls="none", marker="x", mew=2, color="0.3", label="out of memory"))
        if fig.model_label and fig.model:
            handles.append(Line2D([], [], ls="--", lw=1, color="0.5", label=fig.model_label))
        f.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
        buf = io.BytesIO()
        f.savefig(buf, format=fmt, metadata=SVG_META if fmt == "svg" else {"Software": None})
    return buf.getvalue()


# --------------------------------------------------------------------------- output

def write_plots(root: Path | None = None, *, records: dict[str, run_records.RunRecord] | None = None,
                out: Path | None = None, check: bool = False, force: bool = True, hosts: Hosts | None = None,
                contexts: dict[int, chapters.Context] | None = None) -> list[Path]:
    """Draw every chapter's figures into `out` (default ROOT/results/plots); return the changed paths.

    A figure whose bytes are unchanged is not rewritten; an .svg there that no figure makes any more
    is removed (the folder is generated), and with force=False (`make plots` without FORCE=1) refused
    instead: pageguard.WouldShrink, nothing written (a figure goes when its rows or published numbers do:
    `make tables` judges those first, then draws with force). check=True writes nothing and returns the
    paths that are missing or no longer made (file names only, see the module docstring). CONTEXTS: the
    chapters' contexts where the caller made them (make tables: each chapter's figures made once, for its page's
    links and here).
    """
    root = Path(root) if root is not None else ROOT
    if records is None:
        records = provenance.load_rows(root / "results" / "runs", "megalab plots", root)
        hosts = hosts or machines.committed(root / "results")
    if contexts is None:
        reference, twogpu = chapters.load_reference(), chapters.load_twogpu_reference()
        contexts = {ch: chapters.context(ch, records, reference, twogpu, None, root, hosts) for ch in catalog.chapters()}
    folder = out or root / "results" / PLOTS  # every chapter page lives in results/
    wanted: dict[Path, tuple[Figure, pd.DataFrame, str]] = {}
    for chapter, meta in catalog.chapters().items():
        ctx = contexts[chapter]
        for fig, data in figures_of(ctx):
            wanted[folder / file_name(fig, meta["table"])] = (fig, data, ctx.kind)
    stale = sorted(p for p in folder.glob("*.svg") if p not in wanted) if folder.is_dir() else []
    if check:
        return sorted([p for p in wanted if not p.exists()] + stale)
    if stale and not force:
        gone = [pageguard.Loss(f"plots/{p.name}", "the figure (no longer drawn)") for p in stale]
        raise pageguard.WouldShrink(pageguard.sentence(gone, command="make plots"))
    changed = []
    for path, (fig, data, kind) in wanted.items():
        if markdown.write_if_changed(path, draw(fig, data, kind)):
            changed.append(path)
    for path in stale:
        path.unlink()
        changed.append(path)
    return changed


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, help="write the figures here instead of results/plots")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a figure is missing or stale")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Draw results/plots/*.svg from results/runs/*/run.json and configs/reference (make tables does this too)."""
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"megalab plots: --out {args.out} is a file; fix: give a folder (it is created if missing)",
              file=sys.stderr)
        return 2
    try:
        changed = write_plots(args.root, out=args.out, check=args.check,
                              force=args.out is not None or variables.value("FORCE"))
    except pageguard.WouldShrink as e:
        print(f"megalab plots: {e}", file=sys.stderr)
        return 1
    return markdown.report_changes(changed, args.root, check=args.check, what="plots",
                                 fix="run `make plots` (or `make tables`)")
