"""Mem0's SQLite history db: the ``history`` table keeps every memory's old and new text (a delete adds a
row holding the deleted text), the ``messages`` table the last messages of each session. Reading and
purging a set of memories' and messages' rows, with ``secure_delete`` on so SQLite zeroes what it frees."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tombstone.errors import StoreUnavailableError
from tombstone.sqlite_pages import is_sqlite

_PAGE = 500


def check_history(path: Path, store: str) -> None:
    """The history db must be a SQLite file with Mem0's ``history`` table (a path to anything else is refused)."""
    if path.is_symlink() or not path.is_file() or not is_sqlite(path):
        raise StoreUnavailableError(f"store {store!r}: {path} is not a SQLite file (Mem0's history_db_path)",
                                    store=store, retryable=False)
    with connect(path, store) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "history" not in tables:
        raise StoreUnavailableError(f"store {store!r}: {path} has no Mem0 history table", store=store,
                                    retryable=False)


@contextlib.contextmanager
def connect(path: Path, store: str) -> Iterator[sqlite3.Connection]:
    try:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"store {store!r}: cannot open {path}: {exc}", store=store) from exc
    try:
        yield conn
    finally:
        conn.close()


def _hasher(key: Callable[[str], str] | None) -> Callable[[object], str | None]:
    """A row's text as the lineage db records content: SHA-256, keyed by ``key`` (the deployment's secret)."""
    def digest(text: object) -> str | None:
        if not isinstance(text, str):
            return None
        raw = hashlib.sha256(text.encode()).hexdigest()
        return key(raw) if key is not None else raw
    return digest


def _has_messages(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages'").fetchone() is not None


def rows_holding(path: Path, store: str, memory_ids: Sequence[str], message_ids: Sequence[str],
                 hashes: dict[str, str], key: Callable[[str], str] | None) -> dict[str, set[str]]:
    """Which rows still name or hold each artifact: ``history(memory_id)``, ``messages(id)``, and
    ``history(text)`` / ``messages(text)`` — a row whose text hashes to the artifact's recorded content hash,
    whatever id it carries (``hashes``: recorded content hash -> artifact id; ``key`` turns a SHA-256 into the
    recorded form). Every row's text is hashed once."""
    _sha = _hasher(key)
    found: dict[str, set[str]] = {}
    with connect(path, store) as conn:
        for start in range(0, len(memory_ids), _PAGE):
            part = list(memory_ids[start : start + _PAGE])
            marks = ",".join("?" * len(part))
            for (mid,) in conn.execute(f"SELECT DISTINCT memory_id FROM history WHERE memory_id IN ({marks})", part):
                found.setdefault(mid, set()).add("history(memory_id)")
        for old, new in conn.execute("SELECT old_memory, new_memory FROM history"):
            for text in (old, new):
                if (aid := hashes.get(_sha(text) or "")) is not None:
                    found.setdefault(aid, set()).add("history(text)")
        if _has_messages(conn):
            for start in range(0, len(message_ids), _PAGE):
                part = list(message_ids[start : start + _PAGE])
                marks = ",".join("?" * len(part))
                for (mid,) in conn.execute(f"SELECT id FROM messages WHERE id IN ({marks})", part):
                    found.setdefault(mid, set()).add("messages(id)")
            for (content,) in conn.execute("SELECT content FROM messages"):
                if (aid := hashes.get(_sha(content) or "")) is not None:
                    found.setdefault(aid, set()).add("messages(text)")
    return found


def purge(path: Path, store: str, memory_ids: Sequence[str], message_ids: Sequence[str],
          hashes: dict[str, str], key: Callable[[str], str] | None) -> dict[str, int]:
    """Delete, in one transaction with ``secure_delete`` on, every history row of the memories and every row
    (of either table) whose text is an artifact's (by content hash), and the messages by id; then truncate the
    write-ahead log if the db keeps one. Returns the rows deleted per table."""
    counts = {"history": 0, "messages": 0}
    memory_ids = set(memory_ids)
    _sha = _hasher(key)
    with connect(path, store) as conn:
        conn.execute("PRAGMA secure_delete=ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            doomed_history = set()
            for rid, mid, old, new in conn.execute("SELECT id, memory_id, old_memory, new_memory FROM history"):
                if mid in memory_ids or _sha(old) in hashes or _sha(new) in hashes:
                    doomed_history.add(rid)
            doomed_messages = set(message_ids)
            if _has_messages(conn):
                for rid, content in conn.execute("SELECT id, content FROM messages"):
                    if _sha(content) in hashes:
                        doomed_messages.add(rid)
            else:
                doomed_messages = set()
            for table, doomed in (("history", sorted(doomed_history)), ("messages", sorted(doomed_messages))):
                for start in range(0, len(doomed), _PAGE):
                    part = doomed[start : start + _PAGE]
                    cur = conn.execute(f"DELETE FROM {table} WHERE id IN ({','.join('?' * len(part))})", part)
                    counts[table] += cur.rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return counts
