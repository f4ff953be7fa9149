"""One run, resolved once: `build(exp, opts, machine)` -> a frozen RunPlan, the record's intent.

Everything a launch decides lives here and nowhere else: the transformer implementation, the
fast-path levers, the preset flags substituted or dropped without Transformer Engine, the CUDA
graph (with its reason), the layout per node, the run dir, the child environment, and the
Megatron argv in named groups (megalab/core/flags.py writes them). The preflight, Megatron's own
check, the record, slurm, resume, the bench and the printed command all read the plan; the
launcher writes it as RUN_DIR/launch.sh (launchscript.py: the groups as bash arrays) and runs
exactly that file.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
from pathlib import Path

from pydantic import ConfigDict, Field, SkipValidation

from megalab.core import catalog, flags, launchscript, ports, variables
from megalab.core.paths import ROOT
from megalab.core.catalog import Experiment
from megalab.core.flags import GROUPS, TE_ONLY_PRESET_FLAGS
from megalab.core.schema import Intent, Machine
from megalab.core.variables import LaunchError, Options
from megalab.core import gpus as gpus_table
from megalab.runtime import levers
from megalab.runtime.memcap import nominal_gb_to_gib
from megalab.core import graphs
from megalab.core import estimate

ENTRY = ROOT / "megalab" / "runtime" / "pretrain_gpt.py"

# Preset keys whose TE-only flags (flags.TE_ONLY_PRESET_FLAGS) megalab's spec runs without TE: the
# fast-path lever that stands in for each.
TE_FREE_SUBSTITUTES = {"moe_grouped_gemm": levers.GROUPED_GEMM}  # preset key -> megalab fast-path lever

# Multicast over NVLink stays off (shared rigs); 1 connection keeps TP/SP comm ordered for Megatron.
# The user's own value of any of these wins (the launcher's environment, when the plan is made).
CHILD_ENV_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                      "NVSHMEM_DISABLE_NVLS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def machine_of(gpus: int | None = None, names: list[str] | tuple = (), memory_mib: list[int] | tuple = (),
               opts: Options | None = None, te: str | None | bool = True) -> Machine:
    """The machine a run is planned for (schema.Machine, as the record keeps it): the GPUs found (their count,
    NVML names and memory), else the planning GPU (GPU=, GPU_MEM_GB), with the cap applied once; `te`: Transformer
    Engine's version, looked up here where True."""
    name, mem, warning = planning_gpu(list(names), list(memory_mib), opts or Options())
    return Machine(gpus=gpus, te=te_available() if te is True else te, gpu_name=name, gpu_memory_gib=mem,
                   warning=warning)


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
        name = asked or (gpus_table.holding(opts.gpu_mem_gb) if opts.gpu_mem_gb else gpus_table.DEFAULT_GPU_NAME)
        card = (gpus_table.lookup(name) or gpus_table.default_gpu()).memory_gib
    return name, capped(card, opts.gpu_mem_gb), warning


def capped(memory_gib: float, gpu_mem_gb: float | None) -> float:
    """The memory a run may use: the card's, never more than GPU_MEM_GB's cap."""
    if not gpu_mem_gb or memory_gib is None:
        return memory_gib
    return min(memory_gib, nominal_gb_to_gib(gpu_mem_gb))


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
    return levers.GROUPED_GEMM in levers.default(exp.num_experts, exp.model_cfg)


