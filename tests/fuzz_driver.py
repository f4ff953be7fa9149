"""Runs megalab's commands in-process, one damaged input at a time, in a sandbox copy of the repository.

    python tests/fuzz_driver.py SANDBOX PRISTINE CASES.json RESULTS.json

SANDBOX is the copy the commands read and write (its megalab is the one imported: ROOT is the sandbox).
The cases marked `settle` run first and are kept (the pages of a copy without git history differ from the
committed ones: they are the baseline); PRISTINE, made then, is the copy every later case is undone from. Each case of CASES.json names the files
it damages (content, or a FIFO, a directory, a symbolic link, a sparse file of some size), the commands
that read them (argv of `python -m megalab`, with an environment) and what a correct answer looks like.
Each command is megalab.__main__.main(argv), the CLI's own entry, run with stdout and stderr captured and
an alarm as a time limit: an exception out of it, or a traceback printed, is a traceback; running into the
alarm is a hang. After each command the pages are compared with what they were (a row, a reference value,
a quoted number or a page lost), the files a command must leave alone (`unchanged`) with theirs, and, in a
case that plants hostile text (`markup`: its tokens), every page is read for that text quoted raw (a tag, a
comment, a line break) and every table for rows of the wrong width; after each case every file under
results/, tutorials/ and configs/ is put back as PRISTINE has it. Standard library only, besides the
sandbox's megalab.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import functools
import io
import json
import os
import re
import resource
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

SANDBOX, PRISTINE = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
sys.path.insert(0, str(SANDBOX))
os.chdir(SANDBOX)

import megalab.__main__ as cli  # noqa: E402  (the sandbox's)
from megalab.core import git  # noqa: E402

_git_run, _REFUSED = git.run, {}


def _git_once(root, *args):
    """git's refusal, asked once a question: the sandbox is no repository (no .git, none above it), so git refuses
    every question alike, as it would a fresh process (thousands of git starts, a tenth of the audit, otherwise)."""
    key = (str(root), args)
    if key not in _REFUSED:
        out = _git_run(root, *args)
        if out is None or out.returncode == 0 or any(k.startswith("GIT_") for k in os.environ):
            return out
        _REFUSED[key] = out
    return _REFUSED[key]


git.run = _git_once

TREES = ("results", "tutorials", "configs")
TRACEBACK = "Traceback (most recent call last)"
QUOTE = re.compile(r"<!-- q ([^|>]+?) \| ([^>]+?) -->(.*?)<!-- /q -->")
NUMBER = re.compile(r"\d")


class Hang(BaseException):
    """The command ran into the time limit (a FIFO read that blocks, a loop that never ends)."""


def _alarm(signum, frame):
    raise Hang()


signal.signal(signal.SIGALRM, _alarm)
# A reader that reads /dev/zero or unpacks a gzip bomb whole fails here with a MemoryError (counted as a
# traceback) instead of taking the machine's memory.
MEMORY_LIMIT = int(os.environ.get("FUZZ_MEMORY_LIMIT", 6 << 30))
resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


# --------------------------------------------------------------------------- the tree and its undoing

def manifest(root: Path) -> dict[str, tuple]:
    """relative path -> (kind, size, mtime) of everything under the trees, links not followed."""
    out = {}
    stack = [tree for tree in TREES]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(root / rel))
        except OSError:  # not there, or not a folder: nothing under it (as os.walk)
            continue
        for e in entries:
            path = f"{rel}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone since it was listed
                continue
            if stat.S_ISDIR(st.st_mode):
                out[path] = (stat.S_IFDIR, 0, 0)
                stack.append(path)
            else:
                out[path] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


BASE: dict[str, tuple] = {}


def _remove(p: Path) -> None:
    if p.is_symlink() or not p.exists() or not p.is_dir():
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    else:
        shutil.rmtree(p)


def undo() -> list[str]:
    """Every file under the trees back as PRISTINE has it; the paths that had changed."""
    now = manifest(SANDBOX)
    changed = sorted(k for k in set(now) | set(BASE) if now.get(k) != BASE.get(k))
    for rel in sorted((k for k in changed if k not in BASE), key=len, reverse=True):  # new: deepest first
        if os.path.lexists(SANDBOX / rel):
            _remove(SANDBOX / rel)
    for rel in sorted(k for k in changed if k in BASE):
        dst, src = SANDBOX / rel, PRISTINE / rel
        if BASE[rel][0] == stat.S_IFDIR:
            if os.path.lexists(dst) and not dst.is_dir():
                _remove(dst)
            dst.mkdir(parents=True, exist_ok=True)
            continue
        if os.path.lexists(dst):
            _remove(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return changed


# --------------------------------------------------------------------------- damage

def apply(files: dict[str, dict]) -> None:
    for rel, how in files.items():
        p = SANDBOX / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(p):
            _remove(p)
        if "copy" in how:  # a copy of another folder or file of the tree (less what `without` names)
            src = SANDBOX / how["copy"]
            if src.is_dir():
                shutil.copytree(src, p, ignore=shutil.ignore_patterns(*how.get("without", [])))
            else:
                shutil.copy2(src, p)
        elif "b64" in how:
            p.write_bytes(base64.b64decode(how["b64"]))
        elif how.get("special") == "delete":
            pass
        elif how.get("special") == "fifo":
            os.mkfifo(p)
        elif how.get("special") == "dir":
            p.mkdir()
        elif how.get("special") == "loop":
            os.symlink(p.name, p)
        elif how.get("special") == "symlink":
            os.symlink(how["to"], p)
        elif how.get("special") == "sparse":
            with open(p, "wb") as f:
                f.truncate(how["size"])
        else:
            raise SystemExit(f"fuzz_driver: unknown damage {how}")


# Kept between calls, because a fresh process builds the same from what it reads: built from the code alone, never
# from a file a case damages, or keyed by the very bytes read (a damaged file is other bytes: parsed, and refused, anew)
KEPT = {("megalab.core.catalog", "_defaults_model"),  # a pydantic model of Experiment's fields (create_model)
        ("megalab.core.schema", "_parsed"),  # a record file's bytes (and folder) -> its RunRecord or why it is none
        ("megalab.core.provenance", "_blob_statements")}  # a git blob (content-addressed) -> its statements
_CLEARABLE: dict[str, tuple[object, int, list]] = {}  # module name -> (module, len(vars), its caches)
_MEGALAB: list = [0, []]  # (len(sys.modules) when looked, the names of megalab's modules then)


def reset_caches() -> None:
    """What megalab keeps between calls in one process: lru_caches, the once-per-file skip lines. Each
    module's caches are looked up once (again when its namespace changes size or it is imported anew)."""
    if _MEGALAB[0] != len(sys.modules):  # megalab's modules, found again only when an import added some
        _MEGALAB[:] = [len(sys.modules), [n for n in list(sys.modules) if n.startswith("megalab")]]
    for name in _MEGALAB[1]:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        namespace = vars(mod)
        known = _CLEARABLE.get(name)
        if known is None or known[0] is not mod or known[1] != len(namespace):
            known = _CLEARABLE[name] = (mod, len(namespace), [
                v for k, v in list(namespace.items())
                if callable(getattr(v, "cache_clear", None)) and (name, k) not in KEPT])
        for value in known[2]:
            value.cache_clear()
    from megalab.core import records
    records._warned.clear()


