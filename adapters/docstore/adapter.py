"""Adapter for the SQLite docstore: suppressed column, DELETE + VACUUM, byte scan of the file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tombstone.faults import kill_point
from tombstone.fsutil import Snapshot
from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level

from .store import BACKEND, DocStore
from .hooks import DocstoreHooks


class DocstoreAdapter(DocstoreHooks, Adapter):
    """Options: ``path`` (the SQLite file, required), ``secure_delete`` (bool, optional)."""

    backend = BACKEND
    capabilities = frozenset(
        {Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN}
    )
    levels = (Level.LOGICAL, Level.PHYSICAL)

    read_only_supported = True

    def __init__(self, store: str, options: dict[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.source = DocStore(options["path"], store=store, create=False, connect=False)
        """The store's own files (what the physical probe reads)."""
        self._snapshot: Snapshot | None = None
        path = options["path"]
        if self.read_only:
            # SQLite in WAL mode creates -wal and -shm files even for a mode=ro connection, and
            # immutable=1 would not read the WAL: the logical probe reads a private copy instead.
            self._snapshot = Snapshot(prefix="tombstone-docstore-")
            path = self._snapshot.copy_files(self.source.files()) / self.source.path.name
        try:
            self.docs = DocStore(path, store=store, secure_delete=options.get("secure_delete"), create=False)
        except StoreUnavailableError as exc:
            self.close()
            if self._snapshot is None:
                raise
            # the message names the store's own file, not the private copy it was read from
            raise StoreUnavailableError(str(exc).replace(str(path), str(self.source.path)), store=store,
                                        retryable=exc.retryable) from exc
        except BaseException:
            self.close()
            raise
        if not self.read_only:
            self.source = self.docs  # one store object: the files are the ones it has open

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """SQLite's errors, and OSError from the database file itself (reclaim reads its size)."""
        import sqlite3

        return (sqlite3.Error, OSError)

    def close(self) -> None:
        if getattr(self, "docs", None) is not None:
            self.docs.close()
        if self._snapshot is not None:
            self._snapshot.close()

    def lock_path(self) -> Path:
        """The SQLite file: its lock file is ``<file>.tombstone.lock``, the one ``DocStore`` writes take."""
        return Path(self.options["path"])

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return {"mechanism": "suppressed column", "rows_marked": self.docs.mark_suppressed(self._ids(artifacts))}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.docs.delete(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        size_before = self.docs.path.stat().st_size
        deleted = self.docs.delete(self._ids(artifacts))
        kill_point("reclaim:docstore:after-delete")
        self.docs.vacuum()
        return {
            "steps": ["DELETE", "wal_checkpoint(TRUNCATE)", "VACUUM", "wal_checkpoint(TRUNCATE)"],
            "rows_deleted": deleted,
            "secure_delete": self.docs.secure_delete,
            "file_bytes_before": size_before,
            "file_bytes_after": self.docs.path.stat().st_size,
        }

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        ids = self._ids(artifacts)
        listed = {d.id for d in self.docs.all()}
        batch = {d.id for d in self.docs.get_many(ids)}
        raw = self.docs.present_ids(ids)
        results = {}
        for art in artifacts:
            paths = {
                "raw select": art.artifact_id in raw,
                "get": self.docs.get(art.artifact_id) is not None,
                "get_many": art.artifact_id in batch,
                "all": art.artifact_id in listed,
            }
            returned = sorted(name for name, hit in paths.items() if hit)
            results[art.artifact_id] = ProbeResult(
                level=Level.LOGICAL,
                passed=not returned,
                measurement=f"returned by {', '.join(returned)}" if returned else None,
                evidence={"paths": sorted(paths), "returned_by": returned},
            )
        return results

    @classmethod
    def scan_deleted(cls, store: str, options: dict[str, Any]):
        """Free pages, freeblocks and unallocated page space of the SQLite file (``forensics``)."""
        from .forensics import scan_docstore

        return scan_docstore(store, options)

    def physical_root(self) -> Path:
        """The folder holding the SQLite file: every other file in it and below it is read as bytes too (a
        ``docstore.db.bak``, a copy in a sub-folder), but for what a Tombstone deployment keeps there (its
        lineage db, locks, keys, receipts, other stores: ``verify.physical.deployment_owned``)."""
        return self.source.path.parent

    def physical_files(self) -> list[Path]:
        files = self.source.files()
        if not os.access(files[0], os.R_OK):
            raise PhysicalUnsupportedError(f"docstore file {files[0]} is not readable", store=self.store)
        return files
