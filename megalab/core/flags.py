"""Megatron's flags, known in one place: the argv a run gets, and what megalab reads back from EXTRA_ARGS.

Writing: `groups(...)` builds the argv in named groups by concern, as Megatron-LM's examples/ do
(DISTRIBUTED for torchrun, then MODEL, TRAINING, PARALLEL, ... for the entry point); `WHY` says why
each group holds what it holds, and the launch script (launchscript.py) prints it above the group's
bash array. Reading: EXTRA_ARGS (and a target's own extra_args) reach Megatron last, so the last
value wins; the flags among them that change the model (MODEL_FLAGS) or the batch and layout
(LAYOUT_FLAGS) are read back here with argparse, as Megatron's own parser reads them, so that the
plan, its checks, the estimator and the record see the run Megatron will build.
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from megalab.core.catalog import CatalogError, Experiment, Preset
from megalab.core.variables import LaunchError, Options
from megalab.runtime import levers

RUN_DIR_PLACEHOLDER = "RUN_DIR"  # a dry run has no run dir yet: its paths show this

GROUPS = ("DISTRIBUTED", "MODEL", "TRAINING", "PARALLEL", "MOE", "RECOMPUTE", "DATA", "LOGGING",
          "CHECKPOINT", "PROFILE", "IMPL", "PERF", "EXTRA")

# Why each group holds what it holds: the comment above its array in RUN_DIR/launch.sh ({preset}: the
# model preset, {graph}: the CUDA graph decision).
WHY = {
    "DISTRIBUTED": "torchrun: one process per GPU of this node; several nodes meet at the master's address and "
                   "port, one node at a port torchrun's own store picks (--standalone).",
    "MODEL": "The model: preset {preset} (configs/models.yaml). Attention backend auto: 'local' would swap "
             "megalab's spec attention back to Megatron's own; RoPE unfused: the fused one needs TE >= 1.4.",
    "TRAINING": "The catalog's batch; the reference tutorial's hyper-parameters (configs/reference/README.md).",
    "PARALLEL": "The catalog's layout.{parallel}",
    "MOE": "Mixture of experts (the preset's moe_* keys); force-balanced routing: a throughput benchmark without "
           "load imbalance. Grouped GEMM and permute fusion need TE: without it the first is megalab's "
           "grouped_gemm lever, the second is dropped (the record: substituted_flags, dropped_flags).",
    "RECOMPUTE": "Activation recomputation, as the catalog asks (none: every activation is kept).",
    "DATA": "Mock data by default: a throughput row does not depend on the text, and the tokenizer only sets "
            "the vocab. Real data: make prepare-data prints DATA=... TOKENIZER_MODEL=.... No [s, s] mask per sample "
            "from the data loader: every attention megalab runs builds the causal mask itself (--reset-attention-mask "
            "in EXTRA_ARGS keeps it, for document masks).",
    "LOGGING": "Every iteration, with Megatron's TFLOP/s (the harness takes a median). Megatron's wandb logs only "
               "where TensorBoard does, and its profiler writes beside that directory.",
    "CHECKPOINT": "torch_dist: Megatron's sharded format, reloadable under another TP/PP. A LOAD without a "
                  "checkpoint stops rather than train from scratch; an exit interval stops as an interrupted "
                  "job would, within the same LR schedule.",
    "PROFILE": "A torch profiler trace of two steps (RUN_DIR/torch_profile/rank-N.json.gz).",
    "IMPL": "Without TE or apex: torch norms, no fused softmax; the wgrad GEMM adds into the fp32 main_grad "
            "only with the fused_wgrad lever; --spec: megalab's TE-free layer spec.",
    "PERF": "Full-iteration CUDA graph {graph} (one replay of forward+backward: no per-kernel launch cost; "
            "Megatron needs the NaN check off with it, and its rerun state machine, with nothing left to check, "
            "off so the host does not wait for the graph).",
    "EXTRA": "The target's extra_args, then EXTRA_ARGS (split once, as a shell would): last, so they win.",
}

# Preset switches whose Megatron flags need Transformer Engine kernels. Without TE, Megatron's local
# MoE experts are SequentialMLP whatever --moe-grouped-gemm says (the flag only trips a CUDA
# capability check), and --moe-permute-fusion is refused ("fused permutation is not available").
# Without TE neither Megatron flag is passed. megalab's spec has a substitute for the first one:
# GroupedMLP experts (torch._grouped_mm, megalab/runtime/grouped_experts.py), switched on by the
# grouped_gemm lever (on by default for such a preset; FAST=none or a FAST list without it turns it
# off). The record keeps both (config.substituted_flags: flag -> lever, config.dropped_flags).
TE_ONLY_PRESET_FLAGS = {"moe_grouped_gemm": "--moe-grouped-gemm", "moe_permute_fusion": "--moe-permute-fusion"}


def parallel_why(dp: int, zero2: bool) -> str:
    """What the PARALLEL group does with the data-parallel ranks, for this layout (its comment in launch.sh)."""
    if zero2:
        return (f" ZeRO-2 is Megatron's distributed optimizer: the fp32 master weights and Adam state are split over "
                f"the {dp} DP ranks, the gradients reduce-scattered and the weights all-gathered, overlapped with "
                "compute." if dp > 1 else " ZeRO-2 is Megatron's distributed optimizer; at DP=1 there is no other rank "
                "to split the optimizer state with, so this GPU keeps all of it.")
    return (f" DP={dp}: every rank keeps the whole model and optimizer state; the fp32 gradients are all-reduced, "
            "overlapped with the backward pass." if dp > 1 else " DP=1: no gradient is exchanged.")


def profile_start(iters: int) -> int:
    """First traced step: Megatron's default 10, earlier when the run is shorter (two steps traced)."""
    return min(10, iters - 2)


