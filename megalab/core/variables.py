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
    # words (a shell word list, split once by shlex into argv items)
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
        except ValueError as e:
            raise LaunchError(f"{self.name}={_shown(text)}: {e}; fix: {self.fix()}") from None
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
            return f"must be at least {self.minimum:g}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum:g}"
        return None

    def fix(self) -> str:
        if self.type == "flag":
            return f"{self.name}=1 or {self.name}=0"
        if self.type == "choice":
            return f"e.g. {self.name}={self.choices[0]}"
        if self.type == "words":
            return f"balance its quotes, e.g. {self.name}='--seed 7'"
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


PARSERS = {"int": _int, "float": _float, "flag": _flag, "choice": _choice, "words": _words,
           "path": lambda var, text: Path(text), "str": _text}


# FAST's default under SPEC=megalab: each lever computes Megatron's function (tests/test_fastpath.py,
# tests/test_cross_entropy.py, tests/test_rope.py); Megatron's stock local spec stays stock. Each joined
# where it paid and was slower nowhere it was tried (results/bench, "Levers tried against the default":
# every run with it beat every run without, two or more a side, one machine and code):
#   - bf16_ce + addmm_bias (one H100, 2026-11-23): 111 (5 vs 3 runs) and 221 (4 vs 2);
#   - fused_wgrad (one H100, 2026-11-25): with gradient accumulation, where Megatron's fp32 add runs once per
#     micro-batch, it pays (600 with compiled_rope: 316 vs 358-366 ms; 101 at 4 micro-batches of 4, not a
#     catalog row: 426-430 vs 441-443 ms); at one micro-batch within noise (111, 101). Dense models only:
#     MoE layouts were not tried with it;
#   - compiled_rope (one H100, 2026-11-25), for rotary presets only (others have no RoPE to compile): 600
#     338-342 vs 358-366 ms alone; with fused_wgrad on two configurations that are not catalog rows
#     (Llama-style 8 x 2560 at 4 micro-batches: 198-200 vs 218 ms; 600 at sequence 4096: 300-302 vs 329-330);
#   - clip_in_adam (one H100 each, 2026-11-26): 101 71-72 vs 74-80 ms (3 a side); beyond the catalog, GPT-2
#     36 x 1280 at one micro-batch (41-42 vs 43 ms) and 600 at GBS 1 (62 vs 64 ms); 600 at GBS 8 within noise
#     (the clip's pass is one per step, the micro-batches eight). The optimizer's own: MoE rows included;
#   - embed_wgrad (one H100, 2026-11-26), for untied presets only (a tied table stays Megatron's): 600 291-292 vs
#     300-301 ms; beyond the catalog Llama-style 8 x 2560 at 4 micro-batches (187-189 vs 194-195 ms) and 600 at
#     sequence 4096 (291-292 vs 296-297 ms; results/bench, "Levers tried against the default");
#   - flat_adam (one H100 per call, 2026-11-26, third session), every preset (the optimizer's own; a ZeRO-2 run's
#     distributed optimizer keeps torch's kernel): 101 61 vs 71 ms, 600 287-289 vs 295, 111 361-366 vs 375 (three
#     a side or one base, one machine); beyond the catalog GPT-2 36 x 1280 at one micro-batch (36-39 vs 42-45 ms)
#     and Llama-style 8 x 2560 at 4 micro-batches (182 vs 189-190 ms). Its microbenchmark on GPT-2 XL: 15.8 vs
#     23.9 ms a step with the clip on (results/bench/flat-adam-microbench.txt).
#   - device_norm (H100s, 2026-11-26, fourth to seventh sessions), every preset (the clip's own): it removes the
#     host sync on the clip's norm. Over the default with no_rerun: beyond the catalog GPT-2 24 x 2048 at one
#     micro-batch (41.3-41.4 vs 41.8-43.8 ms) and Llama-style 8 x 2560 at 4 micro-batches (183 vs 184-185 ms);
#     101 within noise (56.3-57.4 vs 57.3-59.0). Over the fourth session's default it paid on 101 (59.3-59.7 vs
#     60.2-64.4) and Llama-style 8 x 2560 (181-182 vs 183-184); slower nowhere it was tried.
#   - sdpa_gqa (one H100, GPU-d13b65e7, 2026-11-27, seventeenth session; alternating), for a dense preset with
#     grouped-query attention (fewer K/V heads than query heads): over the default, 600 284.7, 285.0, 286.1 vs
#     289.0, 289.4 ms; beyond the catalog Llama-style 8 x 2560 at 2 micro-batches of 2 183.3, 183.8 vs 185.1, 185.4,
#     600 at sequence 4096 281.1, 281.4 vs 284.4, 284.8, and 24 x 1536 224.2 vs 230.6 (one a side). Loss: the first
#     steps within 2.5e-4 of the base's. In 2026-11-26's seventh session, over that day's default, it paid on 600 but
#     passed the rule by 0.3 ms at 8 x 2560 and overlapped at 24 x 1536, so it stayed opt-in until tried again.
#   - triton_norm (one H100 per call, 2026-11-26, ninth session), every preset (megalab's Norm): its kernels take
#     122 against torch's 189 us a LayerNorm at 111's shape (results/bench/triton-norm-microbench.txt). 111
#     346-347 vs 350-351 ms (two a side, one machine), 600 289-290 vs 290-292; beyond the catalog 101 at
#     micro-batch 14 (330-331 vs 336-337) and GPT-2 1.2B at micro-batch 16 (284 vs 287-288); GPT-2 24 x 2048
#     at 111's batch within noise (263, 263 vs 263, 267; results/bench, "Levers tried against the default").
# Tried and left opt-in: compiled_norm (one H100, 2026-11-26, seventh session): the compiled norm's kernels take
# 8% less GPU time at row 111's shape (results/bench/norm-microbench.txt), but each call costs the host about
# 1.6 ms forward and backward against 0.2 ms: slower on 111, which then ran without the CUDA graph (365-367 vs
# 361-365 ms), and 2 ms ahead on GPT-2 24 x 2048 with it (264 vs 266-267). Tried again in the ninth session with
# the graph that hides the host's cost: 111 within noise (348-349 vs 349-353). triton_norm replaced it.
#   - bias_gelu and norm_residual (one H100, GPU-3c735536, 2026-11-26, eleventh session; two launches a side,
#     alternating), for a dense preset whose MLP is GeLU with biases (bias_gelu) and whose norm is LayerNorm
#     (norm_residual): the two levers' kernels are only called there. bias_gelu (its 64 x 64 tile, the fastest of six
#     at every shape in results/bench/bias-gelu-microbench.txt) over the default: 111 348, 348 vs 349, 351 ms; beyond
#     the catalog GPT-2 24 x 2048 at 111's batch 263, 263 vs 264, 264 and 101 at micro-batch 14 327, 328 vs 329, 330.
#     norm_residual over that: 111 344, 345 ms; 24 x 2048 261, 262; 101 at micro-batch 14 326, 326. On 600 (RMSNorm,
#     Llama-style) one launch with norm_residual took 291 against 290, 290 without: not shown to pay there, so it
#     stays off for RMSNorm presets. (The tenth session's first bias_gelu tiles were within noise beyond the catalog.)
#     Loss: the first five steps within 2e-4 of the base's everywhere; the bench's median-over-100-steps rule fails on
#     24 x 2048 and on 600, where two base launches of one code differ more (median 0.09 and 0.025): their early
#     training amplifies rounding, so that rule cannot tell a lever there.
#   - dropout_add (one H100, GPU-20bfaef5, 2026-11-26, twelfth session; alternating), for the GPT-2 layer bias_gelu
#     serves (the lever runs wherever hidden dropout is on; only that layer was measured): its kernels take 60 against
#     Megatron's 92 us forward, 158 against 182 forward and backward, at 111's shape, and keep no byte mask (24.6 MB a
#     call; results/bench/dropout-add-microbench.txt). Over the default: 111 336.6, 336.9, 337.5 vs 339.6, 341.5 ms
#     (69.2 vs 71.6 GiB); beyond the catalog GPT-2 24 x 2048 at 111's batch 253.9, 253.6 vs 256.2, 255.6 and 101 at
#     micro-batch 14 316.2, 317.2 vs 318.3, 319.1. Loss: its masks are its own, so its first steps differ from the
#     base's by the masks (1.7e-3 at 111, 1.1e-2 at 101 x 14) and the bench judges it by the median over 100 steps
#     (0.5% and 0.3%, within the rule); tests/test_dropout_add.py checks the function with the same masks. Its first
#     backward (eacc376: a few programs an SM walking many rows) lost to Megatron's and gave 111 343.3, 344.2 vs
#     345.0, 346.1 on GPU-fc38cf1f.
#   - qkv_pack (one H100, GPU-acfbfc21, 2026-11-26, thirteenth session; alternating), where the QKV projection has a
#     bias addmm_bias adds (GPT-2's layer): the split's backward packs the gradient and sums the bias in one pass,
#     125 against torch.cat and the bias's sum's 170 us a layer at 111's shape (results/bench/
#     qkv-split-microbench.txt). Over the default: 111 335.5, 335.5, 335.7 vs 339.6, 338.5 ms; beyond the catalog
#     GPT-2 24 x 2048 at 111's batch 255.1, 255.4 vs 256.4, 257.0 and 101 at micro-batch 14 317.4, 317.2 vs 319.1,
#     319.3. Loss: the same function (tests/test_qkv_split.py), the first five steps within 3.2e-5 of the base's.
#     Without a bias (Llama-style) the pack alone is slower than the cat, so the split stays torch's there.
#   - gelu_epilogue (one H100, GPU-14f14cd5, 2026-11-27, eighteenth session; alternating), for the GPT-2 layer
#     bias_gelu serves (a dense GeLU MLP with biases): fc1's bias and GeLU in cuBLASLt's GEMM epilogue and GeLU's
#     derivative in fc2's input-gradient GEMM (nvmath-python; without it the lever is not applied). Its GEMMs against
#     today's kernels at 111's shape: 0.05 ms a layer forward, 0.13 ms backward (results/bench/
#     gelu-epilogue-microbench.txt). Over the default: 111 329.8, 331.4, 330.3 vs 336.8, 336.8 ms; 112 1267.7, 1269.8,
#     1262.6 vs 1282.6, 1289.0; beyond the catalog GPT-2 24 x 2048 at 111's batch 250.7, 251.0 vs 254.4, 254.4 and 101
#     at micro-batch 14 312.4, 311.9 vs 315.0, 315.2. Appended last, so a launch with FAST set to the old default and
#     gelu_epilogue is a launch of the new default.
# Tried and left opt-in: zero_overlap (one H100, GPU-f96ff3f2, 2026-11-27, sixteenth session; alternating): the grad
# buffer's zeroing (1.9 ms a step at 111 in its profile) moved beside the forward bought nothing over the default:
# 101 56.3, 56.1, 56.1 vs 56.2, 56.3, 55.2 ms; 111 339.5, 339.4 vs 339.6, 338.9, 339.3. Likely why: with the CUDA
# graph the zeroing already ran while the GPU waited for the host (results/bench/graph-step-waits.txt).
# plan.py and provenance.py read it here.
DEFAULT_FAST = ("fused_adam", "foreach_norm", "foreach_scale", "bf16_ce", "addmm_bias", "clip_in_adam", "flat_adam",
                "device_norm", "triton_norm")


