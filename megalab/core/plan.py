"""One run, resolved once: `build(exp, opts, machine)` -> a frozen RunPlan.

Everything a launch decides lives here and nowhere else: the transformer implementation, the
fast-path levers, the preset flags substituted or dropped without Transformer Engine, the CUDA
graph (with its reason), the layout per node, the run dir, the child environment, and the
Megatron argv, built in Python in the same named groups as scripts/train_gpt.sh's arrays. The
preflight, Megatron's own check, the record, slurm, resume, the bench and the printed command all
read the plan; the launcher runs `plan.argv` as it is (no shell). The bash wrapper stays the
readable, runnable view of the same flags: tests/test_plan.py runs it for every target and checks
its argv equals `plan.argv`, so the two cannot drift. It is never parsed back.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
from pathlib import Path
from types import MappingProxyType

from megalab.core import catalog, ports, variables
from megalab.core.paths import ROOT
from megalab.core.catalog import Experiment
from megalab.core.variables import LaunchError, Options
from megalab.core import gpus as gpus_table
from megalab.runtime import levers
from megalab.core import graphs
from megalab.core import estimate

WRAPPER = ROOT / "scripts" / "train_gpt.sh"
ENTRY = ROOT / "megalab" / "runtime" / "pretrain_gpt.py"
RUN_DIR_PLACEHOLDER = "RUN_DIR"  # a dry run has no run dir yet: its paths show this

# On by default for megalab's spec (why: variables.DEFAULT_FAST); Megatron's stock local spec stays
# stock, as a fair baseline.
DEFAULT_FAST = ",".join(variables.DEFAULT_FAST)

# Preset switches whose Megatron flags need Transformer Engine kernels. Without TE, Megatron's local
# MoE experts are SequentialMLP whatever --moe-grouped-gemm says (the flag only trips a CUDA
# capability check), and --moe-permute-fusion is refused ("fused permutation is not available").
# Without TE neither Megatron flag is passed. megalab's spec has a substitute for the first one:
# GroupedMLP experts (torch._grouped_mm, megalab/runtime/grouped_experts.py), switched on by the
# grouped_gemm lever (on by default for such a preset; FAST=none or a FAST list without it turns it
# off). The record keeps both (config.substituted_flags: flag -> lever, config.dropped_flags).
TE_ONLY_PRESET_FLAGS = {"moe_grouped_gemm": "--moe-grouped-gemm", "moe_permute_fusion": "--moe-permute-fusion"}
TE_FREE_SUBSTITUTES = {"moe_grouped_gemm": levers.GROUPED_GEMM}  # preset key -> megalab fast-path lever

# Multicast over NVLink stays off (shared rigs); 1 connection keeps TP/SP comm ordered for Megatron.
# The user's own value of any of these wins, as in the wrapper (${VAR:-default}).
CHILD_ENV_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                      "NVSHMEM_DISABLE_NVLS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}

GROUPS = ("DISTRIBUTED", "MODEL", "TRAINING", "PARALLEL", "MOE", "RECOMPUTE", "DATA", "LOGGING",
          "CHECKPOINT", "PROFILE", "IMPL", "PERF", "EXTRA")


@dataclasses.dataclass(frozen=True)
class Machine:
    """What this machine has: GPUs found (None: not counted), Transformer Engine's version, and the
    GPU a plan is made for: its NVML name and the memory a run may use (GiB; GPU_MEM_GB's cap where
    set). Without a GPU that is the planning GPU (GPU=h200; default H100 80GB, or with GPU_MEM_GB the
    smallest card holding it); `warning` says where GPU= contradicts the GPU present."""

    gpus: int | None = None
    te: str | None = None
    gpu_name: str = gpus_table.DEFAULT_GPU_NAME
    gpu_memory_gib: float = gpus_table.default_gpu().memory_gib
    warning: str | None = None

    @classmethod
    def here(cls, gpus: int | None = None, names: list[str] | tuple = (), memory_mib: list[int] | tuple = (),
             opts: Options | None = None) -> "Machine":
        name, mem, warning = planning_gpu(list(names), list(memory_mib), opts or Options())
        return cls(gpus=gpus, te=te_available(), gpu_name=name, gpu_memory_gib=mem, warning=warning)


def planning_gpu(names: list[str], memory_mib: list[int], opts: Options) -> tuple[str, float, str | None]:
    """(NVML name, usable GiB, warning) of the GPU this run is planned for: the first GPU found, else
    GPU=, else the H100 80GB (or, with GPU_MEM_GB, the smallest datasheet card holding it)."""
    try:
        asked = gpus_table.planning_name(opts.gpu) if opts.gpu else None
    except ValueError as e:
        raise LaunchError(str(e)) from None
    warning = None
    if names:
        name = names[0]
        if asked and gpus_table.lookup(asked) != gpus_table.lookup(name):
            warning = f"GPU={opts.gpu} but this machine has {name}: planning for {name}; fix: drop GPU="
        card = memory_mib[0] / 1024 if memory_mib else (gpus_table.lookup(name) or gpus_table.default_gpu()).memory_gib
    else:
        name = asked or (gpus_table.holding(float(opts.gpu_mem_gb)) if opts.gpu_mem_gb else gpus_table.DEFAULT_GPU_NAME)
        card = (gpus_table.lookup(name) or gpus_table.default_gpu()).memory_gib
    if opts.gpu_mem_gb:  # the cap, never more than the card has
        card = min(card, gpus_table.nominal_gb_to_gib(float(opts.gpu_mem_gb)))
    return name, card, warning


def te_available() -> str | None:
    try:
        if importlib.util.find_spec("transformer_engine") is None:
            return None
    except ImportError:  # present but not importable here
        return None
    try:
        from importlib.metadata import version

        return version("transformer-engine")
    except Exception:
        return "present"


# ---- the decisions, each one function of (experiment, options, machine) ---------------------------

def transformer_impl(opts: Options, te: str | None = None) -> str:
    if opts.te == "1" and not te:
        raise LaunchError("TE=1 asks for Transformer Engine, which is not installed; "
                          "fix: drop TE=1 (megalab's TE-free spec runs instead) or use the docker image")
    if opts.te == "0" or not te:
        return "local"
    return "transformer_engine"


def wants_grouped_gemm(exp: Experiment) -> bool:
    """A MoE target whose preset asks for grouped-GEMM experts (moe_grouped_gemm)."""
    return levers.GROUPED_GEMM in variables.default_fast(exp.num_experts, exp.model_cfg)


def fast_levers(opts: Options, impl: str, exp: Experiment | None = None) -> tuple[str, ...]:
    """The fast-path levers (MEGALAB_FAST): the user's FAST, else the default for this spec.

    The default adds grouped_gemm for a target whose preset asks for moe_grouped_gemm: without TE it
    is that flag's substitute. grouped_gemm is a lever of megalab's spec, so it is left out where
    nothing would read it: under SPEC=local, and (given the target) for a model without experts.
    """
    if impl != "local":
        return ()  # Transformer Engine brings its own fused optimizer and kernels
    if opts.fast is not None:
        value = opts.fast
    elif opts.spec == "megalab":
        value = ",".join(variables.default_fast(exp.num_experts, exp.model_cfg) if exp is not None
                         else variables.DEFAULT_FAST)
    else:
        value = "none"
    names = variables.fast_names(value)
    if opts.spec != "megalab" or (exp is not None and not exp.num_experts):
        names = [n for n in names if n not in levers.SPEC_LEVERS]
    if opts.megatron_lm:  # Megatron-LM's own pretrain_gpt.py installs no patch; the spec still reads its levers
        names = [n for n in names if n in levers.SPEC_LEVERS]
    return tuple(names)


def fastpath(opts: Options, impl: str, exp: Experiment | None = None) -> str:
    """The levers as MEGALAB_FAST spells them ("none" for none)."""
    return ",".join(fast_levers(opts, impl, exp)) or "none"


def substituted_flags(exp: Experiment, impl: str, fast: tuple[str, ...]) -> dict[str, str]:
    """TE-only flags the preset asks for that megalab runs without TE: flag -> the lever doing it."""
    if impl == "transformer_engine" or exp.num_experts is None:
        return {}
    return {TE_ONLY_PRESET_FLAGS[key]: lever for key, lever in TE_FREE_SUBSTITUTES.items()
            if exp.model_cfg.get(key) and lever in fast}


def dropped_flags(exp: Experiment, impl: str, fast: tuple[str, ...]) -> list[str]:
    """Flags the preset asks for that this run cannot honour (not passed, and not substituted)."""
    if impl == "transformer_engine" or exp.num_experts is None:
        return []
    subs = substituted_flags(exp, impl, fast)
    return [flag for key, flag in TE_ONLY_PRESET_FLAGS.items() if exp.model_cfg.get(key) and flag not in subs]


def cuda_graph(exp: Experiment, opts: Options, impl: str, machine: Machine, fast: tuple[str, ...],
               model: dict) -> tuple[bool, str]:
    """CUDA_GRAPH=1 / 0 / auto -> (on, why), by megalab/core/graphs.py's policy. A bool (the
    bench's levers) reads as 1 / 0. auto needs the memory plan: the estimator's peak without the
    graph, against the GPU_MEM_GB cap or the GPU's own memory, for `model` (effective_model: the model
    the run builds)."""
    requested = {True: "1", False: "0"}.get(opts.cuda_graph, opts.cuda_graph)
    features = graphs.features_of(exp, impl=impl, spec=opts.spec, profile=opts.profile, nnodes=opts.nnodes,
                                  exit_interval=opts.exit_interval)
    peak = capacity = None
    if requested == "auto" and not features:
        # the GPU found, else the planning GPU (GPU=); never more than the GPU_MEM_GB cap
        capacity = machine.gpu_memory_gib
        if opts.gpu_mem_gb:
            capacity = min(capacity, estimate.nominal_gb_to_gib(float(opts.gpu_mem_gb)))
        try:
            peak = estimate.estimate(exp, spec=opts.spec, gpu_name=machine.gpu_name, model_cfg=model,
                                     **estimate.lever_flags(fast)).peak_gib
        except (NotImplementedError, KeyError, ValueError, ZeroDivisionError):
            peak = None  # no plan for this layout: graphs.decide says so
    try:
        d = graphs.decide(requested, features=features, predicted_peak_gib=peak, capacity_gib=capacity)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    return d.on, d.reason


def gpus_per_node(exp: Experiment, opts: Options) -> int:
    if exp.gpus % opts.nnodes:
        raise LaunchError(f"target {exp.id} needs {exp.gpus} GPUs, which do not split over NNODES={opts.nnodes}; "
                          f"fix: choose NNODES dividing {exp.gpus}")
    return exp.gpus // opts.nnodes


def profile_start(iters: int) -> int:
    """First traced step: Megatron's default 10, earlier when the run is shorter (two steps traced)."""
    return min(10, iters - 2)


