"""Maintained libraries tried against what megalab runs, where the contender is not a lever of ours.

Two trials, each a committed benchmark output (benchmarks/ wrote it on the rig):

* CP_TRIAL: megalab's context-parallel attention (megalab/runtime/cp_attention.py) against torch's own ring
  attention (torch.distributed.tensor.experimental.context_parallel), per catalog target, on real GPUs;
* GEMM_TRIAL: the MoE experts' six grouped GEMMs in torch._grouped_mm (what GroupedMLP runs), grouped_gemm
  (MegaBlocks' GEMMs) and quack-kernels (sonic-moe's).

The section reads each file's tables, sets the libraries side by side and names the faster from the numbers, so
the verdict changes when a new run says otherwise. A file that is missing or cut short gives fewer rows, never a
wrong one: a row is used only whole.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from megalab.core import markdown

CP_TRIAL = "cp-torch-ring-microbench.txt"
GEMM_TRIAL = "moe-grouped-gemm-libraries-microbench.txt"
OURS_CP = "megalab p2p (ring)"  # the mode the catalog's CP rows run
TORCH_CP = "torch ring"
TODAY_GEMM = "torch._grouped_mm (today)"

_BLOCK = re.compile(r"^(?P<target>\S+): micro-batch \d+, .*CP=(?P<cp>\d+) ")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _float(cell: str) -> float | None:
    head = cell.split(" ")[0] if cell else ""
    return float(head) if _NUMBER.match(head) else None


def cp_rows(text: str) -> list[dict]:
    """Per target block: {target, cp, impls: {name: (ms, peak MiB)}} for every whole row with a time."""
    out: list[dict] = []
    for line in text.splitlines():
        m = _BLOCK.match(line)
        if m:
            out.append({"target": m["target"], "cp": int(m["cp"]), "impls": {}})
        elif out and line.startswith("| ") and not line.startswith("| implementation"):
            cells = markdown.cells(line)
            if len(cells) == 6 and (ms := _float(cells[1])) is not None:
                out[-1]["impls"][cells[0]] = (ms, _float(cells[3]))
    return [b for b in out if OURS_CP in b["impls"] and any(k.startswith(TORCH_CP) for k in b["impls"])]


_LAYERS = re.compile(r"^x (\d+) layers$")
_SHAPE = re.compile(r"(\d+ tokens, top-\d+ of \d+ experts)")  # a run's heading names the routing it timed
# grouped_gemm builds two ways; a run's heading names which one it timed
_BUILD = (("GROUPED_GEMM_CUTLASS=1", "CUTLASS build"), ("GROUPED_GEMM_CUTLASS=0", "cuBLAS build"),
          ("cuBLAS build", "cuBLAS build"))


def gemm_runs(text: str) -> list[dict]:
    """Per run: {"layers": the model's layers, "ms": {library: the six GEMMs' ms}, "build": grouped_gemm's, "shape":
    the routing} for every whole row; grouped_gemm's rows are named with the build the run's heading names."""
    runs: list[dict] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## run"):
            runs.append({"layers": None, "ms": {}, "build": "", "shape": ""})
            header = None
        elif runs and line.startswith("# ") and not runs[-1]["shape"]:
            runs[-1]["build"] = next((name for key, name in _BUILD if key in line), "")
            runs[-1]["shape"] = m[1] if (m := _SHAPE.search(line)) else ""
        elif runs and line.startswith("| library"):
            header = markdown.cells(line)
            runs[-1]["layers"] = next((int(m[1]) for c in header if (m := _LAYERS.match(c))), None)
        elif runs and header and line.startswith("| ") and not line.startswith("| ---"):
            cells = markdown.cells(line)
            if len(cells) == len(header) and "six GEMMs" in header:
                total = _float(cells[header.index("six GEMMs")])
                if total is not None:
                    lib = cells[0] + (f", {runs[-1]['build']}" if cells[0].startswith("grouped_gemm") and
                                      runs[-1]["build"] else "")
                    runs[-1]["ms"][lib] = total
    return [r for r in runs if TODAY_GEMM in r["ms"] and r["layers"] and r["shape"]]


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def cp_section(text: str) -> list[str]:
    blocks = cp_rows(text)
    if not blocks:
        return [f"No whole table in [{CP_TRIAL}]({CP_TRIAL}): not run, or cut short.", ""]
    rows, wins = [], 0
    for b in blocks:
        ours, ours_mib = b["impls"][OURS_CP]
        name, (theirs, their_mib) = min(((k, v) for k, v in b["impls"].items() if k.startswith(TORCH_CP)),
                                        key=lambda kv: kv[1][0])
        fastest = min(b["impls"].items(), key=lambda kv: kv[1][0])[0]
        wins += ours < theirs
        rows.append([b["target"], b["cp"], f"{ours:.2f}", f"{theirs:.2f} ({name.removeprefix(TORCH_CP).strip(' ()')})",
                     _pct(theirs, ours), f"{ours_mib:.0f} / {their_mib:.0f}" if ours_mib and their_mib else "",
                     fastest])
    verdict = (f"megalab's ring is the faster at {wins} of {len(blocks)} shapes" +
               ("; it stays" if wins == len(blocks) else
                "; torch's is faster somewhere: a lever trial of torch's ring is due" if wins else
                "; torch's is faster everywhere: a lever trial of torch's ring is due"))
    return [f"One layer's causal attention, forward and backward, on each target's shapes, with real transfers between "
            f"GPUs of one host: megalab's `p2p` ring (what the catalog's CP rows run) against torch's own ring "
            f"attention, the faster of its two K/V rotations (torch's blocks take as many K/V heads as query heads; "
            f"megalab's spec copies them for every CP mode too, so both do that). The slowest rank's time a call; "
            f"memory is the largest rank's peak above its inputs. `fastest` names the quickest of all five "
            f"implementations, megalab's `all_gather` and `a2a` included. {verdict}. Torch's does have one thing "
            f"ours lacks: attention dropout inside the ring. [{CP_TRIAL}]({CP_TRIAL}) has every implementation's "
            f"row, its error against one whole-sequence call and where it ran.", "",
            *markdown.table(["target", "CP", "megalab ring ms", "torch's ring ms", "torch's against ours",
                             "peak MiB, ours / torch's", "fastest"], rows), ""]


def gemm_section(text: str) -> list[str]:
    runs = gemm_runs(text)
    if not runs:
        return [f"No whole table in [{GEMM_TRIAL}]({GEMM_TRIAL}): not run, or cut short.", ""]
    out = [f"The six grouped GEMMs of an MoE layer's experts (fc1 and fc2 forward, their input and weight gradients) on "
           f"the same routed tokens, in each library, run against run in one process: row 510's routing, and one beyond "
           f"the catalog. Medians over the runs that had the library, and its time against torch._grouped_mm's in the "
           f"same run. [{GEMM_TRIAL}]({GEMM_TRIAL}) has every GEMM, each run, the builds and the leases.", ""]
    for shape in dict.fromkeys(r["shape"] for r in runs):
        out += _gemm_table(shape, [r for r in runs if r["shape"] == shape])
    return out


def _gemm_table(shape: str, runs: list[dict]) -> list[str]:
    libs = list(dict.fromkeys(k for r in runs for k in r["ms"]))
    rows, saved = [], {}
    for lib in libs:
        mine = [r for r in runs if lib in r["ms"]]
        ms = [r["ms"][lib] for r in mine]
        ratio = statistics.median(r["ms"][lib] / r["ms"][TODAY_GEMM] for r in mine)
        saved[lib] = statistics.median((r["ms"][TODAY_GEMM] - r["ms"][lib]) * r["layers"] for r in mine)
        rows.append([lib, len(ms), f"{statistics.median(ms):.3f}", f"{min(ms):.3f}-{max(ms):.3f}",
                     "" if lib == TODAY_GEMM else f"{(ratio - 1) * 100:+.1f}%",
                     "" if lib == TODAY_GEMM else f"{-saved[lib]:+.1f}"])
    best = max(libs, key=lambda lib: saved[lib])
    verdict = ("torch._grouped_mm, what runs today, is the fastest" if best == TODAY_GEMM else
               f"{best} is the fastest, {saved[best]:.1f} ms a step ahead of torch._grouped_mm over the model's "
               f"layers (the last column)")
    return [f"**{shape}**: {verdict}.", "",
            *markdown.table(["library", "runs", "six GEMMs ms (median)", "range", "against torch._grouped_mm",
                             "ms a step against it (all layers)"], rows), ""]


def section(bench_dir: Path, read) -> list[str]:
    """The bench page's section; read(path) -> text ('' where it cannot)."""
    parts = []
    if (bench_dir / CP_TRIAL).exists():
        parts += ["### torch's ring attention against megalab's context parallelism", "", *cp_section(read(bench_dir / CP_TRIAL))]
    if (bench_dir / GEMM_TRIAL).exists():
        parts += ["### The MoE experts' grouped GEMMs: torch, grouped_gemm (MegaBlocks), quack (sonic-moe)", "",
                  *gemm_section(read(bench_dir / GEMM_TRIAL))]
    return ["## Libraries tried against what runs today", "",
            "A maintained library beats our own code where it is as fast (issues 59 and 63). These contenders are "
            "not levers: each was timed against what runs today on the rig's GPUs, outside a training step.", "",
            *parts] if parts else []
