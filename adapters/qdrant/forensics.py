"""``tombstone scan`` for Qdrant's local mode (``QdrantClient(path=...)``): each collection persists its
points in ``collection/<name>/storage.sqlite`` (``points(id, point)``, the point pickled), and a delete is
a plain SQLite DELETE. The docstore's ``scan_sqlite`` reads a private copy page by page; the deleted
points' Tombstone ids are read out of the pickled payload bytes found in free space (by pattern, never by
unpickling), and count when no live point carries them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError
from tombstone.scanreport import ScanReport

from .wrapper import ID_KEY

# pickle protocol 4: SHORT_BINUNICODE key, MEMOIZE, SHORT_BINUNICODE value
_ID_PATTERN = re.compile(rb"\x8c" + bytes([len(ID_KEY)]) + ID_KEY.encode() + rb"\x94\x8c(.)", re.DOTALL)


def payload_ids(data: bytes) -> set[str]:
    """The ``tombstone_id`` values of the pickled points in ``data``."""
    found = set()
    for match in _ID_PATTERN.finditer(data):
        length = match.group(1)[0]
        raw = data[match.end():match.end() + length]
        if len(raw) == length:
            try:
                found.add(raw.decode("utf-8"))
            except UnicodeDecodeError:
                continue
    return found


def _no_rows(values: list[Any]) -> str | None:
    return None  # the ids live in the pickled payload, read by payload_ids


def scan_qdrant(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    from tombstone_adapters.docstore.forensics import scan_sqlite

    for key in ("path", "collection"):
        if key not in options:
            raise ConfigError(f'store {store!r}: the {backend} backend needs {key} = "..."', store=store)
    database = Path(options["path"]) / "collection" / str(options["collection"]) / "storage.sqlite"

    def live(conn: sqlite3.Connection) -> set[str]:
        out: set[str] = set()
        for (blob,) in conn.execute("SELECT point FROM points"):
            out |= payload_ids(bytes(blob))
        return out

    report = scan_sqlite(store, backend, database, live, (), _no_rows, find_ids=payload_ids)
    report.notes.append("points written without a Tombstone id are counted in bytes only")
    return report
