"""sqlite-vec, wrapped: a ``vec0`` table in one SQLite file, lineage recorded on write, suppressed rows
never returned.

Python's own ``sqlite3`` here cannot load extensions (its build leaves them out), so the file is opened
with ``apsw``, which carries its own SQLite and loads the ``sqlite_vec`` extension. ``VecStore.connection``
is that connection: the app's own SQL (``vec_distance_cosine``, KNN queries on the table) keeps working.

The table is ``vec0(id text primary key, embedding float[DIM] distance_metric=cosine, +text text,
+metadata text)``; beside it ``<table>_tombstone_hidden`` lists the ids an erasure has suppressed. vec0
keeps its data in shadow tables: ``<table>_rowids`` (id → chunk and offset), ``<table>_chunks`` (a validity
bitmap per chunk of rows), ``<table>_vector_chunks00`` (each chunk's vectors, one float32 blob) and
``<table>_auxiliary`` (the ``+`` columns). Its own ``DELETE`` removes the row's id and auxiliary row and
clears its validity bit, but leaves the vector where it lies in the chunk's blob (sqlite-vec 0.1.6).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture.vector import Embedder, embed, record_write
from tombstone.errors import StoreUnavailableError, TombstoneError
from tombstone.fsutil import create_private
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for
from tombstone.verify.scanner import check_regular

BACKEND = "sqlitevec"
TESTED_VERSIONS = ("v0.1.6",)
"""The sqlite-vec releases this backend knows the storage of (the extra pins the first): a delete in another
may leave the vector elsewhere, so any other is refused."""
DEFAULT_TABLE = "chunks"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_PAGE = 500


@dataclass(frozen=True)
class Hit:
    """One result of a search: the id, its cosine distance, its text and metadata."""

    id: str
    distance: float
    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


def table_name(store: str, name: Any) -> str:
    """The vec0 table's name, refused unless it is a plain SQL identifier (it is spliced into statements)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise StoreUnavailableError(f"store {store!r}: table = {name!r} is not a plain SQL name (letters, digits"
                                    " and underscores, not starting with a digit)", store=store, retryable=False)
    return name


def connect(path: Path, store: str, *, create: bool = False) -> Any:
    """An apsw connection to ``path`` with sqlite-vec loaded, after checking the release is a tested one."""
    try:
        import apsw
        import sqlite_vec
    except ImportError as exc:
        raise StoreUnavailableError(f"the {BACKEND} backend needs apsw and sqlite-vec: pip install"
                                    f" 'tombstone-rag[sqlitevec]' ({exc})", store=store, retryable=False) from exc
    if not create and not path.is_file():
        raise StoreUnavailableError(f"no sqlite-vec database at {path}", store=store, retryable=False)
    try:
        check_regular([path] + [Path(f"{path}{s}") for s in ("-wal", "-journal", "-shm")])
    except TombstoneError as exc:
        raise StoreUnavailableError(f"cannot open {path}: {exc}", store=store, retryable=False) from exc
    try:
        if create:
            create_private(path)
        conn = apsw.Connection(str(path))
        conn.set_busy_timeout(30_000)
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        conn.enable_load_extension(False)
        version = conn.execute("SELECT vec_version()").fetchone()[0]
    except apsw.Error as exc:
        raise StoreUnavailableError(f"cannot open sqlite-vec database {path}: {exc}", store=store) from exc
    except OSError as exc:
        raise StoreUnavailableError(f"cannot create {path}: {exc.strerror or exc}", store=store,
                                    retryable=False) from exc
    if version not in TESTED_VERSIONS:
        conn.close()
        raise StoreUnavailableError(f"sqlite-vec {version} is outside the tested range ({', '.join(TESTED_VERSIONS)}):"
                                    " where it keeps a deleted vector is not known to this release; install"
                                    f" sqlite-vec=={TESTED_VERSIONS[0].lstrip('v')}", store=store, retryable=False)
    return conn


