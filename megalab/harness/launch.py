"""`make <target>`: preflight, launch scripts/train_gpt.sh, monitor the GPUs, write the run record.

The launcher is thin on purpose: the numbers come from the catalog, the flags from the bash
wrapper, the training loop from Megatron. What it adds is what a measurement needs around a run:
checks before a GPU hour is spent, a memory sampler for the whole run, and a record of what ran.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

from megalab.harness import catalog, ports, record
from megalab.harness.catalog import ROOT, CatalogError, Experiment

WRAPPER = ROOT / "scripts" / "train_gpt.sh"
SUPPORTED_MCORE = "0.19."


class LaunchError(RuntimeError):
    """One-line, user-facing: what is wrong and the fix."""


@dataclasses.dataclass
class Options:
    """Make variables (see `make help`), read from the environment."""

    iters: int = 100
    gpu_mem_gb: str | None = None
    dry_run: bool = False
    outdir: Path = ROOT / "outdir"
    spec: str = "megalab"  # megalab | local
    te: str = "auto"  # auto | 1 | 0
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "localhost"
    master_port: int | None = None  # None: a free port on one node, 6000 across nodes (ports.py)
    extra_args: str = ""
    warmup: int = 3
    # megalab's TE-free speed-ups (megalab/runtime/fastpath.py): None = the default for the spec
    fast: str | None = None
    cuda_graph: bool = False  # Megatron's full-iteration CUDA graph (--cuda-graph-impl full_iteration)
    save: bool = False  # SAVE=1: checkpoint into the run dir (torch_dist)
    save_interval: int | None = None  # SAVE_INTERVAL (None: at the end of the run)
    load: Path | None = None  # LOAD=<dir>: resume from a checkpoint
    wandb: bool = False  # WANDB=1
    verbose: bool = False  # VERBOSE=1: the whole log on the terminal, not the progress line
    profile: bool = False  # profile-<id>: a torch profiler trace (not a make variable)
    exit_interval: int | None = None  # stop early, as resume-<id>'s first launch does
    allow_busy_gpus: bool = False  # ALLOW_BUSY_GPUS=1: start beside other processes' GPU memory
    watchdog_silent_s: float = 300  # WATCHDOG_SILENT_S: no output this long after training began: hung
    watchdog_startup_s: float = 900  # WATCHDOG_STARTUP_S: the same before the first iteration
    exit_grace_s: float = 120  # EXIT_GRACE_S: alive this long after the end of training: exit_hang

    @classmethod
    def from_env(cls, env=os.environ) -> "Options":
        def get(name, default):
            v = env.get(name, "")
            return default if v == "" else v

        def flag(name):  # a yes/no make variable: unset, empty, 0, false or no mean no
            return get(name, "0") not in ("0", "false", "no")

        try:
            return cls(
                iters=int(get("ITERS", 100)),
                gpu_mem_gb=get("GPU_MEM_GB", None),
                dry_run=flag("DRY_RUN"),
                outdir=Path(get("OUTDIR", ROOT / "outdir")),
                spec=get("SPEC", "megalab"),
                te=get("TE", "auto"),
                nnodes=int(get("NNODES", 1)),
                node_rank=int(get("NODE_RANK", 0)),
                master_addr=get("MASTER_ADDR", "localhost"),
                master_port=int(get("MASTER_PORT", 0)) or None,
                extra_args=get("EXTRA_ARGS", ""),
                warmup=int(get("WARMUP", 3)),
                fast=get("FAST", None),
                cuda_graph=flag("CUDA_GRAPH"),

                save=flag("SAVE"),
                save_interval=int(get("SAVE_INTERVAL", 0)) or None,
                load=Path(get("LOAD", "")) if get("LOAD", "") else None,
                wandb=flag("WANDB"),
                verbose=flag("VERBOSE"),
                allow_busy_gpus=flag("ALLOW_BUSY_GPUS"),
                watchdog_silent_s=float(get("WATCHDOG_SILENT_S", 300)),
                watchdog_startup_s=float(get("WATCHDOG_STARTUP_S", 900)),
                exit_grace_s=float(get("EXIT_GRACE_S", 120)),
            )
        except ValueError as e:
            raise LaunchError(f"a make variable is not a number ({e}); fix: e.g. ITERS=20 NNODES=2 SAVE_INTERVAL=50") from None


# The optimizer-side fast path is exact (tests/test_fastpath.py) and never slower, so it is on by
# default for megalab's spec; Megatron's stock local spec stays stock, as a fair baseline.
DEFAULT_FAST = "fused_adam,foreach_norm,foreach_scale"


def wants_grouped_gemm(exp: Experiment) -> bool:
    """A MoE target whose preset asks for grouped-GEMM experts (moe_grouped_gemm)."""
    return bool(exp.num_experts) and bool(exp.model_cfg.get("moe_grouped_gemm"))


def fast_patches(opts: Options, impl: str, exp: Experiment | None = None) -> str:
    """MEGALAB_FAST for the entry point: the user's FAST, else the default for this spec.

    The default adds the grouped_gemm lever (megalab/runtime/grouped_experts.py) for a target whose preset
    asks for moe_grouped_gemm: without TE it is that flag's substitute. grouped_gemm is a lever of
    megalab's spec, so it is left out where nothing would read it: under SPEC=local, and (given the
    target) for a model without experts.
    """
    from megalab.runtime import fastpath

    if impl != "local":
        return "none"  # Transformer Engine brings its own fused optimizer and kernels
    if opts.fast is not None:
        value = opts.fast
    elif opts.spec == "megalab":
        value = DEFAULT_FAST + (f",{fastpath.GROUPED_GEMM}" if exp is not None and wants_grouped_gemm(exp) else "")
    else:
        value = "none"
    try:
        names = fastpath.requested({"MEGALAB_FAST": value})
    except ValueError as e:
        raise LaunchError(f"FAST={value}: {str(e).split(': ', 1)[1]}") from None
    if opts.spec != "megalab" or (exp is not None and not exp.num_experts):
        names = [n for n in names if n not in fastpath.SPEC_LEVERS]
    return ",".join(names) or "none"


def te_available() -> str | None:
    if importlib.util.find_spec("transformer_engine") is None:
        return None
    try:
        from importlib.metadata import version

        return version("transformer-engine")
    except Exception:
        return "present"


def transformer_impl(opts: Options) -> str:
    te = te_available()
    if opts.te == "1" and not te:
        raise LaunchError("TE=1 asks for Transformer Engine, which is not installed; "
                          "fix: drop TE=1 (megalab's TE-free spec runs instead) or use the docker image")
    if opts.te == "0" or not te:
        return "local"
    return "transformer_engine"


def gpus_per_node(exp: Experiment, opts: Options) -> int:
    if exp.gpus % opts.nnodes:
        raise LaunchError(f"target {exp.id} needs {exp.gpus} GPUs, which do not split over NNODES={opts.nnodes}; "
                          f"fix: choose NNODES dividing {exp.gpus}")
    return exp.gpus // opts.nnodes


# Preset switches whose Megatron flags need Transformer Engine kernels. Without TE, Megatron's local
# MoE experts are SequentialMLP whatever --moe-grouped-gemm says (the flag only trips a CUDA
# capability check), and --moe-permute-fusion is refused ("fused permutation is not available").
# Without TE neither Megatron flag is passed. megalab's spec has a substitute for the first one:
# GroupedMLP experts (torch._grouped_mm, megalab/runtime/grouped_experts.py), switched on by the
# grouped_gemm lever in MEGALAB_FAST (on by default for such a preset; FAST=none or a FAST list
# without it turns it off). The preflight says which flags were substituted and which dropped; the
# run record keeps both (config.substituted_flags: flag -> lever, config.dropped_flags).
TE_ONLY_PRESET_FLAGS = {"moe_grouped_gemm": "--moe-grouped-gemm", "moe_permute_fusion": "--moe-permute-fusion"}
TE_FREE_SUBSTITUTES = {"moe_grouped_gemm": "grouped_gemm"}  # preset key -> megalab fast-path lever


def substituted_flags(exp: Experiment, impl: str, opts: Options | None = None) -> dict[str, str]:
    """TE-only flags the preset asks for that megalab runs without TE: flag -> the lever doing it."""
    if impl == "transformer_engine" or exp.num_experts is None:
        return {}
    levers = fast_patches(opts or Options(), impl, exp).split(",")
    return {TE_ONLY_PRESET_FLAGS[key]: lever for key, lever in TE_FREE_SUBSTITUTES.items()
            if exp.model_cfg.get(key) and lever in levers}


def dropped_flags(exp: Experiment, impl: str, opts: Options | None = None) -> list[str]:
    """Flags the preset asks for that this run cannot honour (not passed, and not substituted)."""
    if impl == "transformer_engine" or exp.num_experts is None:
        return []
    subs = substituted_flags(exp, impl, opts)
    return [flag for key, flag in TE_ONLY_PRESET_FLAGS.items() if exp.model_cfg.get(key) and flag not in subs]


def wrapper_env(exp: Experiment, opts: Options, impl: str, run_dir: Path | None = None) -> dict[str, str]:
    """The environment scripts/train_gpt.sh reads: the catalog's numbers, by name."""
    m = exp.model_cfg

    def te_flag(key: str) -> int:  # Megatron's flag: with TE only (without, dropped or substituted)
        return int(bool(m.get(key)) and impl == "transformer_engine")

    env = {
        "NUM_LAYERS": m["num_layers"], "HIDDEN_SIZE": m["hidden_size"],
        "NUM_HEADS": m["num_attention_heads"], "SEQ_LEN": m["seq_length"],
        "MAX_POS": m.get("max_position_embeddings", m["seq_length"]), "VOCAB_SIZE": m["vocab_size"],
        "FFN_HIDDEN": m.get("ffn_hidden_size", ""), "DISABLE_BIAS_LINEAR": int(bool(m.get("disable_bias_linear"))),
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
        "GPUS_PER_NODE": gpus_per_node(exp, opts), "NNODES": opts.nnodes, "NODE_RANK": opts.node_rank,
        "MASTER_ADDR": opts.master_addr, "MASTER_PORT": opts.master_port or ports.DEFAULT_PORT,
        "TE_IMPL": impl, "SPEC": opts.spec,
        "EXTRA_ARGS": " ".join([*exp.extra_args, opts.extra_args]).strip(),
        "CUDA_GRAPH": int(opts.cuda_graph), "MEGALAB_FAST": fast_patches(opts, impl, exp),
    }
    env |= {"SAVE": int(opts.save), "SAVE_INTERVAL": opts.save_interval or "", "LOAD": opts.load or "",
            "WANDB": int(opts.wandb), "PROFILE": int(opts.profile), "EXIT_INTERVAL": opts.exit_interval or ""}
    if opts.profile:
        env["PROFILE_START"] = profile_start(opts.iters)
    if run_dir is not None:
        env["RUN_DIR"] = run_dir
    return {k: str(v) for k, v in env.items()}


