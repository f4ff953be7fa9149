"""Tests for megalab.core.logparse.

Fixtures in tests/fixtures/logs/ are small logs written from Megatron-Core 0.19.2's
format strings (training_log, report_memory, report_theoretical_memory, print_datetime,
_print_args) plus older formats. To add a (trimmed) real log, drop it into that folder
and add one row to CASES below.
"""

import gzip
import json
import math
import random
from pathlib import Path

import pytest

from megalab.__main__ import main
from megalab.core.logparse import (
    IterationLine,
    LogReadError,
    LogSummary,
    iterations,
    megatron_mem,
    parse_file,
    parse_log,
    step_stats,
    summary_fields,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"
ROOT = Path(__file__).resolve().parent.parent


def cli(argv: list[str]) -> int:
    """`python -m megalab parse ARGV...`."""
    return main(["parse", *argv])

# fixture -> expected. Keys: status, iters (entries), train_iters, finished, truncated,
# oom_rank, error (substring), loss_last, step_median (approx), params_total.
CASES = {
    "ok_1gpu_v019.txt": dict(status="ok", iters=8, train_iters=8, finished=True, truncated=False,
                             step_median=388.4, params_total=124439808, loss_last=8.61),
    "old_timestamps_nothroughput.txt": dict(status="ok", iters=5, train_iters=5, finished=True,
                                            params_total=354871296, step_median=301.8),
    "legacy_no_timestamp.txt": dict(status="ok", iters=3, train_iters=3, finished=False),
    "moe_v019.txt": dict(status="ok", iters=3, train_iters=3, finished=True),
    "interleaved_2rank_tp2.txt": dict(status="ok", iters=6, train_iters=6, finished=True,
                                      params_total=62219904, step_median=250.0),
    "pp2_last_stage_loss.txt": dict(status="ok", iters=4, train_iters=4, finished=True,
                                    params_total=124439808, loss_last=9.8),
    "oom_rank1.txt": dict(status="oom", iters=1, train_iters=10, finished=False, oom_rank=1,
                          error="OutOfMemoryError"),
    "traceback_failed.txt": dict(status="failed", iters=0, train_iters=10, error="AssertionError: num_layers"),
    "truncated_midline.txt": dict(status="incomplete", iters=5, train_iters=10, truncated=True),
    "garbage.bin": dict(status="empty", iters=0, train_iters=None),
    "random_text.txt": dict(status="empty", iters=0, train_iters=None),
    "empty.txt": dict(status="empty", iters=0, train_iters=None),
    # Real logs from the GPU rig (results/runs, results/bench), trimmed to the lines the parser
    # reads; the expected numbers are those of the committed run.json of the same run.
    "real_h100_101_ok.txt": dict(status="ok", iters=30, train_iters=30, finished=True, truncated=False,
                                 step_median=335.0, params_total=1557686400, loss_last=9.767867),
    "real_2xh200_122_dp2_zero2.txt": dict(status="ok", iters=25, train_iters=25, finished=True,
                                          step_median=445.35, params_total=1557686400, loss_last=9.451899),
    "real_8xh200_128_dp8.txt": dict(status="ok", iters=20, train_iters=20, finished=True,
                                    step_median=468.5, params_total=1557686400, loss_last=10.86968),
    "real_h100_111_localspec_oom.txt": dict(status="oom", iters=0, train_iters=20, finished=False, oom_rank=0,
                                            error="OutOfMemoryError: CUDA out of memory"),
    "real_h100_101_truncated.txt": dict(status="incomplete", iters=15, train_iters=30, truncated=True,
                                        finished=False),
}


def test_every_fixture_has_a_case():
    on_disk = {p.name for p in LOGS.iterdir() if p.is_file()}
    assert on_disk == set(CASES), "add a CASES row for each fixture log"


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_table(name):
    exp = CASES[name]
    s = parse_file(LOGS / name)
    f = summary_fields(s)
    assert s.status == exp["status"]
    assert len(s.iterations) == exp["iters"]
    assert s.train_iters == exp["train_iters"]
    # one entry per iteration number, sorted
    nums = [it.iteration for it in s.iterations]
    assert nums == sorted(set(nums))
    for key in ("finished", "truncated", "oom_rank"):
        if key in exp:
            assert getattr(s, key) == exp[key], key
    if "error" in exp:
        assert exp["error"] in (s.error or "")
    if "loss_last" in exp:
        assert f["loss_last"] == pytest.approx(exp["loss_last"])
    if "step_median" in exp:
        assert f["step_ms_median"] == pytest.approx(exp["step_median"])
    if "params_total" in exp:
        assert f["params_total"] == exp["params_total"]
    json.dumps(f)  # records must serialise


# ------------------------------------------------------------------ specific fixtures

def test_ok_run_fields_v019():
    s = parse_file(LOGS / "ok_1gpu_v019.txt")
    first = s.iterations[0]
    assert first == IterationLine(
        iteration=1, train_iters=8, elapsed_ms=4123.5, tflops_per_gpu=12.3, lm_loss=10.83215,
        lr=1e-4, grad_norm=3.0, skipped=0, nan=0, extra=first.extra)
    assert first.extra["timestamp"] == "2025-09-30 12:00:10.512345"
    assert first.extra["global_batch_size"] == 8.0
    assert first.extra["consumed_samples"] == 8.0
    assert first.extra["loss_scale"] == 1.0
    assert s.args["train_iters"] == "8"
    assert s.args["global_batch_size"] == "8"
    assert s.args["micro_batch_size"] == "1"
    assert s.args["world_size"] == "1"
    assert s.args["data_path"] == "['/data/x_text_document']"
    assert s.args["iteration"] == "0"  # an argument named 'iteration' is not an iteration line
    assert not any("forward" in k or "optimizer" in k for k in s.args)  # timer lines are not args
    assert s.megalab == {"transformer_impl": "local", "spec": "megalab.spec.megalab_layer_spec",
                         "transformer_engine": "absent"}
    assert s.params == {(0, 0): 124439808}
    assert s.theoretical_mem_mb == {"weight_and_optimizer": 2136.25, "activation": 1450.12,
                                    "total": 3586.37}
    # the later report (after 2 iterations, with optimizer state) wins
    assert s.megatron_mem == {0: {"allocated_mb": 2200.51, "max_allocated_mb": 4290.02,
                                  "reserved_mb": 4096.0, "max_reserved_mb": 5120.0}}
    assert s.finished and not s.oom and s.error is None and not s.truncated

    f = summary_fields(s)
    # iterations 4..8 -> 388.1 389.0 387.5 388.9 388.4 (sorted 387.5 388.1 388.4 388.9 389.0)
    assert f["warmup_iters"] == 3 and f["step_count"] == 5
    assert f["step_ms_p10"] == pytest.approx(387.74)
    assert f["step_ms_p90"] == pytest.approx(388.96)
    assert (f["step_ms_min"], f["step_ms_max"]) == (387.5, 389.0)
    assert f["tflops_per_gpu"] == pytest.approx(130.5)
    assert f["loss_first"] == pytest.approx(10.83215)
    assert f["megatron_mem"]["max_reserved_mb"] == 5120.0
    assert f["theoretical_mem_mb"]["total"] == 3586.37
    assert f["missing"] == []


def test_old_format_without_throughput():
    s = parse_file(LOGS / "old_timestamps_nothroughput.txt")
    assert all(it.tflops_per_gpu is None for it in s.iterations)
    assert s.iterations[0].extra["timestamp"] == "2024-03-01 09:15:00"
    assert summary_fields(s)["tflops_per_gpu"] is None
    assert any("throughput" in m for m in s.missing)


def test_legacy_no_timestamp():
    s = parse_file(LOGS / "legacy_no_timestamp.txt")
    assert [it.lm_loss for it in s.iterations] == [10.99, 10.71, 10.42]
    assert s.iterations[0].skipped == 1 and s.iterations[0].grad_norm is None
    assert "timestamp" not in s.iterations[0].extra
    assert s.status == "ok"  # reached train_iters, though no end marker


def test_moe_extra_field():
    s = parse_file(LOGS / "moe_v019.txt")
    assert [it.extra["load_balancing_loss"] for it in s.iterations] == [1.05, 1.04, 1.03]
    assert s.iterations[2].lm_loss == pytest.approx(9.9)


def test_interleaved_ranks_with_torchrun_prefixes():
    s = parse_file(LOGS / "interleaved_2rank_tp2.txt")
    assert s.args["tensor_model_parallel_size"] == "2"
    assert s.args["world_size"] == "2"
    assert s.params == {(0, 0): 62219904, (1, 0): 62219904}
    assert set(s.megatron_mem) == {0, 1}
    assert s.megatron_mem[1]["max_allocated_mb"] == 2400.5
    f = summary_fields(s)
    assert f["megatron_mem"] == s.megatron_mem[0]
    assert set(f["megatron_mem_by_rank"]) == {0, 1}
    assert f["params_total"] == 62219904  # tp rank 0 only


def test_pipeline_parallel_one_entry_per_iteration():
    s = parse_file(LOGS / "pp2_last_stage_loss.txt")
    assert [it.iteration for it in s.iterations] == [1, 2, 3, 4]
    # the last stage's line (with loss) wins regardless of print order
    assert [it.lm_loss for it in s.iterations] == [10.7, 10.3, 10.0, 9.8]
    assert [it.elapsed_ms for it in s.iterations] == [1800.0, 500.0, 480.0, 470.0]
    assert s.params == {(0, 0): 70000000, (0, 1): 54439808}


def test_oom_rank1():
    s = parse_file(LOGS / "oom_rank1.txt")
    assert s.oom and s.oom_rank == 1
    assert s.oom_message.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB")
    assert not s.finished and not s.truncated
    assert summary_fields(s)["oom_rank"] == 1


def test_traceback_failure():
    s = parse_file(LOGS / "traceback_failed.txt")
    assert s.error == "AssertionError: num_layers (7) must be divisible by pipeline_model_parallel_size (2)"
    assert not s.oom and s.oom_rank is None
    assert "no iteration lines" in s.missing


def test_truncated_mid_line():
    s = parse_file(LOGS / "truncated_midline.txt")
    last = s.iterations[-1]
    # the cut field ("elapsed ... (ms): 39") must not be read as 39 ms
    assert last.iteration == 5 and last.elapsed_ms is None
    assert any("cut mid-line" in m for m in s.missing)


@pytest.mark.parametrize("name", ["garbage.bin", "random_text.txt", "empty.txt"])
def test_garbage(name):
    s = parse_file(LOGS / name)
    assert s.status == "empty"
    assert s.missing
    f = summary_fields(s)
    assert f["step_count"] == 0 and f["step_ms_median"] is None and f["loss_first"] is None


# ------------------------------------------------------------------ inline variants

IT = (" [2025-09-30 12:00:00.000001] iteration {i:8d}/{n:8d} | consumed samples: {c:12d} |"
      " elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 |"
      " global batch size:     8 | lm loss: 1.000000E+01 | loss scale: 1.0 |"
      " number of skipped iterations:   0 | number of nan iterations:   0 |")


def it_line(i, n=10, ms=100.0):
    return IT.format(i=i, n=n, c=8 * i, ms=ms)


@pytest.mark.parametrize("msg", [
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)",
    "RuntimeError: CUDA error: out of memory",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79 GiB",
])
def test_oom_variants(msg):
    s = parse_log("training ...\nTraceback (most recent call last):\n  File \"x.py\", line 1\n" + msg + "\n")
    assert s.oom and s.status == "oom"
    assert s.oom_message == msg
    assert s.error == msg


