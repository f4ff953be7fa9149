"""The one door every input file comes in by: a regular file, of bounded size, decompressed to a bound.

A path megalab reads may be anything a user or a damaged checkout puts there: a FIFO (an open for reading
blocks until a writer comes: forever), a device (/dev/zero never ends), a directory, a symbolic-link loop,
a gzip bomb (2 MB that unpack to 2 GB). read() refuses each of them in one line (InputError, an OSError:
the readers that already take "unreadable" in their stride take these too) before it has read more than
its limit: the file is opened without blocking and judged by fstat (no race between a check and the open),
a plain file by its size, a gzip file by what its trailer says it unpacks to, and by what it does unpack
to, read in chunks and never past the limit.

The limits are generous multiples of the largest committed file of each kind (a raw log unpacks to 0.9 MB,
a profiler trace to 31 MB, a run record is 12 kB, a config 40 kB): a real input never meets them.
Standard library only (logparse, schema and `make help` read through here).
"""
from __future__ import annotations

import errno
import gzip
import os
import stat
import zlib
from pathlib import Path

MiB = 1 << 20
LOG_LIMIT = 512 * MiB  # a raw log, a profiler trace, a TensorBoard event file, unpacked (a 100-step log reached 4 MB)
RECORD_LIMIT = 16 * MiB  # a run.json
CONFIG_LIMIT = 4 * MiB  # a YAML config, a reference CSV, a memory CSV
_CHUNK = MiB


class InputError(OSError):
    """An input file that is not read: one line naming the file, what is wrong, and the fix."""

    def __init__(self, path, reason: str, fix: str = "replace it with the file it should be"):
        super().__init__(f"{path}: {reason}; fix: {fix}")
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return self.args[0]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read(path, limit: int | None = CONFIG_LIMIT, *, gunzip: bool | None = None) -> bytes:
    """The bytes of PATH, a regular file: its content, or (gunzip; by default for a name ending .gz) what
    it unpacks to. InputError, one line, for a missing or unreadable file, anything but a regular file,
    a file (or its unpacked content) larger than LIMIT bytes (None: no limit, for a file megalab itself
    just wrote), or a damaged gzip."""
    p = Path(path)
    gunzip = p.suffix == ".gz" if gunzip is None else gunzip
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(p, "no such file", "give the path of an existing file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(p, "a symbolic-link loop") from None
        if e.errno == errno.EISDIR:
            raise InputError(p, "a directory, not a file") from None
        raise InputError(p, f"unreadable ({e.strerror or e})", "check the path and its permissions") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(p, f"{kind(st.st_mode)}, not a regular file: not read")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        if not gunzip:
            if limit is None:
                return f.read()
            if st.st_size > limit:
                raise InputError(p, f"larger than {_mib(limit)} ({_mib(st.st_size)}): not read")
            data = f.read(limit + 1)
            if len(data) > limit:  # grew while we read it
                raise InputError(p, f"larger than {_mib(limit)}: not read")
            return data
        return _gunzip(p, f, limit)


def _gunzip(p: Path, f, limit: int | None) -> bytes:
    """What F unpacks to. With a limit, a file whose gzip trailer gives a size over it is refused unread;
    else it is read twice: first only counting (a bomb is refused having held one chunk at a time, never its
    content), then keeping what is known to fit."""
    too_large = InputError(p, f"larger than {_mib(limit)} uncompressed: not read",
                           "replace it (a gzip bomb, or not the file it should be)") if limit is not None else None
    try:
        if limit is not None:
            if _trailer_size(f) > limit:
                raise too_large
            size = 0
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                while chunk := g.read(_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise too_large
            f.seek(0)
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            return g.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(p, f"damaged gzip ({e})", "restore the file (git checkout, or the run's copy)") from None


def _trailer_size(f) -> int:
    """What a gzip file says it unpacks to: its last member's ISIZE, the trailer's last 4 bytes (the size modulo
    4 GiB: an intact file's is never more than its true size, so one over a limit is over it). 0 where the file is
    too short to have a trailer, or says more than it could hold (deflate unpacks at most 1032 bytes a byte): a
    truncated file's last bytes are no trailer, and it is read and named damaged."""
    stored = os.fstat(f.fileno()).st_size
    if stored < 18:  # a gzip header (10 bytes) and trailer (8)
        return 0
    f.seek(-4, os.SEEK_END)
    size = int.from_bytes(f.read(4), "little")
    f.seek(0)
    return size if size <= 1032 * stored else 0


def check_regular(path) -> None:
    """InputError unless PATH is a regular file (following links), judged without opening it: for a
    reader that takes a path only (TensorBoard's loader), so that it never opens a FIFO or a device."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        what = "a symbolic-link loop" if e.errno == errno.ELOOP else f"unreadable ({e.strerror or e})"
        raise InputError(p, what) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(p, f"{kind(st.st_mode)}, not a regular file: not read")


def text(path, limit: int = CONFIG_LIMIT) -> str:
    """read() as UTF-8 text; InputError for bytes that are not UTF-8."""
    data = read(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 text (byte {e.start})") from None


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"
