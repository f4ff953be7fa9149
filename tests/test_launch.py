"""Bad input gets one line naming the problem and the fix, a non-zero exit, and nothing lost."""
import csv
import dataclasses
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.core import plan
from megalab.harness import launch, monitor

ROOT = Path(__file__).resolve().parent.parent


def _make(*args, **env):
    megatron_verdict(args[0], env)  # speed only: Megatron's verdict reached in this process first (conftest)
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})


def _one_error_line(stderr):
    lines = [l for l in stderr.splitlines() if l.startswith("megalab:")]
    assert len(lines) == 1, stderr
    assert "fix" in lines[0]
    return lines[0]


def test_unknown_target_one_line_and_exit_2():
    out = _make("199-nope")
    assert out.returncode != 0
    assert "unknown target '199-nope'" in _one_error_line(out.stderr)


def test_more_gpus_than_present_says_needed_and_found():
    out = _make("122-gpt2xl-dp2-gbs32-zero2", ITERS="2")
    assert out.returncode != 0
    line = _one_error_line(out.stderr)
    assert "needs 2 GPUs per node, found 0" in line


def test_te_requested_but_absent():
    with pytest.raises(launch.LaunchError, match="Transformer Engine, which is not installed"):
        plan.transformer_impl(launch.Options(te="1"), te=None)
    assert plan.transformer_impl(launch.Options(), te=None) == "local"
    assert plan.transformer_impl(launch.Options(), te="2.1") == "transformer_engine"


@pytest.mark.parametrize("version,msg", [(None, "megatron-core is not installed"),
                                         ("0.16.1", "megatron-core 0.16.1 is installed but megalab targets 0.19.x")])
def test_megatron_missing_or_wrong_version(monkeypatch, version, msg):
    from megalab.harness import validate

    monkeypatch.delenv("MEGATRON_LM", raising=False)
    monkeypatch.setattr(validate, "megatron_available", lambda: version)
    with pytest.raises(launch.LaunchError, match=msg):
        launch.check_megatron_installed(launch.Options())


def test_outdir_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(launch.LaunchError, match="cannot write to OUTDIR"):
        launch.make_run_dir(blocker / "sub", "101")


def test_run_dirs_are_never_reused(tmp_path):
    a = launch.make_run_dir(tmp_path, "101-x")
    (a / "logs.txt").write_text("keep me")
    b = launch.make_run_dir(tmp_path, "101-x")
    assert a != b and (a / "logs.txt").read_text() == "keep me"
    assert a.name.endswith("___101-x")


def test_bad_make_variable():
    with pytest.raises(launch.LaunchError, match="not a number"):
        launch.Options.from_env({"ITERS": "many"})


def test_nnodes_must_divide_gpus():
    from megalab.core import catalog

    with pytest.raises(launch.LaunchError, match="do not split over NNODES=3"):
        plan.gpus_per_node(catalog.get("128"), launch.Options(nnodes=3))


def test_two_nodes_halves_processes_per_node():
    from megalab.core import catalog

    cmd = plan.build(catalog.get("128"), launch.Options(nnodes=2, node_rank=1, master_addr="n0")).command
    assert "--nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr n0" in cmd


def test_gpu_mem_cap_reaches_the_preflight():
    out = _make("111-gpt2xl-dp1-fit-80GB", DRY_RUN="1", GPU_MEM_GB="80")
    assert out.returncode == 0 and "GPU cap: 80 GB" in out.stdout


