"""Parse the combined log of a Megatron-Core GPT pre-training run.

The log is what torchrun writes when every rank is tee'd into one ``logs.txt``:
lines of different ranks interleave, and torchrun may prefix them with
``[default0]:`` (``--tee``, local rank) or ``[rank1]: `` (the excepthook torch
installs at process-group init, global rank). From it we recover:

* Megatron's iteration lines (``training_log``), 0.19 format and older ones
  (timestamp with or without microseconds, or none; with or without
  ``throughput per GPU (TFLOP/s/GPU)``; MoE/MTP extra losses), one entry per
  iteration number even when several pipeline stages print the same iteration;
* Megatron's timers (``--timing-log-level`` 1 or 2): the block printed after each iteration
  line (``forward-compute .....: (min, max)`` in ms), kept per iteration as the max over ranks;
* the arguments dump (``train_iters ....... 100``), ``[Rank N] ... memory (MB)``
  reports, ``Theoretical memory footprints: ...``, the per-(tp, pp) parameter
  counts, and our own ``megalab: k=v ...`` lines;
* how the run ended: ``[after training is done] datetime: ...`` (or a
  deliberate ``--exit-interval``/``--exit-duration-in-mins`` exit), CUDA OOM on
  any rank, Python tracebacks, torchrun's ``ChildFailedError``, or a log that
  simply stops.

Step-time statistics drop the first iterations of the run: iteration 1 includes
CUDA/NCCL initialisation, kernel autotuning and allocator growth, and the next
few are still noisy, so including them would skew the median and, above all,
the low/high percentiles that comparisons rely on.

The parser never raises on log content; whatever it cannot find is listed in
``LogSummary.missing``.  Standard library only.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from megalab.core import infile

__all__ = [
    "IterationLine",
    "LogSummary",
    "LogReadError",
    "parse_log",
    "parse_file",
    "parse_iteration_line",
    "megalab_lines",
    "step_stats",
    "summary_fields",
    "add_arguments",
    "main",
]


@dataclass
class IterationLine:
    iteration: int
    train_iters: int | None = None
    elapsed_ms: float | None = None
    tflops_per_gpu: float | None = None
    lm_loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    skipped: int | None = None
    nan: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class LogSummary:
    iterations: list[IterationLine] = field(default_factory=list)
    train_iters: int | None = None
    args: dict[str, str] = field(default_factory=dict)
    megalab: dict[str, str] = field(default_factory=dict)
    megatron_mem: dict[int, dict[str, float]] = field(default_factory=dict)
    theoretical_mem_mb: dict[str, float] = field(default_factory=dict)
    params: dict[tuple[int, int], int] = field(default_factory=dict)
    # iteration -> timer name -> ms (max over ranks), from the block after that iteration's line
    timers: dict[int, dict[str, float]] = field(default_factory=dict)
    # Megatron's start-up timers (before the first iteration): name -> ms (max over ranks), e.g.
    # startup-library-setup (the entry point's imports), model-and-optimizer-setup
    startup: dict[str, float] = field(default_factory=dict)
    # Megatron's print_datetime markers: label -> the wall-clock time it printed (first of each label)
    marks: dict[str, str] = field(default_factory=dict)
    finished: bool = False
    oom: bool = False
    oom_rank: int | None = None
    oom_message: str | None = None
    error: str | None = None
    truncated: bool = False
    status: str = "empty"
    missing: list[str] = field(default_factory=list)


class LogReadError(Exception):
    """The log file could not be read at all (missing, a directory, no permission).

    ``str(exc)`` is one line naming the path; ``exc.reason`` is the cause alone.
    """

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


# --------------------------------------------------------------------------- regexes

# torchrun --tee prefix "[default0]:" (local rank) or torch's excepthook "[rank1]: " (global
# rank). The excepthook adds one space that belongs to the prefix, so strip at most one.
_PREFIX_RE = re.compile(r"^\[(rank|default)(\d+)\]: ?")
_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_TS_RE = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\]\s*$")
_MEM_RE = re.compile(r"\[Rank (\d+)\]\s*(.*?)\s*memory \(MB\)\s*\|(.*)$")
_THEO_RE = re.compile(r"Theoretical memory footprints:\s*(.*)$")
_THEO_ITEM_RE = re.compile(r"([A-Za-z][A-Za-z _]*?)\s*=\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*MB")
# 0.19: "(tensor, gtp_weight_remat, pipeline) ... rank (0, 0, 1): N"; older: "(tensor, pipeline)".
_PARAMS_RE = re.compile(
    r"number of parameters on \(([^)]*)\) model parallel\s+rank \(([^)]*)\):\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\b"
)
# Timers.log(): "    forward-compute ......: (12.34, 15.67)" (min, max) or "...: 15.67" (max only).
_TIMER_RE = re.compile(r"^\s+([A-Za-z][\w/-]*) \.+: (?:\(([\d.]+), ([\d.]+)\)|([\d.]+))\s*$")
_MEGALAB_RE = re.compile(r"^\s*megalab:\s+(.*)$")
_ARGS_START_RE = re.compile(r"^-{3,} arguments -{3,}\s*$")
_ARGS_END_RE = re.compile(r"^-{3,} end of arguments -{3,}\s*$")
# Megatron pads names with dots to column 48; require dots outside the block so timer
# lines ("forward-backward ....: (1.0, 2.0)") and other text are not taken for arguments.
_ARG_DOTTED_RE = re.compile(r"^\s*([A-Za-z_]\w*) \.{2,} (.*?)\s*$")
_ARG_IN_BLOCK_RE = re.compile(r"^\s+([A-Za-z_]\w*) (?:\.+ |\s)(.*?)\s*$")
# print_datetime(): "[after training is done] datetime: 2025-09-30 12:00:00.123456 ".
_DATETIME_RE = re.compile(r"\[([^\]]+)\] datetime: ")
_END_MARKERS = re.compile(
    r"^(after training is done|exiting program at iteration \d+|exiting program after [\d.]+ minutes)$"
)
_OOM_RE = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|Cuda failure \d*\s*'out of memory'",
    re.IGNORECASE,
)
_OOM_GPU_RE = re.compile(r"\bGPU (\d+)(?: has a total capacity|;)")
_EXC_RE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
    r"(?:(?:Error|Exception|Interrupt|Exit|Failure|Iteration)\b(?::.*)?|:\s.*)$"
)
_CHILD_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_CHILD_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_ELASTIC_FAIL_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
# Lines only a Megatron/torchrun run prints: tell "cut short" from "not a Megatron log".
_MEGATRON_HINT_RE = re.compile(
    r"\] datetime: |^\s*training \.\.\.|building GPT model|> initializing torch distributed|"
    r"setting number of microbatches|using world size:|torch\.distributed\.run|"
    r"> compiling dataset index builder|> building train, validation"
)

_MEM_KEYS = {
    "allocated": "allocated_mb",
    "max allocated": "max_allocated_mb",
    "reserved": "reserved_mb",
    "max reserved": "max_reserved_mb",
    "total device memory used": "device_used_mb",
}
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
_OOM_MSG_MAX = 300


# --------------------------------------------------------------------------- helpers

def _num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _int(text: str) -> int | None:
    v = _num(text)
    if v is None or not math.isfinite(v):
        return None
    return int(v)


def _norm_key(key: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", key.strip().lower()).strip("_")


def _parse_iteration_fields(it: IterationLine, segment: str) -> None:
    # Every Megatron field ends in " |": the piece after the last "|" is either empty or a
    # line cut mid-field (truncated log / interleaved rank), so it is ignored.
    for piece in segment.split("|")[:-1]:
        key, sep, value = piece.rpartition(":")
        if not sep or not key.strip():
            continue
        key = key.strip()
        tokens = value.split()
        if not tokens:
            continue
        raw = tokens[0]
        lk = key.lower()
        if lk == "elapsed time per iteration (ms)":
            it.elapsed_ms = _num(raw)
        elif lk.startswith("throughput per gpu"):
            it.tflops_per_gpu = _num(raw)
        elif lk == "lm loss":
            it.lm_loss = _num(raw)
        elif lk == "learning rate":
            it.lr = _num(raw)
        elif lk == "grad norm":
            it.grad_norm = _num(raw)
        elif lk == "number of skipped iterations":
            it.skipped = _int(raw)
        elif lk == "number of nan iterations":
            it.nan = _int(raw)
        else:
            v = _num(raw)
            it.extra[_norm_key(key)] = v if v is not None else value.strip()


_CORE = ("train_iters", "elapsed_ms", "tflops_per_gpu", "lm_loss", "lr", "grad_norm", "skipped", "nan")


def _merge(old: IterationLine, new: IterationLine) -> IterationLine:
    """One entry per iteration: pipeline stages (or a restart) may print the same one twice.

    The line that carries the loss (last stage) wins, then the more complete one, then the
    later one; the other only fills fields the winner lacks.
    """

    def score(x: IterationLine) -> tuple[int, int]:
        return (x.lm_loss is not None, sum(getattr(x, f) is not None for f in _CORE))

    base, other = (new, old) if score(new) >= score(old) else (old, new)
    for f in _CORE:
        if getattr(base, f) is None and getattr(other, f) is not None:
            setattr(base, f, getattr(other, f))
    base.extra = {**other.extra, **base.extra}
    return base


def _strip_prefix(line: str) -> tuple[str, int | None]:
    if not line.startswith("["):  # most lines: no prefix to look for
        return line, None
    rank = None
    # At most two nested prefixes ("[default1]:[rank1]: ..."). "[rankN]" is the global
    # rank, "[defaultN]" only the local one, so the former wins.
    for _ in range(2):
        m = _PREFIX_RE.match(line)
        if not m:
            break
        if rank is None or m.group(1) == "rank":
            rank = int(m.group(2))
        line = line[m.end():]
    return line, rank


# --------------------------------------------------------------------------- parsing

def parse_log(text: str) -> LogSummary:
    """Parse a whole log given as text. Never raises; see ``LogSummary.missing``."""
    try:
        return _parse(text)
    except Exception as exc:  # a parser bug must not take down a sweep report
        s = LogSummary(status="empty")
        s.missing.append(f"parser error: {type(exc).__name__}: {exc}")
        return s


@dataclass
class _State:
    """What one pass over the lines carries from line to line (LogSummary holds the findings)."""
    s: LogSummary
    iters: dict[int, IterationLine] = field(default_factory=dict)
    recognised: bool = False  # any line only Megatron/torchrun prints: "cut short", not "not a log"
    last_iter: int | None = None  # timer blocks belong to the iteration logged just before
    in_args: bool = False
    tb_pending: dict = field(default_factory=dict)  # rank -> inside a traceback, waiting for its last line
    tb_seen: bool = False
    exceptions: list[str] = field(default_factory=list)  # final lines of tracebacks, in log order
    child_failed: bool = False
    in_root_cause: bool = False
    child_rank: int | None = None
    child_exit: int | None = None
    elastic_rank: int | None = None
    oom_prefix_rank: int | None = None
    oom_gpu: int | None = None
    other_crash: str | None = None


# Each handler gets (state, line without its rank prefix, rank) and returns True when the line is
# taken (no later handler sees it). Lines cut mid-line by a truncated log are shown only to handlers
# marked `partial_ok`: a number on a cut line may be cut too.

def _on_iterations(st: _State, line: str, rank) -> bool:
    """Iteration lines, possibly two ranks' lines glued together."""
    matches = list(_ITER_RE.finditer(line))
    for k, m in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(line)
        it = IterationLine(iteration=int(m.group(1)), train_iters=int(m.group(2)))
        ts = _TS_RE.search(line[matches[k - 1].end() if k else 0:m.start()])
        if ts:
            it.extra["timestamp"] = ts.group(1)
        _parse_iteration_fields(it, line[m.end():end])
        st.iters[it.iteration] = _merge(st.iters[it.iteration], it) if it.iteration in st.iters else it
        st.last_iter = it.iteration
    st.recognised = st.recognised or bool(matches)
    return bool(matches)