def extra(exp: Experiment, opts: Options) -> tuple[str, ...]:
    """The EXTRA group: the target's own extra flags, then the user's EXTRA_ARGS (split at the edge)."""
    return (*exp.extra_args, *opts.extra_args)


def modern_model_flags(m: dict) -> list:
    """The preset's modern-decoder keys as Megatron flags. RoPE always goes with --no-rope-fusion:
    Megatron's fused RoPE needs TE >= 1.4 ("apply_rope_fusion is not available")."""
    out: list = []
    if m.get("normalization", "LayerNorm") != "LayerNorm":
        out += ["--normalization", m["normalization"]]
    if m.get("swiglu"):
        out += ["--swiglu"]
    if m.get("position_embedding", "learned_absolute") == "rope":
        out += ["--position-embedding-type", "rope", "--no-rope-fusion"]
        if m.get("rotary_base"):
            out += ["--rotary-base", m["rotary_base"]]
    if m.get("num_query_groups"):
        out += ["--group-query-attention", "--num-query-groups", m["num_query_groups"]]
    if m.get("untie_embeddings"):
        out += ["--untie-embeddings-and-output-weights"]
    return out


def groups(exp: Experiment, opts: Options, impl: str, fast: tuple[str, ...], graph: bool, per_node: int,
           run_dir: Path | None) -> dict[str, tuple[str, ...]]:
    """The argv of one run, group by group (GROUPS order): DISTRIBUTED is torchrun's, the rest the entry
    point's. `exp` is the effective experiment (EXTRA_ARGS' layout applied); paths under `run_dir`
    (RUN_DIR while there is none)."""
    m = exp.model_cfg
    out = str(run_dir) if run_dir is not None else RUN_DIR_PLACEHOLDER
    ex = extra(exp, opts)
    a = {"DISTRIBUTED": _distributed(opts, per_node), "MODEL": _model(m), "TRAINING": _training(exp, opts),
         "PARALLEL": _parallel(exp, opts, per_node), "MOE": _moe(exp, m, impl), "RECOMPUTE": _recompute(exp),
         "DATA": _data(m, opts, ex), "LOGGING": _logging(exp, opts, out, run_dir), "CHECKPOINT": _checkpoint(opts, out),
         "PROFILE": _profile(opts), "IMPL": _impl(opts, impl, fast), "PERF": _perf(graph), "EXTRA": list(ex)}
    return {g: tuple(str(x) for x in a[g]) for g in GROUPS}