def fast_levers(opts: Options, impl: str, exp: Experiment | None = None) -> tuple[str, ...]:
    """The fast-path levers (megalab/runtime/levers.py): the user's FAST, else the default for this spec and model.

    A spec lever (grouped_gemm) is left out where nothing would read it: under SPEC=local, and (given the target)
    for a model without experts; Megatron-LM's own pretrain_gpt.py installs no patch, so only the spec's stay."""
    if impl != "local":
        return ()  # Transformer Engine brings its own fused optimizer and kernels
    if opts.fast is not None:
        names = opts.fast
    elif opts.spec == "megalab":
        names = levers.default(exp.num_experts, exp.model_cfg) if exp is not None else levers.EVERY
    else:
        names = ()
    problem = levers.problem(names)
    if problem:
        raise LaunchError(f"FAST={levers.text(names)}: {problem}")
    if opts.spec != "megalab" or (exp is not None and not exp.num_experts):
        names = tuple(n for n in names if n not in levers.SPEC_LEVERS)
    if opts.save or opts.load:  # Megatron's optimizer checkpoint maps its state per expert Parameter
        names = tuple(n for n in names if n != levers.EXPERT_STACK)
    if opts.megatron_lm:
        names = tuple(n for n in names if n in levers.SPEC_LEVERS)
    return names


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
    the run builds); its reason quotes the peak the plan prints (with the graph where it is on)."""
    requested = {True: "1", False: "0"}.get(opts.cuda_graph, opts.cuda_graph)
    features = graphs.features_of(exp, impl=impl, spec=opts.spec, profile=opts.profile, nnodes=opts.nnodes,
                                  exit_interval=opts.exit_interval, fast=fast, extra_args=opts.extra_args)
    peak = graph_peak = capacity = None
    if requested == "auto" and not features:
        capacity = machine.gpu_memory_gib  # the GPU found, else the planning GPU; GPU_MEM_GB's cap applied
        try:  # one estimate, with the graph: its peak without it decides, its peak with it is printed
            est = estimate.estimate(exp, spec=opts.spec, gpu_name=machine.gpu_name, model_cfg=model,
                                    cuda_graph=True, fast=fast)
            peak, graph_peak = est.peak_without_graph_gib, est.peak_gib
        except (NotImplementedError, KeyError, ValueError, ZeroDivisionError):
            peak = None  # no plan for this layout: graphs.decide says so
    try:
        d = graphs.decide(requested, features=features, predicted_peak_gib=peak, capacity_gib=capacity,
                          graph_peak_gib=graph_peak)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    return d.on, d.reason


def gpus_per_node(exp: Experiment, opts: Options) -> int:
    if exp.gpus % opts.nnodes:
        raise LaunchError(f"target {exp.id} needs {exp.gpus} GPUs, which do not split over NNODES={opts.nnodes}; "
                          f"fix: choose NNODES dividing {exp.gpus}")
    return exp.gpus // opts.nnodes


def wandb_mode(environ=os.environ) -> str:
    """offline unless an API key is set (no key: log into the run dir, `wandb sync` uploads it later)."""
    return environ.get("WANDB_MODE") or ("online" if environ.get("WANDB_API_KEY") else "offline")


def effective_model(exp: Experiment, opts: Options) -> dict:
    """The model this run builds: the preset overridden by the model flags of the extra args."""
    return flags.effective_model(exp.model_cfg, flags.extra(exp, opts))


# ---- the plan -------------------------------------------------------------------------------------

class RunPlan(Intent):
    """One run, resolved: the record's intent (schema.Intent: each field a decision, as the record keeps it), with
    what it was decided from (the experiment, the options, the model as built, the entry point), which the record
    keeps elsewhere or not at all."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    exp: SkipValidation[Experiment] = Field(exclude=True)
    opts: SkipValidation[Options] = Field(exclude=True)
    model: dict = Field(exclude=True)  # the model this run builds: the preset with EXTRA_ARGS' model flags
    entry: str = Field(exclude=True)  # the entry-point script torchrun starts
    run_dir: Path | None = None  # None for a dry run

    @property
    def entry_args(self) -> list[str]:
        """Megatron's arguments: everything after the entry point (what validate checks)."""
        return [a for g in GROUPS[1:] for a in self.groups[g]]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def script(self) -> str:
        """RUN_DIR/launch.sh: this plan as a bash script (launchscript.py) that runs `argv`."""
        return launchscript.render(self)

    def placed(self, run_dir: Path) -> "RunPlan":
        """The same decisions with the run directory the launcher just made: only the argv items that
        name paths change (checkpoints, TensorBoard, profiler traces), nothing is decided again."""
        groups = flags.groups(self.exp, self.opts, self.impl, self.fastpath, self.cuda_graph, self.gpus_per_node,
                              run_dir)
        return self.model_copy(update={"run_dir": run_dir, "groups": _lists(groups),
                                       "argv": _argv(groups, self.entry)})

    def intent(self) -> Intent:
        """The record's `intent`: the decisions alone, as the record reads them back."""
        return Intent.model_validate(self.model_dump(mode="json"))


