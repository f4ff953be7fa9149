"""`python -m megalab prepare-data` (`make prepare-data`): a text corpus into Megatron's indexed dataset.

Megatron-LM's tools/preprocess_data.py is not in the megatron-core package; this is its equivalent,
on megatron-core's own writer. Each module holds one step, in the order the data flows:

  errors.py     DataError, the one-line error every step raises (exit status 2)
  hub.py        the Hugging Face Hub: a bounded reachability probe, loading a dataset's rows
  sources.py    --source resolved into a Source (Hub id, .jsonl/.parquet/.txt files, python-docs)
                whose documents come out in a fixed order
  tokenizer.py  --tokenizer parsed (gpt2, train:N, DIR), then loaded or trained into a Tok
  encode.py     documents to token ids ended by the end-of-document token, in worker processes
  writer.py     the .bin/.idx/.info.json on disk: names, reading the .idx, the atomic write
  splits.py     Megatron's --split arithmetic: which splits it cannot build (the launcher asks)
  pipeline.py   prepare(): the steps above tied together
  command.py    the command line: options, errors and exit codes, the summary; its docstring is
                the user's reference (--help)

The names the rest of megalab and the tests use are importable from here, each imported from its submodule
when first asked for (PEP 562): the launcher imports this package for split_problem alone, and a run on
mock data never loads numpy or a tokenizer.
"""
from __future__ import annotations

import importlib

_FROM = {  # name -> the submodule that defines it
    "cli": "command", "make_vars": "command", "summary": "command",
    "FIX_LOCAL": "errors", "INSTALL_DATA": "errors", "DataError": "errors",
    "HUB_PARQUET_REVISION": "hub",
    "DEFAULT_OUT_DIR": "pipeline", "Result": "pipeline", "default_prefix": "pipeline", "prepare": "pipeline",
    "DEFAULT_SOURCE": "sources", "LOCAL_EXTS": "sources", "Source": "sources", "resolve_source": "sources",
    "DEFAULT_SPLIT": "splits", "SUGGEST_SEQ_LEN": "splits", "safe_split": "splits", "split_documents": "splits",
    "split_problem": "splits", "split_ranges": "splits", "split_samples": "splits", "suggested_split": "splits",
    "EOD_TOKEN": "tokenizer", "GPT2_HUB_REPO": "tokenizer", "Tok": "tokenizer", "TokenizerSpec": "tokenizer",
    "SUFFIX": "writer", "Paths": "writer", "document_tokens": "writer", "finished": "writer",
    "read_idx_header": "writer",
}
__all__ = sorted(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM))
