"""The records of a TFRecord file (TensorBoard's event files), each CRC-32C checked, read as TensorBoard's own reader
reads them: every record up to the first damaged one (a bad CRC, or cut short), then no more, without an error.

TensorBoard without TensorFlow checks the CRCs in a Python loop over every byte (30 s for the committed runs' event
files); here one numpy step per byte position checks a batch of a file's records at once.
"""
from __future__ import annotations

import struct

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_TABLE_LIST = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (_POLY if _c & 1 else 0)
    _TABLE_LIST.append(_c)
_TABLE = np.array(_TABLE_LIST, dtype=np.uint32)
_BATCH_BYTES = 1 << 22  # a batch's padded rows: records x the longest of them


def _crc_one(chunk: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in chunk:
        crc = _TABLE_LIST[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_batch(chunks: list[bytes]) -> np.ndarray:
    """CRC-32C of chunks given longest first: the chunks still going at byte j are a prefix."""
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    rows = np.zeros((len(chunks), int(lengths[0]) if chunks else 0), dtype=np.uint8)
    for k, c in enumerate(chunks):
        rows[k, :len(c)] = np.frombuffer(c, dtype=np.uint8)
    crc = np.full(len(chunks), 0xFFFFFFFF, dtype=np.uint32)
    going = np.searchsorted(-lengths, -np.arange(rows.shape[1]), side="left")  # how many are longer than j
    for j, k in enumerate(going):
        c = crc[:k]
        crc[:k] = _TABLE[(c ^ rows[:k, j]) & 0xFF] ^ (c >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def masked_crc32c(chunks: list[bytes]) -> list[int]:
    """TFRecord's masked CRC-32C of each chunk."""
    order = sorted(range(len(chunks)), key=lambda i: -len(chunks[i]))
    crc = [0] * len(chunks)
    start = 0
    while start < len(order):
        take = max(1, _BATCH_BYTES // max(1, len(chunks[order[start]])))
        batch = order[start:start + take]
        got = [_crc_one(chunks[batch[0]])] if len(batch) == 1 else _crc_batch([chunks[i] for i in batch]).tolist()
        for i, c in zip(batch, got):
            crc[i] = c
        start += take
    return [((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF for c in crc]


def records(data: bytes) -> list[bytes]:
    """The records of a TFRecord file's bytes, up to the first damaged one. A record is <its length, u64><the
    length's masked CRC, u32><data><the data's masked CRC, u32>."""
    spans = []  # (start, data length or None where the file ends inside it), as framed, unchecked yet
    pos, size = 0, len(data)
    while pos + 12 <= size:
        (length,) = struct.unpack_from("<Q", data, pos)
        whole = pos + 16 + length <= size
        spans.append((pos, length if whole else None))
        if not whole:
            break
        pos += 16 + length
    heads = masked_crc32c([data[p:p + 8] for p, _ in spans])
    bodies = iter(masked_crc32c([data[p + 12:p + 12 + n] for p, n in spans if n is not None]))
    out = []
    for (p, n), head in zip(spans, heads):
        if n is None or head != struct.unpack_from("<I", data, p + 8)[0] \
                or next(bodies) != struct.unpack_from("<I", data, p + 12 + n)[0]:
            break
        out.append(data[p + 12:p + 12 + n])
    return out
