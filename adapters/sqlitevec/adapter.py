"""Adapter for sqlite-vec: a hidden-ids table, a reclaim that zeroes the vector where vec0 leaves it, byte scan
of the file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError
from tombstone.faults import kill_point
from tombstone.lineage.db import ArtifactRecord
from tombstone.sqlite_pages import zero_all_free_space
from tombstone.verify.levels import Level
from tombstone.verify.logical import fit_dim, paths_result, probe_set
from tombstone.verify.neighbourhood import Neighbours

from .hooks import SqliteVecHooks
from .store import BACKEND, DEFAULT_TABLE, VecStore, cleared_slots

_PAGE = 500


class SqliteVecAdapter(SqliteVecHooks, Adapter):
    """Options: ``path`` (the SQLite file, required) and ``table`` (the vec0 table; default ``chunks``)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)
    experimental = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.vec = VecStore(options["path"], table=options.get("table", DEFAULT_TABLE), store=store, create=False)

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        import apsw

        return (apsw.Error, OSError)

    def close(self) -> None:
        if getattr(self, "vec", None) is not None:
            self.vec.close()

    def lock_path(self) -> Path:
        return Path(self.options["path"])

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        ids = self._ids(artifacts)
        with self.vec.connection:
            self.vec.connection.executemany(f"INSERT OR IGNORE INTO {self.vec.table}_tombstone_hidden(id) VALUES (?)",
                                            [(i,) for i in ids])
        return {"mechanism": f"ids listed in {self.vec.table}_tombstone_hidden (every wrapper read leaves them out)",
                "ids_hidden": len(ids)}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.vec.delete(self._ids(artifacts))

    def _slots(self, ids: list[str]) -> list[tuple[str, int, int]]:
        """(id, chunk id, offset in the chunk) of each id that still has a row."""
        out = []
        for start in range(0, len(ids), _PAGE):
            part = ids[start : start + _PAGE]
            out += self.vec._run(f"SELECT id, chunk_id, chunk_offset FROM {self.vec.table}_rowids"
                                 f" WHERE id IN ({','.join('?' * len(part))})", part)
        return out

    def _vector_tables(self) -> list[str]:
        """vec0's vector shadow tables of the table: ``<table>_vector_chunks00``, one per vector column."""
        prefix = f"{self.vec.table}_vector_chunks"
        return [name for (name,) in self.vec._run("SELECT name FROM sqlite_master WHERE type = 'table'")
                if name.startswith(prefix) and name[len(prefix):].isdigit()]

    def _zero_cleared_slots(self) -> tuple[int, int]:
        """Zero, where it lies, every vector of a chunk slot whose validity bit is clear: vec0's delete (this
        reclaim's, or the app's own before it) leaves the vector in its chunk's blob. A live row's slot has its
        bit set and is never written. Returns (slots zeroed, chunks read)."""
        conn, table = self.vec.connection, self.vec.table
        width = self.vec.dim * 4  # float32
        chunks = self.vec._run(f"SELECT chunk_id, size, validity FROM {table}_chunks")
        zeroed = 0
        for name in self._vector_tables():
            for chunk, size, validity in chunks:
                blob = conn.blob_open("main", name, "vectors", chunk, True)
                try:
                    for offset in cleared_slots(size, validity, blob.read(), width):
                        blob.seek(offset * width)
                        blob.write(bytes(width))
                        zeroed += 1
                finally:
                    blob.close()
        return zeroed, len(chunks)

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        conn, table = self.vec.connection, self.vec.table
        ids = self._ids(artifacts)
        size_before = self.vec.path.stat().st_size
        rows = len(self._slots(ids))
        conn.execute("PRAGMA secure_delete=ON")  # the deleted rows' cells and pages are zeroed as they are freed
        with conn:
            for start in range(0, len(ids), _PAGE):
                part = ids[start : start + _PAGE]
                marks = ",".join("?" * len(part))
                conn.execute(f"DELETE FROM {table} WHERE id IN ({marks})", part)
                conn.execute(f"DELETE FROM {table}_tombstone_hidden WHERE id IN ({marks})", part)
            kill_point("reclaim:sqlitevec:deleted")
            zeroed, chunks = self._zero_cleared_slots()
        kill_point("reclaim:sqlitevec:after-delete")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # what the app's own deletes left, with secure_delete off, in free space: zeroed where it lies
        self.vec.close()
        try:
            free = zero_all_free_space(self.vec.path, kill="reclaim:sqlitevec:free-space-page")
        finally:
            self.vec = VecStore(self.options["path"], table=table, store=self.store, create=False)
        if free is None:
            # a file the pass does not edit in place (WAL mode, another layout): written anew instead
            self.compact()
        steps = ["DELETE the rows with secure_delete on",
                 "zero every vector whose chunk slot is marked deleted (<table>_vector_chunks)",
                 "wal_checkpoint(TRUNCATE)",
                 "zero the free space of every page" if free is not None else
                 f"VACUUM ({mode} journal: the free space is not zeroed in place), wal_checkpoint(TRUNCATE)"]
        return {"steps": steps, "rows_deleted": rows, "vectors_zeroed": zeroed, "chunks_read": chunks, "journal_mode": mode,
                "free_space": free, "file_bytes_before": size_before, "file_bytes_after": self.vec.path.stat().st_size}

    def compact(self) -> dict[str, Any]:
        """VACUUM: the whole file written anew (every page, free space and freelist included)."""
        conn = self.vec.connection
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": ["wal_checkpoint(TRUNCATE)", "VACUUM", "wal_checkpoint(TRUNCATE)"]}

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        probe_vectors = probe_vectors or {}
        ids = self._ids(artifacts)
        raw = {i for (i, _c, _o) in self._slots(ids)}
        wrapped = {h.id for h in self.vec.get(ids)}
        listed = set(self.vec.all_ids())
        results = {}
        for art in artifacts:
            aid = art.artifact_id
            paths = {"raw select(id)": aid in raw, "wrapper.get(ids)": aid in wrapped, "wrapper.all_ids": aid in listed}
            queries = probe_set(art.fingerprint, probe_vectors.get(aid, []), self.vec.dim) if aid in raw else []
            for label, vector in queries:
                found = {row[0] for row in self.vec._knn(fit_dim(vector, self.vec.dim), 40)}
                paths[f"raw.knn40({label})"] = aid in found
            results[aid] = paths_result(paths, len(queries), None if aid in raw else
                                        "a KNN query names each result through"
                                        f" {self.vec.table}_rowids, which holds no row for this id")
        return results

    # -- the semantic level's questions, asked of the raw table (suppressed rows included) ---------

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """Each query's ``k`` nearest rows (vec0's KNN, cosine distance) with ``exclude`` left out, and their
        stored vectors."""
        dim = self.vec.dim
        found = []
        for vector in np.asarray(vectors, dtype=np.float32).reshape(-1, dim if np.asarray(vectors).size else 1):
            rows = self.vec._knn(fit_dim(vector, dim), k + len(exclude))
            found.append([(i, float(d)) for i, d, *_rest in rows if i not in exclude][:k])
        stored = self.stored_vectors(sorted({i for rows in found for i, _ in rows}))
        return [Neighbours([i for i, _ in rows if i in stored], [d for i, d in rows if i in stored],
                           np.asarray([stored[i] for i, _ in rows if i in stored], dtype=np.float32).reshape(-1, dim))
                for rows in found]

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        ids = [str(i) for i in ids]
        out = {}
        for start in range(0, len(ids), _PAGE):
            part = ids[start : start + _PAGE]
            for aid, blob in self.vec._run(f"SELECT id, embedding FROM {self.vec.table} WHERE id IN"
                                           f" ({','.join('?' * len(part))})", part):
                out[aid] = np.frombuffer(blob, dtype="<f4").copy()
        return out

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Deleted rows in the file's free space, and vectors vec0 marked deleted but left in their chunk
        (``forensics``)."""
        from .forensics import scan_sqlitevec

        return scan_sqlitevec(store, options)

    def physical_root(self) -> Path:
        """The folder holding the file: every other file in it and below is read too (a ``.bak``, a copy)."""
        return self.vec.path.parent

    def physical_files(self) -> list[Path]:
        files = self.vec.files()
        if not os.access(files[0], os.R_OK):
            raise PhysicalUnsupportedError(f"sqlite-vec file {files[0]} is not readable", store=self.store)
        return files
