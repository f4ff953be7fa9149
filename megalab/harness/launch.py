"""`make <target>`: preflight, write the plan as RUN_DIR/launch.sh and run it, monitor the GPUs, record.

The launcher is thin on purpose: the numbers come from the catalog, the decisions from the plan
(megalab/core/plan.py, built once), the training loop from Megatron. What it adds is what a
measurement needs around a run: checks before a GPU hour is spent, a memory sampler for the whole
run, and a record of what ran. It imports no torch: dry runs work with the base dependencies.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import math
import os
import socket
import stat
import sys
from pathlib import Path

from megalab.core import catalog, estimate, flags, launchscript, plan as planner, ports, variables
from megalab.core.catalog import CatalogError, Experiment
from megalab.core.flags import profile_start
from megalab.core.plan import RunPlan, wandb_mode
from megalab.core.variables import LaunchError, Options  # noqa: F401 (re-exported: launch.Options)
from megalab.harness import data, monitor, progress as progress_line, pyinfo, record, resume, supervise, validate
from megalab.harness import here, scratch
from megalab.runtime import levers
from megalab.runtime.levers import CP_MODES

SUPPORTED_MCORE = "0.19."


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


def check_options(opts: Options) -> Options:
    """One-line errors for LOAD/WANDB/profile settings; returns opts with LOAD resolved."""
    if opts.load is not None:
        opts = dataclasses.replace(opts, load=checkpoint_dir(opts.load))
    if opts.wandb and importlib.util.find_spec("wandb") is None:
        raise LaunchError("WANDB=1 needs the wandb package, which is not installed; "
                          "fix: pip install wandb (or pip install -e '.[wandb]'), or drop WANDB=1")
    if opts.profile and opts.iters < 3:
        raise LaunchError(f"profiling traces two steps after a warm-up one, ITERS={opts.iters} is too few; "
                          "fix: ITERS=3 or more (the default 100 traces steps 10-11)")
    return opts


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
        lines.append(f"wandb      project {opts.wandb_project or 'megalab'}, mode {wandb_mode()}, "
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
            "wandb": {"project": opts.wandb_project or "megalab", "mode": wandb_mode(),
                      "entity": opts.wandb_entity or None} if opts.wandb else None,
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
    return (exp.model_copy(update={"id": f"profile-{exp.id}", "timing_log_level": 2}),
            dataclasses.replace(opts, profile=True))


def preflight(plan: RunPlan) -> list[str]:
    """Human-readable lines: what will run and why the layout is valid."""
    exp, opts, impl = plan.exp, plan.opts, plan.impl
    m = plan.model  # the preset with EXTRA_ARGS' model flags applied
    found = "unknown" if plan.machine.gpus is None else str(plan.machine.gpus)
    graph = f"{'on' if plan.cuda_graph else 'off'} ({plan.cuda_graph_reason})"
    lines = [
        f"target     {exp.id}: {exp.about}",
        f"model      {exp.model}: {m['num_layers']} layers, hidden {m['hidden_size']}, "
        f"{m['num_attention_heads']} heads, seq {m['seq_length']}" + model_features(m)
        + ("" if m == exp.model_cfg else " (the preset changed by the extra args)"),
        f"GPUs       needs {exp.gpus} ({opts.nnodes} node(s) x {plan.gpus_per_node}); found {found} on this node; "
        f"planned for {plan.machine.gpu_name}, {plan.machine.gpu_memory_gib:.1f} GiB"
        + ("" if plan.machine.gpus else " (no GPU here: GPU=h100|h200|a100|... chooses)"),
        f"layout     DP={exp.dp} = {exp.gpus} GPUs / (TP={exp.tp} x PP={exp.pp} x CP={exp.cp})"
        + (f", EP={exp.ep}" if exp.ep > 1 else "") + (f", expert TP={exp.etp}" if exp.etp > 1 else "")
        + (", SP" if exp.sp else "")
        + (f", {exp.virtual_stages} virtual stages per device of {exp.layers_per_virtual_stage} layer(s)"
           if exp.layers_per_virtual_stage else ""),
        f"batch      GBS={exp.gbs} = MBS {exp.mbs} x DP {exp.dp} x grad-accum {exp.grad_accum} "
        f"(microbatches per step: {exp.num_microbatches})",
        f"memory     ZeRO-2 (distributed optimizer): {'on' if exp.zero2 else 'off'}; "
        f"recompute: {exp.recompute}; GPU cap: {variables.gb_text(opts.gpu_mem_gb) + ' GB' if opts.gpu_mem_gb else 'none'}",
        f"impl       {impl}" + (" (Transformer Engine)" if impl == "transformer_engine"
                                 else f" ({'megalab TE-free spec' if opts.spec == 'megalab' else 'Megatron local spec'})")
        + (f"; CP {exp.cp_comm or 'p2p'} by {'Transformer Engine' if impl == 'transformer_engine' else 'megalab/runtime/cp_attention.py'}"
           if exp.cp > 1 else ""),
        f"speed      fast path: {levers.text(plan.fastpath)}; full-iteration CUDA graph: {graph}",
        f"run        {opts.iters} iterations; step time = median after {opts.warmup} warm-up iterations"
        + (f"; Megatron timers at --timing-log-level {exp.timing_log_level}" if exp.timing_log_level else ""),
    ]
    if plan.machine.warning:
        lines.insert(3, f"warning    {plan.machine.warning}")
    if exp.num_experts:
        lines.insert(2, f"experts    {exp.num_experts} experts, top-{exp.router_topk} routing")
    for flag, lever in plan.substituted_flags.items():
        lines.append(f"substitute {flag}: megalab's grouped-GEMM experts (torch._grouped_mm, no TE) by the "
                     f"{lever} lever (off: FAST=none or a FAST list without it); recorded as "
                     "config.substituted_flags")
    if plan.dropped_flags:
        why = {"--moe-grouped-gemm": "the experts run as SequentialMLP, one after another",
               "--moe-permute-fusion": "the token permutation runs unfused"}
        lines.append(f"dropped    {' '.join(plan.dropped_flags)}: need Transformer Engine ("
                     + "; ".join(why[f] for f in plan.dropped_flags) + "); recorded as config.dropped_flags")
    checks = [f"GBS {exp.gbs} % (MBS {exp.mbs} x DP {exp.dp}) == 0",
              f"GPUs {exp.gpus} % (TP x PP x CP = {exp.model_parallel}) == 0"]
    if exp.cp > 1:
        checks.append(f"seq {exp.seq_length} % (2 x CP = {2 * exp.cp}) == 0")
    if exp.cp > 1 and exp.cp_comm == "a2a":
        checks.append(f"heads {m['num_attention_heads']} % (TP x CP = {exp.tp * exp.cp}) == 0")
    lines.append("checks     " + "; ".join(checks) + ": ok")
    return lines + outputs_lines(opts)


def model_features(m: dict) -> str:
    """The preset's non-GPT-2 parts, for the preflight's model line ('' for a GPT-2-style model)."""
    parts = [m["normalization"]] if m.get("normalization", "LayerNorm") != "LayerNorm" else []
    parts += ["SwiGLU"] if m.get("swiglu") else []
    parts += [f"RoPE base {m.get('rotary_base', 10000)}"] if m.get("position_embedding") == "rope" else []
    parts += [f"GQA {m['num_attention_heads']}/{m['num_query_groups']}"] if m.get("num_query_groups") else []
    parts += ["untied output"] if m.get("untie_embeddings") else []
    return f" ({', '.join(parts)})" if parts else ""


def attention_dropout(plan: RunPlan) -> float:
    """The --attention-dropout the run gets: the last one in the extra args, else Megatron's 0.1."""
    return flags.attention_dropout(plan.groups["EXTRA"])


