"""The benchmark's CPU side: configuration, run identity, bisection, parity verdicts, trace reading,
the committed report, and a clean refusal without a GPU."""
import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megalab.core import catalog, plan
from megalab.core.records import RunRecord
from megalab.harness import bench, launch
from megalab.runtime import levers
from megalab.results import benchreport

ROOT = Path(__file__).resolve().parent.parent


# No GPU visible, whatever the host has: a test never starts a benchmark run.
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def test_bench_refuses_to_run_without_a_gpu():
    out = subprocess.run([sys.executable, "-m", "megalab", "bench", "run"], cwd=ROOT, capture_output=True,
                         text=True, env=NO_GPU)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "fix:" in lines[0]


def test_unknown_part_is_a_one_line_error():
    out = subprocess.run([sys.executable, "-m", "megalab", "bench", "run", "--parts", "cases,warp"], cwd=ROOT,
                         capture_output=True, text=True, env=NO_GPU)
    assert out.returncode == 2 and "unknown part" in out.stderr and "fix:" in out.stderr


def test_committed_bench_report_is_up_to_date():
    text = benchreport.render(bench.BENCH_DIR)
    assert (bench.BENCH_DIR / "README.md").read_text(encoding="utf-8") == text, "run `make bench-report` and commit"


def test_config_names_only_known_levers_and_targets():
    from megalab.core import catalog

    cfg = bench.load_config()
    known = set(cfg["levers"])
    for spec in cfg["specs"].values():
        assert set(spec["levers"]) <= known
    for step in cfg["ablation"]["steps"]:
        assert set(step) <= known
    assert set(cfg["ablation"]["alternatives"]) <= known
    targets = [c["target"] for c in cfg["cases"]] + [cfg["search"]["target"]]
    targets += [p[s]["target"] for p in cfg["parity"]["pairs"] for s in ("a", "b")]
    targets += [p["target"] for p in cfg["experts"]["pairs"]]
    for p in cfg["experts"]["pairs"]:
        assert set(p["a"]) | set(p["b"]) <= known
    for t in targets:
        catalog.get(t)  # raises for an unknown id


def test_a_batch_override_is_a_new_run_with_its_own_id():
    run = bench.Run(target="101-gpt2xl-dp1-gbs1-bf16", spec="megalab", gbs=8)
    exp = run.experiment()
    assert exp.id == "101-gpt2xl-dp1-gbs1-bf16.gbs8" and exp.gbs == 8 and exp.mbs == 8 and exp.ref is None
    same = bench.Run(target="111-gpt2xl-dp1-fit-80GB", spec="megalab", gbs=15)
    assert same.experiment().id == "111-gpt2xl-dp1-fit-80GB"  # the target's own batch: the target itself


def test_levers_compose_into_launch_options():
    cfg = bench.load_config()
    run = bench.make_run(cfg, "101-gpt2xl-dp1-gbs1-bf16", "megalab", ["fused_adam", "cuda_graph", "fused_ce"])
    assert run.fast == ("fused_adam",) and run.cuda_graph
    assert "--cross-entropy-loss-fusion" in run.extra_args
    plain = bench.make_run(cfg, "101-gpt2xl-dp1-gbs1-bf16", "local", [])
    assert plain.fast == () and not plain.cuda_graph and plain.extra_args == ""


def test_record_key_matches_the_run_that_made_it():
    """A record written by the launcher for a Run is found again by that Run (resumable bench)."""
    run = bench.Run(target="101-gpt2xl-dp1-gbs1-bf16", spec="megalab", fast=("fused_adam", "foreach_norm"),
                    cuda_graph=True, gbs=4, iters=15)
    opts = dataclasses.replace(launch.Options(), spec="megalab", fast=run.fast, cuda_graph=True, iters=15)
    config = {"id": run.experiment().id, "spec": "megalab", "fastpath": list(plan.fast_levers(opts, "local")),
              "cuda_graph": True, "iters": 15, "extra_args": opts.extra_args_text}
    assert bench.record_key(RunRecord.of({"target": config["id"], "status": "ok", "config": config})) == run.key()


def test_fast_path_defaults_differ_by_spec():
    assert plan.fast_levers(launch.Options(spec="megalab"), "local") == levers.EVERY
    assert plan.fast_levers(launch.Options(spec="local"), "local") == ()
    assert plan.fast_levers(launch.Options(spec="megalab", fast=()), "local") == ()
    assert plan.fast_levers(launch.Options(spec="megalab"), "transformer_engine") == ()
    with pytest.raises(launch.LaunchError, match="FAST=warp.*fix"):
        launch.Options.from_env({"FAST": "warp"})


class _FakeRunner:
    """Fits up to `limit`; records every size it was asked for."""

    def __init__(self, limit):
        self.limit, self.asked = limit, []

    def get(self, run):
        self.asked.append(run.gbs)
        return RunRecord.of({"target": run.id, "status": "ok" if run.gbs <= self.limit else "oom"})