def _on_timer(st: _State, line: str, rank) -> bool:
    """Timers: per iteration after its line; the start-up blocks before any iteration go to `startup`."""
    m = _TIMER_RE.match(line)
    if not m:
        return False
    if st.last_iter is not None:
        st.s.timers.setdefault(st.last_iter, {})[m.group(1)] = float(m.group(3) or m.group(4))
    else:
        st.s.startup[m.group(1)] = float(m.group(3) or m.group(4))
    st.recognised = True
    return True


def _on_args_fence(st: _State, line: str, rank) -> bool:
    """The arguments dump's first and last lines."""
    if _ARGS_START_RE.match(line.strip()):
        st.in_args = st.recognised = True
        return True
    if st.in_args and _ARGS_END_RE.match(line.strip()):
        st.in_args = False
        return True
    return False


def _on_argument(st: _State, line: str, rank) -> bool:
    if "megalab:" in line or not st.in_args and " .." not in line:  # outside the dump: " .. " or no argument
        return False
    m = (_ARG_IN_BLOCK_RE if st.in_args else _ARG_DOTTED_RE).match(line)
    if m:
        st.s.args[m.group(1)] = m.group(2)
        st.recognised = True
    return bool(m)


def _on_memory(st: _State, line: str, rank) -> bool:
    m = _MEM_RE.search(line)
    if not m:
        return False
    mem = {}
    for piece in m.group(3).split("|"):
        key, _, value = piece.partition(":")
        name = _MEM_KEYS.get(key.strip().lower())
        v = _num(value.strip())
        if name and v is not None:
            mem[name] = v
    if mem:  # later reports (after optimizer state exists) supersede earlier ones
        st.s.megatron_mem[int(m.group(1))] = mem
        st.recognised = True
    return True


