"""The tokenizer: --tokenizer parsed once (TokenizerSpec), then loaded or trained into a Tok.

  gpt2     GPT-2's byte-level BPE from vocab.json/merges.txt (given, found in the output folder, or
           downloaded from the Hub into it once).
  train:N  a byte-level BPE of N tokens trained on the corpus itself: nothing to download.
  DIR      a local Hugging Face tokenizer folder, used where it is.

gpt2 and train:N are saved beside the data as a Hugging Face folder (<prefix>-tokenizer/:
tokenizer.json, tokenizer_config.json, vocab.json, merges.txt), first under a temporary name that
the writer renames with the dataset: training then reads the exact tokenizer that wrote the data,
offline, through Megatron's HuggingFaceTokenizer. Every document ends with the end-of-document
token (GPT-2's <|endoftext|>, or DIR's eos_token).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from megalab.harness.data.errors import INSTALL_DATA, DataError, first_line
from megalab.harness.data.hub import check_reachable

EOD_TOKEN = "<|endoftext|>"
GPT2_HUB_REPO = "openai-community/gpt2"


@dataclass(frozen=True)
class TokenizerSpec:
    """--tokenizer, parsed: gpt2, train:N or a folder."""
    text: str                # as given
    kind: str                # "gpt2" | "train" | "dir"
    n: int | None = None     # train:N's N

    @classmethod
    def parse(cls, spec: str) -> TokenizerSpec:
        if spec == "gpt2":
            return cls(spec, "gpt2")
        if not spec.startswith("train:"):
            return cls(spec, "dir")
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 257:
            raise DataError(f"--tokenizer {spec}: N must be an integer >= 257 "
                            f"(256 byte tokens + {EOD_TOKEN}); e.g. train:8192")
        return cls(spec, "train", n)

    @property
    def key(self) -> str:
        """Its identity in .info.json: a folder by its absolute path."""
        return os.path.abspath(self.text) if self.kind == "dir" else self.text

    @property
    def tag(self) -> str:
        """What the default output prefix adds to the source's name: -bpeN, -<folder name>."""
        if self.kind == "gpt2":
            return ""
        if self.kind == "train":
            return "-bpe" + self.text.split(":", 1)[1]
        return "-" + Path(os.path.abspath(self.text)).name.removesuffix("-tokenizer")


@dataclass
class Tok:
    """A loaded tokenizer, and what .info.json and the summary record of it."""
    spec: str                     # as requested: gpt2 | train:N | DIR
    tokenizer: object             # a tokenizers.Tokenizer
    eod_id: int
    eod_token: str
    vocab_size: int
    vocab_file: str | None = None
    merge_file: str | None = None
    model_dir: str | None = None  # a local HF tokenizer folder (HuggingFaceTokenizer)
    staged_dir: str | None = None  # a saved tokenizer's temporary folder, committed with the data


def load_tokenizer(spec: TokenizerSpec, texts: Iterable[str], final_dir: Path, staged_dir: Path,
                   out_dir: Path, vocab_file: str | None = None, merge_file: str | None = None) -> Tok:
    """The Tok spec asks for. train:N reads texts (the corpus) once; gpt2 and train:N save their
    folder to staged_dir, which becomes final_dir when the dataset is committed."""
    if spec.kind == "train":
        return _train_tokenizer(spec.n, iter(texts), final_dir, staged_dir)
    if spec.kind == "gpt2":
        return _gpt2_tokenizer(vocab_file, merge_file, out_dir, final_dir, staged_dir)
    if vocab_file or merge_file:
        raise DataError("--vocab-file/--merge-file go with --tokenizer gpt2")
    return _dir_tokenizer(spec.text)


def import_tokenizers():
    """The `tokenizers` package, or a DataError saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"tokenizing needs the `tokenizers` package; {INSTALL_DATA}") from None
    return tokenizers


def _bytelevel_bpe(vocab_file: str, merge_file: str):
    """GPT-2's tokenizer from vocab.json/merges.txt, exactly as GPT2TokenizerFast builds it."""
    tk = import_tokenizers()
    try:
        impl = tk.ByteLevelBPETokenizer(vocab_file, merge_file, add_prefix_space=False)
    except Exception as e:
        raise DataError(f"cannot read GPT-2 BPE files {vocab_file}, {merge_file} ({first_line(e)})") from None
    return impl._tokenizer


def _gpt2_tokenizer(vocab_file: str | None, merge_file: str | None, out_dir: Path,
                    final_dir: Path, staged_dir: Path) -> Tok:
    if bool(vocab_file) != bool(merge_file):
        raise DataError("--vocab-file and --merge-file go together; fix: pass both")
    if not vocab_file:
        vocab_file, merge_file = str(out_dir / "gpt2-vocab.json"), str(out_dir / "gpt2-merges.txt")
        if not (os.path.isfile(vocab_file) and os.path.isfile(merge_file)):
            _download_gpt2(out_dir, vocab_file, merge_file)
    for f in (vocab_file, merge_file):
        if not os.path.isfile(f):
            raise DataError(f"{f}: no such file")
    tok = _bytelevel_bpe(vocab_file, merge_file)
    eod = tok.token_to_id(EOD_TOKEN)
    if eod is None:
        raise DataError(f"{vocab_file}: no {EOD_TOKEN} token, so not GPT-2's vocabulary")

    def copy_bpe_files(folder: Path) -> None:
        shutil.copyfile(vocab_file, folder / "vocab.json")
        shutil.copyfile(merge_file, folder / "merges.txt")

    return _staged("gpt2", tok, eod, copy_bpe_files, final_dir, staged_dir)


