"""Result tables: one markdown page per chapter, our runs beside the published numbers.

`make tables` (python -m megalab tables) reads every committed run record
(results/runs/*/run.json), picks one per target, and writes each chapter's page
(the `table:` path of configs/experiments/NN-*.yaml, e.g. results/01-dp-zero2.md) with the
figures it links (results/plots/*.svg, megalab/results/plots.py).
Pages are generated, deterministic and only rewritten when their content changes, so
`python -m megalab tables --check` can tell CI whether the committed pages are current.

A chapter is diffed against the published table its YAML names with `reference:`: `anchor`
(default; configs/reference/anchor_8xh100.csv, one memory number per row) or `twogpu`
(configs/reference/twogpu_2xh200.csv, memory per GPU for GPU 0 and GPU 1, kept apart). Each chapter
adds the columns its lesson needs (columns.py: the columns and every cell, computed from the catalog
entry and the records, never typed in); this module assembles the pages.

Public API:
  load_reference()          published 8x H100 numbers, indexed by (chapter, row)
  load_twogpu_reference()   published 2x H200 notes, indexed by row
  load_records(root)        newest usable run record per target
  table_frame(chapter)      one chapter's table as a DataFrame of strings
  render_chapter(chapter)   one chapter's page (markdown text)
  write_tables(root)        write every chapter's page; returns the paths that changed
  main(args)                the build of `python -m megalab tables [--check]` (its arguments and the skip of
                            a build with nothing to do: uptodate.py)
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
import re
import sys
from pathlib import Path

import pandas as pd

from megalab.core import catalog
from megalab.core.paths import ROOT
from megalab.core import git, infile, logparse, markdown, provenance, variables
from megalab.results import (alike, checkmarks, checks, columns as cols, datareport, dataset, index, overview,
                             pageguard, plots, predicted, quotes)
from megalab.results import chapter as chapter_inputs
from megalab.results.chapter import (  # noqa: F401  (tables.load_reference etc.: the pages' inputs)
    RUNS_DIR, Context, context as _context, load_reference, load_twogpu_reference)
from megalab.core.gpus import short_gpu_name
from megalab.core.records import RunRecord, read_once
from megalab.results.hosts import Hosts

UNIT_NOTE = ("Unit: every memory figure on this page is GiB (2^30 bytes) unless its column says otherwise; "
             "`ref GB (pub.)` is the published figure as printed (nvidia-smi MiB / 1000, see "
             "[configs/reference](../configs/reference/README.md#memory-unit)), `ref GiB` the same "
             "converted (× 1000 / 1024), which Δ compares with.")

FOOTNOTES = [
    "Δ is ours − published: GiB for memory (ours against `ref GiB`), percent of the published step "
    "time for ms (+ means we are slower).",
    "Memory is the peak per GPU over the whole run (GiB, NVML used memory as nvidia-smi shows it), "
    "the largest over the run's GPUs; `a / b` is GPU 0 / GPU 1 where they differ by more than 1 GiB "
    "(`lo–hi` with more GPUs).",
    "Step times are the median over steps after warm-up, with the 10th–90th percentile range of that "
    "run's steps; where a target has several ok runs on one host with the same code and settings, "
    "`our ms` is the median of the runs' medians and `runs` gives their number and range (lowest–highest "
    "median), else `runs` is 1. MFU is TFLOP/s/GPU over the GPU's dense bf16 peak (newest run).",
]
# only on a page with a `~Rn` row
ANALOGUE_NOTE = ("`~Rn` rows are 2-GPU analogues of published row Rn: they stand in for it on fewer GPUs and have "
                 "no published number of their own (—); whether they show its trend is what results/checks.md tests.")


# --------------------------------------------------------------------------- inputs

def load_records(root: Path | None = None, tree: Path | None = None) -> dict[str, RunRecord]:
    """Newest usable record per target (records.load_records) from ROOT, default results/runs, one with
    today's settings (a plain `make <target>`) where there is one; repeats are grouped by host, settings
    and code as git sees it in TREE (default: this checkout)."""
    return provenance.load_rows(Path(root) if root is not None else RUNS_DIR, "megalab tables",
                                Path(tree) if tree is not None else ROOT)


def machine_note(recs: list[RunRecord], hosts: Hosts) -> str | None:
    """The legend of the machine column: each machine key's GPUs and when its rows ran."""
    keys: dict[str, list[RunRecord]] = {}
    for r in sorted(recs, key=lambda r: r.started or ""):
        keys.setdefault(hosts.key(r), []).append(r)
    if not keys:
        return None
    parts = []
    for key, mine in keys.items():
        times = sorted(r.started for r in mine if r.started)
        end = times[-1][11:16] if times and times[-1][:10] == times[0][:10] else (times[-1][:16].replace("T", " ") if times else "")
        span = f"{times[0][:16].replace('T', ' ')}–{end}" if times else "?"
        seen = max((r.gpus_on_node or r.num_gpus or 0 for r in mine), default=0)  # the most GPUs a run saw there
        parts.append(f"`{markdown.escape(key)}` = {markdown.escape(short_gpu_name(mine[0].gpu_name or '?'))}, runs saw {seen or '?'} GPU(s), rows run "
                     f"{span} UTC" + (" (no GPU UUID recorded: possibly several machines)" if key.endswith("-noid") else ""))
    return ("machine: the physical machine of the row's record, the same key on every page: its GPU model and the "
            "smallest UUID of the GPUs its records saw together (megalab/results/hosts.py; every rig machine has the "
            "host name `vm`): " + "; ".join(parts) + ". One command's step time moves between machines "
            "([results/checks.md](../results/checks.md#between-machines) measures how far on the committed runs): "
            "compare rows of one machine, code and settings only, as the ratio columns and `make check` do.")