def _on_theoretical(st: _State, line: str, rank) -> bool:
    m = _THEO_RE.search(line)
    if m:
        for name, value in _THEO_ITEM_RE.findall(m.group(1)):
            st.s.theoretical_mem_mb[_norm_key(name)] = float(value)
        st.recognised = True
    return bool(m)


def _on_params(st: _State, line: str, rank) -> bool:
    m = _PARAMS_RE.search(line)
    if not m:
        return False
    names = [n.strip() for n in m.group(1).split(",")]
    ranks = [_int(r.strip()) for r in m.group(2).split(",")]
    if len(names) == len(ranks) and None not in ranks:
        pos = dict(zip(names, ranks))
        tp, pp = pos.get("tensor", ranks[0]), pos.get("pipeline", ranks[-1])
        st.s.params[(tp, pp)] = int(round(float(m.group(3)) * _SUFFIX[m.group(4)]))
        st.recognised = True
    return True


def _on_megalab(st: _State, line: str, rank) -> bool:
    """The entry point's own `megalab: k=v ...` line (what actually ran)."""
    m = _MEGALAB_RE.match(line)
    if m:
        for tok in m.group(1).split():
            k, eq, v = tok.partition("=")
            if eq and k:
                st.s.megalab[k] = v
        st.recognised = True
    return bool(m)