def data_problem(plan: RunPlan) -> str | None:
    """DATA=<prefix>: a missing dataset, or a SPLIT Megatron cannot build at this sequence length."""
    prefix = plan.opts.data
    if prefix == "mock":
        return None
    if not Path(prefix + ".idx").is_file():
        return f"DATA={prefix}: {prefix}.idx not found; fix: make prepare-data (it prints DATA=...)"
    return data.split_problem(prefix, plan.opts.split, int(plan.exp.model_cfg["seq_length"]))


def cp_problem(plan: RunPlan) -> str | None:
    """Why this target's context parallelism cannot run on this path, or None.

    Megatron has CP only inside Transformer Engine's attention; megalab's TE-free spec has its own
    (megalab/runtime/cp_attention.py) for p2p, all_gather and a2a. Megatron's stock local spec has none.
    """
    exp = plan.exp
    if exp.cp <= 1 or plan.impl == "transformer_engine":
        return None
    if plan.opts.spec != "megalab":
        return (f"target {exp.id} uses context parallelism (CP={exp.cp}), which Megatron's local spec lacks "
                "(only Transformer Engine's attention has it); fix: drop SPEC=local (megalab's spec has CP) "
                "or run with Transformer Engine (TE=1)")
    mode = exp.cp_comm or "p2p"
    if mode not in CP_MODES:
        return (f"target {exp.id}: cp_comm {mode} is not one of megalab's CP modes ({', '.join(CP_MODES)}); "
                "fix: pick one of those, or run with Transformer Engine (TE=1)")
    if mode == "p2p" and attention_dropout(plan) > 0:
        return (f"target {exp.id}: megalab's ring attention (cp_comm p2p) has no attention dropout and Megatron's "
                "default is 0.1; fix: add --attention-dropout 0 to the target's extra_args (or EXTRA_ARGS)")
    return None


