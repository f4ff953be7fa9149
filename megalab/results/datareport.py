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

from megalab.core import flags, logparse, markdown, records
from megalab.results import plots, tables
from megalab.core.records import RunRecord
from megalab.core.paths import ROOT
from megalab.core import provenance

PAGE = Path("results") / "data" / "README.md"
RUNS = Path("results") / "data" / "runs"
FIGURE = Path("results") / "data" / "loss-curve.svg"
VOCAB_LINE = re.compile(r"padded vocab \(size: (\d+)\)")


# --------------------------------------------------------------------------- records

def load(runs: Path) -> list[dict]:
    """Every record under RUNS, oldest first, with `_dir` (its folder); unreadable ones skipped."""
    out = [rec.raw | {"_dir": rec.run_dir} for rec in records.read_records(runs, "megalab data-report")]
    records.mark_shared(out, runs.parent.parent)  # results/: every run that shared the host
    return sorted(out, key=lambda r: (records.stamp(r.get("started")), r["_dir"].name))


def _cfg(rec: dict) -> dict:
    return rec.get("config") or {}


def is_mock(rec: dict) -> bool:
    return _cfg(rec).get("data", "mock") == "mock"


def _last_vocab_flag(args) -> int | None:
    try:  # read as the plan reads EXTRA_ARGS (flags.py); a malformed one says nothing
        words = shlex.split(args) if isinstance(args, str) else [str(a) for a in (args or [])]
        return flags.effective_model({}, words).get("vocab_size")
    except ValueError:
        return None


def vocab(rec: dict, root: Path) -> int | None:
    """The vocabulary a record trained with (module docstring), None when unknown; worked out once
    per record (a real-data run's comes from its log), then kept on it."""
    if "_vocab" not in rec:
        rec["_vocab"] = _vocab(rec, root)
    return rec["_vocab"]