def wandb_mode(environ=os.environ) -> str:
    """offline unless an API key is set (scripts/train_gpt.sh applies the same rule)."""
    return environ.get("WANDB_MODE") or ("online" if environ.get("WANDB_API_KEY") else "offline")


def extra_args(exp: Experiment, opts: Options) -> tuple[str, ...]:
    """The catalog's own extra flags, then the user's EXTRA_ARGS split as a shell would (shlex)."""
    try:
        return (*exp.extra_args, *shlex.split(opts.extra_args))
    except ValueError as e:
        raise LaunchError(f"EXTRA_ARGS={opts.extra_args!r} is not a shell word list ({e}); "
                          "fix: balance its quotes, e.g. EXTRA_ARGS='--seed 7'") from None


def modern_model_flags(m: dict) -> list:
    """The preset's modern-decoder keys as Megatron flags (scripts/train_gpt.sh: the same, from
    NORMALIZATION, SWIGLU, POS_EMB, ROTARY_BASE, NUM_QUERY_GROUPS, UNTIE). RoPE always goes with
    --no-rope-fusion: Megatron's fused RoPE needs TE >= 1.4 ("apply_rope_fusion is not available")."""
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


def effective_model(exp: Experiment, opts: Options) -> dict:
    """The model this run builds: the preset overridden by the model flags of the extra args."""
    return catalog.effective_model(exp.model_cfg, extra_args(exp, opts))


