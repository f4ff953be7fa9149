"""The Hugging Face Hub: whether it can be reached, and loading a dataset's rows from it.

A Hub dataset source (sources.py) and GPT-2's BPE files (tokenizer.py) come from the Hub. On a
machine that cannot reach it, `datasets` and `huggingface_hub` retry for minutes before they fail,
so a TCP connect bounded in time goes first and turns "offline" into one line naming the local
alternative. HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) skips that probe: the libraries then read
the copy already in the HF cache.
"""
from __future__ import annotations

import os
import socket
import threading
import urllib.parse

from megalab.harness.data.errors import FIX_LOCAL, INSTALL_DATA, DataError, first_line

HUB_PARQUET_REVISION = "refs/convert/parquet"  # the Hub's own Parquet export of script datasets


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def endpoint() -> tuple[str, int]:
    """Host and port a Hub request connects to first: the HTTPS proxy when one is set."""
    url = (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
           or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if "://" not in url:
        url = "http://" + url
    u = urllib.parse.urlsplit(url)
    return u.hostname or "huggingface.co", u.port or (443 if u.scheme == "https" else 80)


def reachable(timeout: float = 5.0) -> bool:
    """A TCP connect to the Hub (or proxy), bounded in time even when DNS hangs."""
    host, port = endpoint()
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok and ok[0])


def offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")


def check_reachable(what: str, fix: str = FIX_LOCAL) -> None:
    """DataError naming `fix` when the Hub is needed for `what` and cannot be reached."""
    if not offline() and not reachable():
        host, port = endpoint()
        raise DataError(f"cannot reach the Hugging Face Hub ({host}:{port}) for {what}; fix: "
                        f"{fix}, or HF_HUB_OFFLINE=1 to use a copy already in the HF cache")


def load_dataset(name: str, split: str):
    """datasets.load_dataset, falling back to the Hub's Parquet export for script datasets."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "60")
    try:
        import datasets
    except ImportError:
        raise DataError(f"loading '{name}' from the Hub needs `datasets`; {INSTALL_DATA}") from None
    try:
        return datasets.load_dataset(name, split=split)
    except RuntimeError as e:  # datasets>=4 no longer runs loading scripts (stas/openwebtext-10k has one)
        if "scripts are no longer supported" not in str(e):
            raise
        return datasets.load_dataset(name, split=split, revision=HUB_PARQUET_REVISION)


def load_rows(name: str, text_key: str):
    """A Hub dataset's train split (downloaded, or read from the HF cache), which must have the
    column text_key."""
    check_reachable(f"'{name}'")
    try:
        rows = load_dataset(name, "train")
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot load '{name}' from the Hugging Face Hub ({first_line(e)}); "
                        f"fix: {FIX_LOCAL}") from None
    cols = list(getattr(rows, "column_names", []) or [])
    if text_key not in cols:
        raise DataError(f"{name}: no '{text_key}' column (has: {', '.join(cols[:8])}); "
                        f"fix: --text-key NAME")
    return rows
