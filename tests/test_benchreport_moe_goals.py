"""Issue 63's MoE goals on the bench page (benchreport._moe_goal_rows): judged from today's committed plain launches,
each verdict able to fail."""
from megalab.results import benchreport


def _rows(monkeypatch, goals=None, ratios=None):
    if goals is not None:
        monkeypatch.setattr(benchreport, "MOE_GOALS", goals)
    if ratios is not None:
        monkeypatch.setattr(benchreport, "MOE_RATIOS", ratios)
    return benchreport._moe_goal_rows()


def test_the_committed_510_and_513_meet_issue_63s_goals(monkeypatch):
    rows = _rows(monkeypatch)
    assert [r[-1] for r in rows] == ["met", "met"], rows
    assert "3 runs" in rows[0][2]


def test_a_tighter_limit_or_ratio_is_missed(monkeypatch):
    t510, t513 = "510-olmoe-1gpu-gbs4", "513-olmoe-1gpu-gbs4-mbs1"
    rows = _rows(monkeypatch, goals=[("g", t510, 100.0, 70.0), ("m", t510, 150.0, 10.0)], ratios=[("r", t513, t510, 1.1)])
    assert [r[-1] for r in rows] == ["missed", "missed", "missed"], rows


def test_a_row_never_run_today_gets_no_verdict(monkeypatch):
    rows = _rows(monkeypatch, goals=[("g", "506-olmoe-4xE-dp8-zero2-ep8", 150.0, 70.0)],
                 ratios=[("r", "506-olmoe-4xE-dp8-zero2-ep8", "510-olmoe-1gpu-gbs4", 2.0)])
    assert [r[-1] for r in rows] == ["-", "-"], rows
