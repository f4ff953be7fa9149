"""Damaged inputs made from the committed files, the commands that read them, and the audit's figures.

Issue 31's audit, as code: every input megalab reads (run records and the logs, memory CSVs and
TensorBoard files beside them; the catalog, the model presets, configs/checks.yaml, configs/bench.yaml,
the reference CSVs; the make variables) is damaged in many ways, deterministically (seeded), and read by
every command that reads it. tests/fuzz_driver.py runs the commands in-process in a copy of the
repository; judge() says what each answer was:

    traceback        an exception out of the command, or a Python traceback printed
    hang             the command did not end within its time limit (a FIFO read blocks forever)
    silent           an invalid input taken without a word: exit 0 and no line naming it (a record, a
                     log, a CSV beside a record is skipped with one line naming its file; a config or
                     a variable is refused, non-zero, in one line with its fix)
    page lost        exit 0, and a row, a published value, a quoted number or a page went from the
                     pages (pages never shrink silently: `make tables` refuses, FORCE=1 allows), or a file
                     a command must leave as it is (a committed record refresh would make worse) changed
    raw markup       (issue 60) a page that quotes a hostile text raw: a tag, a comment or a line break of
                     it, or a table row with more or fewer cells than its header

    .venv/bin/python tests/fuzz_inputs.py [--group records,catalog,...] [--per-input] [--json OUT]

prints the figures (tried / tracebacks / hangs / silent / pages lost) for the groups; --per-input reads
every damaged record alone with every reader (slow: the issue's audit), instead of all of a batch at once.
tests/test_fuzz_inputs.py runs the same cases and asserts every figure is 0.
"""
from __future__ import annotations

import argparse
import base64
import collections
import copy
import functools
import gzip
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "fuzz_driver.py"
SEED = 31  # the number: every damage below is drawn from random.Random(SEED)


