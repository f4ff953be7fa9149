"""megalab.results.hosts: a machine's key from its GPUs' UUIDs, and which runs may have shared one."""
from __future__ import annotations

from conftest import typed
from megalab.results.hosts import Hosts, Run

H200 = "NVIDIA H200"


def _rec(uuids=None, node=None, visible=None, s=0, e=10, gpu=H200, host="vm"):
    r = {"status": "ok", "gpu_name": gpu, "num_gpus": len(uuids or ()) or 2, "hostname": host,
         "started": f"2026-01-01T10:{s:02d}:00+00:00", "ended": f"2026-01-01T10:{e:02d}:00+00:00"}
    if uuids:
        r["gpu_uuids"] = list(uuids)
        r["gpus_on_node"] = len(uuids)
    if node:
        r["node_gpu_uuids"] = list(node)
    if visible:
        r["cuda_visible_devices"] = visible
    return r


def test_records_that_share_a_gpu_are_one_machine_keyed_by_its_smallest_uuid():
    recs = typed({"1-a": _rec(["GPU-cc", "GPU-dd"], visible="0,1"), "2-b": _rec(["GPU-ee", "GPU-ff"], visible="2,3"),
                  "3-c": _rec(["GPU-dd", "GPU-ee"], visible="1,2", s=20, e=30), "4-d": _rec(["GPU-zz"])})
    h = Hosts(recs.values())
    assert {h.key(r) for r in list(recs.values())[:3]} == {"H200-cc"}  # joined through 3-c
    assert h.key(recs["4-d"]) == "H200-zz"
    assert h.key(typed({"5-e": {"status": "ok", "gpu_name": H200, "num_gpus": 2}})["5-e"]) == "H200x2-noid"


def test_who_may_have_shared_a_machine():
    recs = typed({"1-a": _rec(["GPU-a1", "GPU-a2"], visible="0,1"), "2-b": _rec(["GPU-b1", "GPU-b2"], visible="2,3"),
                  "3-c": _rec(["GPU-c1"]), "4-d": _rec(), "5-e": _rec(["GPU-e1"], gpu="NVIDIA H100 80GB HBM3"),
                  "6-f": _rec(["GPU-a1"], visible="0", s=10, e=20)})
    h = Hosts(recs.values())
    run = {t: Run.of(r) for t, r in recs.items()}
    assert h.may_share(run["1-a"], run["2-b"])  # GPUs 0,1 and 2,3 of one host look like two hosts: may be one
    assert not h.may_share(run["1-a"], run["3-c"])  # 3-c saw its whole machine, which has no GPU of 1-a
    assert h.may_share(run["3-c"], run["4-d"])  # no UUID: could have been anywhere of its model
    assert not h.may_share(run["4-d"], run["5-e"])  # another GPU model
    assert [r.target for r in h.beside(recs["1-a"])] == ["2-b", "4-d"]  # 6-f starts as 1-a ends
    node = typed({"1-a": _rec(["GPU-a1"], node=["GPU-a1", "GPU-a2"]), "2-b": _rec(["GPU-b1"], node=["GPU-b1", "GPU-b2"])})
    assert Hosts(node.values()).beside(node["1-a"]) == []  # the node's UUIDs tell two hosts apart
