"""The experiment catalog: every make target is one entry of configs/experiments/*.yaml.

A target is a model preset (configs/models.yaml) plus the few numbers that make it a lesson
(GPUs, batch sizes, parallel layout). Everything a run needs is derived here, in one place:
data-parallel size, gradient-accumulation steps, and the checks Megatron would otherwise make
only after a 40-second start-up.

The files are typed at the edge (pydantic, as the run record and checks.yaml are): a chapter file is a
ChapterFile, each entry an Experiment (strict: the model the plan and the run record's config read too),
each preset a Preset. A
wrong type, an unknown or missing key, a number out of its range (a size of 0 would divide by zero deep
in a plan) is one CatalogError line naming the file, the entry and the field; so is a layout Megatron
would reject (Experiment.validate, run on every entry as it is loaded), a chapter number, a target id or
a results page that two entries or files share. The YAML itself comes in by core/yamlfile.py (a regular
file, UTF-8, no key given twice, no alias bomb).
"""
from __future__ import annotations

import re
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from megalab.core import yamlfile
from megalab.core.infile import InputError
from megalab.core.paths import CONFIGS, ROOT  # noqa: F401 (catalog.ROOT: callers and tests)


class CatalogError(ValueError):
    """A one-line, user-facing problem with a target or its layout (message says the fix)."""


# a size: 0 or less divides by zero somewhere; past 32 bits no GPU count, batch or model size of this lab goes,
# and torch's and NCCL's 32-bit sizes would overflow
Size = typing.Annotated[int, Field(ge=1, le=2**31 - 1)]


