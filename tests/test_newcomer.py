"""The newcomer's path (issue 20): the test venv never shadows a GPU machine's Python, the preflight
says which Python and torch it uses, a planning GPU without a GPU (GPU=h200), the plan reads the
model EXTRA_ARGS change, and the docs' commands run as written."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.runtime import memcap
from megalab.core import catalog, flags, plan
from megalab.harness import launch, pyinfo
from megalab.core.variables import LaunchError, Options
from megalab.core import estimate, gpus

ROOT = Path(__file__).resolve().parent.parent


# ---- the Python make runs targets with ---------------------------------------------------------

def _which_python(tmp_path, gpu: bool, env_py: str | None = None) -> str:
    """`make which-python`'s PY in a copy of the Makefile beside a fake .venv and a fake nvidia-smi."""
    work = tmp_path / (("gpu" if gpu else "cpu") + (env_py or "").replace("/", "_"))
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    (work / ".venv" / "bin" / "python").write_text("#!/bin/sh\n")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nexit {0 if gpu else 9}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PY"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    if env_py:
        env["PY"] = env_py
    out = subprocess.run(["make", "-s", "-n", "which-python"], cwd=work, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return shlex.split(out.stdout)[0]


def test_the_test_venv_is_the_python_only_where_no_gpu_is_visible(tmp_path):
    assert _which_python(tmp_path, gpu=False) == ".venv/bin/python"  # CPU box after make test
    assert _which_python(tmp_path, gpu=True) == "python3"  # GPU machine / docker-run: the CUDA torch
    assert _which_python(tmp_path, gpu=True, env_py="/opt/py") == "/opt/py"  # PY= always wins


def test_the_venv_is_built_on_the_system_packages():
    assert 'python3 -m venv --system-site-packages "$$VENV"' in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("version, shown", [
    ("2.13.0+cpu", "torch 2.13.0+cpu (CPU build)"), ("2.7.0+cu126", "torch 2.7.0+cu126 (CUDA 12.6)"),
    ("2.8.0a0+5228986c39.nv25.06", "torch 2.8.0a0+5228986c39.nv25.06"), (None, "torch not installed")])
def test_the_preflight_says_which_python_and_torch(version, shown):
    line = pyinfo.line("/x/bin/python", version)
    assert line == f"python     /x/bin/python; {shown}"


def test_a_cpu_torch_on_a_gpu_machine_is_called_out():
    assert "fix: PY=python3" in pyinfo.line("/v/bin/python", "2.13.0+cpu", gpus=8)


def test_the_dry_run_prints_the_python_line():
    megatron_verdict("101", {"DRY_RUN": "1"})  # speed only: Megatron's verdict reached in this process (conftest)
    out = subprocess.run([sys.executable, "-m", "megalab", "run", "101"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    assert f"python     {sys.executable}; torch" in out.stdout


# ---- the planning GPU --------------------------------------------------------------------------

def test_without_a_gpu_the_plan_is_for_an_h100_unless_gpu_says_otherwise():
    m = plan.machine_of(gpus=0)
    assert m.gpu_name == gpus.DEFAULT_GPU_NAME and m.gpu_memory_gib == pytest.approx(81559 / 1024)
    m = plan.machine_of(gpus=0, opts=Options(gpu="h200"))
    assert m.gpu_name == "NVIDIA H200" and m.gpu_memory_gib == pytest.approx(143771 / 1024)
    assert plan.machine_of(gpus=0, opts=Options(gpu="a100")).gpu_name == "NVIDIA A100-SXM4-80GB"


def test_gpu_mem_gb_141_plans_an_h200_not_an_h100():
    m = plan.machine_of(gpus=0, opts=Options(gpu_mem_gb=141.0))
    assert m.gpu_name == "NVIDIA H200"
    assert m.gpu_memory_gib == pytest.approx(memcap.nominal_gb_to_gib(141))
    out = subprocess.run([sys.executable, "-m", "megalab", "plan", "101"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "GPU_MEM_GB": "141"})
    assert "(NVIDIA H200)" in out.stdout and "H100" not in out.stdout


def test_the_gpu_present_wins_and_a_contradicting_gpu_is_one_warning():
    m = plan.machine_of(gpus=2, names=["NVIDIA H100 80GB HBM3"] * 2, memory_mib=[81559] * 2,
                          opts=Options(gpu="h200"))
    assert m.gpu_name == "NVIDIA H100 80GB HBM3" and m.warning.startswith("GPU=h200 but this machine has")
    assert "\n" not in m.warning and "fix:" in m.warning
    p = plan.build(catalog.get("101"), Options(), m)
    assert any(l.startswith("warning    GPU=h200") for l in launch.preflight(p))
    assert plan.machine_of(gpus=1, names=["NVIDIA H100 80GB HBM3"], opts=Options(gpu="h100")).warning is None


def test_an_unknown_gpu_is_one_line_with_the_choices():
    with pytest.raises(LaunchError, match="GPU=v100 is not a GPU megalab knows; fix: one of h100, h200, a100"):
        plan.machine_of(gpus=0, opts=Options(gpu="v100"))


def test_gpu_is_a_make_variable_forwarded_to_slurm():
    from megalab.core import variables

    assert variables.BY_NAME["GPU"].forwarded
    assert Options.from_env({"GPU": "h200"}).gpu == "h200"


# ---- the plan reads the model EXTRA_ARGS change ----------------------------------------------------

def test_extra_args_that_change_the_model_change_the_estimate():
    exp = catalog.get("101")
    base = estimate.estimate(exp)
    opts = Options.from_env({"EXTRA_ARGS": "--num-layers 24 --ffn-hidden-size=8000 --swiglu --num-query-groups 5 "
                                            "--untie-embeddings-and-output-weights --normalization RMSNorm --seed 3"})
    m = plan.effective_model(exp, opts)
    assert (m["num_layers"], m["ffn_hidden_size"], m["swiglu"], m["num_query_groups"], m["normalization"],
            m["untie_embeddings"]) == (24, 8000, True, 5, "RMSNorm", True)
    assert exp.model_cfg["num_layers"] == 48  # the preset itself is untouched
    sh = estimate.Shape.of(m, exp)
    h, kv, f = 1600, 1600 // 25 * 5, 8000
    per_layer = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h + h + 2 * h * f + 2 * f + f * h + h + h
    vpad = estimate.padded_vocab(50257, 1)
    assert estimate.total_params(sh) == 24 * per_layer + 2 * vpad * h + 1024 * h + h
    assert estimate.estimate(exp, model_cfg=m).params_total != base.params_total


def test_the_preflight_and_plan_cli_show_the_effective_model():
    env = {**os.environ, "DRY_RUN": "1", "EXTRA_ARGS": "--num-layers 24"}
    megatron_verdict("101", env)  # speed only (conftest)
    out = subprocess.run([sys.executable, "-m", "megalab", "run", "101"], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    assert "gpt2-xl: 24 layers" in out.stdout and "changed by the extra args" in out.stdout
    assert "(24 layers x 1 microbatch" in out.stdout
    out = subprocess.run([sys.executable, "-m", "megalab", "plan", "101"], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    assert "(24 layers x 1 microbatch" in out.stdout


def test_a_model_flag_without_its_value_is_one_line():
    with pytest.raises(catalog.CatalogError, match="--num-layers needs an int value.*fix"):
        flags.effective_model(catalog.models()["gpt2-xl"], ["--num-layers"])


# ---- the docs' commands work after the README's two commands ----------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "tutorials").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_run_megalab_through_the_venv_or_make(doc):
    """`python -m megalab` under the system Python fails without pandas: the docs say .venv/bin/python
    (which `make test` builds) or a make target."""
    bare = [l for l in doc.read_text(encoding="utf-8").splitlines()
            if re.search(r"(?<![/\w])python3? -m megalab", l)]
    assert not bare, f"{doc.name}: write .venv/bin/python -m megalab (or a make target): {bare[0]}"


def test_a_python_that_recompiles_torch_in_every_process_is_called_out(tmp_path, monkeypatch):
    """The GPU rig sets PYTHONDONTWRITEBYTECODE=1 over a torch with no __pycache__: import torch took
    5.5 s instead of 2.6 s in every process of every launch."""
    from megalab.harness import pyinfo

    assert pyinfo.recompiles({"PYTHONDONTWRITEBYTECODE": "1"}, tmp_path)
    (tmp_path / "__pycache__").mkdir()
    assert not pyinfo.recompiles({"PYTHONDONTWRITEBYTECODE": "1"}, tmp_path)
    assert not pyinfo.recompiles({}, tmp_path)
    monkeypatch.setattr(pyinfo, "recompiles", lambda: True)
    assert pyinfo.line("/x/python", "2.9.0").endswith("fix: unset PYTHONDONTWRITEBYTECODE")
