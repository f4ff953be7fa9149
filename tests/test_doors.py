"""One door for every input (issue 31): each kind of input file is judged where it enters, and a bad one is
one line (the file, the place, what is wrong, the fix), never a traceback, a hang or gigabytes of memory.

core/infile.py (any file: regular, bounded, unpacked to a bound), core/yamlfile.py (the YAML configs: no
key twice, no alias bomb, no crash on deep nesting), the run record (core/schema.py), the catalog and the
presets (core/catalog.py), configs/bench.yaml (core/benchruns.py), the reference CSVs (results/chapter.py),
the make variables (core/variables.py), and the logs and TensorBoard files beside a record.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from megalab.__main__ import main
from megalab.core import benchruns, catalog, infile, logparse, records, variables, yamlfile
from megalab.core.infile import InputError
from megalab.core.records import RunRecord
from megalab.core.schema import RecordError
from megalab.core.variables import LaunchError
from megalab.results import chapter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_inputs import OVER_LOG_LIMIT_MIB, gzip_bomb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T101 = "101-gpt2xl-dp1-gbs1-bf16"
GOOD = {"schema": 2, "target": T101, "status": "ok", "started": "2026-01-01T10:00:00+00:00", "step_ms_median": 100.0,
        "mem_peak_gib": [30.0], "num_gpus": 1, "config": {"gpus": 1, "gbs": 1}}


# --------------------------------------------------------------------------- any file

@pytest.mark.parametrize("make, what", [
    (lambda p: os.mkfifo(p), "a FIFO (named pipe), not a regular file"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink(p.name, p), "a symbolic-link loop"),
    (lambda p: os.symlink("/dev/zero", p), "a character device, not a regular file"),
    (lambda p: None, "no such file"),
])
def test_a_file_that_is_no_regular_file_is_refused_without_blocking(tmp_path, make, what):
    path = tmp_path / "logs.txt"
    make(path)
    t0 = time.monotonic()
    with pytest.raises(InputError) as e:
        infile.read(path)
    assert time.monotonic() - t0 < 1 and what in str(e.value) and "; fix: " in str(e.value)
    assert str(e.value).count("\n") == 0 and isinstance(e.value, OSError)  # readers that take OSError take it


def test_a_file_over_its_limit_is_refused_unread(tmp_path):
    big = tmp_path / "run.json"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB that cost nothing to make, and would to read
    with pytest.raises(InputError, match=r"larger than 16 MiB \(64 MiB\): not read"):
        infile.read(big, infile.RECORD_LIMIT)
    assert infile.read(big, None)[:4] == b"\0\0\0\0"  # no limit: a file megalab itself just wrote


def test_a_gzip_bomb_is_refused_fast_and_small(tmp_path):
    """The issue's 2 MB bomb (2 GiB of zeros) cost 156 s and 4.2 GB: now a bomb is refused by its gzip trailer,
    which says what it unpacks to, without unpacking anything; one whose trailer does not tell (the same zeros
    in 32 members, the last saying 64 MiB) is unpacked only up to the log limit (then refused) and held a chunk
    at a time. In a process of its own so that the memory figure is these reads'. Fast is counted, not timed:
    the bytes unpacked, which a wall-clock bound on a loaded machine cannot promise."""
    one, members = tmp_path / "one" / "logs.txt.gz", tmp_path / "members" / "logs.txt.gz"
    for path, data in ((one, gzip_bomb(OVER_LOG_LIMIT_MIB)), (members, gzip_bomb(64) * 32)):
        path.parent.mkdir()
        path.write_bytes(data)
    assert 1.5e6 < members.stat().st_size < 3e6
    # VmHWM: this process's peak (ru_maxrss would carry the forking pytest's over exec); every GzipFile.read counted
    code = ("import gzip, re, sys\nfrom megalab.core import logparse\nread, unpacked = gzip.GzipFile.read, [0]\n"
            "def counted(self, *a):\n    b = read(self, *a)\n    unpacked[0] += len(b)\n    return b\n"
            "gzip.GzipFile.read = counted\n"
            "for path in sys.argv[1:]:\n    unpacked[0] = 0\n"
            "    try:\n        logparse.parse_file(path)\n    except logparse.LogReadError as e:\n        print(e)\n"
            "    print(unpacked[0])\n"
            "hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(hwm)")
    out = subprocess.run([sys.executable, "-c", code, str(one.parent / "logs.txt"), str(members.parent / "logs.txt")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    one_message, one_unpacked, message, unpacked, rss_kib = out.stdout.splitlines()
    assert "larger than 512 MiB uncompressed: not read" in one_message and one_unpacked == "0", out.stdout
    assert "larger than 512 MiB uncompressed: not read" in message
    assert infile.LOG_LIMIT < float(unpacked) <= infile.LOG_LIMIT + infile._CHUNK, unpacked  # not the bomb's 2 GiB
    assert float(rss_kib) < 200 * 1024, rss_kib


def test_a_gzip_trailer_that_says_more_than_its_file_could_hold_is_damage_not_a_bomb(tmp_path):
    """A trailer that says more than its file could unpack to (deflate unpacks at most 1032 bytes a byte) is no
    size: a file cut short ends in compressed bytes, not its trailer. The file is read, and named damaged."""
    import gzip

    whole = gzip.compress(os.urandom(1 << 16))
    cut = tmp_path / "logs.txt.gz"
    cut.write_bytes(whole[:-8] + (1 << 31).to_bytes(4, "little") * 2)  # its last 4 bytes say 2 GiB
    with pytest.raises(InputError, match="damaged gzip"):
        infile.read(cut, infile.LOG_LIMIT)


def test_a_log_under_the_limit_reads_as_before(tmp_path):
    import gzip

    raw = (Path(__file__).parent / "fixtures" / "logs" / "ok_1gpu_v019.txt").read_bytes()
    (tmp_path / "logs.txt.gz").write_bytes(gzip.compress(raw))
    assert logparse.read_log(tmp_path / "logs.txt") == raw
    with pytest.raises(InputError, match="larger than 100 bytes uncompressed"):
        logparse.read_log(tmp_path / "logs.txt", limit=100)


def test_compress_logs_leaves_a_fifo_alone(tmp_path, capsys):
    run = tmp_path / "runs" / "20260101_000000___101-x"
    run.mkdir(parents=True)
    os.mkfifo(run / "logs.txt")
    assert logparse.compress_logs(tmp_path) == []
    assert "not gzipping" in capsys.readouterr().err and (run / "logs.txt").exists()


def test_tensorboard_files_come_in_by_the_door(tmp_path, capsys):
    """TensorBoard's loader reads a path: it is only ever handed a copy of bytes the door let in, never a
    FIFO or a bomb; each such file is skipped in one line."""
    from megalab.results import validation

    tb = tmp_path / "tensorboard"
    tb.mkdir()
    os.mkfifo(tb / "events.out.tfevents.1")
    (tb / "events.out.tfevents.2.gz").write_bytes(gzip_bomb(OVER_LOG_LIMIT_MIB))
    assert validation.tensorboard_mem_mb(tmp_path) == {}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "FIFO" in err[0] and "uncompressed: not read" in err[1], err


# --------------------------------------------------------------------------- YAML

def test_yaml_refuses_a_key_given_twice_an_alias_bomb_and_deep_nesting(tmp_path):
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdef", "bcdefg"))
    for text, what in (("a: 1\nb: 2\na: 3\n", "line 3: key 'a' given twice (line 1 and here)"),
                       (laughs, "expands to more than 1,000,000 items"),
                       ("[" * 100000 + "]" * 100000, "nested too deeply"),
                       ("!!python/object/apply:os.system ['true']\n", "could not determine a constructor")):
        path = tmp_path / "x.yaml"
        path.write_text(text)
        with pytest.raises(InputError) as e:
            yamlfile.load(path)
        assert what in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "ok.yaml").write_text("a: &x [1, 2]\nb: *x\n")  # an alias that expands to little is fine
    assert yamlfile.load(tmp_path / "ok.yaml") == {"a": [1, 2], "b": [1, 2]}


def test_every_committed_config_reads_as_pyyaml_reads_it():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        assert yamlfile.load(path) == yaml.safe_load(path.read_text()), path


# --------------------------------------------------------------------------- run records

def _record(tmp_path, data) -> Path:
    d = tmp_path / "runs" / "20260101_000000___x"
    d.mkdir(parents=True)
    (d / "run.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return d / "run.json"


@pytest.mark.parametrize("change, field", [
    ({"step_ms_median": -5.0}, "step_ms_median: a measurement is never negative"),
    ({"mem_peak_gib": [30.0, -1]}, "mem_peak_gib.1: a measurement is never negative"),
    ({"num_gpus": 0}, "num_gpus: Input should be greater than or equal to 1"),
    ({"config": {"gpus": 0}}, "config.gpus: Input should be greater than or equal to 1"),
    ({"config": {"mbs": -1}}, "config.mbs: Input should be greater than or equal to 1"),
    ({"config": {"gpu_mem_gb": 0}}, "config.gpu_mem_gb: a memory cap is above 0 GB"),
    ({"files": {"log": "/dev/zero"}}, "files.log: not a file of the run's folder"),
    ({"files": {"log": "../../../etc/passwd"}}, "files.log: not a file of the run's folder"),
    ({"files": {"memory": "/dev/zero"}}, "files.memory: not a file of the run's folder"),
    ({"target": "../../etc/passwd"}, "target: not a target id"),
    ({"target": "101\nmegalab: ok"}, "target: not a target id"),
])
def test_a_record_out_of_range_is_refused_naming_the_field(tmp_path, change, field):
    with pytest.raises(RecordError) as e:
        RunRecord.load(_record(tmp_path, GOOD | change))
    assert field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("make, what", [
    (lambda p: os.mkfifo(p), "a FIFO"), (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink(p.name, p), "a symbolic-link loop"), (lambda p: os.symlink("/dev/zero", p), "device"),
    (lambda p: p.write_bytes(b"[" * 200000 + b"]" * 200000), "nested too deeply"),
    (lambda p: open(p, "wb").truncate(64 << 20), "larger than 16 MiB"),
])
def test_a_run_json_that_is_no_file_is_skipped_by_readers_in_one_line(tmp_path, capsys, make, what):
    d = tmp_path / "runs" / "20260101_000000___x"
    d.mkdir(parents=True)
    make(d / "run.json")
    t0 = time.monotonic()
    assert list(records.read_records(tmp_path / "runs", "megalab test")) == []
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 5 and err.count("\n") == 1 and what in err and "run.json" in err


def test_the_committed_records_all_pass_the_door():
    paths = sorted(ROOT.glob("results/**/run.json"))
    assert len(paths) > 300
    for p in paths:
        RunRecord.load(p)


# --------------------------------------------------------------------------- the catalog and the presets

def _catalog_with(monkeypatch, tmp_path, files: dict[str, dict], models: dict | None = None):
    configs = tmp_path / "configs"
    shutil.rmtree(configs, ignore_errors=True)
    (configs / "experiments").mkdir(parents=True)
    (configs / "models.yaml").write_text(yaml.safe_dump(models or yaml.safe_load(
        (ROOT / "configs" / "models.yaml").read_text())))
    for name, doc in files.items():
        (configs / "experiments" / name).write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(catalog, "CONFIGS", configs)
    for f in (catalog.models, catalog.chapters, catalog.catalog, catalog._chapter_files):
        f.cache_clear()


@pytest.fixture
def fresh_catalog():
    yield
    for f in (catalog.models, catalog.chapters, catalog.catalog, catalog._chapter_files):
        f.cache_clear()


def _chapter(n=1, experiments=None, **more):
    return {"chapter": n, "title": "x", "table": f"results/0{n}-x.md", "defaults": {"model": "gpt2-xl"},
            "experiments": experiments or [{"id": f"{n}01-x", "gpus": 1, "gbs": 1, "about": "x"}], **more}


@pytest.mark.parametrize("entry, needle", [
    ({"mbs": 0}, "101-x: mbs: Input should be greater than or equal to 1"),  # was a ZeroDivisionError
    ({"gbs": -8}, "gbs: Input should be greater than or equal to 1"),
    ({"gpus": 0}, "gpus: Input should be greater than or equal to 1"),
    ({"tp": 0}, "tp: Input should be greater than or equal to 1"),
    ({"timing_log_level": 5}, "timing_log_level: Input should be less than or equal to 2"),
    ({"gpus": 2, "gbs": 3}, "global batch 3 is not divisible by micro batch x DP = 1 x 2"),
    ({"tp": 3, "gpus": 3, "gbs": 3}, "25 attention heads cannot be split over TP=3"),
])
def test_catalog_arithmetic_is_refused_at_load_naming_file_entry_and_field(monkeypatch, tmp_path, fresh_catalog,
                                                                          entry, needle):
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter(experiments=[
        {"id": "101-x", "gpus": 1, "gbs": 1, "about": "x"} | entry])})
    for reader in (catalog.catalog, lambda: catalog.get("101")):
        with pytest.raises(catalog.CatalogError) as e:
            reader()
        assert needle in str(e.value) and "01-x.yaml" in str(e.value) and "fix" in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("change, needle", [
    ({"table": "../../etc/x.md"}, "table: String should match pattern"),
    ({"table": "/tmp/x.md"}, "table: String should match pattern"),
    ({"tutorial": "../x.md"}, "tutorial: String should match pattern"),
    ({"reference": "bogus"}, "reference: Input should be 'anchor', 'twogpu' or 'none'"),
    ({"chapter": -1}, "chapter: Input should be greater than or equal to 0"),
    ({"defaults": {"model": "gpt2-xl", "mbs": 0}}, "defaults: mbs: Input should be greater than or equal to 1"),
    ({"defaults": {"colour": "red"}}, "defaults: unknown keys ['colour']"),
])
def test_a_bad_chapter_header_is_one_line(monkeypatch, tmp_path, fresh_catalog, change, needle):
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter(**change)})
    with pytest.raises(catalog.CatalogError) as e:
        catalog.catalog()
    assert needle in str(e.value) and "01-x.yaml" in str(e.value) and "\n" not in str(e.value)


def test_duplicate_chapters_ids_and_pages_are_refused_naming_both_files(monkeypatch, tmp_path, fresh_catalog):
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter(), "02-y.yaml": _chapter()})
    with pytest.raises(catalog.CatalogError, match=r"02-y.yaml: chapter 1 is also 01-x.yaml's; fix"):
        catalog.chapters()
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter(), "02-y.yaml": _chapter(2, experiments=[
        {"id": "101-x", "gpus": 1, "gbs": 1, "about": "again"}])})
    with pytest.raises(catalog.CatalogError) as e:
        catalog.catalog()
    assert "02-y.yaml and " in str(e.value) and "01-x.yaml: target id 101-x is given twice; fix" in str(e.value)
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter(), "02-y.yaml": _chapter(2, table="results/01-x.md")})
    with pytest.raises(catalog.CatalogError, match="table results/01-x.md is also 01-x.yaml's page"):
        catalog.chapters()
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter()})
    (catalog.CONFIGS / "experiments" / "01-x.yaml").write_text("chapter: 1\nchapter: 2\n")
    with pytest.raises(catalog.CatalogError, match="key 'chapter' given twice"):
        catalog.chapters()


@pytest.mark.parametrize("change, needle", [
    ({"num_layers": 0}, "num_layers: Input should be greater than or equal to 1"),
    ({"num_attention_heads": 0}, "num_attention_heads: Input should be greater than or equal to 1"),
    ({"hidden_size": 1601}, "hidden_size 1601 is not divisible by num_attention_heads 25"),
    ({"num_query_groups": 7}, "num_query_groups 7 does not divide num_attention_heads 25"),
    ({"seq_length": 4096}, "seq_length 4096 is above max_position_embeddings 1024"),
    ({"vocab_size": -1}, "vocab_size: Input should be greater than or equal to 1"),
])
def test_a_preset_out_of_range_is_one_line(monkeypatch, tmp_path, fresh_catalog, change, needle):
    presets = yaml.safe_load((ROOT / "configs" / "models.yaml").read_text())
    presets["gpt2-xl"].update(change)
    _catalog_with(monkeypatch, tmp_path, {"01-x.yaml": _chapter()}, models=presets)
    with pytest.raises(catalog.CatalogError) as e:
        catalog.models()
    assert needle in str(e.value) and str(e.value).startswith("configs/models.yaml: gpt2-xl: ")


# --------------------------------------------------------------------------- configs/bench.yaml

@pytest.mark.parametrize("old, new, needle", [
    ("\niters: 15", "\niters: 0", "iters: Input should be greater than or equal to 1"),
    ("\niters: 15", "\ncolour: red\niters: 15", "colour: unknown key"),
    ("levers: [fused_adam, foreach_norm, foreach_scale, cuda_graph]}", "levers: [fused_adam, warp_drive]}",
     "specs.megalab: unknown lever(s) ['warp_drive']"),
    ("target: 101-gpt2xl-dp1-gbs1-bf16, ref: R1}", "target: 999-nope, ref: R1}", "target '999-nope' is not a catalog"),
    ('cases: ["row 101, GBS 1"', 'cases: ["row 999"', "ablation.cases: no case named ['row 999']"),
    ("gbs: 4}", "gbs: 0}", "cases.1.gbs: Input should be greater than or equal to 1"),
    ("issue_default: [fused_adam,", "issue_default: [warp_drive, fused_adam,",
     "past_reference.beyond_catalog.issue_default: unknown lever(s) ['warp_drive']"),
    ("issue_graph: [101-gpt2xl-dp1-gbs1-bf16,", "issue_graph: [113-gpt2xl-dp1-gbs15-zero2,",
     "issue_graph: ['113-gpt2xl-dp1-gbs15-zero2'] are no goals' targets"),
    ("beyond_catalog: {min_configs: 2,", "beyond_catalog: {min_configs: 0,", "min_configs: Input should be greater"),
    ("round: [gelu_epilogue]", "round: [gelu_epilogo]", "past_reference.round: unknown lever(s) ['gelu_epilogo']"),
])
def test_bench_yaml_is_typed_at_the_door(tmp_path, old, new, needle):
    text = (ROOT / "configs" / "bench.yaml").read_text()
    assert old in text
    (tmp_path / "bench.yaml").write_text(text.replace(old, new, 1))
    with pytest.raises(benchruns.BenchConfigError) as e:
        benchruns.load_config(tmp_path / "bench.yaml")
    assert str(e.value).startswith("configs/bench.yaml: ") and needle in str(e.value) and "fix" in str(e.value)


def test_bench_report_refuses_a_case_whose_published_row_is_not_there():
    from megalab.results import benchreport

    cfg = benchruns.load_config()
    cfg["cases"][0] = {**cfg["cases"][0], "ref": "R999"}
    with pytest.raises(benchruns.BenchConfigError, match="ref R999 is no published row"):
        benchreport.checked(cfg)


# --------------------------------------------------------------------------- the reference CSVs

@pytest.mark.parametrize("damage, needle", [
    (lambda t: t[: len(t) // 2], "its last line has no newline"),
    (lambda t: t.replace("step_ms,", "", 1), "missing column(s) ['step_ms']"),
    (lambda t: t + t.splitlines(keepends=True)[1], "row 1/R1 is also line 2"),
    (lambda t: t.replace(",220,", ",lots,", 1), "column step_ms: 'lots' is not a finite number of at least 0"),
    (lambda t: t.replace(",220,", ",-5,", 1), "column step_ms: '-5' is not"),
    (lambda t: t.replace(",220,", ",inf,", 1), "column step_ms: 'inf' is not"),
    (lambda t: t.replace(",33.3,", ",nan,", 1), "column mem_gb_per_gpu: 'nan' is not"),
    (lambda t: "", "empty"),
])
def test_a_damaged_reference_csv_is_one_line(tmp_path, damage, needle):
    text = (chapter.REFERENCE_DIR / "anchor_8xh100.csv").read_text()
    (tmp_path / "anchor.csv").write_text(damage(text))
    with pytest.raises(chapter.ReferenceTableError) as e:
        chapter.load_reference(tmp_path / "anchor.csv")
    assert needle in str(e.value) and "fix: restore it" in str(e.value) and "\n" not in str(e.value)


def test_tables_refuses_a_damaged_reference_with_exit_2(tmp_path, capsys, monkeypatch):
    ref = tmp_path / "reference"
    shutil.copytree(chapter.REFERENCE_DIR, ref)
    (ref / "twogpu_2xh200.csv").write_text((ref / "twogpu_2xh200.csv").read_text().replace("437.5", "fast"))
    monkeypatch.setattr(chapter, "REFERENCE_DIR", ref)
    (tmp_path / "results" / "runs").mkdir(parents=True)
    assert main(["tables", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "twogpu_2xh200.csv: line 2, column step_ms: 'fast' is not" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- make variables and the commands around them

@pytest.mark.parametrize("name, value, needle", [
    ("MASTER_ADDR", "bad host", "not a host name or an IP address"),
    ("MASTER_ADDR", "-x", "not a host name or an IP address"),
    ("SPLIT", "a,b,c", "not up to three numbers"),
    ("REPEATS", "0", "must be at least 1"),
    ("PORT", "70000", "must be at most 65535"),
    ("WORKERS", "0", "must be at least 1"),
    ("CHAPTER", "-1", "must be at least 0"),
])
def test_variables_have_their_shape_and_range(name, value, needle):
    with pytest.raises(LaunchError) as e:
        variables.parse(name, value)
    assert needle in str(e.value) and "; fix: " in str(e.value)
    assert variables.parse("MASTER_ADDR", "node-1.cluster") == "node-1.cluster"
    assert variables.parse("SPLIT", "98,2,0") == "98,2,0"


def test_outdir_that_is_no_folder_is_refused_at_the_edge():
    with pytest.raises(LaunchError, match="OUTDIR=/dev/null: not a folder; fix"):
        variables.Options.from_env({"OUTDIR": "/dev/null"})
    with pytest.raises(LaunchError, match="unusable .*File name too long"):
        variables.Options.from_env({"OUTDIR": "x" * 5000})


@pytest.mark.parametrize("argv, env, needle", [
    (["tables", "--check"], {"STRICT": "maybe"}, "STRICT=maybe: not a yes/no value"),
    (["check"], {"STRICT": "2"}, "STRICT=2: not a yes/no value"),
])
def test_strict_is_read_as_its_variable(capsys, monkeypatch, argv, env, needle):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_refresh_of_a_damaged_folder_is_one_line(tmp_path, capsys):
    src = next(p.parent for p in sorted((ROOT / "results" / "runs").glob("*/run.json"))
               if (p.parent / "gpu_memory.csv").exists())
    shutil.copytree(src, tmp_path / "run")
    (tmp_path / "run" / "gpu_memory.csv").write_text("t_s,gpu,mem_used_mib\n0,zero,many\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text('{"target": 5}')
    assert main(["refresh", str(tmp_path / "run"), str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "gpu_memory.csv: line 2 has no GPU index" in err[0] and "target:" in err[1]
    assert all("fix:" in line for line in err)


def test_a_grep_that_is_no_regular_expression_is_one_line(capsys):
    pytest.importorskip("megatron.core")
    assert main(["arguments", "[unclosed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GREP='[unclosed' is not a regular expression" in err and "fix:" in err


def test_bench_trace_of_a_file_that_is_no_trace_is_one_line(tmp_path, capsys):
    from megalab.harness import bench

    (tmp_path / "trace.json").write_text("[1, 2]")
    for path in (tmp_path / "trace.json", tmp_path / "missing.json"):
        args = bench.argparse.Namespace(cmd="trace", file=path)
        assert bench.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "fix:" in err


def test_limits_are_generous_for_what_is_committed():
    """The limits are far above the largest committed file of each kind (a real input never meets them)."""
    import gzip

    logs = [len(gzip.decompress(p.read_bytes())) for p in ROOT.glob("results/**/logs.txt.gz")]
    recs = [p.stat().st_size for p in ROOT.glob("results/**/run.json")]
    assert max(logs) * 100 < infile.LOG_LIMIT and max(recs) * 100 < infile.RECORD_LIMIT
    assert OVER_LOG_LIMIT_MIB * infile.MiB > infile.LOG_LIMIT  # the fuzz inputs' bombs are past it
    assert max(p.stat().st_size for p in ROOT.glob("configs/**/*.*")) * 50 < infile.CONFIG_LIMIT


def test_a_catalog_ref_that_names_no_published_row_stops_make_tables(tmp_path, capsys, monkeypatch):
    import dataclasses

    cat = dict(catalog.catalog())
    first = next(e for e in cat.values() if e.ref and e.chapter == 1)
    cat[first.id] = first.model_copy(update={"ref": "R99"})
    monkeypatch.setattr(catalog, "catalog", lambda: cat)
    (tmp_path / "results" / "runs").mkdir(parents=True)
    assert main(["tables", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"configs/experiments/01-dp-zero2.yaml: {first.id}: ref R99 is no row of " \
        "chapter 1 in configs/reference/anchor_8xh100.csv; fix:" in err
    assert not (tmp_path / "results" / "01-dp-zero2.md").exists()