class _FakeNvml(types.SimpleNamespace):
    """Two GPUs whose used memory rises on each read."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return "NVIDIA H100 80GB HBM3"
    def nvmlSystemGetDriverVersion(self): return "580.00"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"
    def nvmlDeviceGetUtilizationRates(self, h): return types.SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, h):
        self.reads += 1
        return types.SimpleNamespace(used=(1000 + 10 * self.reads + 500 * h) * 2**20, total=81559 * 2**20)


def test_monitor_samples_every_visible_gpu_and_keeps_peaks(monkeypatch, tmp_path):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert monitor.gpu_inventory()["count"] == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with monitor.GpuMemoryMonitor(tmp_path / "m.csv", interval_s=0.01) as mon:
        time.sleep(0.1)
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert {r["gpu"] for r in rows} == {"0", "1"}
    assert mon.peak_mib[1] > mon.peak_mib[0] > 1000
    assert mon.peak_mib[0] == max(int(r["mem_used_mib"]) for r in rows if r["gpu"] == "0")


def test_monitor_without_nvml_does_not_break_the_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with monitor.GpuMemoryMonitor(tmp_path / "m.csv") as mon:
        pass
    assert mon.error and mon.peak_mib == []


def test_megatron_lm_checkout_runs_upstreams_entry_point(tmp_path):
    from megalab.core import catalog

    p = plan.build(catalog.get("101"), launch.Options(megatron_lm=str(tmp_path)))
    assert f"{tmp_path}/pretrain_gpt.py --num-layers 48" in p.command
    assert p.env["PYTHONPATH"].split(":")[:2] == [str(ROOT), str(tmp_path)]


def test_quickstart_without_gpu_shows_the_plan_and_rebuilds_tables(tmp_path):
    """On any host, GPU or not: an nvidia-smi that fails keeps it on the no-GPU path (no GPU run),
    and this interpreter has the base dependencies, so no venv is built."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    before = {p: p.read_bytes() for p in sorted((ROOT / "results").rglob("*.md"))}
    megatron_verdict("101-gpt2xl-dp1-gbs1-bf16")  # speed only: quickstart's dry run of 101 (conftest)
    out = _make("quickstart", f"PY={sys.executable}", PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert {p: p.read_bytes() for p in before} == before  # committed pages rebuilt byte-identical
    assert out.returncode == 0, out.stderr
    assert "no GPU found" in out.stdout
    assert "torchrun --standalone --local-addr localhost --nproc_per_node 1" in out.stdout and "tables" in out.stdout


def test_context_parallel_runs_on_megalab_spec_and_is_refused_on_the_local_spec():
    # megalab's spec has CP (megalab/runtime/cp_attention.py): the launch gets as far as counting GPUs
    out = _make("005-gpt2large-cp2-gbs64")
    assert out.returncode != 0 and "needs 2 GPUs per node, found 0" in _one_error_line(out.stderr)
    # Megatron's stock local spec has none (only TE's attention has it): one line, before launch
    out = _make("005-gpt2large-cp2-gbs64", SPEC="local")
    assert out.returncode != 0
    assert "context parallelism (CP=2), which Megatron's local spec lacks" in _one_error_line(out.stderr)
    dry = _make("005-gpt2large-cp2-gbs64", DRY_RUN="1", SPEC="local")
    assert dry.returncode == 0 and "warning    target 005" in dry.stdout


def test_ring_attention_needs_attention_dropout_off():
    from megalab.core import catalog

    exp = catalog.get("005")
    te = plan.Machine(te="2.1")

    def problem(e, opts=launch.Options(), machine=plan.Machine()):
        return launch.cp_problem(plan.build(e, opts, machine))

    assert problem(exp) is None
    assert problem(exp, machine=te) is None
    why = problem(exp, launch.Options(extra_args=("--attention-dropout", "0.1")))
    assert "--attention-dropout 0" in why and "fix" in why
    ag = exp.model_copy(update={"cp_comm": "all_gather", "extra_args": ()})
    assert problem(ag) is None  # SDPA keeps dropout there
    hier = exp.model_copy(update={"cp_comm": "a2a+p2p"})
    assert "not one of megalab's CP modes" in problem(hier)


def test_real_data_flags_and_missing_dataset(tmp_path):
    from megalab.core import catalog

    data = {"DATA": str(tmp_path / "owt_text_document"), "TOKENIZER_MODEL": str(tmp_path / "tok"), "SPLIT": "98,2,0"}
    p = plan.build(catalog.get("101"), launch.Options.from_env(data))
    cmd = p.command
    assert f"--data-path {tmp_path}/owt_text_document --tokenizer-type HuggingFaceTokenizer" in cmd
    assert "--split 98,2,0" in cmd and "--mock-data" not in cmd
    assert launch.data_problem(p) == f"DATA={data['DATA']}: {data['DATA']}.idx not found; fix: make prepare-data (it prints DATA=...)"
    # scripts/train_gpt.sh (the target's launch script, run without make) refuses it too, in one line
    env = {**os.environ, **data, "PY": sys.executable}
    env.pop("DRY_RUN", None)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "train_gpt.sh"), "101"], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 2 and "owt_text_document.idx not found; fix: make prepare-data" in _one_error_line(out.stderr)


