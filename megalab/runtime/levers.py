"""The fast-path levers, one entry each: megalab's TE-free stand-ins for what Megatron falls back on without
Transformer Engine or apex. This table is the one place a lever is declared; the launcher's default and checks
(megalab/core/plan.py), the entry point's installs (megalab/runtime/fastpath.py), the estimator's terms, `make help
FAST` and docs/levers.md all read it. Standard library only: the harness plans runs without torch.

A run's levers travel as a tuple of names: parsed once from FAST (or MEGALAB_FAST inside torchrun) by `parse`, a
list in the run record. Inside torchrun fastpath.apply installs them and notes what it installed here (`applied`):
megalab's spec and kernels read that set, never a switch of their own.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

BENCH = "results/bench/README.md"
TRIED = f"{BENCH}#levers-tried-against-the-default"  # each lever against the default it joined, run against run
ABLATION = f"{BENCH}#what-each-lever-buys-ablation"  # the first levers, added one at a time
MOE = f"{BENCH}#moe-experts-without-te-sequentialmlp-vs-groupedmlp"
MICRO = "results/bench/"  # a lever's microbenchmark: results/bench/<name>-microbench.txt


@dataclasses.dataclass(frozen=True)
class Model:
    """What the default's rules read of a model: the preset (configs/models.yaml, with EXTRA_ARGS' model flags)
    and its experts."""
    moe: bool
    rope: bool
    gelu_bias: bool  # GPT-2's MLP: GeLU with biases, no experts
    layernorm: bool  # LayerNorm, no experts
    gqa: bool  # fewer K/V heads than query heads, no experts
    untied: bool
    moe_grouped_gemm: bool

    @classmethod
    def of(cls, num_experts, cfg: dict | None) -> "Model":
        cfg = cfg or {}
        moe = bool(num_experts)
        heads = cfg.get("num_attention_heads")
        return cls(moe=moe, rope=cfg.get("position_embedding", "learned_absolute") == "rope",
                   gelu_bias=not moe and not cfg.get("swiglu") and not cfg.get("disable_bias_linear"),
                   layernorm=not moe and cfg.get("normalization", "LayerNorm") == "LayerNorm",
                   gqa=not moe and heads is not None and int(cfg.get("num_query_groups", heads)) < int(heads),
                   untied=bool(cfg.get("untie_embeddings")), moe_grouped_gemm=moe and bool(cfg.get("moe_grouped_gemm")))


@dataclasses.dataclass(frozen=True)
class Rule:
    text: str
    holds: Callable[[Model], bool]


# Where the default turns a lever on: each lever paid where it was measured and was slower nowhere it was tried.
RULES = {
    "every": Rule("every model", lambda m: True),
    "dense": Rule("models without experts", lambda m: not m.moe),
    "gpt2_mlp": Rule("a GeLU MLP with biases, no experts (GPT-2's layer)", lambda m: m.gelu_bias),
    "layernorm": Rule("LayerNorm, no experts (GPT-2's layer)", lambda m: m.layernorm),
    "rope": Rule("rotary positions", lambda m: m.rope),
    "untied": Rule("a word embedding untied from the output layer", lambda m: m.untied),
    "gqa": Rule("grouped-query attention, no experts", lambda m: m.gqa),
    "moe_grouped_gemm": Rule("experts whose preset asks for moe_grouped_gemm (its TE-free substitute)",
                             lambda m: m.moe_grouped_gemm),
    "moe": Rule("every model with experts", lambda m: m.moe),
}

# What a run's machine must have for a lever to apply (fastpath.apply checks; without it the lever is not applied).
REQUIREMENTS = {"triton": "Triton", "nvmath": "nvmath-python", "cuda": "a CUDA GPU", "liger_kernel": "liger-kernel"}


@dataclasses.dataclass(frozen=True)
class Lever:
    name: str
    does: str  # one line: what it replaces, with what
    install: str | None  # "module:function" under megalab.runtime (-> applied or not); None: megalab's code reads `applied`
    where: str | None = None  # the default's rule (RULES); None: opt-in
    needs: tuple[str, ...] = ()  # levers it works beside: FAST without them is refused; applied after them
    requires: tuple[str, ...] = ()  # REQUIREMENTS of the machine
    conflicts: tuple[str, ...] = ()  # levers doing the same job: FAST with both is refused (all: the later one runs)
    spec: bool = False  # read by megalab's spec as it builds layers (never a patch): megalab's spec only
    estimated: bool = True  # the estimator (megalab/core/estimate.py) has a term for it
    evidence: tuple[str, ...] = (TRIED,)  # where its measurements are


L = Lever
FP = "megalab.runtime.fastpath"
TABLE: tuple[Lever, ...] = (
    L("fused_adam", "torch's fused AdamW (one kernel) for Megatron's foreach AdamW", f"{FP}:install_fused_adam",
      "every", evidence=(ABLATION,)),
    L("foreach_norm", "the clip's gradient norm in one foreach pass, no host sync per tensor",
      f"{FP}:install_foreach_norm", "every", estimated=False, evidence=(ABLATION,)),
    L("foreach_scale", "gradient scaling and main-to-model copies as foreach kernels, no temporary per tensor",
      f"{FP}:install_foreach_scale", "every", estimated=False, evidence=(ABLATION,)),
    L("bf16_ce", "the loss from the bf16 logits, no fp32 copy (runtime/cross_entropy.py)",
      "megalab.runtime.cross_entropy:install", "every"),
    L("addmm_bias", "a linear layer's bias added inside its GEMM (cuBLASLt's bias epilogue)",
      f"{FP}:install_addmm_bias", "every"),
    L("clip_in_adam", "the clip's coefficient handed to fused AdamW's kernel (runtime/clip.py)",
      "megalab.runtime.clip:install", "every", needs=("fused_adam",)),
    L("flat_adam", "AdamW over flat buffers in one Triton kernel that writes the bf16 weights too (runtime/flat_adam.py)",
      f"{FP}:install_flat_adam", "every", needs=("fused_adam",),
      evidence=(TRIED, MICRO + "flat-adam-microbench.txt")),
    L("device_norm", "the clip's norm kept on the GPU: no `.item()` host sync before the optimizer",
      f"{FP}:install_device_norm", "every", estimated=False),
    L("triton_norm", "LayerNorm/RMSNorm in megalab's Triton kernels, the backward reading x and dy once "
      "(runtime/triton_norm.py)", None, "every", requires=("triton",),
      evidence=(TRIED, MICRO + "triton-norm-microbench.txt")),
    L("liger_norm", "LayerNorm/RMSNorm in liger-kernel's Triton kernels, a maintained library's, tried against "
      "triton_norm (runtime/liger_norm.py)", None, conflicts=("triton_norm",), requires=("liger_kernel",), estimated=False,
      evidence=(TRIED, MICRO + "norm-libraries-microbench.txt")),
    L("bias_gelu", "the MLP's bias-GeLU backward and its bias gradient in one Triton kernel (runtime/bias_gelu.py)",
      "megalab.runtime.bias_gelu:install", "gpt2_mlp", requires=("triton",),
      evidence=(TRIED, MICRO + "bias-gelu-microbench.txt")),
    L("dropout_add", "bias-dropout-add in one Triton kernel each way, the mask drawn again, none saved "
      "(runtime/dropout_add.py)", None, "gpt2_mlp", requires=("triton",),
      evidence=(TRIED, MICRO + "dropout-add-microbench.txt")),
    L("qkv_pack", "the QKV gradient's cat and its bias's sum in one Triton pass (runtime/qkv_split.py)",
      "megalab.runtime.qkv_split:install", "gpt2_mlp", needs=("addmm_bias",), requires=("triton",),
      evidence=(TRIED, MICRO + "qkv-split-microbench.txt")),
    L("norm_residual", "the residual's gradient added inside triton_norm's backward kernel", None, "layernorm",
      needs=("triton_norm",)),
    L("fused_wgrad", "the weight-gradient GEMM adds into fp32 main_grad: apex's wgrad kernel "
      "(--gradient-accumulation-fusion)", f"{FP}:install_wgrad_fusion", "dense",
      evidence=(TRIED, MICRO + "fused-wgrad-microbench.txt")),
    L("compiled_rope", "Megatron's unfused RoPE as one compiled kernel each way (runtime/rope.py)",
      "megalab.runtime.rope:install", "rope"),
    L("embed_wgrad", "the word embedding's gradient rows added into main_grad, no dense table-sized gradient "
      "(runtime/embedding_grad.py)", "megalab.runtime.embedding_grad:install", "untied"),
    L("sdpa_gqa", "grouped-query attention read by SDPA's kernel (enable_gqa), K/V not repeated", None, "gqa",
      evidence=(TRIED, MICRO + "gqa-microbench.txt")),
    L("cudnn_sdpa", "cuDNN's attention first in SDPA's backend order", f"{FP}:prefer_cudnn_attention",
      requires=("cuda",), estimated=False, evidence=(ABLATION,)),
    L("grouped_gemm", "MoE experts as megalab's GroupedMLP (torch._grouped_mm), not SequentialMLP's loop "
      "(runtime/grouped_experts.py)", None, "moe_grouped_gemm", spec=True, evidence=(MOE,)),
    L("gelu_epilogue", "fc1's bias and GeLU in cuBLASLt's GEMM epilogue, GeLU's derivative in fc2's "
      "(runtime/gelu_epilogue.py)", "megalab.runtime.gelu_epilogue:install", "gpt2_mlp",
      requires=("nvmath", "cuda"), evidence=(TRIED, MICRO + "gelu-epilogue-microbench.txt")),
    L("moe_gather", "MoE tokens permuted and combined by gathers on the GPU, no host sync, no atomics, where "
      "EP = ETP = 1 (runtime/moe_dispatch.py); lets the CUDA graph capture MoE", None, "moe", spec=True,
      evidence=(TRIED, MICRO + "moe-kernels-microbench.txt")),
    L("expert_stack", "a MoE layer's expert weights as one tensor per linear, its gradient put into main_grad in "
      "one pass in the grouped GEMM's backward, written on a step's first micro-batch (runtime/grouped_experts.py)",
      None, "moe_grouped_gemm",
      needs=("grouped_gemm",), spec=True, evidence=(TRIED,)),
    L("moe_act", "the experts' GeLU times the router's probability in one Triton kernel each way "
      "(runtime/moe_act.py)", None, "moe_grouped_gemm", needs=("grouped_gemm",), requires=("triton",), spec=True,
      evidence=(TRIED, MICRO + "moe-kernels-microbench.txt")),
)
del L
# Levers tried, never paid, and deleted: records and the bench page still name them; FAST refuses them.
RETIRED = {
    "compiled_norm": "torch.compile's norms: within 1% either way on the rows tried; triton_norm took its place",
    "zero_overlap": "the grad buffer zeroed on a side stream: within noise on 111 and 101",
}
BY_NAME = {lever.name: lever for lever in TABLE}
NAMES = tuple(BY_NAME)  # FAST=all, in the table's order (the order levers are installed)
SPEC_LEVERS = tuple(lever.name for lever in TABLE if lever.spec)  # megalab's spec reads them; fastpath.apply does not
ESTIMATED = frozenset(lever.name for lever in TABLE if lever.estimated)
# The levers every model gets by default (the base a lever's trial adds to: results/bench)
EVERY = tuple(lever.name for lever in TABLE if lever.where == "every")

GROUPED_GEMM, FUSED_WGRAD, TRITON_NORM, NORM_RESIDUAL = "grouped_gemm", "fused_wgrad", "triton_norm", "norm_residual"
LIGER_NORM, DROPOUT_ADD, QKV_PACK, SDPA_GQA = "liger_norm", "dropout_add", "qkv_pack", "sdpa_gqa"
BIAS_GELU, GELU_EPILOGUE = "bias_gelu", "gelu_epilogue"
MOE_GATHER, EXPERT_STACK, MOE_ACT = "moe_gather", "expert_stack", "moe_act"

CP_MODES = ("p2p", "all_gather", "a2a")  # Megatron's --cp-comm-type values megalab's CP attention has


def default(num_experts, model_cfg: dict | None) -> tuple[str, ...]:
    """FAST's default under SPEC=megalab for a model (its preset as built, its experts): every lever whose rule
    holds, in the table's order."""
    model = Model.of(num_experts, model_cfg)
    return tuple(lever.name for lever in TABLE if lever.where and RULES[lever.where].holds(model))