# ---- checkpoints, wandb, profiling: checked before a GPU hour is spent -----------------------------
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's marker of a complete checkpoint directory


def checkpoint_dir(load: Path) -> Path:
    """The Megatron checkpoint directory LOAD names: itself, or a run dir's checkpoints/."""
    for d in (load, load / "checkpoints"):
        if (d / TRACKER).is_file():
            return d.resolve()
    if not load.is_dir():
        raise LaunchError(f"LOAD={load}: no such directory; fix: LOAD=<run dir>/checkpoints of a run made with SAVE=1")
    raise LaunchError(f"LOAD={load} holds no Megatron checkpoint (no {TRACKER}); "
                      "fix: point LOAD at the checkpoints/ folder of a run made with SAVE=1")


def wandb_mode(env=os.environ) -> str:
    """offline unless an API key is set (scripts/train_gpt.sh applies the same rule)."""
    return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


def check_options(opts: Options) -> Options:
    """One-line errors for SAVE/LOAD/WANDB/profile settings; returns opts with LOAD resolved."""
    if opts.save_interval is not None and opts.save_interval < 0:
        raise LaunchError(f"SAVE_INTERVAL={opts.save_interval} must be positive; fix: e.g. SAVE_INTERVAL=50")
    if opts.load is not None:
        opts = dataclasses.replace(opts, load=checkpoint_dir(opts.load))
    if opts.wandb and importlib.util.find_spec("wandb") is None:
        raise LaunchError("WANDB=1 needs the wandb package, which is not installed; "
                          "fix: pip install wandb (or pip install -e '.[wandb]'), or drop WANDB=1")
    if opts.profile and opts.iters < 3:
        raise LaunchError(f"profiling traces two steps after a warm-up one, ITERS={opts.iters} is too few; "
                          "fix: ITERS=3 or more (the default 100 traces steps 10-11)")
    return opts


