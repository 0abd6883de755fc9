"""Adapter for Qdrant local mode (``QdrantClient(path=...)``): payload flag, rewrite + VACUUM, byte scan."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.local.persistence import CollectionPersistence
from qdrant_client.local.utils import normalize_point_id

from tombstone.capture.hidden import FixedHidden
from tombstone.faults import kill_point
from tombstone.fsutil import write_atomic
from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.lineage.db import ArtifactRecord
from tombstone.sqlite_pages import is_sqlite, zero_all_free_space
from tombstone.storelock import STORE_LOCK_WAIT
from tombstone.verify.levels import Level
from tombstone.verify.logical import TOP_K, fit_dim, nearest_paths_many, probe_count, probe_set
from tombstone.verify.neighbourhood import Neighbours

from .wrapper import BACKEND, ID_KEY, MARKER, REWRITE_SUFFIX, SUPPRESSED, TombstoneQdrant, point_id
from .hooks import QdrantHooks
from .points import latest_points, read_only_client
from .local import _clients, close_local_clients, held, local_client  # noqa: F401  (re-exported)

_PAGE = 256
_LISTING_PAGE = 50_000


def pickled_floats(values: Sequence[float]) -> bytes:
    """How pickle writes a list of floats: one BINFLOAT opcode (``G`` + big-endian float64) each."""
    floats = np.asarray(values, dtype=">f8")
    out = np.empty((len(floats), 9), dtype=np.uint8)
    out[:, 0] = ord("G")
    out[:, 1:] = floats.view(np.uint8).reshape(-1, 8)
    return out.tobytes()


def carried_ids(point) -> set[str]:
    """The ids a point's payload carries under the id key: its string, or each string of a list (a filter on
    the key matches a list by any of its items)."""
    value = (point.payload or {}).get(ID_KEY)
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, str)}
    return set()


def result_name(point) -> str | None:
    """How the probe names a search result: its payload id when that is a string (what the wrapper writes),
    else a printed form that equals no artifact id (a list holding one is found by the listing and the filter)."""
    value = (point.payload or {}).get(ID_KEY)
    return value if value is None or isinstance(value, str) else repr(value)


class _Deferred:
    """A connection whose ``with`` block does not commit (``QdrantAdapter._one_transaction`` commits once)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self._conn

    def __exit__(self, *exc: object) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class QdrantAdapter(QdrantHooks, Adapter):
    """Options: ``path`` (the local-mode directory) and ``collection``; ``reclaim``: ``in-place`` (default) or
    ``rewrite`` (rewrite the collection and VACUUM on every erasure)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)
    read_only_supported = True
    point_of = staticmethod(point_id)
    """An artifact id's point id (a backend whose app chose its own point ids maps them itself)."""

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self._memory: QdrantClient | None = None
        self.require("path", "collection")
        self.reclaim_mode()
        self.path = Path(options["path"])
        self.name = str(options["collection"])
        if not (self.path / "meta.json").is_file():
            raise StoreUnavailableError(f"no Qdrant local-mode directory at {self.path}", store=store, retryable=False)
        if self.read_only:
            # No local-mode client on the directory (it writes a lock file, may rewrite rows, and the
            # interrupted rewrite is not resumed): the probes query an in-memory copy of the collection,
            # decoded with the restricted unpickler; the physical probe reads the original files.
            self._memory = read_only_client(self.path, self.name, store=store)
            return
        with self.store_lock():  # another process may be mid-rewrite: its marker is not a leftover
            self._finish_rewrite()
            if not self.client.collection_exists(self.name):
                raise StoreUnavailableError(f"no collection {self.name!r} in {self.path}", store=store,
                                            retryable=False)

    @property
    def client(self) -> QdrantClient:
        """The process's client for the directory (``local_client``), opened again if it was handed over;
        read-only, the in-memory copy of the collection."""
        if self.read_only:
            if self._memory is None:
                raise StoreUnavailableError(f"store {self.store!r} was closed", store=self.store, retryable=False)
            return self._memory
        return local_client(self.path)

    def lock_path(self) -> Path:
        """The local-mode directory: its lock file is ``<directory>.tombstone.lock``, beside it."""
        return self.path

    def store_lock(self) -> contextlib.AbstractContextManager[Any]:
        """The directory's lock, with this process's client open on it inside (``local.held``): local mode
        lets one client at a time open the directory, so processes take turns, and the wrappers' writes
        (``TombstoneQdrant``) take the same lock. Read-only: none (nothing is opened on the directory)."""
        if self.read_only:
            return contextlib.nullcontext()
        return held(self.path, wait=float(self.options.get("lock_wait", STORE_LOCK_WAIT)), store=self.store)

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """qdrant_client's API errors, SQLite's (local mode persists each collection in ``storage.sqlite``,
        which reclaim also opens itself) and OSError from the storage directory."""
        from qdrant_client.http.exceptions import ApiException

        return (ApiException, sqlite3.Error, OSError)

    def view(self) -> TombstoneQdrant:
        return TombstoneQdrant(self.client, self.name, lineage=None, store=self.store, point_of=self.point_of)

    def _present(self, artifacts: Sequence[ArtifactRecord]) -> list[str]:
        ids = [self.point_of(a.artifact_id) for a in artifacts]
        found = []
        for start in range(0, len(ids), _PAGE):
            found += [str(p.id) for p in self.client.retrieve(self.name, ids=ids[start : start + _PAGE],
                                                              with_payload=False)]
        return found

    # -- suppress / delete --------------------------------------------------------------------

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        present = self._present(artifacts)
        if present:
            with self._one_transaction():
                self.client.set_payload(self.name, payload={SUPPRESSED: True}, points=present)
        return {"mechanism": f"payload {SUPPRESSED}=true + must_not filter + post-filter on every wrapper read path",
                "points_flagged": len(present)}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        present = self._present(artifacts)
        if present:
            self.client.delete(self.name, points_selector=models.PointIdsList(points=present))

    # -- reclaim ------------------------------------------------------------------------------

    def _storage_connection(self, collection: str) -> sqlite3.Connection | None:
        """Qdrant's own sqlite connection for a collection (local mode internals), for its settings."""
        local = getattr(self.client, "_client", None)
        coll = getattr(local, "collections", {}).get(collection)
        storage = getattr(coll, "storage", None)
        return getattr(storage, "storage", None)

    @contextlib.contextmanager
    def _one_transaction(self) -> Any:
        """Local mode commits every point it writes on its own: a journal written and synced per point, most
        of what flagging or deleting a batch's ten thousand points costs. Inside this block the collection's
        connection commits once, at the end. If anything fails, nothing of the block is committed, and the
        client is closed so that the next use loads the collection from what its file holds (memory would
        otherwise keep changes the file does not)."""
        local = getattr(self.client, "_client", None)
        storage = getattr(getattr(local, "collections", {}).get(self.name), "storage", None)
        conn = getattr(storage, "storage", None)
        if not isinstance(conn, sqlite3.Connection) or conn.in_transaction:
            yield
            return
        storage.storage = _Deferred(conn)
        try:
            yield
            conn.commit()
        except BaseException:
            try:
                conn.rollback()
            finally:
                self.client.close()
            raise
        finally:
            storage.storage = conn

    def secure_delete_in_force(self) -> bool | None:
        conn = self._storage_connection(self.name)
        return bool(conn.execute("PRAGMA secure_delete").fetchone()[0]) if conn is not None else None

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """In place (the default): delete the points on Qdrant's own SQLite connection with ``secure_delete``
        on, so SQLite zeroes their cells and freed pages — no other point is touched. If the store's files
        still hold an artifact's bytes afterwards (an earlier delete with ``secure_delete`` off left them in
        free pages, where no delete can reach), or with ``reclaim = "rewrite"``, rewrite the collection from
        the survivors and VACUUM every SQLite file."""
        present = self._present(artifacts)
        secure_delete = self.secure_delete_in_force()
        in_place = self.reclaim_mode() != "rewrite"
        conn = self._storage_connection(self.name)
        if in_place and conn is not None:
            conn.execute("PRAGMA secure_delete=ON")
        if present:
            with self._one_transaction():
                self.client.delete(self.name, points_selector=models.PointIdsList(points=present))
        kill_point("reclaim:qdrant:after-delete")
        evidence: dict[str, Any] = {"deleted": len(present), "secure_delete_before": secure_delete,
                                    "secure_delete_at_delete": True if in_place and conn is not None else secure_delete}
        if in_place and conn is not None:
            left = sorted(aid for aid, r in self.probe_physical(artifacts).items() if not r.passed)
            if not left:
                return {"mechanism": "in-place", "steps": ["PRAGMA secure_delete=ON on the collection's connection",
                                                           "delete the points (SQLite zeroes their cells and pages)",
                                                           "scan the files: nothing of the artifacts left"],
                        **evidence}
            evidence["residue_after_delete"] = left
            # an earlier delete or rewrite with secure_delete off left their bytes in free space (of a page
            # still in use, or a free page), maybe with parts of a point no pattern names (its payload, on an
            # overflow page of its own): the free space of every page of each SQLite file is zeroed where it
            # lies; a rewrite if that is refused
            zeroed = {}
            for file in self.physical_files():
                if is_sqlite(file):
                    counts = zero_all_free_space(file, kill="reclaim:qdrant:free-space-page")
                    if counts is None:
                        zeroed = None
                        break
                    zeroed[self.file_label(file)] = counts
            if zeroed is not None:
                evidence["free_space_zeroed"] = zeroed
                left = sorted(aid for aid, r in self.probe_physical(artifacts).items() if not r.passed)
                if not left:
                    return {"mechanism": "in-place",
                            "steps": ["PRAGMA secure_delete=ON on the collection's connection",
                                      "delete the points (SQLite zeroes their cells and pages)",
                                      "scan the files: bytes an earlier delete left in free space",
                                      "zero the free space of every page of each SQLite file",
                                      "scan the files: nothing of the artifacts left"],
                            **evidence}
                evidence["residue_after_zeroing"] = left
        return {"mechanism": "rewrite",
                "steps": ["delete", "rewrite the collection from survivors", "VACUUM every sqlite file"],
                **evidence, "rewrite": self._rewrite(), "vacuumed": self._vacuum_all()}

    def reclaim_store(self) -> dict[str, Any]:
        """Free pages an earlier delete left are out of any delete's reach: the collection rewritten from its
        survivors and every SQLite file VACUUMed."""
        return {"mechanism": "rewrite", "steps": ["rewrite the collection from survivors", "VACUUM every sqlite file"],
                "rewrite": self._rewrite(), "vacuumed": self._vacuum_all()}

    def _stored_points(self, collection: str) -> list[models.PointStruct]:
        """Points exactly as persisted (raw vectors; the in-memory copy of a cosine collection is normalised)."""
        return latest_points(self.path / "collection" / collection / "storage.sqlite")

    def _copy(self, source: str, target: str) -> int:
        info = self.client.get_collection(source)
        if self.client.collection_exists(target):
            self.client.delete_collection(target)
        self.client.create_collection(target, vectors_config=info.config.params.vectors,
                                      sparse_vectors_config=info.config.params.sparse_vectors)
        points = self._stored_points(source)
        for start in range(0, len(points), _PAGE):
            self.client.upsert(target, points=points[start : start + _PAGE])
        copied = self.client.count(target, exact=True).count
        if copied != len(points):
            raise StoreUnavailableError(f"qdrant rewrite copied {copied} of {len(points)} points", store=self.store)
        return copied

    def _marker(self, phase: str | None) -> None:
        path = self.path / MARKER
        if phase is None:
            path.unlink(missing_ok=True)
            return
        # temp file made exclusively (mkstemp), fsynced, renamed: never written through a planted link
        write_atomic(path, json.dumps({"collection": self.name, "phase": phase}).encode())

    def _rewrite(self) -> dict[str, Any]:
        """Copy survivors out to a staging collection, drop and recreate the original, copy them back.

        A marker file names the phase, so a kill at any point resumes without losing a survivor:
        while copying out, the original is intact; while copying back, the staging copy is complete.
        """
        tmp = self.name + REWRITE_SUFFIX
        self._marker("copy-out")
        kill_point("reclaim:qdrant:copy-out")
        survivors = self._copy(self.name, tmp)
        self._marker("copy-back")
        kill_point("reclaim:qdrant:copy-back")
        self._copy(tmp, self.name)
        kill_point("reclaim:qdrant:copied-back")
        self.client.delete_collection(tmp)
        self._marker(None)
        return {"survivors": survivors}

    def _finish_rewrite(self) -> None:
        path = self.path / MARKER
        if not path.is_file():
            return
        state = json.loads(path.read_text())
        if state.get("collection") != self.name:
            return
        tmp = self.name + REWRITE_SUFFIX
        if state["phase"] == "copy-back" and self.client.collection_exists(tmp):
            self._copy(tmp, self.name)
        if self.client.collection_exists(tmp):
            self.client.delete_collection(tmp)
        self._marker(None)

    def _vacuum_all(self) -> list[str]:
        done = []
        for db in sorted(self.path.glob("collection/*/storage.sqlite")):
            conn = sqlite3.connect(db, timeout=30, isolation_level=None)
            try:
                conn.execute("VACUUM")
            except sqlite3.DatabaseError as exc:
                raise StoreUnavailableError(f"VACUUM of {db} failed: {exc}", store=self.store) from exc
            finally:
                conn.close()
            done.append(str(db.relative_to(self.path)))
        return done

    # -- probes -------------------------------------------------------------------------------

    def _searcher(self, target, raw: bool):
        def points(v: np.ndarray, k: int, with_vectors: bool):
            if raw:
                return self.client.query_points(self.name, query=v.tolist(), limit=k, with_payload=True,
                                                with_vectors=with_vectors).points
            return target.query_points(v.tolist(), limit=k, with_vectors=with_vectors)

        def search(vectors: np.ndarray, k: int):
            ids = [[result_name(p) for p in points(v, k, False)] for v in vectors]

            def candidates(rows: list[int]) -> list[np.ndarray]:
                # the same search again, with the vectors, for the few rows MMR needs, aligned by id
                out = []
                for r in rows:
                    by_id = {result_name(p): p.vector for p in points(vectors[r], k, True)}
                    out.append(np.asarray([by_id.get(i, np.zeros(vectors.shape[1])) for i in ids[r]],
                                          dtype=np.float32))
                return out

            return ids, candidates

        return search

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """The raw collection's nearest points (flagged ones included), over-fetched by ``len(exclude)``;
        distances from Qdrant's scores (1 - score for cosine, -score for dot product)."""
        params = self.client.get_collection(self.name).config.params.vectors
        metric = getattr(params, "distance", None)
        to_distance = {models.Distance.COSINE: lambda x: 1.0 - x, models.Distance.DOT: lambda x: -x}.get(metric, float)
        fetch = k + len(exclude)
        out = []
        for v in np.asarray(vectors, dtype=np.float32):
            # ids and scores of the over-fetched points; the vectors of the k kept, read once
            pts = self.client.query_points(self.name, query=v.tolist(), limit=max(1, fetch), with_payload=[ID_KEY],
                                           with_vectors=False).points
            hits = [((p.payload or {}).get(ID_KEY) or str(p.id), p) for p in pts]
            hits = [(aid, p) for aid, p in hits if aid not in exclude][:k]
            stored = {p.id: p.vector for p in self.client.retrieve(self.name, ids=[p.id for _, p in hits],
                                                                  with_payload=False, with_vectors=True)}
            hits = [(aid, p) for aid, p in hits if p.id in stored]  # a point deleted since drops out
            out.append(Neighbours([aid for aid, _ in hits], [float(to_distance(p.score)) for _, p in hits],
                                  np.asarray([stored[p.id] for _, p in hits], dtype=np.float32).reshape(len(hits), -1)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        ids = list(ids)
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), _PAGE):
            for p in self.client.retrieve(self.name, ids=[self.point_of(i) for i in ids[start : start + _PAGE]],
                                          with_payload=True, with_vectors=True):
                aid = (p.payload or {}).get(ID_KEY)
                if aid is not None:
                    out[aid] = np.asarray(p.vector, dtype=np.float32)
        return out

    def listing(self) -> tuple[set[str], frozenset[str]]:
        """The payload ids (string, or each string of a list) of every live point, and those of the flagged
        ones (a flagged point with no payload id by its point id), from one unfiltered read of the collection
        in large pages (local mode sorts every point id on each scroll call). Local mode evaluates a filter in
        Python over every point, so a filtered read of the flagged points would cost as much as this whole
        listing; a point is flagged as the filter on the flag would match it (``True``, or a list holding
        ``True``; a bool matches only a bool)."""
        ids: set[str] = set()
        flagged: set[str] = set()
        offset = None
        while True:
            points, offset = self.client.scroll(self.name, limit=_LISTING_PAGE, offset=offset,
                                                with_payload=models.PayloadSelectorInclude(include=[ID_KEY, SUPPRESSED]))
            for p in points:
                carried = carried_ids(p)
                ids |= carried
                flag = (p.payload or {}).get(SUPPRESSED)
                if flag is True or (isinstance(flag, list) and any(v is True for v in flag)):
                    flagged |= carried or {str(p.id)}
            if offset is None:
                return ids, frozenset(flagged)

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        # The wrapper as an app with the lineage db reads: the hidden ids (here: the flagged ones, read once)
        # post-filtered with oversampling, and the flag checked on every point returned. A view with no
        # hidden set would filter on the flag inside every query, which local mode does over every point.
        listed, flagged = self.listing()  # every live point's payload id and flag, read once
        view = TombstoneQdrant(self.client, self.name, lineage=None, store=self.store, hidden=FixedHidden(flagged),
                              point_of=self.point_of)
        probe_vectors = probe_vectors or {}
        info = self.client.get_collection(self.name)
        params = info.config.params.vectors
        dim = params.size if isinstance(params, models.VectorParams) else None
        searchers = {"raw": self._searcher(None, True), "wrapper": self._searcher(view, False)}
        # The by-id paths are asked once for the whole batch. Local mode evaluates a filter in Python over every
        # point, comparing each with every id the filter names, so a filter naming the batch's ids costs the
        # store times the batch: the collection is first read once, unfiltered (every live point's payload id),
        # and the filtered reads are asked only for the ids that listing found (a filter on the id reads the
        # same payload key, so for the others it can match nothing).
        ids = [a.artifact_id for a in artifacts]
        found: dict[str, set[str]] = {name: set() for name in ("raw.retrieve", "raw.scroll()", "raw.scroll(where id)",
                                                                "wrapper.retrieve", "wrapper.scroll(where id)",
                                                                "wrapper.count(where id)")}
        found["raw.scroll()"] = listed.intersection(ids)
        for start in range(0, len(ids), _PAGE):
            part = ids[start : start + _PAGE]
            for p in self.client.retrieve(self.name, ids=[self.point_of(i) for i in part]):
                found["raw.retrieve"] |= carried_ids(p)
            for p in view.retrieve(part):
                found["wrapper.retrieve"] |= carried_ids(p)
        on_file = sorted(found["raw.scroll()"])
        for start in range(0, len(on_file), _PAGE):
            part = on_file[start : start + _PAGE]
            by_ids = models.Filter(must=[models.FieldCondition(key=ID_KEY, match=models.MatchAny(any=part))])
            for name, scroll in (("raw.scroll(where id)", lambda **kw: self.client.scroll(self.name, **kw)),
                                 ("wrapper.scroll(where id)", view.scroll)):
                offset = None
                while True:
                    points, offset = scroll(scroll_filter=by_ids, limit=_PAGE, offset=offset, with_payload=True)
                    for p in points:
                        found[name] |= carried_ids(p)
                    if offset is None:
                        break
            if view.count(by_ids) > 0:  # a count names no id: only then is each one counted on its own
                for aid in part:
                    one = models.Filter(must=[models.FieldCondition(key=ID_KEY, match=models.MatchValue(value=aid))])
                    if view.count(one) > 0:
                        found["wrapper.count(where id)"].add(aid)
        # Every search here (raw and wrapped) names a point by its payload id, and the listing above read that
        # payload key on every live point of the collection: a search can return an artifact only while the
        # listing found it, so the others' probe vectors are not searched (local mode scores every point per
        # query, which made this probe grow with the store), nor read from the lineage db.
        held = found["raw.scroll()"]
        queries = {art.artifact_id: [(label, fit_dim(v, dim)) for label, v in
                                     probe_set(art.fingerprint, probe_vectors.get(art.artifact_id, []), dim)]
                   if dim else [] for art in artifacts if art.artifact_id in held}
        searched = list(queries.items())
        # With nothing flagged the wrapper's query is the client's same call, filtered: it returns a subset of
        # the raw query's points, and is asked only the queries whose raw results held the artifact.
        total = self.client.count(self.name, exact=True).count if searched else 0  # one more pass over every point
        nearest = nearest_paths_many(searched, searchers, min(TOP_K, total),
                                     within=None if flagged else {"wrapper": "raw"})
        results = {}
        for art in artifacts:
            aid = art.artifact_id
            paths = {name: aid in hits for name, hits in found.items()}
            paths.update(nearest.get(aid, {}))
            returned = sorted(p for p, hit in paths.items() if hit)
            count = len(queries[aid]) if aid in queries else probe_count(art.fingerprint, probe_vectors, aid) if dim else 0
            evidence = {"paths": sorted(paths), "returned_by": returned, "probe_vectors": count}
            if aid in held:
                evidence["wrapper_searches"] = ("every probe vector" if flagged
                                                else "where the raw search returned the artifact (nothing flagged)")
            else:
                evidence["by_filter"] = ("not asked: no live point of the collection carries this payload id"
                                         " (raw.scroll(), every point read), and a filter on the id reads that key")
                if count:
                    evidence["nearest_neighbours"] = ("not searched: every search names a point by its payload id,"
                                                      " and no live point of the collection carries this one")
            results[aid] = ProbeResult(
                level=Level.LOGICAL,
                passed=not returned,
                measurement=f"returned by {', '.join(returned)}" if returned else None,
                evidence=evidence,
            )
        return results

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        patterns = super().physical_patterns(artifact)
        pid = self.point_of(artifact.artifact_id)
        patterns["id_point_uuid"] = pid.encode()
        patterns["id_storage_key"] = CollectionPersistence.encode_key(normalize_point_id(pid)).encode()
        if self.fingerprint_scannable(artifact):
            # local mode pickles the vector as a list of Python floats: big-endian float64 per value
            patterns["content_pickled"] = pickled_floats(artifact.fingerprint)
        return patterns

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """SQLite free space of the collection's ``storage.sqlite``, deleted points named by their payload
        id (``forensics``)."""
        from .forensics import scan_qdrant

        return scan_qdrant(store, cls.backend, options)

    def file_label(self, file: Path) -> str:
        """How evidence names one of the store's files."""
        return file.relative_to(self.path).as_posix() if file.is_relative_to(self.path) else str(file)

    def physical_files(self) -> list[Path]:
        if not os.access(self.path, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"storage directory {self.path} is not readable", store=self.store)
        # everything but folders: the scanner refuses (and names) what it must not read
        return sorted(p for p in self.path.rglob("*") if not p.is_dir() and p.name != ".lock")

    def close(self) -> None:
        """The shared local-mode client stays open for the rest of the process (see ``local_client``); a
        read-only adapter's in-memory copy is dropped."""
        if self._memory is not None:
            self._memory.close()
            self._memory = None
