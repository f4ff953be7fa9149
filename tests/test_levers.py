"""The lever table (megalab/runtime/levers.py): the default it gives every catalog target, what it refuses, and the
page it generates (docs/levers.md)."""
import re

import pytest

from megalab.core import catalog, plan, variables
from megalab.core.paths import ROOT
from megalab.runtime import levers

EVERY = ("fused_adam", "foreach_norm", "foreach_scale", "bf16_ce", "addmm_bias", "clip_in_adam", "flat_adam",
         "device_norm", "triton_norm")
GPT2 = EVERY + ("bias_gelu", "dropout_add", "qkv_pack", "norm_residual", "fused_wgrad", "gelu_epilogue")
LLAMA = EVERY + ("fused_wgrad", "compiled_rope", "embed_wgrad", "sdpa_gqa")
# The default each preset got before the table (variables.default_fast at 5972c4c), as a dense model and with experts
BEFORE = {
    **{p: (GPT2, EVERY) for p in ("gpt2-xl", "gpt2-xl+14L", "gpt2-large", "gpt2-1.2B", "gpt2-2.5B", "gpt2-4.2B",
                                  "gpt2-8.3B", "gpt-22B", "gpt2-1.2B-s2048", "gpt2-1.2B-s4096", "gpt2-1.2B-s16k",
                                  "gpt2-1.2B-s32k")},
    **{p: (LLAMA, EVERY + ("compiled_rope", "embed_wgrad")) for p in ("llama3-1b-like", "llama3-3b-like")},
    "olmoe-like": (EVERY + ("norm_residual", "fused_wgrad"), EVERY + ("grouped_gemm",)),
}
# Since then: issue 63's moe_gather, expert_stack and moe_act joined the default of MoE models (results/bench, "Levers
# tried against the default").
def _since(before: tuple[str, ...], moe: bool) -> tuple[str, ...]:
    if not moe:
        return before
    return before + ("moe_gather",) + (("expert_stack", "moe_act") if "grouped_gemm" in before else ())


def test_the_table_gives_every_preset_and_target_the_default_it_had():
    assert set(BEFORE) == set(catalog.models())
    for name, cfg in catalog.models().items():
        dense, moe = BEFORE[name]
        assert (levers.default(None, cfg), levers.default(8, cfg)) == (dense, _since(moe, True)), name
    for exp in catalog.catalog().values():
        moe = bool(exp.num_experts)
        assert levers.default(exp.num_experts, exp.model_cfg) == _since(BEFORE[exp.model][moe], moe), exp.id
    assert levers.EVERY == EVERY


def test_every_lever_is_declared_whole():
    for lever in levers.TABLE:
        assert lever.where is None or lever.where in levers.RULES, lever.name
        assert set(lever.needs + lever.conflicts) <= set(levers.NAMES), lever.name
        assert set(lever.requires) <= set(levers.REQUIREMENTS), lever.name
        assert not (lever.spec and lever.install), f"{lever.name}: a spec lever installs nothing"
        # a lever comes after the levers it needs: fastpath.apply installs them in the table's order
        assert all(levers.NAMES.index(n) < levers.NAMES.index(lever.name) for n in lever.needs), lever.name
        if lever.install:
            module, function = lever.install.split(":")
            path = ROOT / (module.replace(".", "/") + ".py")
            assert re.search(rf"^def {function}\(", path.read_text(), re.M), f"{lever.name}: {lever.install}"


def test_every_lever_points_at_evidence_that_exists():
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", (ROOT / levers.BENCH).read_text(), re.M)}
    for lever in levers.TABLE:
        assert lever.evidence, lever.name
        for where in lever.evidence:
            path, _, anchor = where.partition("#")
            assert (ROOT / path).is_file(), f"{lever.name}: {where}"
            assert not anchor or anchor in headings, f"{lever.name}: {where}"


def test_fast_is_parsed_once_at_the_edge():
    assert variables.parse("FAST", "all") == levers.NAMES
    assert variables.parse("FAST", "none") == () and variables.parse("FAST", "") is None  # unset: the default
    assert variables.parse("FAST", " bf16_ce, fused_adam ") == ("bf16_ce", "fused_adam")
    with pytest.raises(variables.LaunchError, match=r"^FAST=warp: unknown lever\(s\) warp; fix: none, all"):
        variables.parse("FAST", "warp")


@pytest.mark.parametrize("fast, why", [
    ("clip_in_adam", "clip_in_adam works beside fused_adam, and fused_adam is not in the list; fix: add fused_adam"),
    ("fused_adam,flat_adam,norm_residual", "norm_residual works beside triton_norm"),
    ("addmm_bias,qkv_pack", None),
    ("qkv_pack", "qkv_pack works beside addmm_bias"),
    ("liger_norm,triton_norm", "liger_norm and triton_norm both replace the same kernels; fix: keep one"),
    ("all", None),  # every lever named: the one the spec's Norm prefers runs
])
def test_the_plan_refuses_a_lever_without_what_it_needs(fast, why):
    opts = variables.Options(fast=variables.parse("FAST", fast))
    if why is None:
        assert plan.fast_levers(opts, "local") == levers.parse(fast)
    else:
        with pytest.raises(variables.LaunchError, match=re.escape(f"FAST={levers.text(levers.parse(fast))}: {why}")):
            plan.fast_levers(opts, "local")


@pytest.mark.parametrize("fast", ["zero_overlap", "fused_adam,compiled_norm"])
def test_a_retired_lever_is_refused_at_the_edge_in_one_line(fast):
    name = fast.split(",")[-1]
    with pytest.raises(variables.LaunchError, match=rf"^FAST={fast}: lever {name} was retired \(.*\); fix: drop it"):
        variables.parse("FAST", fast)
    with pytest.raises(variables.LaunchError) as e:
        variables.parse("FAST", fast)
    assert str(e.value).count("fix:") == 1  # one fix a line
    assert name in levers.RETIRED and name not in levers.NAMES


def test_the_reference_page_is_the_table():
    from megalab.core import leverdoc

    assert leverdoc.PAGE.read_text(encoding="utf-8") == leverdoc.markdown(), "fix: python -m megalab levers"


def test_make_help_fast_prints_every_lever_and_nothing_else():
    import os
    import subprocess
    import sys

    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["make", "--no-print-directory", "help", "FAST"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^  ([a-z_0-9]+) ", out.stdout, re.M)
    assert listed == list(levers.NAMES) and "Everyday commands" not in out.stdout