def profile_start(iters: int) -> int:
    """First traced step: Megatron's default 10, earlier when the run is shorter (two steps traced)."""
    return min(10, iters - 2)


def outputs_lines(opts: Options) -> list[str]:
    """Preflight lines for checkpoints, wandb and profiling."""
    lines = []
    if opts.save:
        lines.append(f"checkpoint save to <run dir>/checkpoints every {opts.save_interval or opts.iters} "
                     "iterations (torch_dist)")
    if opts.load:
        lines.append(f"checkpoint resume from {opts.load} (weights, optimizer, RNG, iteration count)")
    if opts.exit_interval:
        lines.append(f"stop       at iteration {opts.exit_interval} of {opts.iters}, as an interrupted job would")
    if opts.wandb:
        lines.append(f"wandb      project {os.environ.get('WANDB_PROJECT') or 'megalab'}, mode {wandb_mode()}, "
                     "files in <run dir>/wandb")
    if opts.profile:
        s = profile_start(opts.iters)
        lines.append(f"profile    torch profiler trace of steps {s}-{s + 1} -> <run dir>/torch_profile/"
                     "rank-N.json.gz (open in https://ui.perfetto.dev)")
    return lines


def outputs_config(opts: Options) -> dict:
    """What the run.json config records about checkpoints, wandb and profiling."""
    return {"save": opts.save, "save_interval": (opts.save_interval or opts.iters) if opts.save else None,
            "load": str(opts.load) if opts.load else None, "exit_interval": opts.exit_interval,
            "wandb": {"project": os.environ.get("WANDB_PROJECT") or "megalab", "mode": wandb_mode(),
                      "entity": os.environ.get("WANDB_ENTITY") or None} if opts.wandb else None,
            "profile": opts.profile}


