"""The exact LLM cache's adapter: suppression, reclaim and probes of the SQLite file that
``TombstoneSQLiteCache`` (``exact_cache``) writes."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import (
    PhysicalUnsupportedError,
    StoreUnavailableError,
    TombstoneError,
)
from tombstone.faults import kill_point
from tombstone.fsutil import Snapshot
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.scanner import check_regular

from .exact_cache import (  # noqa: F401 (re-exported)
    BACKEND,
    TABLE,
    TombstoneLLMCacheRow,
    TombstoneSQLiteCache,
    entry_id,
)
from .hooks import ExactCacheHooks


class ExactCacheAdapter(ExactCacheHooks, Adapter):
    """Options: ``path`` (the SQLite file), ``secure_delete`` (bool, optional)."""

    backend = BACKEND
    capabilities = frozenset({Capability.IMMEDIATE_DELETE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                              Capability.PHYSICAL_SCAN})
    levels = (Level.LOGICAL, Level.PHYSICAL)
    read_only_supported = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.path = Path(options["path"])
        if not self.path.is_file():
            raise StoreUnavailableError(f"no cache database at {self.path}", store=store, retryable=False)
        try:
            check_regular(self.physical_files())  # SQLite would block forever on a FIFO at -journal
        except TombstoneError as exc:
            raise StoreUnavailableError(f"cannot open cache database {self.path}: {exc}", store=store,
                                        retryable=False) from exc
        self._snapshot: Snapshot | None = None
        database = self.path
        if self.read_only:
            # A mode=ro connection to a WAL database still creates its -wal and -shm files: read-only, the
            # logical probe reads a private copy; the physical probe reads the originals.
            self._snapshot = Snapshot(prefix="tombstone-exact-cache-")
            database = self._snapshot.copy_files(self.physical_files()) / self.path.name
        self.conn = sqlite3.connect(database, isolation_level=None, timeout=30)
        if options.get("secure_delete") is not None:
            self.conn.execute(f"PRAGMA secure_delete={'ON' if options['secure_delete'] else 'OFF'}")

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """SQLite's errors, and OSError from the database file itself."""
        return (sqlite3.Error, OSError)

    def close(self) -> None:
        self.conn.close()
        if self._snapshot is not None:
            self._snapshot.close()

    def lock_path(self) -> Path:
        """The SQLite file: its lock file is ``<file>.tombstone.lock``, the one the cache's updates take."""
        return self.path

    def _ids(self, artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def _delete(self, ids: list[str]) -> int:
        return sum(self.conn.execute(f"DELETE FROM {TABLE} WHERE entry_id = ?", (i,)).rowcount for i in ids)

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        # A cache has no hide state: suppression is deletion, and a miss only costs a recomputation.
        return {"mechanism": "row deleted at suppression (a cache has no hide state)",
                "rows_deleted": self._delete(self._ids(artifacts))}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self._delete(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        deleted = self._delete(self._ids(artifacts))
        kill_point("reclaim:exact_cache:after-delete")
        mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.execute("VACUUM")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": ["DELETE (again, idempotent)", "VACUUM"], "rows_deleted": deleted, "journal_mode": mode,
                "secure_delete": bool(self.conn.execute("PRAGMA secure_delete").fetchone()[0])}

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        results = {}
        for art in artifacts:
            hit = self.conn.execute(f"SELECT count(*) FROM {TABLE} WHERE entry_id = ?", (art.artifact_id,)).fetchone()[0]
            results[art.artifact_id] = ProbeResult(
                level=Level.LOGICAL, passed=not hit, measurement=f"{hit} cached generation(s) still stored" if hit else None,
                evidence={"paths": ["select by entry_id"],
                          "note": "a lookup needs the prompt, which Tombstone never keeps; the entry id stands for it"})
        return results

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Free pages, freeblocks and unallocated page space of the cache's SQLite file (``forensics``)."""
        from .forensics import scan_exact_cache

        return scan_exact_cache(store, cls.backend, TABLE, options)

    def physical_root(self) -> Path:
        """The folder holding the cache database: every other file in it and below it is read as bytes too,
        but for what a Tombstone deployment keeps there (``verify.physical.deployment_owned``)."""
        return self.path.parent

    def physical_files(self) -> list[Path]:
        if not os.access(self.path, os.R_OK):
            raise PhysicalUnsupportedError(f"cache database {self.path} is not readable", store=self.store)
        return [self.path] + [Path(f"{self.path}{s}") for s in ("-wal", "-journal", "-shm")]
