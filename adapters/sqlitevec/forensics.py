"""``tombstone scan`` for sqlite-vec: what vec0's own delete and SQLite's free space still hold.

Two places, read from a private copy (the store's file is never opened):

- the file's free space (free pages, freeblocks, the gaps of pages), carved for deleted rows of the id map
  ``<table>_rowids`` (rowid, id, chunk id, offset) and of its index on id, as the docstore's scan does;
- each chunk's vectors (``<table>_vector_chunks00``): a slot whose validity bit vec0 cleared on delete but
  whose float32 bytes are not all zero still holds the deleted row's vector.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.errors import ConfigError
from tombstone.fsutil import Snapshot
from tombstone.scanreport import ScanPlace, ScanReport
from tombstone_adapters.docstore.forensics import carve_budget, index_row_id, scan_sqlite

from .store import BACKEND, DEFAULT_TABLE, cleared_slots, table_name


def _rowids_record(values: list[Any]) -> str | None:
    """A row of ``<table>_rowids`` (rowid as NULL, id, chunk id, offset) or of its index on id (id, rowid)."""
    if len(values) == 4:
        _rowid, ident, chunk, offset = values
        if isinstance(ident, str) and isinstance(chunk, int) and isinstance(offset, int) and chunk > 0 and offset >= 0:
            return ident if ident and ident.isprintable() else None
        return None
    return index_row_id(values)


def _cleared_slots(database: Path, table: str) -> tuple[int, int, int]:
    """(slots cleared but not zeroed, their non-zero bytes, chunks looked at), from a copy of the file."""
    with Snapshot(prefix="tombstone-sqlitevec-scan-") as snap:
        copy = snap.copy_files([database, Path(f"{database}-wal")]) / database.name
        conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        try:
            dim_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            import re

            found = re.search(r"float\[(\d+)\]", dim_sql[0] if dim_sql else "")
            if not found:
                return 0, 0, 0
            width = int(found.group(1)) * 4
            chunks = conn.execute(f"SELECT c.chunk_id, c.size, c.validity, v.vectors FROM {table}_chunks c"
                                  f" JOIN {table}_vector_chunks00 v ON v.rowid = c.chunk_id").fetchall()
        finally:
            conn.close()
    count = nonzero = 0
    for _chunk, size, validity, vectors in chunks:
        for offset in cleared_slots(size, validity, vectors, width):
            count += 1
            nonzero += int(np.count_nonzero(np.frombuffer(vectors, dtype=np.uint8)[offset * width : (offset + 1) * width]))
    return count, nonzero, len(chunks)


def scan_sqlitevec(store: str, options: Mapping[str, Any]) -> ScanReport:
    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {BACKEND} backend needs path = "..."', store=store)
    table = table_name(store, options.get("table", DEFAULT_TABLE))
    database = Path(options["path"])

    def live(conn: sqlite3.Connection) -> set[str]:
        return {i for (i,) in conn.execute(f"SELECT id FROM {table}_rowids")}

    report = scan_sqlite(store, BACKEND, database, live, (4, 2), _rowids_record, budget=carve_budget(store, options))
    count, nonzero, chunks = _cleared_slots(database, table)
    report.places.append(ScanPlace(
        place=f"{table}_vector_chunks00", kind="vec0 slots marked deleted", count=count, bytes=nonzero,
        note=f"{chunks} chunk(s): vectors whose validity bit vec0 cleared on delete but whose bytes it left"))
    return report


__all__ = ["scan_sqlitevec"]
