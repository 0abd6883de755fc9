"""The locks the lineage db hands out: one saga per subject, one receipt-chain head at a time.

Next to a SQLite lineage db a lock is an exclusive ``flock`` on a file under ``locks/``
(:class:`FileLock`); on a PostgreSQL one it is a session advisory lock (:class:`AdvisoryLock`).
Both are dropped when their holder dies, so a killed process never leaves a stale lock. Both
answer ``try_acquire()``, ``owner()`` and ``release()``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tombstone.fsutil import make_private_dirs

if TYPE_CHECKING:
    from tombstone.lineage.postgres import PgConnection

__all__ = ["AdvisoryLock", "FileLock"]


class FileLock:
    """An exclusive ``flock`` on a file under the lineage db's ``locks/`` directory, held until released or
    until the process dies (the OS drops it then, so a killed process never leaves a stale lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # the locks directory, made on first use
            make_private_dirs(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return True

    def owner(self) -> str:
        try:
            return "pid " + (self.path.read_text().strip() or "unknown")
        except OSError:
            return "pid unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class AdvisoryLock:
    """A PostgreSQL session advisory lock on the lineage db's connection. The server drops it when that
    connection ends, so a worker that dies (and its connection with it) never leaves a stale lock."""

    NAMESPACE = 0x70B5  # first key of the two-key form: Tombstone's locks, apart from the application's

    def __init__(self, conn: PgConnection, name: str) -> None:
        self._conn = conn
        self._key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True)
        self._held = False

    def try_acquire(self) -> bool:
        got = self._conn.execute("SELECT pg_try_advisory_lock(?, ?)", (self.NAMESPACE, self._key)).fetchone()[0]
        self._held = bool(got)
        return self._held

    def owner(self) -> str:
        row = self._conn.execute(
            "SELECT a.application_name, l.pid FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.classid = ? AND l.objid = ? AND l.granted LIMIT 1",
            (self.NAMESPACE, self._key & 0xFFFFFFFF),
        ).fetchone()
        if row is None:
            return "unknown"
        return f"{row[0] or 'a worker'} (server pid {row[1]})"

    def release(self) -> None:
        if self._held:
            self._conn.execute("SELECT pg_advisory_unlock(?, ?)", (self.NAMESPACE, self._key))
            self._held = False