def test_oom_rank_from_torchrun_root_cause():
    text = ("Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Failures:\n  rank      : 0 (local_rank: 0)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 3 (local_rank: 3)\n"
            "  exitcode  : 1 (pid: 9)\n")
    s = parse_log(text)
    assert s.oom_rank == 3 and s.status == "oom"


def test_child_failed_without_python_traceback():
    text = ("training ...\n" + it_line(1) + "\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Root Cause (first observed failure):\n  rank      : 2 (local_rank: 2)\n"
            "  exitcode  : -9 (pid: 9)\n")
    s = parse_log(text)
    assert s.status == "failed"
    assert s.error == "ChildFailedError: rank 2, exitcode -9"


def test_traceback_beats_end_marker():
    text = it_line(10, n=10) + "\n[after training is done] datetime: 2025-09-30 12:00:00.1 \n" \
        "Traceback (most recent call last):\n  File \"a.py\"\nValueError: boom\n"
    s = parse_log(text)
    assert s.finished and s.status == "failed" and s.error == "ValueError: boom"


def test_first_root_cause_reported_across_ranks():
    text = ("[rank1]: Traceback (most recent call last):\n[rank0]: Traceback (most recent call last):\n"
            "[rank1]:   File \"a.py\", line 3\n[rank1]: ValueError: root cause\n"
            "[rank0]:   File \"b.py\", line 4\n[rank0]: torch.distributed.DistBackendError: NCCL aborted\n")
    s = parse_log(text)
    assert s.error == "ValueError: root cause"


