"""Adapter for embedded Chroma (``PersistentClient``): flag + filter, in-place reclaim (a rewrite for what it
cannot reach, and for ``tombstone compact``), byte scan."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import chromadb
import numpy as np

from tombstone.faults import kill_point
from tombstone.fsutil import Snapshot
from tombstone.capture.vector import normalised_fingerprint_bytes
from tombstone import holders
from tombstone.contract import Adapter, Capability, ExtraFinding, ProbeResult, writable_files
from tombstone.errors import ConfigError, PhysicalUnsupportedError, StoreUnavailableError, TombstoneError
from tombstone.lineage.db import ArtifactRecord
from tombstone.sqlite_pages import where_found, zero_all_free_space
from tombstone.verify.levels import Level
from tombstone.verify.logical import TOP_K, fit_dim, nearest_paths_many, probe_count, probe_set
from tombstone.verify.physical import keyed_patterns
from tombstone.verify.scanner import check_regular

from . import clients, fulltext, inplace
from .wrapper import BACKEND, REWRITE_SUFFIX, SUPPRESSED, TombstoneCollection, bump_epoch, fresh_client
from .hooks import ChromaHooks
from .neighbours import ChromaNeighbours
from .rewrite import ChromaRewrite
from .segments import UUID_DIR, ChromaSegments

_SEARCH_ALL_UP_TO = 400
"""Probe vectors searched without first reading which ids the collection can name (one subject's: the id
map is read whole, which costs more than a few hundred searches)."""
_PAGE = 1000
# lock file -> the token this process's Chroma instance on that directory is known complete at
_fresh_at: dict[str, str | None] = {}


class ChromaAdapter(ChromaRewrite, ChromaHooks, ChromaNeighbours, ChromaSegments, Adapter):
    """Options: ``path`` (the persist directory), ``collection`` (its name) and, optionally, ``id_key``:
    a metadata key under which the app keeps each record's id (the logical probe then also filters on it)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)
    read_only_supported = True

    @classmethod
    def preflight(cls, store: str, options: Mapping[str, Any]) -> bool:
        """The collection is read from ``chroma.sqlite3`` itself, opened immutable (no lock, no journal, no
        byte written), instead of copying the whole persist directory for a read-only client; where a journal
        or write-ahead log is beside it (a writer is at work, or crashed), the default check runs."""
        if "path" not in options or "collection" not in options:
            raise ConfigError(f'store {store!r}: the {cls.backend} backend needs path = "..." and collection = "..."')
        path = Path(options["path"])
        db = path / "chroma.sqlite3"
        # a client of another process on the files: no erasure may change them under it
        clients.refuse_foreign_clients(path, store, retryable=False)
        if any(os.path.lexists(path / f"chroma.sqlite3{suffix}") for suffix in ("-wal", "-journal")):
            return super().preflight(store, options)
        if not db.is_file():
            raise StoreUnavailableError(f"no Chroma persist directory at {path}", store=store, retryable=False)
        try:
            check_regular([db])
            conn = sqlite3.connect(db.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
            try:
                found = conn.execute("SELECT 1 FROM collections WHERE name = ?", (str(options["collection"]),)).fetchone()
            finally:
                conn.close()
        except (TombstoneError, sqlite3.Error) as exc:
            raise StoreUnavailableError(f"cannot open Chroma store {path}: {exc}", store=store, retryable=False) from exc
        if not found:
            raise StoreUnavailableError(f"no collection {str(options['collection'])!r} in {path}", store=store,
                                        retryable=False)
        files = [db] + [child / name for child in path.iterdir() if child.is_dir() and not child.is_symlink()
                        for name in os.listdir(child)]
        return writable_files(files)

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self._snapshot: Snapshot | None = None
        self.require("path", "collection")
        self.reclaim_mode()
        self.path = Path(options["path"])
        self.name = str(options["collection"])
        if not (self.path / "chroma.sqlite3").is_file():
            raise StoreUnavailableError(f"no Chroma persist directory at {self.path}", store=store, retryable=False)
        try:  # SQLite would block forever on a FIFO at -journal
            check_regular(self.path / f"chroma.sqlite3{suffix}" for suffix in ("", "-wal", "-shm", "-journal"))
        except TombstoneError as exc:
            raise StoreUnavailableError(f"cannot open Chroma store {self.path}: {exc}", store=store,
                                        retryable=False) from exc
        client_path = self.path
        if self.read_only:
            # Chroma writes into its persist directory whenever a client opens it (migrations, the log,
            # the WAL): read-only, the probes read a private copy; the physical probe reads the originals.
            self._snapshot = Snapshot(prefix="tombstone-chroma-")
        try:
            if self._snapshot is not None:
                client_path = self._snapshot.copy_tree(self.path)
            self.client = chromadb.PersistentClient(path=str(client_path))
            if self._snapshot is None:
                holders.register(self.path)  # this process follows an erasure: not a foreign holder
            self._col = None
            with self.store_lock():  # another process may be mid-rewrite: its copy is not a leftover
                self.collection()  # fail now, with one line, if the collection is missing
        except BaseException as exc:
            if self._snapshot is not None:
                if getattr(self, "client", None) is not None:
                    self.client.close()
                self._snapshot.close()
            refused = None if self._snapshot is not None or not isinstance(exc, Exception) else clients.write_refused(self.path)
            if refused:  # Chroma's own error says nothing of the cause (on a read-only mount, an AttributeError)
                raise StoreUnavailableError(f"cannot open Chroma store {self.path}: {refused}", store=store) from exc
            raise

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """Chroma's errors, SQLite's (reclaim opens ``chroma.sqlite3`` itself) and OSError from the
        persist directory (reclaim rewrites segment files; the physical probe lists them)."""
        import chromadb.errors

        return (chromadb.errors.ChromaError, sqlite3.Error, OSError)

    def map_vendor_error(self, exc: BaseException) -> TombstoneError:
        """As the base, but a NotFoundError (a collection or segment gone) is not retryable."""
        import chromadb.errors

        error = super().map_vendor_error(exc)
        if isinstance(exc, chromadb.errors.NotFoundError):
            error.retryable = False
        return error

    def lock_path(self) -> Path:
        """The persist directory: its lock file is ``<directory>.tombstone.lock``, beside it (a rewrite
        changes what is inside), the one ``TombstoneCollection`` writes take."""
        return self.path

    @contextlib.contextmanager
    def store_lock(self):
        """The persist directory's lock. On taking it the collection is looked up again by name, since
        another process's reclaim may have replaced it with a rewritten one meanwhile; and when another
        process held the lock since this one last released it (the lock file's token says so), the
        process's Chroma instance is replaced by a fresh one (``_reload``). Read-only: no lock (the probes
        read a private copy, and a lock file would be a new file beside the store)."""
        if self.read_only:
            self._col = None
            yield
            return
        with super().store_lock() as lock:
            outer = lock.depth == 1
            if outer and self._snapshot is None and _fresh_at.get(str(lock.path)) != lock.token():
                self._reload()
            self._col = None
            yield
        if outer:
            _fresh_at[str(lock.path)] = lock.written()

    def _reload(self) -> None:
        """A fresh Chroma instance on the persist directory for this adapter (whoever holds the old one
        keeps it). Chroma keeps each collection's vector index in the memory of the process that loaded
        it, and does not see records another process added until it writes itself: a probe or a copy of
        the survivors through a stale instance misses them, or fails ("Error finding id")."""
        self.client = fresh_client(self.path)

    # -- the collection, including one left mid-rewrite ---------------------------------------

    def _get(self, name: str):
        import chromadb.errors

        try:
            return self.client.get_collection(name)
        except chromadb.errors.NotFoundError:
            return None

    def collection(self):
        if self._col is not None:
            return self._col
        col = self._get(self.name)
        if col is None:
            rewrite = self._get(self.name + REWRITE_SUFFIX)
            if rewrite is None:
                raise StoreUnavailableError(f"no collection {self.name!r} in {self.path}", store=self.store,
                                            retryable=False)
            # Killed after the original was dropped: the rewrite is complete (it is only
            # dropped once the copy was checked), so finishing means renaming it (read-only: reading it).
            if not self.read_only:
                rewrite.modify(name=self.name)
            col = rewrite
        self._col = col
        return col

    def view(self) -> TombstoneCollection:
        """The wrapper's read paths over this collection (no capture)."""
        return TombstoneCollection(self.collection(), lineage=None, store=self.store)

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def _existing(self, ids: list[str]) -> list[str]:
        col = self.collection()
        found: list[str] = []
        for start in range(0, len(ids), _PAGE):
            found += col.get(ids=ids[start : start + _PAGE], include=[])["ids"]
        return found

    # -- suppress / delete --------------------------------------------------------------------

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """The flag set in the metadata segment's table (``inplace.flag_rows``), where every read path's
        filter looks; through Chroma's ``update`` where the collection has no metadata segment row."""
        col = self.collection()
        conn = self._db()
        try:
            segment = conn.execute("SELECT id FROM segments WHERE collection = ? AND scope = 'METADATA'",
                                   (str(col.id),)).fetchone()
            if segment is not None:
                flagged = inplace.flag_rows(conn, segment[0], self._ids(artifacts), SUPPRESSED)
                return {"mechanism": f"metadata {SUPPRESSED}=true (in the metadata segment's table) + filter on"
                                     " every wrapper query path", "records_flagged": flagged}
        finally:
            conn.close()
        present = self._existing(self._ids(artifacts))
        for start in range(0, len(present), _PAGE):
            batch = present[start : start + _PAGE]
            col.update(ids=batch, metadatas=[{SUPPRESSED: True} for _ in batch])
        return {"mechanism": f"metadata {SUPPRESSED}=true + filter on every wrapper query path",
                "records_flagged": len(present)}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        present = self._existing(self._ids(artifacts))
        if present:
            self.collection().delete(ids=present)

    # -- reclaim ------------------------------------------------------------------------------

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """In place (the default, ``inplace.py``): the records' rows deleted on a ``secure_delete``
        connection, the full-text index merged, their HNSW slots marked deleted with the vectors zeroed,
        their ids dropped from the id map, the free space of every page of chroma.sqlite3 zeroed (Chroma's
        own client, which runs with ``secure_delete`` off, leaves deleted and rewritten rows there:
        ``tombstone.sqlite_pages``); then a scan of every file for the erased artifacts. Bytes it still finds:
        a VACUUM. With ``reclaim = "rewrite"``, when the segment is not in a shape the in-place recipe knows,
        or if bytes survive the VACUUM: the collection is rewritten from its survivors."""
        clients.refuse_foreign_clients(self.path, self.store)
        if self.reclaim_mode() == "rewrite" or not artifacts:
            return {"mechanism": "rewrite", **self._reclaim_rewrite(artifacts)}
        try:
            evidence = self._reclaim_in_place(artifacts)
        except inplace.NotInPlace as exc:
            return {"mechanism": "rewrite", "in_place_refused": str(exc), **self._reclaim_rewrite(artifacts)}
        # Chroma's own client deletes and rewrites rows with secure_delete off, so the erased records' old
        # bytes (a document's text with nothing else of the record beside it) can be in any page's free space:
        # every page's free space was zeroed (_reclaim_in_place). What a scan still finds lies elsewhere (a
        # live cell, an HNSW file): a VACUUM of chroma.sqlite3, and only if that is not enough, the collection.
        patterns = keyed_patterns(self, artifacts)  # the physical probe's, made once for both
        try:
            found = where_found(self.physical_files(), patterns, root=self.path)
        except PhysicalUnsupportedError:
            return evidence  # nothing can be checked here: the verify step says UNVERIFIED
        if not found:
            return evidence
        evidence["residue_after_in_place"] = len({key.split("\x00", 1)[1] for key in found})
        evidence["vacuum"] = self._vacuum()
        # bytes left only in files that are not Chroma's (a copy beside chroma.sqlite3) are no reason to
        # rewrite the collection: no recipe reaches them, and the verify step names them
        left = sorted(aid for aid, r in self.probe_physical(artifacts).items()
                      if not r.passed and r.evidence.get("store_file_hits", 1))
        if not left:
            evidence["steps"] = evidence["steps"] + ["VACUUM chroma.sqlite3"]
            return evidence
        return {"mechanism": "rewrite", "in_place": evidence, "residue_after_vacuum": len(left),
                **self._reclaim_rewrite(artifacts)}

    def _reclaim_in_place(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        ids = self._ids(artifacts)
        col = self.collection()
        collection_id = str(col.id)
        conn = fulltext.connect(self.path / "chroma.sqlite3")
        try:
            conn.execute("PRAGMA secure_delete=ON")
            segments = dict(conn.execute("SELECT scope, id FROM segments WHERE collection = ?", (collection_id,)))
            topics = [t for (t,) in conn.execute("SELECT DISTINCT topic FROM embeddings_queue")
                      if t.rsplit("/", 1)[-1] == collection_id]
            # the full-text index already deletes in place (secure-delete, merged once): nothing to merge after,
            # unless so many go at once that one merge costs less (then the option is off for these deletes)
            settled = fulltext.settled(conn, self.path)
            merge_instead = settled and fulltext.merge_cheaper(conn, len(ids))
            in_place_fulltext = settled and not merge_instead
            rows = inplace.delete_rows(conn, ids, segments.get("METADATA"), topics,
                                       before=fulltext.secure_off if merge_instead else None)
        finally:
            conn.close()
        kill_point("reclaim:chroma:rows-deleted")
        # Chroma's own delete is not called: the DELETE rows it queues would be replayed by the next client
        # that loads the segment, and hnswlib refuses to delete an element twice (a slot this recipe marked
        # before a crash). The index in this process's memory is replaced below instead.
        vector = segments.get("VECTOR")
        slots = inplace.erase_slots(self.path / vector, ids) if vector else {}
        kill_point("reclaim:chroma:slots-erased")
        conn = fulltext.connect(self.path / "chroma.sqlite3")
        try:
            conn.execute("PRAGMA secure_delete=ON")
            merged = False if in_place_fulltext else fulltext.turn_on_and_merge(conn, self.path)
            checkpoint = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            marker_problem = fulltext.mark(self.path) if merged and fulltext.is_apsw(conn) else None
        finally:
            conn.close()
        free_space = zero_all_free_space(self.path / "chroma.sqlite3", kill="reclaim:chroma:free-space-page")
        if free_space is None:
            raise inplace.NotInPlace("chroma.sqlite3 is not in a shape whose free space can be zeroed in place")
        # this process's index still holds the vectors in memory: a fresh instance loads the files, and
        # wrappers (in any process) learn from the epoch token to do the same before their next call
        bump_epoch(self.path)
        self._reload()
        self._col = None
        zeroed = self._settle_and_zero_tails()
        return {
            "mechanism": "in-place",
            "steps": ["delete the records' rows, metadata and full-text rows, empty their queue rows, on a"
                      " secure_delete connection",
                      "mark their HNSW slots deleted, zero their vectors and every deleted slot's, drop their ids"
                      " from index_metadata.pickle",
                      ("the full-text rows deleted in place (FTS5 secure-delete, on since an earlier reclaim merged"
                       " the index)" if in_place_fulltext else
                       "turn FTS5 secure-delete on and merge the full-text index"
                       + (" (so many documents went that one merge cost less than deleting each in place)"
                          if merge_instead else "")),
                      "zero the free space of every page of chroma.sqlite3 (what Chroma's own deletes and rewrites,"
                      " with secure_delete off, left there)",
                      "reload the collection from its files (a new epoch token for the wrappers)",
                      "zero HNSW slots past cur_element_count"],
            "rows_deleted": rows, "hnsw": slots, "fulltext_merged": merged, "fulltext_secure_delete": in_place_fulltext,
            "free_space_zeroed": free_space,
            "wal_checkpoint_busy": bool(checkpoint and checkpoint[0]), "hnsw_tail_bytes_zeroed": zeroed,
            "left": "the erased slots stay in the HNSW graph (links, a label no id maps to) until 'tombstone compact'",
            **({"fulltext_marker": marker_problem} if marker_problem else {}),
        }

    # -- probes -------------------------------------------------------------------------------

    def _space(self) -> str:
        col = self.collection()
        meta = col.metadata or {}
        if "hnsw:space" in meta:
            return str(meta["hnsw:space"])
        return str(((col.configuration_json or {}).get("hnsw") or {}).get("space") or "l2")

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        col = self.collection()
        view = TombstoneCollection(col, lineage=None, store=self.store)
        probe_vectors = probe_vectors or {}
        count = col.count()
        sample = col.get(limit=1, include=["embeddings"]) if count else None
        dim = len(sample["embeddings"][0]) if sample and len(sample["ids"]) else None
        searchers = {"raw": self._searcher(col), "wrapper": self._searcher(view)}
        # by id, and peek, asked once for the batch
        ids = [a.artifact_id for a in artifacts]
        raw_ids: set[str] = set()
        wrapped_ids: set[str] = set()
        for start in range(0, len(ids), _PAGE):
            part = ids[start : start + _PAGE]
            raw_ids |= set(col.get(ids=part, include=[])["ids"])
            wrapped_ids |= set(view.get(ids=part, include=[])["ids"])
        peeked = set(view.peek(limit=TOP_K)["ids"])
        # by the metadata key that names a record's id, for the batch in pages (one ``$in`` per page, not a get
        # per artifact): which of the ids some record still carries under that key, raw and through the wrapper
        id_key = self.options.get("id_key")
        keyed: dict[str, set] = {"raw": set(), "wrapper": set()}
        for start in range(0, len(ids) if id_key else 0, _PAGE):
            where = {id_key: {"$in": ids[start : start + _PAGE]}}
            for name, source in (("raw", col), ("wrapper", view)):
                keyed[name] |= {m.get(id_key) for m in source.get(where=where, include=["metadatas"])["metadatas"] if m}
        # how many probe vectors each artifact has, counted without reading them (only those searched are read)
        counts = {art.artifact_id: probe_count(art.fingerprint, probe_vectors, art.artifact_id) if dim else 0
                  for art in artifacts}
        # The wrapper's query is the collection's same call, filtered on the flag and over-fetched past the
        # flagged ids: with none flagged (the store's lock is held, so none will be) it returns a subset of
        # the raw query's results, and is asked only the queries whose raw results held the artifact.
        nothing_flagged = not col.get(where={SUPPRESSED: True}, include=[])["ids"]
        # A search names each result through the vector segment's id map, so an id that neither the id map,
        # nor the metadata segment, nor a queued write of the collection names cannot come back from any
        # search: its probe vectors are not searched. The map is read (whole) only for a large batch; for a few
        # artifacts it is used only when this process's reclaim left it without them (no read: the searches
        # would load the whole HNSW index instead).
        named = self._named(ids, read_map=sum(counts.values()) > _SEARCH_ALL_UP_TO)
        searched = [(art.artifact_id, [(label, fit_dim(v, dim)) for label, v in
                                       probe_set(art.fingerprint, probe_vectors.get(art.artifact_id, []), dim)])
                    for art in artifacts if counts[art.artifact_id] and (named is None or art.artifact_id in named)]
        nearest = nearest_paths_many(searched, searchers, min(TOP_K, count),
                                     within={"wrapper": "raw"} if nothing_flagged else None)
        results = {}
        for art in artifacts:
            aid = art.artifact_id
            paths: dict[str, bool] = {
                "raw.get(ids)": aid in raw_ids,
                "wrapper.get(ids)": aid in wrapped_ids,
                "wrapper.peek": aid in peeked,
            }
            if id_key:
                paths[f"raw.get(where {id_key})"] = aid in keyed["raw"]
                paths[f"wrapper.get(where {id_key})"] = aid in keyed["wrapper"]
            paths.update(nearest.get(aid, {}))
            returned = sorted(p for p, hit in paths.items() if hit)
            evidence = {"paths": sorted(paths), "returned_by": returned,
                        "probe_vectors": counts[aid], "collection_count": count}
            if named is not None and aid not in named and counts[aid]:
                evidence["nearest_neighbours"] = (
                    "not searched: a search names its results through the vector segment's id map, and neither"
                    " that map, nor the metadata segment, nor a queued write of the collection names this id")
            else:
                evidence["wrapper_searches"] = ("where the raw search returned the artifact (nothing flagged)"
                                                if nothing_flagged else "every probe vector")
            results[aid] = ProbeResult(
                level=Level.LOGICAL,
                passed=not returned,
                measurement=f"returned by {', '.join(returned)}" if returned else None,
                evidence=evidence,
            )
        return results

    def _named(self, ids: list[str], read_map: bool = True) -> set[str] | None:
        """Which of ``ids`` the collection can still name: in the vector segment's persisted id map, in the
        metadata segment's ``embeddings`` table, or in an embeddings-queue row of the collection (a write the
        segments have not all persisted). None where that cannot be told (no vector segment folder, a map
        in a shape ``inplace.read_id_map`` does not know), or where it would take reading the map and
        ``read_map`` is false: then every probe vector is searched. The map is not read where this process's
        own reclaim left it without any of ``ids`` and it has not changed since (``inplace.known_absent``)."""
        conn = self._db()
        try:
            col = self.collection()
            segments = dict(conn.execute("SELECT scope, id FROM segments WHERE collection = ?", (str(col.id),)))
            if "VECTOR" not in segments or "METADATA" not in segments:
                return None
            folder = self.path / segments["VECTOR"]
            map_absent = inplace.known_absent(folder, ids)
            if not (map_absent or read_map):
                return None
            topics = [t for (t,) in conn.execute("SELECT DISTINCT topic FROM embeddings_queue")
                      if t.rsplit("/", 1)[-1] == str(col.id)]
            named: set[str] = set()
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                marks = ",".join("?" * len(part))
                named |= {i for (i,) in conn.execute(
                    f"SELECT embedding_id FROM embeddings WHERE segment_id = ? AND embedding_id IN ({marks})",  # noqa: S608
                    (segments["METADATA"], *part))}
                for topic in topics:
                    named |= {i for (i,) in conn.execute(
                        f"SELECT id FROM embeddings_queue WHERE topic = ? AND id IN ({marks})", (topic, *part))}  # noqa: S608
        finally:
            conn.close()
        if map_absent:
            pass  # the map as this process's reclaim wrote it holds none of them
        elif (folder / inplace.ID_MAP).exists():
            id_map = inplace.read_id_map(folder)
            if id_map is None:
                return None
            named |= set(ids) & set(id_map["id_to_label"])
        elif folder.exists() and any(folder.iterdir()):
            return None  # HNSW files without the map this reads
        return named

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        self._cosine = self._space() == "cosine"
        return super().probe_physical(artifacts)

    @staticmethod
    def _searcher(target):
        def search(vectors: np.ndarray, k: int):
            ids = target.query(query_embeddings=vectors, n_results=k, include=[])["ids"]

            def candidates(rows: list[int]) -> list[np.ndarray]:
                # the same search again, with the vectors, for the few rows MMR needs (HNSW answers the
                # same query the same way); a row whose ids differ is aligned by id
                res = target.query(query_embeddings=vectors[rows], n_results=k, include=["embeddings"])
                out = []
                for r, got_ids, embs in zip(rows, res["ids"], res["embeddings"]):
                    embs = np.asarray(embs if embs is not None else [], dtype=np.float32)
                    if list(got_ids) != list(ids[r]):
                        by_id = dict(zip(got_ids, embs))
                        embs = np.asarray([by_id.get(i, np.zeros(vectors.shape[1], np.float32)) for i in ids[r]],
                                          dtype=np.float32)
                    out.append(embs)
                return out

            return ids, candidates

        return search

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """Whether another process holds the persist directory's files through a client Tombstone does not
        know of. Such a client keeps the collection's vector index as it loaded it, before the erasure, and
        writes that copy back, erased vectors included, the next time it persists: while one is open, a scan
        that finds nothing is not final, and the level is left unchecked (UNVERIFIED), naming the process.
        (The reclaim refuses to run while one is open; one that opened after it began is caught here.)"""
        seen = holders.holders(self.path)
        unchecked = None
        if seen.foreign:
            unchecked = (f"{clients.foreign_clients(seen)}; its client keeps the vector index as it was before the erasure"
                         " and writes it back, erased vectors included, when it next persists. Close that client"
                         " (or open the collection through TombstoneCollection), then run 'tombstone erase' for"
                         " the subject again")
        return {art.artifact_id: ExtraFinding(evidence=seen.evidence(), unchecked=unchecked) for art in artifacts}

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        patterns = super().physical_patterns(artifact)
        cosine = getattr(self, "_cosine", None)
        if cosine is None:
            cosine = self._space() == "cosine"
        if self.fingerprint_scannable(artifact) and artifact.inv_norm is not None and cosine:
            # hnswlib's cosine space stores v / |v|: the raw bytes alone would miss the index copy.
            patterns["content_normalised"] = normalised_fingerprint_bytes(artifact.fingerprint, artifact.inv_norm)
        return patterns

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Queue rows of deleted ids, deleted HNSW slots, orphan segment folders and SQLite free space
        (``forensics``)."""
        from .forensics import scan_chroma

        return scan_chroma(store, cls.backend, options)

    def physical_root(self) -> Path:
        """The persist directory: a file in it that is not Chroma's (a ``chroma.sqlite3.bak``) is read as
        bytes too, and named."""
        return self.path

    def physical_files(self) -> list[Path]:
        if not os.access(self.path, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"persist directory {self.path} is not readable: logical level only",
                                           store=self.store)
        files = [self.path / f"chroma.sqlite3{suffix}" for suffix in ("", "-wal", "-shm", "-journal")]
        for child in sorted(self.path.iterdir()):
            if child.is_dir() and UUID_DIR.match(child.name):  # a segment's folder (or an orphan one)
                # everything but folders: the scanner refuses (and names) what it must not read
                files += sorted(p for p in child.rglob("*") if not p.is_dir())
        # any other file under the persist directory is read too, as bytes, and named (physical_root)
        return files

    def close(self) -> None:
        self._col = None
        if self._snapshot is not None:
            self.client.close()
            self._snapshot.close()
            self._snapshot = None
