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

The names the rest of megalab and the tests use are importable from here.
"""
from megalab.harness.data.command import cli, make_vars, summary
from megalab.harness.data.errors import FIX_LOCAL, INSTALL_DATA, DataError
from megalab.harness.data.hub import HUB_PARQUET_REVISION
from megalab.harness.data.pipeline import DEFAULT_OUT_DIR, Result, default_prefix, prepare
from megalab.harness.data.sources import DEFAULT_SOURCE, LOCAL_EXTS, Source, resolve_source
from megalab.harness.data.splits import (
    DEFAULT_SPLIT,
    SUGGEST_SEQ_LEN,
    safe_split,
    split_documents,
    split_problem,
    split_ranges,
    split_samples,
    suggested_split,
)
from megalab.harness.data.tokenizer import EOD_TOKEN, GPT2_HUB_REPO, Tok, TokenizerSpec
from megalab.harness.data.writer import SUFFIX, Paths, document_tokens, finished, read_idx_header

__all__ = [
    "DEFAULT_OUT_DIR", "DEFAULT_SOURCE", "DEFAULT_SPLIT", "EOD_TOKEN", "FIX_LOCAL", "GPT2_HUB_REPO",
    "HUB_PARQUET_REVISION", "INSTALL_DATA", "LOCAL_EXTS", "SUFFIX", "SUGGEST_SEQ_LEN",
    "DataError", "Paths", "Result", "Source", "Tok", "TokenizerSpec",
    "cli", "default_prefix", "document_tokens", "finished", "make_vars", "prepare", "read_idx_header",
    "resolve_source", "safe_split", "split_documents", "split_problem", "split_ranges", "split_samples",
    "suggested_split", "summary",
]