def older_note(ctx: Context, verdicts: Mapping[str, checks.Result]) -> str | None:
    """The page's rows that are not today's code and defaults, and the verdicts (results/checks.md) that read
    them: what the page's older rows carry (None where every row that ran is today's)."""
    older = [e for e in ctx.exps if (r := ctx.rec(e)) is not None
             and provenance.of(r, ctx.tree).state != provenance.CURRENT]
    if not older:
        return None
    ids = {e.id.split("-", 1)[0] for e in older}
    resting = [f"`{cid}` ({r.status})" for cid, r in verdicts.items()
               if r.status != checks.NOT_RUN and ids & {t for t, *_ in r.basis.runs}]
    return (f"older rows (not today's code and defaults, the provenance column): {', '.join(sorted(ids))}. Their "
            "numbers stand for the code and settings their runs had, and so do the conclusions drawn from them: "
            + (f"the verdicts of results/checks.md that read them are {', '.join(resting)}; " if resting else
               "no verdict of results/checks.md reads them; ")
            + "the tutorial says which of its sentences rest on them.")


def _ours_sentence(recs: list[RunRecord]) -> str:
    gpus = sorted({short_gpu_name(r.gpu_name) for r in recs if r.gpu_name})
    impls = {r.transformer_impl for r in recs}
    impls.discard(None)
    if "transformer_engine" in impls:
        te = "with Transformer Engine" if impls == {"transformer_engine"} else \
            "with and without Transformer Engine (see each run.json)"
    else:
        te = "without Transformer Engine"
    where = " and ".join(markdown.escape(g) for g in gpus) if gpus else "our rig (no runs recorded yet)"
    return (f"ours on {where}, {te}, on mock data, timing the median step after warm-up and reading "
            "nvidia-smi-style peak memory per GPU through NVML")


SOURCES = {
    "anchor": (
        "configs/reference/anchor_8xh100.csv",
        "Published numbers are from the tutorial series \"Megatron, Transformed!\" (Chua, 2025) on "
        "8x H100 80GB with Megatron core_r0.14 and Transformer Engine "
        "([configs/reference](../configs/reference/README.md))"),
    "none": ("configs/experiments", "No published table to compare with: every row is our own measurement, "
             "\"not run yet\" until it is run"),
    "twogpu": (
        "configs/reference/twogpu_2xh200.csv",
        "Published numbers are from the same author's 2x H200 notes (Chua, 2025: public notes on "
        "tinkering with model parallelism on GPT-2 large, by the author of \"Megatron, Transformed!\") "
        "on 2x H200 141GB with NVLink, NGC PyTorch 25.06 and Transformer Engine "
        "([configs/reference](../configs/reference/README.md))"),
}