def _distributed(opts: Options, per_node: int) -> list:
    if opts.master_port is None and opts.nnodes == 1:  # torchrun's store binds a free port itself (ports.py)
        return ["--standalone", "--local-addr", opts.master_addr, "--nproc_per_node", per_node, "--nnodes", 1]
    return ["--nproc_per_node", per_node, "--nnodes", opts.nnodes, "--node_rank", opts.node_rank,
            "--master_addr", opts.master_addr, "--master_port", opts.master_port]


def _model(m: dict) -> list:
    out = ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"],
           "--num-attention-heads", m["num_attention_heads"], "--seq-length", m["seq_length"],
           "--max-position-embeddings", m.get("max_position_embeddings", m["seq_length"]), "--attention-backend", "auto"]
    if m.get("ffn_hidden_size"):
        out += ["--ffn-hidden-size", m["ffn_hidden_size"]]
    if m.get("disable_bias_linear"):
        out += ["--disable-bias-linear"]
    return out + modern_model_flags(m)


def _training(exp: Experiment, opts: Options) -> list:
    return ["--micro-batch-size", exp.mbs, "--global-batch-size", exp.gbs, "--train-iters", opts.iters,
            "--lr", "6.0e-5", "--min-lr", "6.0e-6", "--lr-decay-style", "cosine",
            "--lr-warmup-fraction", ".001", "--weight-decay", "0.1", "--adam-beta1", "0.9",
            "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad", "1.0", "--bf16"]


def _parallel(exp: Experiment, opts: Options, per_node: int) -> list:
    p = ["--tensor-model-parallel-size", exp.tp, "--pipeline-model-parallel-size", exp.pp]
    if exp.cp > 1:
        p += ["--context-parallel-size", exp.cp, "--cp-comm-type", exp.cp_comm or "p2p"]
    if exp.layers_per_virtual_stage:
        p += ["--num-layers-per-virtual-pipeline-stage", exp.layers_per_virtual_stage]
    if exp.sp:
        p += ["--sequence-parallel"]
    dp = per_node * opts.nnodes // (exp.tp * exp.pp * exp.cp)
    if dp > 1:
        p += ["--overlap-grad-reduce"]
    if exp.zero2:
        p += ["--use-distributed-optimizer"] + (["--overlap-param-gather"] if dp > 1 else [])
    return p


def _moe(exp: Experiment, m: dict, impl: str) -> list:
    if not exp.num_experts:
        return []
    moe = ["--num-experts", exp.num_experts, "--moe-router-topk", exp.router_topk,
           "--expert-model-parallel-size", exp.ep, "--expert-tensor-parallel-size", exp.etp,
           "--moe-token-dispatcher-type", m.get("moe_token_dispatcher", "alltoall")]
    if m.get("moe_ffn_hidden_size"):
        moe += ["--moe-ffn-hidden-size", m["moe_ffn_hidden_size"]]
    if m.get("moe_router_force_load_balancing"):
        moe += ["--moe-router-force-load-balancing"]
    if impl == "transformer_engine":  # TE kernels only: without TE substituted or dropped (plan.py)
        moe += [flag for key, flag in TE_ONLY_PRESET_FLAGS.items() if m.get(key)]
    return moe


def _recompute(exp: Experiment) -> list:
    if exp.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if exp.recompute.startswith("full-"):
        _, method, layers = exp.recompute.split("-")
        return ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", layers]
    if exp.recompute != "none":
        raise LaunchError(f"target {exp.id}: unknown recompute {exp.recompute} "
                          "(none|selective|full-uniform-N|full-block-N); fix: the catalog entry")
    return []