def end_of_training(line: str) -> bool:
    """A print_datetime line that says training is over (the launcher's exit watchdog reads it too)."""
    m = _DATETIME_RE.search(line)
    return bool(m) and _ends_training(m.group(1).strip())


def _ends_training(label: str) -> bool:
    return bool(_END_MARKERS.match(label))


def _on_datetime(st: _State, line: str, rank) -> bool:
    """print_datetime markers; the end-of-training one says the run finished."""
    m = _DATETIME_RE.search(line)
    if m:
        st.recognised = True
        label = m.group(1).strip()
        st.s.marks.setdefault(label, line[m.end():].strip())
        st.s.finished = st.s.finished or _ends_training(label)
    return bool(m)


def _on_oom(st: _State, line: str, rank) -> bool:
    s = st.s
    # every form of the message says "memory": the cheap test first, the regex only then
    if not s.oom and "memory" in line.lower() and _OOM_RE.search(line) and not line.lstrip().startswith("File "):
        s.oom, s.oom_message, st.oom_prefix_rank = True, line.strip()[:_OOM_MSG_MAX], rank
        g = _OOM_GPU_RE.search(line)
        st.oom_gpu = int(g.group(1)) if g else None
    return False  # the same line may also end a traceback


def _on_traceback(st: _State, line: str, rank) -> bool:
    """A traceback's first line, and the exception line that ends it (per rank)."""
    if "Traceback (most recent call last)" in line and line.strip().startswith("Traceback (most recent call last)"):
        st.tb_pending[rank] = True
        st.tb_seen = st.recognised = True
        return True
    if st.tb_pending.get(rank) and line[:1] not in (" ", "\t") and (stripped := line.strip()):
        if not stripped.startswith(("During handling", "The above exception")) and _EXC_RE.match(stripped):
            st.exceptions.append(stripped)
            st.tb_pending[rank] = False
    return False


def _on_torchrun_failure(st: _State, line: str, rank) -> bool:
    """torchrun's ChildFailedError report (its root cause's rank and exit code) and elastic's line."""
    if "ChildFailedError" in line:
        st.child_failed = st.recognised = True
    if st.child_failed:
        if line.strip().startswith("Root Cause"):
            st.in_root_cause = True
        elif st.in_root_cause:
            if (m := _CHILD_RANK_RE.match(line)) and st.child_rank is None:
                st.child_rank = int(m.group(1))
            if (m := _CHILD_EXIT_RE.match(line)) and st.child_exit is None:
                st.child_exit = int(m.group(1))
    if "failed (exitcode: " in line and (m := _ELASTIC_FAIL_RE.search(line)) and st.elastic_rank is None:
        st.elastic_rank = int(m.group(2))
        st.recognised = True
    return False


def _on_abort(st: _State, line: str, rank) -> bool:
    """A C++ abort (e.g. NCCL's watchdog): no Python traceback."""
    if "terminate called after throwing" in line and st.other_crash is None \
            and (stripped := line.strip()).startswith("terminate called after throwing"):
        st.other_crash = stripped
    if not st.recognised and _MEGATRON_HINT_RE.search(line):
        st.recognised = True
    return False


@dataclass(frozen=True)
class _Handler:
    needle: str | None  # a substring the line must hold (a cheap test before the regex); None: any
    fn: Callable[[_State, str, Any], bool]
    partial_ok: bool = False  # also shown the last line when the log was cut mid-line


