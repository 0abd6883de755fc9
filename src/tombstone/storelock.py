"""Per-store locks: one process at a time changes a store, or probes it.

A saga holds a store's lock around that store's suppress, reclaim and verify steps; the app-facing
wrappers hold the same lock around each write. So a write never lands in the middle of a rewrite-based
reclaim (where the rewrite, copying the survivors it read before the write, would lose it), two erasures
never rewrite one store at once, and a probe never reads a store half rewritten.

For a store kept in files the lock is an exclusive ``flock`` on a file beside the store,
``<store file or directory>.tombstone.lock`` (:func:`lock_file_for`), never inside it: a rewrite may
replace everything inside, and the physical probe must not scan it. The OS drops a ``flock`` when its
holder dies, so a killed process never leaves a stale lock. Each adapter says which lock its store needs
(``Adapter.store_lock``); stores on a server use the server's own locks instead.

Uncontended, taking the lock costs a few system calls (open, flock, one write of the holder's pid,
flock, close): a few microseconds next to any store write. Contended, it waits with a bound and then
raises a StoreUnavailableError naming the holder; the saga retries it like any store error.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from pathlib import Path

from tombstone.errors import StoreUnavailableError

__all__ = ["LOCK_SUFFIX", "STORE_LOCK_WAIT", "StoreLock", "lock_file_for"]

LOCK_SUFFIX = ".tombstone.lock"
STORE_LOCK_WAIT = 300.0
"""Seconds a saga step or a wrapper write waits for a store's lock before giving up (a store option
``lock_wait`` changes it for the saga; the wrappers take ``lock_wait=``)."""
_PID = slice(0, 16)
_REQUEST = slice(16, 48)
_TOKEN = slice(48, 80)
_REQUEST_TTL = 5.0  # a request not renewed for this long is from a process that stopped waiting

# (lock file, thread) -> [fd, depth]: the lock is reentrant within a thread (a wrapper write inside a saga
# step of the same thread does not wait for itself); other threads and other processes wait.
_held: dict[tuple[str, int], list[int]] = {}
# lock file -> the token this process wrote when it last released the lock
_written: dict[str, str] = {}


def lock_file_for(store_path: str | os.PathLike[str]) -> Path:
    """The lock file of a store kept at ``store_path`` (a file or a directory): beside it, named after
    the real path, so a symlink, a relative path and an absolute one all name one lock."""
    return Path(os.path.realpath(store_path) + LOCK_SUFFIX)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StoreLock:
    """An exclusive ``flock`` on ``path``, taken with a bounded wait; a context manager, reentrant per thread.

    ``store`` names the store in the error raised when the wait runs out.
    """

    def __init__(self, path: str | os.PathLike[str], *, wait: float = STORE_LOCK_WAIT, store: str | None = None) -> None:
        self.path = Path(path)
        self.wait = float(wait)
        self.store = store

    # -- holding ----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """How many times this thread holds the lock now (0: not held)."""
        entry = _held.get((str(self.path), threading.get_ident()))
        return entry[1] if entry else 0

    def _open(self) -> int | None:
        """The lock file, created if missing; None when there is none and it cannot be created (no such
        folder, or a read-only one: nothing there can be rewritten by this process either)."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # private, as every file Tombstone makes
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None  # no folder for the store to be in: no store to guard
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise StoreUnavailableError(f"cannot open the lock file {self.path}: {exc.strerror or exc}",
                                            store=self.store) from exc
        try:
            return os.open(self.path, os.O_RDONLY)
        except OSError:
            return None

    def acquire(self, wait: float | None = None) -> None:
        key = (str(self.path), threading.get_ident())
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
            return
        fd = self._open()
        if fd is None:
            _held[key] = [-1, 1]
            return
        wait = self.wait if wait is None else wait
        deadline = time.monotonic() + wait
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = self.owner(fd)
                    os.close(fd)
                    where = f"store {self.store!r}" if self.store else str(self.path)
                    raise StoreUnavailableError(
                        f"{where} stayed locked for {wait:.0f} s by {owner} ({self.path}): an erasure or a write"
                        " is still running there; try again when it ends", store=self.store) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        try:
            os.pwrite(fd, str(os.getpid()).encode().ljust(_PID.stop), _PID.start)
        except OSError:
            pass  # a read-only lock file: the lock holds, only the owner's pid is not shown
        _held[key] = [fd, 1]

    def release(self) -> None:
        key = (str(self.path), threading.get_ident())
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        if entry[0] >= 0:
            token = f"{os.getpid()}:{time.time_ns()}"
            try:
                os.pwrite(entry[0], token.encode().ljust(_TOKEN.stop - _TOKEN.start), _TOKEN.start)
                _written[key[0]] = token
            except OSError:
                _written.pop(key[0], None)
            fcntl.flock(entry[0], fcntl.LOCK_UN)
            os.close(entry[0])

    def __enter__(self) -> "StoreLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def owner(self, fd: int | None = None) -> str:
        """Who holds the lock, as far as the lock file says."""
        try:
            raw = os.pread(fd, _PID.stop, 0) if fd is not None else self.path.read_bytes()[_PID]
        except OSError:
            raw = b""
        pid = raw.decode(errors="replace").strip()
        return f"pid {pid}" if pid.isdigit() else "another process"

    # -- who held it since -------------------------------------------------------------------

    def token(self) -> str | None:
        """The token the last holder wrote when it released the lock (read while holding it): a process
        that finds another token than :meth:`written` knows someone else held the store meanwhile, so
        what it cached of the store may be out of date."""
        entry = _held.get((str(self.path), threading.get_ident()))
        try:
            if entry is not None and entry[0] >= 0:
                raw = os.pread(entry[0], _TOKEN.stop - _TOKEN.start, _TOKEN.start)
            else:
                with open(self.path, "rb") as fh:
                    raw = fh.read()[_TOKEN]
        except OSError:
            return None
        return raw.decode(errors="replace").strip() or None

    def written(self) -> str | None:
        """The token this process wrote when it last released the lock (None: it never did)."""
        return _written.get(str(self.path))

    # -- asking the holder to let go (for clients that keep a store open between writes) ----

    def request(self) -> None:
        """Record that this process waits for the store: a holder that keeps the store open between its
        own uses (Qdrant local mode's client) lets go of it when it next takes or releases the lock."""
        fd = self._open()
        if fd is None:
            return
        try:
            os.pwrite(fd, f"{os.getpid()} {time.time():.3f}".encode().ljust(_REQUEST.stop - _REQUEST.start),
                      _REQUEST.start)
        except OSError:
            pass
        finally:
            os.close(fd)

    def withdraw(self) -> None:
        """Clear this process's request, if the lock file holds it."""
        if self._requester() == os.getpid():
            fd = self._open()
            if fd is not None:
                try:
                    os.pwrite(fd, b" " * (_REQUEST.stop - _REQUEST.start), _REQUEST.start)
                except OSError:
                    pass
                finally:
                    os.close(fd)

    def requested_by_other(self) -> bool:
        """Whether another live process asked for the store within the last few seconds."""
        pid = self._requester()
        return pid is not None and pid != os.getpid() and _alive(pid)

    def _requester(self) -> int | None:
        entry = _held.get((str(self.path), threading.get_ident()))
        try:
            if entry is not None and entry[0] >= 0:
                raw = os.pread(entry[0], _REQUEST.stop - _REQUEST.start, _REQUEST.start)
            else:
                with open(self.path, "rb") as fh:
                    raw = fh.read()[_REQUEST]
        except OSError:
            return None
        parts = raw.decode(errors="replace").split()
        if len(parts) != 2 or not parts[0].isdigit():
            return None
        try:
            if time.time() - float(parts[1]) > _REQUEST_TTL:
                return None
        except ValueError:
            return None
        return int(parts[0])