def test_real_data_split_megatron_cannot_build_is_one_line_before_launch(tmp_path):
    """Found on the GPU rig: 949,50,1 over a 789-document corpus gave the test split one short
    document, less than a sample, and Megatron stopped after its start-up (tests/test_data.py
    checks that case's counts); 55 documents give it none, and Megatron hangs. Both are caught
    before the GPU check, with the split that works for this target's sequence length."""
    from megalab.harness import data

    res = data.prepare(source=str(ROOT / "tests/fixtures/corpus/founding-documents.jsonl"),
                       tokenizer="train:512", out=str(tmp_path / "fd"), workers=1, quiet=True)
    out = _make("101-gpt2xl-dp1-gbs1-bf16", ITERS="2", DATA=res.paths.data, SPLIT="949,50,1",
                TOKENIZER_MODEL=res.info["tokenizer_dir"])
    assert out.returncode != 0
    line = _one_error_line(out.stderr)
    assert "SPLIT=949,50,1 leaves the test split no documents" in line and line.endswith("fix: SPLIT=98,2,0")
    out = _make("101-gpt2xl-dp1-gbs1-bf16", ITERS="2", DATA=str(tmp_path / "missing_text_document"),
                TOKENIZER_MODEL=res.info["tokenizer_dir"])
    assert "missing_text_document.idx not found" in _one_error_line(out.stderr)


def test_record_keeps_the_catalogs_extra_flags_and_the_users(tmp_path):
    """config.extra_args is the user's EXTRA_ARGS (the bench keys runs on it); the catalog's own
    flags (e.g. a CP row's --attention-dropout 0) are kept beside it, not overwritten."""
    import datetime as dt
    import shutil
    from types import SimpleNamespace

    from megalab.core import catalog
    from megalab.harness import record
    from megalab.core import logparse

    exp = catalog.get("302")
    assert exp.extra_args
    shutil.copy(ROOT / "tests/fixtures/logs/ok_1gpu_v019.txt", tmp_path / "logs.txt")
    now = dt.datetime.now(dt.timezone.utc)
    p = plan.build(exp, launch.Options(extra_args=("--seed", "7")), run_dir=tmp_path)
    rec = record.build(plan=p, returncode=0, interrupted=False,
                       monitor=SimpleNamespace(peak_mib=[], baseline_mib=[], samples=0, error=None),
                       inventory={}, started=now, ended=now, hostname="h")
    assert rec["config"]["catalog_extra_args"] == list(exp.extra_args)
    assert rec["config"]["extra_args"] == "--seed 7"
    # schema 2: the plan as `intent`, the entry point's own `megalab:` line as `observed`
    assert rec["schema"] == 2 and rec["intent"]["argv"] == p.argv and rec["command"] == p.command
    assert rec["intent"]["groups"]["EXTRA"][-2:] == ["--seed", "7"]
    assert rec["observed"] == logparse.parse_file(tmp_path / "logs.txt").megalab and rec["observed"]