@pytest.mark.parametrize("limit", [5, 15, 16, 17, 24])
def test_search_finds_the_largest_batch_that_fits(limit):
    cfg = bench.load_config()
    runner = _FakeRunner(limit)
    start = cfg["search"]["start"]["megalab"]
    res = bench.search(runner, cfg, "megalab")
    if limit < start:
        assert res["largest"] is None
    else:
        assert res["largest"] == min(limit, cfg["search"]["up_to"])
        assert len(runner.asked) <= 6  # bisection, not a sweep


def _log(path: Path, losses):
    lines = [f" [2026-11-22 10:00:00] iteration {i:8d}/{len(losses):8d} | consumed samples: {i} | "
             f"elapsed time per iteration (ms): 100.0 | lm loss: {v:.6E} | loss scale: 1.0 |"
             for i, v in enumerate(losses, 1)]
    path.write_text("\n".join(lines) + "\n")


def test_parity_verdicts(tmp_path):
    base = [10.8, 10.7, 10.6, 10.5, 10.4, 10.3, 10.2, 10.1, 10.0, 9.9]
    recs = {}
    for name, losses in {"a": base, "same": [v * 1.0002 for v in base],
                         "off_at_start": [v * 1.01 for v in base],
                         "drift": base[:5] + [v * 1.05 for v in base[5:]]}.items():
        d = tmp_path / name
        d.mkdir()
        _log(d / "logs.txt", losses)
        recs[name] = RunRecord.of({"target": name, "status": "ok", "files": {"log": "logs.txt"}}, d)
    assert benchreport.parity(recs["a"], recs["same"])["pass"]
    assert not benchreport.parity(recs["a"], recs["off_at_start"])["pass"]  # a wrong function shows at once
    assert not benchreport.parity(recs["a"], recs["drift"])["pass"]  # a lasting offset fails the median


