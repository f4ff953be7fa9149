"""results/fast_by_default.py: the fast-by-default table lists every 1-2 GPU target with a published TE time."""
import math

from megalab.core import catalog
from megalab.results import chapter, fast_by_default


def test_every_one_or_two_gpu_target_with_a_reference_time_has_a_row():
    anchor, twogpu = chapter.load_reference(), chapter.load_twogpu_reference()
    want = [e.id for e in catalog.catalog().values()
            if e.gpus <= 2 and (ref := fast_by_default._reference(e, anchor, twogpu)) and not math.isnan(ref[0])]
    got = [r[1] for r in fast_by_default.rows() if not r[0].endswith("(per GPU)")]  # the analogues' rows: the test below
    assert got == want and len(got) >= 20


def test_a_row_is_met_only_at_or_below_the_reference_time_and_memory():
    for r in fast_by_default.rows():
        if r[5] == "not run":
            assert r[-1] == "not run with today's defaults"
            continue
        ratio, gib, ref_gib = float(r[7]), float(r[6]), float(r[3])
        if r[-1].startswith("no verdict"):  # another GPU kind than the reference's
            continue
        assert r[-1].startswith("met") == (ratio <= 1.0 and gib <= ref_gib), r


def test_a_verdict_needs_the_references_gpu_kind():
    from megalab.core.records import RunRecord

    def run(gpu, cap=None):
        return RunRecord.of({"target": "x", "status": "ok", "gpu_name": gpu, "config": {"gpu_mem_gb": cap}})

    t0, r1, r8 = (catalog.get(i) for i in ("001", "101", "122"))  # T0 (2x H200 set), R1 (1 GPU), R8 (2 GPUs)
    h100, h200, h200_80 = "NVIDIA H100 80GB HBM3", "NVIDIA H200", ("NVIDIA H200", "80")
    assert fast_by_default.like_reference(run(h200), t0) and not fast_by_default.like_reference(run(*h200_80), t0)
    assert not fast_by_default.like_reference(run(h100), t0)
    assert fast_by_default.like_reference(run(h100), r1) and not fast_by_default.like_reference(run(*h200_80), r1)
    assert fast_by_default.like_reference(run(*h200_80), r8) and not fast_by_default.like_reference(run(h200), r8)
    assert fast_by_default.like_reference(run(h100), r8)


def test_a_row_shows_the_reference_kind_first_and_gives_no_verdict_on_another(monkeypatch, tmp_path):
    """111 (R3, published on H100s): of today's runs, the H100's are shown even when an H200 run is newer; with
    only an H200 run the row is shown but gets no verdict."""
    from megalab.core import provenance
    from megalab.core.records import RunRecord

    t111 = catalog.get("111").id

    def rec(gpu, ms, started, cap=None):
        return RunRecord.of({"schema": 2, "target": t111, "status": "ok", "step_ms_median": ms, "started": started,
                             "gpu_name": gpu, "num_gpus": 1, "mem_peak_gib": [70.0], "hostname": gpu,
                             "config": {"gpu_mem_gb": cap}, "intent": {"cuda_graph": False}})

    runs = [rec("NVIDIA H100 80GB HBM3", 380.0, "2026-01-01T00:00:00+00:00"),
            rec("NVIDIA H200", 300.0, "2026-01-02T00:00:00+00:00", cap="80")]
    monkeypatch.setattr(fast_by_default, "read_records", lambda root, who: list(runs))
    monkeypatch.setattr(provenance, "of", lambda r, root=None: provenance.Provenance(provenance.CURRENT, ""))

    def row():
        return next(r for r in fast_by_default.rows(tmp_path) if r[1] == t111)

    assert row()[5] == "380" and row()[-1] == "met (1x H100 80GB)"
    runs.pop(0)
    assert row()[5] == "300" and row()[-1] == "no verdict: not the reference's GPU kind (1x H200, capped 80 GB)"


def test_a_one_gpu_analogue_is_set_beside_the_reference_rows_whose_per_gpu_work_it_carries():
    """510 carries R0's, R1's and R2's 4 x 4096 tokens per GPU in one micro-batch; 513 carries them in four (not
    the references' micro-batching) and 520 runs on two GPUs: neither gets a per-GPU row. A per-GPU row never
    gets a verdict and is not counted among the judged rows."""
    from megalab.core import catalog
    anchor = chapter.load_reference()
    assert fast_by_default.per_gpu_references(catalog.get("510"), anchor) == ["R0", "R1", "R2"]
    assert fast_by_default.per_gpu_references(catalog.get("513"), anchor) == []
    assert fast_by_default.per_gpu_references(catalog.get("520"), anchor) == []
    assert fast_by_default.per_gpu_references(catalog.get("111"), anchor) == []  # no analogue_of
    per_gpu = [r for r in fast_by_default.rows() if r[0].endswith("(per GPU)")]
    assert [r[0] for r in per_gpu] == ["R0 (per GPU)", "R1 (per GPU)", "R2 (per GPU)"]
    assert all(r[-1] == "not run with today's defaults" or r[-1].startswith("no verdict") for r in per_gpu)
