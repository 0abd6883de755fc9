"""Whether any process has committed to a SQLite lineage db since the last look, without a read transaction.

In WAL mode every SQLite connection to the file shares the wal-index (the ``-shm`` file, mapped into memory
by each). Its header (https://www.sqlite.org/walformat.html, section 2.1) is written by every commit, before
the commit returns: the frame count grows, or, where the log starts over, its salt changes, and the header's
own checksum with either. It is kept twice; a writer writes the second copy, then the first, and a reader
that finds the two equal has a header no commit is half way through. So a header equal to one read earlier
means no commit since, as far as any SQLite connection can see: a reader may keep what it read then.

A wrapper asks this before every query (:class:`tombstone.capture.hidden.HiddenIds`): 48 bytes compared,
where a single-row ``SELECT`` opens and closes a read transaction on the wal-index's locks. Where the header
cannot be used — no ``-shm`` file, a header of another version, two copies that differ (a commit under way),
a transaction of this connection's own still open (its writes are visible to it before any header changes), a
``-shm`` file this process does not already hold open (so not the one its SQLite connection uses) —
the caller reads the db as before.

Mapped read-only, 136 bytes (the two header copies and the checkpoint information after them), only while
this process's connection is open: that connection holds the wal-index's shared lock, without which the next
connection to open the db may truncate the file under the mapping.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from pathlib import Path

_HEADER = 48
_MAPPED = 136
_VERSION = 3007000
"""The only wal-index version SQLite has written (``WALINDEX_MAX_VERSION``)."""


class WalStamp:
    """The wal-index header of one SQLite database file, as this process sees it now."""

    def __init__(self, db_path: Path) -> None:
        # SQLite follows a link to the database file and keeps its -shm beside the file it reaches
        self._path = Path(os.path.realpath(db_path) + "-shm")
        self._map: mmap.mmap | None = None
        self._usable = True

    def read(self) -> bytes | None:
        """The header's bytes now, or None where it cannot say whether anything was committed."""
        if self._map is None:
            if not self._usable:
                return None
            self._map = self._open()
            if self._map is None:
                self._usable = False
                return None
        both = self._map[: 2 * _HEADER]
        first = both[:_HEADER]
        if first != both[_HEADER:] or first[12] != 1 or struct.unpack_from("=I", first)[0] != _VERSION:
            return None
        return first

    def _open(self) -> mmap.mmap | None:
        try:
            fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < _MAPPED or not _held_open(info, fd):
                return None
            return mmap.mmap(fd, _MAPPED, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmapped before the connection closes (after it, the file may be truncated by the next opener)."""
        if self._map is not None:
            self._map.close()
        self._map = None
        self._usable = False


def _held_open(info: os.stat_result, own: int) -> bool:
    """Whether this process already holds that very file open (SQLite's connection does, for the -shm it uses):
    a file put at the name since, or left there by something else, is never taken for it. Where the process's
    open files cannot be listed (no ``/proc/self/fd``), False: the caller reads the db instead."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        if fd == str(own):  # the descriptor just opened to map it
            continue
        try:
            held = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if (held.st_dev, held.st_ino) == (info.st_dev, info.st_ino) and stat.S_ISREG(held.st_mode):
            return True
    return False


__all__ = ["WalStamp"]