def _data(m: dict, opts: Options, ex) -> list:
    if opts.data == "mock":
        data = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", m["vocab_size"],
                "--split", opts.split]
    elif opts.tokenizer_model:  # the tokenizer folder saved beside the data: offline, exact
        data = ["--data-path", opts.data, "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", opts.tokenizer_model, "--split", opts.split]
    elif opts.vocab_file and opts.merge_file:  # mcore 0.19's GPT2BPETokenizer loads the Hub's gpt2: online only
        data = ["--data-path", opts.data, "--tokenizer-type", "GPT2BPETokenizer",
                "--vocab-file", opts.vocab_file, "--merge-file", opts.merge_file, "--split", opts.split]
    else:
        raise LaunchError(f"DATA={opts.data} needs its tokenizer; fix: set TOKENIZER_MODEL "
                          "(or VOCAB_FILE and MERGE_FILE), as make prepare-data prints")
    # Megatron's loader builds a float [s, s] causal mask for every sample and moves it to the GPU, which
    # SDPA's is_causal, Megatron's softmax and TE all rebuild themselves. Under the CUDA graph that host work
    # sits between replays (results/bench, "Levers tried against the default", no_dataloader_mask). Document
    # masks need it.
    if "--reset-attention-mask" not in ex:
        data += ["--no-create-attention-mask-in-dataloader"]
    return data


def _logging(exp: Experiment, opts: Options, out: str, run_dir: Path | None) -> list:
    log = ["--log-interval", 1, "--log-throughput", "--eval-iters", 0, "--eval-interval", opts.iters,
           "--log-memory-to-tensorboard", "--log-timers-to-tensorboard"]
    if run_dir is not None or opts.wandb or opts.profile:  # wandb logs, and the profiler writes, beside it
        log += ["--tensorboard-dir", f"{out}/tensorboard"]
    if exp.timing_log_level > 0:
        log += ["--timing-log-level", exp.timing_log_level]
    if opts.wandb:
        log += ["--wandb-project", opts.wandb_project or "megalab", "--wandb-exp-name", Path(out).name,
                "--wandb-save-dir", f"{out}/wandb"]
        if opts.wandb_entity:
            log += ["--wandb-entity", opts.wandb_entity]
    return log


def _checkpoint(opts: Options, out: str) -> list:
    ck = []
    if opts.save:
        ck += ["--save", f"{out}/checkpoints", "--save-interval", opts.save_interval or opts.iters]
    if opts.load:
        ck += ["--load", str(opts.load), "--exit-on-missing-checkpoint"]
    if ck:
        ck += ["--ckpt-format", "torch_dist"]
    if opts.exit_interval:
        ck += ["--exit-interval", opts.exit_interval]
    return ck


def _profile(opts: Options) -> list:
    if not opts.profile:
        return []
    start = profile_start(opts.iters)
    return ["--profile", "--use-pytorch-profiler", "--profile-step-start", start, "--profile-step-end", start + 2]


def _impl(opts: Options, impl: str, fast: tuple[str, ...]) -> list:
    if impl == "transformer_engine":
        return ["--transformer-impl", "transformer_engine"]
    out = ["--transformer-impl", "local", "--no-persist-layer-norm"]
    if levers.FUSED_WGRAD not in fast:  # the wgrad GEMM adds into main_grad: megalab's stand-in for apex
        out += ["--no-gradient-accumulation-fusion"]
    out += ["--no-masked-softmax-fusion"]
    if opts.spec == "megalab":
        out += ["--spec", "megalab.runtime.spec", "megalab_layer_spec"]
    return out


def _perf(graph: bool) -> list:
    # The graph cannot hold the NaN checks, so Megatron's rerun state machine has nothing to validate; left on,
    # it all-reduces a flag and reads it back after every forward-backward, and the optimizer's per-tensor
    # preparation waits for the graph instead of running beside it (results/bench, lever no_rerun).
    return ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad", "--rerun-mode",
            "disabled"] if graph else []


# ---- reading EXTRA_ARGS back -------------------------------------------------------------------------