TWOGPU_UNIT_NOTE = ("Unit: every memory figure on this page is GiB (2^30 bytes); the published figures are "
                    "nvidia-smi MiB as printed in the notes, divided by 1024 here.")
NONE_UNIT_NOTE = "Unit: every memory figure on this page is GiB (2^30 bytes)."

TWOGPU_FOOTNOTES = [
    "Δ is ours − published: GiB per GPU (`GPU 0 / GPU 1`) for memory (none for a run that ran out of "
    "memory: its peak is the card's limit), percent of the published step time for ms (+ means we are "
    "slower).",
    "Memory is the peak of each GPU over the whole run in GiB, GPU 0 and GPU 1 side by side and never "
    "merged (with PP=2 the two stages hold different layers and activations): published numbers are "
    "nvidia-smi MiB / 1024, ours NVML used memory (what nvidia-smi shows) / 1024.",
    "The published step time is the mean of the two logged iterations shown in the notes; ours is the "
    "median over steps after warm-up, with the 10th–90th percentile range. MFU is TFLOP/s/GPU over the "
    "GPU's dense bf16 peak.",
    "The published runs used Transformer Engine, ours Megatron with megalab's TE-free layers, so Δ "
    "includes the difference between the two implementations.",
]


def _frame(ctx: Context) -> pd.DataFrame:
    return pd.DataFrame([cols.row(e, ctx) for e in ctx.exps], columns=cols.columns(ctx.chapter), dtype=str)


def table_frame(chapter: int, records: dict[str, RunRecord] | None = None,
                reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                exps: list[catalog.Experiment] | None = None, tree: Path | None = None,
                hosts: Hosts | None = None) -> pd.DataFrame:
    """The chapter's table as a DataFrame of strings (one row per target, catalog order).

    `exps` replaces the catalog's targets of the chapter (tests build their own Experiments); `tree`
    is the checkout whose git history judges each record's code (default: this one); `hosts` the machines
    of every run (default: chapter.context's).
    """
    return _frame(_context(chapter, records, reference, twogpu, exps, ROOT if tree is None else Path(tree), hosts))


def render_chapter(chapter: int, records: dict[str, RunRecord] | None = None,
                   reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                   block_only: bool = False, tree: Path | None = None, hosts: Hosts | None = None,
                   verdicts: Mapping[str, checks.Result] | None = None) -> str:
    """Markdown page for one chapter: title, provenance sentence, table, footnotes.

    block_only: just the provenance sentence, table and footnotes (what tutorials embed).
    tree: the checkout whose git history judges each record's code (default: this one).
    verdicts: the claims' results (checks.Verdicts); where given, a note names the older rows and the
    verdicts that rest on them.
    """
    _, block, page = chapter_outputs(chapter, records, reference, twogpu=twogpu, tree=tree, hosts=hosts,
                                     verdicts=verdicts)
    return block if block_only else page


def chapter_outputs(chapter: int, records: dict[str, RunRecord] | None = None,
                    reference: pd.DataFrame | None = None, *, twogpu: pd.DataFrame | None = None,
                    tree: Path | None = None, hosts: Hosts | None = None,
                    verdicts: Mapping[str, checks.Result] | None = None) -> tuple[pd.DataFrame, str, str]:
    """(the chapter's table_frame, its block, its page: render_chapter's two), made from one table."""
    return outputs(_context(chapter, records, reference, twogpu, None, ROOT if tree is None else Path(tree), hosts),
                   verdicts)