def default_fast(num_experts, model_cfg: dict) -> tuple[str, ...]:
    """FAST's default under SPEC=megalab for a model: DEFAULT_FAST, then bias_gelu, dropout_add and qkv_pack for a dense
    GeLU MLP with biases and norm_residual for a dense LayerNorm model (GPT-2's layer), fused_wgrad for a dense model,
    compiled_rope where the preset has rotary positions, embed_wgrad where its word embedding is untied from the
    output layer, sdpa_gqa for a dense model with grouped-query attention, grouped_gemm where a MoE preset asks for
    moe_grouped_gemm (without TE it is that flag's substitute), and last gelu_epilogue for GPT-2's MLP again. The
    launcher (plan.fast_levers), a record's provenance and `python -m megalab plan` all read it here."""
    cfg = model_cfg or {}
    moe = bool(num_experts)
    rope = cfg.get("position_embedding", "learned_absolute") == "rope"
    # GPT-2's layer: a GeLU MLP with biases and LayerNorm (where bias_gelu, dropout_add, qkv_pack and norm_residual were
    # measured to pay)
    gelu_bias = not moe and not cfg.get("swiglu") and not cfg.get("disable_bias_linear")
    layernorm = not moe and cfg.get("normalization", "LayerNorm") == "LayerNorm"
    heads = cfg.get("num_attention_heads")
    gqa = not moe and heads is not None and int(cfg.get("num_query_groups", heads)) < int(heads)
    return (DEFAULT_FAST + ((levers.BIAS_GELU, levers.DROPOUT_ADD, levers.QKV_PACK) if gelu_bias else ())
            + ((levers.NORM_RESIDUAL,) if layernorm else ())
            + (() if moe else (levers.FUSED_WGRAD,)) + ((levers.COMPILED_ROPE,) if rope else ())
            + ((levers.EMBED_WGRAD,) if cfg.get("untie_embeddings") else ())
            + ((levers.SDPA_GQA,) if gqa else ())
            + ((levers.GROUPED_GEMM,) if moe and cfg.get("moe_grouped_gemm") else ())
            + ((levers.GELU_EPILOGUE,) if gelu_bias else ()))