HANDLERS: tuple[_Handler, ...] = (  # in this order; the first that takes a line ends its turn
    _Handler("iteration", _on_iterations, partial_ok=True),
    _Handler("..: ", _on_timer),
    _Handler("---", _on_args_fence, partial_ok=True),
    _Handler(None, _on_argument),
    _Handler("memory (MB)", _on_memory),
    _Handler("Theoretical memory footprints", _on_theoretical),
    _Handler("number of parameters on", _on_params),
    _Handler("megalab:", _on_megalab),
    _Handler(" datetime: ", _on_datetime, partial_ok=True),
    _Handler(None, _on_oom, partial_ok=True),
    _Handler(None, _on_traceback, partial_ok=True),
    _Handler(None, _on_torchrun_failure, partial_ok=True),
    _Handler(None, _on_abort, partial_ok=True),
)


# (needle, fn) pairs, for a whole line and for a line cut mid-line: read once, not per line
_WHOLE = tuple((h.needle, h.fn) for h in HANDLERS)
_PARTIAL = tuple((h.needle, h.fn) for h in HANDLERS if h.partial_ok)


def _take(handlers, st: _State, line: str, rank, idx: int) -> None:
    """The first of HANDLERS that takes the line; a line one cannot digest (a 5000-digit number, ...) is noted, not
    fatal, and taken."""
    for needle, fn in handlers:
        if needle is None or needle in line:
            try:
                if fn(st, line, rank):
                    return
            except (ValueError, OverflowError, KeyError, IndexError) as exc:
                if len(st.s.missing) < 20:  # a log of bad lines must not grow the summary without bound
                    st.s.missing.append(f"line {idx + 1} not understood ({fn.__name__}: {type(exc).__name__})")
                return


def _as_text(text) -> str:
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    return text if isinstance(text, str) else str(text)


def _parse(text) -> LogSummary:
    text = _as_text(text)
    s = LogSummary()
    if not text.strip():
        s.status = "empty"
        s.missing.append("empty log")
        return s
    lines = text.splitlines()
    cut_mid_line = not text.endswith(("\n", "\r"))
    st = _State(s)
    last = len(lines) - 1
    for idx, raw in enumerate(lines):
        line, rank = _strip_prefix(raw)
        _take(_PARTIAL if cut_mid_line and idx == last else _WHOLE, st, line, rank, idx)
    s.iterations = [st.iters[k] for k in sorted(st.iters)]
    s.train_iters = _int(s.args.get("train_iters", ""))
    if s.train_iters is None and s.iterations:
        s.train_iters = max(it.train_iters or 0 for it in s.iterations) or None
    _assemble_error(st)
    _assemble_status(st)
    _list_missing(st, cut_mid_line)
    return s


def _assemble_error(st: _State) -> None:
    """The run's error: the root cause first, as later ranks usually die of the first one's failure."""
    s = st.s
    real = [e for e in st.exceptions if "ChildFailedError" not in e]
    if real:
        s.error = real[0]
    elif st.child_failed:
        bits = [f"rank {st.child_rank}" if st.child_rank is not None else None,
                f"exitcode {st.child_exit}" if st.child_exit is not None else None]
        s.error = "ChildFailedError: " + (", ".join(b for b in bits if b) or "a worker failed")
    elif st.other_crash:
        s.error = st.other_crash
    elif st.tb_seen:
        s.error = "Traceback without a final exception line"
    if s.oom:
        s.error = s.error or s.oom_message
        # The prefix names the rank for sure; torchrun's root cause next; the GPU index in
        # the message equals the rank only on a single node, so it comes last.
        s.oom_rank = next((r for r in (st.oom_prefix_rank, st.child_rank, st.elastic_rank, st.oom_gpu)
                           if r is not None), None)


def _last_iteration(s: LogSummary) -> int | None:
    return s.iterations[-1].iteration if s.iterations else None


def _assemble_status(st: _State) -> None:
    s = st.s
    last = _last_iteration(s)
    reached = bool(s.train_iters and last is not None and last >= s.train_iters)
    s.truncated = st.recognised and not (s.finished or reached or s.oom or s.error is not None)
    if s.oom:
        s.status = "oom"
    elif s.error is not None:
        s.status = "failed"
    elif s.finished or reached:
        s.status = "ok"
    else:
        s.status = "incomplete" if st.recognised else "empty"