def test_global_rank_prefix_preferred_over_local():
    s = parse_log("[default0]:[rank8]: torch.OutOfMemoryError: CUDA out of memory.\n")
    assert s.oom_rank == 8


def test_chained_exception_lines_skipped():
    text = ("Traceback (most recent call last):\n  File \"a.py\"\nKeyError: 'x'\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"b.py\"\nRuntimeError: wrapped\n")
    assert parse_log(text).error == "KeyError: 'x'"


def test_duplicate_iteration_lines_kept_once():
    text = "\n".join([it_line(1), it_line(1), it_line(2), "[rank1]:" + it_line(2)]) + "\n"
    s = parse_log(text)
    assert [it.iteration for it in s.iterations] == [1, 2]


def test_two_ranks_glued_on_one_line():
    text = it_line(3, ms=300.0) + it_line(4, ms=400.0) + "\n"
    s = parse_log(text)
    assert [(it.iteration, it.elapsed_ms) for it in s.iterations] == [(3, 300.0), (4, 400.0)]


def test_first_stage_only_lines_have_no_loss():
    line = it_line(1).replace(" lm loss: 1.000000E+01 |", "")
    s = parse_log(line + "\n")
    assert s.iterations[0].lm_loss is None and s.iterations[0].elapsed_ms == 100.0
    assert "no lm loss values" in s.missing