# --------------------------------------------------------------------------- pages lost

# A page's text by its path, with what os.stat said of it when read: (inode, size, mtime, ctime) -> text
_TEXTS: dict[str, tuple[tuple, str | None]] = {}
RACY_NS = 2_000_000_000  # a file changed this recently is read each time: a second change might keep its times


def _text(p: Path) -> str | None:
    """A regular file's text (None for anything else: the driver must never block on a FIFO a case made). Read
    again only where the file changed since (git's rule: its inode, size, mtime or ctime, which no write leaves
    as they were, and which copying the times back cannot reset), or changed within RACY_NS of its reading."""
    try:
        st = os.stat(p)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    kept = _TEXTS.get(str(p))
    if kept is not None and kept[0] == key:
        return kept[1]
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
        _TEXTS[str(p)] = (key, text)
    return text


def page_state(root: Path) -> dict:
    """What a reader of the pages would miss if it went: each chapter CSV's rows (target -> status, the
    numeric `ref` cells), each generated page, each tutorial quote that shows a number or a table. Every file
    is read each time; what is parsed out of a text is parsed once per text (_csv_state, _tutorial_state)."""
    state = {"rows": {}, "refs": {}, "pages": set(), "quotes": {}, "embeds": {}}
    for p in sorted((root / "results").glob("*.csv")):
        rows, refs = _parsed(_csv_state, p.name, _text(p) or "")
        state["rows"].update(rows)
        state["refs"].update(refs)
    for p in [*(root / "results").glob("*.md"), *(root / "results").glob("*/README.md"),
              *(root / "results" / "plots").glob("*.svg")]:
        if _text(p):
            state["pages"].add(str(p.relative_to(root)))
    for p in sorted((root / "tutorials").glob("*.md")):
        text = _text(p)
        if text is None:
            continue
        quotes, embeds = _parsed(_tutorial_state, p.name, text)
        state["quotes"].update(quotes)
        state["embeds"].update(embeds)
    return state


