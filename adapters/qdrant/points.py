"""Reading Qdrant local mode's stored points without running anything a store holds.

Local mode persists each point as ``pickle.dumps(PointStruct)`` in ``collection/<name>/storage.sqlite``,
and ``qdrant_client`` unpickles every row when it opens the directory. Unpickling runs whatever the
bytes name, so a row planted in that file would run code in whoever opens the store: the app, an
erasure, an auditor. Here points are read with an unpickler that finds only the classes a stored point
is made of (``PointStruct`` and ``SparseVector``; everything else in a point — ids, vectors, payloads —
is plain pickle data: lists, dicts, strings, numbers, ``None``, booleans) and refuses any other.

:func:`install` also puts that unpickler in ``qdrant_client``'s own persistence module, so a client
opened on a local-mode directory in this process (the app's or Tombstone's) refuses a planted row with
a :class:`~tombstone.errors.StoreUnavailableError` naming the store file, instead of running it.
"""

from __future__ import annotations

import io
import json
import pickle
import sqlite3
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tombstone.errors import StoreUnavailableError

ALLOWED = frozenset({
    ("qdrant_client.http.models.models", "PointStruct"),
    ("qdrant_client.http.models.models", "SparseVector"),
})
"""The only classes a stored point may name: (module, class)."""


class _PointUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"a stored point names {module}.{name}, which is not part of a point")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a stored point uses a persistent id")


class UnsafePointError(StoreUnavailableError):
    """A stored row is not a plain Qdrant point (it names other classes): it was not unpickled."""

    retryable = False


def loads(data: bytes, *, where: str = "a Qdrant local-mode store") -> Any:
    """Unpickle one stored point, finding only the classes a point is made of."""
    try:
        point = _PointUnpickler(io.BytesIO(bytes(data))).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError, RecursionError, MemoryError) as exc:
        raise UnsafePointError(f"qdrant: {where} holds a row that is not a plain point ({exc}); it was not"
                               " loaded, nothing in it ran: remove that row or restore the store") from exc
    from qdrant_client.http import models

    if not isinstance(point, models.PointStruct):
        raise UnsafePointError(f"qdrant: {where} holds a row that is not a point ({type(point).__name__});"
                               " it was not loaded")
    return point


def read_points(storage: str | Path, *, read_only: bool = True) -> Iterator[tuple[int, Any]]:
    """(rowid, point) of every row of one collection's ``storage.sqlite``, oldest first, read with the
    restricted unpickler. ``read_only`` opens it with ``mode=ro``; a private copy can be opened for
    writing, so that SQLite rolls back a journal left in it."""
    storage = Path(storage)
    conn = sqlite3.connect(storage.absolute().as_uri() + ("?mode=ro" if read_only else "?mode=rw"), uri=True)
    try:
        rows = conn.execute("SELECT rowid, point FROM points ORDER BY rowid").fetchall()
    finally:
        conn.close()
    for rowid, blob in rows:
        yield rowid, loads(blob, where=str(storage))


def latest_points(storage: str | Path, *, read_only: bool = True) -> list[Any]:
    """The stored points, one per id (the latest write of each), as local mode loads them."""
    from qdrant_client.local.utils import normalize_point_id

    latest: dict[Any, Any] = {}
    for _rowid, point in read_points(storage, read_only=read_only):
        latest[normalize_point_id(point.id)] = point
    return list(latest.values())


MAX_META_BYTES = 16 * 1024 * 1024


def read_only_client(path: str | Path, collection: str, *, store: str | None = None) -> Any:
    """An in-memory client holding what one collection of a local-mode directory holds, read without
    ``qdrant_client`` opening the directory (it would unpickle every row itself, write a lock file into
    the directory, and may rewrite rows): the collection's configuration from ``meta.json``, its points
    from a private copy of its ``storage.sqlite`` through the restricted unpickler. Queries, filters and
    retrieval then behave as local mode's own, and nothing in the directory is changed."""
    from qdrant_client import QdrantClient, models

    from tombstone.fsutil import Snapshot

    path = Path(path)
    try:
        with open(path / "meta.json", "rb") as fh:
            raw = fh.read(MAX_META_BYTES + 1)
        meta = json.loads(raw) if len(raw) <= MAX_META_BYTES else None
        config_json = dict(meta["collections"][collection])
    except KeyError as exc:
        raise StoreUnavailableError(f"no collection {collection!r} in {path}", store=store, retryable=False) from exc
    except (OSError, ValueError, TypeError) as exc:
        raise StoreUnavailableError(f"cannot read {path / 'meta.json'}: {exc}", store=store, retryable=False) from exc
    config_json.pop("init_from", None)
    try:
        config = models.CreateCollection(**config_json)
    except ValueError as exc:
        raise StoreUnavailableError(f"{path / 'meta.json'}: collection {collection!r} has a configuration local"
                                    f" mode would not load ({exc.__class__.__name__})", store=store,
                                    retryable=False) from exc
    storage = path / "collection" / collection / "storage.sqlite"
    with Snapshot(prefix="tombstone-qdrant-") as snapshot:
        copied = snapshot.copy_files([storage, Path(f"{storage}-journal")], "points") / storage.name
        points = latest_points(copied, read_only=False) if copied.is_file() else []
    client = QdrantClient(":memory:")
    client.create_collection(collection, vectors_config=config.vectors, sparse_vectors_config=config.sparse_vectors)
    for start in range(0, len(points), 256):
        client.upsert(collection, points=points[start : start + 256])
    return client


def _caller_file() -> str:
    """The storage file local mode is loading (its ``CollectionPersistence.location``), for the message."""
    frame = sys._getframe(2)
    location = getattr(frame.f_locals.get("self"), "location", None)
    return str(location) if location is not None else "a Qdrant local-mode store"


def _restricted_pickle_module() -> types.ModuleType:
    shim = types.ModuleType("tombstone_restricted_pickle")
    shim.__dict__.update({name: getattr(pickle, name) for name in dir(pickle) if not name.startswith("__")})
    shim.loads = lambda data, *args, **kwargs: loads(data, where=_caller_file())  # type: ignore[attr-defined]
    shim.load = lambda file, *args, **kwargs: loads(file.read(), where=_caller_file())  # type: ignore[attr-defined]
    shim.__tombstone_restricted__ = True  # type: ignore[attr-defined]
    return shim


def install() -> None:
    """Make ``qdrant_client``'s local-mode persistence unpickle stored points with the restricted
    unpickler (idempotent). Pickling — how local mode writes points — is unchanged."""
    from qdrant_client.local import persistence

    current = getattr(persistence, "pickle", None)
    if getattr(current, "__tombstone_restricted__", False):
        return
    if current is not pickle:
        raise RuntimeError("qdrant_client.local.persistence no longer reads points through the pickle module;"
                           " tombstone cannot restrict what it unpickles")
    persistence.pickle = _restricted_pickle_module()


__all__ = ["ALLOWED", "UnsafePointError", "install", "latest_points", "loads", "read_only_client", "read_points"]