def _train_tokenizer(n: int, texts: Iterable[str], final_dir: Path, staged_dir: Path) -> Tok:
    """A byte-level BPE of n tokens (256 bytes + <|endoftext|> + merges) on the corpus itself."""
    tk = import_tokenizers()
    impl = tk.ByteLevelBPETokenizer(add_prefix_space=False)
    impl.train_from_iterator(texts, vocab_size=n, min_frequency=2, show_progress=False,
                             special_tokens=[EOD_TOKEN])
    tok = impl._tokenizer
    return _staged(f"train:{n}", tok, tok.token_to_id(EOD_TOKEN),
                   lambda folder: impl.save_model(str(folder)), final_dir, staged_dir)


def _staged(spec: str, tok, eod: int, write_bpe_files, final_dir: Path, staged_dir: Path) -> Tok:
    """A GPT-2-style tokenizer saved to a fresh staged_dir: write_bpe_files(folder) puts
    vocab.json/merges.txt there (--tokenizer-type GPT2BPETokenizer --vocab-file --merge-file read
    them), _save_hf_folder the files AutoTokenizer reads. The Tok names the final folder."""
    shutil.rmtree(staged_dir, ignore_errors=True)
    staged_dir.mkdir(parents=True)
    write_bpe_files(staged_dir)
    _save_hf_folder(tok, staged_dir)
    return Tok(spec, tok, eod, EOD_TOKEN, tok.get_vocab_size(with_added_tokens=True),
               vocab_file=str(final_dir / "vocab.json"), merge_file=str(final_dir / "merges.txt"),
               model_dir=str(final_dir), staged_dir=str(staged_dir))


def _save_hf_folder(tok, folder: Path) -> None:
    """tokenizer.json + tokenizer_config.json: a folder AutoTokenizer (Megatron's
    HuggingFaceTokenizer, --tokenizer-model) loads offline, with <|endoftext|> as eos/eod."""
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "GPT2TokenizerFast", "bos_token": EOD_TOKEN, "eos_token": EOD_TOKEN,
              "unk_token": EOD_TOKEN, "add_prefix_space": False, "model_max_length": 1_000_000_000}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


def _download_gpt2(out_dir: Path, vocab_file: str, merge_file: str) -> None:
    """GPT-2's vocab.json/merges.txt from the Hub into out_dir (under temporary names, renamed),
    where the next run finds them."""
    check_reachable("GPT-2's vocab.json/merges.txt",
                    fix="--vocab-file/--merge-file (local GPT-2 files), --tokenizer train:N "
                        "(a BPE trained on the corpus)")
    try:
        from huggingface_hub import hf_hub_download

        got = [hf_hub_download(GPT2_HUB_REPO, f) for f in ("vocab.json", "merges.txt")]
    except ImportError:
        raise DataError(f"downloading GPT-2's BPE needs huggingface_hub; {INSTALL_DATA}") from None
    except Exception as e:
        raise DataError(f"cannot download GPT-2's BPE from the Hub ({first_line(e)}); fix: "
                        f"--vocab-file/--merge-file, or --tokenizer train:N") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for src, dst in zip(got, (vocab_file, merge_file)):
        tmp = f"{dst}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def _dir_tokenizer(path: str) -> Tok:
    """A local Hugging Face tokenizer (a folder with tokenizer.json or vocab.json + merges.txt, or
    a tokenizer.json itself); its end of document is its eos_token, else a usual name for one."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    tk = import_tokenizers()
    tj = p / "tokenizer.json" if p.is_dir() else p
    vocab, merges = p / "vocab.json", p / "merges.txt"
    if tj.is_file():
        try:
            tok = tk.Tokenizer.from_file(str(tj))
        except Exception as e:
            raise DataError(f"{tj}: not a Hugging Face tokenizer.json ({first_line(e)})") from None
    elif p.is_dir() and vocab.is_file() and merges.is_file():
        tok = _bytelevel_bpe(str(vocab), str(merges))
    else:
        raise DataError(f"tokenizer '{path}' is not gpt2, train:N, nor a folder with tokenizer.json "
                        f"(or vocab.json + merges.txt)")
    candidates = []
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            eos = json.loads(cfg.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            candidates.append(eos)
    candidates += [EOD_TOKEN, "</s>", "<eos>", "<|end_of_text|>"]
    for token in candidates:
        eod = tok.token_to_id(token)
        if eod is not None:
            break
    else:
        raise DataError(f"tokenizer '{path}' has no end-of-document token (eos_token in "
                        f"tokenizer_config.json, {EOD_TOKEN} or </s>)")
    gpt2_files = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    return Tok(path, tok, eod, token, tok.get_vocab_size(with_added_tokens=True),
               vocab_file=str(folder / "vocab.json") if gpt2_files else None,
               merge_file=str(folder / "merges.txt") if gpt2_files else None, model_dir=str(folder))