class Experiment(BaseModel):
    """One target: a catalog entry as written (strict: a quoted "2" is no GPU count; every size at least 1), and
    everything derived from it. The run record's config holds these fields too (schema.Config is made from them)."""
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    id: str
    chapter: typing.Annotated[int, Field(ge=0)]
    about: str
    model: str
    gpus: Size
    gbs: Size
    mbs: Size = 1
    tp: Size = 1
    pp: Size = 1
    cp: Size = 1
    ep: Size = 1
    etp: Size = 1
    # Megatron's --num-layers-per-virtual-pipeline-stage (None: no virtual pipeline)
    layers_per_virtual_stage: Size | None = None
    cp_comm: str | None = None
    sp: bool = False
    zero2: bool = False
    recompute: str = "none"  # none | selective | full-uniform-N
    num_experts: Size | None = None
    topk: Size | None = None  # router top-k; None: the preset's moe_router_topk
    # Megatron's --timing-log-level: 2 reports per-microbatch forward/backward timers (profile-* targets)
    timing_log_level: typing.Annotated[int, Field(ge=0, le=2)] = 0
    ref: str | None = None  # row id in configs/reference/anchor_8xh100.csv (this chapter)
    analogue_of: str | None = None  # reference row this stand-in on the GPUs the rig lends (1 or 2) illustrates
    extra_args: tuple[str, ...] = ()

    # ---- derived -------------------------------------------------------------------------
    @property
    def model_cfg(self) -> dict[str, Any]:
        return models()[self.model]

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.gpus // self.model_parallel

    @property
    def grad_accum(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def seq_length(self) -> int:
        return int(self.model_cfg["seq_length"])

    @property
    def num_microbatches(self) -> int:
        return self.grad_accum

    @property
    def router_topk(self) -> int | None:
        return self.topk or self.model_cfg.get("moe_router_topk")

    @property
    def virtual_stages(self) -> int | None:
        """Virtual pipeline stages per device (Megatron's virtual_pipeline_model_parallel_size)."""
        if not self.layers_per_virtual_stage:
            return None
        return self.model_cfg["num_layers"] // self.pp // self.layers_per_virtual_stage

    def validate(self) -> None:
        """Raise CatalogError for a layout Megatron would reject (same arithmetic, said earlier)."""
        m = self.model_cfg
        where = f"target {self.id}"
        if self.gpus % self.model_parallel:
            raise CatalogError(
                f"{where}: {self.gpus} GPUs is not divisible by TP x PP x CP = {self.model_parallel}; "
                f"fix: choose gpus as a multiple of {self.model_parallel}")
        if self.gbs % (self.mbs * self.dp):
            raise CatalogError(
                f"{where}: global batch {self.gbs} is not divisible by micro batch x DP = "
                f"{self.mbs} x {self.dp}; fix: use a GBS that is a multiple of {self.mbs * self.dp}")
        if m["num_attention_heads"] % self.tp:
            raise CatalogError(
                f"{where}: {m['num_attention_heads']} attention heads cannot be split over TP={self.tp}; "
                f"fix: pick a TP that divides {m['num_attention_heads']}")
        groups = m.get("num_query_groups")
        if groups and (m["num_attention_heads"] % groups or groups % self.tp):
            raise CatalogError(
                f"{where}: {groups} query groups must divide {m['num_attention_heads']} heads and split over "
                f"TP={self.tp}; fix: pick a TP that divides {groups} (Megatron splits K/V groups over TP)")
        if m["num_layers"] % self.pp:
            raise CatalogError(
                f"{where}: {m['num_layers']} layers cannot be split over PP={self.pp}; "
                f"fix: pick a PP that divides {m['num_layers']}")
        if self.layers_per_virtual_stage:
            per_stage = m["num_layers"] // self.pp
            if self.pp < 2 or per_stage % self.layers_per_virtual_stage:
                raise CatalogError(
                    f"{where}: {per_stage} layers per pipeline stage cannot be cut into virtual stages "
                    f"of {self.layers_per_virtual_stage}; fix: use a divisor of {per_stage} (and PP >= 2)")
        if self.layers_per_virtual_stage and self.num_microbatches % self.pp:
            raise CatalogError(
                f"{where}: the interleaved (virtual) pipeline schedule needs a number of microbatches that is a "
                f"multiple of PP={self.pp}, got {self.num_microbatches}; fix: change gbs or mbs")
        if self.sp and self.tp < 2:
            raise CatalogError(f"{where}: sequence parallel needs TP >= 2; fix: set tp >= 2 or drop sp")
        if self.seq_length % (2 * self.cp) and self.cp > 1:
            raise CatalogError(
                f"{where}: sequence {self.seq_length} must divide into 2 x CP = {2 * self.cp} chunks; "
                f"fix: choose a sequence length that is a multiple of {2 * self.cp}")
        self._validate_cp(where)
        self._validate_moe(where)
        if not re.fullmatch(r"none|selective|full-(uniform|block)-\d+", self.recompute):
            raise CatalogError(
                f"{where}: recompute '{self.recompute}' is not one of none, selective, full-uniform-N, "
                f"full-block-N; fix the catalog entry")

    def _validate_cp(self, where: str) -> None:
        if self.cp_comm is not None and self.cp_comm not in CP_COMM_TYPES:
            raise CatalogError(f"{where}: cp_comm '{self.cp_comm}' is not one of Megatron's --cp-comm-type "
                               f"values ({', '.join(CP_COMM_TYPES)}); fix the catalog entry")
        heads = self.model_cfg["num_attention_heads"]
        if self.cp > 1 and self.cp_comm == "a2a" and heads % (self.tp * self.cp):
            raise CatalogError(
                f"{where}: cp_comm a2a gives each of TP x CP = {self.tp * self.cp} GPUs whole heads, and "
                f"{heads} heads do not divide by that; fix: use p2p or all_gather, or a CP dividing {heads // self.tp}")

    def _validate_moe(self, where: str) -> None:
        m = self.model_cfg
        moe_preset = any(k.startswith("moe_") for k in m)
        if self.num_experts is None:
            if moe_preset:
                raise CatalogError(f"{where}: model {self.model} is a mixture of experts but the target sets no "
                                   "num_experts; fix: add num_experts (e.g. 64)")
            if self.ep > 1 or self.etp > 1:
                raise CatalogError(f"{where}: expert parallelism (ep/etp) needs a MoE model; "
                                   "fix: set num_experts or drop ep/etp")
            return
        if self.num_experts % self.ep:
            raise CatalogError(f"{where}: {self.num_experts} experts cannot be split over EP={self.ep}; "
                               f"fix: pick an EP that divides {self.num_experts}")
        # Megatron folds the expert layout into the same GPUs: PP x ETP x EP x expert-DP.
        if (self.gpus // self.pp) % (self.ep * self.etp):
            raise CatalogError(f"{where}: {self.gpus // self.pp} GPUs per pipeline stage are not divisible by "
                               f"EP x ETP = {self.ep * self.etp}; fix: choose ep and etp whose product divides it")
        topk = self.router_topk
        if not topk or topk > self.num_experts:
            raise CatalogError(f"{where}: router top-k {topk} must be set and at most {self.num_experts} experts; "
                               "fix: set topk (or the preset's moe_router_topk)")
        if self.etp > 1 and not m.get("disable_bias_linear"):
            raise CatalogError(f"{where}: Megatron supports biases in MoE layers only with ETP=1; "
                               "fix: use a preset with disable_bias_linear: true, or etp: 1")
        if self.tp > 1 and not self.sp:
            raise CatalogError(f"{where}: Megatron's MoE layers need sequence parallelism when TP > 1; "
                               "fix: set sp: true")


# Megatron's --cp-comm-type values (a2a+p2p also needs --hierarchical-context-parallel-sizes).
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")

# The published tables a chapter is diffed against (results/chapter.py): none for our rows only.
REFERENCES = ("anchor", "twogpu", "none")

# Preset keys with a fixed set of values (the first is Megatron's default).
PRESET_CHOICES = {"normalization": ("LayerNorm", "RMSNorm"), "position_embedding": ("learned_absolute", "rope")}


class Preset(BaseModel):
    """One preset of configs/models.yaml (core/flags.py turns each key into flags). Anything else in the file
    is a typo and refused; every size is at least 1, and the heads split the hidden size (Megatron's own
    rule) as the query groups split the heads."""
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    about: str
    num_layers: Size
    hidden_size: Size
    num_attention_heads: Size
    seq_length: Size
    max_position_embeddings: Size
    vocab_size: Size
    ffn_hidden_size: Size | None = None
    disable_bias_linear: bool | None = None
    # modern decoders (chapter 6): RMSNorm, SwiGLU, rotary positions, grouped-query attention (GQA)
    normalization: Literal[PRESET_CHOICES["normalization"]] | None = None
    swiglu: bool | None = None
    position_embedding: Literal[PRESET_CHOICES["position_embedding"]] | None = None
    rotary_base: Size | None = None
    num_query_groups: Size | None = None
    untie_embeddings: bool | None = None
    moe_ffn_hidden_size: Size | None = None
    moe_router_topk: Size | None = None
    moe_router_force_load_balancing: bool | None = None
    moe_token_dispatcher: str | None = None
    moe_grouped_gemm: bool | None = None
    moe_permute_fusion: bool | None = None

    @model_validator(mode="after")
    def _shapes(self) -> "Preset":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_query_groups {self.num_query_groups} does not divide num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.seq_length > self.max_position_embeddings and self.position_embedding != "rope":
            raise ValueError(f"seq_length {self.seq_length} is above max_position_embeddings "
                             f"{self.max_position_embeddings} (learned positions)")
        return self


PRESET_KEYS = frozenset(Preset.model_fields)


# A chapter's page and tutorial: a markdown file directly under results/ and tutorials/ (make tables
# writes the page: never a path outside the checkout or into another folder)
PAGE = r"^results/[0-9A-Za-z][0-9A-Za-z._-]*\.md$"
TUTORIAL = r"^tutorials/[0-9A-Za-z][0-9A-Za-z._-]*\.md$"


class ChapterFile(BaseModel):
    """A configs/experiments/NN-*.yaml: the chapter's page and tutorial, defaults, and its targets."""
    model_config = ConfigDict(strict=True, extra="forbid")
    chapter: typing.Annotated[int, Field(ge=0)]
    title: typing.Annotated[str, Field(min_length=1)]
    table: typing.Annotated[str, Field(pattern=PAGE)]  # its results page, e.g. results/01-dp-zero2.md
    tutorial: typing.Annotated[str, Field(pattern=TUTORIAL)] | None = None
    reference: Literal[REFERENCES] | None = None  # the published table it is diffed against (results/chapter.py)
    defaults: dict[str, Any] = {}
    experiments: list[dict[str, Any]]

# The flags of EXTRA_ARGS that change a target's model or layout are read in megalab/core/flags.py
# (flags.effective_model, flags.effective_experiment), beside the argv that writes them.


@lru_cache(maxsize=None)
def _defaults_model() -> type[BaseModel]:
    """A chapter's `defaults`: any of Experiment's fields but the id and chapter, none required."""
    fields = {name: ((typing.Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation) | None, None)
              for name, f in Experiment.model_fields.items() if name not in ("id", "chapter")}
    return create_model("CatalogDefaults", __config__=ConfigDict(strict=True, extra="forbid"), **fields)


def _why(e: ValidationError) -> str:
    """One line from pydantic's errors: unknown keys together, else the first problem's field."""
    errs = e.errors()
    unknown = sorted(str(x["loc"][-1]) for x in errs if x["type"] == "extra_forbidden")
    if unknown:
        return f"unknown keys {unknown}"
    first = errs[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


def _load_yaml(path) -> Any:
    try:
        return yamlfile.load(path)
    except InputError as e:
        raise CatalogError(str(e)) from None


def _tupled(spec: dict) -> dict:
    """SPEC with a YAML list of extra_args as the tuple Experiment holds."""
    return {**spec, "extra_args": tuple(spec["extra_args"])} if isinstance(spec.get("extra_args"), list) else spec


def _shown(path: Path) -> str:
    return yamlfile.shown(path)


@lru_cache(maxsize=None)
def models() -> dict[str, dict[str, Any]]:
    """The presets by name, each as written (plan.py and the estimator read them by key), every one a
    valid Preset."""
    presets = _load_yaml(CONFIGS / "models.yaml")
    if not isinstance(presets, dict) or not presets:
        raise CatalogError("configs/models.yaml: expected a mapping of preset name -> keys; fix the file")
    for name, preset in presets.items():
        if not isinstance(name, str) or not PRESET_NAME.fullmatch(name):
            raise CatalogError(f"configs/models.yaml: preset name {name!r}: letters, digits, '.', '_', '-' and '+'; "
                               "fix: rename it")
        try:
            Preset.model_validate(preset)
        except ValidationError as e:
            raise CatalogError(f"configs/models.yaml: {name}: {_why(e)}; fix the preset (keys: "
                               f"{', '.join(sorted(PRESET_KEYS))})") from None
    return presets


@lru_cache(maxsize=None)
def _chapter_files() -> dict[int, tuple[Any, ChapterFile]]:
    out: dict[int, tuple[Any, ChapterFile]] = {}
    pages: dict[str, Path] = {}
    for path in sorted((CONFIGS / "experiments").glob("*.yaml")):
        try:
            doc = ChapterFile.model_validate(_load_yaml(path))
            _defaults_model().model_validate(_tupled(doc.defaults))
        except ValidationError as e:
            where = "defaults: " if e.title == "CatalogDefaults" else ""
            raise CatalogError(f"configs/experiments/{path.name}: {where}{_why(e)}; fix the chapter file") from None
        if doc.chapter in out:
            raise CatalogError(f"configs/experiments/{path.name}: chapter {doc.chapter} is also "
                               f"{out[doc.chapter][0].name}'s; fix: one file per chapter")
        if doc.table in pages:
            raise CatalogError(f"configs/experiments/{path.name}: table {doc.table} is also {pages[doc.table].name}'s "
                               "page; fix: one page per chapter")
        out[doc.chapter], pages[doc.table] = (path, doc), path
    return out


@lru_cache(maxsize=None)
def chapters() -> dict[int, dict[str, Any]]:
    """Chapter metadata (title, table, tutorial) keyed by chapter number."""
    return {chapter: doc.model_dump(exclude={"experiments"}, exclude_unset=True) | {"file": path}
            for chapter, (path, doc) in _chapter_files().items()}


# A target id is a make target, a run folder's name and a word of the sbatch script: letters, digits,
# '.', '_' and '-', a letter or digit first (never an option, a hidden file or shell syntax).
ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")
PRESET_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]*")  # gpt2-xl+14L


def check_id(entry: Any, path: Path, index: int) -> None:
    """CatalogError, in one line naming the YAML file and the entry, unless `entry` is a mapping whose id
    matches ID_PATTERN."""
    ident = entry.get("id") if isinstance(entry, dict) else None
    if not isinstance(ident, str) or not ID_PATTERN.fullmatch(ident):
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        raise CatalogError(f"{shown}: entry {index} (id {ident!r}): a target id is letters, digits, '.', '_' "
                           "and '-', a letter or digit first; fix: rename it in that file")


@lru_cache(maxsize=None)
def catalog() -> dict[str, Experiment]:
    """All experiments, in catalog order, keyed by target id; each one typed, in range and a layout
    Megatron takes (Experiment.validate), else one CatalogError line naming its file."""
    out: dict[str, Experiment] = {}
    where: dict[str, Path] = {}
    for chapter, (path, doc) in _chapter_files().items():
        for index, entry in enumerate(doc.experiments, 1):
            check_id(entry, path, index)
            spec = _tupled({**doc.defaults, **entry, "chapter": chapter})
            try:
                exp = Experiment.model_validate(spec)
            except ValidationError as e:
                raise CatalogError(f"{path.name}: {entry.get('id')}: {_why(e)}; fix the catalog entry") from None
            if exp.id in out:
                also = "" if where[exp.id] == path else f" and {_shown(where[exp.id])}"
                raise CatalogError(f"{_shown(path)}{also}: target id {exp.id} is given twice; fix: give each "
                                   "target its own id")
            if exp.model not in models():
                raise CatalogError(f"{_shown(path)}: {exp.id}: unknown model preset '{exp.model}' "
                                   f"(configs/models.yaml); fix: one of {', '.join(models())}")
            try:
                exp.validate()
            except CatalogError as e:
                raise CatalogError(f"{_shown(path)}: {e}") from None
            out[exp.id], where[exp.id] = exp, path
    return out


def get(target: str) -> Experiment:
    """Look a target up by its full id or unique numeric prefix ('101')."""
    cat = catalog()
    if target in cat:
        return cat[target]
    hits = [k for k in cat if k.split("-", 1)[0] == target]
    if len(hits) == 1:
        return cat[hits[0]]
    close = [k for k in cat if k.startswith(target[:2])][:4]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise CatalogError(f"unknown target '{target}'{hint}; fix: run 'make list' to see every target")