def test_trace_summary_separates_gpu_busy_from_wall_time(tmp_path):
    events = [
        # the GPU's copy of the step spans its kernels only; the step's wall time is the host's
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": 100, "dur": 800},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 100, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 250, "dur": 100},  # overlaps: counted once
        {"ph": "X", "cat": "kernel", "name": "adam", "ts": 800, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
    ]
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = bench.trace_summary(path)
    assert s["steps"] == [{"step": "ProfilerStep#1", "wall_ms": 1.0, "gpu_busy_ms": 0.35, "kernels": 3}]
    assert s["kernels"][0] == {"name": "gemm", "ms_per_step": 0.3, "calls_per_step": 2}
    assert s["kinds"] == [{"kind": "GEMM", "ms_per_step": 0.3}, {"kind": "optimizer", "ms_per_step": 0.1}]
    assert "busy %" in bench.render_trace(s)


def test_host_gaps_name_the_sync_and_the_launch_that_left_the_gpu_idle(tmp_path):
    """A step whose GPU idles 2 ms while the host waits on a sync and then launches from aten::mul, and 1.4 ms
    at its end: both gaps, their launch sites and the sync; a 0.1 ms gap stays under the threshold."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 2000, "dur": 3000, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 2100, "dur": 1500, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 5500, "dur": 100, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5550, "dur": 20, "tid": 1,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "k0", "ts": 0, "dur": 3500, "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 3600, "dur": 0, "args": {"correlation": 6}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 5600, "dur": 3000, "args": {"correlation": 7}},
    ]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    text = bench.host_gaps(path, min_ms=0.2)
    assert "ProfilerStep#1: wall 10.0 ms, 2 gaps > 0.2 ms, idle 3.4 ms" in text
    assert "2.00 ms at +    3.6; next: k2" in text and "waits before: ['cudaStreamSynchronize']" in text
    assert "launched from: ProfilerStep#1 > aten::mul" in text
    assert "1.40 ms    1x (step end)" in text
    assert "2 gaps" not in bench.host_gaps(path, min_ms=2.5)  # the threshold drops the short ones
    bad = tmp_path / "cut.json"
    bad.write_text(json.dumps({"traceEvents": events})[:200])  # a truncated trace: one line, the fix
    with pytest.raises(bench.BenchError, match="not a torch profiler trace.*fix"):
        bench.host_gaps(bad)
    for wrong in ([1, 2], {"ph": "X"}, 5):  # events that are not event objects: the same one line, for both readers
        bad.write_text(json.dumps({"traceEvents": wrong}))
        for reader in (bench.host_gaps, bench.trace_summary):
            with pytest.raises(bench.BenchError, match="not a torch profiler trace.*fix"):
                reader(bad)


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "GEMM"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN", "GEMM"),
    ("pytorch_flash::flash_bwd_kernel<Flash_bwd_kernel_traits<128, 64>>", "attention"),
    ("void at::native::(anonymous namespace)::fused_adam_kernel", "optimizer"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise / other"),
])
def test_kernel_kinds(name, kind):
    assert bench.kernel_kind(name) == kind


def test_expert_pairs_differ_only_by_the_grouped_gemm_lever():
    cfg = bench.load_config()
    for pair, a, b in bench.expert_runs(cfg):
        assert (a.target, a.spec, a.iters) == (b.target, b.spec, b.iters)
        assert levers.GROUPED_GEMM not in a.fast
        assert b.fast == a.fast + (levers.GROUPED_GEMM,)
        assert b.experiment().num_experts  # a MoE row


# ---- levers tried against the default (benchreport.trials_section) ----------------------------------------

def test_a_trial_pays_only_when_every_run_with_the_lever_beats_every_run_without():
    v = benchreport._trial_verdict
    assert v([400, 401], [410, 412]) == "pays"
    assert v([420, 430], [410, 412]) == "slower"
    assert v([405, 413, 409], [400, 402, 408, 417]).startswith("within noise")  # 111's runs: overlapping
    assert v([82], [86, 92, 93]).startswith("no verdict")  # a ratio of 0.89 from one run is no finding


def test_wgrad_shapes_follow_the_targets_model():
    tokens, shapes = bench.wgrad_shapes("111-gpt2xl-dp1-fit-80GB")
    assert tokens == 15 * 1024
    assert shapes[0] == ("qkv", 3 * 1600, 1600, 48) and shapes[-1] == ("output", 50304, 1600, 1)
    tokens, shapes = bench.wgrad_shapes("600-llama1b-1gpu-gbs8")  # grouped-query attention, SwiGLU
    m = catalog.get("600-llama1b-1gpu-gbs8").model_cfg
    h, g, heads, ffn = m["hidden_size"], m["num_query_groups"], m["num_attention_heads"], m["ffn_hidden_size"]
    assert dict((n, (o, i)) for n, o, i, _ in shapes) == {
        "qkv": (h + 2 * h * g // heads, h), "proj": (h, h), "fc1": (2 * ffn, h), "fc2": (h, ffn), "output": (50304, h)}


CP_COMPUTE = """
import json, torch.distributed as dist
from megalab.harness import bench
from megalab.runtime import cp_attention
calls = []
block = cp_attention.block_forward
cp_attention.block_forward = lambda *a: calls.append(1) or block(*a)
rows = bench.cp_compute("302", cps=(1, 2, 4, 7), reps=1, device="cpu", shapes=(1, 2, 32, 8))
cp_attention.block_forward = block
print(json.dumps({"rows": rows, "calls": len(calls), "restored": cp_attention.dist is dist
                  and cp_attention._sendrecv.__name__ == "_sendrecv"}))
"""


def test_cp_compute_runs_cp_ring_blocks_per_rank_without_a_process_group():
    """The CP microbenchmark on CPU (tiny shapes): one rank of a CP group runs CP block calls forward and
    backward, with the transfers as local copies; the module's dist and _sendrecv are put back after. In a
    process of its own: torch's CPU thread pool, once started here, would deadlock the forked gloo ranks of
    test_cp_attention."""
    assert bench.cp_shapes("302-cp2-gpt2-1.2B-gbs8-len4096") == (8, 16, 4096, 96, 2)
    done = subprocess.run([sys.executable, "-c", CP_COMPUTE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    rows = got["rows"]
    assert [r["cp"] for r in rows] == [1, 2, 4]  # 32 tokens do not split into 2 x 7 chunks
    assert rows[1]["tokens_per_rank"] == 16 and all(r["ring_fwd_bwd_ms"] > 0 for r in rows)
    assert rows[0]["max_abs_diff_vs_flash"] < 1e-5  # CP=1: the ring is plain causal attention
    assert got["calls"] == 6 * (1 + 2 + 4) + 1  # CP blocks in each of 6 forward passes, one more against SDPA at CP=1
    assert got["restored"]


def test_the_committed_fused_wgrad_trial_reads_only_one_machines_runs():
    """111's trial row: three runs with the lever, six without, all on the one machine and code of the trial;
    the verdict the page gives is the one the rule gives for those runs."""
    from megalab.core import benchruns

    rows = [ln for ln in benchreport.trials_section(benchruns.load_config(), benchruns.BENCH_DIR)
            if ln.startswith("| `fused_wgrad` | 111-") and "| foreach_norm,foreach_scale,fused_adam |" in ln]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "foreach_norm,foreach_scale,fused_adam"  # the default when it was tried
    assert cells[3].startswith("1x H100 80GB GPU-09f9c24c, ")  # the one machine, named
    assert "(6 runs, " in cells[4] and "(3 runs, " in cells[5]
    assert cells[-1].startswith("within noise") and cells[-2] == "PASS"


def test_the_committed_loss_and_bias_trial_pays_on_one_machine():
    """bf16_ce + addmm_bias against the fast path they joined: on 111 every run with them beat every run
    without (one machine, one code); 241's one run without them is no verdict."""
    from megalab.core import benchruns

    lines = benchreport.trials_section(benchruns.load_config(), benchruns.BENCH_DIR)
    cells = {ln.split("|")[2].strip(): [c.strip() for c in ln.strip("|").split("|")]
             for ln in lines if ln.startswith("| `bf16_ce` + `addmm_bias` |")}
    assert cells["111-gpt2xl-dp1-fit-80GB"][-1] == "pays" and cells["111-gpt2xl-dp1-fit-80GB"][-2] == "PASS"
    assert cells["241-strong-scale-gpt2-1.2B-tp1-gbs20"][-1].startswith("no verdict")