def fast_names(value: str) -> list[str]:
    """A FAST value as lever names (none, all, or a list); LaunchError naming the unknown ones and the fix."""
    try:
        return levers.requested({"MEGALAB_FAST": value})
    except ValueError as e:
        raise LaunchError(f"FAST={value}: {str(e).split(': ', 1)[1]}") from None


V = Variable
VARIABLES: tuple[Variable, ...] = (
    V("ITERS", "int", 100, "training iterations (the step time is the median after WARMUP)", True, field="iters",
      minimum=1),
    V("WARMUP", "int", 3, "iterations left out of the step-time median (below ITERS)", True, field="warmup",
      minimum=0),
    V("GPU_MEM_GB", "float", None, "cap each process as if the GPU had this many GB (e.g. 80 on an H200)", True,
      field="gpu_mem_gb", positive=True, example="80"),
    V("GPU", "str", None, "the GPU to plan for: h100, h200, a100, a100-40gb, b200, gh200, l40s (default: the GPU "
      "found, else h100; with GPU_MEM_GB, the smallest that holds it)", True, field="gpu"),
    V("DRY_RUN", "flag", False, "print the preflight and the exact command; start nothing", field="dry_run"),
    V("OUTDIR", "path", ROOT / "outdir", "where run directories go", field="outdir"),
    V("SPEC", "choice", "megalab", "TE-free layer spec: megalab, or local (Megatron's stock spec)", True,
      field="spec", choices=("megalab", "local")),
    V("TE", "choice", "auto", "Transformer Engine: auto, 1 (require it), 0 (never)", True, field="te",
      choices=("auto", "1", "0")),
    V("FAST", "str", None, "fast-path levers: none, all, or a list (default: the spec's)", True, field="fast"),
    V("CUDA_GRAPH", "choice", "auto", "Megatron's full-iteration CUDA graph: auto, 1, 0", True,
      field="cuda_graph", choices=("auto", "1", "0")),
    V("EXTRA_ARGS", "words", (), "more Megatron flags, split like a shell word list (shlex), appended", True,
      field="extra_args"),
    V("MEGATRON_LM", "str", "", "a Megatron-LM checkout: run its own pretrain_gpt.py with the same flags", True,
      field="megatron_lm"),
    V("VERBOSE", "flag", False, "stream the whole log instead of the progress line", field="verbose"),
    V("SAVE", "flag", False, "checkpoint into the run dir's checkpoints/ (torch_dist)", True, "outputs", "save"),
    V("SAVE_INTERVAL", "int", None, "iterations between checkpoints (default: the end of the run)", True,
      "outputs", "save_interval", minimum=1, example="50"),
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
      minimum=1),
    V("NODE_RANK", "int", 0, "this node's rank (0 to NNODES-1)", group="nodes", field="node_rank", minimum=0),
    V("MASTER_ADDR", "str", "localhost", "torchrun's rendezvous host", group="nodes", field="master_addr",
      pattern=r"[0-9A-Za-z\[][0-9A-Za-z_.:%\[\]-]*", shape="a host name or an IP address"),
    V("MASTER_PORT", "int", None, "torchrun's rendezvous port (default: a free one on one node, 6000 across nodes)",
      group="nodes", field="master_port", minimum=1, maximum=65535, example="29500"),
    V("ALLOW_BUSY_GPUS", "flag", False, "start even where other processes hold GPU memory (the record says so)",
      field="allow_busy_gpus"),
    V("WATCHDOG_SILENT_S", "float", 300.0, "end a run whose log is silent this long after training began (hung)",
      True, field="watchdog_silent_s", positive=True),
    V("WATCHDOG_STARTUP_S", "float", 900.0, "the same before the first iteration", True, field="watchdog_startup_s",
      positive=True),
    V("EXIT_GRACE_S", "float", 120.0, "end a run still alive this long after Megatron's end of training", True,
      field="exit_grace_s", positive=True),
    V("GPUS_PER_NODE", "int", None, "make slurm-<id>: GPUs per node (default 8)", group="slurm", minimum=1,
      example="8"),
    V("SBATCH_ARGS", "str", "", "make slurm-<id>: more sbatch flags (shlex-split)", group="slurm"),
    V("SRUN_ARGS", "str", "", "make slurm-<id>: more srun flags (shlex-split)", group="slurm"),
    V("DOCKER_IMAGE", "str", "megalab", "make docker-build/docker-run: the image tag", group="docker"),
    V("DOCKER_SHM", "str", "16g", "make docker-run: --shm-size", group="docker"),
    V("DOCKER_ARGS", "str", "", "make docker-run: more docker run flags (shlex-split)", group="docker"),
    V("DOCKER_CMD", "str", "bash", "make docker-run: the command to run in the container (shlex-split)",
      group="docker"),
    # Read by one make target (megalab/harness/campaign.py and batch.py, the Makefile's recipes), never by a
    # run's plan; groups campaign, pages, make. Listed so that `make help` shows them and the Makefile takes
    # them literally (its export line).
    V("IDS", "str", "", 'make batch/campaign: the targets, e.g. IDS="101 111"', group="campaign"),
    V("CHAPTER", "int", None, "make campaign: a chapter's targets (0: the two-GPU tour)", group="campaign",
      minimum=0, example="1"),
    V("STALE", "flag", False, "make campaign: only rows short of REPEATS runs of today's code here",
      group="campaign"),
    V("REPEATS", "int", 3, "make campaign: launches of each target, pass after pass", group="campaign", minimum=1),
    V("BUDGET_S", "int", None, "make campaign: start no launch after this many seconds", group="campaign",
      minimum=1, example="1200"),
    V("GPUS", "int", None, "make campaign DRY_RUN=1 (a plan: nothing starts): for N GPUs not here",
      group="campaign", minimum=1, example="2"),
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
      minimum=1, example="4"),
    V("LIMIT_DOCS", "int", None, "make prepare-data: only the first N documents", group="make", minimum=1,
      example="1000"),
    V("FORCE", "flag", False, "make prepare-data: rebuild a finished dataset; make tables: write pages that lose "
      "rows, numbers or pages (FORCE=1)", group="make"),
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
    gpu_mem_gb: float | None = None  # nominal GB (gpus.nominal_gb_to_gib), 80 = an H100 80GB
    dry_run: bool = False
    gpu: str | None = None  # GPU=h200: the planning GPU (plan.Machine resolves it)
    outdir: Path = ROOT / "outdir"
    spec: str = "megalab"  # megalab | local
    te: str = "auto"  # auto | 1 | 0
    fast: str | None = None  # megalab's TE-free speed-ups: None = the default for the spec
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
    exit_interval: int | None = None  # stop early, as resume-<id>'s first launch does

    def __post_init__(self):  # text belongs at the edge (from_env, parse): a str here would be read char by char
        if isinstance(self.extra_args, str) or isinstance(self.gpu_mem_gb, str):
            raise TypeError("Options.extra_args is a tuple of argv items and gpu_mem_gb a float; parse text with "
                            "variables.parse('EXTRA_ARGS', text) / variables.parse('GPU_MEM_GB', text)")

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
    p.add_argument("--names", action="store_true", help="the names only, on one line")


def main(args) -> int:
    """`python -m megalab variables`: the table, as `make help` prints it."""
    print(" ".join(v.name for v in VARIABLES) if args.names else "\n".join(help_lines()))
    return 0
