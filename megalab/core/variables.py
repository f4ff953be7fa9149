"""The make variables, declared once: name, type, default, one line of help, whether an sbatch
script forwards it, and its group. Everything else is derived from this table: `Options.from_env`
(the typed view a run is planned from), slurm's forwarded list, the Makefile's `export` line
(tests/test_plan.py checks it lists exactly these) and `make help`'s variable list
(`python -m megalab variables`). Standard library only: `make help` needs nothing installed.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from pathlib import Path

from megalab.core import leverdoc
from megalab.core.paths import ROOT
from megalab.runtime import levers


class LaunchError(RuntimeError):
    """One-line, user-facing: what is wrong and the fix."""


# A flag's words (anything else is refused: DRY_RUN=maybe must not mean yes)
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    # int | float (finite) | str | flag (1/true/yes/on, 0/false/no/off; unset: off) | path | choice |
    # words (a shell word list, split once by shlex into argv items) | levers (FAST: lever names, levers.parse) |
    # size (bytes as docker writes them, 16g, 512m: kept as typed, within SIZES)
    type: str
    default: object
    help: str
    forwarded: bool = False  # an sbatch script exports it so that every node runs the same way
    group: str = "run"  # run | outputs | data | nodes | slurm | docker
    field: str | None = None  # its Options attribute (None: read where it is used, e.g. make or docker)
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # int, float: the least value allowed
    maximum: float | None = None  # int, float: the largest
    positive: bool = False  # float: above 0 (a size, a duration)
    example: str | None = None  # the value a fix suggests where the default cannot (None: the default)
    pattern: str | None = None  # str: the whole value matches this regex (what it is, in `shape`)
    shape: str = ""  # str with a pattern: what the value is, in words

    def parse(self, text: str):
        """The variable's value from its text: the default when empty, else the text as its type, within
        its range. Anything else is a LaunchError of one line: the variable, the value, the fix."""
        if text == "":
            return self.default
        kind = PARSERS.get(self.type, _text)
        try:
            value = kind(self, text)
            if self.pattern and not re.fullmatch(self.pattern, text):
                raise ValueError(f"not {self.shape}")
        except ValueError as e:  # a parser that names its own fix (a retired lever) keeps it: one fix a line
            fix = "" if "; fix: " in str(e) else f"; fix: {self.fix()}"
            raise LaunchError(f"{self.name}={_shown(text)}: {e}{fix}") from None
        problem = self.out_of_range(value)
        if problem:
            raise LaunchError(f"{self.name}={_shown(text)}: {problem}; fix: {self.fix()}")
        return value

    def out_of_range(self, value) -> str | None:
        if self.type not in ("int", "float"):
            return None
        if self.positive and not value > 0:
            return "must be above 0"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum:.15g}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum:.15g}"
        return None

    def fix(self) -> str:
        if self.type == "flag":
            return f"{self.name}=1 or {self.name}=0"
        if self.type == "choice":
            return f"e.g. {self.name}={self.choices[0]}"
        if self.type == "words":
            return f"balance its quotes, e.g. {self.name}='--seed 7'"
        if self.type == "size":
            return f"a size from 1m to 1t, e.g. {self.name}={self.default}"
        if self.type == "levers":
            return f"none, all, or names from `make help FAST` ({', '.join(levers.NAMES)})"
        example = self.example or ("" if self.default is None else f"{self.default:g}" if isinstance(self.default, float)
                                   else str(self.default))
        what = {"int": "a whole number", "float": "a number"}.get(self.type)
        return ", ".join(x for x in (what, f"e.g. {self.name}={example}" if example else "") if x) or "unset it"


def _shown(text: str) -> str:
    """The value as typed; quoted where it would not stay on one line."""
    return text if text.isprintable() else repr(text)


def _int(var: Variable, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not a number") from None


def _float(var: Variable, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(value):  # nan would switch a watchdog off, inf never ends
        raise ValueError("not a finite number")
    return value


def _flag(var: Variable, text: str) -> bool:
    word = text.strip().lower()
    if word in ON + OFF:
        return word in ON
    raise ValueError(f"not a yes/no value ({', '.join(ON)} / {', '.join(OFF)})")


def _choice(var: Variable, text: str) -> str:
    if text in var.choices:
        return text
    if var.name == "CUDA_GRAPH" and text in ("true", "yes", "false", "no"):  # yes/no words, as flags take
        return "1" if text in ("true", "yes") else "0"
    raise ValueError(f"not one of {', '.join(var.choices)}")


def _words(var: Variable, text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ValueError(f"not a shell word list ({e})") from None


def _text(var: Variable, text: str) -> str:
    return text


# docker's sizes (go-units RAMInBytes: a number, a unit k/m/g/t/p, an optional i and b), and the range of one
SIZE = re.compile(r"(\d+(?:\.\d+)?) ?([kmgtp]?)i?b?", re.I)
SIZES = (1 << 20, 1 << 40)  # a shared-memory size: 1 MiB (docker's default is 64m) to 1 TiB


def _size(var: Variable, text: str) -> str:
    m = SIZE.fullmatch(text)
    if not m:
        raise ValueError("not a size (a number and a unit: 16g, 512m)")
    size = float(m.group(1)) * 1024 ** "bkmgtp".index((m.group(2) or "b").lower())
    if not SIZES[0] <= size <= SIZES[1]:
        raise ValueError("out of range (1m to 1t)")
    return text


PARSERS = {"int": _int, "float": _float, "flag": _flag, "choice": _choice, "words": _words,
           "path": lambda var, text: Path(text), "str": _text, "levers": lambda var, text: levers.parse(text),
           "size": _size}


# Sane bounds of the counts and durations (what no run of this lab needs more of; a typo of a few digits, or
# 99999999999999999999999, which would overflow Megatron's 64-bit counters, is refused in one line)
MAX_ITERS = 10_000_000  # training iterations
MAX_WAIT_S = 7 * 86400  # a watchdog's or a grace period's seconds: a week

V = Variable
VARIABLES: tuple[Variable, ...] = (
    V("ITERS", "int", 100, "training iterations (the step time is the median after WARMUP)", True, field="iters",
      minimum=1, maximum=MAX_ITERS),
    V("WARMUP", "int", 3, "iterations left out of the step-time median (below ITERS)", True, field="warmup",
      minimum=0),
    V("GPU_MEM_GB", "float", None, "cap each process as if the GPU had this many GB (e.g. 80 on an H200)", True,
      field="gpu_mem_gb", positive=True, maximum=4096, example="80"),
    V("GPU", "str", None, "the GPU to plan for: h100, h200, a100, a100-40gb, b200, gh200, l40s (default: the GPU "
      "found, else h100; with GPU_MEM_GB, the smallest that holds it)", True, field="gpu"),
    V("DRY_RUN", "flag", False, "print the preflight and the exact command; start nothing", field="dry_run"),
    V("OUTDIR", "path", ROOT / "outdir", "where run directories go", field="outdir"),
    V("SPEC", "choice", "megalab", "TE-free layer spec: megalab, or local (Megatron's stock spec)", True,
      field="spec", choices=("megalab", "local")),
    V("TE", "choice", "auto", "Transformer Engine: auto, 1 (require it), 0 (never)", True, field="te",
      choices=("auto", "1", "0")),
    V("FAST", "levers", None, "fast-path levers: none, all, or a list (default: the spec's; make help FAST)", True,
      field="fast"),
    V("CUDA_GRAPH", "choice", "auto", "Megatron's full-iteration CUDA graph: auto, 1, 0", True,
      field="cuda_graph", choices=("auto", "1", "0")),
    V("EXTRA_ARGS", "words", (), "more Megatron flags, split like a shell word list (shlex), appended", True,
      field="extra_args"),
    V("MEGATRON_LM", "str", "", "a Megatron-LM checkout: run its own pretrain_gpt.py with the same flags", True,
      field="megatron_lm"),
    V("VERBOSE", "flag", False, "stream the whole log instead of the progress line", field="verbose"),
    V("SAVE", "flag", False, "checkpoint into the run dir's checkpoints/ (torch_dist)", True, "outputs", "save"),
    V("SAVE_INTERVAL", "int", None, "iterations between checkpoints (default: the end of the run)", True,
      "outputs", "save_interval", minimum=1, maximum=MAX_ITERS, example="50"),
    V("LOAD", "path", None, "resume from a checkpoint dir (or a run dir holding checkpoints/)", True,
      "outputs", "load"),
    V("WANDB", "flag", False, "log to Weights & Biases (offline unless WANDB_API_KEY is set)", True,
      "outputs", "wandb"),
    V("WANDB_PROJECT", "str", "megalab", "the wandb project", True, "outputs", "wandb_project"),
    V("WANDB_ENTITY", "str", "", "the wandb entity", True, "outputs", "wandb_entity"),
    V("DATA", "str", "mock", "a Megatron dataset prefix (make prepare-data prints it); mock data by default",
      True, "data", "data"),
    V("TOKENIZER_MODEL", "str", "", "the tokenizer folder saved beside DATA", True, "data", "tokenizer_model"),
    V("SPLIT", "str", "949,50,1", "train,valid,test split of DATA", True, "data", "split",
      pattern=r"\d+(\.\d+)?([,/]\d+(\.\d+)?){0,2}", shape="up to three numbers, comma-separated"),
    V("VOCAB_FILE", "str", "", "GPT-2 BPE vocab (DATA without TOKENIZER_MODEL)", True, "data", "vocab_file"),
    V("MERGE_FILE", "str", "", "GPT-2 BPE merges (with VOCAB_FILE)", True, "data", "merge_file"),
    V("NNODES", "int", 1, "nodes of a multi-node run (each runs make <target>)", group="nodes", field="nnodes",
      minimum=1, maximum=4096),
    V("NODE_RANK", "int", 0, "this node's rank (0 to NNODES-1)", group="nodes", field="node_rank", minimum=0),
    V("MASTER_ADDR", "str", "localhost", "torchrun's rendezvous host", group="nodes", field="master_addr",
      pattern=r"[0-9A-Za-z\[][0-9A-Za-z_.:%\[\]-]*", shape="a host name or an IP address"),
    V("MASTER_PORT", "int", None, "torchrun's rendezvous port (default: a free one on one node, 6000 across nodes)",
      group="nodes", field="master_port", minimum=1, maximum=65535, example="29500"),
    V("ALLOW_BUSY_GPUS", "flag", False, "start even where other processes hold GPU memory (the record says so)",
      field="allow_busy_gpus"),
    V("WATCHDOG_SILENT_S", "float", 300.0, "end a run whose log is silent this long after training began (hung)",
      True, field="watchdog_silent_s", positive=True, maximum=MAX_WAIT_S),
    V("WATCHDOG_STARTUP_S", "float", 900.0, "the same before the first iteration", True, field="watchdog_startup_s",
      positive=True, maximum=MAX_WAIT_S),
    V("EXIT_GRACE_S", "float", 120.0, "end a run still alive this long after Megatron's end of training", True,
      field="exit_grace_s", positive=True, maximum=MAX_WAIT_S),
    V("GPUS_PER_NODE", "int", None, "make slurm-<id>: GPUs per node (default 8)", group="slurm", minimum=1,
      maximum=64, example="8"),
    V("SBATCH_ARGS", "str", "", "make slurm-<id>: more sbatch flags (shlex-split)", group="slurm"),
    V("SRUN_ARGS", "str", "", "make slurm-<id>: more srun flags (shlex-split)", group="slurm"),
    V("DOCKER_IMAGE", "str", "megalab", "make docker-build/docker-run: the image tag", group="docker"),
    V("DOCKER_SHM", "size", "16g", "make docker-run: --shm-size", group="docker"),
    V("DOCKER_ARGS", "str", "", "make docker-run: more docker run flags (shlex-split)", group="docker"),
    V("DOCKER_CMD", "str", "bash", "make docker-run: the command to run in the container (shlex-split)",
      group="docker"),
    # Read by one make target (megalab/harness/campaign.py and batch.py, the Makefile's recipes), never by a
    # run's plan; groups campaign, pages, make. Listed so that `make help` shows them and the Makefile takes
    # them literally (its export line).
    V("IDS", "str", "", 'make batch/campaign: the targets, e.g. IDS="101 111"', group="campaign"),
    V("CHAPTER", "int", None, "make campaign: a chapter's targets (0: the two-GPU tour)", group="campaign",
      minimum=0, maximum=999, example="1"),
    V("STALE", "flag", False, "make campaign: only rows short of REPEATS runs of today's code here",
      group="campaign"),
    V("REPEATS", "int", 3, "make campaign: launches of each target, pass after pass", group="campaign", minimum=1,
      maximum=1000),
    V("BUDGET_S", "int", None, "make campaign: start no launch after this many seconds", group="campaign",
      minimum=1, maximum=MAX_WAIT_S * 52, example="1200"),
    V("GPUS", "int", None, "make campaign DRY_RUN=1 (a plan: nothing starts): for N GPUs not here",
      group="campaign", minimum=1, maximum=65536, example="2"),
    V("STRICT", "flag", False, "make tables: refuse rows not of today's code; make check: FAIL is an error",
      group="pages"),
    V("ID", "str", "", "make show-command: the target", group="make"),
    V("GREP", "str", "", "make show-arguments: only the flags matching it", group="make"),
    V("PORT", "int", 6006, "make tensorboard: the port", group="make", minimum=1, maximum=65535),
    V("HOST", "str", "127.0.0.1", "make tensorboard: the address (0.0.0.0: every interface)", group="make"),
    V("BENCH_ARGS", "str", "", 'make bench: more arguments, e.g. "--parts cases --budget-s 500"', group="make"),
    V("DATA_SOURCE", "str", "stas/openwebtext-10k", "make prepare-data: a Hub id, file, glob, folder, python-docs",
      group="make"),
    V("TOKENIZER", "str", "gpt2", "make prepare-data: gpt2, train:N or a tokenizer folder", group="make"),
    V("DATA_PREFIX", "str", "", "make prepare-data: the output prefix", group="make"),
    V("WORKERS", "int", None, "make prepare-data: tokenizer processes (default: all cores)", group="make",
      minimum=1, maximum=1024, example="4"),
    V("LIMIT_DOCS", "int", None, "make prepare-data: only the first N documents", group="make", minimum=1,
      example="1000"),
    V("FORCE", "flag", False, "make prepare-data: rebuild a finished dataset; make tables: write pages that lose "
      "rows, numbers or pages; megalab refresh: rewrite a record that loses measurements (FORCE=1)", group="make"),
    V("VENV", "str", ".venv", "make setup/test: the test venv (without a GPU, PY's default)", group="make"),
    V("TORCH_SPEC", "str", "torch==2.13.0", "make setup: the torch installed where none is importable",
      group="make"),
    V("PY", "str", None, "the Python command of every target (python3; VENV's without a GPU): the one hook",
      group="make"),
)
BY_NAME = {v.name: v for v in VARIABLES}
FORWARDED = tuple(v.name for v in VARIABLES if v.forwarded)  # make slurm-<id> writes these into the script


def raw(name: str, env=os.environ) -> str:
    """The variable's text, empty when unset."""
    return env.get(name, "")