# ---- the plan -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RunPlan:
    exp: Experiment
    opts: Options
    machine: Machine
    impl: str  # transformer_engine | local
    spec: str | None  # megalab | local under impl local; None with TE
    fast: tuple[str, ...]
    model: MappingProxyType  # the model this run builds: the preset with EXTRA_ARGS' model flags (resolved once)
    substituted_flags: MappingProxyType
    dropped_flags: tuple[str, ...]
    cuda_graph: bool
    cuda_graph_reason: str
    gpus_per_node: int
    master_port: int
    run_dir: Path | None  # None for a dry run
    groups: MappingProxyType  # group name -> tuple of argv items, in GROUPS order
    entry: str  # the entry-point script torchrun starts
    env: MappingProxyType  # what the child environment adds to (or sets in) the launcher's

    @property
    def fastpath(self) -> str:
        return ",".join(self.fast) or "none"

    @property
    def entry_args(self) -> list[str]:
        """Megatron's arguments: everything after the entry point (what validate checks)."""
        return [a for g in GROUPS[1:] for a in self.groups[g]]

    @property
    def argv(self) -> list[str]:
        return ["torchrun", *self.groups["DISTRIBUTED"], self.entry, *self.entry_args]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def placed(self, run_dir: Path, environ=os.environ) -> "RunPlan":
        """The same decisions with the run directory the launcher just made: only the argv items that
        name paths change (checkpoints, TensorBoard, profiler traces), nothing is decided again."""
        groups = _argv_groups(self.exp, self.opts, self.impl, self.fast, self.cuda_graph, self.gpus_per_node,
                              run_dir, environ)
        return dataclasses.replace(self, run_dir=run_dir, groups=MappingProxyType(groups))

    def to_dict(self) -> dict:
        """The record's `intent`: what the launcher decided, as JSON."""
        return {"target": self.exp.id, "impl": self.impl, "spec": self.spec, "fastpath": self.fastpath,
                "substituted_flags": dict(self.substituted_flags), "dropped_flags": list(self.dropped_flags),
                "cuda_graph": self.cuda_graph, "cuda_graph_reason": self.cuda_graph_reason,
                "gpus": self.exp.gpus, "nnodes": self.opts.nnodes, "node_rank": self.opts.node_rank,
                "gpus_per_node": self.gpus_per_node, "master_addr": self.opts.master_addr,
                "master_port": self.master_port, "machine": dataclasses.asdict(self.machine),
                "run_dir": str(self.run_dir) if self.run_dir else None,
                "argv": self.argv, "groups": {g: list(a) for g, a in self.groups.items()},
                "env": dict(self.env)}


