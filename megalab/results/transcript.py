"""The quickstart transcript, results/quickstart/transcript.txt: tutorials/00-quickstart.md followed step by
step, by a command.

The transcript has two kinds of section, each with its kind in its heading:

  [regenerated: COMMAND]   what any machine, a GPU or none, prints for COMMAND today: the preflight of
                           `make quickstart`'s target (planned for the GPU the page was followed on), the
                           tables' state, the summary of the quickstart run's committed log. `megalab
                           transcript` rewrites them; `megalab transcript --check` exits 1 where one is out
                           of date (a test runs it).
  [GPU run: ...]           what only a GPU run shows: the run `make quickstart` made (its progress and
                           result lines) and the install as typed on that machine. They say where and at
                           which commit they ran, and change only when `megalab transcript --gpu` follows
                           the page again on a GPU machine (then copy the new run folder from outdir/ into
                           results/quickstart/runs/, as the run's own line says).

Lines that name this machine rather than the page (the Python and torch, the Megatron check's
cache) are masked, so a regenerated section is the same on every machine.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from megalab.core import git, infile, markdown, variables
from megalab.core.paths import ROOT

TRANSCRIPT = Path("results") / "quickstart" / "transcript.txt"
TARGET = "101-gpt2xl-dp1-gbs1-bf16"
ITERS = "20"  # make quickstart's ITERS
GPU = "h200"  # the GPU the committed transcript's run ran on: the preflight is planned for it
RUNS = Path("results") / "quickstart" / "runs"
HEADING = re.compile(r"^## (.*?)\s+\[(regenerated: .*|GPU run: .*)\]$")
MASKS = (
    (re.compile(r"^(python\s+).*$", re.M), r"\1(the Python and torch of the machine that writes this: masked)"),
    (re.compile(r" \(the same check passed before; verdict cached in [^)]*\)"), ""),
)

HEADER = f"""# tutorials/00-quickstart.md, followed step by step. Sections marked [regenerated: ...] are what
# `megalab transcript` prints today on any machine (the page's commands, planned for GPU={GPU} where the page
# was followed); sections marked [GPU run: ...] come from the last time it was followed on a GPU machine, at the
# commit they name, and change only with `megalab transcript --gpu` there. `megalab transcript --check` says
# whether the regenerated ones are current.
"""


class TranscriptError(ValueError):
    """transcript.txt without the sections the command keeps: one line, with the fix."""


def _env() -> dict[str, str]:
    """This process's environment without any make variable the user set: the page's commands as a
    newcomer types them."""
    env = {k: v for k, v in os.environ.items() if k not in variables.BY_NAME}
    return {**env, "PYTHONWARNINGS": "ignore"}


def _run(root: Path, argv: list[str], **env: str) -> str:
    p = subprocess.run([sys.executable, "-m", "megalab", *argv], cwd=root, env={**_env(), **env},
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + (p.stderr if p.returncode else "")
    for pattern, repl in MASKS:
        out = pattern.sub(repl, out)
    return out.rstrip("\n") + "\n"


def _preflight(root: Path) -> str:
    """`make quickstart`'s preflight of TARGET, planned for GPU, up to the launch script."""
    out = _run(root, ["run", TARGET], DRY_RUN="1", GPU=GPU, ITERS=ITERS)
    return out.split("\nscript ", 1)[0].rstrip("\n") + "\n"


def _run_log(root: Path) -> Path:
    logs = sorted((root / RUNS).glob("*/logs.txt*"))
    if not logs:
        raise TranscriptError(f"{RUNS}: no quickstart run; fix: megalab transcript --gpu on a GPU machine, then copy "
                              "its run folder there")
    return logs[-1].relative_to(root)


def regenerated(root: Path) -> dict[str, tuple[str, str]]:
    """Section title -> (its tag, its text) for every section any machine regenerates."""
    log = _run_log(root)
    return {
        "2. First run: the preflight": (f"regenerated: DRY_RUN=1 GPU={GPU} ITERS={ITERS} megalab run {TARGET}",
                                        _preflight(root)),
        "3. Reading a row": ("regenerated: megalab tables --check", _run(root, ["tables", "--check"])),
        "4. Your own runs go to outdir/": (f"regenerated: megalab parse {log.as_posix()}, the quickstart run's log",
                                           _run(root, ["parse", log.as_posix()])),
    }


def sections(text: str) -> list[tuple[str, str, str]]:
    """transcript.txt as (title, tag, body) per `## title [tag]` heading, in order."""
    out: list[tuple[str, str, str]] = []
    for line in text.splitlines(keepends=True):
        if m := HEADING.match(line.rstrip("\n")):
            out.append((m.group(1), m.group(2), ""))
        elif out:
            title, tag, body = out[-1]
            out[-1] = (title, tag, body + line)
    return out


def render(kept: list[tuple[str, str, str]], fresh: dict[str, tuple[str, str]]) -> str:
    """The transcript: the kept sections in their order, each regenerated one replaced by its fresh text."""
    titles = [t for t, _, _ in kept]
    missing = [t for t in fresh if t not in titles]
    if missing:
        raise TranscriptError(f"{TRANSCRIPT}: no section '{missing[0]}'; fix: restore it from git (git checkout "
                              f"{TRANSCRIPT})")
    parts = [HEADER]
    for title, tag, body in kept:
        tag, body = fresh.get(title, (tag, body))
        parts.append(f"## {title}  [{tag}]\n{body}")
    return "".join(parts)


def gpu_sections(root: Path) -> dict[str, tuple[str, str]]:
    """On a GPU machine: the run `make quickstart` makes (ITERS=20), as the transcript's GPU section."""
    head = git.run(root, "rev-parse", "--short", "HEAD")  # None, not a hang, where git cannot answer
    commit = (head.stdout.strip() if head is not None else "") or "unknown"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        gpu = []
    if not gpu:
        raise TranscriptError("transcript --gpu: no GPU here (nvidia-smi found none); fix: run it on a GPU machine")
    out = _run(root, ["run", TARGET], ITERS=ITERS)
    body = "".join(line + "\n" for line in out.splitlines() if line.startswith(("run dir", "progress", "result")))
    return {"2. First run: the run": (f"GPU run: make quickstart on 1x {gpu[0]}, commit {commit}; copy its run "
                                      f"folder from outdir/ into {RUNS}/", body)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a regenerated section is out of date")
    ap.add_argument("--gpu", action="store_true", help="on a GPU machine: also make the GPU run (make quickstart)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Regenerate results/quickstart/transcript.txt: what the quickstart page's commands print today."""
    root = Path(args.root)
    path = root / TRANSCRIPT
    try:
        fresh = regenerated(root)
        if args.gpu:
            fresh.update(gpu_sections(root))
            kept = sections(infile.text(path))
            titles = [t for t, _, _ in kept]
            if "2. First run: the run" not in titles:  # a transcript written before the GPU section had a name
                kept.insert(titles.index("2. First run: the preflight") + 1, ("2. First run: the run", "", ""))
        else:
            kept = sections(infile.text(path))
        text = render(kept, fresh)
    except (TranscriptError, OSError) as e:
        print(f"megalab transcript: {e}", file=sys.stderr)
        return 1 if isinstance(e, TranscriptError) else 2
    changed = markdown.write_if_changed(path, text, check=args.check)
    if args.check:
        print(f"transcript: {TRANSCRIPT} " + ("is out of date; fix: run `megalab transcript` and commit it" if changed
                                              else "up to date"))
        return 1 if changed else 0
    print(f"transcript: {'wrote' if changed else 'up to date:'} {TRANSCRIPT}")
    return 0
