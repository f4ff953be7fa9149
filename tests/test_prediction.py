"""One prediction: `python -m megalab plan TARGET` prints exactly the plan block the preflight of
`DRY_RUN=1 make TARGET` prints, for every catalog target and the variables that change it (CUDA_GRAPH,
FAST, GPU, GPU_MEM_GB, EXTRA_ARGS), and that block and the CUDA-graph decision name one peak figure."""
from __future__ import annotations

import re

import pytest

from megalab.__main__ import main
from megalab.core import catalog
from megalab.harness import launch, monitor

TARGETS = list(catalog.catalog())


def _more_layers(exp: catalog.Experiment) -> str:
    """EXTRA_ARGS' model flag every layout takes: twice the preset's layers (still divisible by PP and
    the virtual stages)."""
    return f"--num-layers {2 * int(exp.model_cfg['num_layers'])}"


SETTINGS = {
    "defaults": {},
    "graph off, no levers": {"CUDA_GRAPH": "0", "FAST": "none"},
    "graph forced, an H200": {"CUDA_GRAPH": "1", "GPU": "h200"},
    "a 40 GB cap, one lever": {"GPU_MEM_GB": "40", "FAST": "fused_adam"},
    "EXTRA_ARGS' model flag": {"EXTRA_ARGS": _more_layers},
}
VARIABLES = ("CUDA_GRAPH", "FAST", "GPU", "GPU_MEM_GB", "EXTRA_ARGS", "SPEC", "DRY_RUN", "TE")


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without GPUs, and Megatron's own argument check left out (it is tested in test_launch)."""
    monkeypatch.setattr(monitor, "gpu_inventory", lambda: {"count": 0, "names": [], "memory_mib": []})
    monkeypatch.setattr(launch, "megatron_check", lambda *a, **k: "megatron   (not checked here)")
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _peak(text: str) -> float:
    return float(re.search(r"^peak +([0-9.]+) GiB per GPU", text, re.M).group(1))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_plan_prints_the_preflights_prediction_for_every_target(no_gpu, capsys, setting):
    problems = []
    for target in TARGETS:
        exp = catalog.get(target)
        for name, value in SETTINGS[setting].items():
            no_gpu.setenv(name, value(exp) if callable(value) else value)
        no_gpu.delenv("DRY_RUN", raising=False)
        assert main(["plan", target]) == 0, target
        planned = capsys.readouterr().out
        no_gpu.setenv("DRY_RUN", "1")
        assert main(["run", target]) == 0, target
        preflight = capsys.readouterr().out
        if planned not in preflight:
            problems.append(f"{target}: `plan` printed\n{planned}\nnot found in the preflight\n{preflight}")
            continue
        # one peak: where auto decided by memory, its reason quotes the peak the plan prints
        speed = next(line for line in preflight.splitlines() if line.startswith("speed "))
        quoted = re.search(r"auto: predicted peak ([0-9.]+) GiB", speed)
        if quoted and float(quoted.group(1)) != _peak(planned):
            problems.append(f"{target}: the CUDA-graph reason says {quoted.group(1)} GiB, the plan {_peak(planned)}")
        graph_on = "CUDA graph: on" in speed
        if graph_on != (" + CUDA graph " in planned):
            problems.append(f"{target}: the plan's peak and the decision disagree on the graph")
    assert not problems, "\n".join(problems[:3])
    assert len(TARGETS) > 100  # every catalog target, not a sample


@pytest.mark.parametrize("argv,needle", [(["111", "FOO=1"], "FOO: not a make variable; fix: "),
                                         (["GPU=h100"], "plan needs a TARGET"),
                                         (["111", "112"], "plan takes one TARGET, then VAR=value words")])
def test_plan_takes_make_variables_as_documented_and_names_a_bad_word(no_gpu, capsys, argv, needle):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_predicted_columns_are_what_plan_prints_for_an_h100(no_gpu, capsys):
    """The results pages' `predicted GiB` / `predicted ms` for a row no machine here runs are the figures
    `python -m megalab plan TARGET GPU=h100` prints (one code path: plan.estimate_of)."""
    from megalab.results import columns, predicted

    wanted = [e for e in catalog.catalog().values() if predicted.wanted(e)]
    assert wanted and all(e.gpus > predicted.RIG_GPUS for e in wanted)
    for exp in wanted:  # the documented form: the make variable on the command line
        assert main(["plan", exp.id, "GPU=h100"]) == 0
        out = capsys.readouterr().out
        cells = columns.predicted_cells(exp)
        peak = f"{_peak(out):.1f}"
        fits = "DOES NOT FIT" not in out
        assert cells["predicted GiB"] == peak + ("" if fits else " (oom)"), exp.id
        ms = re.search(r"^time +([0-9]+) ms per step", out, re.M).group(1)
        assert cells["predicted ms"] == (ms if fits else ""), exp.id