def build(exp: Experiment, opts: Options, machine: Machine | None = None, run_dir: Path | None = None,
          environ=os.environ) -> RunPlan:
    """Resolve one run. `environ` supplies what the wrapper reads beyond the make variables
    (WANDB_API_KEY/WANDB_MODE, PYTHONPATH, the NCCL defaults a user may override)."""
    machine = machine or Machine()
    try:  # EXTRA_ARGS' batch/layout flags: the plan, its checks and the estimator see what Megatron gets
        exp = catalog.effective_experiment(exp, extra_args(exp, opts))
    except catalog.CatalogError as e:
        raise LaunchError(f"EXTRA_ARGS: {e}") from None
    if opts.master_port is None:  # one node: a free port; several: 6000 (the launcher resolves it first)
        opts = dataclasses.replace(opts, master_port=ports.master_port(None, opts.nnodes))
    impl = transformer_impl(opts, machine.te)
    fast = fast_levers(opts, impl, exp)
    model = effective_model(exp, opts)
    graph, why = cuda_graph(exp, opts, impl, machine, fast, model)
    per_node = gpus_per_node(exp, opts)
    groups = _argv_groups(exp, opts, impl, fast, graph, per_node, run_dir, environ)
    entry = str(Path(opts.megatron_lm) / "pretrain_gpt.py") if opts.megatron_lm else str(ENTRY)
    env = {k: environ.get(k) or v for k, v in CHILD_ENV_DEFAULTS.items()}
    env["PYTHONPATH"] = ":".join(p for p in (str(ROOT), opts.megatron_lm, environ.get("PYTHONPATH", "")) if p)
    env["MEGALAB_FAST"] = ",".join(fast) or "none"
    if opts.gpu_mem_gb:
        env["MEGALAB_GPU_MEM_GB"] = opts.gpu_mem_gb
    if opts.wandb and not environ.get("WANDB_API_KEY"):
        env["WANDB_MODE"] = wandb_mode(environ)  # no key: log offline into the run dir, never prompt
    return RunPlan(exp=exp, opts=opts, machine=machine, impl=impl, spec=opts.spec if impl == "local" else None,
                   fast=fast, model=MappingProxyType(model), substituted_flags=MappingProxyType(substituted_flags(exp, impl, fast)),
                   dropped_flags=tuple(dropped_flags(exp, impl, fast)), cuda_graph=graph, cuda_graph_reason=why,
                   gpus_per_node=per_node, master_port=opts.master_port, run_dir=run_dir,
                   groups=MappingProxyType(groups), entry=entry, env=MappingProxyType(env))


