"""The catalog, the wrapper's flags, and Megatron's own verdict on every target (CPU only)."""
import re
import subprocess
from pathlib import Path

import pytest

from megalab import catalog, launch, validate
from megalab.catalog import CatalogError, Experiment

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "configs" / "reference" / "anchor_8xh100.csv"


def _opts(**kw):
    return launch.Options(**({"iters": 20} | kw))


def test_makefile_target_list_matches_catalog():
    out = subprocess.run(["make", "-s", "-pRrq", "-f", "Makefile"], cwd=ROOT, capture_output=True, text=True).stdout
    ids = list(catalog.catalog())
    for i in ids:
        assert re.search(rf"^{re.escape(i)}:", out, re.M), f"{i} is not a make target"


def test_every_chapter1_reference_row_has_its_target():
    import csv

    rows = [r for r in csv.DictReader(open(REF)) if r["chapter"] == "1"]
    by_ref = {e.ref: e for e in catalog.catalog().values() if e.chapter == 1 and e.ref}
    assert len(rows) == 13
    for r in rows:
        exp = by_ref[r["row"]]
        assert exp.id == r["target"]
        assert (exp.gbs, exp.mbs, exp.gpus, exp.dp) == (int(r["gbs"]), int(r["mbs"]), int(r["gpus"]), int(r["dp"]))
        assert exp.zero2 == (r["zero2"] == "1")
        assert exp.model_cfg["num_layers"] == int(r["layers"])


@pytest.mark.parametrize("target", list(catalog.catalog()))
def test_every_target_dry_runs_and_megatron_accepts_it(target):
    exp = catalog.get(target)
    exp.validate()
    env = launch.wrapper_env(exp, _opts(), "local")
    cmd = launch.torchrun_command(env)
    assert cmd.startswith("torchrun ") and f"--nproc_per_node {exp.gpus}" in cmd
    args = validate.validate(validate.entry_args(cmd), exp.gpus)
    assert args.data_parallel_size == exp.dp
    assert args.global_batch_size == exp.gbs and args.micro_batch_size == exp.mbs
    assert args.use_distributed_optimizer == exp.zero2
    assert args.transformer_impl == "local" and args.spec == ["megalab.spec", "megalab_layer_spec"]


def test_dry_run_128_shows_8_processes_distributed_optimizer_and_preflight():
    out = subprocess.run(["make", "-s", "128-gpt2xl-dp8-gbs128-zero2"], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    assert "--nproc_per_node 8" in out.stdout and "--use-distributed-optimizer" in out.stdout
    assert "needs 8" in out.stdout and "DP=8" in out.stdout and "accepts the flags with WORLD_SIZE=8" in out.stdout


def test_prefix_lookup_and_unknown_target():
    assert catalog.get("101").id == "101-gpt2xl-dp1-gbs1-bf16"
    with pytest.raises(CatalogError, match="unknown target '999'.*make list"):
        catalog.get("999")


def _bad(**kw):
    base = dict(id="x", chapter=1, about="", model="gpt2-xl", gpus=2, gbs=32, mbs=16)
    return Experiment(**(base | kw))


@pytest.mark.parametrize("kw,msg", [
    (dict(gbs=30, mbs=16), "not divisible by micro batch x DP"),
    (dict(gpus=3, tp=2), "not divisible by TP x PP x CP"),
    (dict(gpus=2, tp=2, gbs=16), "25 attention heads cannot be split over TP=2"),
    (dict(gpus=2, pp=2, layers_per_virtual_stage=5, gbs=16), "virtual stages"),
    (dict(sp=True), "sequence parallel needs TP >= 2"),
    (dict(recompute="sometimes"), "recompute"),
])
def test_layouts_megatron_would_reject_fail_early_with_a_fix(kw, msg):
    with pytest.raises(CatalogError, match=msg) as e:
        _bad(**kw).validate()
    assert "fix" in str(e.value) and "\n" not in str(e.value)


def test_megatron_rejection_is_reported_in_one_line(monkeypatch):
    exp = _bad(gbs=32, mbs=16, extra_args=("--no-such-flag",))
    env = launch.wrapper_env(exp, _opts(), "local")
    with pytest.raises(launch.LaunchError, match="Megatron rejects x on 2 GPUs") as e:
        launch.megatron_check(exp, launch.torchrun_command(env))
    assert "\n" not in str(e.value)