def megatron_check(plan: RunPlan, without_extra=None) -> str:
    """Megatron's own verdict on the plan's flags, when megatron-core is importable here. A refusal is one
    line that says where the flag or value came from: EXTRA_ARGS (when `without_extra()`, the same run
    without the user's EXTRA_ARGS, passes) or the catalog."""
    exp = plan.exp
    without_extra = without_extra or (lambda: planner.build(exp, dataclasses.replace(plan.opts, extra_args=()),
                                                            plan.machine))
    skipped = "megatron   not installed here: Megatron's own argument check skipped"
    if validate.megatron_available() is None:
        return skipped
    try:
        cached = validate.validate_cached(plan.entry_args, exp.gpus,
                                          [plan.machine.gpu_name] * (plan.machine.gpus or 0))
    except ImportError:  # installed but not importable here (e.g. no torch): the node checks again
        return skipped
    except validate.UnknownFlag as e:
        raise LaunchError(unknown_flag(plan, e)) from None
    except validate.MegatronRejected as e:
        if plan.opts.extra_args and _accepted_without(without_extra):
            raise LaunchError(f"EXTRA_ARGS: Megatron rejects {exp.id} with {plan.opts.extra_args_text}: {e}; "
                              "fix: change or drop those EXTRA_ARGS") from None
        raise LaunchError(f"Megatron rejects {exp.id} on {exp.gpus} GPUs: {e}; "
                          "fix the layout in configs/experiments/") from None
    return (f"megatron   parse_and_validate_args accepts the flags with WORLD_SIZE={exp.gpus} and "
            "gpt_config_from_args builds the model config: ok"
            + (f" (the same check passed before; verdict cached in {validate.cache_dir()})" if cached else ""))


def _accepted_without(build) -> bool:
    """Whether Megatron accepts the plan `build()` makes (the same run without the user's EXTRA_ARGS)."""
    try:
        plan = build()
        validate.validate_cached(plan.entry_args, plan.exp.gpus, [plan.machine.gpu_name] * (plan.machine.gpus or 0))
    except (validate.MegatronRejected, LaunchError, CatalogError):
        return False
    return True


def unknown_flag(plan: RunPlan, e: validate.UnknownFlag) -> str:
    """One line for a flag Megatron does not know: where it came from, the closest known one, the fix."""
    spelt = {a.split("=", 1)[0] for a in plan.opts.extra_args}
    closest = f" (closest: {e.closest})" if e.closest else ""
    pattern = e.flag.lstrip("-").split("-")[0]
    if e.flag in spelt:
        return (f"EXTRA_ARGS: {e.flag} is not a Megatron flag{closest}; fix: correct or drop it "
                f"(make show-arguments GREP={pattern} lists megatron-core's flags)")
    if e.flag in {a.split("=", 1)[0] for a in plan.exp.extra_args}:
        return (f"target {plan.exp.id}: its extra_args flag {e.flag} is not a Megatron flag{closest}; "
                "fix: correct it in configs/experiments/")
    return (f"Megatron rejects {plan.exp.id}: {e.flag} is not a flag of the installed megatron-core{closest}; "
            f"fix: pip install --no-deps megatron-core==0.19.2")


