"""core/tfrecord.py reads an event file's records as TensorBoard's own reader does: whole, cut short, or with a
flipped bit (every record up to the damaged one)."""
import random
from pathlib import Path

import pytest

from megalab.core import infile, tfrecord

ROOT = Path(__file__).resolve().parent.parent


def _tensorboards(data: bytes, tmp_path) -> list[bytes]:
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    path = tmp_path / "events.out.tfevents"
    path.write_bytes(data)
    return list(RawEventFileLoader(str(path)).Load())


def test_records_are_tensorboards_whole_cut_and_damaged(tmp_path):
    pytest.importorskip("tensorboard")
    path = next(iter(sorted((ROOT / "results").glob("**/tensorboard/*tfevents*"))))
    data = infile.read(path, infile.LOG_LIMIT)
    rng = random.Random(0)
    damaged = [data, data[:len(data) // 2], data[:-1], data[:5], b""]
    for _ in range(8):
        b = bytearray(data)
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        damaged.append(bytes(b))
    for d in damaged:
        assert tfrecord.records(d) == _tensorboards(d, tmp_path)
    assert len(tfrecord.records(data)) > 100 and len(tfrecord.records(damaged[1])) < len(tfrecord.records(data))


def test_a_long_record_and_many_lengths_get_crc32cs_known_values():
    # CRC-32C's check value (RFC 3720): "123456789" -> 0xE3069283, masked as TFRecord masks it
    want = ((((0xE3069283 >> 15) | (0xE3069283 << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    chunks = [b"123456789", b"123456789" * 1000, b"", b"x" * 5_000_000]
    got = [tfrecord.masked_crc32c(c) for c in chunks]
    assert got[0] == want and got[1] == tfrecord.masked_crc32c(chunks[1]) != want
    assert got == [tfrecord.masked_crc32c(bytes(c)) for c in chunks]
