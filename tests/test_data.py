"""Tests for megalab/harness/data/ (`python -m megalab prepare-data`): CPU only, no network.

The corpus is tests/fixtures/corpus/founding-documents.jsonl (55 public-domain documents, see the
README there), tokenized with a byte-level BPE of 512 tokens trained on it (`train:512`), so
nothing is downloaded. What is written is read back through Megatron's own readers
(IndexedDataset, GPTDataset built by BlendedMegatronDatasetBuilder).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="prepare-data needs the `data` extra: pip install -e '.[data]'")

from megalab.harness import data  # noqa: E402
from megalab.harness.data import hub, tokenizer, writer  # noqa: E402
from megalab._compat import ensure_typing_override  # noqa: E402

ensure_typing_override()

CORPUS = Path(__file__).parent / "fixtures" / "corpus" / "founding-documents.jsonl"
DOCS = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
SEQ = 64


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = data.cli(["--quiet", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _leftovers(folder: Path) -> list[str]:
    """Temporary files or folders of prepare-data left in folder."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture corpus tokenized once with train:512 and 2 worker processes."""
    out = tmp_path_factory.mktemp("prepared")
    res = data.prepare(source=str(CORPUS), tokenizer="train:512", out=str(out / "fd"), workers=2,
                       quiet=True)
    return res


@pytest.fixture(scope="module")
def hf_tok(built):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(built.info["tokenizer_dir"], "tokenizer.json"))


# ---- the build and Megatron's readers -----------------------------------------------------------
def test_build_writes_bin_idx_tokenizer_and_summary(built):
    p = built.paths
    assert not built.skipped
    assert os.path.isfile(p.bin) and os.path.isfile(p.idx) and os.path.isfile(p.info)
    info = built.info
    assert info["documents"] == len(DOCS) == 55
    assert info["vocab_size"] == 512 and info["eod_token"] == "<|endoftext|>" and info["eod_id"] == 0
    assert info["dtype"] == "uint16" and os.path.getsize(p.bin) == 2 * info["tokens"]
    tok_dir = Path(info["tokenizer_dir"])
    assert tok_dir == Path(p.prefix + "-tokenizer")
    assert {f.name for f in tok_dir.iterdir()} == {"tokenizer.json", "tokenizer_config.json",
                                                  "vocab.json", "merges.txt"}
    assert _leftovers(Path(p.prefix).parent) == []
    text = data.summary(built)
    assert "55 documents" in text and f"{info['tokens']:,} tokens" in text
    assert p.bin in text and p.idx in text
    assert f"DATA={p.data} TOKENIZER_MODEL={tok_dir} SPLIT=98,2,0" in text  # 55 docs: see safe_split


def test_indexed_dataset_round_trip(built, hf_tok):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(built.paths.data)
    assert len(ds) == 55 and ds.document_indices.tolist() == list(range(56))
    assert int(ds.sequence_lengths.sum()) == built.info["tokens"]
    for i, text in enumerate(DOCS):
        ids = ds[i]
        assert ids[-1] == 0 and 0 not in ids[:-1]          # one EOD, at the document's end
        assert hf_tok.decode(ids[:-1].tolist()) == text     # byte-level BPE is lossless


def test_gpt2_style_vocab_merges_encode_identically(built, hf_tok):
    """vocab.json/merges.txt (what GPT-2-style loaders read) give the same ids as tokenizer.json."""
    info = built.info
    gpt2_style = tokenizer._bytelevel_bpe(info["vocab_file"], info["merge_file"])
    for text in DOCS[:10]:
        assert gpt2_style.encode(text).ids == hf_tok.encode(text).ids


def test_megatron_hf_tokenizer_reads_the_folder(built, hf_tok):
    """The training side: --tokenizer-type HuggingFaceTokenizer --tokenizer-model <folder>."""
    pytest.importorskip("transformers", reason="Megatron's HuggingFaceTokenizer needs transformers")
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer

    t = HuggingFaceTokenizer(built.info["tokenizer_dir"])
    assert t.vocab_size == 512 and t.eod == 0
    assert t.text_to_ids(DOCS[0]) == hf_tok.encode(DOCS[0]).ids


