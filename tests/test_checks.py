"""megalab.results.checks: every metric kind on invented records (PASS, FAIL, NOT RUN), the claims-file schema,
the published values recomputed from configs/reference, and the page on the real committed records.

Records here are synthetic dicts, not measurements; `known` stands in for the catalog.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from megalab.core import catalog
from megalab.core.paths import ROOT
from megalab.results import checkmarks, checks, claims, tables
from megalab.results.hosts import Hosts
from megalab.results.checks import FAIL, NOT_RUN, PASS
from conftest import typed
from megalab.__main__ import main

A, B, C = "901-a", "902-b", "903-c"
KNOWN = {A: None, B: None, C: None}


def rec(status="ok", ms=100.0, gib=(10.0,), **extra) -> dict:
    r = {"status": status, "step_ms_median": ms, "mem_peak_gib": list(gib),
         "mem_peak_mib": [g * 1024 for g in gib]}
    r.update(extra)
    return r


def claim(metric: dict, expect, reads=None, **over) -> checks.Claim:
    reads = reads if reads is not None else sorted(_targets(metric))
    entry = {"id": "c1", "claim": "a claim.", "source": "a source", "reads": reads, "metric": metric,
             "expect": expect, "published": {"value": 1, "source": "somewhere"}}
    entry.update(over)
    return claims.parse(entry, 0)


def _targets(spec) -> set[str]:
    if isinstance(spec, str):
        return {spec} if spec[:1].isdigit() else set()
    if isinstance(spec, list):
        return set().union(*(_targets(x) for x in spec)) if spec else set()
    if isinstance(spec, dict):
        out = set()
        for k, v in spec.items():
            if k in ("a", "b", "target", "targets", "minus"):
                out |= _targets(v)
        return out
    return set()


def run(metric, expect, records, known=KNOWN, **kw) -> checks.Result:
    return checks.evaluate(claim(metric, expect, **kw), typed(records), known)


# --------------------------------------------------------------------------- metric kinds

@pytest.mark.parametrize("expect,status", [("< 1.0", PASS), ({"between": [0.4, 0.6]}, PASS), (">= 0.6", FAIL)])
def test_ratio(expect, status):
    r = run({"kind": "ratio", "a": A, "b": B}, expect, {A: rec(ms=50), B: rec(ms=100)})
    assert r.status == status
    assert r.values == [0.5] and "0.5000 (50.00 / 100.0)" in r.measured


def test_value_and_gpu_reduction():
    recs = {A: rec(gib=(60.0, 90.0))}
    assert run({"kind": "value", "field": "mem_peak_gib", "a": A}, "== 90", recs).status == PASS  # max
    assert run({"kind": "value", "field": "mem_peak_gib", "gpu": "sum", "a": A}, "== 150", recs).status == PASS
    assert run({"kind": "value", "field": "mem_peak_gib", "a": {"target": A, "gpu": 0}}, "< 61", recs).status == PASS
    r = run({"kind": "value", "field": "mem_peak_gib", "a": {"target": A, "gpu": 5}}, "< 61", recs)
    assert r.status == NOT_RUN and "no GPU 5" in r.why


def test_difference_and_relative_change():
    recs = {A: rec(ms=130), B: rec(ms=100)}
    assert run({"kind": "difference", "a": A, "b": B}, {"between": [29, 31]}, recs).status == PASS
    assert run({"kind": "difference", "a": A, "b": B}, "< 0", recs).status == FAIL
    r = run({"kind": "relative_change", "a": A, "b": B}, ">= 0.25", recs)
    assert r.status == PASS and math.isclose(r.values[0], 0.3) and r.measured.startswith("+0.3000")
    assert run({"kind": "relative_change", "a": A, "b": B}, ">= 0.5", recs).status == FAIL


def test_bytes_per_param():
    recs = {A: rec(params_total=10**9, theoretical_mem_mb={"weight_and_optimizer": 18e9 / 2**20},
                   mem_peak_mib=[25e9 / 2**20])}
    m = {"kind": "bytes_per_param", "field": "theoretical_mem_mb.weight_and_optimizer", "a": A}
    assert run(m, {"approx": 18, "rel": 0.005}, recs).status == PASS
    assert run(m, {"approx": 16, "rel": 0.005}, recs).status == FAIL
    r = run({"kind": "bytes_per_param", "field": "mem_peak_mib", "a": A}, {"between": [18, 27]}, recs)
    assert r.status == PASS and math.isclose(r.values[0], 25.0) and "B/param" in r.measured
    r = run(m, {"approx": 18, "rel": 0.005}, {A: rec()})  # no theoretical memory in the record
    assert r.status == NOT_RUN and "theoretical_mem_mb" in r.why


def test_bytes_per_param_of_a_difference():
    """The measured saving between two runs per parameter of the first (ZeRO-2's 12/DP B/param)."""
    recs = {A: rec(params_total=10**9, mem_peak_mib=[20e9 / 2**20]), B: rec(mem_peak_mib=[14e9 / 2**20])}
    m = {"kind": "bytes_per_param", "a": {"target": A, "field": "mem_peak_mib", "minus": B}}
    r = run(m, {"approx": 6, "rel": 0.15}, recs)
    assert r.status == PASS and math.isclose(r.values[0], 6.0) and "a difference of" in r.measured


def test_monotonic():
    m = {"kind": "monotonic", "targets": [A, B, C]}
    down = {A: rec(ms=300), B: rec(ms=200), C: rec(ms=205)}
    assert run(m, "decreasing", down).status == FAIL
    r = run({**m, "tolerance": 0.05}, "decreasing", down)
    assert r.status == PASS and r.measured == "300.0 > 200.0 < 205.0"
    assert run(m, "increasing", {A: rec(ms=1), B: rec(ms=2), C: rec(ms=3)}).status == PASS
    assert run(m, "decreasing", {A: rec(ms=1), B: rec(ms=2)}).status == NOT_RUN  # C has no record


def test_status():
    m = {"kind": "status", "targets": [A, B]}
    assert run(m, {"equals": ["oom", "ok"]}, {A: rec("oom"), B: rec()}).status == PASS
    r = run(m, {"equals": ["oom", "ok"]}, {A: rec(), B: rec()})
    assert r.status == FAIL and r.measured == "901 ok, 902 ok"
    r = run(m, {"equals": ["oom", "ok"]}, {A: rec("failed", error="NCCL timeout"), B: rec()})
    assert r.status == NOT_RUN and "901: its record is failed (NCCL timeout)" == r.why


def test_vector_across_and_minus():
    recs = {A: rec(ms=110), B: rec(ms=90), C: rec(ms=100)}
    r = run({"kind": "ratio", "a": [A, B], "b": C}, {"between": [0.85, 1.25]}, recs)
    assert r.status == PASS and r.values == [1.1, 0.9]
    assert run({"kind": "ratio", "a": [A, B], "b": C}, "> 1", recs).status == FAIL  # every value must hold
    r = run({"kind": "ratio", "a": C, "b": {"targets": [A, B], "across": "max"}}, "< 1", recs)
    assert r.status == PASS and math.isclose(r.values[0], 100 / 110)
    r = run({"kind": "ratio", "a": {"target": A, "minus": C}, "b": {"target": C, "minus": B}}, "== 1", recs)
    assert r.status == PASS


def test_not_run_reasons():
    m = {"kind": "ratio", "a": A, "b": B}
    r = run(m, "< 1", {A: rec(), B: rec()}, known={A: None})
    assert r.status == NOT_RUN and r.why == "902: not in the catalog yet"
    r = run(m, "< 1", {A: rec()})
    assert r.status == NOT_RUN and r.why == "902: no record yet"
    r = run(m, "< 1", {A: rec("incomplete"), B: rec("failed")})
    assert r.status == NOT_RUN and "901: its record is incomplete" in r.why and "902: its record is failed" in r.why


def test_stale_record_is_not_run():
    exp = catalog.catalog()["101-gpt2xl-dp1-gbs1-bf16"]
    known = {A: exp, B: None}
    stale = rec(config={"gbs": exp.gbs + 1, "gpus": exp.gpus})
    r = run({"kind": "ratio", "a": A, "b": B}, "< 1", {A: stale, B: rec()}, known=known)
    assert r.status == NOT_RUN and f"gbs={exp.gbs + 1}" in r.why
    fresh = rec(ms=50, config={"gbs": exp.gbs, "gpus": exp.gpus})
    assert run({"kind": "ratio", "a": A, "b": B}, "< 1", {A: fresh, B: rec()}, known=known).status == PASS


def test_oom_record():
    m = {"kind": "ratio", "a": A, "b": B}
    r = run(m, "< 1", {A: rec("oom"), B: rec()})
    assert r.status == FAIL and "901-a ran out of memory" in r.why
    theo = {"weight_and_optimizer": 100.0}  # printed before training, valid for an oom run too
    recs = {A: rec("oom", theoretical_mem_mb=theo), B: rec(theoretical_mem_mb=theo)}
    assert run({**m, "field": "theoretical_mem_mb.weight_and_optimizer"}, "== 1", recs).status == PASS


# --------------------------------------------------------------------------- schema

def _load(tmp_path: Path, claims: list) -> list:
    p = tmp_path / "checks.yaml"
    p.write_text(yaml.safe_dump({"claims": claims}))
    return checks.load_claims(p)


GOOD = {"id": "ok-claim", "claim": "x.", "source": "s", "reads": [A, B],
        "metric": {"kind": "ratio", "a": A, "b": B}, "expect": "< 1", "published": {"source": "p"}}


def test_good_claim_loads(tmp_path):
    (c,) = _load(tmp_path, [GOOD])
    assert c.kind == "ratio" and c.expect.text() == "< 1"


@pytest.mark.parametrize("change,needle", [
    ({"metric": {"kind": "speedup", "a": A, "b": B}}, "unknown metric kind 'speedup'"),
    ({"metric": {"kind": "ratio", "a": A}}, "needs b"),
    ({"reads": [A]}, "not listed: ['902-b']"),
    ({"reads": [A, B, C]}, "not read: ['903-c']"),
    ({"expect": "decreasing"}, "expect 'decreasing' is for kind monotonic"),
    ({"expect": "about 1"}, "expect 'about 1' is not valid for kind ratio"),
    ({"expect": {"between": [2, 1]}}, "is not valid for kind ratio"),
    ({"metric": {"kind": "ratio", "a": A, "b": B, "gpu": "median"}}, "gpu 'median'"),
    ({"metric": {"kind": "bytes_per_param", "a": A}, "reads": [A]}, "memory field in MiB or GiB"),
    ({"published": 3}, "`published` must be"),
    ({"colour": "red"}, "unknown keys ['colour']"),
])
def test_schema_errors_name_the_claim(tmp_path, change, needle):
    with pytest.raises(checks.ChecksError) as e:
        _load(tmp_path, [{**GOOD, **change}])
    msg = str(e.value)
    assert "claim ok-claim" in msg and needle in msg and "\n" not in msg


def test_schema_missing_keys_and_duplicates(tmp_path):
    bad = dict(GOOD)
    del bad["expect"]
    with pytest.raises(checks.ChecksError, match="claim ok-claim: missing expect"):
        _load(tmp_path, [bad])
    with pytest.raises(checks.ChecksError, match="duplicate claim id ok-claim"):
        _load(tmp_path, [GOOD, GOOD])


# --------------------------------------------------------------------------- the real claims file

def test_real_claims_load_and_name_real_targets():
    claims = checks.load_claims()
    assert len(claims) >= 30
    anchor = set(tables.load_reference()["target"])
    known = set(catalog.catalog()) | anchor
    for c in claims:
        typos = set(c.reads) - known
        assert not typos, f"{c.id}: {sorted(typos)} is neither a catalog target nor an anchor_8xh100.csv row"


def _reference_records() -> dict[str, dict]:
    """The published rows as records: anchor_8xh100.csv by target, twogpu_2xh200.csv via chapter 0's refs."""
    out = {}
    for (_ch, _row), r in tables.load_reference().iterrows():
        if not r["target"]:
            continue
        gpus = int(r["gpus"])
        if r["mem_gb_per_gpu"] == "oom":
            out[r["target"]] = {"status": "oom"}
        else:
            out[r["target"]] = {"status": "ok", "step_ms_median": r["step_ms"],
                                "mem_peak_gib": [float(r["mem_gb_per_gpu"])] * gpus}
    two = tables.load_twogpu_reference()
    for exp in catalog.catalog().values():
        if exp.chapter == 0 and exp.ref in two.index:
            r = two.loc[exp.ref]
            mib = [float(v) for v in (r["mem_mib_gpu0"], r["mem_mib_gpu1"]) if not pd.isna(v)]
            out[exp.id] = {"status": "ok", "step_ms_median": float(r["step_ms"]),
                           "mem_peak_mib": mib, "mem_peak_gib": [m / 1024 for m in mib]}
    return out


def test_published_values_match_the_reference_rows():
    """A published value whose claim can be computed on the published rows is that computation, and
    the published rows meet every expectation they can be tested on (the bands admit the reference)."""
    ref = _reference_records()
    known = {t: None for t in ref}
    checked = 0
    for c in checks.load_claims():
        value = c.published.value
        if value is None or not set(c.reads) <= set(ref):
            continue
        r = checks.evaluate(c, typed(ref), known)
        if r.status == NOT_RUN:  # needs a field the published rows lack (theoretical memory, params)
            continue
        assert r.status == PASS, f"{c.id}: the published rows themselves miss the expectation: {r.why}"
        want = value if isinstance(value, list) else [value]
        assert len(r.values) == len(want), c.id
        for got, w in zip(r.values, want):
            if isinstance(w, str):
                assert got == w, c.id
            else:
                decimals = len(repr(float(w)).split(".")[1].rstrip("0")) if "." in repr(float(w)) else 0
                assert abs(got - w) <= 0.5 * 10 ** -decimals + 1e-9, f"{c.id}: published {w}, reference gives {got}"
        checked += 1
    assert checked >= 28


@pytest.fixture(scope="module")
def committed():
    """Every claim on the committed records, as `make check` evaluates them, the rows they read and the machines."""
    hosts = Hosts.under(ROOT / "results")
    return checks.evaluate_root(hosts=hosts), tables.load_records(), hosts


def test_page_on_the_committed_records(committed):
    results, records, _ = committed
    claims = checks.load_claims()
    text = checks.render(results)
    counts = checks.summary(results)
    assert f"{len(claims)} claims: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN (" in text
    assert text.count("A finding, reported as is") == counts[FAIL]
    cat = catalog.catalog()
    measured = 0
    for r in results:
        usable = all(t in cat and t in records and records[t].status in ("ok", "oom") for t in r.claim.reads)
        if usable and not r.why.startswith("unlike runs"):
            measured += 1
            assert r.status in (PASS, FAIL), f"{r.claim.id}: {r.why}"
        else:
            assert r.status == NOT_RUN and r.why
    assert measured >= 15


def test_every_verdict_names_the_runs_its_pages_rows_stand_on(committed):
    """No PASS or FAIL rests on a run that no page's row stands on: each folder it names is one of its
    target's row runs (rows.csv `median_of`), and results/checks.md lists them."""
    results, _, _ = committed
    rows = pd.read_csv(ROOT / "results" / "rows.csv", dtype=str, keep_default_na=False)
    shown = {t.split("-", 1)[0]: set(runs.split()) for t, runs in zip(rows["target"], rows["median_of"])}
    page = (ROOT / "results" / "checks.md").read_text()
    offenders = []
    for r in results:
        if r.status == NOT_RUN:
            continue
        assert r.basis.folders and {t for t, _ in r.basis.folders} == {t.split("-", 1)[0] for t in r.claim.reads}
        offenders += [f"{r.claim.id}: {t} {name}" for t, names in r.basis.folders for name in names
                      if name not in shown.get(t, ())]
        assert f"- `{r.claim.id}` ({r.status}): " in page, r.claim.id
    assert not offenders, f"verdicts resting on runs no row stands on: {offenders}"


def _mutated(records: dict, target: str, **config) -> dict:
    """RECORDS with TARGET's row record changed in memory (its folder's copy: what the check reads)."""
    r = records[target]
    return {**records, target: r.model_copy(update={"config": r.config.model_copy(update=config)})}


@pytest.mark.parametrize("field,value,label", [("cuda_graph", False, "CUDA graph: 111 on, 113 off"),
                                               ("fastpath", "fused_adam", "FAST: 111 +")])
def test_a_run_with_another_cuda_graph_or_fast_path_turns_the_verdict_into_a_refusal(committed, field, value, label):
    """ch1-zero2-step-time-flat-dp1 compares 113 with 111, two like runs: change one thing of 113's record
    and the claim refuses in one line naming that difference and the fix."""
    results, records, hosts = committed
    c = next(r.claim for r in results if r.claim.id == "ch1-zero2-step-time-flat-dp1")
    cat = catalog.catalog()
    assert checks.evaluate(c, records, cat, hosts).status in (PASS, FAIL)
    t113 = next(t for t in c.reads if t.startswith("113"))
    if field == "fastpath":  # the record's fast path is its plan's (intent) where it has one
        r = records[t113]
        mutated = {**records, t113: r.model_copy(update={"intent": r.intent.model_copy(update={"fastpath": value})})}
    else:
        mutated = _mutated(records, t113, **{field: value})
    res = checks.evaluate(c, mutated, cat, hosts)
    assert res.status == NOT_RUN and res.why.startswith("unlike runs") and label in res.why
    assert "\n" not in res.why and "fix: " in res.why and 'make campaign IDS="111 113"' in res.why
    declared = c.model_copy(update={"differs": {field: "a test declares it"}})
    res = checks.evaluate(declared, mutated, cat, hosts)
    assert res.status in (PASS, FAIL) and res.declared and "a test declares it" in res.stands_on


# --------------------------------------------------------------------------- cli

def _root_with(tmp_path: Path, ms: float) -> Path:
    d = tmp_path / "root" / "results" / "runs" / "20250101_000000___101-gpt2xl-dp1-gbs1-bf16"
    d.mkdir(parents=True)
    exp = catalog.catalog()["101-gpt2xl-dp1-gbs1-bf16"]
    (d / "run.json").write_text(json.dumps({
        "fixture": True, "target": exp.id, "status": "ok", "started": "2025-01-01T00:00:00+00:00",
        "step_ms_median": ms, "config": {"gbs": exp.gbs, "gpus": exp.gpus}}))
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": [{
        "id": "fast", "claim": "fast.", "source": "s", "reads": [exp.id],
        "metric": {"kind": "value", "a": exp.id}, "expect": "< 400", "published": "p"}]}))
    return tmp_path / "root"