def _lists(groups: dict) -> dict[str, list[str]]:
    return {g: list(a) for g, a in groups.items()}


def _argv(groups: dict, entry: str) -> list[str]:
    return ["torchrun", *groups["DISTRIBUTED"], entry, *(a for g in GROUPS[1:] for a in groups[g])]


def estimate_of(p: RunPlan, mfu: float | None = None) -> estimate.Estimate:
    """The estimator's prediction for a plan (its model, levers, CUDA graph and GPU): what the preflight
    and `python -m megalab plan TARGET` print, and the results pages' predicted columns. Raises what the
    estimator raises for a layout it cannot plan (NotImplementedError, KeyError, ValueError, ...)."""
    return estimate.estimate(p.exp, gpu_mem_gib=p.machine.gpu_memory_gib, spec=p.opts.spec,
                             gpu_name=p.machine.gpu_name, model_cfg=dict(p.model), mfu=mfu,
                             cuda_graph=p.cuda_graph, fast=p.fastpath)


def build(exp: Experiment, opts: Options, machine: Machine | None = None, run_dir: Path | None = None,
          environ=os.environ) -> RunPlan:
    """Resolve one run. `environ` supplies what the child environment takes beyond the make variables
    (WANDB_API_KEY/WANDB_MODE, PYTHONPATH, the NCCL defaults a user may override)."""
    machine = machine or machine_of(opts=opts, te=None)  # no GPU counted: the planning GPU
    try:  # EXTRA_ARGS' batch/layout flags: the plan, its checks and the estimator see what Megatron gets
        exp = flags.effective_experiment(exp, flags.extra(exp, opts))
        model = effective_model(exp, opts)
        if model != exp.model_cfg:
            flags.check_model(model, exp)
    except catalog.CatalogError as e:
        raise LaunchError(f"EXTRA_ARGS: {e}") from None
    if opts.master_port is None:  # one node: torchrun --standalone picks it; several: 6000 (ports.py)
        opts = dataclasses.replace(opts, master_port=ports.master_port(None, opts.nnodes))
    impl = transformer_impl(opts, machine.te)
    fast = fast_levers(opts, impl, exp)
    graph, why = cuda_graph(exp, opts, impl, machine, fast, model)
    per_node = gpus_per_node(exp, opts)
    groups = flags.groups(exp, opts, impl, fast, graph, per_node, run_dir)
    entry = str(Path(opts.megatron_lm) / "pretrain_gpt.py") if opts.megatron_lm else str(ENTRY)
    env = {k: environ.get(k) or v for k, v in CHILD_ENV_DEFAULTS.items()}
    paths = (str(ROOT), opts.megatron_lm, *environ.get("PYTHONPATH", "").split(":"))
    env["PYTHONPATH"] = ":".join(p for p in dict.fromkeys(paths) if p)  # once each (scripts/train_gpt.sh sets ROOT)
    env["MEGALAB_FAST"] = levers.text(fast)
    if opts.gpu_mem_gb:  # the entry point's memcap.py reads it as nominal GB
        env["MEGALAB_GPU_MEM_GB"] = variables.gb_text(opts.gpu_mem_gb)
    if opts.wandb and not environ.get("WANDB_API_KEY"):
        env["WANDB_MODE"] = wandb_mode(environ)  # no key: log offline into the run dir, never prompt
    return RunPlan(exp=exp, opts=opts, model=model, entry=entry, target=exp.id, impl=impl,
                   spec=opts.spec if impl == "local" else None, fastpath=fast,
                   substituted_flags=substituted_flags(exp, impl, fast), dropped_flags=dropped_flags(exp, impl, fast),
                   cuda_graph=graph, cuda_graph_reason=why, gpus=exp.gpus, nnodes=opts.nnodes,
                   node_rank=opts.node_rank, gpus_per_node=per_node, master_addr=opts.master_addr,
                   master_port=opts.master_port, machine=machine, run_dir=run_dir, argv=_argv(groups, entry),
                   groups=_lists(groups), env=env)