def _parsed(parse, name: str, text: str):
    """parse(name, text), kept for a text under 1 MiB (a page a case blew up is parsed each time, never kept)."""
    return parse(name, text) if len(text) < 1 << 20 else parse.__wrapped__(name, text)


@functools.lru_cache(maxsize=1024)
def _csv_state(name: str, text: str) -> tuple[dict, dict]:
    """A chapter CSV's rows ((page, target) -> status) and numeric `ref` cells ((page, target, column) -> text)."""
    rows, refs = {}, {}
    try:
        records = list(csv.DictReader(io.StringIO(text)))
    except csv.Error:
        return rows, refs
    for r in records:
        t = r.get("make target")
        if not t:
            continue
        rows[(name, t)] = (r.get("status") or "").strip()
        for k, v in r.items():
            if k and k.startswith("ref") and v and NUMBER.search(v):
                refs[(name, t, k)] = v
    return rows, refs


@functools.lru_cache(maxsize=1024)
def _tutorial_state(name: str, text: str) -> tuple[dict, dict]:
    """A tutorial's quotes that show a number ((page, i, source, key) -> text) and its embedded tables' lengths."""
    quotes, embeds = {}, {}
    for i, m in enumerate(QUOTE.finditer(text)):
        if NUMBER.search(m.group(3)):
            quotes[(name, i, m.group(1), m.group(2))] = m.group(3)
    for m in re.finditer(r"<!-- megalab:table chapter=(\d+) -->\n(.*?)<!-- /megalab:table -->", text, re.S):
        embeds[(name, m.group(1))] = len(m.group(2).splitlines())
    return quotes, embeds


# --------------------------------------------------------------------------- raw markup (issue 60)

# A `<` that opens a tag, a comment or an autolink, but our own markers' (the pages' and the tutorials' comments)
RAW = re.compile(r"<(?!!-- (?:q |/q -->|check |/check -->|megalab:table|/megalab:table|generated|published|/published))"
                 r"[A-Za-z/!?]")
DELIMITER = re.compile(r"\|(\s*:?-+:?\s*\|)+\s*")


def _cells(line: str) -> int:
    """How many cells GFM splits a table row into (a pipe after a backslash splits none)."""
    n, slashes = 0, 0
    for ch in line.strip():
        n += ch == "|" and slashes % 2 == 0
        slashes = slashes + 1 if ch == "\\" else 0
    return n


def markup(root: Path, tokens: list[str]) -> tuple[list[str], list[str]]:
    """(what the pages quote raw of the hostile texts of TOKENS, and which tokens they quote at all): a raw tag or
    comment on a line of a token, a line holding a token's second half without its first (a line break quoted),
    a table row whose cells are not its header's."""
    bad, seen = [], set()
    pages = [*root.glob("results/*.md"), *root.glob("results/*/README.md"), *root.glob("tutorials/*.md")]
    for p in sorted(pages):
        text = _text(p) or ""
        if not any(t in text for t in tokens):
            continue
        lines = text.split("\n")
        for i, line in enumerate(lines):
            for t in tokens:
                if t not in line:
                    continue
                seen.add(t)
                if RAW.search(line):
                    bad.append(f"{p.relative_to(root)}:{i + 1}: raw markup near {t}: {line[:160]!r}")
                if f"{t}B" in line and f"{t}A" not in line.split(f"{t}B")[0]:
                    bad.append(f"{p.relative_to(root)}:{i + 1}: a line break of {t}'s text: {line[:160]!r}")
            if line.startswith("|") and i + 1 < len(lines) and DELIMITER.fullmatch(lines[i + 1]) \
                    and (i == 0 or not lines[i - 1].startswith("|")):
                width, j = _cells(line), i + 1
                while j < len(lines) and lines[j].startswith("|"):
                    if _cells(lines[j]) != width:
                        bad.append(f"{p.relative_to(root)}:{j + 1}: {_cells(lines[j])} cells under a header of {width}")
                    j += 1
    return bad, sorted(seen)