class _Tok:  # what GPTDataset needs of a tokenizer
    vocab_size = 512
    eod = 0
    unique_identifiers = {"class": "_Tok", "vocab_size": 512, "eod": 0}  # for its cache key


def _gpt_datasets(prefix: str, split: str, cache: Path):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=SEQ, blend=([prefix], None), split=split,
        path_to_cache=str(cache), tokenizer=_Tok(), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()


def test_gpt_dataset_samples_eod_and_split(built, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    train, valid, test = _gpt_datasets(built.paths.data, "949,50,1", tmp_path)
    # Megatron splits by document: round(.949 * 55) = 52 train, 3 valid, round(.001 * 55) = 0 test.
    assert train.indices.tolist() == list(range(52))
    assert valid.indices.tolist() == [52, 53, 54]
    assert test is None or len(test.indices) == 0
    indexed = IndexedDataset(built.paths.data)  # keep it: its arrays are views of its mmaps
    lengths = indexed.sequence_lengths
    for ds, docs in ((train, range(52)), (valid, range(52, 55))):
        tokens = int(lengths[list(docs)].sum())
        assert len(ds) == (tokens - 1) // SEQ  # one epoch, the extra label token, last partial dropped

    docs = [np.array(indexed[i][:-1], dtype=np.int64) for i in range(55)]
    as_bytes = [d.tobytes() for d in docs]
    crossings = inside = 0
    for i in range(len(train)):
        s = train[i]
        assert s["tokens"].shape == (SEQ,) and s["labels"].shape == (SEQ,)
        assert s["loss_mask"].shape == (SEQ,) and s["position_ids"].shape == (SEQ,)
        assert s["tokens"][1:].tolist() == s["labels"][:-1].tolist()
        window = np.concatenate([s["tokens"].numpy()[:1], s["labels"].numpy()]).astype(np.int64)
        # EODs sit exactly at document ends: every run between two EODs is a whole document,
        # the first run ends some document and the last one starts some document.
        pieces = np.split(window, np.flatnonzero(window == 0))
        pieces = [pieces[0]] + [p[1:] for p in pieces[1:]]
        first, *middle, last = pieces if len(pieces) > 1 else (pieces[0], pieces[0])
        for piece in middle:
            assert piece.tobytes() in as_bytes
        if len(pieces) > 1:
            crossings += 1
            assert any(d.tobytes().endswith(first.tobytes()) for d in docs)
            assert any(d.tobytes().startswith(last.tobytes()) for d in docs)
        else:  # no EOD in the window: a stretch inside one document
            inside += 1
            assert any(first.tobytes() in d.tobytes() for d in docs)
    assert crossings >= 40 and inside > 0  # 52 documents: most of their ends fall inside a sample


def test_gpt_dataset_three_way_split(built, tmp_path):
    train, valid, test = _gpt_datasets(built.paths.data, "80,15,5", tmp_path)
    # round(.80 * 55) = 44, round(.95 * 55) = 52: 44 / 8 / 3 documents
    assert [len(d.indices) for d in (train, valid, test)] == [44, 8, 3]
    assert len(train) > 0 and len(valid) > 0 and len(test) > 0


def test_split_samples_match_megatron_and_split_problem_names_the_fix(built, tmp_path):
    """The counts the launcher checks are Megatron's own: GPTDataset lengths for one epoch."""
    tokens = data.document_tokens(built.paths.idx)
    assert len(tokens) == 55 and int(tokens.sum()) == built.info["tokens"]
    got = data.split_samples("80,15,5", tokens, SEQ)
    assert got == [len(d) for d in _gpt_datasets(built.paths.data, "80,15,5", tmp_path)]
    # A sequence longer than the 3 test documents together: Megatron builds an empty GPTDataset
    # and stops at "no sample to consume: 0"; the launcher says so first, with a split that works.
    long_seq = int(tokens[52:].sum())
    assert data.split_samples("80,15,5", tokens, long_seq)[2] == 0
    msg = data.split_problem(built.paths.data, "80,15,5", long_seq)
    assert f"SPLIT=80,15,5 leaves the validation split 8 document(s), less than one {long_seq}-token" in msg
    assert msg.endswith("fix: SPLIT=100,0,0")  # all 55 documents in training
    assert data.split_problem(built.paths.data, "100,0,0", long_seq) is None
    assert data.split_problem(built.paths.data, "98,2,0", SEQ) is None
    assert "no documents" in data.split_problem(built.paths.data, "949,50,1", SEQ)  # 0 test docs: the hang
    assert "not a readable dataset index" in data.split_problem(str(tmp_path / "nothing"), "98,2,0", SEQ)


# ---- finished, --force, atomic writes -----------------------------------------------------------
def _copy_built(built, tmp_path: Path) -> str:
    """A private copy of the built dataset (tests below modify it)."""
    src = Path(built.paths.prefix)
    for p in src.parent.iterdir():
        dst = tmp_path / p.name
        (shutil.copytree if p.is_dir() else shutil.copyfile)(p, dst)
    out = str(tmp_path / src.name)
    info = json.loads(Path(out + "_text_document.info.json").read_text())
    info["tokenizer_dir"] = out + "-tokenizer"
    Path(out + "_text_document.info.json").write_text(json.dumps(info))
    return out


def test_finished_dataset_is_not_rebuilt(built, tmp_path, capsys, monkeypatch):
    out = _copy_built(built, tmp_path)
    monkeypatch.setattr(writer, "builder_class", lambda: pytest.fail("rebuilt a finished dataset"))
    rc, stdout, _ = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:512", "--out", out)
    assert rc == 0 and "already prepared" in stdout and "55 documents" in stdout


def test_force_rebuilds(built, tmp_path, capsys):
    out = _copy_built(built, tmp_path)
    before = json.loads(Path(out + "_text_document.info.json").read_text())
    os.utime(out + "_text_document.idx", (0, 0))
    rc, stdout, _ = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:512", "--out", out,
                         "--workers", "1", "--force")
    assert rc == 0 and "done in" in stdout
    assert os.path.getmtime(out + "_text_document.idx") > 0
    after = json.loads(Path(out + "_text_document.info.json").read_text())
    assert after["tokens"] == before["tokens"] and after["workers"] == 1
    assert _leftovers(tmp_path) == []


