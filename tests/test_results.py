"""Every committed measurement is traceable: its raw log and memory CSV sit beside the record,
and re-parsing them gives the record's numbers back."""
import json
from pathlib import Path

import pytest

from megalab.runtime import memcap
from megalab.core import logparse
from megalab.results import tables
from megalab.harness import record

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "results").glob("**/runs/*/run.json"))


def test_there_are_committed_records():
    assert RECORDS


def offenders(check) -> list[str]:
    """CHECK(path) over every committed record: each record it fails, named, with what is wrong (one test over
    all records rather than one per record: a thousand tests' overhead, the same verdicts)."""
    bad = []
    for path in RECORDS:
        try:
            check(path)
        except Exception as e:  # noqa: BLE001  (any error fails that record, as it failed its own test)
            bad.append(f"{path.parent.relative_to(ROOT)}: {type(e).__name__}: {e}")
    return bad


def test_every_record_matches_its_raw_log_and_memory_csv():
    bad = offenders(_matches_its_raw_log_and_memory_csv)
    assert not bad, f"{len(bad)} of {len(RECORDS)} records:\n" + "\n".join(bad)


def _matches_its_raw_log_and_memory_csv(path):
    rec = json.loads(path.read_text())
    log, mem = logparse.log_file(path.parent / rec["files"]["log"]), path.parent / rec["files"]["memory"]
    assert log.exists() and mem.exists()
    summary = logparse.parse_file(log)  # parsed once: measured() below reads the same log
    f = logparse.summary_fields(summary, warmup=rec["warmup_iters"] or 3)
    # the status is the log's as the launcher corrects it (exit code, interrupt, supervisor, busy GPUs)
    status = record.measured(log, rec["warmup_iters"] or 3, rec.get("returncode"), rec["status"] == "incomplete",
                             rec["mem_peak_mib"], rec.get("peak_tflops"),
                             one_node=(rec.get("config") or {}).get("nnodes", 1) == 1, ended_by=rec.get("ended_by"),
                             end_detail=rec.get("end_detail") or "", busy=bool(rec.get("busy_gpus")),
                             summary=summary)["status"]
    assert status == rec["status"]
    for key in ("step_ms_median", "step_ms_p10", "step_ms_p90", "tflops_per_gpu", "loss_first", "loss_last",
                "params_total"):
        assert f[key] == rec[key], key
    assert record.memory_peaks_from_csv(mem, rec["num_gpus"]) == rec["mem_peak_mib"]
    assert rec["num_gpus"] == len(rec["mem_peak_mib"])


def test_committed_tables_are_up_to_date():
    assert tables.write_tables(ROOT, check=True) == [], "run `make tables` and commit the result"


def test_committed_raw_logs_are_gzipped():
    plain = [p.relative_to(ROOT) for p in logparse.plain_logs(ROOT / "results")]
    assert not plain, f"{len(plain)} raw log(s) not gzipped, e.g. {plain[0]}: run `make tables` and commit"


def test_committed_checks_page_is_up_to_date():
    from megalab.results import checks

    from megalab.results import checkmarks

    results, _, text = checks.page(ROOT)
    assert (ROOT / "results" / "checks.md").read_text(encoding="utf-8") == text, "run `make check` and commit"
    changed, _ = checkmarks.fill_docs(ROOT, {r.claim.id: r for r in results}, check=True)
    assert not changed, f"{changed[0]}: a check verdict is out of date; run `make check` and commit"


# The committed estimate-vs-measured page is up to date: tests/test_estimate.py's
# test_cli_validate_writes_the_table compares what the CLI writes with it, byte for byte.


# --------------------------------------------------------------------------- the typed record reader

from megalab.core import gpus, markdown, records  # noqa: E402


def _cap_as_number(raw: dict) -> dict:
    """RAW with config.gpu_mem_gb as the number the schema reads it as ("80" -> 80.0)."""
    cfg = raw.get("config") or {}
    if isinstance(cfg.get("gpu_mem_gb"), str):
        return {**raw, "config": {**cfg, "gpu_mem_gb": float(cfg["gpu_mem_gb"])}}
    return raw


def test_every_committed_record_reads_typed():
    bad = offenders(_reads_typed)
    assert not bad, f"{len(bad)} of {len(RECORDS)} records:\n" + "\n".join(bad)


def _reads_typed(path):
    rec = records.RunRecord.load(path)
    raw = json.loads(path.read_text())
    assert (rec.target, rec.status, rec.schema, rec.run_dir) == (raw["target"], raw["status"], raw.get("schema", 1),
                                                                  path.parent)
    # nothing lost or changed on the way in: the record dumps back to its file (the cap as a number)
    assert rec.dump() == _cap_as_number(raw) and rec.dump(like=raw) == _cap_as_number(raw)
    assert (rec.intent.model_dump(exclude_unset=True) if rec.intent else None) == raw.get("intent")
    assert rec.measured[0] == (raw["step_ms_median"] if raw["status"] in ("ok", "incomplete") else None)
    # what ran: schema 2 stores the entry point's line (empty where the launch failed before the entry point
    # started: torchrun's EADDRINUSE), schema 1 reads it from the log beside the record
    if raw.get("observed") != {}:
        assert rec.ran is None or rec.ran.transformer_impl == raw["config"]["transformer_impl"]