# ---- variants of every target: `make profile-<id>`, `make resume-<id>` -----------------------------
VARIANTS = ("profile", "resume")


def resolve(target: str) -> tuple[Experiment, str | None]:
    """A catalog target, or a variant of one: profile-282 is 282 with timers and a trace."""
    try:
        return catalog.get(target), None
    except CatalogError:
        variant, _, rest = target.partition("-")
        if variant not in VARIANTS or not rest:
            raise
    return catalog.get(rest), variant


def profiled(exp: Experiment, opts: Options) -> tuple[Experiment, Options]:
    """profile-<id>: Megatron's per-microbatch timers plus a torch profiler trace, recorded under
    its own target name so a profiled (slower, synchronised) step never stands in a table."""
    return (dataclasses.replace(exp, id=f"profile-{exp.id}", timing_log_level=2),
            dataclasses.replace(opts, profile=True))


def torchrun_command(env: dict[str, str]) -> str:
    """The exact command the wrapper would run (its own DRY_RUN output)."""
    full = {**os.environ, **env, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(WRAPPER)], env=full, capture_output=True, text=True)
    if out.returncode:
        raise LaunchError(f"scripts/train_gpt.sh refused the settings: {out.stderr.strip().splitlines()[-1]}")
    return out.stdout.strip()