@pytest.mark.parametrize("ms,strict,rc", [(300, False, 0), (300, True, 0), (500, False, 0), (500, True, 1)])
def test_cli_exit_codes(tmp_path, capsys, ms, strict, rc):
    root = _root_with(tmp_path, ms)
    argv = ["--root", str(root), "--claims", str(tmp_path / "claims.yaml")] + (["--strict"] if strict else [])
    assert main(["check", *argv]) == rc
    out = capsys.readouterr().out
    page = (root / "results" / "checks.md").read_text()
    if ms == 500:
        assert "FAIL fast: measured 500.0" in out and "FAIL [1]" in page and "[1] `fast`" in page
    else:
        assert "1 PASS, 0 FAIL, 0 NOT RUN" in out and "| PASS" in page


def test_cli_schema_error(tmp_path, capsys):
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": [{**GOOD, "metric": {"kind": "nope", "a": A, "b": B}}]}))
    assert main(["check", "--root", str(tmp_path), "--claims", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "claim ok-claim: unknown metric kind 'nope'" in err


# --------------------------------------------------------------------------- every claim can fail

def _set(rec: dict, field: str, value) -> None:
    parts = field.split(".")
    for p in parts[:-1]:
        rec = rec.setdefault(p, {})
    rec[parts[-1]] = value


def _failing_records(c: checks.Claim, rng) -> dict[str, dict]:
    """A synthetic record set for claim c: every target it reads ok (or a status drawn for status
    claims), every field it reads a random positive value (per-GPU fields: two GPUs), one host."""
    recs = {t: {"target": t, "status": "ok", "hostname": "h"} for t in c.reads}
    if c.kind == "status":
        for t in c.reads:
            recs[t]["status"] = rng.choice(["ok", "oom"])
        return recs
    ops = list(c.operands.values())
    while ops:
        op = ops.pop()
        if op.minus is not None:
            ops.append(op.minus)
        for t in op.targets:
            v = float(rng.choice([0.5, 1, 2, 3, 5, 8, 13, 100, 1e4, 1e9])) * rng.uniform(0.9, 1.1)
            _set(recs[t], op.field, [v, v * rng.uniform(0.5, 2)] if op.field.startswith("mem_peak") else v)
            _set(recs[t], c.params_field, rng.choice([10**8, 10**9, 10**10]))
    return recs


def test_every_claim_has_a_reachable_failing_value():
    """A claim that no measurement could make FAIL checks nothing: for each claim, a synthetic record
    set (random values, one host) that makes it FAIL must exist, and is found here."""
    import random

    rng = random.Random(18)
    known = {t: None for c in checks.load_claims() for t in c.reads}
    unfailable = []
    for c in checks.load_claims():
        for _ in range(3000):
            if checks.evaluate(c, typed(_failing_records(c, rng)), known).status == checks.FAIL:
                break
        else:
            unfailable.append(c.id)
    assert not unfailable, f"claims no record set makes FAIL: {unfailable}"


def test_fails_if_is_generated_from_expect():
    by_id = {c.id: c for c in checks.load_claims()}
    assert checks.fails_if(by_id["ch0-dp-step-flat"]) == \
        "FAIL if the ratio is outside 0.9–1.1, or if a target it reads ran out of memory"
    assert checks.fails_if(by_id["ch1-zero2-cannot-help-at-dp1"]).startswith(
        "FAIL if the ratio is outside 1 ± 3% (0.97–1.03)")
    assert checks.fails_if(by_id["ch2-sp-fits-22b"]) == "FAIL if the statuses are not oom, ok in this order"
    assert "does not fall (a rise within 5% is allowed)" in checks.fails_if(by_id["ch2-tp-strong-scaling-gbs20-monotonic"])
    page = checks.render(checks.evaluate_all(list(by_id.values()), {}, {}))
    assert "| fails if " in page


def test_the_formula_against_itself_claims_are_gone():
    """Claims compare measurements: none reads Megatron's printed theoretical memory on both sides."""
    for c in checks.load_claims():
        fields = {op.field for op in c.operands.values()} | {op.minus.field for op in c.operands.values() if op.minus}
        assert fields != {"theoretical_mem_mb.weight_and_optimizer"}, c.id
    ids = {c.id for c in checks.load_claims()}
    assert "ch1-18-bytes-per-param-theoretical" not in ids and "ch1-distopt-6-plus-12-over-dp" not in ids


# --------------------------------------------------------------------------- what a verdict stands on

def _host(**extra) -> dict:
    return {"hostname": "vm", "gpu_name": "NVIDIA H200", "num_gpus": 2, "gpus_on_node": 2, **extra}


def test_a_claim_that_pairs_runs_of_two_machines_is_not_run_and_names_them():
    metric = {"kind": "ratio", "a": B, "b": A}
    same = {A: rec(ms=100.0, **_host()), B: rec(ms=105.0, **_host())}
    r = run(metric, {"between": [0.9, 1.1]}, same)
    assert r.status == PASS and r.basis.runs[0][2] == "2 GPUs on H200x2-noid" and not r.basis.today
    # without a GPU UUID, a 2-GPU and an 8-GPU run of one host name are two machines, never one
    other = {A: rec(ms=100.0, **_host()), B: rec(ms=105.0, **_host(num_gpus=8, gpus_on_node=8))}
    r = run(metric, {"between": [0.9, 1.1]}, other)
    assert r.status == NOT_RUN and r.why.startswith("unlike runs, machine: 901 H200x2-noid, 902 H200x8-noid")
    assert "fix: " in r.why
    uuid = {A: rec(ms=100.0, **_host(gpu_uuids=["GPU-aaaa1111-2222"])),
            B: rec(ms=105.0, **_host(gpu_uuids=["GPU-bbbb1111-2222"]))}
    assert run(metric, {"between": [0.9, 1.1]}, uuid).status == NOT_RUN  # two UUIDs: two machines


def test_what_pairs_nothing_is_evaluated_across_machines_and_says_where_each_ran():
    recs = {A: rec(status="oom", **_host()), B: rec(**_host(num_gpus=8, gpus_on_node=8))}
    r = run({"kind": "status", "targets": [A, B]}, {"equals": ["oom", "ok"]}, recs)
    assert r.status == PASS and r.basis.text.startswith("901: older (schema 1), 2 GPUs on H200x2-noid")
    assert "; 902: older (schema 1), 8 GPUs on H200x8-noid" in r.basis.text
    r = run({"kind": "value", "field": "mem_peak_gib", "a": [A, B]}, "< 20", {t: rec(**_host(num_gpus=n, gpus_on_node=n))
                                                                              for t, n in ((A, 2), (B, 8))})
    assert r.status == PASS
    for metric in ({"kind": "value", "a": {"targets": [A, B], "across": "max"}},
                   {"kind": "value", "a": {"target": A, "minus": B}}):
        assert checks.pairs_runs(claim(metric, "< 1000"))


def test_basis_text_groups_the_targets_of_one_provenance_and_machine():
    b = checks.Basis((("001", "today", "2x H200 GPU-4460", "41ddb22"), ("002", "today", "2x H200 GPU-4460", "41ddb22")))
    assert b.today and b.text == "today, 2x H200 GPU-4460, commit 41ddb22"
    b = checks.Basis((("101", "today", "1x H100 GPU-768c", "df56dc0"),
                      ("102", "older (schema 1)", "2x H200 (no GPU UUID)", "0aa8761")))
    assert not b.today and b.text == ("101: today, 1x H100 GPU-768c, commit df56dc0; "
                                      "102: older (schema 1), 2x H200 (no GPU UUID), commit 0aa8761")


def test_between_machines_is_derived_from_runs_of_one_command(tmp_path):
    runs = tmp_path / "results" / "runs"
    for name, host, ms in (("a", "h1", 100.0), ("b", "h2", 110.0), ("c", "h1", 50.0)):
        (runs / name).mkdir(parents=True)
        (runs / name / "run.json").write_text(json.dumps({
            "target": A if name != "c" else B, "status": "ok", "step_ms_median": ms, "hostname": host,
            "gpu_uuids": [f"GPU-{host}"],
            "gpu_name": "NVIDIA H100 80GB HBM3", "num_gpus": 1, "versions": {"megalab_commit": "c1c1"}}))
    spread = checks.between_machines(tmp_path)
    assert [(t, round(x, 3)) for t, x in spread] == [("901", 0.1)]
    assert "10.0%–10.0% apart (901: 10.0%)" in checks.between_machines_text(spread)
    assert "not measured" in checks.between_machines_text([])
    page = checks.render([], {}, spread)
    assert "## Between machines" in page and "901: 10.0%" in page


def test_the_page_names_each_verdicts_runs_and_where_it_is_taught():
    r = run({"kind": "ratio", "a": B, "b": A}, "> 2", {A: rec(**_host()), B: rec(**_host())})
    page = checks.render([r], {"c1": ["tutorials/00-two-gpu-tour.md"]})
    assert "| runs " in page and "| taught in" in page and "older (schema 1), 2 GPUs on H200x2-noid" in page
    assert "Explained where it is taught: tutorials/00-two-gpu-tour.md." in page
    assert "Of the 1 evaluated, 0 read runs of today's code and defaults only and 1 read older runs" in page


def test_a_declared_difference_is_evaluated_and_shown_beside_the_verdict():
    """A claim may accept a difference between its runs (`differs`): it is evaluated, and both results/checks.md
    and the marker in the prose show the difference and why."""
    recs = {A: rec(ms=100.0, **_host(config={"cuda_graph": True})), B: rec(ms=105.0, **_host(config={"cuda_graph": False}))}
    metric = {"kind": "ratio", "a": B, "b": A}
    r = run(metric, {"between": [0.9, 1.1]}, recs)
    assert r.status == NOT_RUN and "CUDA graph: 901 on, 902 off" in r.why and "differs: {cuda_graph: why}" in r.why
    r = run(metric, {"between": [0.9, 1.1]}, recs, differs={"cuda_graph": "the graph replays the same kernels"})
    assert r.status == PASS
    said = "declared difference: CUDA graph: 901 on, 902 off (the graph replays the same kernels)"
    assert said in r.stands_on and said in checkmarks.verdict(r) and said in checks.render([r])
    with pytest.raises(claims.ChecksError, match="differs: 'graph' is no facet of a run; fix: name one of machine"):
        claim(metric, "< 2", differs={"graph": "no such facet"})


def test_runs_that_may_have_shared_a_machine_are_refused():
    """Two runs whose times overlap on a machine they may have shared (no UUID: it cannot be told) are not
    compared; with UUIDs of two whole machines they are."""
    at = lambda s, e: {"started": f"2026-01-01T10:{s:02d}:00+00:00", "ended": f"2026-01-01T10:{e:02d}:00+00:00"}  # noqa: E731
    metric = {"kind": "ratio", "a": B, "b": A}
    recs = {A: rec(ms=100.0, **_host(**at(0, 10))), B: rec(ms=100.0, **_host(**at(5, 15)))}
    r = run(metric, "< 2", recs)
    assert r.status == NOT_RUN and "another run beside it: 901 (beside 902)" in r.why
    recs = {A: rec(ms=100.0, **_host(gpu_uuids=["GPU-a1", "GPU-a2"], **at(0, 10))),
            B: rec(ms=100.0, **_host(gpu_uuids=["GPU-b1", "GPU-b2"], **at(5, 15)))}
    r = run(metric, "< 2", recs)  # two whole machines: no run beside the other, but not one machine either
    assert r.status == NOT_RUN and "beside" not in r.why and "machine: 901 H200-a1, 902 H200-b1" in r.why
    recs[B] = rec(ms=100.0, **_host(gpu_uuids=["GPU-a1", "GPU-a2"], **at(10, 15)))
    assert run(metric, "< 2", recs).status == PASS  # one after the other on one machine


def test_compared_sets_leave_out_what_reads_one_run():
    """A ratio of one run's own GPUs, or of each target's own largest to smallest GPU, compares no runs."""
    own = claim({"kind": "ratio", "field": "mem_peak_gib", "a": {"targets": [A, B], "gpu": "max"},
                 "b": {"targets": [A, B], "gpu": "min"}}, "< 1.05")
    assert checks.compared(own) == []
    assert checks.compared(claim({"kind": "ratio", "a": [A, B], "b": C}, "< 2")) == [{A, C}, {B, C}]
    assert checks.compared(claim({"kind": "value", "a": {"target": A, "minus": B}}, "< 2")) == [{A, B}]
    assert checks.compared(claim({"kind": "status", "targets": [A, B]}, {"equals": ["ok", "ok"]})) == []