def test_schema2_record_with_new_statuses_and_notes(tmp_path):
    (tmp_path / "r").mkdir()
    raw = {"schema": 2, "target": "101-x", "status": "hung", "step_ms_median": 300.0, "notes": ["exit_hang"],
           "busy_gpus": [{"pid": 7, "mib": 1000}], "intent": {"tp": 1}, "observed": {"transformer_impl": "local"},
           "mem_peak_gib": [1.0, 2.5], "num_gpus": 2}
    (tmp_path / "r" / "run.json").write_text(json.dumps(raw))
    [rec] = list(records.read_records(tmp_path, None))
    assert (rec.schema, rec.notes, rec.busy_gpus) == (2, ["exit_hang"], [{"pid": 7, "mib": 1000}])
    assert rec.intent.model_extra == {"tp": 1} and rec.observed.transformer_impl == "local"  # unknown keys kept
    assert rec.measured == (None,) * 5  # a hung run never stands as a measurement
    assert (rec.mem_peak_gib, rec.num_gpus, rec.config.model_fields_set) == ([1.0, 2.5], 2, set())
    assert records.load_records(tmp_path)["101-x"].status == "hung"


def test_killed_and_hung_runs_are_never_measured_rows():
    from megalab.results import chapter

    for status in ("killed", "hung", "failed", "oom"):
        assert chapter.measured(records.RunRecord.of({"target": "t", "status": status, "step_ms_median": 5.0}))[0] is None
    assert chapter.measured(records.RunRecord.of({"target": "t", "status": "ok", "step_ms_median": 5.0}))[0] == 5.0


# --------------------------------------------------------------------------- one GPU table, one table helper

@pytest.mark.parametrize("name, short, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 80GB", 989.0), ("NVIDIA H200", "H200", 989.0), ("NVIDIA GH200 480GB", "GH200", 989.0),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB", 312.0), ("NVIDIA A100-PCIE-40GB", "A100 40GB", 312.0),
    ("NVIDIA B200", "B200", 2250.0), ("NVIDIA H800", "H800", 989.0), ("NVIDIA L40S", "L40S", 362.0),
    ("NVIDIA A10", "A10", 125.0)])
def test_gpu_datasheet_lookup(name, short, tflops):
    gpu = gpus.lookup(name)
    assert (gpu.short, gpu.tflops_bf16, gpus.peak_tflops(name)) == (short, tflops, tflops)


def test_gpu_datasheet_unknown_and_memory():
    assert gpus.lookup("Tesla T4") is None and gpus.peak_tflops(None) is None
    assert gpus.lookup("NVIDIA H100 80GB HBM3").memory_gib == pytest.approx(81559 / 1024)
    assert memcap.nominal_gb_to_gib(80) == pytest.approx(81559 / 1024)
    assert gpus.short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB" and gpus.short_gpu_name(None) == "GPU"


def test_padded_table_is_the_pages_pipe_format():
    """The look of the chapter and checks pages, byte for byte: columns padded to one width (at least the
    header plus two), cells stripped and escaped, `:---` / `---:` rules, nothing parsed as a number."""
    header = ["Row", "a long header", "Δ", "x"]
    rows = [["R1", "  1 ", "+0.1%", ""], ["~R22", "1234567890123456", "—", "‡ a | b"], ["", "", "", "007"]]
    assert markdown.table(header, rows, None, padded=True) == [
        "| Row   | a long header    | Δ     | x        |",
        "|:------|:-----------------|:------|:---------|",
        "| R1    | 1                | +0.1% |          |",
        "| ~R22  | 1234567890123456 | —     | ‡ a \\| b |",  # a cell's pipe escaped: it splits no column
        "|       |                  |       | 007      |"]
    assert markdown.table(header, rows, ["left", "right", "right", "left"], padded=True)[:3] == [
        "| Row   |    a long header |     Δ | x        |",
        "|:------|-----------------:|------:|:---------|",
        "| R1    |                1 | +0.1% |          |"]


def test_write_if_changed_writes_only_a_change(tmp_path):
    page = tmp_path / "d" / "p.md"
    assert markdown.write_if_changed(page, "x", check=True) and not page.exists()  # check: would write
    assert markdown.write_if_changed(page, "x") and page.read_text() == "x"
    mtime = page.stat().st_mtime_ns
    assert not markdown.write_if_changed(page, "x") and page.stat().st_mtime_ns == mtime
    assert markdown.write_if_changed(page, "y", check=True) and page.read_text() == "x"


def test_plain_table():
    assert markdown.table(["a", "b"], [[1, None]], [None, "right"]) == ["| a | b |", "| --- | ---: |", "| 1 |  |"]


def test_write_atomic(tmp_path):
    markdown.write_atomic(tmp_path / "d" / "p.md", "x")
    markdown.write_atomic(tmp_path / "d" / "f.svg", b"<svg/>")
    assert (tmp_path / "d" / "p.md").read_text() == "x" and sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f.svg", "p.md"]


def test_committed_integrity_page_is_up_to_date():
    from megalab.results import integrity

    assert integrity.PAGE.read_text() == integrity.render(), "run `python -m megalab integrity` and commit"


def test_graph_parity_finds_a_twin_among_the_integrity_runs_and_lists_each_pair_once():
    """005's graph-off launch was alternated with two graph-on ones on a machine no table row ran on: its
    twin is in results/integrity/runs itself, and the off run (whose newest twin is the second on run)
    does not repeat that pair."""
    from megalab.results import integrity

    rows = [ln for ln in integrity.render().splitlines() if ln.startswith("| 005-") and "PASS" in ln]
    assert len(rows) == 2
    assert len({ln.split("|")[2] for ln in rows}) == 2  # two graph-on runs, one graph-off twin
    assert len({ln.split("|")[3] for ln in rows}) == 1