def _list_missing(st: _State, cut_mid_line: bool) -> None:
    s, miss = st.s, st.s.missing
    if not st.recognised:
        miss.append("no recognisable Megatron output")
    if not s.iterations:
        miss.append("no iteration lines")
    else:
        for attr, what in (("elapsed_ms", "no elapsed time per iteration"), ("lm_loss", "no lm loss values"),
                           ("tflops_per_gpu", "no throughput field (run without --log-throughput)")):
            if not any(getattr(it, attr) is not None for it in s.iterations):
                miss.append(what)
    for found, what in ((s.args, "no arguments dump"), (s.train_iters is not None, "train_iters unknown"),
                        (s.megalab, "no 'megalab:' line"), (s.params, "no parameter count line"),
                        (s.megatron_mem, "no Megatron memory report"),
                        (s.theoretical_mem_mb, "no theoretical memory line"),
                        (s.finished, "no end-of-training marker")):
        if not found:
            miss.append(what)
    if s.truncated:
        last = _last_iteration(s)
        reason = f"log stops at iteration {last}" if last is not None else "log stops early"
        if s.train_iters:
            reason += f" of {s.train_iters}"
        miss.append(reason + (" (last line cut mid-line)" if cut_mid_line else ""))


def megalab_lines(text) -> dict[str, str]:
    """Only the entry point's `megalab: k=v ...` lines of a log (what ran), without parsing the rest."""
    st = _State(LogSummary())
    for raw in _as_text(text).splitlines():
        if "megalab:" in raw:
            _on_megalab(st, _strip_prefix(raw)[0], None)
    return st.s.megalab


def _only(text, needles: tuple[str, ...]) -> _State:
    """parse_log's pass over the lines that hold one of NEEDLES alone, each through the handlers as there: what
    those handlers find where no line without a needle can reach them or the state they read."""
    text = _as_text(text)
    lines = text.splitlines()
    cut_mid_line = not text.endswith(("\n", "\r"))
    st, last = _State(LogSummary()), len(lines) - 1
    for idx in sorted({i for n in needles for i, raw in enumerate(lines) if n in raw}):  # in order, each line once
        line, rank = _strip_prefix(lines[idx])
        _take(_PARTIAL if cut_mid_line and idx == last else _WHOLE, st, line, rank, idx)
    return st


def megatron_mem(text) -> dict[int, dict[str, float]]:
    """Only Megatron's memory reports of a log (LogSummary.megatron_mem: the last per rank), as parse_log reads
    them, without parsing the rest: the lines with the report's marker, and those that may open or close the
    arguments dump, which decides how the handlers before the report's read a line (the estimator's validation
    reads 1,134 logs for them alone: 4.9 s -> 0.4 s)."""
    try:
        return _only(text, ("memory (MB)", "---")).s.megatron_mem
    except Exception:  # as parse_log: a parser bug is no report
        return {}


def iterations(text) -> list[IterationLine]:
    """Only the iteration lines of a log (LogSummary.iterations), as parse_log reads them, without parsing the
    rest: their handler, the first, sees every line that holds "iteration" and no other (the bench page's loss
    parity reads 248 logs for them, each page build)."""
    try:
        st = _only(text, ("iteration",))
    except Exception:  # as parse_log: a parser bug is no report
        return []
    return [st.iters[k] for k in sorted(st.iters)]


def log_file(path) -> Path:
    """PATH, or where PATH is missing and PATH.gz is there, PATH.gz: the committed runs under results/
    keep their raw logs gzipped (`make tables` compresses them; a 7x smaller checkout)."""
    p = Path(path)
    gz = p.with_name(p.name + ".gz")
    return gz if not p.exists() and gz.exists() else p


def read_log(path, limit: int | None = infile.LOG_LIMIT) -> bytes:
    """The bytes of a log, from PATH or its gzip (log_file), through the file door (core/infile.py): a
    regular file (a FIFO, a device, a directory is refused without blocking), at most LIMIT bytes once
    unpacked (a gzip bomb stops there; None: no limit, for the launcher's own fresh log). Anything else is
    an InputError, an OSError: readers catch OSError."""
    return infile.read(log_file(path), limit)


def plain_logs(root: Path) -> list[Path]:
    """The raw logs under ROOT (results/) of committed runs that are not gzipped yet: Megatron's log and
    its TensorBoard event files (a quarter of their size gzipped: a run is then about 0.1 MB, so the
    checkout stays small enough for the GPU rig's copy of it)."""
    root = Path(root)
    # not a .gz, nor the .gz.tmp an interrupted compress_logs leaves behind
    events = (p for p in root.glob("**/runs/*/tensorboard/*tfevents*") if ".gz" not in p.suffixes)
    return sorted([*root.glob("**/runs/*/logs.txt"), *events])


