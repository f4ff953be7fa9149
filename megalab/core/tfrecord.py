"""The records of a TFRecord file (TensorBoard's event files), each CRC-32C checked, read as TensorBoard's own reader
reads them: every record up to the first damaged one (a bad CRC, or cut short), then no more, without an error.

TensorBoard without TensorFlow checks the CRCs in a Python loop over every byte; google-crc32c (a dev dependency, C)
does the same check. Without it, TensorBoard's own crc32c runs (the same values, slower).
"""
from __future__ import annotations

import functools
import struct


@functools.cache
def _crc32c():
    """The CRC-32C function, chosen at the first record read (importing this module needs neither library)."""
    try:
        from google_crc32c import value
    except ImportError:  # pragma: no cover - the dev extra installs it
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as value
    return value


def masked_crc32c(chunk: bytes) -> int:
    """TFRecord's masked CRC-32C of a chunk."""
    c = _crc32c()(chunk)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(data: bytes) -> list[bytes]:
    """The records of a TFRecord file's bytes, up to the first damaged one. A record is <its length, u64><the
    length's masked CRC, u32><data><the data's masked CRC, u32>. (A file holds a record per scalar and step, so
    the loop is kept tight: masked_crc32c's arithmetic written out.)"""
    crc, unpack = _crc32c(), struct.unpack_from
    out, pos, size = [], 0, len(data)
    while pos + 12 <= size:
        length, want = unpack("<QI", data, pos)
        end = pos + 16 + length
        if end > size:
            break
        c = crc(data[pos:pos + 8])
        if ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF != want:
            break
        body = data[pos + 12:end - 4]
        c = crc(body)
        if ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF != unpack("<I", data, end - 4)[0]:
            break
        out.append(body)
        pos = end
    return out