def _vocab(rec: dict, root: Path) -> int | None:
    cfg = _cfg(rec)
    if is_mock(rec):
        return (_last_vocab_flag(cfg.get("extra_args")) or _last_vocab_flag(cfg.get("catalog_extra_args"))
                or (cfg.get("model_preset") or {}).get("vocab_size"))
    log = rec["_dir"] / (rec.get("files") or {}).get("log", "logs.txt")
    try:
        if m := VOCAB_LINE.search(logparse.read_log(log).decode(errors="replace")):
            return int(m.group(1))
    except OSError:
        pass
    try:
        return int(json.loads((root / f"{cfg['data']}.info.json").read_text())["vocab_size"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _newest_ok_else_any(recs: list[dict]) -> dict | None:
    ok = [r for r in recs if r.get("status") == "ok"]
    return (ok or recs or [None])[-1]


def pairs(recs: list[dict], root: Path) -> list[tuple[str, dict | None, dict | None, int | None]]:
    """(target, real record, mock twin, real vocabulary) per target, resume runs left out.

    The real side is the newest ok real-data record, else the newest of any status; the mock side
    the newest ok mock record at the real side's vocabulary (any vocabulary when that is unknown),
    else the newest mock record that did not end ok.
    """
    out = []
    for target in sorted({r["target"] for r in recs if not r["target"].startswith("resume-")}):
        mine = [r for r in recs if r["target"] == target]
        real = _newest_ok_else_any([r for r in mine if not is_mock(r)])
        v = vocab(real, root) if real else None
        mocks = [r for r in mine if is_mock(r)]
        twins = [r for r in mocks if r.get("status") == "ok" and (v is None or vocab(r, root) == v)]
        mock = twins[-1] if twins else ([r for r in mocks if r.get("status") != "ok"] or [None])[-1]
        out.append((target, real, mock, v))
    return out


# --------------------------------------------------------------------------- cells

def _link(rec: dict, text: str | None = None) -> str:
    return f"[{text or rec['_dir'].name}](runs/{rec['_dir'].name}/run.json)"


def _status(rec: dict) -> str:
    """'ok', or the status with the record's one error line ('failed: AssertionError: ...')."""
    r = RunRecord.of(rec)
    return f"{r.status}: {r.error}".replace("|", "\\|") if r.status != "ok" and r.error else r.status


def _side(rec: dict | None) -> list[str]:
    """Step ms (p10-p90), TFLOP/s, peak GiB of an ok record; the status in words otherwise."""
    if rec is None:
        return ["not run", "", ""]
    r = RunRecord.of(rec)
    if r.status != "ok" or r.step_ms_median is None:
        return [f"{_status(rec)} ({_link(rec, 'record')})", "", ""]
    shared = " †" if rec.get("_concurrent") else ""
    ms = f"{r.step_ms_median:.0f} ({r.step_ms_p10:.0f}–{r.step_ms_p90:.0f}){shared}"
    return [f"{ms} ({_link(rec, 'record')})", "" if r.tflops_per_gpu is None else f"{r.tflops_per_gpu:.1f}",
            tables.fmt_mem(list(r.mem_peak_gib))[0]]


def _ratio(real: dict | None, mock: dict | None, v: int | None) -> str:
    if not (real and mock and real.get("status") == mock.get("status") == "ok"):
        return ""
    if v is None:
        return "vocabulary unknown"
    ka, kb = provenance.comparable_key(real), provenance.comparable_key(mock)
    if ka and kb and ka != kb:
        return tables.OTHER_HOST  # two hosts or two codes: no ratio (identical commands differ 5-23% between hosts)
    return f"{real['step_ms_median'] / mock['step_ms_median']:.2f}x"


def _v(x: int | None) -> str:
    return "unknown" if x is None else str(x)


# --------------------------------------------------------------------------- loss curve

def _losses(rec: dict) -> list[tuple[int, float]]:
    log = rec["_dir"] / (rec.get("files") or {}).get("log", "logs.txt")
    try:
        its = logparse.parse_file(log).iterations
    except logparse.LogReadError:
        return []
    return [(it.iteration, it.lm_loss) for it in its if it.lm_loss is not None]


def curve_runs(recs: list[dict], root: Path) -> tuple[dict, dict | None, int | None] | None:
    """(longest ok real-data run, its mock twin or None, vocabulary); None when there is none.

    A resume half is not a whole curve, so resume runs are left out; among equally long runs the
    newest wins.
    """
    ok = [r for r in recs if r.get("status") == "ok" and not is_mock(r) and not r["target"].startswith("resume-")]
    if not ok:
        return None
    real = max(ok, key=lambda r: (r.get("iters_logged") or 0, records.stamp(r.get("started")), r["_dir"].name))
    _, _, mock, v = next(p for p in pairs(recs, root) if p[0] == real["target"])
    return real, (mock if mock and mock.get("status") == "ok" else None), v


def draw_curve(real: dict, mock: dict | None, v: int | None, fmt: str = "svg") -> bytes:
    """Loss per iteration, real data and its mock twin on one axis; SVG bytes, same in, same out
    (fmt="png" for a quick look)."""
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure as MplFigure

    with matplotlib.style.context("default"), matplotlib.rc_context(plots.STYLE):
        f = MplFigure(figsize=plots.SIZE, dpi=plots.DPI, layout="constrained")
        ax = f.add_subplot()
        for rec, label, color in ((real, f"real data: {_cfg(real).get('data')}", "C0"),
                                  (mock, "mock data, same vocabulary", "C1")):
            if rec is not None and (pts := _losses(rec)):
                ax.plot([i for i, _ in pts], [loss for _, loss in pts], color=color, lw=1.2, label=label)
        if v:  # where a fresh model starts: the loss of a uniform guess over the vocabulary
            ax.axhline(math.log(v), ls="--", lw=1, color="0.5", label=f"ln {v} = {math.log(v):.2f} (uniform guess)")
        ax.set(xlabel="iteration", ylabel="lm loss", title=f"{real['target']}: training loss per iteration")
        f.legend(loc="outside right upper", fontsize=8, frameon=False)
        buf = io.BytesIO()
        f.savefig(buf, format=fmt, metadata=plots.SVG_META if fmt == "svg" else {"Software": None})
    return buf.getvalue()


# --------------------------------------------------------------------------- page


def _resume_cells(r: dict) -> list[str]:
    """A resume check's row: where launch 1 stopped, its last loss, launch 2's first, the jump."""
    c = r["resume_check"]
    before, after = records.num(c.get("saved_last_loss")), records.num(c.get("resumed_first_loss"))
    return [_link(r, r["target"]), str(c.get("stop_at")),
            f"{'' if before is None else f'{before:.4f}'} ({c.get('saved_last_iteration')})",
            f"{'' if after is None else f'{after:.4f}'} ({c.get('resumed_first_iteration')})",
            str(c.get("loss_jump", "")), "ok" if c.get("ok") else f"FAIL: {c.get('why')}"]


def render(root: Path | None = None, recs: list[dict] | None = None) -> str:
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


def _pairs_section(recs: list[dict], root: Path) -> list[str]:
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
    if any(r.get("_concurrent") for _, real, mock, _ in rows for r in (real, mock) if r):
        L += ["- " + tables.SHARED_NOTE]
    return L


def _curve_section(recs: list[dict], root: Path) -> list[str]:
    curve = curve_runs(recs, root)
    if curve is None:
        return ["Not run yet: no real-data run has ended ok."]
    real, mock, v = curve
    pts = _losses(real)
    text = (f"`{real['target']}` on `{_cfg(real).get('data')}` ({_link(real, 'record')}): {len(pts)} iterations, "
            f"loss {pts[0][1]:.3f} → {pts[-1][1]:.3f}" if pts else f"`{real['target']}`: no loss in its log")
    if mock and (mp := _losses(mock)):
        text += (f"; its mock twin ({_link(mock, 'record')}): {len(mp)} iterations, "
                 f"loss {mp[0][1]:.3f} → {mp[-1][1]:.3f}")
    return [text + ".", "", f"![loss per iteration, real data and mock]({FIGURE.name})"]


def _resume_section(recs: list[dict]) -> list[str]:
    resumes = [r for r in recs if r["target"].startswith("resume-")]
    checked = [r for r in resumes if isinstance(r.get("resume_check"), dict)]
    if not checked:
        last = f" (the last attempt, {_link(resumes[-1])}, ended {_status(resumes[-1])})" if resumes else ""
        return [f"Not run yet{last}."]
    return ["Launch 1 trains to `stop at` and saves; launch 2 loads that checkpoint and must go on from the next "
            "iteration with a loss near launch 1's last, not a fresh model's.", "",
            *markdown.table(["record", "stop at", "last loss before (iteration)", "first loss after (iteration)",
                             "loss jump", "ok"], (_resume_cells(r) for r in checked))]


def _records_section(recs: list[dict], root: Path) -> list[str]:
    L = []
    for r in recs:
        cfg = _cfg(r)
        data = "mock data" if is_mock(r) else f"real data `{cfg.get('data')}`"
        check = r.get("resume_check")
        extra = f", resume check {'ok' if check.get('ok') else 'FAIL'}" if isinstance(check, dict) else ""
        L.append(f"- {_link(r)}: `{r['target']}`, {data}, vocabulary {_v(vocab(r, root))}, "
                 f"{cfg.get('iters')} iterations: {_status(r)}{extra}")
    return L or ["None yet."]


def write_report(root: Path | None = None, *, check: bool = False) -> list[Path]:
    """Write the page and its figure under ROOT; return the paths that changed (check: would change).

    The figure is removed when there is no ok real-data run, so the page never links a stale one.
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
        else:
            svg = draw_curve(*curve)
            if not fig.exists() or fig.read_bytes() != svg:
                markdown.write_atomic(fig, svg)
                changed.append(fig)
    text = render(root, recs)
    if not page.exists() or page.read_text(encoding="utf-8") != text:
        changed.append(page)
        if not check:
            markdown.write_atomic(page, text)
    return changed


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Rebuild results/data/README.md from results/data/runs/*/run.json."""
    changed = write_report(args.root, check=args.check)
    return markdown.report_changes(changed, args.root, check=args.check, what="data report", fix="run `make tables`")