def outputs(ctx: Context, verdicts: Mapping[str, checks.Result] | None = None) -> tuple[pd.DataFrame, str, str]:
    """chapter_outputs of a chapter's Context."""
    chapter = ctx.chapter
    meta = catalog.chapters()[chapter]
    df = _frame(ctx)
    targets = set(df["make target"])
    recs = [ctx.records[t] for t in sorted(targets & set(ctx.records))]
    table = "\n".join(markdown.table(list(df.columns), df.itertuples(index=False), cols.align(chapter), padded=True))
    source_file, published = SOURCES[ctx.kind]
    if ctx.kind == "twogpu":
        notes = list(TWOGPU_FOOTNOTES)
        ref_notes = [f"{e.ref}: {markdown.escape(ref['notes'])}" for e in ctx.exps
                     if (ref := ctx.ref_row(e)) is not None and isinstance(ref["notes"], str) and ref["notes"]]
        if ref_notes:
            notes.append("Published notes: " + ". ".join(ref_notes) + ".")
    elif ctx.kind == "none":
        notes = FOOTNOTES[1:]  # no Δ
    else:
        notes = list(FOOTNOTES)
    if any(str(v).startswith("~") for v in df.get("Row", ())):
        notes.append(ANALOGUE_NOTE)
    notes += [cols.TOKENS_NOTE, cols.TIMED_STEPS_NOTE, cols.GRAPH_NOTE] + [c.note for c in cols.chapter_columns(chapter) if c.note]
    if cols.has_predictions(chapter):
        notes.append(predicted.note())
    notes.append(provenance.LEGEND)
    if verdicts is not None and (note := older_note(ctx, verdicts)):
        notes.append(note)
    if note := machine_note(recs, ctx.hosts):
        notes.append(note)
    if any(cols.UNLIKE in str(v) for v in df.values.ravel()):
        notes.append(cols.UNLIKE_NOTE)
    if any(ctx.hosts.beside(r) for r in recs):
        notes.append(cols.SHARED_NOTE)
    if any(cols.over_cap_gib(r) for r in recs):
        notes.append(cols.OVER_CAP_NOTE)
    unit = {"anchor": UNIT_NOTE, "none": NONE_UNIT_NOTE}.get(ctx.kind, TWOGPU_UNIT_NOTE)
    block = "\n".join([published + "; " + _ours_sentence(recs) + ".", "", unit, "", table, "",
                          *(f"- {note}" for note in notes)])
    lines = [
        f"# Chapter {chapter}: {markdown.escape(meta.get('title', ''))}".rstrip(),
        "",
        f"<!-- generated by `make tables` from results/runs/*/run.json and {source_file}; "
        "do not edit by hand -->",
        "",
        block,
    ]
    if figures := plots.page_links(ctx, meta["table"]):
        lines += ["", *figures]
    if meta.get("tutorial") and (catalog.ROOT / meta["tutorial"]).exists():
        lines += ["", f"Tutorial: [{meta['tutorial']}](../{meta['tutorial']}). "
                      "Run a row with `make <make target>`, then `make tables`."]
    return df, block + "\n", "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- output

class NotToday(Exception):
    """STRICT: rows whose records are not today's code and defaults (one line, naming them)."""


def not_today(records: dict[str, RunRecord], tree: Path) -> dict[str, list[str]]:
    """Provenance cell ('older (schema 1)', ...) -> the short ids of the catalog rows whose record has
    it, for every row that is not provenance CURRENT, in catalog order."""
    out: dict[str, list[str]] = {}
    for exp in catalog.catalog().values():
        rec = records.get(exp.id)
        if rec is not None and (p := provenance.of(rec, tree)).state != provenance.CURRENT:
            out.setdefault(p.cell, []).append(exp.id.split("-", 1)[0])
    return out


def write_tables(root: Path | None = None, *, check: bool = False, strict: bool = False,
                 records: dict[str, RunRecord] | None = None, index_page: dict | None = None,
                 force: bool = False) -> list[Path]:
    """Write every chapter's table page (and its CSV, same rows) under ROOT; return the paths whose
    content changed.

    Records come from ROOT/results/runs unless given (`compare`: the committed ones and an outdir's);
    a file whose content is unchanged is not touched. With check=True nothing is written and the
    returned paths are those that *would* change. With strict=True nothing is written when a row's
    record is not today's code and defaults (NotToday).

    Pages never shrink silently (results/pageguard.py states the rule): every page is made in memory first,
    and nothing is written when the new pages would lose a row, a published or measured number, a page or
    a tutorial's table (pageguard.WouldShrink, one line), unless the working tree's catalog change explains it
    (a target removed or changed against HEAD: its rows; a chapter file removed: its page) or FORCE
    (force=True; `compare`, whose pages are its own scratch, passes it). A page no chapter writes any more
    is then removed with its CSV; a tutorial quote of a row that is gone keeps its text.
    """
    with git.asked_once(), read_once():  # nothing commits or writes a record while the pages are made
        return _write_tables(Path(root) if root is not None else ROOT, check, strict, records, index_page, force)


