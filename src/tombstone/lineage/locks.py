"""The locks the lineage db hands out: one saga per subject, one receipt-chain head at a time.

Next to a SQLite lineage db a lock is an exclusive ``flock`` on a file under ``locks/``
(:class:`FileLock`); on a PostgreSQL one it is a session advisory lock (:class:`AdvisoryLock`).
Both are dropped when their holder dies, so a killed process never leaves a stale lock. Both
answer ``try_acquire()``, ``owner()``, ``holder()`` and ``release()``.

A file lock records its holder's pid, and keeps it when the holder is killed (a release empties the file):
``holder()`` tells a lock some live process holds from one whose recorded pid is gone (the saga it guarded
was interrupted), and ``owner()`` says so when the pid a held lock records is no longer running (a process
it started, which inherited the lock, holds it still).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tombstone.fsutil import make_private_dirs

if TYPE_CHECKING:
    from tombstone.lineage.postgres import PgConnection

__all__ = ["AdvisoryLock", "FileLock", "Holder", "pid_alive"]


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as far as this machine can tell."""

    held: bool | None
    """Some process holds it; None when that cannot be told."""
    pid: int | None = None
    """The pid the lock records (its holder's, or, once the holder was killed, the last one's)."""
    pid_alive: bool | None = None
    """Whether that pid is a running process here (None: no pid recorded, or a server's pid)."""
    text: str = ""
    """The holder for a reader: ``pid 123``, ``a worker (server pid 77)``."""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process on this machine (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except (OverflowError, ValueError, OSError):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True  # no /proc here: kill(0) said it exists


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

    def recorded_pid(self) -> int | None:
        """The pid the lock file records: its holder's, or the last holder's if that one was killed; None
        when the file is missing, empty (released) or holds no pid."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            text = os.read(fd, 32).decode("ascii", "replace").strip()
        except OSError:
            return None
        finally:
            os.close(fd)
        return int(text) if text.isdigit() and 0 < int(text) < 2**31 else None

    def owner(self) -> str:
        """The holder of a lock ``try_acquire`` did not get, for a message: ``pid 123``, and when that pid is
        no longer running, that it is not (a process it started holds the lock still)."""
        pid = self.recorded_pid()
        if pid is None:
            return "pid unknown"
        if not pid_alive(pid):
            return f"pid {pid}, which is no longer running: a process it started still holds the lock"
        return f"pid {pid}"

    def holder(self) -> Holder:
        """Who holds the lock. The pid recorded, if it is running, is the holder; if it is not (killed, or
        none recorded), whether anyone holds the lock is tried with a shared, non-blocking lock released at
        once, which never writes to the file."""
        pid = self.recorded_pid()
        alive = pid_alive(pid) if pid is not None else None
        if alive:
            return Holder(True, pid, True, f"pid {pid}")
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return Holder(False, pid, alive)
        except OSError:
            return Holder(None, pid, alive, "unknown")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held = True
        except OSError:
            return Holder(None, pid, alive, "unknown")
        else:
            held = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        text = "" if not held else (f"pid {pid}, which is no longer running: a process it started still holds"
                                    " the lock" if pid is not None else "pid unknown")
        return Holder(held, pid, alive, text)

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
        return self.holder().text or "unknown"

    def holder(self) -> Holder:
        """Who holds the lock: the server knows, and drops it when its holder's connection ends."""
        row = self._conn.execute(
            "SELECT a.application_name, l.pid FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.classid = ? AND l.objid = ? AND l.granted LIMIT 1",
            (self.NAMESPACE, self._key & 0xFFFFFFFF),
        ).fetchone()
        if row is None:
            return Holder(False)
        return Holder(True, None, None, f"{row[0] or 'a worker'} (server pid {row[1]})")

    def release(self) -> None:
        if self._held:
            self._conn.execute("SELECT pg_advisory_unlock(?, ?)", (self.NAMESPACE, self._key))
            self._held = False
