"""The run record's schema: what a run.json holds, typed, and the one door every record comes in by.

A record is what the launcher wrote at the end of a run (megalab/harness/record.py builds a RunRecord
and writes its dump). Schema 1 (the records from before runs kept their plan) holds the measurements,
the config and provenance; schema 2 adds `intent` (the resolved run plan) and `observed` (what the
entry point's `megalab: transformer_impl=...` line said actually ran). `migrate` reads any schema as
today's fields; a schema-1 record's `observed` is read from the raw log beside it when asked
(`RunRecord.ran`).

Pydantic v2, because a record is JSON from disk that must be judged field by field: its errors carry
the field's location (`notes: Input should be a valid list`), which is the one line a reader prints
before skipping the file, and the same model dumps what the launcher writes, so a written record is a
validated one. Known fields are typed (numbers finite, never text or bools; `status` one of STATUSES);
fields this schema does not know load as they are (history: older launchers wrote some). A field a
record lacks is None (or empty): old records lack many.

GPU_MEM_GB was written as text ("80") and is a number now: `config.gpu_mem_gb` reads either as a float,
so an old record and a new one of the same cap compare equal.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import re
import types
import typing
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      PlainValidator, PrivateAttr, Strict, ValidationError, WrapValidator, create_model)

from megalab.core import infile, logparse
from megalab.core.catalog import Experiment
from megalab.core.variables import VARIABLES, Options
from megalab.core.gpus import DEFAULT_GPU_NAME, default_gpu
from megalab.runtime import levers

SCHEMA = 2  # what the launcher writes now

STATUSES = ("ok", "oom", "failed", "incomplete", "killed", "hung", "oom_busy")
USABLE = ("ok", "oom")  # statuses preferred when picking a target's record
MEASURED = ("ok", "incomplete")  # statuses whose step times are measurements (an oom/failed/killed run has none)
# A target as records name it: a catalog id (catalog.ID_PATTERN), or its bench or profile variant (101-x.gbs4)
TARGET = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")
# A run's folder, as pages link it: the launcher's TIME___TARGET (a test's or a user's own name of these characters)
RUN_FOLDER = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]*")
FUTURE_S = 86400  # a record may start this far ahead of this machine's clock (another machine's clock) and no more


class RecordError(ValueError):
    """A run.json that is no valid record: one line naming the field (or why the file is unreadable)."""


# --------------------------------------------------------------------------- field types

def _finite(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"not a number ({_short(v)})")
    if not math.isfinite(v):
        raise ValueError(f"not a finite number ({v})")
    return v


def _amount(v: Any) -> float:
    v = _finite(v)
    if v < 0:
        raise ValueError(f"a measurement is never negative ({v})")
    return v


def _cap(v: Any) -> Any:
    """GPU_MEM_GB as written: text ("80", schema 1 and 2 launchers) or a number; '' is no cap."""
    if isinstance(v, str):
        if not v.strip():
            return None
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"not a number of GB ({_short(v)})") from None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not v > 0:
        raise ValueError(f"a memory cap is above 0 GB ({v})")
    return v


class LeverNames(tuple):
    """A run's fast-path levers (megalab/runtime/levers.py), as a tuple of names. Records from before lists wrote
    them as MEGALAB_FAST's text ("a,b", "none"): read as names, and kept as written (`written`), so that a record
    rewritten (megalab refresh) keeps its shape; a new record writes a list."""
    written: str | None = None


def lever_names(v: Any) -> LeverNames:
    if isinstance(v, str):  # MEGALAB_FAST's text; a name no longer in the table is kept (history), `all` read as it was
        names = LeverNames(levers.NAMES if v.strip() == "all" else (n for n in v.split(",") if n and n != "none"))
        names.written = v
        return names
    if isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v):
        return LeverNames(v)
    raise ValueError(f"not a list of lever names ({_short(v)})")


def _inside(v: str) -> str:
    """A file of the record's folder: a relative path that stays inside it (a record names its log and
    memory CSV; every reader opens them, so /dev/zero or ../../x would be read in its place)."""
    p = PurePosixPath(v)
    if not v or p.is_absolute() or ".." in p.parts or "\\" in v or "\x00" in v:
        raise ValueError(f"not a file of the run's folder ({_short(v)}): a relative path inside it")
    return v


# A git commit id as the launcher writes it (`-dirty`: the run code had uncommitted changes): what git is asked about
COMMIT = re.compile(r"[0-9a-fA-F]{4,64}(-dirty)?")


def _commit(v: str) -> str:
    if not COMMIT.fullmatch(v):  # git reads a value that starts with '-' as its own option
        raise ValueError(f"not a git commit id ({_short(v)}): hexadecimal, `-dirty` after it where the tree was")
    return v


def _target(v: str) -> str:
    if not TARGET.fullmatch(v):
        raise ValueError(f"not a target id ({_short(v)}): letters, digits, '.', '_' and '-', a letter or digit first")
    return v


def _iso(v: str) -> str:
    try:
        dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO time ({_short(v)})") from None
    return v


_NUMBERED = re.compile(r"(?:profile-|resume-)?((\d+)[^.]*)(?:\..*)?")  # a catalog id (its number first), its variants


def _contradicts(named: str, target: str) -> bool:
    """Whether a run folder's target NAMED (TIME___NAMED) is another than the record's TARGET: another catalog
    number, or another full id ('101' names 101-gpt2xl-...; a name of no number, a test's 'good', names none)."""
    a, b = _NUMBERED.fullmatch(named), _NUMBERED.fullmatch(target)
    if named == target or not (a and b):
        return False
    return a.group(2) != b.group(2) or (a.group(1) != a.group(2) and a.group(1) != b.group(1))


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# A finite number, kept as written (an int stays an int in the JSON: records are rewritten byte-alike).
Num = Annotated[float, PlainValidator(_finite), PlainSerializer(lambda v: v, return_type=Any)]
# A measured amount (a time, memory, a rate): finite and never negative.
Amount = Annotated[float, PlainValidator(_amount), PlainSerializer(lambda v: v, return_type=Any)]


def _amounts(v: Any, each) -> list:
    """A list of plain finite numbers, none negative, checked in one pass (a damaged record may hold 100,000 of
    them: 19 ms a read item by item, 7 in one pass); anything else item by item (EACH), so that an error names
    its item."""
    if type(v) is list and all((type(x) is float or type(x) is int) and x >= 0 and math.isfinite(x) for x in v):
        return list(v)
    return each(v)


# Amounts measured per GPU (peak memory, baseline)
Amounts = Annotated[list[Amount], WrapValidator(_amounts)]

Int = Annotated[int, Strict()]  # an int: not 3.0, "3" or True
Count = Annotated[int, Strict(), Field(ge=0)]  # how many, an index, a rank
Size = Annotated[int, Strict(), Field(ge=1)]  # a layout's size (GPUs, batch, TP, ...): a divisor somewhere
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Time = Annotated[str, Strict(), AfterValidator(_iso)]
GB = Annotated[Union[Num, None], BeforeValidator(_cap)]
Levers = Annotated[tuple[str, ...], PlainValidator(lever_names),
                   PlainSerializer(lambda v: v.written if getattr(v, "written", None) is not None else list(v),
                                   return_type=Any)]
InFolder = Annotated[str, Strict(), AfterValidator(_inside)]
Commit = Annotated[str, Strict(), AfterValidator(_commit)]


class _Part(BaseModel):
    """A part of a record: fields this schema does not know are kept (history), known ones typed."""
    model_config = ConfigDict(frozen=True, extra="allow")


# --------------------------------------------------------------------------- the parts

class _Strict(_Part):
    model_config = ConfigDict(frozen=True, extra="allow", strict=True)


def _optional(f) -> tuple[Any, None]:
    """A model field as a record keeps it: its type and range, None where the record does not say."""
    kind = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
    return kind | None, None


def _setting(name: str) -> tuple[Any, None]:
    """An Options field as a record keeps it: Options' type, the make variable's range (variables.VARIABLES; a field
    of no variable: its own metadata), None where the record does not say."""
    hint = typing.get_type_hints(Options)[name]
    kind = next(t for t in (*typing.get_args(hint), hint) if t is not type(None) and not typing.get_args(t))
    var = next((v for v in VARIABLES if v.field == name), None)
    meta = {f.name: f.metadata for f in dataclasses.fields(Options)}[name]
    low = var.minimum if var else meta.get("minimum")
    return Annotated[kind, Field(ge=low, le=var.maximum if var else None)] | None, None


# What was run: the catalog entry (catalog.Experiment's fields: the entry's own extra flags are catalog_extra_args,
# extra_args is the user's EXTRA_ARGS) and the launch's settings (Options' fields, and what the plan resolved).
Config = create_model(
    "Config", __base__=_Strict, __module__=__name__,
    **{n: _optional(f) for n, f in Experiment.model_fields.items() if n != "extra_args"},
    extra_args=(Str | None, None),
    dp=(Size | None, None), grad_accum=(Size | None, None),
    model_preset=(dict[str, Any] | None, None),  # the model as built (the preset with EXTRA_ARGS' model flags)
    iters=_setting("iters"),
    warmup=_setting("warmup"),  # the WARMUP setting (records from before it was kept: see warmup_iters)
    gpu_mem_gb=(GB, None),  # the GPU_MEM_GB cap (None: uncapped); older records wrote it as text
    transformer_impl=(Str | None, None), spec=_setting("spec"), nnodes=_setting("nnodes"),
    node_rank=_setting("node_rank"), catalog_extra_args=(list[Str] | None, None), fastpath=(Levers | None, None),
    cuda_graph=(Bool | None, None), data=_setting("data"), dropped_flags=(list[Str] | None, None),
    substituted_flags=(dict[str, Str] | None, None), save=_setting("save"), save_interval=_setting("save_interval"),
    load=(Str | None, None), exit_interval=_setting("exit_interval"), wandb=(dict[str, Any] | None, None),
    profile=_setting("profile"), cp_impl=(Str | None, None),
)


class Machine(_Part):
    """The machine a run is planned for (megalab/core/plan.py makes it: plan.machine): the GPUs found (None: not
    counted), Transformer Engine's version, and the GPU the plan is for: its NVML name and the memory a run may use
    (GiB; GPU_MEM_GB's cap applied). Without a GPU that is the planning GPU (GPU=h200; default the H100 80GB, or with
    GPU_MEM_GB the smallest card holding it); `warning` says where GPU= contradicts the GPU present. A record that
    does not say reads as the default GPU."""
    gpus: Count | None = None
    te: Str | None = None
    gpu_name: Str | None = DEFAULT_GPU_NAME
    gpu_memory_gib: Amount | None = default_gpu().memory_gib
    warning: Str | None = None


class Intent(_Part):
    """Schema 2: the resolved run plan (megalab/core/plan.py's RunPlan is an Intent, with what it was made from)."""
    target: Str | None = None
    impl: Str | None = None
    spec: Str | None = None
    fastpath: Levers | None = None
    substituted_flags: dict[str, Str] = {}
    dropped_flags: list[Str] = []
    cuda_graph: Bool | None = None
    cuda_graph_reason: Str | None = None
    gpus: Size | None = None
    nnodes: Size | None = None
    node_rank: Count | None = None
    gpus_per_node: Size | None = None
    master_addr: Str | None = None
    master_port: Annotated[int, Strict(), Field(ge=1, le=65535)] | None = None
    machine: Machine = Machine()
    run_dir: Str | None = None
    argv: list[Str] = []
    groups: dict[str, list[Str]] = {}
    env: dict[str, Str] = {}


class Observed(_Part):
    """What the entry point said it ran (its `megalab: k=v` lines): text, as logged."""
    transformer_impl: Str | None = None
    spec: Str | None = None
    transformer_engine: Str | None = None
    fastpath: Levers | None = None
    cp: Str | None = None
    moe_experts: Str | None = None
    cuda_graphs_released: Str | None = None


class Versions(_Part):
    megalab_commit: Commit | None = None
    megatron_core: Str | None = None
    torch: Str | None = None
    transformer_engine: Str | None = None
    cuda: Str | None = None
    driver: Str | None = None
    python: Str | None = None


class Files(_Part):
    """The files beside the record, relative to its folder (and inside it)."""
    log: InFolder = "logs.txt"
    memory: InFolder | None = None
    traces: list[InFolder] = []


class Breakdown(_Part):
    """A step split by Megatron's timers (ms, medians): logparse.breakdown."""
    forward: Num
    backward: Num
    optimizer: Num
    other: Num


class ResumeCheck(_Part):
    """`make resume-<id>`: does launch 2 go on where launch 1 saved (harness/resume.py check)."""
    stop_at: Int | None = None
    saved_last_iteration: Int | None = None
    saved_first_loss: Num | None = None
    saved_last_loss: Num | None = None
    resumed_first_iteration: Int | None = None
    resumed_first_loss: Num | None = None
    loss_jump: Num | None = None
    ok: Bool = False
    why: Str | None = None

    @property
    def verdict(self) -> str:
        """ok, inconclusive (the logs cannot tell a resume from a restart) or FAIL."""
        return resume_verdict(self.ok, self.why)


RESUME_INCONCLUSIVE = "inconclusive"  # the start of a resume check's why where its logs cannot tell


def resume_verdict(ok: bool, why: str | None) -> str:
    """The word a resume check's line and the data page start with."""
    return "ok" if ok else (RESUME_INCONCLUSIVE if (why or "").startswith(RESUME_INCONCLUSIVE) else "FAIL")


class Repeats(BaseModel):
    """Spread across repeated runs of one target with one setup (records.repeats): never written."""
    model_config = ConfigDict(frozen=True)
    n: int
    median_ms: float
    lo_ms: float
    hi_ms: float
    runs: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the record

class RunRecord(_Part):
    """One run.json. Fields in the order the launcher writes them (a dump keeps that order)."""
    # the schema the file was written in (migrate reads any): `schema` in the file, RunRecord.schema here
    schema_: Annotated[int, Strict(), Field(ge=1)] = Field(1, alias="schema")
    target: Annotated[str, Strict(), AfterValidator(_target)]
    status: Literal[STATUSES]
    returncode: Int | None = None
    # how the run ended, when the launcher ended it: killed (a signal), hung or exit_hang (watchdog)
    ended_by: Str | None = None
    end_detail: Str | None = None
    busy_gpus: list[dict[str, Any]] = []  # what the preflight found in use when ALLOW_BUSY_GPUS=1 let it start
    step_ms_median: Amount | None = None
    step_ms_p10: Amount | None = None
    step_ms_p90: Amount | None = None
    step_ms_min: Amount | None = None
    step_ms_max: Amount | None = None
    step_count: Count | None = None
    warmup_iters: Count | None = None  # the steps dropped as warm-up
    tflops_per_gpu: Amount | None = None
    loss_first: Num | None = None
    loss_last: Num | None = None
    iters_logged: Count | None = None
    train_iters: Count | None = None
    megatron_mem: dict[str, Amount] | None = None
    megatron_mem_by_rank: dict[Annotated[int, Field(ge=0)], dict[str, Amount]] = {}
    theoretical_mem_mb: dict[str, Amount] | None = None
    params_total: Count | None = None
    timers_ms: dict[str, Amount] | None = None
    breakdown_ms: Breakdown | None = None
    oom_rank: Count | None = None
    error: Str | None = None
    missing: list[Str] = []
    notes: list[Str] = []  # e.g. "exit_hang: ..." (finished, then hung at exit), "busy_gpus: ..."
    mfu: Amount | None = None
    mem_peak_mib: Amounts = []  # NVML peak per GPU
    mem_peak_gib: Amounts = []
    peak_tflops: Amount | None = None
    mem_baseline_mib: Amounts = []
    mem_samples: Count | None = None
    monitor_error: Str | None = None
    gpu_name: Str | None = None
    num_gpus: Size | None = None
    gpus_on_node: Count | None = None  # observed: 0 on a machine without GPUs (a run that failed there)
    gpu_uuids: list[Str] | None = None  # the physical GPUs: what tells two hosts apart (provenance)
    node_gpu_uuids: list[Str] | None = None  # every GPU of the node, visible or not: runs that may share it
    cuda_visible_devices: Str | None = None
    gpu_memory_mib: Amount | None = None
    hostname: Str | None = None
    started: Time | None = None
    ended: Time | None = None
    duration_s: Amount | None = None
    preflight_s: Amount | None = None  # the launcher's checks before `started`
    command: Str | None = None
    config: Config = Config()
    intent: Intent | None = None
    observed: Observed | None = None
    versions: Versions = Versions()
    files: Files = Files()
    resume_check: ResumeCheck | None = None
    refreshed: list[dict[str, Any]] = []  # `megalab refresh`: when the measured fields were derived again
    fixture: Bool = False  # a test's hand-made record (tests/fixtures)
    fixture_note: Str | None = None

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    # not in the file: where it was read from, and what load_records found around it
    _run_dir: Path | None = PrivateAttr(default=None)
    _runs: Repeats | None = PrivateAttr(default=None)
    _concurrent: tuple[str, ...] = PrivateAttr(default=())

    # ---- in and out --------------------------------------------------------------------------------
    @classmethod
    def of(cls, raw: dict, run_dir: Path | None = None) -> RunRecord:
        """A record from its parsed JSON (any schema); RecordError naming the field when it is none."""
        if not isinstance(raw, dict):
            raise RecordError(f"not a JSON object (a {type(raw).__name__})")
        try:
            rec = cls.model_validate(migrate(raw))
        except ValidationError as e:
            raise RecordError(why(e)) from None
        rec._run_dir = None if run_dir is None else Path(run_dir)
        return rec

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """ROOT/…/run.json; RecordError (one line: the field, or why the file is unreadable). The file comes
        in by core/infile.py: a regular file of at most infile.RECORD_LIMIT bytes (never a FIFO that
        blocks, nor /dev/zero); a NaN or Infinity in it is named by the field that holds it."""
        path = Path(path)
        try:
            data = infile.read(path, infile.RECORD_LIMIT)
        except infile.InputError as e:
            raise RecordError(e.reason) from None
        if len(data) > _PARSED_MAX:
            got = cls._parse(data, path.parent)
        else:
            got = _parsed(cls, data, str(path.parent))
        if isinstance(got, str):
            raise RecordError(got)
        if problem := got.misplaced(path.parent.name):
            raise RecordError(problem)
        return got

    def misplaced(self, folder: str, now: float | None = None) -> str | None:
        """Why this record cannot be the run of its folder FOLDER (the launcher's TIME___TARGET), or None: a
        folder name a page cannot link (a space, a bracket, markup), a target other than the folder's, or a start
        in the future (a wrong clock would make it every other run's newest for good)."""
        if not RUN_FOLDER.fullmatch(folder):
            return (f"its folder name {_short(folder)} is not a run folder's (letters, digits, '.', '_', '+', '-'); "
                    "fix: rename the folder TIME___TARGET, as the launcher names it")
        named = folder.rpartition("___")[2] if "___" in folder else ""
        if _contradicts(named, self.target):
            return (f"target: {self.target} is not its folder's ({named}); fix: mend `target`, or move the record "
                    f"to a folder named for its target (TIME___{self.target})")
        now = dt.datetime.now(dt.timezone.utc).timestamp() if now is None else now
        if stamp(self.started) > now + FUTURE_S:
            return (f"started: {self.started} is in the future; fix: mend `started` (the run's clock was wrong?) "
                    "or remove the record")
        return None

    @classmethod
    def _parse(cls, data: bytes, run_dir: Path) -> RunRecord:
        try:
            raw = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise RecordError("not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise RecordError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except RecursionError:
            raise RecordError("not JSON a record could be (nested too deeply)") from None
        return cls.of(raw, run_dir)

    def dump(self, like: dict | None = None) -> dict:
        """The record as JSON-ready data, with the fields it was given: in schema order (unknown ones last),
        or in the key order of LIKE (the dict it was validated from), so a rewritten file keeps its shape."""
        out = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return out if like is None else _ordered(out, like)

    def grouped(self, runs: Repeats | None, concurrent: tuple[str, ...] | list[str] = ()) -> RunRecord:
        """This record as a table row sees it: the repeats of its measurement and the runs beside it."""
        out = self.model_copy()
        out._runs, out._concurrent = runs, tuple(concurrent)
        return out

    # ---- what load_records adds --------------------------------------------------------------------
    @property
    def schema(self) -> int:
        return self.schema_

    @property
    def run_dir(self) -> Path | None:
        """The folder it was read from (None for a record made in memory)."""
        return self._run_dir

    @property
    def runs(self) -> Repeats | None:
        """Spread across repeated runs (records.repeats), set by load_records; None for one run."""
        return self._runs if self._runs is not None and self._runs.n >= 2 else None

    @property
    def concurrent(self) -> tuple[str, ...]:
        """Targets of the runs that shared its host while it ran (records.mark_shared)."""
        return self._concurrent

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def measured(self) -> tuple[float | None, ...]:
        """(median ms, p10, p90, TFLOP/s/GPU, MFU); all None unless the steps are valid (MEASURED). The
        median is the median of the runs' medians where repeats exist (`runs`); the rest are this run's."""
        if self.status not in MEASURED:
            return (None,) * 5
        return (self.step_ms, self.step_ms_p10, self.step_ms_p90, self.tflops_per_gpu, self.mfu)

    @property
    def step_ms(self) -> float | None:
        """The row's step time: the median of the runs' medians where repeats exist, else this run's."""
        if self.status not in MEASURED:
            return None
        return self.runs.median_ms if self.runs else self.step_ms_median

    @property
    def gpu_mem_cap(self) -> float | None:
        """The GPU_MEM_GB the run was capped to (None when uncapped)."""
        return self.config.gpu_mem_gb

    @property
    def transformer_impl(self) -> str | None:
        """What ran: the entry point's own word where known, else what the launcher asked for."""
        return (self.ran.transformer_impl if self.ran else None) or self.config.transformer_impl

    @property
    def fastpath(self) -> tuple[str, ...] | None:
        """The fast path the launcher resolved (intent), else what the config says (None: the record does not say)."""
        resolved = self.intent.fastpath if self.intent else None
        return resolved if resolved is not None else self.config.fastpath

    @property
    def log_path(self) -> Path | None:
        """The raw log (logparse.log_file: gzipped under results/); read it with logparse.read_log."""
        return None if self.run_dir is None else logparse.log_file(self.run_dir / self.files.log)

    @cached_property
    def ran(self) -> Observed | None:
        """What the entry point reported it ran: schema 2 stores it (`observed`), schema 1's is read from
        the raw log beside the record (None when that log or line is not there)."""
        if self.observed is not None or self.log_path is None:
            return self.observed
        try:
            lines = logparse.megalab_lines(logparse.read_log(self.log_path))
        except OSError:
            return None
        return Observed.model_validate(lines) if lines else None

    @property
    def window(self) -> tuple[float, float] | None:
        """(start, end) in epoch seconds, when both are known."""
        start, end = stamp(self.started), stamp(self.ended)
        return (start, end) if start > float("-inf") and end > float("-inf") else None

    def value(self, path: str) -> Any:
        """A field by its dotted name (`mem_peak_gib`, `megatron_mem.max_allocated_mb`): what
        configs/checks.yaml names; None where the record has no such value."""
        v: Any = self
        for part in path.split("."):
            if isinstance(v, BaseModel):
                name = "schema_" if part == "schema" else part
                v = getattr(v, name, None) if name in type(v).model_fields else (v.model_extra or {}).get(part)
            elif isinstance(v, dict):
                v = v.get(part)
            else:
                return None
        return v


def field_known(path: str) -> bool:
    """Whether a dotted name can address a record field: each part a field of the model it is in (a
    part of a mapping field, e.g. megatron_mem.max_allocated_mb, may be any key)."""
    model: Any = RunRecord
    parts = path.split(".")
    for i, part in enumerate(parts):
        name = "schema_" if part == "schema" and model is RunRecord else part
        if name not in model.model_fields:
            return False
        kinds = _types(model.model_fields[name].annotation)
        sub = [t for t in kinds if isinstance(t, type) and issubclass(t, BaseModel)]
        if sub:
            model = sub[0]
        elif any(t is dict or getattr(t, "__origin__", None) is dict for t in kinds):
            return True  # a mapping: any key below it
        else:
            return i == len(parts) - 1  # a value: nothing below it
    return True


def _types(ann: Any) -> list[Any]:
    """The types an annotation admits (Optional and Annotated unwrapped)."""
    if getattr(ann, "__metadata__", None) is not None:  # Annotated[T, ...]
        return _types(ann.__origin__)
    if typing.get_origin(ann) in (Union, types.UnionType):
        return [t for a in typing.get_args(ann) for t in _types(a)]
    return [ann]


def migrate(raw: dict) -> dict:
    """A record of any schema as today's fields; RecordError for a schema newer than this code reads.

    Schema 1 -> 2: the launcher kept no plan (`intent`) and no word of what ran (`observed`): both read
    as None (a schema-1 record holding either is refused); what ran is read from the raw log beside the
    record on demand (RunRecord.ran).
    Fields every schema grew over time (notes, busy_gpus, preflight_s, config.warmup, ...) are absent
    in older records and read as None or empty; config.gpu_mem_gb, text in schemas 1 and 2, reads as a
    number (the field type). A record without `schema` is schema 1.
    """
    version = raw.get("schema", 1)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA:
        raise RecordError(f"schema: {version} is newer than this megalab reads ({SCHEMA}); fix: update megalab")
    if version == 1 and (raw.get("intent") is not None or raw.get("observed") is not None):
        raise RecordError("intent: a schema-1 record has no plan; fix: set `schema` to the version that wrote it")
    return raw  # nothing else was renamed or retyped between schema 1 and 2


def _ordered(out: Any, like: Any) -> Any:
    """OUT with its mappings' keys in LIKE's order where LIKE has them (the rest after)."""
    if not (isinstance(out, dict) and isinstance(like, dict)):
        return out
    keys = [k for k in like if k in out] + [k for k in out if k not in like]
    return {k: _ordered(out[k], like.get(k)) for k in keys}


def why(e: ValidationError) -> str:
    """One line from a pydantic error: the first problem's field and what is wrong (and how many more)."""
    errs = e.errors()
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"] if p != "[key]") or "record"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {msg}{more}"


def stamp(s: Any) -> float:
    """An ISO time of a record as seconds since the epoch; -inf if absent or unreadable."""
    if not isinstance(s, str):
        return float("-inf")
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return float("-inf")
    if t.tzinfo is None:  # records are written in UTC; a naive stamp is read as UTC too
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def finite_or_none(obj: Any) -> Any:
    """OBJ with every non-finite float (a diverged loss) as None: JSON has no NaN, and a record that held
    one would be refused by every reader."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


# A record file's bytes -> its RunRecord (or why it is none), parsed once per process: a page build reads each
# record several times (the rows, the runs beside them, the dataset, the index). The key is the content, so a
# file that changed is parsed anew; records are frozen and readers copy what they change (grouped()); a file
# over _PARSED_MAX bytes is parsed each time, never kept. Room for several times the committed records (1,203 in
# November 2026): a build reads them all in the same order again and again, and an LRU cache smaller than that
# evicts each one just before it is read again (it kept none at 1,024).
_PARSED_MAX = 1 << 20


@functools.lru_cache(maxsize=8192)
def _parsed(cls, data: bytes, run_dir: str):
    try:
        return cls._parse(data, Path(run_dir))
    except RecordError as e:
        return str(e)