def parse(text: str) -> tuple[str, ...]:
    """FAST / MEGALAB_FAST as lever names ('', 0, none: none; all: every one, in the table's order); ValueError
    naming the unknown ones."""
    raw = text.strip()
    if raw in ("", "0", "none"):
        return ()
    if raw == "all":
        return NAMES
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    retired = [n for n in names if n in RETIRED]
    if retired:
        raise ValueError(f"lever {retired[0]} was retired ({RETIRED[retired[0]]}: docs/levers.md#retired-levers); "
                         f"fix: drop it from FAST")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown lever(s) {', '.join(unknown)}")
    return names


def text(names) -> str:
    """Lever names as MEGALAB_FAST and the pages spell them: comma-separated, `none` for none."""
    return ",".join(names) or "none"


def problem(names: tuple[str, ...]) -> str | None:
    """What is wrong with a set of levers as a run would install them (one line, its fix), else None."""
    for name in names:
        lever = BY_NAME[name]
        missing = [n for n in lever.needs if n not in names]
        if missing:
            need = " and ".join(missing)
            return (f"{name} works beside {need}, and {need} is not in the list; fix: add {need} to FAST, or "
                    f"drop {name}")
        both = [n for n in lever.conflicts if n in names]
        if both and names != NAMES:  # all: both named, the later one's kernels run
            return f"{name} and {both[0]} both replace the same kernels; fix: keep one of the two in FAST"
    return None


# ---- inside torchrun: what fastpath.apply installed (the spec and the kernels' drop-ins read it) ---------------
_APPLIED: set[str] = set()


def applied() -> frozenset[str]:
    """The levers this process runs with: those fastpath.apply installed, and the spec's levers it was asked for."""
    return frozenset(_APPLIED)


def on(name: str) -> bool:
    return name in _APPLIED


def mark_spec_levers_asked(env=None) -> None:
    """Where nothing was installed (Megatron-LM's own entry point runs no fastpath.apply), the spec's levers that
    MEGALAB_FAST asks for; a no-op after fastpath.apply, which notes them itself."""
    import os

    if not _APPLIED:
        asked = parse((os.environ if env is None else env).get("MEGALAB_FAST", ""))
        _APPLIED.update(n for n in asked if n in SPEC_LEVERS)


def mark_applied(names) -> None:
    """fastpath.apply's record of what it installed (the one writer)."""
    _APPLIED.clear()
    _APPLIED.update(names)