def test_train_iters_from_iteration_lines_and_reached():
    s = parse_log("\n".join(it_line(i, n=3) for i in (1, 2, 3)) + "\n")
    assert s.train_iters == 3 and s.status == "ok" and not s.finished
    assert "no arguments dump" in s.missing


def test_exit_interval_counts_as_finished():
    s = parse_log(it_line(5) + "\n[exiting program at iteration 5] datetime: 2025-09-30 12:00:00.000001 \n")
    assert s.finished and s.status == "ok"


def test_incomplete_without_cut():
    s = parse_log(it_line(1) + "\n" + it_line(2) + "\n")
    assert s.status == "incomplete" and s.truncated


def test_sigterm_exit_is_not_finished():
    s = parse_log(it_line(2) + "\n[exiting program after receiving SIGTERM.] datetime: 2025-09-30 12:00:00.1 \n")
    assert not s.finished and s.status == "incomplete"


def test_warmup_by_iteration_number_with_log_interval():
    # --log-interval 10: iteration 1 is logged alone, then 10, 20, 30
    s = parse_log("\n".join(it_line(i, n=30, ms=ms) for i, ms in
                            [(1, 5000.0), (10, 110.0), (20, 100.0), (30, 90.0)]) + "\n")
    f = summary_fields(s)
    assert f["warmup_iters"] == 1 and f["step_count"] == 3 and f["step_ms_median"] == 100.0


def test_warmup_fallback_when_few_iterations():
    s = parse_log(it_line(1, ms=500.0) + "\n" + it_line(2, ms=100.0) + "\n")
    f = summary_fields(s)
    assert f["warmup_iters"] == 0 and f["step_count"] == 2 and f["step_ms_median"] == 300.0


