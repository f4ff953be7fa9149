"""The experiment catalog: every make target is one entry of configs/experiments/*.yaml.

A target is a model preset (configs/models.yaml) plus the few numbers that make it a lesson
(GPUs, batch sizes, parallel layout). Everything a run needs is derived here, in one place:
data-parallel size, gradient-accumulation steps, and the checks Megatron would otherwise make
only after a 40-second start-up.
"""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from megalab.core.paths import CONFIGS, ROOT  # noqa: F401 (catalog.ROOT: callers and tests)


class CatalogError(ValueError):
    """A one-line, user-facing problem with a target or its layout (message says the fix)."""


@dataclasses.dataclass(frozen=True)
class Experiment:
    id: str
    chapter: int
    about: str
    model: str
    gpus: int
    gbs: int
    mbs: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    # Megatron's --num-layers-per-virtual-pipeline-stage (None: no virtual pipeline)
    layers_per_virtual_stage: int | None = None
    cp_comm: str | None = None
    sp: bool = False
    zero2: bool = False
    recompute: str = "none"  # none | selective | full-uniform-N
    num_experts: int | None = None
    topk: int | None = None  # router top-k; None: the preset's moe_router_topk
    # Megatron's --timing-log-level: 2 reports per-microbatch forward/backward timers (profile-* targets)
    timing_log_level: int = 0
    ref: str | None = None  # row id in configs/reference/anchor_8xh100.csv (this chapter)
    analogue_of: str | None = None  # reference row this 2-GPU stand-in illustrates
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
        if self.timing_log_level not in (0, 1, 2):
            raise CatalogError(f"{where}: timing_log_level must be 0, 1 or 2 (Megatron's --timing-log-level); "
                               "fix the catalog entry")
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

# Preset keys and what they are (plan.py turns each into flags, as scripts/train_gpt.sh does from
# plan.wrapper_env). Anything else in configs/models.yaml is a typo and refused.
PRESET_KEYS = {
    "about", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
    "vocab_size", "ffn_hidden_size", "disable_bias_linear",
    # modern decoders (chapter 6): normalization LayerNorm|RMSNorm, swiglu, position_embedding
    # learned_absolute|rope, rotary_base, num_query_groups (GQA), untie_embeddings
    "normalization", "swiglu", "position_embedding", "rotary_base", "num_query_groups", "untie_embeddings",
    "moe_ffn_hidden_size", "moe_router_topk", "moe_router_force_load_balancing", "moe_token_dispatcher",
    "moe_grouped_gemm", "moe_permute_fusion",
}

# Preset keys with a fixed set of values (the first is Megatron's default).
PRESET_CHOICES = {"normalization": ("LayerNorm", "RMSNorm"), "position_embedding": ("learned_absolute", "rope")}

# Megatron flags that change the model, as the preset key each overrides: (key, value type); a None
# type is a switch (present: True). EXTRA_ARGS may carry them; the estimator and the preflight read
# the effective model (the preset overridden by them), as Megatron builds it (the last one wins).
MODEL_FLAGS = {
    "--num-layers": ("num_layers", int), "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int), "--num-attention-heads": ("num_attention_heads", int),
    "--seq-length": ("seq_length", int), "--max-position-embeddings": ("max_position_embeddings", int),
    "--vocab-size": ("vocab_size", int), "--num-query-groups": ("num_query_groups", int),
    "--normalization": ("normalization", str), "--position-embedding-type": ("position_embedding", str),
    "--rotary-base": ("rotary_base", int), "--swiglu": ("swiglu", None),
    "--untie-embeddings-and-output-weights": ("untie_embeddings", None),
    "--disable-bias-linear": ("disable_bias_linear", None),
}


def argv_items(args: tuple[str, ...] | list[str]) -> list[str]:
    """argv items with `--flag=value` read as `--flag value`, as argparse does."""
    return [p for a in args for p in (a.split("=", 1) if a.startswith("--") and "=" in a else [a])]


def read_flags(args: tuple[str, ...] | list[str], table: dict[str, tuple[str, Any]], missing) -> dict[str, Any]:
    """The values `args` give the keys of `table` (flag -> (key, value type, or None for a switch)); the
    last one wins, as in Megatron's argparse. A flag without its value raises CatalogError(missing(flag,
    key, type))."""
    items = argv_items(args)
    out: dict[str, Any] = {}
    for i, a in enumerate(items):
        if a not in table:
            continue
        key, kind = table[a]
        if kind is None:
            out[key] = True
            continue
        try:
            out[key] = kind(items[i + 1])
        except (IndexError, ValueError):
            raise CatalogError(missing(a, key, kind)) from None
    return out


