"""Adapter for LanceDB (local): hidden-ids table, a reclaim that rewrites the fragments holding deleted rows and
removes every older version, byte scan and decode of every file of the table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.contract import Adapter, Capability, ExtraFinding, ProbeResult
from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.faults import kill_point
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.logical import fit_dim, paths_result, probe_set
from tombstone.verify.neighbourhood import Neighbours

from .hooks import LanceDBHooks
from .store import (BACKEND, HIDDEN_SUFFIX, TombstoneLanceTable, check_release, checked_name, hidden_ids, hide, quoted, table_names,
                    table_path)

_PAGE = 1000
TOP = 40


def _flag(store: str, options: Mapping[str, Any], name: str) -> bool:
    value = options.get(name, False)
    if isinstance(value, bool):
        return value
    raise ConfigError(f"store {store!r}: {name} = {value!r} is not true or false", store=store)


class LanceDBAdapter(LanceDBHooks, Adapter):
    """Options: ``path`` (the local database folder, as passed to ``lancedb.connect``; required), ``table`` (required), ``id_column`` (default
    ``id``), ``vector_column`` (default ``vector``), ``remove_tags`` (default false: a tag whose version still
    holds an erased row is never deleted; the artifact ends RESIDUAL(physical) naming it)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path", "table")
        check_release(store)
        self.remove_tags = _flag(store, options, "remove_tags")
        self.uri = Path(options["path"])
        if not self.uri.is_dir():
            raise StoreUnavailableError(f"no LanceDB database folder at {self.uri}", store=store, retryable=False)
        self.name = checked_name(store, "table", options["table"])
        self._open()

    def _open(self) -> None:
        import lancedb

        # every read and write of the adapter sees the latest version, whoever committed it
        self.db = lancedb.connect(str(self.uri), read_consistency_interval=timedelta(0))
        self.wrapped = TombstoneLanceTable(self.db, self.name, store=self.store,
                                           id_column=self.options.get("id_column", "id"),
                                           vector_column=self.options.get("vector_column", "vector"))
        self.table = self.wrapped.table

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        return (OSError, ValueError, RuntimeError)

    def lock_path(self) -> Path:
        return table_path(self.uri, self.name)

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def _dataset(self, version: int | None = None) -> Any:
        import lance

        return lance.dataset(str(table_path(self.uri, self.name)), version=version)

    def _present(self, ids: Sequence[str], version: int | None = None) -> set[str]:
        """Which of ``ids`` a row of the table holds (in ``version``, default the latest), suppressed or not."""
        column = self.wrapped.id_column
        ds = self._dataset(version)
        out: set[str] = set()
        for start in range(0, len(ids), _PAGE):
            part = list(ids[start : start + _PAGE])
            out |= set(ds.to_table(columns=[column], filter=f"{column} IN ({quoted(part)})").column(column).to_pylist())
        return out

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        added = hide(self.db, self.name, self._ids(artifacts))
        return {"mechanism": f"ids listed in the table {self.name}{HIDDEN_SUFFIX}, pushed into every wrapper read's"
                             " where-clause", "ids_hidden": added}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.wrapped.delete(self._ids(artifacts))

    def _tags_holding(self, ids: Sequence[str]) -> dict[str, tuple[int, set[str]]]:
        """Each tag whose version still holds any of ``ids``: its version and those ids."""
        out = {}
        for tag, info in sorted(self._dataset().tags.list().items()):
            version = int(info["version"] if isinstance(info, Mapping) else getattr(info, "version"))
            held = self._present(ids, version)
            if held:
                out[tag] = (version, held)
        return out

    @staticmethod
    def _collect(path: Path) -> dict[str, Any]:
        """Rewrite every fragment that holds a deleted row (threshold 0: not only those past LanceDB's 10%),
        bring the indices up to it, and remove every older version's files (and files no version names)."""
        import lance

        ds = lance.dataset(str(path))
        compaction = ds.optimize.compact_files(materialize_deletions=True, materialize_deletions_threshold=0.0)
        kill_point("reclaim:lancedb:compacted")
        ds = lance.dataset(str(path))
        if ds.describe_indices():
            ds.optimize.optimize_indices()
            ds = lance.dataset(str(path))
        # a tagged version is kept (the reclaim names the tag; it never deletes one unless told to)
        stats = ds.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True, error_if_tagged_old_versions=False)
        return {"fragments_rewritten": compaction.fragments_removed, "fragments_written": compaction.fragments_added,
                "old_versions_removed": stats.old_versions, "bytes_removed": stats.bytes_removed}

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        ids = self._ids(artifacts)
        holding = self._tags_holding(ids)
        removed_tags = []
        if holding and self.remove_tags:
            for tag in holding:
                self._dataset().tags.delete(tag)
                removed_tags.append(tag)
        present = self._present(ids)
        # Deleted by row address, not by id: a delete's predicate is kept in its transaction file and manifest,
        # and a version that is the latest one (nothing after it to compact) is never cleaned up.
        rows = self._row_ids(ids)
        for start in range(0, len(rows), _PAGE):
            self.table.delete(f"_rowid IN ({', '.join(map(str, rows[start : start + _PAGE]))})")
        kill_point("reclaim:lancedb:deleted")
        main = self._collect(table_path(self.uri, self.name))
        self._unhide(ids)
        self._open()  # the table as the reclaim left it
        kept = {tag: version for tag, (version, _held) in holding.items() if tag not in removed_tags}
        return {"steps": ["delete by row address (a deletion file)", "compact_files(materialize_deletions_threshold=0): every fragment"
                          " holding a deleted row rewritten", "optimize_indices", "cleanup_old_versions(older_than=0,"
                          " delete_unverified=True)", f"{self.name}{HIDDEN_SUFFIX} written anew without the ids"],
                "rows_deleted": len(present), **main, "tags_removed": removed_tags, "tags_kept": kept}

    def _row_ids(self, ids: Sequence[str]) -> list[int]:
        column = self.wrapped.id_column
        ds = self._dataset()
        out: list[int] = []
        for start in range(0, len(ids), _PAGE):
            part = list(ids[start : start + _PAGE])
            out += ds.to_table(columns=[column], filter=f"{column} IN ({quoted(part)})",
                               with_row_id=True).column("_rowid").to_pylist()
        return out

    def _unhide(self, ids: Sequence[str]) -> None:
        """Take ``ids`` out of the hidden-ids table: written anew without them (an overwrite names no id; a
        delete's predicate would), every older version removed; the table dropped once it lists none."""
        import pyarrow as pa

        name = self.name + HIDDEN_SUFFIX
        if name not in table_names(self.db):
            return
        rest = sorted(hidden_ids(self.db, self.name) - set(ids))
        if not rest:
            self.db.drop_table(name)
            return
        self.db.create_table(name, pa.table({"id": pa.array(rest, type=pa.string())}), mode="overwrite")
        self._collect(table_path(self.uri, name))

    def compact(self) -> dict[str, Any]:
        """What the reclaim's collection does, for the whole table: every fragment with a deleted row rewritten,
        every older version removed."""
        return self._collect(table_path(self.uri, self.name))

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        probe_vectors = probe_vectors or {}
        ids = self._ids(artifacts)
        raw = self._present(ids)
        wrapped = {row[self.wrapped.id_column] for row in self.wrapped.get(ids)}
        dim = self._dataset().schema.field(self.wrapped.vector_column).type.list_size
        results = {}
        for art in artifacts:
            aid = art.artifact_id
            paths = {"raw.filter(id)": aid in raw, "wrapper.get(ids)": aid in wrapped}
            queries = probe_set(art.fingerprint, probe_vectors.get(aid, []), dim) if aid in raw else []
            for label, vector in queries:
                rows = self.table.search(fit_dim(vector, dim), vector_column_name=self.wrapped.vector_column) \
                    .select([self.wrapped.id_column]).limit(TOP).to_list()
                paths[f"raw.search{TOP}({label})"] = any(r[self.wrapped.id_column] == aid for r in rows)
            results[aid] = paths_result(paths, len(queries), None if aid in raw else
                                        "no row of the latest version holds this id")
        return results

    # -- the semantic level's questions, asked of the raw table (suppressed rows included) ---------

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """Each query's ``k`` nearest rows of the latest version (LanceDB's own search, its distance) with
        ``exclude`` left out, and their stored vectors."""
        column, id_column = self.wrapped.vector_column, self.wrapped.id_column
        dim = self._dataset().schema.field(column).type.list_size
        self.table.checkout_latest()
        out = []
        for vector in np.asarray(vectors, dtype=np.float32).reshape(-1, dim):
            rows = self.table.search(vector, vector_column_name=column).select([id_column, column]) \
                .limit(k + len(exclude)).to_list()
            rows = [r for r in rows if r[id_column] not in exclude][:k]
            out.append(Neighbours([r[id_column] for r in rows], [float(r["_distance"]) for r in rows],
                                  np.asarray([r[column] for r in rows], dtype=np.float32).reshape(-1, dim)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        column, id_column = self.wrapped.vector_column, self.wrapped.id_column
        ds = self._dataset()
        ids = [str(i) for i in ids]
        out = {}
        for start in range(0, len(ids), _PAGE):
            part = ids[start : start + _PAGE]
            table = ds.to_table(columns=[id_column, column], filter=f"{id_column} IN ({quoted(part)})")
            for aid, vector in zip(table.column(id_column).to_pylist(), table.column(column).to_pylist()):
                out[aid] = np.asarray(vector, dtype=np.float32)
        return out

    def physical_root(self) -> Path:
        """The database folder: the table's files, the hidden-ids table's, and anything beside them (a copy of
        the table folder, a ``.bak``) are read."""
        return self.uri

    def physical_files(self) -> list[Path]:
        files = []
        for name in (self.name, self.name + HIDDEN_SUFFIX):
            folder = table_path(self.uri, name)
            if folder.is_dir():
                files += sorted(p for p in folder.rglob("*") if p.is_file())
        return files

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """Every ``.lance`` file under the database folder decoded with Lance's own reader (data files of every
        version, index files), whatever its encoding: an erased id in any string column, or an erased vector's
        first floats in any vector column, is found there even where the bytes are compressed. A tag that keeps
        a version holding an erased row is named. A ``.lance`` file that cannot be decoded leaves the level
        unchecked."""
        from .decode import find_in_lance_files

        ids = {a.artifact_id for a in artifacts}
        prints = {a.artifact_id: np.asarray(a.fingerprint, dtype=np.float32).tobytes()
                  for a in artifacts if a.fingerprint is not None}
        found, unreadable, files = find_in_lance_files(self.uri, ids, prints)
        tags = self._tags_holding(sorted(ids))
        out = {}
        for art in artifacts:
            aid = art.artifact_id
            places = [f"decoded from {where}" for where in found.get(aid, [])]
            places += [f"kept by tag {tag!r} (version {version}): remove the tag, or set remove_tags = true, and"
                       " erase again" for tag, (version, held) in tags.items() if aid in held]
            out[aid] = ExtraFinding(found=places, id_found=bool(places), content_found=bool(places),
                                    evidence={"lance_files_decoded": files, "tags": sorted(tags)},
                                    unchecked=(f"{len(unreadable)} .lance file(s) could not be decoded:"
                                               f" {', '.join(unreadable[:3])}") if unreadable else None)
        return out

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Rows deleted from the latest version that files of the table still hold (``forensics``)."""
        from .forensics import scan_lancedb

        return scan_lancedb(store, options)
