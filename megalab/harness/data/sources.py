"""Where the documents come from: --source resolved once into a Source, which yields their texts.

A Source is a Hub dataset id (its `text` column), local files (a file, a glob or a folder of .jsonl,
.parquet and .txt) or `python-docs`, Python's own documentation, there wherever Python runs. Each
reader turns its format's faults (invalid JSON, a missing column, bytes that are not UTF-8) into a
one-line DataError that names the file, the line where there is one, and the fix. Documents come
out in a fixed order (files sorted), so the same corpus always gives the same dataset.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from megalab.harness.data.errors import FIX_LOCAL, INSTALL_DATA, DataError, first_line
from megalab.harness.data.hub import load_rows

DEFAULT_SOURCE = "stas/openwebtext-10k"
LOCAL_EXTS = (".jsonl", ".parquet", ".txt")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Source:
    spec: str                    # as given
    key: str                     # the identity recorded in .info.json (absolute for local files)
    name: str                    # for the default output prefix
    hub: bool = False
    files: list[Path] = field(default_factory=list)
    text_key: str = "text"
    txt_docs: str = "auto"
    _hub_rows: object = None     # the loaded datasets.Dataset, loaded once
    builtin: bool = False        # python-docs

    def load(self) -> None:
        """A Hub source's rows, loaded now (downloaded or read from the HF cache) and kept, so
        that an offline Hub is reported before anything else is done; nothing for other sources."""
        if self.hub and self._hub_rows is None:
            self._hub_rows = load_rows(self.spec, self.text_key)

    def total(self) -> int | None:
        """Number of documents when cheap to know (for the progress bar), else None."""
        if self.hub and self._hub_rows is not None:
            return len(self._hub_rows)
        if self.files and all(f.suffix == ".parquet" for f in self.files):
            try:
                import pyarrow.parquet as pq

                return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
            except Exception:
                return None
        if self.files and all(f.suffix == ".txt" for f in self.files) and self._txt_mode() == "file":
            return len(self.files)
        return None

    def _txt_mode(self) -> str:
        if self.txt_docs != "auto":
            return self.txt_docs
        return "paragraph" if len(self.files) == 1 else "file"

    def documents(self) -> Iterator[str]:
        """Every document's text, in order (empty ones included; the caller skips them)."""
        if self.hub:
            self.load()
            rows = self._hub_rows
            for row in rows.select_columns([self.text_key]) if hasattr(rows, "select_columns") else rows:
                yield row[self.text_key] or ""
            return
        if self.builtin:
            yield from _python_docs()
            return
        for path in self.files:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(path, self.text_key)
            elif path.suffix == ".parquet":
                yield from _parquet_documents(path, self.text_key)
            else:
                yield from _txt_documents(path, self._txt_mode())


def resolve_source(spec: str, text_key: str = "text", txt_docs: str = "auto") -> Source:
    """The Source --source names: python-docs, local files (anything that looks like a path, a
    glob or a file name) or a Hub dataset id (owner/name); a DataError for anything else."""
    if spec == "python-docs":
        import platform

        return Source(spec=spec, key=f"python-docs:{platform.python_version()}", name="python-docs",
                      builtin=True)
    has_glob = any(c in spec for c in "*?[")
    looks_local = (has_glob or os.path.exists(spec) or spec.startswith((".", "/", "~"))
                   or spec.endswith(LOCAL_EXTS))
    if not looks_local:
        if _HUB_ID.match(spec):
            return Source(spec=spec, key=f"hub:{spec}", name=spec.rsplit("/", 1)[1], hub=True,
                          text_key=text_key, txt_docs=txt_docs)
        raise DataError(f"source '{spec}' is neither a file, a glob, a folder nor a Hub dataset id "
                        f"(owner/name); fix: {FIX_LOCAL}")
    expanded = os.path.expanduser(spec)
    if os.path.isdir(expanded):
        files = sorted(p for p in Path(expanded).rglob("*") if p.is_file() and p.suffix in LOCAL_EXTS)
        name = Path(os.path.abspath(expanded)).name
        if not files:
            raise DataError(f"no *.jsonl, *.parquet or *.txt files under {spec}")
    else:
        matches = sorted(glob.glob(expanded, recursive=True)) if has_glob else [expanded]
        files = [Path(m) for m in matches if os.path.isfile(m)]
        if not files:
            raise DataError(f"no file matches '{spec}'; fix: {FIX_LOCAL}")
        bad = [f for f in files if f.suffix not in LOCAL_EXTS]
        if bad:
            raise DataError(f"{bad[0]}: unsupported file type '{bad[0].suffix}' "
                            f"(expected .jsonl, .parquet or .txt)")
        if has_glob:  # corpus/*.jsonl, corpus/part-*.jsonl -> "corpus"
            head = re.split(r"[*?\[]", expanded, maxsplit=1)[0]
            name = Path(os.path.dirname(os.path.abspath(head + "x"))).name or "corpus"
        else:
            name = files[0].stem
    return Source(spec=spec, key=os.path.abspath(expanded), name=name, files=files,
                  text_key=text_key, txt_docs=txt_docs)


def _python_docs() -> Iterator[str]:
    """pydoc's reference topics, then each stdlib module's docstrings (module, classes, functions)."""
    import ast
    import sysconfig

    import pydoc_data.topics as topics

    for name in sorted(topics.topics):
        yield topics.topics[name]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        nodes = [tree, *(n for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
        yield "\n\n".join(d for n in nodes if (d := ast.get_docstring(n)))


def _jsonl_documents(path: Path, key: str) -> Iterator[str]:
    lineno = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno}); "
                                    f"fix: repair or delete that line") from None
                if not isinstance(obj, dict) or key not in obj:
                    has = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
                    raise DataError(f"{path}:{lineno}: no '{key}' field (has: {has}); "
                                    f"fix: --text-key NAME")
                text = obj[key]
                if text is None:
                    text = ""
                if not isinstance(text, str):
                    raise DataError(f"{path}:{lineno}: '{key}' is a {type(text).__name__}, not a string")
                yield text
    except UnicodeDecodeError:
        raise DataError(f"{path}:{lineno + 1}: not UTF-8 text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({first_line(e)})") from None


def _parquet_documents(path: Path, key: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow; {INSTALL_DATA}") from None
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet ({first_line(e)})") from None
    if key not in names:
        raise DataError(f"{path}: no '{key}' column (has: {', '.join(names[:8])}); fix: --text-key NAME")
    try:
        batches = pf.iter_batches(columns=[key], batch_size=1024)
        for batch in batches:
            for text in batch.column(0).to_pylist():
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{path}: column '{key}' holds {type(text).__name__}, not strings")
                yield text or ""
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet ({first_line(e)})") from None


def _txt_documents(path: Path, mode: str) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({first_line(e)})") from None
    if mode == "file":
        yield text
    else:
        yield from (b.strip("\n") for b in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")))