def preflight(exp: Experiment, opts: Options, impl: str, gpus_present: int | None) -> list[str]:
    """Human-readable lines: what will run and why the layout is valid."""
    m = exp.model_cfg
    per_node = gpus_per_node(exp, opts)
    found = "unknown" if gpus_present is None else str(gpus_present)
    lines = [
        f"target     {exp.id}: {exp.about}",
        f"model      {exp.model}: {m['num_layers']} layers, hidden {m['hidden_size']}, "
        f"{m['num_attention_heads']} heads, seq {m['seq_length']}",
        f"GPUs       needs {exp.gpus} ({opts.nnodes} node(s) x {per_node}); found {found} on this node",
        f"layout     DP={exp.dp} = {exp.gpus} GPUs / (TP={exp.tp} x PP={exp.pp} x CP={exp.cp})"
        + (f", EP={exp.ep}" if exp.ep > 1 else "") + (f", expert TP={exp.etp}" if exp.etp > 1 else "")
        + (", SP" if exp.sp else "")
        + (f", {exp.virtual_stages} virtual stages per device of {exp.layers_per_virtual_stage} layer(s)"
           if exp.layers_per_virtual_stage else ""),
        f"batch      GBS={exp.gbs} = MBS {exp.mbs} x DP {exp.dp} x grad-accum {exp.grad_accum} "
        f"(microbatches per step: {exp.num_microbatches})",
        f"memory     ZeRO-2 (distributed optimizer): {'on' if exp.zero2 else 'off'}; "
        f"recompute: {exp.recompute}; GPU cap: {opts.gpu_mem_gb + ' GB' if opts.gpu_mem_gb else 'none'}",
        f"impl       {impl}" + (" (Transformer Engine)" if impl == "transformer_engine"
                                 else f" ({'megalab TE-free spec' if opts.spec == 'megalab' else 'Megatron local spec'})")
        + (f"; CP {exp.cp_comm or 'p2p'} by {'Transformer Engine' if impl == 'transformer_engine' else 'megalab/runtime/cp_attention.py'}"
           if exp.cp > 1 else ""),
        f"speed      fast path: {fast_patches(opts, impl, exp)}; full-iteration CUDA graph: "
        f"{'on' if opts.cuda_graph else 'off (CUDA_GRAPH=1)'}"
        + ("; note: the graph is measured on single-GPU dense runs only (results/bench); with PP, MoE "
           "or CP its capture may fail" if opts.cuda_graph and (exp.pp > 1 or exp.num_experts or exp.cp > 1) else ""),
        f"run        {opts.iters} iterations; step time = median after {opts.warmup} warm-up iterations"
        + (f"; Megatron timers at --timing-log-level {exp.timing_log_level}" if exp.timing_log_level else ""),
    ]
    if exp.num_experts:
        lines.insert(2, f"experts    {exp.num_experts} experts, top-{exp.router_topk} routing")
    for flag, lever in substituted_flags(exp, impl, opts).items():
        lines.append(f"substitute {flag}: megalab's grouped-GEMM experts (torch._grouped_mm, no TE) by the "
                     f"{lever} lever (off: FAST=none or a FAST list without it); recorded as "
                     "config.substituted_flags")
    dropped = dropped_flags(exp, impl, opts)
    if dropped:
        why = {"--moe-grouped-gemm": "the experts run as SequentialMLP, one after another",
               "--moe-permute-fusion": "the token permutation runs unfused"}
        lines.append(f"dropped    {' '.join(dropped)}: need Transformer Engine ("
                     + "; ".join(why[f] for f in dropped) + "); recorded as config.dropped_flags")
    checks = [f"GBS {exp.gbs} % (MBS {exp.mbs} x DP {exp.dp}) == 0",
              f"GPUs {exp.gpus} % (TP x PP x CP = {exp.model_parallel}) == 0"]
    if exp.cp > 1:
        checks.append(f"seq {exp.seq_length} % (2 x CP = {2 * exp.cp}) == 0")
    if exp.cp > 1 and exp.cp_comm == "a2a":
        checks.append(f"heads {m['num_attention_heads']} % (TP x CP = {exp.tp * exp.cp}) == 0")
    lines.append("checks     " + "; ".join(checks) + ": ok")
    return lines