def test_megatrons_verdict_is_cached_and_a_rejection_never(tmp_path, monkeypatch):
    """An identical check that passed is not run again (it costs a launch 4-10 s of imports); other flags
    are checked afresh; a rejection raises every time."""
    from megalab.harness import validate

    calls = []

    def fake(args, world):
        calls.append(list(args))
        if "--bad" in args:
            raise validate.MegatronRejected("no")

    monkeypatch.setattr(validate, "validate", fake)
    env = {"MEGALAB_CACHE_DIR": str(tmp_path)}
    assert validate.validate_cached(["--a", "1"], 2, [], env) is False
    assert validate.validate_cached(["--a", "1"], 2, [], env) is True
    assert validate.validate_cached(["--a", "1"], 4, [], env) is False  # another world size
    assert validate.validate_cached(["--a", "2"], 2, [], env) is False  # other flags
    assert validate.validate_cached(["--a", "2"], 2, ["NVIDIA A100-SXM4-80GB"], env) is False  # another GPU
    for _ in range(2):
        with pytest.raises(validate.MegatronRejected):
            validate.validate_cached(["--bad"], 2, [], env)
    assert len(calls) == 6
    assert validate.cache_dir(env) == tmp_path / "megatron-check"
    # two launches of one plan differ only in the run directory their logs go to: one verdict
    run = ["--a", "1", "--tensorboard-dir", "/runs/20261125_1/tensorboard"]
    assert validate.validate_cached(run, 2, [], env) is True  # ["--a", "1"] passed above
    assert validate.validate_cached(run[:3] + ["/runs/20261125_2/tensorboard"], 2, [], env) is True
    assert validate.validate_cached(["--a", "1"], 2, [], env) is True  # its DRY_RUN (no run dir) had the verdict
    assert validate.validate_cached(["--tensorboard-dir", "x", "--a", "2", "--b"], 2, [], env) is False  # flags decide
    assert len(calls) == 7


def test_megatrons_flag_table_is_kept_per_install_and_made_again_when_damaged(tmp_path, monkeypatch):
    """A flag Megatron does not know is refused from its flag table in the cache (no parser, so no import of
    megatron.training), with the answer the parser gives; a table that is damaged, of another install or
    empty is not used, and is made again; flags the table knows still go through the parser."""
    from megalab.harness import validate

    env = {"MEGALAB_CACHE_DIR": str(tmp_path)}
    built, real = [], validate.parser
    monkeypatch.setattr(validate, "parser", lambda: built.append(1) or real())

    def refused(*args):
        with pytest.raises(validate.UnknownFlag) as e:
            validate.check_flags(list(args), env)
        return str(e.value)

    line = "--num-layer is not a Megatron flag (closest: --num-layers)"
    assert refused("--seed", "7", "--num-layer", "3") == line and len(built) == 1  # the parser: the table made
    path = validate.flag_table_path(env)
    assert path.parent == tmp_path / "megatron-flags" and "--num-layers" in validate.flag_table(env)
    assert refused("--seed", "7", "--num-layer", "3") == line and len(built) == 1  # the table
    validate.check_flags(["--seed", "7"], env)  # known flags: the parser reads their values
    assert len(built) == 2
    for damage in (b"\xff", b"{", b"[]", b'{"key": "another", "flags": ["--num-layer"]}',
                   b'{"key": "%s", "flags": []}' % path.stem.encode(), b'{"key": "%s", "flags": [7]}' % path.stem.encode()):
        path.write_bytes(damage)
        assert validate.flag_table(env) is None
        assert refused("--num-layer", "3") == line
        assert validate.flag_table(env) and len(built) == 3  # made again
        built.pop()


def test_the_flag_tables_unknown_flag_is_the_parsers():
    """unknown_flag (what the table decides alone) names the flag argparse would name first, and leaves to
    the parser an item it may read as a value (`--x y` after a flag with nargs)."""
    from megalab.harness import validate

    p = validate.parser()
    known = validate.table_of(p)
    cases = [["--seed", "7", "--foo-bar", "1"], ["--foo=1"], ["--seed=7"], ["--seed", "7"], ["--", "--foo"],
             ["--spec", "a", "b", "--foo", "--bar"], ["x", "--foo"], ["---x"], ["--=x"], ["--num-layers=3", "--fo"]]
    for args in cases:
        _, unknown = p.parse_known_args(args)
        first = next((a.split("=", 1)[0] for a in unknown if a.startswith("--")), None)
        assert validate.unknown_flag(args, known) == (None if "--" in args else first), args
    # left to the parser: what follows a bare `--`, and an item with a space (a value, after a flag with nargs)
    assert validate.unknown_flag(["--data-path", "--foo bar", "--baz"], known) is None
    assert p.parse_known_args(["--data-path", "--foo bar"])[1] == []