def value(name: str, env=os.environ):
    """The variable parsed by its type (Variable.parse), or its default when unset or empty."""
    return BY_NAME[name].parse(raw(name, env))


def parse(name: str, text) -> object:
    """A value from elsewhere than the environment (a record's config, a command-line option) read as
    the variable reads it: None and "" give the default, any other value its text parsed."""
    return BY_NAME[name].parse("" if text is None else str(text))


def gb_text(gb: float) -> str:
    """GPU_MEM_GB as the entry point reads it (MEGALAB_GPU_MEM_GB) and the preflight shows it: 80.0 -> "80"."""
    return f"{gb:.15g}"


@dataclasses.dataclass
class Options:
    """The make variables a run reads (see `make help`), typed; from_env reads them by the table."""

    iters: int = 100
    warmup: int = 3
    gpu_mem_gb: float | None = None  # nominal GB (memcap.nominal_gb_to_gib), 80 = an H100 80GB
    dry_run: bool = False
    gpu: str | None = None  # GPU=h200: the planning GPU (plan.Machine resolves it)
    outdir: Path = ROOT / "outdir"
    spec: str = "megalab"  # megalab | local
    te: str = "auto"  # auto | 1 | 0
    fast: tuple[str, ...] | None = None  # megalab's TE-free speed-ups (lever names): None = the default for the spec
    cuda_graph: str = "auto"  # auto | 1 | 0 (plan.py decides, with a reason)
    extra_args: tuple[str, ...] = ()  # EXTRA_ARGS as argv items, split once (shlex), never through a shell
    megatron_lm: str = ""
    verbose: bool = False
    save: bool = False
    save_interval: int | None = None
    load: Path | None = None
    wandb: bool = False
    wandb_project: str = "megalab"
    wandb_entity: str = ""
    data: str = "mock"
    tokenizer_model: str = ""
    split: str = "949,50,1"
    vocab_file: str = ""
    merge_file: str = ""
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "localhost"
    master_port: int | None = None  # None: torchrun --standalone picks one on one node, 6000 across nodes (ports.py)
    allow_busy_gpus: bool = False
    watchdog_silent_s: float = 300.0
    watchdog_startup_s: float = 900.0
    exit_grace_s: float = 120.0
    profile: bool = False  # profile-<id>: a torch profiler trace (not a make variable)
    exit_interval: int | None = dataclasses.field(default=None, metadata={"minimum": 1})  # stop early (resume-<id>)

    def __post_init__(self):  # text belongs at the edge (from_env, parse): a str here would be read char by char
        if isinstance(self.extra_args, str) or isinstance(self.gpu_mem_gb, str) or isinstance(self.fast, str):
            raise TypeError("Options.extra_args is a tuple of argv items, fast a tuple of lever names and gpu_mem_gb "
                            "a float; parse text with variables.parse('EXTRA_ARGS' / 'FAST' / 'GPU_MEM_GB', text)")

    @property
    def extra_args_text(self) -> str:
        """EXTRA_ARGS as one shell word list again (the record keeps it so; the bench keys runs on it)."""
        return shlex.join(self.extra_args)

    @classmethod
    def from_env(cls, env=os.environ) -> "Options":
        """Every variable of the table parsed and checked (a bad one is one line before anything runs),
        then the Options fields among them, and the rules between two variables."""
        values = {v.name: value(v.name, env) for v in VARIABLES}
        opts = cls(**{v.field: values[v.name] for v in VARIABLES if v.field})
        if opts.node_rank >= opts.nnodes:
            raise LaunchError(f"NODE_RANK={opts.node_rank}: must be below NNODES={opts.nnodes} (ranks 0 to "
                              f"{opts.nnodes - 1}); fix: NODE_RANK=0 on the first node, 1 on the next, ...")
        try:
            bad = "not a folder" if opts.outdir.exists() and not opts.outdir.is_dir() else None
        except OSError as e:  # a name too long, a link loop
            bad = f"unusable ({e.strerror or e})"
        if bad:
            raise LaunchError(f"OUTDIR={_shown(str(opts.outdir))[:200]}: {bad}; fix: a folder for the run folders, "
                              "e.g. OUTDIR=outdir (it is made when missing)")
        if raw("WARMUP", env) and opts.warmup >= opts.iters:  # the default 3 may exceed a short ITERS: no median then
            raise LaunchError(f"WARMUP={opts.warmup}: must be below ITERS={opts.iters} (the step time is the median "
                              f"of the iterations after it); fix: e.g. WARMUP=3 with ITERS=20")
        return opts


def help_lines() -> list[str]:
    """`make help`'s variable list, by group."""
    out, width = [], max(len(v.name) for v in VARIABLES) + 2
    for group in dict.fromkeys(v.group for v in VARIABLES):
        out.append(f"Variables ({group}):")
        for v in (v for v in VARIABLES if v.group == group):
            default = "" if not v.default else f" [{Path(v.default).name if v.type == 'path' else v.default}]"
            out.append(f"  {v.name:<{width}}{v.help}{default}")
    return out


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help="only these variables (FAST: the lever table)")
    p.add_argument("--names", dest="list_names", action="store_true", help="the names only, on one line")


def main(args) -> int:
    """`python -m megalab variables`: the table, as `make help` prints it; `variables FAST` (make help FAST): one
    variable, the lever table for FAST."""
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        raise LaunchError(f"make help {unknown[0]}: not a make variable; fix: `make help` lists them")
    if args.list_names:
        print(" ".join(v.name for v in VARIABLES))
    elif args.names:
        width = max(len(n) for n in args.names) + 2
        print("\n".join(leverdoc.text() if n == "FAST" else f"  {n:<{width}}{BY_NAME[n].help}" for n in args.names))
    else:
        print("\n".join(help_lines()))
    return 0