def _digest(root: Path, rels: list[str]) -> dict[str, bytes | None]:
    out = {}
    for rel in rels:
        try:
            out[rel] = (root / rel).read_bytes()
        except OSError:
            out[rel] = None
    return out


def lost(before: dict, after: dict) -> list[str]:
    out = []
    for (page, target), status in before["rows"].items():
        now = after["rows"].get((page, target))
        if now is None:
            out.append(f"row {target} of {page}")
        elif not status.startswith("not run") and now.startswith("not run"):
            out.append(f"row {target} of {page}: {status!r} -> {now!r}")
    out += [f"{k} of {t} in {page}" for (page, t, k) in before["refs"] if (page, t, k) not in after["refs"]]
    out += [f"page {p}" for p in sorted(before["pages"] - after["pages"])]
    out += [f"quote {q[2]} | {q[3]} in {q[0]}" for q in before["quotes"] if q not in after["quotes"]]
    out += [f"table of chapter {c} in {t}" for (t, c), n in before["embeds"].items()
            if after["embeds"].get((t, c), 0) < n]
    return out


# --------------------------------------------------------------------------- one command

def run(argv: list[str], env: dict[str, str], limit: float) -> dict:
    saved = dict(os.environ)
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    rc, tb, hang = None, False, False
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(argv))
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except Hang:
        hang = True
    except BaseException as e:  # noqa: BLE001  (what the audit counts: anything out of the CLI's main)
        import traceback
        tb = True
        err.write("".join(traceback.format_exception(e)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.environ.clear()
        os.environ.update(saved)
    text = err.getvalue()
    tb = tb or TRACEBACK in text or TRACEBACK in out.getvalue()
    return {"argv": argv, "env": env, "rc": rc, "traceback": tb, "hang": hang, "secs": round(time.monotonic() - t0, 2),
            "stderr": text[-(1 << 21):], "stdout_tail": out.getvalue()[-600:]}


def main() -> int:
    global BASE
    cases = json.loads(Path(sys.argv[3]).read_text())
    results = []
    log = open(sys.argv[4] + ".jsonl", "w")  # as they come: a driver that dies leaves what it had
    for case in cases:
        if case.get("settle"):
            for cmd in case["commands"]:
                reset_caches()
                results.append({**run(cmd["argv"], cmd.get("env", {}), cmd.get("limit", 300)), "case": case["name"],
                                "lost": [], "settle": True})
    for tree in TREES:
        shutil.copytree(SANDBOX / tree, PRISTINE / tree, symlinks=True, dirs_exist_ok=True)
    BASE = manifest(SANDBOX)
    todo = [c for c in cases if not c.get("settle")]
    for n, case in enumerate(todo, 1):
        print(f"[{n}/{len(todo)}] {case['name']}", file=sys.__stderr__, flush=True)
        apply(case.get("files", {}))
        before = page_state(SANDBOX)
        for cmd in case["commands"]:
            reset_caches()
            kept = _digest(SANDBOX, cmd.get("unchanged", []))
            r = run(cmd["argv"], {**case.get("env", {}), **cmd.get("env", {})}, cmd.get("limit", 60))
            after = page_state(SANDBOX)
            r["lost"], before = lost(before, after), after
            r["changed"] = [rel for rel, data in _digest(SANDBOX, cmd.get("unchanged", [])).items() if data != kept[rel]]
            if case.get("markup"):
                r["markup"], r["quoted"] = markup(SANDBOX, case["markup"])
            r.update(case=case["name"], **{k: cmd[k] for k in ("expect", "mentions", "any_of") if k in cmd})
            results.append(r)
            log.write(json.dumps(r) + "\n")
            log.flush()
        undo()
    Path(sys.argv[4]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