def _write_tables(root: Path, check: bool, strict: bool, records: dict[str, RunRecord] | None,
                  index_page: dict | None, force: bool) -> list[Path]:
    catalog.catalog()  # the catalog's door first: a bad entry is refused before a record is read
    chapters = catalog.chapters()
    records = load_records(root / "results" / "runs", root) if records is None else records
    if strict and (rows := not_today(records, root)):
        n = sum(len(ids) for ids in rows.values())
        raise NotToday(f"{n} row(s) come from other code or other defaults than today's: "
                       + "; ".join(f"{why}: {' '.join(ids)}" for why, ids in rows.items()) + "; fix: re-run them with `make <target>` (plain, no FAST/CUDA_GRAPH/"
                       "EXTRA_ARGS/WARMUP) and commit the records, or build without STRICT=1")
    # the machines of every run (rows, bench, data, ...): which ran where, and beside whom (hosts.py)
    hosts = Hosts.under(root / "results", "megalab tables", records.values())
    verdicts = checks.Verdicts(root, hosts=hosts)  # the claims the tutorials teach: evaluated where a page names one
    if strict and (unsaid := _unsaid(root, verdicts)):
        raise checkmarks.CheckMarkError(f"{len(unsaid)} verdict(s) unsaid where taught, e.g. {unsaid[0]}")
    reference, twogpu = load_reference(), load_twogpu_reference()
    chapter_inputs.check_refs(reference, twogpu)
    # every page in memory first: nothing is written when one of them cannot be made or would lose something
    frames, pages, blocks = {}, {}, {}
    contexts = {ch: _context(ch, records, reference, twogpu, None, root, hosts) for ch in chapters}  # the figures too
    for chapter, meta in chapters.items():
        path = root / meta["table"]
        frames[chapter], blocks[chapter], pages[path] = outputs(contexts[chapter], verdicts)
        pages[path.with_suffix(".csv")] = frames[chapter].to_csv(index=False, lineterminator="\n")  # same rows
    unlike = lambda a, b: row_differences(records, hosts, root, a, b)  # noqa: E731  (what a quote's two rows differ in)
    tutorials: dict[Path, tuple[str, list[str]]] = {}
    row = table_rows(frames)
    for path in sorted((root / "tutorials").glob("*.md")):
        old = infile.text(path)  # the file door: a FIFO, a directory, bytes not UTF-8 are one line
        try:  # the chapter tables, then the prose's quoted cells (quotes.py)
            tutorials[path] = quotes.fill(embed_tables(old, blocks), row, keep_missing=force, unlike=unlike)
        except quotes.QuoteError as e:
            raise quotes.QuoteError(f"{path.relative_to(root)}: {e}") from None
    rows = dataset.rows_frame(records, reference, twogpu, root, hosts)
    if not check and not force:
        linked = {p: text for p, text in pages.items() if p.suffix == ".md"}  # the index and the data page: links
        linked[root / "results" / "README.md"] = index.render(root, frames, overview=overview.sentence(
            overview.points(rows)), **(index_page or {}))
        if (root / datareport.RUNS).is_dir():
            linked[root / datareport.PAGE] = datareport.render(root)
        lost = pageguard.losses(root, chapters, frames, {p: text for p, (text, _) in tutorials.items()}, linked)
        if lost and (lost := pageguard.unexplained(lost, pageguard.catalog_change())):
            raise pageguard.WouldShrink(pageguard.sentence(lost))
    # the pages link these figures: drawn first, so no link is ever dangling
    changed = plots.write_plots(root, records=records, check=check, hosts=hosts, contexts=contexts)
    for path, text in pages.items():
        if markdown.write_if_changed(path, text, check=check):
            changed.append(path)
    for path in pageguard.orphans(root, chapters):  # a page no chapter writes (allowed above, or FORCE)
        if not check:
            path.unlink()
        changed.append(path)
    changed += dataset.write(root, records, reference, twogpu, check=check, hosts=hosts, rows=rows)  # runs/rows.csv
    drawn, said = overview.write(root / "results", rows, check=check)  # the index's first figure
    changed += drawn
    if (root / datareport.RUNS).is_dir():  # before the index, which lists the pages there are
        changed += datareport.write_report(root, check=check, force=True)  # results/data/README.md (judged above)
    changed += index.write(root, frames, check=check, overview=said, **(index_page or {}))  # results/README.md
    for path, (text, moved) in tutorials.items():
        for line in moved:
            print(f"megalab tables: {path.relative_to(root)}: {line}: re-read the sentence around it")
        # and the verdicts of the claims it teaches (checkmarks.py), with each one the sentence leaves unsaid
        text, marks = checkmarks.fill(text, verdicts, str(path.relative_to(root)))
        for line in checkmarks.unsaid(marks, verdicts):
            print(f"megalab tables: {line}")
        if markdown.write_if_changed(path, text, check=check):
            changed.append(path)
    return changed