def cleared_slots(size: int, validity: bytes, vectors: bytes, width: int) -> list[int]:
    """The offsets of a vec0 chunk whose validity bit is clear (no row holds them: deleted, or never written)
    but whose ``width`` bytes in the chunk's vector blob are not all zero: a deleted row's vector, left there."""
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    used = min(size, len(bits), len(vectors) // width) if width else 0
    if not used:
        return []
    slots = np.frombuffer(vectors, dtype=np.uint8)[: used * width].reshape(used, width)
    return [int(n) for n in np.flatnonzero((bits[:used] == 0) & slots.any(axis=1))]


class VecStore:
    """Chunks with their embeddings in a vec0 table. Pass ``lineage`` and ``embedder`` to write (the app-facing
    wrapper); without them the store is opened bare (what the adapter uses). Every read leaves out suppressed
    ids. Writes hold the store's lock (``<file>.tombstone.lock``), waiting at most ``lock_wait`` seconds while
    an erasure changes or probes the file. A file it creates is mode 0600."""

    def __init__(self, path: str | Path, *, table: str = DEFAULT_TABLE, dim: int | None = None,
                 lineage: LineageDB | None = None, embedder: Embedder | None = None, store: str = BACKEND,
                 create: bool = True, lock_wait: float = STORE_LOCK_WAIT) -> None:
        self.path = Path(path)
        self.store = store
        self.table = table_name(store, table)
        self.lineage = lineage
        self.embedder = embedder
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        self.lock = StoreLock(lock_file_for(self.path), wait=lock_wait, store=store)
        self.connection = connect(self.path, store, create=create)
        import apsw

        self._errors = (apsw.Error,)
        try:
            if not self._exists(self.table):
                if not create or dim is None:
                    self.close()
                    raise StoreUnavailableError(f"{self.path} has no vec0 table {self.table!r}", store=store,
                                                retryable=False)
                self.connection.execute(
                    f"CREATE VIRTUAL TABLE {self.table} USING vec0(id text primary key,"
                    f" embedding float[{int(dim)}] distance_metric=cosine, +text text, +metadata text)")
            self.connection.execute(f"CREATE TABLE IF NOT EXISTS {self.table}_tombstone_hidden (id TEXT PRIMARY KEY)")
            self.dim = self._dim()
        except apsw.Error as exc:
            self.close()
            raise StoreUnavailableError(f"cannot open table {self.table!r} of {self.path}: {exc}", store=store) from exc

    def close(self) -> None:
        if getattr(self, "connection", None) is not None:
            self.connection.close()
            self.connection = None

    def _exists(self, name: str) -> bool:
        return self.connection.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None

    def _dim(self) -> int:
        sql = self.connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (self.table,)).fetchone()[0]
        found = re.search(r"embedding\s+float\[(\d+)\]", sql)
        if not found or "using vec0" not in sql.lower():
            raise StoreUnavailableError(f"{self.table!r} in {self.path} is not a vec0 table with a float[N]"
                                        " column named embedding", store=self.store, retryable=False)
        return int(found.group(1))

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        try:
            return list(self.connection.execute(sql, params))
        except self._errors as exc:
            raise StoreUnavailableError(f"sqlite-vec statement failed on {self.path}: {exc}", store=self.store) from exc

    # -- writes -------------------------------------------------------------------------------

    def add(self, ids: Sequence[str], texts: Sequence[str] | None = None, *, subject: str,
            metadatas: Sequence[Mapping[str, Any] | None] | None = None, vectors: Any = None,
            sources: Sequence[Sequence[tuple[str, str, str]]] | None = None) -> None:
        """Write chunks for ``subject`` (lineage first, then the rows, in one transaction under the lock). An id
        an erasure has suppressed stays hidden when it is written again, until the erasure has removed it.
        ``sources``, one list per id, are the (store, artifact id, relation) records each chunk was cut from:
        erasing one of them reaches the chunk."""
        if self.lineage is None or self.embedder is None:
            raise ValueError("this store was opened bare (no lineage db or embedder): it cannot write")
        ids = [str(i) for i in ids]
        written = record_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                               documents=texts, embeddings=vectors, subject=subject, sources=sources)
        vecs = written
        docs = list(texts) if texts is not None else [None] * len(ids)
        metas = list(metadatas) if metadatas is not None else [None] * len(ids)
        rows = [(i, np.asarray(v, dtype="<f4").tobytes(), d, json.dumps(dict(m or {}), sort_keys=True))
                for i, v, d, m in zip(ids, vecs, docs, metas)]
        with self.lock:
            hidden = suppressed_among(self.lineage, self.store, ids)
            try:
                with self.connection:
                    self.connection.executemany(f"DELETE FROM {self.table} WHERE id = ?", [(i,) for i in ids])
                    self.connection.executemany(
                        f"INSERT INTO {self.table}(id, embedding, text, metadata) VALUES (?, ?, ?, ?)", rows)
                    self.connection.executemany(f"INSERT OR IGNORE INTO {self.table}_tombstone_hidden(id) VALUES (?)",
                                                [(i,) for i in ids if i in hidden])
            except self._errors as exc:
                raise StoreUnavailableError(f"sqlite-vec write failed on {self.path}: {exc}", store=self.store) from exc

    # -- reads (every one leaves out suppressed ids) ------------------------------------------

    def _hidden_now(self) -> frozenset[str]:
        flagged = {i for (i,) in self._run(f"SELECT id FROM {self.table}_tombstone_hidden")}
        return frozenset(flagged | (self.hidden.current() if self.hidden is not None else frozenset()))

    def search(self, query: Any = None, *, text: str | None = None, k: int = 4) -> list[Hit]:
        """The ``k`` nearest chunks to ``query`` (a vector) or to ``text`` (embedded), nearest first."""
        if text is not None:
            if self.embedder is None:
                raise ValueError("searching by text needs an embedder")
            query = embed(self.embedder, [text])[0]
        hidden = self._hidden_now()
        rows = self._knn(query, k + len(hidden))
        return [Hit(i, d, t, json.loads(m or "{}")) for i, d, t, m in rows if i not in hidden][:k]

    def _knn(self, query: Any, k: int) -> list[tuple]:
        if k <= 0:
            return []
        blob = np.asarray(query, dtype="<f4").reshape(-1)[: self.dim].tobytes()
        return self._run(f"SELECT id, distance, text, metadata FROM {self.table} WHERE embedding MATCH ? AND k = ?"
                         " ORDER BY distance", (blob, int(k)))

    def get(self, ids: Sequence[str]) -> list[Hit]:
        """The chunks of ``ids`` that are stored and not suppressed (distance 0)."""
        hidden = self._hidden_now()
        out = []
        for start in range(0, len(ids), _PAGE):
            part = [str(i) for i in ids[start : start + _PAGE] if str(i) not in hidden]
            if part:
                marks = ",".join("?" * len(part))
                out += [Hit(i, 0.0, t, json.loads(m or "{}"))
                        for i, t, m in self._run(f"SELECT id, text, metadata FROM {self.table} WHERE id IN ({marks})", part)]
        return out

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of ``ids`` (suppressed ones left out)."""
        out = {}
        for hit in self.get(ids):
            blob = self._run(f"SELECT embedding FROM {self.table} WHERE id = ?", (hit.id,))[0][0]
            out[hit.id] = np.frombuffer(blob, dtype="<f4").copy()
        return out

    def all_ids(self) -> list[str]:
        hidden = self._hidden_now()
        return sorted(i for (i,) in self._run(f"SELECT id FROM {self.table}") if i not in hidden)

    def count(self) -> int:
        return len(self.all_ids())

    def delete(self, ids: Sequence[str]) -> int:
        """vec0's own delete (what an app calls): the id and the text go; the vector stays in its chunk."""
        with self.lock:
            before = self._run(f"SELECT count(*) FROM {self.table}")[0][0]
            try:
                with self.connection:
                    self.connection.executemany(f"DELETE FROM {self.table} WHERE id = ?", [(str(i),) for i in ids])
            except self._errors as exc:
                raise StoreUnavailableError(f"sqlite-vec delete failed on {self.path}: {exc}", store=self.store) from exc
            return before - self._run(f"SELECT count(*) FROM {self.table}")[0][0]

    def files(self) -> list[Path]:
        return [self.path] + [Path(f"{self.path}{suffix}") for suffix in ("-wal", "-journal", "-shm")]


__all__ = ["BACKEND", "DEFAULT_TABLE", "Hit", "TESTED_VERSIONS", "VecStore", "cleared_slots", "connect", "table_name"]