def compress_logs(root: Path) -> list[Path]:
    """Gzip every plain_logs(ROOT) (a .gz beside it is replaced: the plain file is the newer copy;
    atomic: the .gz is complete before the plain file goes); the paths written. A file the door refuses
    (a FIFO, a device, larger than infile.LOG_LIMIT) is left as it is, with one line on stderr."""
    done = []
    for p in plain_logs(root):
        try:
            data = infile.read(p, infile.LOG_LIMIT, gunzip=False)
        except infile.InputError as e:
            print(f"megalab: not gzipping {e}", file=sys.stderr)
            continue
        gz = p.with_name(p.name + ".gz")
        tmp = gz.with_name(gz.name + ".tmp")
        tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))  # mtime 0: same bytes each time
        tmp.replace(gz)
        p.unlink()
        done.append(gz)
    return done


def parse_file(path, limit: int | None = infile.LOG_LIMIT) -> LogSummary:
    """Read and parse a log file (or its gzip, log_file; read_log's LIMIT); undecodable bytes are replaced,
    never fatal."""
    return parse_log(read_text(path, limit))


def read_text(path, limit: int | None = infile.LOG_LIMIT) -> str:
    """A log file's text (or its gzip's, log_file; read_log's LIMIT), undecodable bytes replaced; LogReadError
    where it cannot be read."""
    p = Path(path)
    try:
        data = read_log(p, limit)
    except infile.InputError as exc:
        raise LogReadError(p, exc.reason) from None
    except ValueError as exc:  # a path with a NUL byte
        raise LogReadError(p, str(exc)) from None
    except OSError as exc:
        raise LogReadError(p, str(exc.strerror or exc).replace("\n", " ")) from None
    return data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- statistics

def _percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict:
    xs = sorted(values)
    if not xs:
        return {"median": None, "p10": None, "p90": None, "min": None, "max": None, "count": 0}
    return {
        "median": _percentile(xs, 0.5),
        "p10": _percentile(xs, 0.1),
        "p90": _percentile(xs, 0.9),
        "min": xs[0],
        "max": xs[-1],
        "count": len(xs),
    }


def step_stats(values: list[float], warmup: int = 3) -> dict:
    """Median/p10/p90/min/max of per-step values after dropping the first ``warmup``.

    If nothing would be left, all values are used and ``warmup`` reports 0 dropped.
    """
    vals = [float(v) for v in values if v is not None]
    drop = max(0, int(warmup))
    if len(vals) <= drop:
        drop = 0
    out = _stats(vals[drop:])
    out["warmup"] = drop
    return out


def _steady(iterations: list[IterationLine], attr: str, warmup: int) -> tuple[list[float], int]:
    """Values of ``attr`` with the first ``warmup`` iterations of the run dropped.

    Dropping is by iteration number counted from the first logged one, so with
    --log-interval 10 (logged: 1, 10, 20, ...) only iteration 1 goes, and a resumed run
    (first logged: 101) loses 101..103.
    """
    rows = [(it.iteration, getattr(it, attr)) for it in iterations if getattr(it, attr) is not None]
    if not rows:
        return [], 0
    cutoff = rows[0][0] + max(0, int(warmup))
    kept = [v for i, v in rows if i >= cutoff]
    if not kept:
        return [v for _, v in rows], 0
    return kept, len(rows) - len(kept)


def summary_fields(s: LogSummary, warmup: int = 3) -> dict:
    """Flat record of a parsed log (JSON-serialisable)."""
    steps, dropped = _steady(s.iterations, "elapsed_ms", warmup)
    st = _stats(steps)
    tflops, _ = _steady(s.iterations, "tflops_per_gpu", warmup)
    losses = [it.lm_loss for it in s.iterations if it.lm_loss is not None]
    tp0 = [n for (tp, _pp), n in s.params.items() if tp == 0]
    timers = timer_medians(s, warmup)
    return {
        "status": s.status,
        "step_ms_median": st["median"],
        "step_ms_p10": st["p10"],
        "step_ms_p90": st["p90"],
        "step_ms_min": st["min"],
        "step_ms_max": st["max"],
        "step_count": st["count"],
        "warmup_iters": dropped,
        "tflops_per_gpu": _stats(tflops)["median"],
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "iters_logged": len(s.iterations),
        "train_iters": s.train_iters,
        "megatron_mem": dict(s.megatron_mem[0]) if 0 in s.megatron_mem else None,
        "megatron_mem_by_rank": {r: dict(m) for r, m in sorted(s.megatron_mem.items())},
        "theoretical_mem_mb": dict(s.theoretical_mem_mb) or None,
        "params_total": sum(tp0) if tp0 else None,
        "timers_ms": timers or None,
        "breakdown_ms": breakdown(timers, st["median"]),
        "oom_rank": s.oom_rank,
        "error": s.error,
        "missing": list(s.missing),
    }


