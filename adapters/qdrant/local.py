"""Local mode's directory, shared by processes one at a time.

A local-mode client loads the whole directory into its process's memory and locks the directory for as
long as it is open: a second client, in this process or another, cannot open it. Within a process the
app and Tombstone share one client (:func:`local_client`). Between processes the store's lock
(``<directory>.tombstone.lock``, ``tombstone.storelock``) decides whose turn it is: :func:`held` takes the
lock with this process's client open inside it. A client stays open after the lock is released, so a
process writing alone keeps its loaded collection (uncontended writes cost what they cost before); when
another process waits for the directory it records a request in the lock file, and the holder closes its
client the next time it takes or releases the lock, then loads the directory afresh when its turn comes
back. A process that keeps the directory open without writing hands it over only when it closes it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from qdrant_client import QdrantClient

from tombstone.errors import StoreUnavailableError
from tombstone.fsutil import make_private_dirs
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

_clients: dict[str, QdrantClient] = {}
# Close before the interpreter tears modules down (the client's own __del__ fails that late).
atexit.register(lambda: close_local_clients())


def _key(path: str | os.PathLike[str]) -> str:
    return str(Path(path).resolve())


def is_open(client: QdrantClient | None) -> bool:
    return client is not None and getattr(client._client, "closed", False) is not True


def local_client(path: str | os.PathLike[str], *, wait: float = STORE_LOCK_WAIT) -> QdrantClient:
    """The process's client for a local-mode directory. Local mode locks its directory to one client,
    so an app and Tombstone in the same process must share it. When another process has the directory
    open, this waits (at most ``wait`` seconds) for it to hand the directory over."""
    key = _key(path)
    client = _clients.get(key)
    if is_open(client):
        return client
    lock = StoreLock(lock_file_for(key), wait=wait, store=str(path))
    client = _acquire(key, lock, wait, str(path))
    lock.release()
    return client


def adopt(client: QdrantClient) -> str | None:
    """The directory of a local-mode client (None for a server's), which becomes the process's shared
    client for that directory if it has none open."""
    local = getattr(client, "_client", None)
    location = getattr(local, "location", None)
    if getattr(local, "persistent", False) is not True or not isinstance(location, str):
        return None
    key = _key(location)
    if not is_open(_clients.get(key)):
        _clients[key] = client
    return key


def current(path: str | os.PathLike[str]) -> QdrantClient | None:
    """The process's client for the directory if it is open now (no lock taken, nothing opened)."""
    client = _clients.get(_key(path))
    return client if is_open(client) else None


def close_local_clients() -> None:
    for client in _clients.values():
        client.close()
    _clients.clear()


def _take(key: str, lock: StoreLock) -> QdrantClient | None:
    """Under the lock: this process's client, opened if need be; None when it is another process's turn."""
    client = _clients.get(key)
    if is_open(client):
        if lock.depth > 1 or not lock.requested_by_other():
            return client
        client.close()  # another process waits for the directory: hand it over
        return None
    if lock.requested_by_other():
        return None  # it asked first
    try:
        client = QdrantClient(path=key)
    except RuntimeError as exc:
        if "already accessed" not in str(exc):
            raise StoreUnavailableError(f"qdrant: {exc}", store=key) from exc
        lock.request()  # open in another process: ask it to let go
        return None
    _clients[key] = client
    lock.withdraw()
    return client


def _make_directory(key: str) -> None:
    """A directory local mode is about to create is made here first, mode 0700 (with any missing parent):
    the points' payloads, documents included, are stored in it, and the files the client then writes inside
    keep its own modes. A directory that is already there keeps its mode."""
    if os.path.lexists(key):
        return
    try:
        make_private_dirs(key)
    except OSError as exc:
        raise StoreUnavailableError(f"cannot create the Qdrant directory {key}: {exc.strerror or exc}",
                                    store=key, retryable=False) from exc


def _acquire(key: str, lock: StoreLock, wait: float, store: str) -> QdrantClient:
    """Take the lock with this process's client open on the directory, waiting for the turn."""
    _make_directory(key)
    deadline = time.monotonic() + wait
    pause = 0.005
    while True:
        lock.acquire(max(0.0, deadline - time.monotonic()))
        try:
            client = _take(key, lock)
        except BaseException:
            lock.release()
            raise
        if client is not None:
            return client
        lock.release()
        if time.monotonic() >= deadline:
            lock.withdraw()
            raise StoreUnavailableError(
                f"store {store!r}: another process has kept the Qdrant directory {key} open for {wait:.0f} s"
                " (local mode allows one client at a time; a process hands it over when it next uses it"
                " through Tombstone's wrappers or adapter, or when it closes its client)", store=store)
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


@contextlib.contextmanager
def held(path: str | os.PathLike[str], *, wait: float = STORE_LOCK_WAIT, store: str | None = None) -> Iterator[QdrantClient]:
    """The directory's store lock, with this process's client open on it inside the block."""
    key = _key(path)
    lock = StoreLock(lock_file_for(key), wait=wait, store=store or key)
    client = _acquire(key, lock, wait, store or key)
    try:
        yield client
    finally:
        try:
            if lock.depth == 1 and lock.requested_by_other():
                client.close()  # hand the directory to the process waiting for it
        finally:
            lock.release()