def newest(srcs: list[Path]) -> str:
    """A start a minute after every source's: a damaged record is the newest of its target (it would stand in
    the row), and not in the future (a record that starts there is refused: issue 60)."""
    import datetime as dt

    stamps = []
    for src in srcs:
        try:
            stamps.append(dt.datetime.fromisoformat(json.loads((src / "run.json").read_text())["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return (max(stamps) + dt.timedelta(minutes=1)).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- the sandbox

def sandbox(base: Path, ref: str | None = None, *, runs: list[Path] | None = None) -> Path:
    """A copy of the repository under BASE (no .git, no venv, no tests): the commands' ROOT. REF: the
    tree of that commit instead of the working tree (the audit of main: --tree main). RUNS: the only run
    folders kept under results/**/runs/ (default sources(): every reader then reads a dozen records, not
    three hundred, and the damaged ones beside them). The copy sits two folders down, so that a page path
    of ../../x that code would take still lands in BASE."""
    repo = base / "sandbox" / "repo"
    if ref:
        repo.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
        shutil.rmtree(repo / "tests", ignore_errors=True)
    keep = {str(d.relative_to(ROOT)) for d in (sources() if runs is None else runs)}
    if not ref:
        plain = shutil.ignore_patterns(".git", ".venv", "outdir", ".pytest_cache", "*.egg-info", "tests")

        def ignore(folder: str, names: list[str]) -> set[str]:
            """The patterns above, and the run folders not kept (never copied, rather than copied and removed)."""
            skip = set(plain(folder, names))
            rel = Path(folder).relative_to(ROOT)
            if rel.parts[:1] == ("results",) and rel.name == "runs":
                skip |= {n for n in names if str(rel / n) not in keep and (Path(folder) / n).is_dir()}
            return skip

        shutil.copytree(ROOT, repo, symlinks=True, ignore=ignore)
    for d in sorted(repo.glob("results/**/runs/*")):
        if d.is_dir() and str(d.relative_to(repo)) not in keep:
            shutil.rmtree(d)
    (repo / "outdir").mkdir()
    return repo


def drive(repo: Path, cases: list[dict], timeout: float = 1800, progress: bool = False) -> list[dict]:
    """Run CASES in REPO (tests/fuzz_driver.py, one process); every (case, command) answer."""
    base = repo.parent.parent
    work = Path(tempfile.mkdtemp(prefix="drive-", dir=base))
    (work / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    env.update(HOME=str(base / "home"), MEGALAB_CACHE_DIR=str(base / "cache"), PYTHONDONTWRITEBYTECODE="1",
               MPLCONFIGDIR=str(base / "mpl"))
    proc = subprocess.run([sys.executable, str(DRIVER), str(repo), str(work / "pristine"), str(work / "cases.json"),
                           str(work / "out.json")], cwd=repo, env=env, stdout=subprocess.PIPE,
                          stderr=None if progress else subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"fuzz driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{(proc.stderr or '')[-3000:]}")
    out = json.loads((work / "out.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- judging an answer

def judge(case: dict, r: dict) -> dict[str, bool]:
    """What one command's answer was (the figures count these)."""
    err = r["stderr"]
    expect = r.get("expect") or case.get("expect", "any")
    mentions = r.get("mentions") or ([case["mention"]] if case.get("mention") else [])
    named = all(m in err for m in mentions) and (not r.get("any_of") or any(m in err for m in r["any_of"]))
    silent = unclear = False
    if expect == "skip":  # read on, with one line naming the damaged file
        silent = not named
    elif expect == "refuse":  # non-zero, in one line naming the input, with the fix (or argparse's usage)
        silent = r["rc"] == 0
        unclear = not silent and (not named or not ("fix" in err or "usage:" in err))
    broken = bool(r["traceback"] or r["hang"])
    return {"traceback": bool(r["traceback"]), "hang": bool(r["hang"]), "silent": silent and not broken,
            "unclear": unclear and not broken, "lost": bool(r["lost"]) and r["rc"] == 0 or bool(r.get("changed")),
            "markup": bool(r.get("markup"))}


def figures(cases: list[dict], results: list[dict]) -> dict[str, collections.Counter]:
    """group -> Counter(inputs, runs, traceback, hang, silent, lost) over (case, command) answers; an input
    counts once per kind however many of its commands went wrong."""
    by_name = {c["name"]: c for c in cases}
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    per_input: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        if r.get("settle"):
            continue
        case = by_name[r["case"]]
        verdict = judge(case, r)  # once per answer: a batch's answer stands for each of its inputs
        for name in case.get("inputs", [case["name"]]):
            per_input[name]["runs"] += 1
            for k, v in verdict.items():
                per_input[name][k] += v
        out[case["group"]]["runs"] += 1
        for k, v in verdict.items():
            out[case["group"]][k] += v
    for case in cases:
        for name in case.get("inputs", [case["name"]]):
            out[case["group"]]["inputs"] += 1
            for k in KINDS:
                out[case["group"]][f"inputs with {k}"] += bool(per_input[name][k])
    return out


KINDS = ("traceback", "hang", "silent", "unclear", "lost", "markup")


def report(figs: dict[str, collections.Counter]) -> str:
    """The audit's table: per group, inputs and (input, command) runs, then each kind of wrong answer
    counted over runs, and (in brackets) over inputs."""
    lines = [f"{'group':<12}{'inputs':>8}{'runs':>7}{'tracebacks':>12}{'hangs':>7}{'silent':>8}{'unclear':>9}"
             f"{'pages lost':>12}{'raw markup':>12}   (inputs with each)"]
    total = collections.Counter()
    for group, c in sorted(figs.items()):
        if group == "settle":
            continue
        total.update(c)
        lines.append(_line(group, c))
    lines.append(_line("total", total))
    return "\n".join(lines)


def _line(group: str, c: collections.Counter) -> str:
    return (f"{group:<12}{c['inputs']:>8}{c['runs']:>7}{c['traceback']:>12}{c['hang']:>7}{c['silent']:>8}"
            f"{c['unclear']:>9}{c['lost']:>12}{c['markup']:>12}   "
            f"({' / '.join(str(c['inputs with ' + k]) for k in KINDS)})")


def failures(cases: list[dict], results: list[dict], limit: int = 40) -> list[str]:
    by_name = {c["name"]: c for c in cases}
    out = []
    for r in results:
        if r.get("settle"):
            continue
        j = judge(by_name[r["case"]], r)
        bad = [k for k, v in j.items() if v]
        if bad:
            tail = [ln for ln in r["stderr"].splitlines() if ln.strip()][-2:]
            env = {k: (v if len(v) < 40 else v[:37] + "...") for k, v in (r["env"] or {}).items()}
            out.append(f"{r['case'][:80]}: {' '.join(a[:60] for a in r['argv'])} {env or ''}: {','.join(bad)} "
                       f"(rc {r['rc']}) {' | '.join(tail)[:400]} {r['lost'][:3] if r['lost'] else ''}"
                       f"{r.get('markup', [])[:3] or ''}{r.get('changed') or ''}")
    return out[:limit]


# --------------------------------------------------------------------------- bytes

def b64(data: bytes | str) -> dict:
    return {"b64": base64.b64encode(data.encode("utf-8") if isinstance(data, str) else data).decode()}


OVER_LOG_LIMIT_MIB = 600  # a bomb past infile.LOG_LIMIT (512 MiB) unpacked: the door refuses it unread


@functools.lru_cache(maxsize=4)  # the same bomb for the log and the TensorBoard file: made once
def gzip_bomb(mib: int) -> bytes:
    """MIB MiB of zeros, gzipped (about a thousandth of that on disk): one gzip member whose deflate stream is one
    MiB's block, flushed to stand alone, MIB times over, then an empty last block (0.2 s for 600 MiB, where
    compressing them took 1.7 s)."""
    import struct
    import zlib
    chunk = bytes(1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip header and trailer are written here
    block = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)  # refers to nothing before it: it can be repeated
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(chunk, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, mtime 0, best compression, unknown OS
    return header + block * mib + z.flush() + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)


# --------------------------------------------------------------------------- run records

READER_COMMANDS = [
    ["tables"], ["check"], ["campaign", "@", {"DRY_RUN": "1", "GPUS": "1", "CHAPTER": "@chapter"}],
    ["campaign", "@", {"DRY_RUN": "1", "GPUS": "1", "STALE": "1"}], ["plan", "--validate"],
    ["compare", "outdir"], ["refresh", "@dir"], ["data-report"], ["bench-report"], ["integrity", "--check"],
]


def reader_commands(run_dir: str, chapter: int | None, *, limit: float = 60) -> list[dict]:
    """Every command that reads run records, for a damaged record in RUN_DIR (refresh reads that one)."""
    out = []
    for spec in READER_COMMANDS:
        argv = [a for a in spec if isinstance(a, str) and a != "@"]
        env = next((dict(a) for a in spec if isinstance(a, dict)), {})
        if "CHAPTER" in env:
            env["CHAPTER"] = str(chapter if chapter is not None else 1)
        argv = [run_dir if a == "@dir" else a for a in argv]
        out.append({"argv": argv, "env": env, "limit": limit})
    return out


def sources(root: Path = ROOT) -> list[Path]:
    """The records damaged copies are made of, in a fixed order: the newest record of the first target
    of each chapter (results/runs), and the newest of each other records folder (bench, data, integrity,
    holdout)."""
    newest: dict[str, tuple[str, Path]] = {}
    for p in sorted(root.glob("results/**/runs/*/run.json")):
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            continue
        folder = str(p.parent.parent.relative_to(root))
        chapter = (raw.get("config") or {}).get("chapter") if folder == "results/runs" else None
        if folder == "results/runs" and (str(raw.get("target", "")).startswith("profile-") or chapter is None):
            continue
        key = f"{folder} {chapter}"
        best = newest.get(key)
        if best is None or (str(raw.get("target")), str(raw.get("started"))) < (best[1].name.split("___")[-1], "") \
                or (raw.get("target") == best[1].name.split("___")[-1] and str(raw.get("started")) > best[0]):
            newest[key] = (str(raw.get("started")), p.parent)
    return [d for _, d in sorted(newest.values(), key=lambda x: str(x[1]))]


# Fields whose values are measurements or layout: negative (or zero, for the layout) is no record's
NONNEG = ("step_ms_median", "step_ms_p10", "step_ms_p90", "tflops_per_gpu", "mfu", "duration_s", "params_total",
          "mem_samples", "num_gpus", "gpu_memory_mib", "step_count", "iters_logged", "train_iters")
LAYOUT = ("gpus", "gbs", "mbs", "tp", "pp", "cp", "ep", "etp", "iters")


def _wrong_type(v: Any) -> Any:
    if isinstance(v, bool):
        return "yes"
    if isinstance(v, (int, float)):
        return "12abc"
    if isinstance(v, str):
        return 12
    if isinstance(v, list):
        return 5
    if isinstance(v, dict):
        return [1, 2]
    return {"a": 1}


def record_damages(raw: dict, rng: random.Random, whole_file: bool = True) -> list[tuple[str, Any, bool]]:
    """(name, damage, invalid) for one record's JSON: damage is bytes (the file), a dict (special file),
    or a dict of JSON (the record as changed). invalid: no reader may use it for a row."""
    out: list[tuple[str, Any, bool]] = []

    def changed(name: str, fn, invalid: bool):
        d = copy.deepcopy(raw)
        fn(d)
        out.append((name, d, invalid))

    keys = sorted(raw)
    for k in rng.sample(keys, min(3, len(keys))):
        changed(f"drop {k}", lambda d, k=k: d.pop(k), k in ("target", "status"))
    for k in ("target", "status"):
        changed(f"drop {k}", lambda d, k=k: d.pop(k, None), True)
    typed = [k for k in keys if raw[k] is not None and k not in ("refreshed", "busy_gpus", "fixture")]
    for k in rng.sample(typed, min(4, len(typed))):
        changed(f"wrong type {k}", lambda d, k=k: d.__setitem__(k, _wrong_type(d[k])), True)
    changed("notes a number", lambda d: d.__setitem__("notes", 5), True)
    nums = [k for k in keys if isinstance(raw[k], (int, float)) and not isinstance(raw[k], bool)]
    for k in rng.sample(nums, min(2, len(nums))):
        changed(f"nan {k}", lambda d, k=k: d.__setitem__(k, float("nan")), True)
        changed(f"inf {k}", lambda d, k=k: d.__setitem__(k, float("inf")), True)
    for k in rng.sample([k for k in NONNEG if isinstance(raw.get(k), (int, float)) and raw.get(k)], 2):
        changed(f"negative {k}", lambda d, k=k: d.__setitem__(k, -abs(d[k]) - 1), True)
    if isinstance(raw.get("mem_peak_gib"), list) and raw["mem_peak_gib"]:
        changed("negative mem_peak_gib", lambda d: d["mem_peak_gib"].__setitem__(0, -3.5), True)
        changed("text in mem_peak_gib", lambda d: d["mem_peak_gib"].__setitem__(0, "many"), True)
    cfg = raw.get("config") or {}
    for k in rng.sample([k for k in LAYOUT if isinstance(cfg.get(k), int)], 2):
        changed(f"config.{k} 0", lambda d, k=k: d["config"].__setitem__(k, 0), True)
        changed(f"config.{k} negative", lambda d, k=k: d["config"].__setitem__(k, -2), True)
    changed("huge step_ms_median", lambda d: d.__setitem__("step_ms_median", 1e300), False)
    changed("huge params_total", lambda d: d.__setitem__("params_total", 10 ** 30), False)
    changed("status unknown", lambda d: d.__setitem__("status", "exploded"), True)
    changed("target empty", lambda d: d.__setitem__("target", ""), True)
    changed("target a path", lambda d: d.__setitem__("target", "../../etc/passwd"), True)
    changed("target with newline", lambda d: d.__setitem__("target", "101\nmegalab: ok"), True)
    changed("schema newer", lambda d: d.__setitem__("schema", 99), True)
    changed("schema text", lambda d: d.__setitem__("schema", "2"), True)
    changed("started not a time", lambda d: d.__setitem__("started", "yesterday"), True)
    changed("files.log absolute", lambda d: d.setdefault("files", {}).__setitem__("log", "/dev/zero"), True)
    changed("files.log outside", lambda d: d.setdefault("files", {}).__setitem__("log", "../../../../etc/hostname"),
            True)
    changed("files.memory device", lambda d: d.setdefault("files", {}).__setitem__("memory", "/dev/zero"), True)
    # a launcher may write it (a log whose iterations carry no elapsed time): a row without its time, not a bad file
    changed("ok without a step time", lambda d: (d.__setitem__("status", "ok"), d.pop("step_ms_median", None)), False)
    changed("mem_peak_gib huge list", lambda d: d.__setitem__("mem_peak_gib", [1.0] * 100000), False)
    changed("megatron_mem_by_rank text rank", lambda d: d.__setitem__("megatron_mem_by_rank", {"x": {"a": 1}}), True)
    changed("config a list", lambda d: d.__setitem__("config", [1]), True)
    changed("intent.argv text", lambda d: d.__setitem__("intent", {"argv": "--x"}), True)
    if not whole_file:
        return out
    text = json.dumps(raw)
    for cut in sorted(rng.sample(range(1, len(text) - 1), 3)):
        out.append((f"truncated at {cut}", text[:cut].encode(), True))
    out += [("empty file", b"", True), ("whitespace", b"  \n", True), ("null", b"null", True),
            ("a list", b"[1, 2]", True), ("a string", b'"run"', True),
            ("binary garbage", bytes(rng.randrange(256) for _ in range(300)), True),
            ("not UTF-8", text.replace('"target"', '"t\u00e9rget"').encode("latin-1", "replace") + b"\xff", True),
            ("deeply nested", b"[" * 200000 + b"]" * 200000, True),
            ("NaN literal", text.replace('"target"', '"nanval": NaN, "target"', 1).encode(), False),
            ("directory run.json", {"special": "dir"}, True), ("fifo run.json", {"special": "fifo"}, True),
            ("symlink loop run.json", {"special": "loop"}, True),
            ("symlink to /dev/zero", {"special": "symlink", "to": "/dev/zero"}, True),
            ("sparse 64 MiB run.json", {"special": "sparse", "size": 64 << 20}, True)]
    return out


def record_cases(root: Path = ROOT, *, batch: bool = True, seed: int = SEED) -> list[dict]:
    """Damaged records, each in a run folder of its own beside its source (the newest of its target).
    batch: all of them in the tree at once (BATCH a case), read once by every reader, which must name each
    bad one it reads; else one case per damage (the issue's audit: slow)."""
    rng = random.Random(seed)
    srcs = sources(root)
    per_source = []
    for src in srcs:
        raw = json.loads((src / "run.json").read_text(encoding="utf-8"))
        raw["started"] = newest(srcs)
        per_source.append((src, raw, record_damages(raw, rng, whole_file=len(per_source) < 2)))
    damages = []  # (src, raw, name, damage, invalid), round-robin over the sources
    depth = max(len(d) for _, _, d in per_source)
    for i in range(depth):
        for src, raw, dmg in per_source:
            if i < len(dmg):
                damages.append((src, raw) + dmg[i])
    cases, used, pending = [], collections.Counter(), []
    for src, raw, name, damage, invalid in damages:
        rel_parent = str(src.parent.relative_to(root))
        n = used[str(src)]
        used[str(src)] += 1
        folder = f"{rel_parent}/29990101_{n:06d}___{raw.get('target')}"
        item = {"name": f"record {src.name}: {name}", "folder": folder, "source": str(src.relative_to(root)),
                "damage": damage, "invalid": invalid, "chapter": (raw.get("config") or {}).get("chapter")}
        if not batch:
            cases.append(_record_case(item["name"], [item]))
            continue
        pending.append(item)
        if len(pending) == BATCH:
            cases.append(_record_case(f"records batch {len(cases)}", pending))
            pending = []
    for item in cross_items(root, srcs):  # issue 60: valid records a reader must not take
        if batch:
            pending.append(item)
        else:
            cases.append(_record_case(item["name"], [item]))
    if pending:
        cases.append(_record_case(f"records batch {len(cases)}", pending))
    return cases


BATCH = 1000  # damaged records read at once by each reader (each names every bad one it reads)


# The records folders each reader reads besides results/runs' (None: every folder under results/, as
# records.mark_shared does for the pages).
READS = {"campaign": ("results/runs",), "plan": ("results/runs", "results/bench/runs", "results/holdout/runs"),
         "integrity": ("results/integrity/runs", "results/runs"), "refresh": ()}


def _record_case(name: str, items: list[dict]) -> dict:
    """One state of the tree with ITEMS' damaged records in it, read by every reader: each reader that reads
    a bad record's folder names it in its skip line; refresh of a bad record is refused, naming it."""
    files: dict[str, dict] = {}
    for it in items:
        files[it["folder"]] = {"copy": it["source"], "without": ["tensorboard", "torch_profile"]}
        dmg = it["damage"]
        if isinstance(dmg, (bytes, bytearray)):
            files[f"{it['folder']}/run.json"] = b64(dmg)
        elif isinstance(dmg, dict) and "special" in dmg:
            files[f"{it['folder']}/run.json"] = dmg
        else:
            files[f"{it['folder']}/run.json"] = b64(json.dumps(dmg, indent=2))
    first = items[0]
    commands = [c for c in reader_commands(first["folder"], first["chapter"]) if c["argv"][0] != "refresh"]
    for c in commands:
        reads = READS.get(c["argv"][0])
        c["expect"] = "skip"
        c["mentions"] = [Path(it["folder"]).name for it in items if it["invalid"]
                         and (reads is None or str(Path(it["folder"]).parent) in reads)]
    for it in items:  # refresh reads the one folder it is given
        c = {"argv": ["refresh", it["folder"]], "env": {}, "pages": False}
        if it["invalid"]:
            c.update(expect="refuse", mentions=[Path(it["folder"]).name])
        commands.append(c)
    return {"name": name, "group": "records", "files": files, "commands": commands,
            "inputs": [it["name"] for it in items]}


def merged(cases: list[dict], name: str, group: str) -> dict:
    """One state of the tree holding every case's damage (each in a folder of its own), read once by every
    reader: a record's damage and a log's beside another record never meet."""
    out = {"name": name, "group": group, "files": {}, "commands": [], "inputs": []}
    seen: dict[str, dict] = {}
    for c in cases:
        out["files"].update(c["files"])
        out["inputs"] += c.get("inputs", [c["name"]])
        for cmd in c["commands"]:
            key = json.dumps([cmd["argv"], cmd.get("env", {})])
            if cmd["argv"][0] == "refresh" or key not in seen:
                seen[key] = dict(cmd, mentions=list(cmd.get("mentions", [])))
                out["commands"].append(seen[key])
            else:
                seen[key]["mentions"] += cmd.get("mentions", [])
    return out


# --------------------------------------------------------------------------- logs, memory CSVs, TensorBoard files beside a record

def beside_cases(root: Path = ROOT, *, batch: bool = True) -> list[dict]:
    """A valid record whose raw log, memory CSV or TensorBoard file is damaged: read with a line, never
    a traceback, a hang or 4 GB of memory."""
    srcs = sources(root)
    pick = {}
    for s in srcs:  # one source per records folder that has a log and TensorBoard files
        key = str(s.parent.relative_to(root))
        if key not in pick and (s / "logs.txt.gz").exists():
            pick[key] = s
    damages = [("logs.txt.gz", "gzip bomb", b64(gzip_bomb(OVER_LOG_LIMIT_MIB))), ("logs.txt.gz", "truncated gzip", None),
               ("logs.txt.gz", "not gzip", b64(b"\x1f\x8bjunk" * 50)), ("logs.txt.gz", "fifo", {"special": "fifo"}),
               ("logs.txt.gz", "directory", {"special": "dir"}),
               ("logs.txt", "device", {"special": "symlink", "to": "/dev/zero"}),
               ("gpu_memory.csv", "text cells", b64("t,gpu,mem_used_mib\nx,zero,many\n")),
               ("gpu_memory.csv", "fifo", {"special": "fifo"}),
               ("gpu_memory.csv", "clock cells", b64(",".join(("t_s", "gpu", "mem_used_mib", "util_pct", "sm_mhz",
                                                               "power_w", "held_by")) + "\n0,0,1000,100,fast,hot,x\n")),
               ("tensorboard/events.out.tfevents.1.gz", "gzip bomb", b64(gzip_bomb(OVER_LOG_LIMIT_MIB))),
               ("tensorboard/events.out.tfevents.2", "fifo", {"special": "fifo"}),
               ("tensorboard/events.out.tfevents.3", "garbage", b64(b"\x00\x01garbage" * 100))]
    cases = []
    for folder_rel, src in sorted(pick.items()):
        raw = json.loads((src / "run.json").read_text(encoding="utf-8"))
        raw["started"] = newest(srcs)
        for i, (name, what, dmg) in enumerate(damages):
            folder = f"{folder_rel}/29990102_{i:06d}___{raw.get('target')}"
            files = {folder: {"copy": str(src.relative_to(root))}, f"{folder}/run.json": b64(json.dumps(raw))}
            if dmg is None:
                dmg = b64((src / "logs.txt.gz").read_bytes()[:200])
            if name == "logs.txt":
                files[f"{folder}/logs.txt.gz"] = {"special": "delete"}
            files[f"{folder}/{name}"] = dmg
            commands = reader_commands(folder, raw.get("config", {}).get("chapter"), limit=30)
            if name == "gpu_memory.csv":  # the clocks' reader reads this file alone
                commands.append({"argv": ["bench", "clocks", folder], "env": {}, "limit": 30})
            cases.append({"name": f"beside {folder_rel}: {name} {what}", "group": "beside", "files": files,
                          "commands": commands, "expect": "any"})
    return cases if not batch else [merged(cases, "beside: every damage at once", "beside")]


# --------------------------------------------------------------------------- YAML configs

def yaml_damages(text: str, rng: random.Random, edits: list[tuple[str, str, str, bool]]) -> list[tuple[str, str | bytes, bool]]:
    """(name, new content, invalid): generic damage to a YAML file, then EDITS (name, old, new, invalid):
    the first `old` in the text replaced by `new`."""
    lines = text.splitlines(keepends=True)
    out: list[tuple[str, str | bytes, bool]] = [
        ("empty file", "", True), ("only a comment", "# nothing\n", True), ("a list", "- 1\n- 2\n", True),
        ("a scalar", "hello\n", True), ("binary garbage", bytes(rng.randrange(256) for _ in range(200)), True),
        ("not UTF-8", text.encode("utf-8") + b"\n# \xff\xfe\n", True),
        ("unbalanced bracket", _in_code(lines, "{", "{["), True), ("tab indentation", _in_code(lines, "  ", "\t", start=True), True),
        ("billion laughs", 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
         'c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n'
         'f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n', True),
        ("python tag", "!!python/object/apply:os.system ['true']\n", True),
    ]
    for cut in sorted(rng.sample(range(1, len(lines)), min(2, len(lines) - 1))):
        out.append((f"cut after line {cut}", "".join(lines[:cut]), None))  # may parse: the reader decides
    for name, old, new, invalid in edits:
        if old in text:
            out.append((name, text.replace(old, new, 1), invalid))
    return out


def _in_code(lines: list[str], old: str, new: str, start: bool = False) -> str:
    """The text with OLD replaced by NEW in the first line that holds it outside a comment (start: that
    begins with it)."""
    for i, ln in enumerate(lines):
        code = ln.split("#", 1)[0]
        if (code.startswith(old) and code.strip()) if start else old in code:
            return "".join(lines[:i] + [ln.replace(old, new, 1)] + lines[i + 1:])
    return "".join(lines) + new


def chapter_edits(text: str) -> list[tuple[str, str, str, bool]]:
    """Edits of a chapter file's first entry and header (see catalog_cases)."""
    import re
    m = re.search(r"- \{id: ([^,]+),", text)
    first_id = m.group(1) if m else "x"
    e = [("chapter a word", "\nchapter: ", "\nchapter: one #", True), ("title a list", "\ntitle: ", "\ntitle: [a] #", True),
         ("unknown file key", "\nchapter: ", "\ncolour: red\nchapter: ", True),
         ("table outside results", "\ntable: ", "\ntable: ../../etc/x.md #", True),
         ("table absolute", "\ntable: ", "\ntable: /proc/megalab-fuzz.md #", True),  # unwritable: code that
         # took it would fail there, not write outside
         ("reference unknown", "\ntable: ", "\nreference: bogus\ntable: ", True),
         ("tutorial outside", "\ntable: ", "\ntutorial: ../../x.md\ntable: ", True),
         ("defaults unknown key", "defaults: {", "defaults: {colour: red, ", True),
         ("defaults mbs 0", "defaults: {", "defaults: {mbs: 0, ", True),
         ("entry unknown key", "- {id: ", "- {colour: red, id: ", True),
         ("id with a space", f"id: {first_id},", f"id: '{first_id} x',", True),
         ("id empty", f"id: {first_id},", "id: '',", True),
         ("id an option", f"id: {first_id},", "id: '-rf',", True),
         ("duplicate id in file", "experiments:\n", f"experiments:\n  - {{id: {first_id}, gpus: 1, gbs: 1, about: dup}}\n",
          True),
         ("entry removed", f"  - {{id: {first_id},", f"  - {{id: {first_id}-renamed,", False)]
    for field, values in (("gpus", ("0", "-1", '"2"', "2.5", "true", "1000000000000")),
                          ("gbs", ("0", "-8", "7", "1e3", "null")), ("mbs", ("0", "-1", '"1"'))):
        for v in values:
            e.append((f"{field}: {v}", f"id: {first_id},", f"id: {first_id}, {field}: {v},", v != "1000000000000"))
    for field, v in (("tp", "0"), ("tp", "3"), ("pp", "0"), ("pp", "7"), ("cp", "0"), ("ep", "0"), ("etp", "-1"),
                     ("num_experts", "0"), ("topk", "0"), ("layers_per_virtual_stage", "0"), ("timing_log_level", "5"),
                     ("recompute", "sometimes"), ("cp_comm", "carrier-pigeon"), ("sp", '"yes"'), ("zero2", "2"),
                     ("model", "no-such-model"), ("model", "7"), ("extra_args", '"--foo"'), ("extra_args", "[1, 2]"),
                     ("ref", "5"), ("about", "[1]")):
        e.append((f"{field}: {v}", f"id: {first_id},", f"id: {first_id}, {field}: {v},", True))
    return e


def catalog_cases(root: Path = ROOT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 1)
    cases = []
    files = sorted((root / "configs" / "experiments").glob("*.yaml"))
    for path in [files[1], files[-1]]:  # chapter 1 (anchor reference) and the last (no reference)
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        for name, content, invalid in yaml_damages(text, rng, chapter_edits(text)):
            cases.append(_config_case("catalog", f"{rel}: {name}", {rel: b64(content)}, invalid, CATALOG_READERS))
    first = files[1]
    text = first.read_text(encoding="utf-8")
    cases.append(_config_case("catalog", "second file reuses chapter 1",
                              {"configs/experiments/99-dup.yaml": b64(text.replace("101-", "991-").replace(
                                  "104-", "994-").replace("11", "99"))}, True, CATALOG_READERS))
    import re
    other = files[2].read_text(encoding="utf-8")
    dup = re.search(r"- \{id: ([^,]+),", text).group(1)
    cases.append(_config_case("catalog", "id of chapter 1 in chapter 2's file",
                              {str(files[2].relative_to(root)): b64(other.replace("experiments:\n", f"experiments:\n  - {{id: {dup}, gpus: 1, gbs: 1, about: dup}}\n", 1))},
                              True, CATALOG_READERS))
    ref = re.search(r"ref: (R\d+)", text).group(0)  # a published row the reference does not have
    refs = _config_case("catalog", "ref naming no published row", {str(first.relative_to(root)): b64(
        text.replace(ref, "ref: R999", 1))}, False, CATALOG_READERS)
    for c in refs["commands"]:
        c["expect"] = "refuse" if c["argv"][0] == "tables" else "any"
    cases.append(refs)
    cases.append(_config_case("catalog", "chapter file removed", {str(files[1].relative_to(root)): {"special": "delete"}},
                              False, CATALOG_READERS))
    cases.append(_config_case("catalog", "chapter file a directory", {"configs/experiments/98-dir.yaml": {"special": "dir"}},
                              True, CATALOG_READERS))
    cases.append(_config_case("catalog", "chapter file a fifo", {"configs/experiments/98-fifo.yaml": {"special": "fifo"}},
                              True, CATALOG_READERS))
    return cases


CATALOG_READERS = [["list"], ["targets"], ["plan", "101"], ["run", "101", "@", {"DRY_RUN": "1"}], ["tables"], ["check"],
                   ["bench-report"]]


def _commands(specs: list[list], limit: float = 60) -> list[dict]:
    out = []
    for spec in specs:
        argv = [a for a in spec if isinstance(a, str) and a != "@"]
        env = next((dict(a) for a in spec if isinstance(a, dict)), {})
        out.append({"argv": argv, "env": env, "limit": limit})
    return out


def _config_case(group: str, name: str, files: dict, invalid: bool | None, readers: list[list]) -> dict:
    return {"name": name, "group": group, "files": files, "commands": _commands(readers),
            "expect": "refuse" if invalid else "any"}


def models_edits(text: str) -> list[tuple[str, str, str, bool]]:
    e = [("unknown key", "  num_layers: 48\n", "  num_layers: 48\n  colour: red\n", True),
         ("preset a list", "gpt2-xl:\n", "gpt2-xl: [1]\nunused:\n", True),
         ("duplicate preset", "gpt2-xl:\n", "gpt2-xl: {}\ngpt2-xl:\n", True)]
    for field, values in (("num_layers", ("0", "-48", '"48"', "48.5", "1e9")),
                          ("hidden_size", ("0", "-1", "1601")), ("num_attention_heads", ("0", "-25", "7")),
                          ("seq_length", ("0", "-1")), ("vocab_size", ("0", "-1")), ("max_position_embeddings", ("0",))):
        for v in values:
            e.append((f"{field}: {v}", f"  {field}: ", f"  {field}: {v} #", v not in ("1e9",)))
    e += [("normalization bogus", "  num_layers: 48\n", "  num_layers: 48\n  normalization: BatchNorm\n", True),
          ("rotary_base 0", "  num_layers: 48\n", "  num_layers: 48\n  rotary_base: 0\n", True),
          ("num_query_groups 0", "  num_layers: 48\n", "  num_layers: 48\n  num_query_groups: 0\n", True),
          ("num_query_groups 7", "  num_layers: 48\n", "  num_layers: 48\n  num_query_groups: 7\n", True),
          ("ffn_hidden_size -1", "  num_layers: 48\n", "  num_layers: 48\n  ffn_hidden_size: -1\n", True),
          ("moe_router_topk 0", "  num_layers: 48\n", "  num_layers: 48\n  moe_router_topk: 0\n", True)]
    return e


def models_cases(root: Path = ROOT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 2)
    rel = "configs/models.yaml"
    text = (root / rel).read_text(encoding="utf-8")
    return [_config_case("models", f"{rel}: {name}", {rel: b64(content)}, invalid, CATALOG_READERS)
            for name, content, invalid in yaml_damages(text, rng, models_edits(text))]


def checks_cases(root: Path = ROOT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 3)
    rel = "configs/checks.yaml"
    text = (root / rel).read_text(encoding="utf-8")
    edits = [("claims a mapping", "\nclaims:\n", "\nclaims: {a: 1}\nx:\n", True),
             ("unknown claim key", "  - id: ", "  - colour: red\n    id: ", True),
             ("duplicate claim id", "  - id: ch0-dp-step-flat\n", "  - id: ch0-dp-step-flat\n", None),
             ("metric kind bogus", "metric: {kind: ratio", "metric: {kind: bogus", True),
             ("expect text", "\n    expect: ", "\n    expect: whatever #", True),
             ("expect nan", "\n    expect: ", "\n    expect: {between: [.nan, 1]} #", True),
             ("between reversed", "\n    expect: ", "\n    expect: {between: [2, 1]} #", True),
             ("reads unknown target", "reads: [", "reads: [999-nope, ", True),
             ("tolerance negative", "metric: {kind: ratio", "metric: {tolerance: -1, kind: ratio", True),
             ("gpu index huge", "metric: {kind: ratio", "metric: {gpu: 99, kind: ratio", None),
             ("field unknown", "metric: {kind: ratio", "metric: {field: no_such_field, kind: ratio", True)]
    return [_config_case("checks", f"{rel}: {name}", {rel: b64(content)}, invalid, [["check"]])
            for name, content, invalid in yaml_damages(text, rng, edits)]


def bench_cases(root: Path = ROOT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 4)
    rel = "configs/bench.yaml"
    text = (root / rel).read_text(encoding="utf-8")
    edits = [("iters 0", "\niters: 15", "\niters: 0", True), ("iters text", "\niters: 15", "\niters: many", True),
             ("no levers", "\nlevers:\n", "\nlevers_gone:\n", True),
             ("case unknown target", "target: 101-gpt2xl-dp1-gbs1-bf16, ref: R1}", "target: 999-nope, ref: R1}", True),
             ("case unknown ref", "ref: R1}", "ref: R999}", True),
             ("case gbs 0", "gbs: 4}", "gbs: 0}", True),
             ("case gbs text", "gbs: 4}", "gbs: four}", True),
             ("spec unknown lever", "levers: [fused_adam, foreach_norm, foreach_scale, cuda_graph]}",
              "levers: [fused_adam, warp_drive]}", True),
             ("ablation unknown case", 'cases: ["row 101, GBS 1"', 'cases: ["row 999"', True),
             ("search up_to text", "up_to: 24", "up_to: lots", True),
             ("unknown top key", "\niters: 15", "\ncolour: red\niters: 15", True)]
    return [_config_case("bench", f"{rel}: {name}", {rel: b64(content)}, invalid, [["bench-report"]])
            for name, content, invalid in yaml_damages(text, rng, edits)]


# --------------------------------------------------------------------------- reference CSVs

def csv_damages(text: str, rng: random.Random, key: str, numeric: list[str]) -> list[tuple[str, str | bytes, bool]]:
    lines = text.splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    out: list[tuple[str, str | bytes, bool]] = [
        ("empty file", "", True), ("header only", lines[0], True), ("binary garbage", bytes(rng.randrange(256) for _ in range(300)), True),
        ("not UTF-8", text.encode() + b"\xff\xfe\n", True), ("semicolons", text.replace(",", ";"), True),
        ("BOM", "\ufeff" + text, None), ("a fifo", None, True)]
    for cut in sorted(rng.sample(range(len(lines[0]) + 5, len(text) - 2), 3)):
        out.append((f"truncated at byte {cut}", text[:cut], True))
    out.append(("last rows gone", "".join(lines[: len(lines) // 2]), None))
    for col in [key] + rng.sample([h for h in header if h != key], 2):
        i = header.index(col)
        out.append((f"column {col} missing", "".join(",".join(c for j, c in enumerate(ln.rstrip("\n").split(",")) if j != i) + "\n"
                                                   if ln.count(",") == len(header) - 1 else ln for ln in lines), True))
    out.append(("duplicate row", text + lines[1], True))
    for col in numeric:
        i = header.index(col)
        row = 1 + rng.randrange(len(lines) - 1)
        for bad in ("lots", "nan", "inf", "-5", "1e999"):
            cells = lines[row].rstrip("\n").split(",")
            if len(cells) != len(header):
                continue
            cells[i] = bad
            new = lines[:row] + [",".join(cells) + "\n"] + lines[row + 1:]
            out.append((f"{col} {bad} in row {row}", "".join(new), True))
    return out


def reference_cases(root: Path = ROOT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 5)
    cases = []
    for name, key, numeric in (("anchor_8xh100.csv", "row", ["step_ms", "mem_gb_per_gpu", "chapter"]),
                               ("twogpu_2xh200.csv", "row", ["step_ms", "mem_mib_gpu0", "mem_mib_gpu1"])):
        rel = f"configs/reference/{name}"
        text = (root / rel).read_text(encoding="utf-8")
        for what, content, invalid in csv_damages(text, rng, key, numeric):
            files = {rel: {"special": "fifo"} if content is None else b64(content)}
            cases.append(_config_case("reference", f"{rel}: {what}", files, invalid,
                                      [["tables"], ["bench-report"], ["plots"]]))
    return cases


# --------------------------------------------------------------------------- make variables

def variable_values(var) -> list[tuple[str, bool | None]]:
    """(value, invalid) for one make variable, by its type and range: invalid (True) is refused by every
    command that parses the variables (`plan` parses them all, as `make <target>` does); None: odd, but
    the variable's own (a long or non-ASCII text)."""
    t = var.type
    if t == "int" and var.maximum is not None:  # just past its bound (issue 60: sane bounds)
        vals = [(f"{int(var.maximum) + 1}", True)]
    else:
        vals = []
    if t == "int":
        vals += [("abc", True), ("1.5", True), ("nan", True), ("", False),
                ("99999999999999999999999", True if var.maximum is not None else None),
                ("-5", var.minimum is not None and var.minimum > -5), ("0", var.minimum is not None and var.minimum > 0),
                ("0x10", True), ("1\n2", True)]
    elif t == "float":
        vals = [("abc", True), ("nan", True), ("inf", True), ("-inf", True), ("1e999", True),
                ("-1", bool(var.positive or var.minimum is not None)), ("0", bool(var.positive)), ("1e-300", None),
                ("1e300", True if var.maximum is not None else None)]
    elif t == "flag":
        vals = [("maybe", True), ("2", True), ("-1", True), ("yes", False)]
    elif t == "choice":
        vals = [("bogus", True), (var.choices[0].upper() + "x", True), (" " + var.choices[0], True)]
    elif t == "words":
        vals = [("'unbalanced", True), ('"also', True)]
    elif t == "size":  # docker's sizes (issue 60: DOCKER_SHM=abc went to docker as it was)
        vals = [("abc", True), ("0", True), ("2t", True), ("16g; rm -rf x", True), ("-1g", True), ("1e3g", True),
                ("512m", False), ("16 GiB", False)]
    else:
        vals = [("x" * 5000, None), ("\u00e9\u4e2d\U0001f4a5", None)]
    return vals


# Text variables with a meaning, values that break it, and the command that reads it (refused there, in
# one line naming the variable or the value).
SPECIFIC = {
    "GPU": (("h900", "80"), [["plan", "101"]]), "FAST": (("warp_drive", "all,bogus"), [["plan", "101"]]),
    "LOAD": (("/nonexistent/ckpt",), [["run", "101", {"DRY_RUN": "1"}]]),
    "OUTDIR": (("/dev/null",), [["run", "101", {"DRY_RUN": "1"}]]),
    "SPLIT": (("a,b,c", "1,,2"), [["plan", "101"]]), "MASTER_ADDR": (("bad host", "-x"), [["plan", "101"]]),
    "IDS": (("999-nope", "999-nope 998-nope"), [["campaign", {"DRY_RUN": "1", "GPUS": "1"}], ["batch", {"DRY_RUN": "1"}]]),
    "SBATCH_ARGS": (("'unbalanced",), [["slurm", "101", {"DRY_RUN": "1"}]]),
    "SRUN_ARGS": (("'unbalanced",), [["slurm", "101", {"DRY_RUN": "1"}]]),
    "DOCKER_ARGS": (("'unbalanced",), [["docker-run", "--print"]]),
    "DOCKER_CMD": (("'unbalanced",), [["docker-run", "--print"]]),
    "ID": (("999-nope",), [["show-command", "@"]]), "GREP": (("[unclosed",), [["arguments", "@"]]),
    "BENCH_ARGS": (("--parts bogus", "--budget-s x"), [["bench", "run", "@words"]]),
    # issue 60: EXTRA_ARGS' layout and model flags out of range (--micro-batch-size 0 was a ZeroDivisionError)
    "EXTRA_ARGS": (("--micro-batch-size 0", "--global-batch-size -4", "--tensor-model-parallel-size 0",
                    "--pipeline-model-parallel-size=-1", "--context-parallel-size 0", "--num-layers 0",
                    "--num-attention-heads 0", "--hidden-size -1600", "--seq-length 0", "--num-query-groups 0",
                    "--vocab-size 0", "--normalization BatchNorm", "--micro-batch-size 99999999999999999999"),
                   [["plan", "101"]]),
}

# The command each variable's group reaches, besides `plan 101`, which reads them all as `make <target>`
# does (Options.from_env: every variable of the table, typed, before anything is planned; a dry run would
# go on to Megatron's own argument check, seconds a call, and tests/test_plan.py proves make's path).
GROUP_COMMANDS = {
    "slurm": [["slurm", "101", {"DRY_RUN": "1"}]],
    "docker": [["docker-run", "--print"]],
    "campaign": [["campaign", {"DRY_RUN": "1", "GPUS": "1", "CHAPTER": "1"}]],
    "pages": [["tables"], ["check"]],
}
OWN_COMMANDS = {"FORCE": [["tables"]], "ID": [["show-command", "@"]]}
NOT_RUN_HERE = {"PY"}  # the one hook: a command by design


def _variable_command(spec: list, name: str, value: str, expect: str) -> dict:
    import shlex
    argv = []
    for a in spec:
        if a == "@words":
            try:
                argv += shlex.split(value)
            except ValueError:
                argv.append(value)
        elif a == "@":
            argv.append(value)
        elif isinstance(a, str):
            argv.append(a)
    env = {**next((dict(a) for a in spec if isinstance(a, dict)), {}), name: value}
    words = [w for w in value.replace("'", " ").replace('"', " ").split() if len(w) > 2]
    return {"argv": argv, "env": env, "limit": 60, "pages": argv[0] in ("tables", "check"), "expect": expect,
            "any_of": [name, value, *words]}


def variable_cases() -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from megalab.core import variables
    cases = []
    for var in variables.VARIABLES:
        if var.name in NOT_RUN_HERE:
            continue
        readers = [["plan", "101"]] + GROUP_COMMANDS.get(var.group, []) + OWN_COMMANDS.get(var.name, [])
        for value, invalid in variable_values(var):
            commands = [_variable_command(spec, var.name, value, "refuse" if invalid else "any") for spec in readers]
            cases.append({"name": f"{var.name}={value[:20]!r}", "group": "variables", "commands": commands})
        values, own = SPECIFIC.get(var.name, ((), []))
        for value in values:
            commands = [_variable_command(spec, var.name, value, "any") for spec in readers if spec not in own]
            commands += [_variable_command(spec, var.name, value, "refuse") for spec in own]
            cases.append({"name": f"{var.name}={value[:20]!r}", "group": "variables", "commands": commands})
    return cases


# --------------------------------------------------------------------------- the pages and committed files the page writers read

def pages_cases(root: Path = ROOT) -> list[dict]:
    """What is where a page goes (a FIFO, a directory, garbage, half a CSV) and the committed files beside
    the pages (tutorials, the bench's and integrity's texts): read or replaced by every page writer, never
    hung on, never a traceback."""
    readers = _commands([["tables"], ["check"], ["plan", "--validate"], ["bench-report"], ["data-report"],
                         ["integrity"], ["plots"]])
    fifo, folder, garbage = {"special": "fifo"}, {"special": "dir"}, b64(bytes(range(256)) * 4)
    csv_text = (root / "results" / "01-dp-zero2.csv").read_text(encoding="utf-8")
    damages = [("results/01-dp-zero2.csv", "fifo", fifo), ("results/01-dp-zero2.csv", "directory", folder),
               ("results/01-dp-zero2.csv", "garbage", garbage), ("results/01-dp-zero2.csv", "half", b64(csv_text[:700])),
               ("results/01-dp-zero2.csv", "empty", b64("")), ("results/01-dp-zero2.md", "fifo", fifo),
               ("results/01-dp-zero2.md", "directory", folder), ("results/README.md", "fifo", fifo),
               ("results/checks.md", "fifo", fifo), ("results/estimate-vs-measured.md", "directory", folder),
               ("results/plots/01-dp-zero2-memory.svg", "directory", folder),
               ("tutorials/01-dp-zero2.md", "fifo", fifo), ("tutorials/01-dp-zero2.md", "not UTF-8", garbage),
               ("tutorials/99-new.md", "an embed of no chapter",
                b64("<!-- megalab:table chapter=99 -->\nx\n<!-- /megalab:table -->\n")),
               ("results/bench/cp-ring-microbench.txt", "fifo", fifo), ("results/bench/matmul.json", "garbage", garbage),
               ("results/bench/matmul.json", "fifo", fifo), ("results/integrity/kill-transcript.txt", "fifo", fifo),
               ("results/data/README.md", "fifo", fifo), ("results/integrity/README.md", "directory", folder)]
    return [{"name": f"{rel}: {what}", "group": "pages", "files": {rel: dmg}, "commands": readers, "expect": "any"}
            for rel, what, dmg in damages]


# --------------------------------------------------------------------------- issue 60: what pages quote, records made worse

# Hostile texts, each holding its family's TOKEN: tags, comments (our own markers among them), pipes after
# backslashes, line breaks of every kind (TOKEN+A before one, TOKEN+B after), controls, a link. A page must quote
# them all escaped: no raw tag or comment on a line of a token, no B without its A, no table row of another width.
HOSTILE = ["<script>alert('{t}')</script>|{t}|", "{t}A\n| --- |\n{t}B | x", "<img src=x onerror=alert(1)> {t} \\| {t} \\\\| e",
           "<!--{t}--> <!-- q 101 | our ms -->6<!-- /q --> <!-- /megalab:table -->", "{t}A\r\n<{t}-tag a=1>\u2028{t}B\x85",
           "[{t}](javascript:alert(1)) `{t}` <a href=x>{t}</a>", "{t}A\x00\x1b[31m\x0b{t}B\tend", "</td></tr></table><{t}>|"]
ONE_LINE = [h for h in HOSTILE if not any(c in h for c in "\n\r\x00\x0b\x85\u2028")]  # a CSV cell's or a YAML key's
FAMILIES = {"rec": "records", "cat": "catalog titles and abouts", "mod": "model presets' abouts", "chk": "checks.yaml",
            "ref": "reference CSVs' notes", "bch": "bench.yaml", "fil": "bench files (matmul, trace summaries, CP)"}
QUOTED = {"mlxrec", "mlxcat", "mlxchk", "mlxref", "mlxbch", "mlxfil"}  # the families some page quotes (mod: none)
# Fields a record keeps typed (a hostile text there is a record skipped, never quoted): left as they are
TYPED = {"target", "status", "started", "ended", "schema", "files", "fixture", "megalab_commit", "gpu_mem_gb", "chapter"}


def hostile(token: str, i: int, pool: list[str] = HOSTILE) -> str:
    return pool[i % len(pool)].format(t=token)


def _hostile_record(raw: Any, token: str, n: list[int]) -> Any:
    """RAW with every text (and the keys of its measured mappings) hostile, the typed fields as they were."""
    if isinstance(raw, dict):
        out = {}
        for k, v in raw.items():
            n[0] += 1
            out[k] = v if k in TYPED else _hostile_record(v, token, n)
        for k in ("megatron_mem", "timers_ms", "theoretical_mem_mb"):
            if isinstance(out.get(k), dict):
                out[k][hostile(token, n[0], ONE_LINE)] = 1.0
        return out
    if isinstance(raw, list):
        return [_hostile_record(v, token, n) for v in raw]
    if isinstance(raw, str):
        n[0] += 1
        return hostile(token, n[0])
    return raw


def _yaml_hostile(text: str, token: str, fields) -> str:
    import yaml

    doc = yaml.safe_load(text)
    n = [0]

    def h() -> str:
        n[0] += 1
        return hostile(token, n[0])

    fields(doc, h)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False)


def markup_cases(root: Path = ROOT) -> list[dict]:
    """Every text a page quotes made hostile at once, a token for each family (FAMILIES): the records' every text
    (copies of the sources, the newest of their targets), the catalog's titles and abouts, the presets' abouts,
    checks.yaml's claims, sources and notes, the reference CSVs' notes, bench.yaml's abouts and the bench's files.
    Every page writer then runs; none may quote one raw (fuzz_driver.markup) or crash."""
    import csv as csvmod

    files: dict[str, dict] = {}
    srcs = sources(root)
    for i, src in enumerate(srcs):
        raw = json.loads((src / "run.json").read_text(encoding="utf-8"))
        rec = {**_hostile_record(raw, "mlxrec", [i]), "started": newest(srcs)}
        folder = f"{src.parent.relative_to(root)}/29990103_{i:06d}___{raw.get('target')}"
        files[folder] = {"copy": str(src.relative_to(root)), "without": ["tensorboard", "torch_profile"]}
        files[f"{folder}/run.json"] = b64(json.dumps(rec, indent=1))
    for path in sorted((root / "configs" / "experiments").glob("*.yaml")):
        def chapter(doc, h):
            doc["title"] = h()
            for e in doc["experiments"]:
                e["about"] = h()
        files[str(path.relative_to(root))] = b64(_yaml_hostile(path.read_text(encoding="utf-8"), "mlxcat", chapter))

    def presets(doc, h):
        for preset in doc.values():
            preset["about"] = h()

    def claims(doc, h):
        for c in doc["claims"]:
            c["claim"], c["source"] = h(), h()
            if isinstance(c.get("published"), dict):
                c["published"].update(source=h(), note=h())
            if isinstance(c.get("differs"), dict):
                c["differs"] = {k: h() for k in c["differs"]}

    def bench(doc, h):
        for lever in doc["levers"].values():
            lever["about"] = h()
    for rel, token, fields in (("configs/models.yaml", "mlxmod", presets), ("configs/checks.yaml", "mlxchk", claims),
                               ("configs/bench.yaml", "mlxbch", bench)):
        files[rel] = b64(_yaml_hostile((root / rel).read_text(encoding="utf-8"), token, fields))
    for name in ("anchor_8xh100.csv", "twogpu_2xh200.csv"):
        rel = f"configs/reference/{name}"
        rows = list(csvmod.DictReader(io.StringIO((root / rel).read_text(encoding="utf-8"))))
        for i, row in enumerate(rows):
            row["notes"] = " ".join(x for x in (row["notes"], hostile("mlxref", i, ONE_LINE)) if x)  # what it said kept
        out = io.StringIO()
        w = csvmod.DictWriter(out, list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        files[rel] = b64(out.getvalue())
    extra = "".join(f"| {hostile('mlxfil', i, ONE_LINE)} | 1 | 2 | 3 |\n" for i in range(len(ONE_LINE)))  # a file: its
    # lines are its own, so its hostile texts are one line each
    for src in srcs:
        summary = src / "trace-summary.md"
        if summary.exists():
            files[str(summary.relative_to(root))] = b64(summary.read_text(encoding="utf-8") + extra
                                                        + hostile("mlxfil", 1, ONE_LINE) + "\n")
    cp = root / "results" / "bench" / "cp-ring-microbench.txt"
    files[str(cp.relative_to(root))] = b64(cp.read_text(encoding="utf-8") + "\n".join(ONE_LINE).format(t="mlxfil")
                                           + "\n| a | b |\n--- | ---\n")
    mm = json.loads((root / "results" / "bench" / "matmul.json").read_text(encoding="utf-8"))
    files["results/bench/matmul.json"] = b64(json.dumps({**mm, "gpu_name": hostile("mlxfil", 0)}))
    commands = _commands([["tables"], ["check"], ["plan", "--validate"], ["bench-report"], ["integrity"]])
    return [{"name": "hostile text in every field a page quotes", "group": "markup", "files": files,
             "commands": commands, "expect": "any", "markup": [f"mlx{k}" for k in FAMILIES],
             "inputs": [f"{FAMILIES[k]} (token mlx{k})" for k in FAMILIES]}]


def downgrade_cases(root: Path = ROOT) -> list[dict]:
    """A committed ok record beside raw files that say less (a log emptied, cut at 5% or half way, its end line
    gone, not gzip; a memory CSV of its header only): refresh must refuse, naming what would go, and leave the
    record as it is; with FORCE=1 it writes what the files say."""
    import gzip as gz

    src = next(s for s in sources(root) if s.parent.name == "runs" and s.parent.parent.name == "results"
               and (s / "logs.txt.gz").exists() and json.loads((s / "run.json").read_text())["status"] == "ok")
    log = gz.decompress((src / "logs.txt.gz").read_bytes())
    cuts = [("log empty", {"logs.txt.gz": b64(gz.compress(b""))}),
            ("log cut at 5%", {"logs.txt.gz": b64(gz.compress(log[: len(log) // 20]))}),
            ("log cut half way", {"logs.txt.gz": b64(gz.compress(log[: len(log) // 2]))}),
            ("log without its last lines", {"logs.txt.gz": b64(gz.compress(b"\n".join(log.split(b"\n")[:-40])))}),
            ("memory CSV header only", {"gpu_memory.csv": b64("t_s,gpu,mem_used_mib\n")})]
    files, commands, inputs = {}, [], []
    for i, (what, beside) in enumerate(cuts):
        folder = f"results/runs/29990104_{i:06d}___{src.name.split('___')[-1]}"
        files[folder] = {"copy": str(src.relative_to(root)), "without": ["tensorboard", "torch_profile"]}
        files.update({f"{folder}/{name}": dmg for name, dmg in beside.items()})
        commands.append({"argv": ["refresh", folder], "env": {}, "expect": "refuse", "unchanged": [f"{folder}/run.json"],
                         "mentions": [Path(folder).name, "would lose", "FORCE=1"]})
        inputs.append(f"refresh of {src.name}: {what}")
    commands.append({"argv": ["refresh", folder], "env": {"FORCE": "1"}, "expect": "any"})
    return [{"name": "refresh over raw files that say less", "group": "downgrade", "files": files,
             "commands": commands, "inputs": inputs}]


def tutorial_cases(root: Path = ROOT) -> list[dict]:
    """Tutorials damaged as a hand or a full disk damages them (emptied, cut inside the table or a quote, the
    table's end marker gone, a quote's end marker gone, removed while its chapter names it): make tables refuses
    in one line naming each, writes nothing."""
    tuts = sorted(p for p in (root / "tutorials").glob("*.md") if "megalab:table chapter=" in p.read_text(encoding="utf-8"))
    texts = {p: p.read_text(encoding="utf-8") for p in tuts}

    def cut_at(text: str, marker: str, after: int = 40) -> str:
        return text[: text.index(marker) + after] if marker in text else text[: len(text) // 2]
    damages = [("emptied", lambda t: ""),
               ("cut inside its table", lambda t: cut_at(t, "<!-- megalab:table chapter=", 300)),
               ("cut inside a quote", lambda t: cut_at(t, "<!-- q ", 30)),
               ("its table's end marker gone", lambda t: t.replace("<!-- /megalab:table -->", "", 1)),
               ("a quote's end marker gone", lambda t: t.replace("<!-- /q -->", "", 1)),
               ("removed", None)]
    files, mentions, inputs = {}, [], []
    for (what, damage), p in zip(damages, tuts):
        rel = str(p.relative_to(root))
        files[rel] = {"special": "delete"} if damage is None else b64(damage(texts[p]))
        mentions.append(rel)
        inputs.append(f"{rel}: {what}")
    cmd = {"argv": ["tables"], "env": {}, "expect": "refuse", "mentions": mentions}
    return [{"name": "tutorials cut, emptied, removed", "group": "tutorials", "files": files, "commands": [cmd],
             "inputs": inputs}]


def cross_items(root: Path, srcs: list[Path]) -> list[dict]:
    """Records a reader must not take, though each is a valid record (issue 60's cross-checks): a target its
    folder contradicts, a start in the future, a folder name a page cannot link, a commit id git would read as
    an option. Items of the records batch (record_cases)."""
    src = next(s for s in srcs if s.parent.name == "runs" and s.parent.parent.name == "results")
    raw = json.loads((src / "run.json").read_text(encoding="utf-8"))
    target = raw["target"]
    other = next(t for t in (s.name.split("___")[-1] for s in srcs) if t.split("-")[0] != target.split("-")[0])
    base = {**raw, "started": newest(srcs)}
    parent = str(src.parent.relative_to(root))
    cases = [("target another than its folder's", f"29990105_000000___{other}", base),
             ("started in 2099", f"29990105_000001___{target}", {**base, "started": "2099-01-01T00:00:00+00:00"}),
             ("folder name with a space and brackets", f"29990105_000002 [x]___{target}", base),
             ("folder name with markup", f"29990105_000003<b>___{target}", base),
             ("commit id an option of git", f"29990105_000004___{target}",
              {**base, "versions": {**(raw.get("versions") or {}), "megalab_commit": "--output=/tmp/mlx"}})]
    return [{"name": f"record {src.name}: {what}", "folder": f"{parent}/{folder}", "source": str(src.relative_to(root)),
             "damage": rec, "invalid": True, "chapter": (raw.get("config") or {}).get("chapter")}
            for what, folder, rec in cases]


def second_round_reference_cases(root: Path = ROOT) -> list[dict]:
    """A published row's target renamed on the CSV's side only (to no target, to another entry's): make tables
    refuses in one line naming the file and the row."""
    rel = "configs/reference/anchor_8xh100.csv"
    text = (root / rel).read_text(encoding="utf-8")
    first = text.splitlines()[1].split(",")
    other = text.splitlines()[2].split(",")[2]
    cases = []
    for what, new in (("renamed to no target", first[2] + "-renamed"), ("renamed to another entry's", other)):
        changed = text.replace(",".join(first), ",".join(first[:2] + [new] + first[3:]), 1)
        cases.append({"name": f"{rel}: row {first[1]}'s target {what}", "group": "reference",
                      "files": {rel: b64(changed)}, "expect": "refuse",
                      "commands": [{"argv": ["tables"], "env": {}, "limit": 60, "mentions": [rel, first[1]]}]})
    return cases


def checks_in_tables_cases(root: Path = ROOT) -> list[dict]:
    """configs/checks.yaml damaged as `make check` refuses it: make tables reads it too, and says it in one line."""
    rel = "configs/checks.yaml"
    text = (root / rel).read_text(encoding="utf-8")
    damages = [("empty file", b64("")), ("cut after a line", b64("".join(text.splitlines(keepends=True)[:40]))),
               ("not UTF-8", b64(text.encode() + b"\n# \xff\xfe\n")), ("a directory", {"special": "dir"})]
    return [{"name": f"{rel}: {what} (make tables)", "group": "checks", "files": {rel: dmg}, "expect": "refuse",
             "commands": [{"argv": ["tables"], "env": {}, "limit": 60, "mentions": ["checks.yaml"]}]}
            for what, dmg in damages]


GROUPS = {"records": record_cases, "beside": beside_cases, "catalog": catalog_cases, "models": models_cases,
          "checks": lambda: checks_cases() + checks_in_tables_cases(),
          "bench": bench_cases, "reference": lambda: reference_cases() + second_round_reference_cases(),
          "variables": variable_cases, "pages": pages_cases, "markup": markup_cases, "downgrade": downgrade_cases,
          "tutorials": tutorial_cases}

# The sandbox holds a dozen of the committed records: its pages are made again from them first (FORCE: they
# are smaller than the committed ones), and that is what every later answer is compared with.
SETTLE = {"name": "settle", "group": "settle", "settle": True,
          "commands": [{"argv": a, "env": {"FORCE": "1"}} for a in (["tables"], ["check"], ["plan", "--validate"],
                                                                   ["bench-report"], ["data-report"], ["integrity"])]}


def cases_for(groups: list[str], *, per_input: bool = False) -> list[dict]:
    out = [SETTLE]
    for g in groups:
        out += GROUPS[g](batch=not per_input) if g in ("records", "beside") else GROUPS[g]()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="issue 31's audit: damaged inputs, every reader; the figures")
    ap.add_argument("--group", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    ap.add_argument("--per-input", action="store_true", help="each damaged record read alone (slow)")
    ap.add_argument("--json", type=Path, help="write every answer here")
    ap.add_argument("--tree", help="audit the code and files of this commit (e.g. main) instead of the working tree")
    ap.add_argument("--failures", type=int, default=40, help="list this many failing answers")
    ap.add_argument("--limit", type=float, help="seconds a command may take before it counts as a hang")
    ap.add_argument("--sample", type=int, default=1, help="with --per-input: every Nth damaged record only")
    args = ap.parse_args(argv)
    groups = [g for g in args.group.split(",") if g]
    cases = cases_for(groups, per_input=args.per_input)
    if args.per_input and args.sample > 1:
        records = [c for c in cases if c["group"] == "records"]
        cases = [c for c in cases if c["group"] != "records" or records.index(c) % args.sample == 0]
    for case in cases if args.limit else []:
        for cmd in case["commands"]:
            cmd["limit"] = args.limit
    with tempfile.TemporaryDirectory(prefix="megalab-audit-") as tmp:
        repo = sandbox(Path(tmp), args.tree)
        results = drive(repo, cases, timeout=6 * 3600, progress=True)
    if args.json:
        args.json.write_text(json.dumps({"cases": cases, "results": results}))
    print(report(figures(cases, results)))
    for line in failures(cases, results, args.failures):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
