"""Encoding documents into token ids, each ended by the end-of-document token, in worker processes.

BPE encoding is the slow part of prepare-data and runs one document at a time per process, so
--workers processes (default: every core) encode chunks of documents while the parent writes them
in order. The pool starts with `spawn`, not `fork`: the parent may have used tokenizers' thread
pool (BPE training), which does not survive a fork. Pool.imap's feeder thread would read the whole
corpus into its queue; a throttle keeps a few chunks per worker in flight instead, so memory stays
flat on any corpus size. One worker encodes in the parent process itself.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from contextlib import contextmanager
from itertools import islice
from typing import Iterable, Iterator

import numpy as np

from megalab.harness.data.tokenizer import Tok, import_tokenizers

_W: dict = {}  # a worker process's tokenizer, end-of-document id and dtype (set by _init_worker)


@contextmanager
def encoded(texts: Iterable[str], tok: Tok, dtype: np.dtype, workers: int,
            chunk: int) -> Iterator[Iterator[list[np.ndarray]]]:
    """The token ids of texts, chunk by chunk in order, one array per document (its ids, then the
    end-of-document id, as dtype). With workers > 1 a pool encodes them: closed when the block ends,
    terminated when it raises (an error, Ctrl-C) so that no worker outlives the run."""
    if workers == 1:
        yield (_encode(c, tok.tokenizer, tok.eod_id, dtype) for c in _chunks(texts, chunk))
        return
    pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker,
                                        initargs=(tok.tokenizer.to_str(), tok.eod_id, dtype.str))
    throttle = _Throttle(4 * workers)

    def arrays() -> Iterator[list[np.ndarray]]:
        for out in pool.imap(_encode, throttle.feed(_chunks(texts, chunk))):
            yield out
            throttle.done()  # the caller has written this chunk: one more may go

    closed = False
    try:
        yield arrays()
        pool.close()
        pool.join()
        closed = True
    finally:
        if not closed:
            throttle.stop()
            pool.terminate()
            pool.join()


def _init_worker(tokenizer_json: str, eod: int, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: the pool is the parallelism
    tk = import_tokenizers()
    _W.update(tok=tk.Tokenizer.from_str(tokenizer_json), eod=eod, dtype=np.dtype(dtype))


def _encode(texts: list[str], tok=None, eod: int | None = None, dtype=None) -> list[np.ndarray]:
    if tok is None:  # in a worker process: what _init_worker set up
        tok, eod, dtype = _W["tok"], _W["eod"], _W["dtype"]
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = np.empty(len(enc.ids) + 1, dtype=dtype)
        ids[:-1] = enc.ids
        ids[-1] = eod
        out.append(ids)
    return out


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while chunk := list(islice(it, size)):
        yield chunk


class _Throttle:
    """Back-pressure for Pool.imap, whose feeder thread would otherwise read the whole corpus
    into the task queue: at most `n` chunks in flight; stop() ends the feed (for terminate())."""

    def __init__(self, n: int) -> None:
        self._sem = threading.Semaphore(n)
        self._stop = threading.Event()

    def feed(self, chunks: Iterable[list[str]]) -> Iterator[list[str]]:
        for chunk in chunks:
            while not self._sem.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            yield chunk

    def done(self) -> None:
        self._sem.release()

    def stop(self) -> None:
        self._stop.set()