def _unsaid(root: Path, verdicts: checks.Verdicts) -> list[str]:
    """The check markers of ROOT's pages whose sentence does not account for the verdict (STRICT)."""
    return checkmarks.unsaid(checkmarks.fill_docs(root, verdicts, write=False)[1], verdicts)


def row_differences(records: dict[str, RunRecord], hosts: Hosts, root: Path, a: str, b: str) -> str:
    """What the runs behind two rows (catalog ids, short or full) differ in besides their layout, by
    alike.py's labels ('CUDA graph, ITERS'); '' where they are like for like or a row has no record."""
    try:
        ta, tb = catalog.get(a).id, catalog.get(b).id
    except catalog.CatalogError:
        return ""
    if ta == tb or ta not in records or tb not in records:
        return ""
    runs = {t: chapter_inputs.runs_behind(records[t]) for t in (ta, tb)}
    return ", ".join(d.label for d in alike.differences(runs, hosts, root))


def table_rows(frames: dict[int, pd.DataFrame]) -> Callable[[str], dict[str, str] | None]:
    """A lookup of a target's row (a catalog id, short or full) in its chapter's table, column -> cell; None if
    none. Each table is read once: a build quotes hundreds of cells."""
    rows: dict[tuple[int, str], dict[str, str]] = {}
    for chapter, frame in frames.items():
        for values in frame.itertuples(index=False, name=None):
            row = {k: str(v) for k, v in zip(frame.columns, values)}
            rows.setdefault((chapter, row["make target"]), row)  # the first row of a target, as a filter's first

    def lookup(target: str) -> dict[str, str] | None:
        try:
            exp = catalog.get(target)
        except catalog.CatalogError:
            return None
        return rows.get((exp.chapter, exp.id))
    return lookup


EMBED = re.compile(r"(<!-- megalab:table chapter=(\d+) -->\n)(.*?)(<!-- /megalab:table -->)", re.S)


def embed_tables(text: str, blocks: dict[int, str]) -> str:
    """Replace what sits between a tutorial's table markers with the chapter's current table."""
    def fill(m: re.Match) -> str:
        chapter = int(m.group(2))
        body = blocks.get(chapter, f"(no chapter {chapter} in the catalog)\n")
        return m.group(1) + body + m.group(4)

    return EMBED.sub(fill, text)


def main(args: argparse.Namespace) -> int:
    """Rebuild results/*.md from results/runs/*/run.json. STRICT and FORCE are read from the environment
    too (make passes them so), as their variables type them: STRICT=maybe is an error, not a no."""
    root = args.root
    strict = args.strict or variables.value("STRICT")
    force = args.force or variables.value("FORCE")
    try:
        changed = write_tables(root, check=args.check, strict=strict, force=force)
    except (NotToday, quotes.QuoteError, checkmarks.CheckMarkError, pageguard.WouldShrink, checks.ChecksError) as e:
        print(f"megalab tables: {e}", file=sys.stderr)
        return 1
    # committed raw logs and TensorBoard event files are kept gzipped (4-7x smaller: the checkout stays
    # small enough to copy to a GPU machine); every reader takes either (logparse.log_file, validation.tensorboard_mem_mb)
    if args.check:
        changed += logparse.plain_logs(root / "results")
    elif gz := logparse.compress_logs(root / "results"):
        print(f"megalab tables: gzipped {len(gz)} raw log(s) under results/ (logs.txt and TensorBoard events -> .gz)")
    n = len(catalog.chapters())
    return markdown.report_changes(changed, root, check=args.check, what="tables", fix="run `make tables`",
                          detail=f" ({n} file{'s' * (n != 1)})")
