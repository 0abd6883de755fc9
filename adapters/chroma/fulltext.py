"""Chroma's full-text index (the FTS5 table ``embedding_fulltext_search``) in an in-place reclaim.

FTS5 records a delete as a new entry: the deleted document's terms stay in the segments that held them until
those segments are merged, and a merge of the whole index (``optimize``) rewrites all of it, which at a
million records is most of a reclaim. Its ``secure-delete`` option (SQLite 3.42) takes a deleted row's
entries out of the segments where they lie instead; once a table has used it, FTS5 marks the table's format
as one that SQLite before 3.42 refuses to open. Chroma 1.x writes ``chroma.sqlite3`` through the SQLite
bundled in its Rust bindings (3.46.0 in 1.5.9), which reads and honours it; this Python's ``sqlite3`` module
(3.40.1 here) cannot, so the reclaim's statements on that file run through apsw, which carries its own SQLite.

The first reclaim turns the option on and merges the index in the same transaction, so that no delete made
before (by Chroma's own client, without the option) leaves terms behind, and records that in a marker file in
the persist directory. A later reclaim whose table still has the option on and whose directory has the
marker deletes in place and merges nothing: every delete since, Chroma's included, took its terms with it —
unless it deletes so many documents (a fortieth of the index or more, as a large batch does) that one merge
costs less: it then turns the option off in its delete's transaction and merges, turning it on again, after.
Without apsw the reclaim works on ``sqlite3`` as before, merging every time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tombstone.fsutil import write_atomic

TABLE = "embedding_fulltext_search"
MARKER = ".tombstone-fulltext-secure"
"""In the persist directory: a reclaim turned ``secure-delete`` on and merged the index in one transaction."""


def connect(path: Path) -> Any:
    """A connection to ``chroma.sqlite3`` for the reclaim's statements: apsw's where it is installed (its
    SQLite reads a full-text table that has used ``secure-delete``), else ``sqlite3``'s. Autocommit; waits up
    to 30 s for a lock."""
    try:
        import apsw
    except ImportError:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=30000")
        return conn
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(30000)
    return conn


def is_apsw(conn: Any) -> bool:
    return not isinstance(conn, sqlite3.Connection)


def changed(conn: Any, sql: str, params: Any = ()) -> int:
    """Run one statement; the rows it changed."""
    cur = conn.execute(sql, params)
    return cur.rowcount if isinstance(conn, sqlite3.Connection) else conn.changes()


def present(conn: Any) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone() is not None


def secure(conn: Any) -> bool:
    """Whether the table has ``secure-delete`` on (its config row, read as a plain table)."""
    row = conn.execute(f"SELECT v FROM {TABLE}_config WHERE k = 'secure-delete'").fetchone()  # noqa: S608
    return row is not None and str(row[0]) == "1"


def settled(conn: Any, folder: Path) -> bool:
    """The index has nothing of earlier deletes left to merge: the option on and the marker there."""
    return is_apsw(conn) and present(conn) and secure(conn) and (folder / MARKER).is_file()


MERGE_AT = 40
"""A reclaim that deletes at least one in this many of the index's documents merges the index (one
``optimize``) rather than taking each one's entries out in place: an in-place delete costs about 0.1 to 0.2 ms
a document, a merge about 3 us per document of the index (measured at 20,000, 100,000 and 1,000,000
documents: the two cross between 2.4% and 2.7% of the index), so past a fortieth the merge is the cheaper."""


def documents(conn: Any) -> int:
    """How many documents the index holds (its docsize table's rows, one per document)."""
    return conn.execute(f"SELECT count(*) FROM {TABLE}_docsize").fetchone()[0]  # noqa: S608


def merge_cheaper(conn: Any, deleting: int) -> bool:
    """Whether merging the whole index costs less than deleting ``deleting`` documents in place."""
    try:
        return deleting * MERGE_AT >= documents(conn)
    except Exception:  # noqa: BLE001 - no docsize table (an index made with other options): in place, as before
        return False


def secure_off(conn: Any) -> None:
    """Turn ``secure-delete`` off, inside the caller's transaction: its deletes then only record themselves, and
    the table, no longer ``settled``, is merged by :func:`turn_on_and_merge` (this reclaim's next step, or a
    resumed one's) before any reclaim deletes in place again."""
    conn.execute(f"INSERT INTO {TABLE}({TABLE}, rank) VALUES ('secure-delete', 0)")  # noqa: S608


def turn_on_and_merge(conn: Any, folder: Path) -> bool:
    """Turn ``secure-delete`` on and merge the whole index, in one transaction (on apsw only); on ``sqlite3``
    merge only. Returns whether a merge ran (False: no full-text table). The caller then writes the marker
    (:func:`mark`) where the connection is apsw's."""
    if not present(conn):
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        if is_apsw(conn):
            conn.execute(f"INSERT INTO {TABLE}({TABLE}, rank) VALUES ('secure-delete', 1)")  # noqa: S608
        conn.execute(f"INSERT INTO {TABLE}({TABLE}) VALUES ('optimize')")  # noqa: S608
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True


def mark(folder: Path) -> str | None:
    """Write the marker, after :func:`turn_on_and_merge` committed on apsw. None once written; else why not
    (a folder or an unwritable file at its path): the merge stands, the reclaim does not fail on it, and the
    next reclaim, finding no marker, merges the index again."""
    try:
        write_atomic(folder / MARKER, b"secure-delete on and the index merged by an in-place reclaim\n")
    except OSError as exc:
        return f"{MARKER} not written ({exc.strerror or exc}): the next reclaim merges the full-text index again"
    return None


__all__ = ["MARKER", "MERGE_AT", "TABLE", "changed", "connect", "documents", "is_apsw", "mark", "merge_cheaper",
           "secure_off", "settled", "turn_on_and_merge"]