def effective_model(preset: dict[str, Any], args: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The preset with the model flags among `args` (argv items, e.g. a target's extra args plus
    EXTRA_ARGS) applied; `--flag=value` is read too. Raises CatalogError for a flag without its value."""
    return {**preset, **read_flags(args, MODEL_FLAGS, lambda a, key, kind: (
        f"{a} needs a {kind.__name__} value in the extra args; fix: e.g. {a} {preset.get(key, 8)}"))}


# Megatron flags that change a target's batch or layout, as the Experiment field each overrides (a None
# type is a switch). In EXTRA_ARGS they reach Megatron after the target's own (the last one wins), so the
# plan, its checks and the estimator read the experiment with them applied: `effective_experiment`.
LAYOUT_FLAGS = {
    "--micro-batch-size": ("mbs", int), "--global-batch-size": ("gbs", int),
    "--tensor-model-parallel-size": ("tp", int), "--pipeline-model-parallel-size": ("pp", int),
    "--context-parallel-size": ("cp", int), "--sequence-parallel": ("sp", None),
    "--use-distributed-optimizer": ("zero2", None),
}


def effective_experiment(exp: "Experiment", args: tuple[str, ...] | list[str]) -> "Experiment":
    """The target with the batch/layout flags among `args` applied (validated again: a layout Megatron
    would reject is a CatalogError). Raises CatalogError for a flag without its value."""
    changes = read_flags(args, LAYOUT_FLAGS, lambda a, field, kind: (
        f"{a} needs an int value in the extra args; fix: e.g. {a} {getattr(exp, field)}"))
    if not changes or all(getattr(exp, k) == v for k, v in changes.items()):
        return exp
    out = dataclasses.replace(exp, **changes)
    out.validate()
    return out


def _experiment_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(Experiment)}


@lru_cache(maxsize=None)
def models() -> dict[str, dict[str, Any]]:
    with open(CONFIGS / "models.yaml") as f:
        presets = yaml.safe_load(f)
    for name, preset in presets.items():
        for key, allowed in PRESET_CHOICES.items():
            if key in preset and preset[key] not in allowed:
                raise CatalogError(f"configs/models.yaml: {name}: {key} '{preset[key]}' is not one of "
                                   f"{', '.join(allowed)}; fix the preset")
        unknown = set(preset) - PRESET_KEYS
        if unknown:
            raise CatalogError(f"configs/models.yaml: {name}: unknown keys {sorted(unknown)}; "
                               f"fix: use {', '.join(sorted(PRESET_KEYS))}")
    return presets


@lru_cache(maxsize=None)
def chapters() -> dict[int, dict[str, Any]]:
    """Chapter metadata (title, table, tutorial) keyed by chapter number."""
    out = {}
    for path in sorted((CONFIGS / "experiments").glob("*.yaml")):
        with open(path) as f:
            doc = yaml.safe_load(f)
        out[int(doc["chapter"])] = {k: v for k, v in doc.items() if k != "experiments"} | {"file": path}
    return out


# A target id is a make target, a run folder's name and a word of the sbatch script: letters, digits,
# '.', '_' and '-', a letter or digit first (never an option, a hidden file or shell syntax).
ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")


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
    """All experiments, in catalog order, keyed by target id."""
    out: dict[str, Experiment] = {}
    fields = _experiment_fields()
    for chapter, meta in chapters().items():
        with open(meta["file"]) as f:
            doc = yaml.safe_load(f)
        defaults = doc.get("defaults", {})
        for index, entry in enumerate(doc["experiments"], 1):
            check_id(entry, meta["file"], index)
            spec = {**defaults, **entry, "chapter": chapter}
            unknown = set(spec) - fields
            if unknown:
                raise CatalogError(f"{meta['file'].name}: {entry.get('id')}: unknown keys {sorted(unknown)}")
            if "extra_args" in spec:
                spec["extra_args"] = tuple(spec["extra_args"])
            exp = Experiment(**spec)
            if exp.id in out:
                raise CatalogError(f"duplicate target id {exp.id}")
            if exp.model not in models():
                raise CatalogError(f"{exp.id}: unknown model preset '{exp.model}' (configs/models.yaml)")
            out[exp.id] = exp
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