def test_params_variants():
    text = (" > number of parameters on (tensor, pipeline) model parallel rank (0 ,1): 1.5B\n"
            " > number of parameters on (tensor, gtp_remat, pipeline) model parallel rank (1, 0, 0): 7\n")
    s = parse_log(text)
    assert s.params == {(0, 1): 1_500_000_000, (1, 0): 7}


def test_theoretical_weights_only_older_format():
    s = parse_log("Theoretical memory footprints: weight and optimizer=26699.47 MB\n")
    assert s.theoretical_mem_mb == {"weight_and_optimizer": 26699.47}


def test_nan_loss_json_safe(capsys, tmp_path):
    line = it_line(1, n=1).replace("lm loss: 1.000000E+01", "lm loss: nan")
    p = tmp_path / "logs.txt"
    p.write_text(line + "\n")
    assert math.isnan(parse_file(p).iterations[0].lm_loss)
    assert cli([str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loss_last"] is None


def test_never_raises_on_noise():
    rnd = random.Random(7)
    pieces = ["iteration", " 3/ 10 |", "lm loss:", " | ", "[rank", "1]:", "Traceback (most recent call last):",
              "memory (MB) | allocated:", "number of parameters on (", "): ", "Theoretical memory footprints:",
              "=", " MB", "megalab:", "\n", "\x00", "\ufffd", " datetime: ", "CUDA out of memory", "...."]
    for _ in range(300):
        text = "".join(rnd.choice(pieces) + str(rnd.randint(-5, 99)) for _ in range(rnd.randint(0, 40)))
        s = parse_log(text)
        assert isinstance(s, LogSummary)
        assert not any(m.startswith("parser error") for m in s.missing), s.missing
        json.dumps(summary_fields(s))


def test_the_memory_reports_and_iterations_alone_read_as_the_whole_parse_reads_them():
    """logparse.megatron_mem and logparse.iterations (the estimator's validation and the bench's loss parity read
    only those) are parse_log's: on every fixture and committed log, cut anywhere, and on noise of the lines that
    decide them (an arguments dump around a report, a report glued to an iteration line)."""
    rnd = random.Random(11)
    texts = [p.read_bytes() for p in sorted(LOGS.iterdir())]
    texts += [gzip.decompress(p.read_bytes()) for p in sorted((ROOT / "results").glob("runs/*/logs.txt.gz"))[::25]]
    pieces = ["[Rank 0] (after 2 iterations) memory (MB) | allocated: ", " | max reserved: ", "[Rank 1] memory (MB) |",
              "---------- arguments ----------", "-------- end of arguments --------", "  ", "x .... ", "\n",
              " iteration 3/ 10 |", "[default1]:", "[rank1]: ", "9" * 5000]
    texts += ["".join(rnd.choice(pieces) + str(rnd.randint(-5, 99)) for _ in range(rnd.randint(0, 40)))
              for _ in range(300)]
    # inside the arguments dump a report's line indented under a name is an argument, after it a report
    dump = ("---------- arguments ----------\n  seed  [Rank 3] memory (MB) | allocated: 5\n"
            "-------- end of arguments --------\n  seed  [Rank 2] memory (MB) | allocated: 7\n")
    assert parse_log(dump).megatron_mem == {2: {"allocated_mb": 7.0}}
    texts.append(dump)
    for text in texts:
        for cut in (len(text), *(rnd.randrange(len(text) + 1) for _ in range(3))):
            whole = parse_log(text[:cut])
            assert megatron_mem(text[:cut]) == whole.megatron_mem and iterations(text[:cut]) == whole.iterations


@pytest.mark.parametrize("value", [None, b"\xff\xfe iteration 1/ 2 |", 12])
def test_non_str_input(value):
    assert isinstance(parse_log(value), LogSummary)


# ------------------------------------------------------------------ step_stats

def test_step_stats_numpy_linear():
    st = step_stats([float(v) for v in range(1, 11)], warmup=0)
    assert st == {"median": 5.5, "p10": pytest.approx(1.9), "p90": pytest.approx(9.1),
                  "min": 1.0, "max": 10.0, "count": 10, "warmup": 0}


def test_step_stats_drops_warmup():
    st = step_stats([1000.0, 500.0, 300.0, 10.0, 20.0, 30.0])
    assert st["warmup"] == 3 and st["count"] == 3 and st["median"] == 20.0


def test_step_stats_too_few_values():
    st = step_stats([5.0, 7.0], warmup=3)
    assert st["warmup"] == 0 and st["count"] == 2 and st["median"] == 6.0


def test_step_stats_empty():
    assert step_stats([]) == {"median": None, "p10": None, "p90": None, "min": None, "max": None,
                              "count": 0, "warmup": 0}


# ------------------------------------------------------------------ parse_file / cli

SUMMARY_KEYS = {
    "status", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_min", "step_ms_max",
    "step_count", "warmup_iters", "tflops_per_gpu", "loss_first", "loss_last", "iters_logged",
    "train_iters", "megatron_mem", "megatron_mem_by_rank", "theoretical_mem_mb", "params_total",
    "oom_rank", "error", "missing", "timers_ms", "breakdown_ms",
}


def test_summary_fields_keys():
    assert set(summary_fields(parse_log(""))) == SUMMARY_KEYS


@pytest.mark.parametrize("path", ["does/not/exist.txt", str(LOGS)])
def test_parse_file_unreadable(path):
    with pytest.raises(LogReadError) as ei:
        parse_file(path)
    assert "\n" not in str(ei.value)


def test_cli_json(capsys):
    assert cli([str(LOGS / "ok_1gpu_v019.txt"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == SUMMARY_KEYS
    assert out["status"] == "ok" and out["step_count"] == 5
    assert out["megatron_mem_by_rank"]["0"]["max_reserved_mb"] == 5120.0


def test_cli_human(capsys):
    assert cli([str(LOGS / "oom_rank1.txt")]) == 0
    out = capsys.readouterr().out
    assert "status=oom" in out and "OOM on rank 1" in out
    assert 1 < len(out.splitlines()) <= 8


@pytest.mark.parametrize("name", ["empty.txt", "traceback_failed.txt", "garbage.bin"])
def test_cli_no_iterations_returns_1(capsys, name):
    assert cli([str(LOGS / name), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["iters_logged"] == 0


@pytest.mark.parametrize("path", ["nope/logs.txt", str(LOGS)])
def test_cli_unreadable(capsys, path):
    assert cli([path]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"megalab parse: cannot read {path}: ") and "(fix: " in lines[0]


def test_cli_usage(capsys):
    for argv in ([], ["a.txt", "b.txt"]):
        assert cli(argv) == 2
        assert capsys.readouterr().err.startswith("usage: python -m megalab parse [-h] [--json] LOG")


# --------------------------------------------------------------------------- fuzz: `parse` never tracebacks

def _mutations(rnd: random.Random, data: bytes):
    """One damaged copy of a real log per kind of damage a log file meets."""
    lines = data.splitlines(keepends=True) or [b""]
    k = rnd.randrange(len(data) + 1)
    yield data[:k]  # truncated at a random byte
    spliced = lines[:]
    a, b = rnd.randrange(len(lines)), rnd.randrange(len(lines))
    spliced[a] = spliced[a].rstrip(b"\n") + spliced[b][rnd.randrange(len(spliced[b]) + 1):]
    yield b"".join(spliced)  # two ranks' lines glued mid-line
    flipped = bytearray(data)
    for _ in range(rnd.randint(1, 20)):
        if flipped:
            flipped[rnd.randrange(len(flipped))] ^= 1 << rnd.randrange(8)
    yield bytes(flipped)  # flipped bits
    yield data[:k] + bytes(rnd.choice([b"\xff\xfe", b"\xc3", b"\x80\x80", b"\xed\xa0\x80"])) + data[k:]  # not UTF-8
    shuffled = lines + rnd.sample(lines, min(len(lines), 5))
    rnd.shuffle(shuffled)
    yield b"".join(shuffled)  # duplicated and out of order
    yield data[:k] + b"iteration 1/ 2 | " + b"9" * rnd.choice([5000, 200_000]) + b" |\n" + data[k:]  # a huge line


def test_parse_cli_never_tracebacks_on_damaged_logs(tmp_path, capsys):
    rnd = random.Random(19)
    sources = [p.read_bytes() for p in sorted(LOGS.iterdir()) if p.is_file()]
    path = tmp_path / "logs.txt"
    cases = 0
    for _ in range(6):
        for data in sources:
            for damaged in _mutations(rnd, data):
                path.write_bytes(damaged)
                for argv in ([str(path)], [str(path), "--json"]):
                    rc = cli(argv)
                    out = capsys.readouterr()
                    assert rc in (0, 1), (rc, out.err[-300:])
                    assert "Traceback" not in out.err
                    if argv[-1] == "--json":
                        json.loads(out.out)
                cases += 1
    assert cases >= 500


@pytest.mark.parametrize("content", [b"", b"\x00" * 4096, bytes(range(256)) * 64, b"\xff" * 10])
def test_parse_cli_binary_and_empty(tmp_path, capsys, content):
    path = tmp_path / "x.log"
    path.write_bytes(content)
    assert cli([str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "empty"


@pytest.mark.parametrize("name", ["missing.txt", ".", "bad\x00name"])
def test_parse_cli_unreadable_is_one_line(tmp_path, capsys, name):
    assert cli([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "Traceback" not in err


def test_committed_logs_are_gzipped_and_read_the_same(tmp_path):
    """make tables gzips the raw logs of committed runs; every reader takes the .gz where the plain file
    is gone, and the bytes (and the parse) are the same; gzipping twice writes the same bytes."""
    import gzip

    from megalab.core import logparse

    run = tmp_path / "results" / "runs" / "20260101_000000___101-x"
    run.mkdir(parents=True)
    raw = (LOGS / "ok_1gpu_v019.txt").read_bytes()
    (run / "logs.txt").write_bytes(raw)
    before = logparse.parse_file(run / "logs.txt")
    assert logparse.compress_logs(tmp_path / "results") == [run / "logs.txt.gz"]
    assert not (run / "logs.txt").exists() and gzip.decompress((run / "logs.txt.gz").read_bytes()) == raw
    assert logparse.log_file(run / "logs.txt") == run / "logs.txt.gz"
    assert logparse.read_log(run / "logs.txt") == raw
    assert logparse.parse_file(run / "logs.txt") == before
    first = (run / "logs.txt.gz").read_bytes()
    (run / "logs.txt").write_bytes(raw)  # a run copied in again
    logparse.compress_logs(tmp_path / "results")
    assert (run / "logs.txt.gz").read_bytes() == first and logparse.compress_logs(tmp_path / "results") == []


def test_tensorboard_events_are_gzipped_but_not_a_leftover_temporary(tmp_path):
    """compress_logs takes a run's TensorBoard event files too; the .gz.tmp an interrupted earlier call
    left beside one is not an event file to pack."""
    from megalab.core import logparse

    tb = tmp_path / "results" / "runs" / "20260101_000000___101-x" / "tensorboard"
    tb.mkdir(parents=True)
    (tb / "events.out.tfevents.1.vm.7.0").write_bytes(b"events")
    (tb / "events.out.tfevents.1.vm.7.0.gz.tmp").write_bytes(b"partial")
    assert logparse.compress_logs(tmp_path / "results") == [tb / "events.out.tfevents.1.vm.7.0.gz"]
    assert logparse.plain_logs(tmp_path / "results") == []


def test_a_damaged_gzipped_log_is_a_read_error_not_a_crash(tmp_path):
    from megalab.core import logparse

    good = __import__("gzip").compress((LOGS / "ok_1gpu_v019.txt").read_bytes())
    for name, data in (("truncated", good[: len(good) // 2]), ("garbage", b"\x1f\x8b" + b"x" * 50)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "logs.txt.gz").write_bytes(data)
        with pytest.raises(OSError, match="damaged gzip"):
            logparse.read_log(tmp_path / name / "logs.txt")
        with pytest.raises(logparse.LogReadError):
            logparse.parse_file(tmp_path / name / "logs.txt")
