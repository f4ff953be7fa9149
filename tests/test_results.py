"""Every committed measurement is traceable: its raw log and memory CSV sit beside the record,
and re-parsing them gives the record's numbers back."""
import json
from pathlib import Path

import pytest

from megalab.results import logparse, tables
from megalab.harness import record

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "results").glob("**/runs/*/run.json"))


def test_there_are_committed_records():
    assert RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.name)
def test_record_matches_its_raw_log_and_memory_csv(path):
    rec = json.loads(path.read_text())
    log, mem = path.parent / rec["files"]["log"], path.parent / rec["files"]["memory"]
    assert log.exists() and mem.exists()
    f = logparse.summary_fields(logparse.parse_file(log), warmup=rec["warmup_iters"] or 3)
    assert f["status"] == rec["status"]
    for key in ("step_ms_median", "step_ms_p10", "step_ms_p90", "tflops_per_gpu", "loss_first", "loss_last",
                "params_total"):
        assert f[key] == rec[key], key
    assert record.memory_peaks_from_csv(mem, rec["num_gpus"]) == rec["mem_peak_mib"]
    assert rec["num_gpus"] == len(rec["mem_peak_mib"])


def test_committed_tables_are_up_to_date():
    assert tables.write_tables(ROOT, check=True) == [], "run `make tables` and commit the result"


def test_committed_checks_page_is_up_to_date():
    from megalab.harness import catalog
    from megalab.results import checks

    recs = tables.load_records(ROOT / "results" / "runs")
    text = checks.render(checks.evaluate_all(checks.load_claims(), recs, catalog.catalog()))
    assert (ROOT / "results" / "checks.md").read_text(encoding="utf-8") == text, "run `make check` and commit"


def test_committed_estimate_validation_is_up_to_date():
    from megalab.results import estimate

    text = estimate.validation_table(ROOT)
    assert (ROOT / "results" / "estimate-vs-measured.md").read_text(encoding="utf-8") == text, \
        "run `python -m megalab plan --validate` and commit"