def timer_medians(s: LogSummary, warmup: int = 3) -> dict[str, float]:
    """Median per step of each timer over the steady iterations (same warm-up rule as steps)."""
    if not s.timers:
        return {}
    cutoff = min(s.timers) + max(0, int(warmup))
    steady = [t for i, t in s.timers.items() if i >= cutoff] or list(s.timers.values())
    names = sorted({n for t in steady for n in t})
    return {n: round(_stats([t[n] for t in steady if n in t])["median"], 2) for n in names}


def breakdown(timers: dict[str, float], step_ms: float | None) -> dict[str, float] | None:
    """A step split into forward / backward / optimizer / other (ms, medians).

    forward-compute and backward-compute sum a step's microbatches (--timing-log-level 2);
    `other` is what the step spends outside them: pipeline sends/receives, gradient all-reduce
    or reduce-scatter, the data loader, the timers' own synchronisation.
    """
    need = ("forward-compute", "backward-compute", "optimizer")
    if step_ms is None or any(n not in timers for n in need):
        return None
    f, b, o = (timers[n] for n in need)
    return {"forward": f, "backward": b, "optimizer": o, "other": round(step_ms - f - b - o, 2)}


def parse_iteration_line(line: str) -> IterationLine | None:
    """The iteration a single log line reports (for live progress), or None."""
    line, _ = _strip_prefix(line.rstrip("\r\n"))
    m = _ITER_RE.search(line)
    if not m:
        return None
    it = IterationLine(iteration=int(m.group(1)), train_iters=int(m.group(2)))
    _parse_iteration_fields(it, line[m.end():])
    return it


# --------------------------------------------------------------------------- cli

def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _human(path: str, s: LogSummary, f: dict) -> str:
    last = s.iterations[-1].iteration if s.iterations else None
    out = [
        f"{path}: status={f['status']}  iterations logged={f['iters_logged']}"
        f"  last={_fmt(last, 'd')}/{_fmt(f['train_iters'], 'd')}  finished={'yes' if s.finished else 'no'}"
    ]
    if f["step_count"]:
        out.append(
            f"  step ms: median {_fmt(f['step_ms_median'])}  p10 {_fmt(f['step_ms_p10'])}"
            f"  p90 {_fmt(f['step_ms_p90'])}  (n={f['step_count']}, first {f['warmup_iters']} dropped)"
            f"  TFLOP/s/GPU {_fmt(f['tflops_per_gpu'])}"
        )
    if f["loss_first"] is not None:
        out.append(f"  lm loss: {f['loss_first']:.4f} -> {f['loss_last']:.4f}")
    mem, theo = f["megatron_mem"], f["theoretical_mem_mb"] or {}
    if mem or theo:
        out.append(
            f"  memory MB (rank 0): max allocated {_fmt((mem or {}).get('max_allocated_mb'))}"
            f"  max reserved {_fmt((mem or {}).get('max_reserved_mb'))}"
            f"  theoretical total {_fmt(theo.get('total'))}"
        )
    if f["params_total"] is not None:
        out.append(f"  parameters: {f['params_total']:,}")
    if s.oom:
        out.append(f"  OOM on rank {_fmt(s.oom_rank, 'd')}: {s.oom_message}")
    elif f["error"]:
        out.append(f"  error: {f['error']}")
    if f["missing"]:
        out.append("  missing: " + "; ".join(f["missing"]))
    return "\n".join(out)


def _finite(obj):
    # NaN/inf (a diverged loss) are not JSON; jq and friends reject them.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _emit(text: str, stream=None) -> None:
    """Print whatever the log held: a terminal that cannot show a character gets an escape, not a traceback."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream)
    except UnicodeEncodeError:
        enc = getattr(stream, "encoding", None) or "ascii"
        print(text.encode(enc, "backslashreplace").decode(enc, "replace"), file=stream)


def add_arguments(p) -> None:
    p.add_argument("log", metavar="LOG", help="a run's logs.txt (or logs.txt.gz)")
    p.add_argument("--json", action="store_true", help="the record's fields, as JSON")


def main(args) -> int:
    """``python -m megalab parse LOG [--json]``. Returns 0, 1 (no iterations) or 2 (cannot read)."""
    path = args.log
    try:
        s = parse_file(path)
    except LogReadError as exc:
        _emit(f"megalab parse: cannot read {path}: {exc.reason} "
              f"(fix: pass the path of a run's logs.txt, e.g. one under outdir/)", sys.stderr)
        return 2
    f = summary_fields(s)
    _emit(json.dumps(_finite(f)) if args.json else _human(path, s, f))
    return 0 if s.iterations else 1
