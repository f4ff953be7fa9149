"""results/data/README.md: the runs on real data (DATA=<prefix>), beside their mock twins.

`python -m megalab data-report` (run by `make tables`) reads every record in results/data/runs and
writes the page: real data vs mock per target, the loss curve of the longest ok real-data run
(results/data/loss-curve.svg, beside the page: plots.py owns results/plots), the resume check, and every record with its status.

A mock run is a real run's twin only at the same vocabulary: the output layer, the logits and the
loss's starting point all scale with it, so only then is the step-time difference the data's.
A record's vocabulary: for mock data the last --vocab-size of its EXTRA_ARGS, else of the catalog's
flags, else the model preset's (the order the launcher passes them, last wins); for real data the
tokenizer's size Megatron logs ("padded vocab (size: N)"), else the dataset's .info.json, else
unknown. The log comes first because it is committed, so the page reads the same on every machine;
data/ is not.

Deterministic like the chapter pages: `--check` (and tests/test_datareport.py) says whether the
committed page is current; the figure is compared as a file that exists or not (see plots.py).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import re
import shlex
from pathlib import Path

from megalab.core import flags, infile, logparse, markdown, records
from megalab.results import columns, hosts, pageguard, plots
from megalab.core.records import RunRecord
from megalab.core.paths import ROOT
from megalab.core import provenance

PAGE = Path("results") / "data" / "README.md"
RUNS = Path("results") / "data" / "runs"
FIGURE = Path("results") / "data" / "loss-curve.svg"
VOCAB_LINE = re.compile(r"padded vocab \(size: (\d+)\)")


# --------------------------------------------------------------------------- records

def load(runs: Path) -> list[RunRecord]:
    """Every record under RUNS, oldest first; bad ones skipped (one line each)."""
    found = dict(enumerate(records.read_records(runs, "megalab data-report")))
    out = hosts.mark(found, runs.parent.parent, "megalab data-report").values()  # results/: runs beside it
    return sorted(out, key=lambda r: (records.stamp(r.started), r.run_dir.name))


def is_mock(rec: RunRecord) -> bool:
    return rec.config.data in (None, "mock")  # a record from before DATA= existed ran on mock data


def _last_vocab_flag(args) -> int | None:
    try:  # read as the plan reads EXTRA_ARGS (flags.py); a malformed one says nothing
        words = shlex.split(args) if isinstance(args, str) else [str(a) for a in (args or [])]
        return flags.effective_model({}, words).get("vocab_size")
    except ValueError:
        return None


_VOCAB: dict[tuple[Path | None, Path], int | None] = {}  # (run dir, root) -> its vocabulary: a log is read once


def vocab(rec: RunRecord, root: Path) -> int | None:
    """The vocabulary a record trained with (module docstring), None when unknown; worked out once
    per record (a real-data run's comes from its log)."""
    key = (rec.run_dir, root)
    if key not in _VOCAB:
        _VOCAB[key] = _vocab(rec, root)
    return _VOCAB[key]


def _vocab(rec: RunRecord, root: Path) -> int | None:
    cfg = rec.config
    if is_mock(rec):
        return (_last_vocab_flag(cfg.extra_args) or _last_vocab_flag(cfg.catalog_extra_args)
                or (cfg.model_preset or {}).get("vocab_size"))
    try:
        if m := VOCAB_LINE.search(logparse.read_log(rec.log_path).decode(errors="replace")):
            return int(m.group(1))
    except OSError:
        pass
    try:
        return int(json.loads(infile.read(root / f"{cfg.data}.info.json"))["vocab_size"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _newest_ok_else_any(recs: list[RunRecord]) -> RunRecord | None:
    ok = [r for r in recs if r.status == "ok"]
    return (ok or recs or [None])[-1]


def pairs(recs: list[RunRecord], root: Path
          ) -> list[tuple[str, RunRecord | None, RunRecord | None, int | None]]:
    """(target, real record, mock twin, real vocabulary) per target, resume runs left out.

    The real side is the newest ok real-data record, else the newest of any status; the mock side
    the newest ok mock record at the real side's vocabulary (any vocabulary when that is unknown),
    else the newest mock record that did not end ok.
    """
    out = []
    for target in sorted({r.target for r in recs if not r.target.startswith("resume-")}):
        mine = [r for r in recs if r.target == target]
        real = _newest_ok_else_any([r for r in mine if not is_mock(r)])
        v = vocab(real, root) if real else None
        mocks = [r for r in mine if is_mock(r)]
        twins = [r for r in mocks if r.status == "ok" and (v is None or vocab(r, root) == v)]
        mock = twins[-1] if twins else ([r for r in mocks if r.status != "ok"] or [None])[-1]
        out.append((target, real, mock, v))
    return out


# --------------------------------------------------------------------------- cells

def _link(rec: RunRecord, text: str | None = None) -> str:
    return f"[{text or rec.run_dir.name}](runs/{rec.run_dir.name}/run.json)"


def _status(r: RunRecord) -> str:
    """'ok', or the status with the record's one error line ('failed: AssertionError: ...')."""
    return markdown.escape(f"{r.status}: {r.error}") if r.status != "ok" and r.error else r.status


def _side(r: RunRecord | None) -> list[str]:
    """Step ms (p10-p90), TFLOP/s, peak GiB of an ok record; the status in words otherwise."""
    if r is None:
        return ["not run", "", ""]
    if r.status != "ok" or r.step_ms_median is None:
        return [f"{_status(r)} ({_link(r, 'record')})", "", ""]
    shared = " †" if r.concurrent else ""
    ms = f"{r.step_ms_median:.0f} ({r.step_ms_p10:.0f}–{r.step_ms_p90:.0f}){shared}"
    return [f"{ms} ({_link(r, 'record')})", "" if r.tflops_per_gpu is None else f"{r.tflops_per_gpu:.1f}",
            columns.fmt_mem(r.mem_peak_gib)[0]]


def _ratio(real: RunRecord | None, mock: RunRecord | None, v: int | None) -> str:
    if not (real and mock and real.status == mock.status == "ok"):
        return ""
    if v is None:
        return "vocabulary unknown"
    ka, kb = provenance.comparable_key(real), provenance.comparable_key(mock)
    if ka and kb and ka != kb:
        return columns.OTHER_HOST  # two machines or two codes: no ratio (results/checks.md, "Between machines")
    return f"{real.step_ms_median / mock.step_ms_median:.2f}x"


def _v(x: int | None) -> str:
    return "unknown" if x is None else str(x)


# --------------------------------------------------------------------------- loss curve

def _losses(rec: RunRecord) -> list[tuple[int, float]]:
    try:
        its = logparse.iterations(logparse.read_text(rec.log_path))
    except logparse.LogReadError:
        return []
    return [(it.iteration, it.lm_loss) for it in its if it.lm_loss is not None]


def curve_runs(recs: list[RunRecord], root: Path) -> tuple[RunRecord, RunRecord | None, int | None] | None:
    """(longest ok real-data run, its mock twin or None, vocabulary); None when there is none.

    A resume half is not a whole curve, so resume runs are left out; among equally long runs the
    newest wins.
    """
    ok = [r for r in recs if r.status == "ok" and not is_mock(r) and not r.target.startswith("resume-")]
    if not ok:
        return None
    real = max(ok, key=lambda r: (r.iters_logged or 0, records.stamp(r.started), r.run_dir.name))
    _, _, mock, v = next(p for p in pairs(recs, root) if p[0] == real.target)
    return real, (mock if mock and mock.status == "ok" else None), v


def draw_curve(real: RunRecord, mock: RunRecord | None, v: int | None, fmt: str = "svg") -> bytes:
    """Loss per iteration, real data and its mock twin on one axis; SVG bytes, same in, same out
    (fmt="png" for a quick look), kept in the machine's cache as the chapter figures are (plots.kept_drawing)."""
    lines = [(label, color, pts) for rec, label, color in ((real, f"real data: {real.config.data}", "C0"),
                                                            (mock, "mock data, same vocabulary", "C1"))
             if rec is not None and (pts := _losses(rec))]
    title = f"{real.target}: training loss per iteration"
    key = plots.drawing_digest(Path(__file__), fmt, repr((lines, v, title)))
    return plots.kept_drawing(key, fmt, lambda: _draw_curve(lines, v, title, fmt))


def _draw_curve(lines: list[tuple[str, str, list[tuple[int, float]]]], v: int | None, title: str, fmt: str) -> bytes:
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure as MplFigure

    with matplotlib.style.context("default"), matplotlib.rc_context(plots.STYLE):
        f = MplFigure(figsize=plots.SIZE, dpi=plots.DPI, layout="constrained")
        ax = f.add_subplot()
        for label, color, pts in lines:
            ax.plot([i for i, _ in pts], [loss for _, loss in pts], color=color, lw=1.2, label=label)
        if v:  # where a fresh model starts: the loss of a uniform guess over the vocabulary
            ax.axhline(math.log(v), ls="--", lw=1, color="0.5", label=f"ln {v} = {math.log(v):.2f} (uniform guess)")
        ax.set(xlabel="iteration", ylabel="lm loss", title=title)
        f.legend(loc="outside right upper", fontsize=8, frameon=False)
        buf = io.BytesIO()
        f.savefig(buf, format=fmt, metadata=plots.SVG_META if fmt == "svg" else {"Software": None})
    return buf.getvalue()


# --------------------------------------------------------------------------- page


def _resume_cells(r: RunRecord) -> list[str]:
    """A resume check's row: where launch 1 stopped, its last loss, launch 2's first, the jump."""
    c = r.resume_check
    before, after = c.saved_last_loss, c.resumed_first_loss
    return [_link(r, r.target), str(c.stop_at),
            f"{'' if before is None else f'{before:.4f}'} ({c.saved_last_iteration})",
            f"{'' if after is None else f'{after:.4f}'} ({c.resumed_first_iteration})",
            str(c.loss_jump) if "loss_jump" in c.model_fields_set else "",
            "ok" if c.ok else (c.why if c.verdict != "FAIL" else f"FAIL: {c.why}")]


def render(root: Path | None = None, recs: list[RunRecord] | None = None) -> str:
    """The page; RECS: load(ROOT / RUNS), when the caller has read them already."""
    root = Path(root) if root is not None else ROOT
    recs = load(root / RUNS) if recs is None else recs
    L = ["# Real data: loss, speed against mock data, resume", "",
         "<!-- generated by `make tables` (python -m megalab data-report) from results/data/runs/*/run.json; "
         "do not edit by hand -->", "",
         "Runs on a tokenized corpus (`make prepare-data`, then `make <target> DATA=... TOKENIZER_MODEL=...`) "
         "and their mock twins (the same target on mock data with `EXTRA_ARGS=\"--vocab-size N\"`, N the "
         "tokenizer's vocabulary), committed to `runs/` apart from the chapter tables' records.", "",
         "## Real data vs mock", "", *_pairs_section(recs, root),
         "", "## Loss curve", "", *_curve_section(recs, root),
         "", "## Resume check", "", *_resume_section(recs),
         "", "## Every record", "", *_records_section(recs, root)]
    return "\n".join(L) + "\n"


def _pairs_section(recs: list[RunRecord], root: Path) -> list[str]:
    rows = pairs(recs, root)
    if not rows:
        return ["Not run yet."]
    L = markdown.table(
        ["target", "vocabulary (real / mock)", "real: step ms", "real: TFLOP/s", "real: peak GiB",
         "mock: step ms", "mock: TFLOP/s", "mock: peak GiB", "real / mock step time"],
        ([target, f"{_v(v) if real else '—'} / {_v(vocab(mock, root) if mock else None) if mock else '—'}",
          *_side(real), *_side(mock), _ratio(real, mock, v)] for target, real, mock, v in rows))
    L += ["", "- Step times are the median after warm-up with the p10–p90 range; memory is the NVML peak "
              "per GPU (GiB); TFLOP/s is Megatron's own count per GPU.",
          "- The mock side is the newest ok mock run at the real side's vocabulary; the ratio is given only "
          "when both sides ended ok."]
    if any(r.concurrent for _, real, mock, _ in rows for r in (real, mock) if r):
        L += ["- " + columns.SHARED_NOTE]
    return L


def _curve_section(recs: list[RunRecord], root: Path) -> list[str]:
    curve = curve_runs(recs, root)
    if curve is None:
        return ["Not run yet: no real-data run has ended ok."]
    real, mock, v = curve
    pts = _losses(real)
    text = (f"`{real.target}` on `{markdown.escape(real.config.data)}` ({_link(real, 'record')}): {len(pts)} iterations, "
            f"loss {pts[0][1]:.3f} → {pts[-1][1]:.3f}" if pts else f"`{real.target}`: no loss in its log")
    if mock and (mp := _losses(mock)):
        text += (f"; its mock twin ({_link(mock, 'record')}): {len(mp)} iterations, "
                 f"loss {mp[0][1]:.3f} → {mp[-1][1]:.3f}")
    return [text + ".", "", f"![loss per iteration, real data and mock]({FIGURE.name})"]


def _resume_section(recs: list[RunRecord]) -> list[str]:
    resumes = [r for r in recs if r.target.startswith("resume-")]
    checked = [r for r in resumes if r.resume_check is not None]
    if not checked:
        last = f" (the last attempt, {_link(resumes[-1])}, ended {_status(resumes[-1])})" if resumes else ""
        return [f"Not run yet{last}."]
    return ["Launch 1 trains to `stop at` and saves; launch 2 loads that checkpoint and must go on from the next "
            "iteration with a loss near launch 1's last, not a fresh model's.", "",
            *markdown.table(["record", "stop at", "last loss before (iteration)", "first loss after (iteration)",
                             "loss jump", "ok"], (_resume_cells(r) for r in checked))]


def _records_section(recs: list[RunRecord], root: Path) -> list[str]:
    L = []
    for r in recs:
        data = "mock data" if is_mock(r) else f"real data `{markdown.escape(r.config.data)}`"
        check = r.resume_check
        extra = f", resume check {'ok' if check.ok else 'FAIL'}" if check is not None else ""
        L.append(f"- {_link(r)}: `{r.target}`, {data}, vocabulary {_v(vocab(r, root))}, "
                 f"{r.config.iters} iterations: {_status(r)}{extra}")
    return L or ["None yet."]


def write_report(root: Path | None = None, *, check: bool = False, force: bool | None = None) -> list[Path]:
    """Write the page and its figure under ROOT; return the paths that changed (check: would change).

    The figure is removed when there is no ok real-data run, so the page never links a stale one. A page
    that would lose a record's link is refused (pageguard.write_page), unless FORCE (make tables judged it first).
    """
    root = Path(root) if root is not None else ROOT
    page, fig = root / PAGE, root / FIGURE
    changed = []
    recs = load(root / RUNS)
    curve = curve_runs(recs, root)
    if curve is None and fig.exists():
        changed.append(fig)
        if not check:
            fig.unlink()
    elif curve is not None:
        if check:
            changed += [] if fig.exists() else [fig]
        elif markdown.write_if_changed(fig, draw_curve(*curve)):
            changed.append(fig)
    if pageguard.write_page(root, page, render(root, recs), "python -m megalab data-report", check=check, force=force):
        changed.append(page)
    return changed


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Rebuild results/data/README.md from results/data/runs/*/run.json."""
    changed = write_report(args.root, check=args.check)
    return markdown.report_changes(changed, args.root, check=args.check, what="data report", fix="run `make tables`")