def attention_dropout(exp: Experiment, opts: Options) -> float:
    """The --attention-dropout the run gets: the last one in the extra args, else Megatron's 0.1."""
    args = [*exp.extra_args, *opts.extra_args.split()]
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--attention-dropout"]
    return float(values[-1]) if values else 0.1


def data_problem(exp: Experiment) -> str | None:
    """DATA=<prefix>: a missing dataset, or a SPLIT Megatron cannot build at this sequence length."""
    prefix = os.environ.get("DATA") or "mock"
    if prefix == "mock":
        return None
    if not Path(prefix + ".idx").is_file():
        return f"DATA={prefix}: {prefix}.idx not found; fix: make prepare-data (it prints DATA=...)"
    from megalab.harness import data

    return data.split_problem(prefix, os.environ.get("SPLIT") or data.DEFAULT_SPLIT, int(exp.model_cfg["seq_length"]))


def cp_problem(exp: Experiment, opts: Options, impl: str) -> str | None:
    """Why this target's context parallelism cannot run on this path, or None.

    Megatron has CP only inside Transformer Engine's attention; megalab's TE-free spec has its own
    (megalab/runtime/cp_attention.py) for p2p, all_gather and a2a. Megatron's stock local spec has none.
    """
    if exp.cp <= 1 or impl == "transformer_engine":
        return None
    if opts.spec != "megalab":
        return (f"target {exp.id} uses context parallelism (CP={exp.cp}), which Megatron's local spec lacks "
                "(only Transformer Engine's attention has it); fix: drop SPEC=local (megalab's spec has CP) "
                "or run with Transformer Engine (TE=1)")
    from megalab.runtime.cp_attention import MODES

    mode = exp.cp_comm or "p2p"
    if mode not in MODES:
        return (f"target {exp.id}: cp_comm {mode} is not one of megalab's CP modes ({', '.join(MODES)}); "
                "fix: pick one of those, or run with Transformer Engine (TE=1)")
    if mode == "p2p" and attention_dropout(exp, opts) > 0:
        return (f"target {exp.id}: megalab's ring attention (cp_comm p2p) has no attention dropout and Megatron's "
                "default is 0.1; fix: add --attention-dropout 0 to the target's extra_args (or EXTRA_ARGS)")
    return None


def megatron_check(exp: Experiment, command: str) -> str:
    """Megatron's own verdict on the flags, when megatron-core is importable here."""
    from megalab.harness import validate

    if validate.megatron_available() is None:
        return "megatron   not installed here: Megatron's own argument check skipped"
    try:
        validate.validate(validate.entry_args(command), exp.gpus)
    except validate.MegatronRejected as e:
        raise LaunchError(f"Megatron rejects {exp.id} on {exp.gpus} GPUs: {e}; "
                          "fix the layout in configs/experiments/") from None
    return f"megatron   parse_and_validate_args accepts the flags with WORLD_SIZE={exp.gpus}: ok"


def plan_lines(exp: Experiment, opts: Options, impl: str, inv: dict) -> str:
    """The estimator's prediction (megalab/results/estimate.py); warns, never refuses: OOM is a lesson too."""
    from megalab.results import estimate

    cap = estimate.nominal_gb_to_gib(float(opts.gpu_mem_gb)) if opts.gpu_mem_gb else None
    gpu = (inv.get("names") or [None])[0]
    try:
        est = estimate.estimate(exp, gpu_mem_gib=cap, spec=opts.spec, gpu_name=gpu,
                                fused_adam="fused_adam" in fast_patches(opts, impl, exp))
    except (NotImplementedError, KeyError, ValueError, ZeroDivisionError) as e:  # a prediction is advice
        return f"plan       no estimate for this layout ({e})"
    text = estimate.render(est)
    if not est.fits:
        text += "\nwarning    predicted not to fit in GPU memory: expect an out-of-memory error (starting anyway)"
    return text