def plan_lines(plan: RunPlan, mfu: float | None = None) -> str:
    """The estimator's prediction (megalab/core/estimate.py); warns, never refuses: OOM is a lesson too.
    The preflight and `python -m megalab plan TARGET` print this, from the same plan."""
    try:  # the machine's GPU: the one found, else the planning GPU (GPU=, GPU_MEM_GB)
        est = planner.estimate_of(plan, mfu=mfu)
    except (NotImplementedError, KeyError, ValueError, ZeroDivisionError) as e:  # a prediction is advice
        return f"plan       no estimate for this layout ({e})"
    text = estimate.render(est)
    if not est.fits:
        text += "\nwarning    predicted not to fit in GPU memory: expect an out-of-memory error (starting anyway)"
    return text


def check_megatron_installed(opts: Options | None = None) -> None:
    if (opts or Options.from_env()).megatron_lm:
        return
    v = validate.megatron_available()
    if v is None:
        raise LaunchError("megatron-core is not installed; fix: pip install --no-deps megatron-core==0.19.2 "
                          "(Python 3.12) or `make setup`")
    if not v.startswith(SUPPORTED_MCORE):
        raise LaunchError(f"megatron-core {v} is installed but megalab targets {SUPPORTED_MCORE}x; "
                          "fix: pip install --no-deps megatron-core==0.19.2")


def check_gpus(exp: Experiment, opts: Options, inv: dict) -> int:
    """GPUs per node, or a LaunchError when NNODES x the GPUs found here fall short of the target's."""
    per_node = planner.gpus_per_node(exp, opts)
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


def make_run_dir(outdir: Path, target: str) -> Path:
    try:
        scratch.make_dir(outdir)  # made inside the repository: out of git's sight
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