def _argv_groups(exp: Experiment, opts: Options, impl: str, fast: tuple[str, ...], graph: bool, per_node: int,
                 run_dir: Path | None, environ) -> dict[str, tuple[str, ...]]:
    """scripts/train_gpt.sh's arrays, one for one (same names, same order, same conditions)."""
    m = exp.model_cfg
    out = str(run_dir) if run_dir is not None else RUN_DIR_PLACEHOLDER
    a: dict[str, list] = {g: [] for g in GROUPS}
    a["DISTRIBUTED"] = ["--nproc_per_node", per_node, "--nnodes", opts.nnodes, "--node_rank", opts.node_rank,
                        "--master_addr", opts.master_addr, "--master_port", opts.master_port]
    a["MODEL"] = ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"],
                  "--num-attention-heads", m["num_attention_heads"], "--seq-length", m["seq_length"],
                  "--max-position-embeddings", m.get("max_position_embeddings", m["seq_length"]),
                  "--attention-backend", "auto"]
    if m.get("ffn_hidden_size"):
        a["MODEL"] += ["--ffn-hidden-size", m["ffn_hidden_size"]]
    if m.get("disable_bias_linear"):
        a["MODEL"] += ["--disable-bias-linear"]
    a["MODEL"] += modern_model_flags(m)
    a["TRAINING"] = ["--micro-batch-size", exp.mbs, "--global-batch-size", exp.gbs, "--train-iters", opts.iters,
                     "--lr", "6.0e-5", "--min-lr", "6.0e-6", "--lr-decay-style", "cosine",
                     "--lr-warmup-fraction", ".001", "--weight-decay", "0.1", "--adam-beta1", "0.9",
                     "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad", "1.0", "--bf16"]
    p = a["PARALLEL"] = ["--tensor-model-parallel-size", exp.tp, "--pipeline-model-parallel-size", exp.pp]
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
    if exp.num_experts:
        moe = a["MOE"] = ["--num-experts", exp.num_experts, "--moe-router-topk", exp.router_topk,
                          "--expert-model-parallel-size", exp.ep, "--expert-tensor-parallel-size", exp.etp,
                          "--moe-token-dispatcher-type", m.get("moe_token_dispatcher", "alltoall")]
        if m.get("moe_ffn_hidden_size"):
            moe += ["--moe-ffn-hidden-size", m["moe_ffn_hidden_size"]]
        if m.get("moe_router_force_load_balancing"):
            moe += ["--moe-router-force-load-balancing"]
        if impl == "transformer_engine":  # TE kernels only: without TE substituted or dropped (above)
            moe += [flag for key, flag in TE_ONLY_PRESET_FLAGS.items() if m.get(key)]
    if exp.recompute == "selective":
        a["RECOMPUTE"] = ["--recompute-granularity", "selective"]
    elif exp.recompute.startswith("full-"):
        _, method, layers = exp.recompute.split("-")
        a["RECOMPUTE"] = ["--recompute-granularity", "full", "--recompute-method", method,
                          "--recompute-num-layers", layers]
    elif exp.recompute != "none":
        raise LaunchError(f"target {exp.id}: unknown recompute {exp.recompute} "
                          "(none|selective|full-uniform-N|full-block-N); fix: the catalog entry")
    if opts.data == "mock":
        a["DATA"] = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", m["vocab_size"],
                     "--split", opts.split]
    elif opts.tokenizer_model:
        a["DATA"] = ["--data-path", opts.data, "--tokenizer-type", "HuggingFaceTokenizer",
                     "--tokenizer-model", opts.tokenizer_model, "--split", opts.split]
    elif opts.vocab_file and opts.merge_file:
        a["DATA"] = ["--data-path", opts.data, "--tokenizer-type", "GPT2BPETokenizer",
                     "--vocab-file", opts.vocab_file, "--merge-file", opts.merge_file, "--split", opts.split]
    else:
        raise LaunchError(f"DATA={opts.data} needs its tokenizer; fix: set TOKENIZER_MODEL "
                          "(or VOCAB_FILE and MERGE_FILE), as make prepare-data prints")
    log = a["LOGGING"] = ["--log-interval", 1, "--log-throughput", "--eval-iters", 0, "--eval-interval", opts.iters,
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
    ck = a["CHECKPOINT"]
    if opts.save:
        ck += ["--save", f"{out}/checkpoints", "--save-interval", opts.save_interval or opts.iters]
    if opts.load:
        ck += ["--load", str(opts.load), "--exit-on-missing-checkpoint"]
    if ck:
        ck += ["--ckpt-format", "torch_dist"]
    if opts.exit_interval:
        ck += ["--exit-interval", opts.exit_interval]
    if opts.profile:
        start = profile_start(opts.iters)
        a["PROFILE"] = ["--profile", "--use-pytorch-profiler", "--profile-step-start", start,
                        "--profile-step-end", start + 2]
    if impl == "transformer_engine":
        a["IMPL"] = ["--transformer-impl", "transformer_engine"]
    else:
        a["IMPL"] = ["--transformer-impl", "local", "--no-persist-layer-norm"]
        if levers.FUSED_WGRAD not in fast:  # the wgrad GEMM adds into main_grad: megalab's stand-in for apex
            a["IMPL"] += ["--no-gradient-accumulation-fusion"]
        a["IMPL"] += ["--no-masked-softmax-fusion"]
        if opts.spec == "megalab":
            a["IMPL"] += ["--spec", "megalab.runtime.spec", "megalab_layer_spec"]
    if graph:
        a["PERF"] = ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"]
    a["EXTRA"] = list(extra_args(exp, opts))
    return {g: tuple(str(x) for x in a[g]) for g in GROUPS}


def wrapper_env(plan: RunPlan) -> dict[str, str]:
    """The environment under which scripts/train_gpt.sh builds this plan's argv (the readable view:
    `VAR=... scripts/train_gpt.sh` by hand, and the test that it agrees with `plan.argv`)."""
    exp, opts, m = plan.exp, plan.opts, plan.exp.model_cfg

    def te_flag(key: str) -> int:  # Megatron's flag: with TE only (without, dropped or substituted)
        return int(bool(m.get(key)) and plan.impl == "transformer_engine")

    env = {
        "NUM_LAYERS": m["num_layers"], "HIDDEN_SIZE": m["hidden_size"],
        "NUM_HEADS": m["num_attention_heads"], "SEQ_LEN": m["seq_length"],
        "MAX_POS": m.get("max_position_embeddings", m["seq_length"]), "VOCAB_SIZE": m["vocab_size"],
        "FFN_HIDDEN": m.get("ffn_hidden_size", ""), "DISABLE_BIAS_LINEAR": int(bool(m.get("disable_bias_linear"))),
        "NORMALIZATION": m.get("normalization", "LayerNorm"), "SWIGLU": int(bool(m.get("swiglu"))),
        "POS_EMB": m.get("position_embedding", "learned_absolute"), "ROTARY_BASE": m.get("rotary_base", ""),
        "NUM_QUERY_GROUPS": m.get("num_query_groups", ""), "UNTIE": int(bool(m.get("untie_embeddings"))),
        "GBS": exp.gbs, "MBS": exp.mbs, "ITERS": opts.iters,
        "TP": exp.tp, "PP": exp.pp, "CP": exp.cp, "EP": exp.ep, "ETP": exp.etp,
        "SP": int(exp.sp), "ZERO2": int(exp.zero2), "RECOMPUTE": exp.recompute,
        "VPP_LAYERS": exp.layers_per_virtual_stage or "", "CP_COMM": exp.cp_comm or "p2p",
        "NUM_EXPERTS": exp.num_experts or "", "TOPK": (exp.router_topk or "") if exp.num_experts else "",
        "MOE_FFN_HIDDEN": m.get("moe_ffn_hidden_size", ""),
        "MOE_DISPATCHER": m.get("moe_token_dispatcher", "alltoall"),
        "MOE_FORCE_BALANCE": int(bool(m.get("moe_router_force_load_balancing"))),
        "MOE_GROUPED_GEMM": te_flag("moe_grouped_gemm"), "MOE_PERMUTE_FUSION": te_flag("moe_permute_fusion"),
        "TIMING_LOG_LEVEL": exp.timing_log_level,
        "GPUS_PER_NODE": plan.gpus_per_node, "NNODES": opts.nnodes, "NODE_RANK": opts.node_rank,
        "MASTER_ADDR": opts.master_addr, "MASTER_PORT": plan.master_port,
        "TE_IMPL": plan.impl, "SPEC": opts.spec,
        "EXTRA_ARGS": shlex.join(extra_args(exp, opts)),
        "CUDA_GRAPH": int(plan.cuda_graph), "MEGALAB_FAST": plan.fastpath,
        "SAVE": int(opts.save), "SAVE_INTERVAL": opts.save_interval or "", "LOAD": opts.load or "",
        "WANDB": int(opts.wandb), "WANDB_PROJECT": opts.wandb_project, "WANDB_ENTITY": opts.wandb_entity,
        "PROFILE": int(opts.profile), "EXIT_INTERVAL": opts.exit_interval or "",
        "DATA": opts.data, "SPLIT": opts.split, "TOKENIZER_MODEL": opts.tokenizer_model,
        "VOCAB_FILE": opts.vocab_file, "MERGE_FILE": opts.merge_file, "MEGATRON_LM": opts.megatron_lm,
    }
    if opts.profile:
        env["PROFILE_START"] = profile_start(opts.iters)
    if plan.run_dir is not None:
        env["RUN_DIR"] = plan.run_dir
    return {k: str(v) for k, v in env.items()}