def test_missing_tokenizer_folder_means_not_finished(built, tmp_path):
    out = _copy_built(built, tmp_path)
    assert data.finished(data.Paths(out)) is not None
    shutil.rmtree(out + "-tokenizer")
    assert data.finished(data.Paths(out)) is None


def test_damaged_idx_is_rebuilt_without_force(built, tmp_path, capsys):
    out = _copy_built(built, tmp_path)
    idx = out + "_text_document.idx"
    Path(idx).write_bytes(Path(idx).read_bytes()[:-8])  # truncated
    assert data.finished(data.Paths(out)) is None
    rc, stdout, _ = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:512", "--out", out,
                         "--workers", "1")
    assert rc == 0 and "done in" in stdout and data.finished(data.Paths(out)) is not None


def test_another_dataset_under_the_prefix_needs_force(built, tmp_path, capsys):
    out = _copy_built(built, tmp_path)
    rc, _, err = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:600", "--out", out)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "hold another dataset" in err and "--force" in err


class _Crash(RuntimeError):
    pass


def _crash_after(monkeypatch, n: int, exc: type[BaseException] = _Crash) -> None:
    """Make megatron-core's builder fail after n documents, as a crash mid-write would."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    real = IndexedDatasetBuilder.add_document
    calls = {"n": 0}

    def add_document(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > n:
            raise exc("simulated crash mid-write")
        return real(self, *a, **k)

    monkeypatch.setattr(IndexedDatasetBuilder, "add_document", add_document)


def test_crash_mid_write_leaves_no_final_files(tmp_path, monkeypatch):
    _crash_after(monkeypatch, 10)
    with pytest.raises(_Crash):
        data.prepare(source=str(CORPUS), tokenizer="train:300", out=str(tmp_path / "x"), workers=1,
                     quiet=True)
    assert list(tmp_path.iterdir()) == []  # no .bin/.idx/.info.json, no tokenizer, no temporaries


def test_interrupt_with_pool_leaves_no_files(tmp_path, monkeypatch, capsys):
    _crash_after(monkeypatch, 5, KeyboardInterrupt)
    rc, _, err = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:300",
                      "--out", str(tmp_path / "x"), "--workers", "2")
    assert rc == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_crash_during_force_keeps_the_old_dataset(built, tmp_path, monkeypatch):
    out = _copy_built(built, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    _crash_after(monkeypatch, 20)
    with pytest.raises(_Crash):
        data.prepare(source=str(CORPUS), tokenizer="train:512", out=out, workers=1, force=True,
                     quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert data.finished(data.Paths(out))["documents"] == 55


def test_stale_temporaries_of_dead_runs_are_removed(tmp_path):
    stale = tmp_path / ".x_text_document.999999999.bin.tmp"    # a run killed with SIGKILL
    stale.write_bytes(b"half")
    stale_dir = tmp_path / ".x-tokenizer.999999999.dir.tmp"
    stale_dir.mkdir()
    (stale_dir / "vocab.json").write_text("{}")
    other = tmp_path / ".y_text_document.999999999.bin.tmp"    # another prefix's: not ours
    other.write_bytes(b"half")
    data.prepare(source=str(CORPUS), tokenizer="train:300", out=str(tmp_path / "x"), workers=1,
                 limit_docs=3, quiet=True)
    assert not stale.exists() and not stale_dir.exists() and other.exists()
    assert _leftovers(tmp_path) == [other.name]


# ---- sources and tokenizers ---------------------------------------------------------------------
def test_limit_docs_and_default_prefix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, stdout, _ = _run(capsys, "--source", str(CORPUS), "--tokenizer", "train:300",
                         "--limit-docs", "7", "--workers", "1")
    assert rc == 0 and "7 documents" in stdout
    prefix = os.path.join("data", "founding-documents-bpe300")
    assert f"DATA={prefix}_text_document TOKENIZER_MODEL={prefix}-tokenizer" in stdout
    assert data.finished(data.Paths(prefix))["documents"] == 7


def test_tokenizer_folder_txt_and_parquet_sources_match_jsonl(built, tmp_path, capsys):
    """The same documents as .txt files (one per file) or parquet give the same tokens."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    txt_dir = tmp_path / "txt"
    txt_dir.mkdir()
    for i, text in enumerate(DOCS):
        (txt_dir / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    pq.write_table(pa.table({"text": DOCS}), tmp_path / "corpus.parquet")
    tok_dir = built.info["tokenizer_dir"]
    want = Path(built.paths.bin).read_bytes()
    for name, source in (("from-txt", str(txt_dir / "*.txt")), ("from-pq", str(tmp_path / "corpus.parquet"))):
        rc, stdout, err = _run(capsys, "--source", source, "--tokenizer", tok_dir,
                               "--out", str(tmp_path / name), "--workers", "1")
        assert rc == 0, err
        assert f"TOKENIZER_MODEL={tok_dir}" in stdout
        assert Path(tmp_path / f"{name}_text_document.bin").read_bytes() == want


def test_single_txt_file_is_split_at_blank_lines(built, tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("First paragraph,\nstill first.\n\nSecond.\n \n\n\nThird.\n", encoding="utf-8")
    res = data.prepare(source=str(book), tokenizer=built.info["tokenizer_dir"],
                       out=str(tmp_path / "b"), workers=1, quiet=True)
    assert res.info["documents"] == 3
    res = data.prepare(source=str(book), tokenizer=built.info["tokenizer_dir"],
                       out=str(tmp_path / "w"), workers=1, txt_docs="file", quiet=True)
    assert res.info["documents"] == 1


# ---- bad input: one line, exit 2 ----------------------------------------------------------------
def _one_line_error(capsys, tmp_path: Path, *argv: str) -> str:
    rc, stdout, err = _run(capsys, *argv, "--out", str(tmp_path / "out" / "x"), "--workers", "1")
    assert rc == 2, (stdout, err)
    assert len(err.strip().splitlines()) == 1, err
    if (tmp_path / "out").exists():  # nothing written, not even temporaries
        assert list((tmp_path / "out").iterdir()) == []
    return err


def test_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = _one_line_error(capsys, tmp_path, "--source", str(empty), "--tokenizer", "train:300")
    assert "no documents with text" in err


def test_blank_documents_only(tmp_path, capsys):
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": ""}\n{"text": "  \\n"}\n')
    err = _one_line_error(capsys, tmp_path, "--source", str(blank), "--tokenizer", "train:300")
    assert "no documents with text" in err and "2 empty" in err


def test_invalid_json_line_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": t}) for t in DOCS[:4]]
    lines.insert(2, '{"text": "unterminated')
    bad.write_text("\n".join(lines) + "\n")
    err = _one_line_error(capsys, tmp_path, "--source", str(bad), "--tokenizer", "train:300")
    assert f"{bad}:3: invalid JSON" in err


def test_missing_text_field(tmp_path, capsys):
    bad = tmp_path / "body.jsonl"
    bad.write_text('{"body": "text under another name"}\n')
    err = _one_line_error(capsys, tmp_path, "--source", str(bad), "--tokenizer", "train:300")
    assert "no 'text' field (has: body)" in err and "--text-key" in err


def test_text_key_option(tmp_path):
    src = tmp_path / "body.jsonl"
    src.write_text('{"body": "We the People"}\n{"body": "of the United States"}\n')
    res = data.prepare(source=str(src), tokenizer="train:300", out=str(tmp_path / "k"), workers=1,
                       text_key="body", quiet=True)
    assert res.info["documents"] == 2


def test_unreadable_and_columnless_parquet(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet at all")
    err = _one_line_error(capsys, tmp_path, "--source", str(junk), "--tokenizer", "train:300")
    assert "unreadable parquet" in err
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"content": ["a", "b"]}), other)
    err = _one_line_error(capsys, tmp_path, "--source", str(other), "--tokenizer", "train:300")
    assert "no 'text' column (has: content)" in err


