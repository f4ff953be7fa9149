"""`make tables` with nothing to do answers at once: a build that said nothing but its report leaves the
fingerprint of everything it read in the machine's cache, and a plain build over the same fingerprint is
skipped before pandas is imported or a record read (~15 s of loads and git questions -> a fraction of a second).

What a build reads, and so the fingerprint: under the pages' root, results/ (records, raw logs, bench and data
runs, and the pages themselves: one edited or deleted by hand is rebuilt) and tutorials/; the catalog's
configs/ (experiments, models, checks, reference CSVs) and megalab/ (the code); git's HEAD, which a record's
provenance and the page guard are judged against, and MEGALAB_COMMIT; the Python and its site-packages. A
file counts by its path, size and mtime, as make and git count it; one written so shortly before the
fingerprint that a later edit might keep its mtime counts by its content too (git's "racily clean" rule).
--check, --strict and --force (STRICT=1, FORCE=1) always build.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from megalab.core import catalog, git, infile, markdown, paths, variables
from megalab.core.paths import ROOT

RACY_NS = 2_000_000_000  # mtimes are as coarse as 1-2 s on some filesystems: younger files count by content
SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache"})  # what Python and pytest write as they read


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if any table is out of date (for CI)")
    ap.add_argument("--strict", action="store_true",
                    help="refuse (exit 1, write nothing) if a row's record is not today's code and defaults, or "
                         "a tutorial's check verdict is not said by its sentence (make tables STRICT=1)")
    ap.add_argument("--force", action="store_true",
                    help="write the pages even where they lose something (make tables FORCE=1). Without it, "
                         "make tables refuses (exit 1, one line, nothing written) to drop a row or a page, or "
                         "to lose a published (`ref`) or measured (`our`) number, a tutorial's table or a quoted "
                         "row; the rows of a catalog change not yet committed (a target removed or changed in "
                         "configs/experiments/ against HEAD) and the page of a chapter file removed since HEAD "
                         "need no FORCE (results/pageguard.py)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)


def main(args: argparse.Namespace, build: Callable[[argparse.Namespace], int]) -> int:
    """`python -m megalab tables`: BUILD(args) (tables.main, which __main__ imports only for it), skipped where a
    plain build's inputs are as the last silent build left them."""
    plain = not (args.check or args.strict or args.force or variables.value("STRICT") or variables.value("FORCE"))
    root = Path(args.root)
    if plain and (n := built(root)) is not None:
        print(f"tables up to date ({n} file{'s' * (n != 1)}; no input changed since the last build)")
        return 0
    with _heard() as said:
        rc = build(args)
    if plain and rc == 0 and said.only_report():
        remember(root, len(catalog.chapters()))
    return rc


# ---- the fingerprint ---------------------------------------------------------------------------------------

def inputs(root: Path) -> list[Path]:
    """The folders a build of ROOT's pages reads (see the module's docstring), each once."""
    folders = [root / "results", root / "tutorials", root / "configs", Path(catalog.CONFIGS), ROOT / "megalab"]  # CONFIGS as the build reads it
    return list(dict.fromkeys(p.resolve() for p in folders))


def listing(folders: list[Path]) -> dict[str, tuple[int, int]]:
    """Every file under FOLDERS: path -> (mtime_ns, size); a folder that is missing lists nothing."""
    out: dict[str, tuple[int, int]] = {}
    stack = [str(f) for f in folders]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS:
                        stack.append(e.path)
                else:
                    with contextlib.suppress(OSError):
                        st = e.stat()
                        out[e.path] = (st.st_mtime_ns, st.st_size)
    return out


def surroundings(root: Path) -> dict:
    """What a build depends on besides files: git's HEAD, MEGALAB_COMMIT, the Python and its packages."""
    head = git.run(root, "rev-parse", "--verify", "--quiet", "HEAD")
    site = {}
    for entry in sys.path:
        with contextlib.suppress(OSError, ValueError):
            if entry and not Path(entry).resolve().is_relative_to(ROOT):  # an install adds or removes a folder there
                site[entry] = os.stat(entry).st_mtime_ns
    return {"head": head.stdout.strip() if head is not None and head.returncode == 0 else None,
            "megalab_commit": os.environ.get("MEGALAB_COMMIT"), "python": sys.version, "site": site}


def digest(files: dict[str, tuple[int, int]], around: dict) -> str:
    h = hashlib.sha256(json.dumps(around, sort_keys=True).encode())
    for path in sorted(files):
        mtime, size = files[path]
        h.update(f"{path}\0{mtime}\0{size}\n".encode())
    return h.hexdigest()


def _content(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def stamp_path(root: Path) -> Path:
    """The stamp of ROOT's pages in the machine's cache (core/paths.cache_root), one per checkout."""
    return paths.cache_root() / "tables" / f"{hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]}.json"


def remember(root: Path, chapters: int) -> None:
    """ROOT's inputs, as they are now, were built: the next plain build over them may be skipped."""
    taken = time.time_ns()
    files = listing(inputs(root))
    racy = {p: _content(p) for p, (mtime, _) in files.items() if mtime >= taken - RACY_NS}
    doc = {"digest": digest(files, surroundings(root)), "racy": racy, "chapters": chapters}
    with contextlib.suppress(infile.InputError):  # a read-only cache only costs the next build its work
        markdown.write_atomic(stamp_path(root), json.dumps(doc) + "\n")


def built(root: Path) -> int | None:
    """The chapters of ROOT's last silent build when nothing it read has changed since; else None."""
    try:
        doc = json.loads(stamp_path(root).read_text())
        same = doc["digest"] == digest(listing(inputs(root)), surroundings(root)) and all(
            _content(p) == h for p, h in doc["racy"].items())
        return int(doc["chapters"]) if same else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, or damaged: build
        return None


# ---- what a build said -------------------------------------------------------------------------------------

REPORT = ("wrote ", "removed ", "tables up to date", "megalab tables: gzipped ")  # markdown.report_changes, main


class _Heard(io.TextIOBase):
    """A stream that passes everything on and keeps a copy."""

    def __init__(self, out):
        self.out, self.text = out, []

    def write(self, s: str) -> int:
        self.text.append(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


class _Said:
    def __init__(self):
        self.out, self.err = _Heard(sys.stdout), _Heard(sys.stderr)

    def only_report(self) -> bool:
        """The build said nothing but what it wrote (a note, such as a verdict no sentence says, or a warning,
        is said again by every build: such a build is not remembered)."""
        lines = "".join(self.out.text).splitlines()
        return not "".join(self.err.text).strip() and all(line.startswith(REPORT) for line in lines)


@contextlib.contextmanager
def _heard():
    said = _Said()
    with contextlib.redirect_stdout(said.out), contextlib.redirect_stderr(said.err):
        yield said
