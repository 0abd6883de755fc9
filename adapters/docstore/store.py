"""A SQLite document store, wrapped: lineage recorded on insert, suppressed rows never returned."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.errors import StoreUnavailableError, TombstoneError
from tombstone.fsutil import create_private
from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture.writes import check_write
from tombstone.lineage.db import ArtifactRecord, LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for
from tombstone.verify.scanner import check_regular

BACKEND = "docstore"
_METADATA_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id         TEXT PRIMARY KEY,
    text       TEXT NOT NULL,
    metadata   TEXT NOT NULL DEFAULT '{}',
    suppressed INTEGER NOT NULL DEFAULT 0
)
"""


@dataclass(frozen=True)
class Document:
    """A document as the store returns it."""

    id: str
    """The document's id; also its artifact id."""
    text: str
    """The document's content."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON metadata."""


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class DocStore:
    """Documents in one SQLite file (WAL mode).

    Pass ``lineage`` to record every insert in the lineage db (the app-facing wrapper); without it
    the store is opened bare (what the adapter uses). Every read path excludes suppressed rows.
    ``secure_delete`` sets SQLite's pragma of that name on this connection; ``None`` keeps the
    library default (on for this machine's Python build, off in upstream SQLite).

    Writes hold the store's lock (``<file>.tombstone.lock``, beside it; ``tombstone.storelock``), waiting
    at most ``lock_wait`` seconds while an erasure changes or probes the file.

    A file it creates is mode 0600 (its ``-wal``/``-shm`` take that mode), and the folders it creates for it
    0700: it holds document text. A file or folder that was already there keeps its mode.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        lineage: LineageDB | None = None,
        store: str = BACKEND,
        secure_delete: bool | None = None,
        create: bool = True,
        lock_wait: float = STORE_LOCK_WAIT,
        connect: bool = True,
    ) -> None:
        """``connect=False`` only checks that the file is there (for its path and its file list)."""
        self.path = Path(path)
        self.lineage = lineage
        self.store = store
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        """Ids an erasure has recorded as suppressed and not yet reclaimed: hidden from that moment, before
        the row's flag is set."""
        if not create and not self.path.is_file():
            raise StoreUnavailableError(f"docstore file not found: {self.path}", store=store, retryable=False)
        if not connect:
            return
        try:
            check_regular(self.files())  # SQLite would block forever on a FIFO at -journal
        except TombstoneError as exc:
            raise StoreUnavailableError(f"cannot open docstore {self.path}: {exc}", store=store, retryable=False) from exc
        try:
            if create:
                # A new store is private: folders 0700, the file 0600 before SQLite opens it (its -wal and
                # -shm take its mode). A file or folder that is already there keeps its mode.
                create_private(self.path)
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self._conn.execute("PRAGMA journal_mode=WAL")
            if secure_delete is not None:
                self._conn.execute(f"PRAGMA secure_delete={'ON' if secure_delete else 'OFF'}")
            self._conn.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailableError(f"cannot open docstore {self.path}: {exc}", store=store) from exc
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create docstore {self.path}: {exc.strerror or exc}", store=store,
                                        retryable=False) from exc
        self.lock = StoreLock(lock_file_for(self.path), wait=lock_wait, store=store)

    def close(self) -> None:
        self._conn.close()

    @property
    def secure_delete(self) -> bool:
        return bool(self._conn.execute("PRAGMA secure_delete").fetchone()[0])

    # -- writes -------------------------------------------------------------------------------

    def add(self, doc_id: str, text: str, *, subject: str, metadata: Mapping[str, Any] | None = None) -> None:
        self.add_many([(doc_id, text, metadata or {})], subject=subject)

    def add_many(self, docs: Iterable[tuple[str, str, Mapping[str, Any]]], *, subject: str) -> None:
        """Insert documents owned by ``subject``.

        Lineage is written before the store, in its own transaction: assume the store write will
        fail. A lineage row without its document costs nothing (the probe finds it absent); a
        document without its lineage row could never be erased.
        """
        if self.lineage is not None:
            check_write(self.lineage, self.store, [subject])
        docs = [(str(i), str(t), dict(m)) for i, t, m in docs]
        if self.lineage is not None:
            self.lineage.record_artifacts(
                subject,
                [
                    ArtifactRecord(
                        store=self.store,
                        artifact_id=doc_id,
                        backend=BACKEND,
                        kind="document",
                        content_hash=content_hash(text),
                    )
                    for doc_id, text, _ in docs
                ],
            )
        try:
            with self.lock:
                # An id an erasure has suppressed stays hidden when it is written again (and a row already
                # hidden stays hidden) until the erasure has removed it.
                hidden = suppressed_among(self.lineage, self.store, [i for i, _, _ in docs])
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany(
                    "INSERT INTO documents (id, text, metadata, suppressed) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET text = excluded.text, metadata = excluded.metadata,"
                    " suppressed = max(documents.suppressed, excluded.suppressed)",
                    [(i, t, json.dumps(m, sort_keys=True), int(i in hidden)) for i, t, m in docs],
                )
                self._conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self._rollback()
            raise StoreUnavailableError(f"docstore write failed: {exc}", store=self.store) from exc

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    # -- reads (every one excludes suppressed rows) -------------------------------------------

    def _hidden_now(self) -> frozenset[str]:
        return self.hidden.current() if self.hidden is not None else frozenset()

    def _rows(self, where: str = "", params: Sequence[Any] = ()) -> list[Document]:
        sql = "SELECT id, text, metadata FROM documents WHERE suppressed = 0"
        if where:
            sql += f" AND ({where})"
        hidden = self._hidden_now()
        if hidden:
            sql += " AND id NOT IN (SELECT value FROM json_each(?))"
            params = [*params, json.dumps(sorted(hidden))]
        try:
            rows = self._conn.execute(sql + " ORDER BY id", params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailableError(f"docstore read failed: {exc}", store=self.store) from exc
        return [Document(i, t, json.loads(m)) for i, t, m in rows if i not in hidden]

    def get(self, doc_id: str) -> Document | None:
        rows = self._rows("id = ?", (doc_id,))
        return rows[0] if rows else None

    def get_many(self, ids: Sequence[str]) -> list[Document]:
        ids = list(ids)
        if not ids:
            return []
        return self._rows(f"id IN ({','.join('?' * len(ids))})", ids)

    def find(self, **metadata: Any) -> list[Document]:
        """Documents whose metadata has every given key equal to the given value."""
        clauses, params = [], []
        for key, value in metadata.items():
            if not _METADATA_KEY.match(key):
                raise TombstoneError(f"invalid metadata key {key!r}")
            clauses.append("json_extract(metadata, ?) = ?")
            params += [f"$.{key}", value]
        return self._rows(" AND ".join(clauses), params)

    def search(self, text: str) -> list[Document]:
        """Documents whose text contains ``text``."""
        return self._rows("instr(text, ?) > 0", (text,))

    def all(self) -> list[Document]:
        return self._rows()

    def count(self) -> int:
        hidden = self._hidden_now()
        if not hidden:
            return self._conn.execute("SELECT count(*) FROM documents WHERE suppressed = 0").fetchone()[0]
        return self._conn.execute("SELECT count(*) FROM documents WHERE suppressed = 0 AND id NOT IN"
                                  " (SELECT value FROM json_each(?))", (json.dumps(sorted(hidden)),)).fetchone()[0]

    # -- used by the adapter ------------------------------------------------------------------

    def present_ids(self, ids: Sequence[str]) -> set[str]:
        """Which ids have a row at all, suppressed or not (what raw SQL would return)."""
        ids = list(ids)
        if not ids:
            return set()
        rows = self._conn.execute(f"SELECT id FROM documents WHERE id IN ({','.join('?' * len(ids))})", ids)
        return {row[0] for row in rows}

    def _execute_many(self, sql: str, ids: Sequence[str]) -> int:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            changed = sum(self._conn.execute(sql, (i,)).rowcount for i in ids)
            self._conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self._rollback()
            raise StoreUnavailableError(f"docstore write failed: {exc}", store=self.store) from exc
        return changed

    def mark_suppressed(self, ids: Sequence[str]) -> int:
        return self._execute_many("UPDATE documents SET suppressed = 1 WHERE id = ?", ids)

    def delete(self, ids: Sequence[str]) -> int:
        """Plain DELETE: what an app would call. Bytes may stay in free pages and the WAL."""
        return self._execute_many("DELETE FROM documents WHERE id = ?", ids)

    def checkpoint(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def vacuum(self) -> None:
        try:
            self.checkpoint()
            self._conn.execute("VACUUM")
            self.checkpoint()
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailableError(f"docstore VACUUM failed: {exc}", store=self.store) from exc

    def files(self) -> list[Path]:
        return [self.path] + [Path(f"{self.path}{suffix}") for suffix in ("-wal", "-journal", "-shm")]