def _tail(log_path: Path, n: int = 15, window: int = 1 << 16) -> str:
    """The log's last N lines (from its last WINDOW bytes: a regular file only, never a device read forever)."""
    try:
        with open(log_path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return ""
            f.seek(max(0, os.fstat(f.fileno()).st_size - window))
            lines = f.read().decode("utf-8", errors="replace").splitlines()[-n:]
    except OSError:  # none was written (a full disk): the record's end_detail says why
        return ""
    return "\n".join(f"log        {line}" for line in lines)


def check_busy(per_node: int, opts: Options) -> list[dict]:
    """GPUs of this run that other processes use: refused in one line unless ALLOW_BUSY_GPUS=1."""
    busy = monitor.busy_gpus(monitor.run_gpu_indices(per_node))
    if busy and not opts.allow_busy_gpus:
        raise LaunchError(f"GPUs in use by other processes ({monitor.describe_busy(busy)}); fix: wait for "
                          "them to end, kill them, or ALLOW_BUSY_GPUS=1 (the record then says so)")
    if busy:
        print(f"warning    ALLOW_BUSY_GPUS=1: starting beside {monitor.describe_busy(busy)}")
    return busy


def _execute(plan: RunPlan, progress):
    """Write the plan as RUN_DIR/launch.sh and run exactly that file under the supervisor
    (supervise.py): its own process group, the log into run_dir/logs.txt and the progress line, a
    watchdog, and signals to us end the whole run."""
    script = plan.run_dir / launchscript.NAME
    try:
        script.write_text(plan.script)
        script.chmod(0o755)
    except OSError as e:  # nothing started yet: nothing to end, nothing to record
        progress.close()
        raise LaunchError(f"{script}: cannot be written ({e.strerror or e}), so nothing was started; fix: free space "
                          "on OUTDIR's disk (or make it writable) and launch again") from None
    opts = plan.opts
    quiet_node = opts.nnodes > 1 and opts.node_rank != opts.nnodes - 1  # the last node logs the iterations
    limits = supervise.Limits(silent_s=math.inf if quiet_node else opts.watchdog_silent_s,
                              startup_s=math.inf if quiet_node else opts.watchdog_startup_s,
                              exit_grace_s=opts.exit_grace_s)
    try:
        return supervise.supervise(["bash", str(script)], env=dict(os.environ), log_path=plan.run_dir / "logs.txt",
                                   on_line=progress.feed, limits=limits)
    finally:
        progress.close()


# ---- one target, one launch ---------------------------------------------------------------------------

class RecordLost(LaunchError):
    """A run that ended but whose record could not be written (a full disk): one line, with its result."""


def run(target: str, opts: Options | None = None, exp: Experiment | None = None) -> int:
    """Launch a catalog target or a variant of one (or `exp`, a variant built by the benchmark)."""
    opts = opts or Options.from_env()
    exp, variant = (exp, None) if exp is not None else resolve(target)
    if variant == "resume":
        return resume.run(exp, opts, launch)
    if variant == "profile":
        exp, opts = profiled(exp, opts)
    done = launch(exp, opts)
    return 0 if done is None or done[0]["status"] == "ok" else 1


def launch(exp: Experiment, opts: Options) -> tuple[dict, Path] | None:
    """Preflight, and unless DRY_RUN, one launch: its run record and run dir (None for a dry run)."""
    t0 = dt.datetime.now(dt.timezone.utc)  # the preflight's share of a launch goes in the record
    exp.validate()
    opts = check_options(opts)
    asked_port = opts.master_port  # resolved once, so the dry-run plan and the run plan agree
    opts = dataclasses.replace(opts, master_port=ports.master_port(asked_port, opts.nnodes))
    inv = monitor.gpu_inventory()
    plan = here.plan_here(exp, opts, inventory=inv)
    # Megatron's verdict first: a flag it does not know is one line before anything else
    check = megatron_check(plan, lambda: planner.build(exp, dataclasses.replace(opts, extra_args=()), plan.machine))
    print("\n".join(preflight(plan)))
    print(pyinfo.line(gpus=inv["count"]))
    print(check)
    print(plan_lines(plan))
    print(ports.describe(asked_port, opts.master_port, opts.nnodes))

    problem = cp_problem(plan) or data_problem(plan)  # a dry run only warns
    if opts.dry_run:
        if problem:
            print(f"warning    {problem}")
        print(f"script     {launchscript.NAME}, which a run writes into its run dir and runs "
              "(DRY_RUN=1: not written, not started):")
        print(plan.script, end="")
        print("command    (DRY_RUN=1, not started)")
        print(plan.command)
        return None

    if problem:
        raise LaunchError(problem)
    per_node = check_gpus(exp, opts, inv)
    busy = check_busy(per_node, opts)
    check_megatron_installed(opts)
    run_dir = make_run_dir(opts.outdir, exp.id)
    plan = plan.placed(run_dir)  # the same decisions, with its paths
    print(f"run dir    {run_dir}  (full log: logs.txt)")

    started = dt.datetime.now(dt.timezone.utc)
    progress = progress_line.Progress(verbose=opts.verbose)
    with monitor.GpuMemoryMonitor(run_dir / "gpu_memory.csv", num_gpus=per_node) as mon:
        outcome = _execute(plan, progress)
    if outcome.reason:
        print(f"ended      {outcome.reason}: {outcome.detail}")
    ended = dt.datetime.now(dt.timezone.utc)

    rec = record.build(plan=plan, returncode=outcome.returncode, interrupted=False, monitor=mon, inventory=inv,
                       started=started, ended=ended, hostname=socket.gethostname(),
                       outputs=outputs_config(opts), outcome=outcome, busy_gpus=busy,
                       preflight_s=(started - t0).total_seconds())
    try:
        record.write(rec, run_dir / "run.json")
    except OSError as e:  # a full disk: the result still reaches the terminal, and the exit says it is lost
        lost = RecordLost(f"{run_dir / 'run.json'}: the run's record cannot be written ({e.strerror or e}); it ended "
                          f"so: {record.one_line(rec).removeprefix('result     ')}; fix: free space on OUTDIR's disk "
                          "and run it again (its log, if any, is in the run dir)")
        if outcome.reason != "killed":
            raise lost from None
        print(f"megalab: {lost}", file=sys.stderr, flush=True)  # a stop asked for still stops every caller
        raise SystemExit(outcome.exit_code) from None
    if rec["status"] != "ok" and not opts.verbose:
        print(_tail(run_dir / "logs.txt"))
    print(record.one_line(rec))
    for line in record.profile_lines(rec, run_dir):
        print(line)
    if outcome.reason == "killed":  # a stop asked for stops every caller (bench, resume, batch) too
        raise SystemExit(outcome.exit_code)
    return rec, run_dir
