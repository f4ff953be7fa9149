"""megalab.results.datareport: results/data/README.md from real-data records and their mock twins.

Synthetic run folders (a fixture log and a run.json) in tmp_path; expected numbers come from the
records and the parsed logs, never typed in. The last test holds the committed page to the records.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from megalab.core import logparse
from megalab.results import datareport, plots
from megalab.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "logs"
DATA = "data/corpus_text_document"


def _run(root: Path, name: str, target: str, *, data: str = DATA, status: str = "ok", log: str = "real_h100_101_ok.txt",
         extra_args: str = "", ms: float = 200.0, **rec) -> Path:
    d = root / datareport.RUNS / name
    d.mkdir(parents=True)
    shutil.copy(LOGS / log, d / "logs.txt")
    iters = len(logparse.parse_file(d / "logs.txt").iterations)
    (d / "run.json").write_text(json.dumps({
        "target": target, "status": status, "started": f"2026-01-01T{name[:2]}:00:00+00:00",
        "step_ms_median": ms if status == "ok" else None, "step_ms_p10": ms * 0.9, "step_ms_p90": ms * 1.2,
        "tflops_per_gpu": 40.0, "mem_peak_gib": [31.4], "iters_logged": iters,
        "error": None if status == "ok" else "AssertionError: no sample to consume: 0",
        "files": {"log": "logs.txt", "memory": "gpu_memory.csv"},
        # ITERS as set (at least 1: a failed log's 0 iterations logged is no setting a launcher writes)
        "config": {"data": data, "extra_args": extra_args, "iters": max(iters, 1), "model_preset": {"vocab_size": 50257}},
        **rec}))
    return d


def _info(root: Path, vocab: int) -> None:
    (root / "data").mkdir(exist_ok=True)
    (root / f"{DATA}.info.json").write_text(json.dumps({"vocab_size": vocab}))


def _row(page: str, target: str) -> list[str]:
    line = next(x for x in page.splitlines() if x.startswith(f"| {target} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_real_beside_its_mock_twin_with_loss_curve(tmp_path):
    _info(tmp_path, 8192)
    _run(tmp_path, "10_real", "101-x", ms=250.0)
    _run(tmp_path, "11_mock", "101-x", data="mock", log="ok_1gpu_v019.txt", extra_args="--vocab-size 8192", ms=200.0)
    _run(tmp_path, "12_mock_gpt2", "101-x", data="mock", log="ok_1gpu_v019.txt", ms=100.0)  # vocab 50257: no twin
    changed = datareport.write_report(tmp_path)
    page = (tmp_path / datareport.PAGE).read_text()
    assert set(changed) == {tmp_path / datareport.PAGE, tmp_path / datareport.FIGURE}
    row = _row(page, "101-x")
    assert row[1] == "8192 / 8192" and row[2].startswith("250 (225–300)") and "11_mock" in row[5]
    assert row[-1] == f"{250 / 200:.2f}x"
    losses = [it.lm_loss for it in logparse.parse_file(LOGS / "real_h100_101_ok.txt").iterations]
    assert f"{len(losses)} iterations, loss {losses[0]:.3f} → {losses[-1]:.3f}" in page
    assert f"]({datareport.FIGURE.name})" in page
    svg = (tmp_path / datareport.FIGURE).read_bytes()
    assert b"<svg" in svg and b"<dc:date>" not in svg
    assert datareport.write_report(tmp_path) == []  # unchanged inputs: nothing rewritten
    assert tmp_path / datareport.FIGURE not in plots.write_plots(tmp_path, check=True)  # not plots' to remove


def test_log_vocabulary_comes_before_info_json(tmp_path):
    _info(tmp_path, 8192)
    d = _run(tmp_path, "10_real", "101-x")
    with open(d / "logs.txt", "a") as f:
        f.write("INFO:megatron.core.tokenizers.utils.build_tokenizer: > padded vocab (size: 4096) with 0 dummy "
                "tokens (new size: 4096)\n")
    assert datareport.vocab(datareport.load(tmp_path / datareport.RUNS)[0], tmp_path) == 4096


def test_unknown_vocabulary_and_a_failed_side(tmp_path):
    _run(tmp_path, "10_real", "101-x")  # no .info.json, no vocab line in the log
    _run(tmp_path, "11_mock", "101-x", data="mock", log="ok_1gpu_v019.txt", extra_args="--vocab-size 8192")
    _run(tmp_path, "12_real", "102-y", status="failed", log="traceback_failed.txt")
    page = datareport.render(tmp_path)
    assert _row(page, "101-x")[1] == "unknown / 8192" and _row(page, "101-x")[-1] == "vocabulary unknown"
    row = _row(page, "102-y")
    assert row[2].startswith("failed: AssertionError: no sample to consume: 0") and row[5] == "not run"
    assert "- [12_real](runs/12_real/run.json): `102-y`" in page


def test_mock_at_another_vocabulary_is_not_a_twin(tmp_path):
    _info(tmp_path, 8192)
    _run(tmp_path, "10_real", "101-x")
    _run(tmp_path, "11_mock", "101-x", data="mock", log="ok_1gpu_v019.txt")  # the preset's 50257
    row = _row(datareport.render(tmp_path), "101-x")
    assert row[1] == "8192 / —" and row[5] == "not run" and row[-1] == ""


def test_resume_check_row(tmp_path):
    _run(tmp_path, "10_resume", "resume-101-x", log="ok_1gpu_v019.txt")
    check = {"stop_at": 4, "saved_last_iteration": 4, "saved_first_loss": 9.1, "saved_last_loss": 7.5,
             "resumed_first_iteration": 5, "resumed_first_loss": 7.4, "loss_jump": 0.1, "ok": True, "why": None}
    _run(tmp_path, "11_resume", "resume-101-x", log="ok_1gpu_v019.txt", resume_check=check)
    page = datareport.render(tmp_path)
    assert "| [resume-101-x](runs/11_resume/run.json) | 4 | 7.5000 (4) | 7.4000 (5) | 0.1 | ok |" in page
    assert "Not run yet: no real-data run has ended ok." in page  # a resume half is no loss curve
    assert "| resume-101-x |" not in page  # and no real-vs-mock row


def test_nothing_run_yet_and_a_stale_figure_goes(tmp_path):
    fig = tmp_path / datareport.FIGURE
    fig.parent.mkdir(parents=True)
    fig.write_text("<svg/>")
    assert main(["data-report", "--root", str(tmp_path), "--check"]) == 1
    assert main(["data-report", "--root", str(tmp_path)]) == 0 and not fig.exists()
    page = (tmp_path / datareport.PAGE).read_text()
    assert page.count("Not run yet") == 3 and "None yet." in page and "do not edit by hand" in page
    assert main(["data-report", "--root", str(tmp_path), "--check"]) == 0


def test_committed_data_page_is_up_to_date():
    assert datareport.write_report(ROOT, check=True) == [], "run `make tables` and commit the result"