def check_megatron_installed() -> None:
    if os.environ.get("MEGATRON_LM"):
        return
    v = __import__("megalab.harness.validate", fromlist=["x"]).megatron_available()
    if v is None:
        raise LaunchError("megatron-core is not installed; fix: pip install --no-deps megatron-core==0.19.2 "
                          "(Python 3.12) or `make setup`")
    if not v.startswith(SUPPORTED_MCORE):
        raise LaunchError(f"megatron-core {v} is installed but megalab targets {SUPPORTED_MCORE}x; "
                          "fix: pip install --no-deps megatron-core==0.19.2")


def check_gpus(exp: Experiment, opts: Options, inv: dict) -> int:
    """GPUs per node, or a LaunchError when NNODES x the GPUs found here fall short of the target's."""
    per_node = gpus_per_node(exp, opts)
    found = inv["count"]
    if found >= per_node:
        return per_node
    why = f" ({inv['why']})" if inv.get("why") else ""
    if found and exp.gpus % found == 0:  # enough GPUs exist across nodes like this one
        fix = (f"NNODES={exp.gpus // found} with NODE_RANK and MASTER_ADDR on each node, "
               f"or make slurm-{exp.id} GPUS_PER_NODE={found}")
    else:
        fix = f"run on {opts.nnodes} node(s) with {per_node} GPUs each, or DRY_RUN=1 to see the plan"
    raise LaunchError(f"target {exp.id} needs {per_node} GPUs per node, found {found}{why}: "
                      f"{opts.nnodes} node(s) x {found} = {opts.nnodes * found} of {exp.gpus} GPUs; fix: {fix}")


def check_busy(per_node: int, opts: Options) -> list[dict]:
    """GPUs of this run that other processes use: refused in one line unless ALLOW_BUSY_GPUS=1."""
    from megalab.harness import monitor

    busy = monitor.busy_gpus(monitor.run_gpu_indices(per_node))
    if busy and not opts.allow_busy_gpus:
        raise LaunchError(f"GPUs in use by other processes ({monitor.describe_busy(busy)}); fix: wait for "
                          "them to end, kill them, or ALLOW_BUSY_GPUS=1 (the record then says so)")
    if busy:
        print(f"warning    ALLOW_BUSY_GPUS=1: starting beside {monitor.describe_busy(busy)}")
    return busy


def make_run_dir(outdir: Path, target: str) -> Path:
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        probe = outdir / ".megalab-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise LaunchError(f"cannot write to OUTDIR {outdir}: {e.strerror or e}; "
                          "fix: OUTDIR=/a/writable/path make ...") from None
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    run_dir = outdir / f"{stamp}___{target}"
    n = 1
    while run_dir.exists():  # never reuse (and so never overwrite) a run directory
        n += 1
        run_dir = outdir / f"{stamp}-{n}___{target}"
    run_dir.mkdir()
    return run_dir


def train_argv() -> list[str]:
    """What one launch runs: the wrapper, which execs torchrun (tests put a fake torchrun here)."""
    return ["bash", str(WRAPPER)]


def _tail(log_path: Path, n: int = 15) -> str:
    lines = log_path.read_text(errors="replace").splitlines()[-n:] if log_path.exists() else []
    return "\n".join(f"log        {line}" for line in lines)