# Megatron flags that change the model, as the preset key each overrides: (key, value type); a None
# type is a switch (present: True). The estimator and the preflight read the effective model (the
# preset overridden by them), as Megatron builds it (the last one wins).
MODEL_FLAGS = {
    "--num-layers": ("num_layers", int), "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int), "--num-attention-heads": ("num_attention_heads", int),
    "--seq-length": ("seq_length", int), "--max-position-embeddings": ("max_position_embeddings", int),
    "--vocab-size": ("vocab_size", int), "--num-query-groups": ("num_query_groups", int),
    "--normalization": ("normalization", str), "--position-embedding-type": ("position_embedding", str),
    "--rotary-base": ("rotary_base", int), "--swiglu": ("swiglu", None),
    "--untie-embeddings-and-output-weights": ("untie_embeddings", None),
    "--disable-bias-linear": ("disable_bias_linear", None),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", int),
}

# Megatron flags that change a target's batch or layout, as the Experiment field each overrides (a None
# type is a switch). The plan, its checks and the estimator read the experiment with them applied.
LAYOUT_FLAGS = {
    "--micro-batch-size": ("mbs", int), "--global-batch-size": ("gbs", int),
    "--tensor-model-parallel-size": ("tp", int), "--pipeline-model-parallel-size": ("pp", int),
    "--context-parallel-size": ("cp", int), "--sequence-parallel": ("sp", None),
    "--use-distributed-optimizer": ("zero2", None),
    "--num-experts": ("num_experts", int), "--moe-router-topk": ("topk", int),
    "--expert-model-parallel-size": ("ep", int), "--expert-tensor-parallel-size": ("etp", int),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print its usage and exit: the caller says it in one line
        raise argparse.ArgumentError(None, message)


def reader(table: dict[str, tuple[str, Any]]) -> argparse.ArgumentParser:
    """An argparse parser of `table`'s flags alone, spelt as Megatron's parser takes them (no
    abbreviations; `--flag=value` too); a flag not given stays out of the result."""
    return _reader(tuple(table.items()))


@functools.lru_cache(maxsize=16)  # made once a table: a page build reads thousands of records' extra args
def _reader(items: tuple[tuple[str, tuple[str, Any]], ...]) -> argparse.ArgumentParser:
    p = _Parser(prog="EXTRA_ARGS", add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag, (key, kind) in items:
        if kind is None:
            p.add_argument(flag, dest=key, action="store_true", default=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=key, type=kind, default=argparse.SUPPRESS)
    return p


def read(args, table: dict[str, tuple[str, Any]], example) -> tuple[dict[str, Any], list[str]]:
    """(the values `args` give the keys of `table`, the items it does not read). The last one wins, as
    in Megatron. A flag without its value (or with one of the wrong type) raises CatalogError naming
    it, with the fix `{flag} {example(key)}`."""
    args = list(args)
    if not args:  # most records' extra args: nothing to read
        return {}, []
    try:
        known, rest = reader(table).parse_known_args(args)
    except argparse.ArgumentError as e:
        flag = e.argument_name or "a flag"
        key, kind = table.get(flag, (None, int))
        if kind is None:
            raise CatalogError(f"{flag} is a switch and takes no value in the extra args; fix: {flag} alone") from None
        name = {int: "an int", str: "a text", float: "a number"}.get(kind, f"a {kind.__name__}")
        raise CatalogError(f"{flag} needs {name} value in the extra args; fix: e.g. {flag} {example(key)}") from None
    return vars(known), rest


def effective_model(preset: dict[str, Any], args) -> dict[str, Any]:
    """The preset with the model flags among `args` (argv items: a target's extra args plus EXTRA_ARGS)
    applied. Raises CatalogError for a flag without its value."""
    values, _ = read(args, MODEL_FLAGS, lambda key: preset.get(key, 8))
    for key, v in values.items():  # in range as a preset's own are (a 0 would divide by zero in the plan and the
        try:                       # estimator); the rules between values are check_model's, with their fixes
            _preset_field(key).validate_python(v)
        except ValidationError as e:
            raise CatalogError(_out_of_range(MODEL_FLAGS, key, e, preset, "model")) from None
    return {**preset, **values}


@functools.lru_cache(maxsize=None)
def _preset_field(key: str) -> TypeAdapter:
    """A preset field's type and range (catalog.Preset), to check one value by."""
    f = Preset.model_fields[key]
    return TypeAdapter(Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation, config={"strict": True})


def effective_experiment(exp: Experiment, args) -> Experiment:
    """The target with the batch/layout flags among `args` applied (validated again: a layout Megatron
    would reject is a CatalogError). Raises CatalogError for a flag without its value."""
    changes, _ = read(args, LAYOUT_FLAGS, lambda field: getattr(exp, field))
    if not changes or all(getattr(exp, k) == v for k, v in changes.items()):
        return exp
    try:  # in range as a catalog entry's own (a micro-batch of 0 would divide by zero)
        out = Experiment.model_validate({**exp.model_dump(), **changes})
    except ValidationError as e:
        field = str(e.errors()[0]["loc"][0]) if e.errors()[0]["loc"] else ""
        raise CatalogError(_out_of_range(LAYOUT_FLAGS, field, e, exp.model_dump(), "layout")) from None
    out.validate()
    return out


def _out_of_range(table: dict[str, tuple[str, Any]], field: str, e: ValidationError, before: dict[str, Any],
                  what: str) -> str:
    """One line for the value of FIELD (a flag of TABLE) the model or layout does not take: the flag, the problem,
    the fix (BEFORE's value of it, the preset's or the catalog entry's, where it has one)."""
    first = e.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    flag = next((f for f, (key, _) in table.items() if key == field), "EXTRA_ARGS")
    shown = f" (the {'preset' if what == 'model' else 'catalog entry'}'s)" if before.get(field) is not None else ""
    example = before.get(field) if before.get(field) is not None else "a value in range"
    return f"{flag} {first.get('input')!r}: {msg}; fix: {flag} {example}{shown}, or drop it"


def check_model(model: dict[str, Any], exp: Experiment) -> None:
    """The splits Megatron needs of a model that extra args changed (the preset's own are the catalog's
    checks): heads over TP, query groups into heads and over TP, layers over PP, hidden into heads.
    CatalogError in one line with the fix."""
    heads, groups_, layers = model["num_attention_heads"], model.get("num_query_groups"), model["num_layers"]
    if model["hidden_size"] % heads:
        raise CatalogError(f"hidden size {model['hidden_size']} does not split into {heads} attention heads; "
                           f"fix: --hidden-size a multiple of {heads}, or --num-attention-heads dividing it")
    if heads % exp.tp:
        raise CatalogError(f"{heads} attention heads cannot be split over TP={exp.tp}; "
                           f"fix: --num-attention-heads a multiple of {exp.tp}")
    if groups_ and (heads % groups_ or groups_ % exp.tp):
        raise CatalogError(f"--num-query-groups {groups_} must divide the {heads} attention heads and split over "
                           f"TP={exp.tp}; fix: --num-query-groups a divisor of {heads} that TP={exp.tp} divides")
    if layers % exp.pp:
        raise CatalogError(f"{layers} layers cannot be split over PP={exp.pp}; fix: --num-layers a multiple of {exp.pp}")


def only_planned(args) -> bool:
    """Extra args made only of flags read back here (MODEL_FLAGS, LAYOUT_FLAGS), each with its value: a
    record of such a run is a configuration the estimator models, whatever the catalog says."""
    try:
        _, rest = read(args, {**MODEL_FLAGS, **LAYOUT_FLAGS}, lambda key: "")
    except CatalogError:
        return False
    return not rest


# Flags megalab reads for checks of its own (launch.cp_problem: megalab's ring attention has no dropout;
# graphs.features_of: the graph's dropout with sequence parallel).
CHECKED_FLAGS = {"--attention-dropout": ("attention_dropout", float), "--hidden-dropout": ("hidden_dropout", float)}


def attention_dropout(args) -> float:
    """The --attention-dropout `args` give Megatron (the last one), else Megatron's default 0.1."""
    values, _ = read(args, CHECKED_FLAGS, lambda key: 0.0)
    return values.get("attention_dropout", 0.1)


def dropout(args) -> float:
    """The larger of the attention and hidden dropout `args` give Megatron (Megatron's default 0.1 each)."""
    values, _ = read(args, CHECKED_FLAGS, lambda key: 0.0)
    return max(values.get("attention_dropout", 0.1), values.get("hidden_dropout", 0.1))
