"""megalab/results/launchtime.py: the phases of one launch from its record's times and its log's markers."""
import json

from megalab.results import launchtime
from megalab.core.records import RunRecord

LOG = """\
[before library-setup] datetime: 2026-11-23 12:15:07.000000
[after library-setup] datetime: 2026-11-23 12:15:20.000000
[before megatron-init] datetime: 2026-11-23 12:15:24.000000
[after megatron is initialized] datetime: 2026-11-23 12:15:27.000000
[before the start of training step] datetime: 2026-11-23 12:15:28.000000
 [2026-11-23 12:15:29] iteration        1/       2 | elapsed time per iteration (ms): 900.0 |
 [2026-11-23 12:15:30] iteration        2/       2 | elapsed time per iteration (ms): 90.0 |
[after training is done] datetime: 2026-11-23 12:15:33.000000
"""


def test_phases_add_up_to_the_launch(tmp_path):
    (tmp_path / "logs.txt").write_text(LOG)
    raw = {"schema": 2, "target": "101", "status": "ok", "started": "2026-11-23T12:15:04+00:00",
           "ended": "2026-11-23T12:15:37+00:00", "duration_s": 33.0, "preflight_s": 6.0,
           "files": {"log": "logs.txt"}}
    (tmp_path / "run.json").write_text(json.dumps(raw))
    rec = RunRecord.of(raw, tmp_path)
    p = launchtime.phases(rec)
    assert p == {"preflight": 6.0, "torchrun": 3.0, "imports": 13.0, "Megatron args": 4.0, "Megatron init": 3.0,
                 "model + data": 1.0, "training": 5.0, "exit": 4.0}
    assert sum(v for k, v in p.items() if k != "preflight") == raw["duration_s"]


def test_a_log_without_markers_leaves_the_phases_empty(tmp_path):
    (tmp_path / "logs.txt").write_text("nothing here\n")
    raw = {"schema": 2, "target": "101", "status": "ok", "started": "2026-11-23T12:15:04+00:00",
           "ended": "2026-11-23T12:15:37+00:00", "files": {"log": "logs.txt"}}
    p = launchtime.phases(RunRecord.of(raw, tmp_path))
    assert p["preflight"] is None and all(v is None for k, v in p.items())