@pytest.mark.parametrize("extra,line", [
    ("--num-layer 3", "megalab: EXTRA_ARGS: --num-layer is not a Megatron flag (closest: --num-layers); fix: "
                      "correct or drop it (make show-arguments GREP=num lists megatron-core's flags)"),
    ("--seed 7 --foo-bar 1", "megalab: EXTRA_ARGS: --foo-bar is not a Megatron flag; fix: correct or drop it"),
    ("--seed=7 --attention-dropuot=0", "megalab: EXTRA_ARGS: --attention-dropuot is not a Megatron flag "
                                       "(closest: --attention-dropout); fix"),
])
def test_a_flag_megatron_does_not_know_is_one_line_before_anything_else(extra, line):
    """issue 33: not 726 lines of Megatron's usage, and not "fix the layout in configs/experiments/"."""
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", EXTRA_ARGS=extra)
    assert out.returncode != 0 and out.stdout == ""  # no preflight line before it
    assert _one_error_line(out.stderr).startswith(line)
    assert len(out.stderr.splitlines()) <= 2  # ours, and make's own "Error 2"


def test_a_value_megatron_rejects_says_it_came_from_extra_args():
    out = _make("101-gpt2xl-dp1-gbs1-bf16", DRY_RUN="1", EXTRA_ARGS="--seed many")
    line = _one_error_line(out.stderr)
    assert out.returncode != 0 and out.stdout == ""
    assert line.startswith("megalab: EXTRA_ARGS: Megatron rejects 101-gpt2xl-dp1-gbs1-bf16 with --seed many: "
                           "argument --seed: invalid int value: 'many'; fix: change or drop those EXTRA_ARGS")


def test_a_run_writes_its_launch_script_and_runs_exactly_that(tmp_path, monkeypatch):
    """The supervisor runs `bash RUN_DIR/launch.sh`; torchrun gets the plan's argv (the record's intent),
    and `bash RUN_DIR/launch.sh` by hand runs the same command again."""
    import json

    from megalab.core import catalog

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(
        "#!/bin/sh\nprintf '%s\\0' \"$@\" >> \"$ARGV_LOG\"\nprintf '\\n' >> \"$ARGV_LOG\"\n"
        "echo ' [2026-01-01 00:00:00] iteration        1/       2 | elapsed time per iteration (ms): 400.0 |'\n"
        "echo '[after training is done] datetime: 2026-01-01 00:00:01'\n")
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("ARGV_LOG", str(tmp_path / "argv"))
    monkeypatch.delenv("DRY_RUN", raising=False)
    monkeypatch.setattr(monitor, "gpu_inventory",
                        lambda: {"count": 1, "names": ["NVIDIA H100"], "memory_mib": [81559], "driver": "580"})
    monkeypatch.setattr(launch, "check_busy", lambda *a: [])
    monkeypatch.setattr(launch, "check_megatron_installed", lambda *a: None)
    opts = launch.Options(iters=2, outdir=tmp_path / "out", extra_args=("--data-cache-path", "/a b $(x)"))
    assert launch.run("101", opts) == 0
    (run_dir,) = (tmp_path / "out").iterdir()
    rec = json.loads((run_dir / "run.json").read_text())
    script = run_dir / "launch.sh"
    assert script.read_text() == plan.build(catalog.get("101"), dataclasses.replace(
        opts, master_port=rec["intent"]["master_port"]), plan.Machine(**rec["intent"]["machine"]),
        run_dir=run_dir).script
    subprocess.run(["bash", str(script)], check=True, capture_output=True)  # by hand, again
    first, again = (tmp_path / "argv").read_text().split("\n")[:2]
    assert first == again and ["torchrun", *first.split("\0")[:-1]] == rec["intent"]["argv"]
    assert rec["config"]["extra_args"] == "--data-cache-path '/a b $(x)'"
