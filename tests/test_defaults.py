"""results/defaults.py: the fast-by-default table lists every 1-2 GPU target with a published TE time."""
import math

from megalab.harness import catalog
from megalab.results import chapter, defaults


def test_every_one_or_two_gpu_target_with_a_reference_time_has_a_row():
    anchor, twogpu = chapter.load_reference(), chapter.load_twogpu_reference()
    want = [e.id for e in catalog.catalog().values()
            if e.gpus <= 2 and (ref := defaults._reference(e, anchor, twogpu)) and not math.isnan(ref[0])]
    got = [r[1] for r in defaults.rows()]
    assert got == want and len(got) >= 20


def test_a_row_is_met_only_at_or_below_the_reference_time_and_memory():
    for r in defaults.rows():
        if r[5] == "not run":
            assert r[-1] == "not run with today's defaults"
            continue
        ratio, gib, ref_gib = float(r[7]), float(r[6]), float(r[3])
        assert r[-1].startswith("met") == (ratio <= 1.0 and gib <= ref_gib), r