def run(target: str, opts: Options | None = None, exp: Experiment | None = None) -> int:
    """Launch a catalog target (or `exp`, a variant of one built by the benchmark)."""
    opts = opts or Options.from_env()
    exp, variant = (exp, None) if exp is not None else resolve(target)
    if variant == "resume":
        from megalab.harness import resume

        return resume.run(exp, opts)
    if variant == "profile":
        exp, opts = profiled(exp, opts)
    done = launch(exp, opts)
    return 0 if done is None or done[0]["status"] == "ok" else 1


def launch(exp: Experiment, opts: Options) -> tuple[dict, Path] | None:
    """Preflight, and unless DRY_RUN, one launch: its run record and run dir (None for a dry run)."""
    exp.validate()
    opts = check_options(opts)
    asked_port = opts.master_port
    opts = dataclasses.replace(opts, master_port=ports.master_port(asked_port, opts.nnodes))
    impl = transformer_impl(opts)
    from megalab.harness.monitor import GpuMemoryMonitor, gpu_inventory

    inv = gpu_inventory()
    env = wrapper_env(exp, opts, impl)
    command = torchrun_command(env)
    print("\n".join(preflight(exp, opts, impl, inv["count"]) + outputs_lines(opts)))
    print(megatron_check(exp, command))
    print(plan_lines(exp, opts, impl, inv))
    print(ports.describe(asked_port, opts.master_port, opts.nnodes))

    problem = cp_problem(exp, opts, impl) or data_problem(exp)  # a dry run only warns
    if opts.dry_run:
        if problem:
            print(f"warning    {problem}")
        print("command    (DRY_RUN=1, not started)")
        print(command)
        return None

    if problem:
        raise LaunchError(problem)
    per_node = check_gpus(exp, opts, inv)
    busy = check_busy(per_node, opts)
    check_megatron_installed()
    run_dir = make_run_dir(opts.outdir, exp.id)
    env = wrapper_env(exp, opts, impl, run_dir)
    command = torchrun_command(env)
    child_env = {**os.environ, **env}
    if opts.gpu_mem_gb:
        child_env["MEGALAB_GPU_MEM_GB"] = opts.gpu_mem_gb
    print(f"run dir    {run_dir}  (full log: logs.txt)")

    started = dt.datetime.now(dt.timezone.utc)
    from megalab.harness import supervise
    from megalab.harness.progress import Progress

    progress = Progress(verbose=opts.verbose)
    quiet_node = opts.nnodes > 1 and opts.node_rank != opts.nnodes - 1  # the last node logs the iterations
    limits = supervise.Limits(silent_s=math.inf if quiet_node else opts.watchdog_silent_s,
                              startup_s=math.inf if quiet_node else opts.watchdog_startup_s,
                              exit_grace_s=opts.exit_grace_s)
    with GpuMemoryMonitor(run_dir / "gpu_memory.csv", num_gpus=per_node) as mon:
        try:
            outcome = supervise.supervise(train_argv(), env=child_env, log_path=run_dir / "logs.txt",
                                          on_line=progress.feed, limits=limits)
        finally:
            progress.close()
    rc = outcome.returncode
    if outcome.reason:
        print(f"ended      {outcome.reason}: {outcome.detail}")
    ended = dt.datetime.now(dt.timezone.utc)

    rec = record.build(
        exp=exp, opts=opts, impl=impl, command=command, run_dir=run_dir, returncode=rc,
        interrupted=False, monitor=mon, inventory=inv, started=started, ended=ended,
        hostname=socket.gethostname(), dropped_flags=dropped_flags(exp, impl, opts),
        substituted_flags=substituted_flags(exp, impl, opts), outputs=outputs_config(opts),
        outcome=outcome, busy_gpus=busy,
    )
    record.write(rec, run_dir / "run.json")
    if rec["status"] != "ok" and not opts.verbose:
        print(_tail(run_dir / "logs.txt"))
    print(record.one_line(rec))
    for line in record.profile_lines(rec, run_dir):
        print(line)
    if outcome.reason == "killed":  # a stop asked for stops every caller (bench, resume, batch) too
        raise SystemExit(outcome.exit_code)
    return rec, run_dir
