"""``tombstone scan`` for the exact cache: its SQLite file, parsed at page level by the docstore's
``scan_sqlite`` (free pages, freeblocks, unallocated page space), with deleted entries carved by their
``entry_id``."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError
from tombstone.scanreport import ScanReport

ENTRY_PREFIX = "llmcache-"


def _cache_record(values: list[Any]) -> str | None:
    """A cache row (prompt, llm, idx, response, entry_id) or an ``entry_id`` index entry (entry_id, rowid)."""
    if len(values) == 5:
        prompt, llm, idx, _response, ident = values
        if isinstance(prompt, str) and isinstance(llm, str) and isinstance(idx, int) and isinstance(ident, str):
            return ident if ident.startswith(ENTRY_PREFIX) and ident.isprintable() else None
        return None
    if len(values) == 2:
        ident, rowid = values
        if isinstance(ident, str) and isinstance(rowid, int) and ident.startswith(ENTRY_PREFIX) and ident.isprintable():
            return ident
    return None


def scan_exact_cache(store: str, backend: str, table: str, options: Mapping[str, Any]) -> ScanReport:
    from tombstone_adapters.docstore.forensics import scan_sqlite

    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {backend} backend needs path = "..."', store=store)

    def live(conn: sqlite3.Connection) -> set[str]:
        return {i for (i,) in conn.execute(f"SELECT entry_id FROM {table}") if i}

    return scan_sqlite(store, backend, Path(options["path"]), live, (5, 2), _cache_record)