def test_no_matching_files_and_bad_tokenizer(tmp_path, capsys):
    err = _one_line_error(capsys, tmp_path, "--source", str(tmp_path / "*.jsonl"))
    assert "no file matches" in err
    err = _one_line_error(capsys, tmp_path, "--source", str(CORPUS), "--tokenizer", "train:100")
    assert "N must be an integer >= 257" in err
    err = _one_line_error(capsys, tmp_path, "--source", str(CORPUS), "--tokenizer", str(tmp_path))
    assert "not gpt2, train:N, nor a folder with tokenizer.json" in err


# ---- the Hub, offline ---------------------------------------------------------------------------
@pytest.fixture
def online_env(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)


def test_hub_load_failure_is_one_line_naming_the_fix(tmp_path, capsys, monkeypatch, online_env):
    def offline_loader(name, split):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(hub, "reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(hub, "load_dataset", offline_loader)
    err = _one_line_error(capsys, tmp_path, "--tokenizer", "train:300")  # default --source
    assert "stas/openwebtext-10k" in err and "ConnectionError" in err
    assert "--source path/to/*.jsonl|*.parquet|*.txt" in err


def test_unreachable_hub_fails_before_loading(tmp_path, capsys, monkeypatch, online_env):
    monkeypatch.setattr(hub, "reachable", lambda timeout=5.0: False)
    monkeypatch.setattr(hub, "load_dataset", lambda *a: pytest.fail("tried the network"))
    err = _one_line_error(capsys, tmp_path, "--source", "stas/openwebtext-10k",
                          "--tokenizer", "train:300")
    assert "cannot reach the Hugging Face Hub" in err and "--source path/to/" in err
    # GPT-2's BPE files: same, naming the tokenizer fixes
    err = _one_line_error(capsys, tmp_path, "--source", str(CORPUS), "--tokenizer", "gpt2")
    assert "GPT-2's vocab.json/merges.txt" in err and "--tokenizer train:N" in err


def test_reachability_probe_is_bounded(monkeypatch, online_env):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # loopback, nothing listens
    t0 = time.monotonic()
    assert hub.reachable(timeout=2.0) is False
    assert time.monotonic() - t0 < 3.0


def test_hub_dataset_rows_flow_through(tmp_path, monkeypatch, online_env):
    class Rows(list):  # the part of datasets.Dataset prepare-data uses
        column_names = ["text", "meta"]

        def select_columns(self, cols):
            return [{"text": r["text"]} for r in self]

    monkeypatch.setattr(hub, "reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(hub, "load_dataset", lambda name, split: Rows({"text": t, "meta": 0} for t in DOCS))
    monkeypatch.chdir(tmp_path)
    res = data.prepare(tokenizer="train:300", workers=1, limit_docs=20, quiet=True)
    assert res.paths.prefix == os.path.join("data", "openwebtext-10k-bpe300")
    assert res.info["documents"] == 20 and res.info["source"] == "hub:stas/openwebtext-10k"

    Rows.column_names = ["content"]
    with pytest.raises(data.DataError, match="no 'text' column \\(has: content\\)"):
        data.prepare(tokenizer="train:300", out="data/other", workers=1, quiet=True)


def test_gpt2_with_local_vocab_and_merges(built, tmp_path):
    """--tokenizer gpt2 --vocab-file/--merge-file: no download, and a tokenizer folder is saved."""
    info = built.info
    res = data.prepare(source=str(CORPUS), tokenizer="gpt2", vocab_file=info["vocab_file"],
                       merge_file=info["merge_file"], out=str(tmp_path / "g"), workers=1, quiet=True)
    assert Path(res.paths.bin).read_bytes() == Path(built.paths.bin).read_bytes()
    assert res.info["tokenizer_dir"] == str(tmp_path / "g-tokenizer")
    assert "VOCAB_FILE=" in data.summary(res)


def test_gpt2_files_are_downloaded_once_into_the_output_folder(built, tmp_path, monkeypatch,
                                                              online_env):
    """--tokenizer gpt2 without files: fetched from the Hub (mocked here) into data/, then reused."""
    hf_hub = pytest.importorskip("huggingface_hub")
    info = built.info
    fetched = []

    def fake_download(repo, filename, **kw):
        fetched.append((repo, filename))
        return info["vocab_file"] if filename == "vocab.json" else info["merge_file"]

    monkeypatch.setattr(hf_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(hub, "reachable", lambda timeout=5.0: True)
    monkeypatch.chdir(tmp_path)
    res = data.prepare(source=str(CORPUS), tokenizer="gpt2", workers=1, quiet=True)
    assert fetched == [("openai-community/gpt2", "vocab.json"), ("openai-community/gpt2", "merges.txt")]
    assert res.paths.prefix == os.path.join("data", "founding-documents")
    assert os.path.isfile("data/gpt2-vocab.json") and os.path.isfile("data/gpt2-merges.txt")
    monkeypatch.setattr(hub, "reachable", lambda timeout=5.0: False)  # now offline
    res = data.prepare(source=str(CORPUS), tokenizer="gpt2", out="data/again", workers=1, quiet=True)
    assert len(fetched) == 2 and res.info["documents"] == 55


def test_split_documents_matches_megatron_and_safe_split():
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    for split in ("949,50,1", "98,2,0", "80,15,5", "100,0,0", "1,1,1"):
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        for n in range(1, 1200):
            want = [None if m is None else int(round(m[1] * float(n))) - int(round(m[0] * float(n)))
                    for m in matrix]
            assert data.split_documents(split, n) == want, (split, n)
    assert data.safe_split(10_000) == "949,50,1"   # openwebtext-10k: 9490 / 500 / 10
    assert data.safe_split(501) == "949,50,1" and data.safe_split(500) == "98,2,0"  # test: 1 / 0 docs
    assert data.safe_split(55) == "98,2,0" and data.safe_split(10) == "100,0,0"
    for n in range(1, 1200):
        assert all(c is None or c > 0 for c in data.split_documents(data.safe_split(n), n))
