"""Adapter for the FAISS store: exclusion set, in-place reclaim (or rebuild from survivors), byte scan of the
store's files (index, state, records)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, ReclaimUnavailableError, StoreUnavailableError
from tombstone.fsutil import Snapshot
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.logical import TOP_K, fit_dim, nearest_paths_many, probe_count, probe_set
from tombstone.verify.neighbourhood import Neighbours

from .store import BACKEND, FaissStore, metadata_limit
from .hooks import FaissHooks


class FaissAdapter(FaissHooks, Adapter):
    """Options: ``path`` (the store directory); ``reclaim``: ``in-place`` (default: zero the erased vectors,
    keep the graph) or ``rewrite`` (rebuild the graph from the survivors on every erasure);
    ``max_metadata_bytes``: the largest state file read whole (64 MiB by default); ``threads``: FAISS's OpenMP
    threads (a number, or ``"all"``; by default half the CPUs this process may use: see ``threads.py``)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)
    read_only_supported = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.reclaim_mode()
        self.dir = Path(options["path"])
        """The store's own directory (what the physical probe reads)."""
        self._snapshot: Snapshot | None = None
        path = self.dir
        limit = metadata_limit(store, options)
        if self.read_only:
            if not (self.dir / "CURRENT").is_file():
                raise StoreUnavailableError(f"no FAISS store at {self.dir}", store=store, retryable=False)
            # FaissStore takes the store's lock (a file beside the store) to load it: read-only, it loads
            # a private copy, and nothing beside or inside the store is touched.
            self._snapshot = Snapshot(prefix="tombstone-faiss-")
            path = self._snapshot.copy_tree(self.dir)
        try:
            self.faiss = FaissStore(path, store=store, create=False, max_metadata_bytes=limit,
                                    threads=options.get("threads"))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._snapshot is not None:
            self._snapshot.close()
            self._snapshot = None

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """faiss raises its C++ exceptions as RuntimeError; OSError comes from the store directory."""
        return (RuntimeError, OSError)

    def lock_path(self) -> Path:
        """The store directory: its lock file is ``<directory>.tombstone.lock``, beside it (a commit deletes
        every other file inside), the one ``FaissStore`` writes take."""
        return self.faiss.dir

    @property
    def writable(self) -> bool:
        return os.access(self.faiss.dir, os.W_OK) and all(os.access(p, os.W_OK) for p in self.faiss.files())

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        n = self.faiss.exclude(self._ids(artifacts))
        return {"mechanism": "persisted exclusion set (IDSelectorNot in the search parameters) + post-filter",
                "labels_excluded": n}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        labels = np.array([self.faiss.side["labels"][i] for i in self._ids(artifacts) if i in self.faiss.side["labels"]],
                          dtype=np.int64)
        try:
            self.faiss.index.remove_ids(labels)
            self.faiss.commit()
        except RuntimeError:
            # IndexHNSWFlat cannot remove: all an app can do is forget the mapping.
            self.faiss.drop_mapping(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        if not self.writable:
            # The suppression just wrote this folder, so it is a fault the operator fixes (a read-only mount,
            # changed permissions): a dead letter that `tombstone dlq retry` finishes, not a skipped step
            mounted_ro = bool(os.statvfs(self.faiss.dir).f_flag & os.ST_RDONLY)
            raise StoreUnavailableError(f"cannot reclaim FAISS store {self.faiss.dir}: its folder or files are"
                                        f" not writable{' (Read-only file system)' if mounted_ro else ''}",
                                        store=self.store, retryable=False)
        if self.reclaim_mode() == "rewrite":
            evidence = self.faiss.rebuild(self._ids(artifacts))
            evidence["mechanism"] = "rewrite"
            evidence["steps"] = ["rebuild IndexHNSWFlat from survivors (same M, efConstruction, efSearch, metric)",
                                 "write the new generation's index and state (temp, fsync, rename)", "switch CURRENT",
                                 "delete old generation", "blank the erased records' lines where they lie"]
            return evidence
        evidence = self.faiss.zero_in_place(self._ids(artifacts))
        if evidence["mechanism"] == "in-place":
            evidence["steps"] = ["zero the erased vectors in the flat storage under the HNSW graph",
                                 "drop their ids, documents and metadata; hide their labels",
                                 "write the new generation's state (temp, fsync, rename)", "switch CURRENT",
                                 "delete old generation", "blank the erased records' lines where they lie"]
            evidence["left"] = ("the zeroed slots stay in the graph (links and int64 labels that name no id) until"
                                " 'tombstone compact'")
        return evidence

    def reclaim_store(self) -> dict[str, Any]:
        """Everything deleted goes: the graph rebuilt from the live records (vectors whose id the app dropped,
        zeroed slots and their links are left out)."""
        return self.compact()

    def compact(self) -> dict[str, Any]:
        if not self.writable:
            raise ReclaimUnavailableError("index directory or files not writable", store=self.store)
        return {"mechanism": "rebuild IndexHNSWFlat from the live records", **self.faiss.compact()}

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        store = self.faiss
        probe_vectors = probe_vectors or {}
        dim, total = store.dim, store.ntotal

        def raw(vectors: np.ndarray, k: int):
            _, labels = store.raw_search(vectors, k)
            id_of = store._id_of()  # built when first needed: after a clean erasure nothing is searched
            ids = [[id_of.get(label) for label in row if label >= 0] for row in labels.tolist()]
            return ids, lambda rows: [self._candidates(ids[r]) for r in rows]

        def wrapped(vectors: np.ndarray, k: int):
            ids = [[aid for aid, _ in row] for row in store.search(query_embeddings=vectors, k=k)]
            return ids, lambda rows: [self._candidates(ids[r]) for r in rows]

        results = {}
        store.refresh()
        store.look_up(art.artifact_id for art in artifacts)  # one sorted search for all of them
        # the wrapper's full listing (get()'s ids), once for the batch: which of the artifacts it holds
        listed = {art.artifact_id for art in artifacts}.intersection(store.ids())
        # and its read by id, once for all of them (what it returns for a list is what it returns for each)
        gotten = set(store.get(ids=[art.artifact_id for art in artifacts]))
        # Both searches name their results through the store's id map (label -> id), so a search can
        # return an id only while the map holds it: for an id the map no longer holds, every nearest-neighbour
        # path is decided by that one lookup, and its probe vectors are not searched, nor read from the lineage
        # db (after a clean erasure, none are). Chroma and Qdrant decide the same from ids they read.
        labels = store.side["labels"]
        mapped = {art.artifact_id: [(label, fit_dim(v, dim)) for label, v in
                                    probe_set(art.fingerprint, probe_vectors.get(art.artifact_id, []), dim)]
                  for art in artifacts if art.artifact_id in labels}
        nearest = nearest_paths_many(list(mapped.items()), {"raw": raw, "wrapper": wrapped}, min(TOP_K, total))
        for art in artifacts:
            aid = art.artifact_id
            paths = {
                "raw.sidecar(id)": aid in store.side["labels"],
                "wrapper.get(ids)": aid in gotten,
                "wrapper.get()": aid in listed,
            }
            paths.update(nearest.get(aid, {}))
            returned = sorted(p for p, hit in paths.items() if hit)
            count = len(mapped[aid]) if aid in mapped else probe_count(art.fingerprint, probe_vectors, aid)
            evidence = {"paths": sorted(paths), "returned_by": returned, "probe_vectors": count}
            if aid not in mapped and count:
                evidence["nearest_neighbours"] = ("not searched: the id map names every search result and holds"
                                                  " no entry for this id, so no search can return it")
            results[aid] = ProbeResult(
                level=Level.LOGICAL,
                passed=not returned,
                measurement=f"returned by {', '.join(returned)}" if returned else None,
                evidence=evidence,
            )
        return results

    def _candidates(self, ids: list[str | None]) -> np.ndarray:
        known = [i for i in ids if i is not None and i in self.faiss.side["labels"]]
        if len(known) != len(ids):
            return np.zeros((0, self.faiss.dim), dtype=np.float32)
        return self.faiss.vectors(known)

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """The index's own search (the exclusion set not applied), over-fetched by ``len(exclude)``;
        labels no id maps to any more are left out."""
        store = self.faiss
        store.refresh()
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, store.dim)
        fetch = min(store.ntotal, k + len(exclude))
        if fetch <= 0:
            return [Neighbours([], [], np.zeros((0, store.dim))) for _ in vectors]
        dist, labels = store.raw_search(vectors, fetch)
        id_of = store._id_of()
        out = []
        for row_d, row_l in zip(dist.tolist(), labels.tolist()):
            hits = [(id_of[label], d) for d, label in zip(row_d, row_l)
                    if label >= 0 and label in id_of and id_of[label] not in exclude][:k]
            ids = [aid for aid, _ in hits]
            out.append(Neighbours(ids, [d for _, d in hits], store.vectors(ids)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        self.faiss.refresh()
        known = [i for i in ids if i in self.faiss.side["labels"]]
        return dict(zip(known, self.faiss.vectors(known)))

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        patterns = super().physical_patterns(artifact)
        escaped = json.dumps(artifact.artifact_id, ensure_ascii=False)[1:-1].encode("utf-8")
        if escaped != patterns["id"]:
            patterns["id_json"] = escaped  # how the records file spells an id with quotes or backslashes
        return patterns

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        if not self.read_only and not self.writable:  # an auditor only reads: it rebuilds nothing
            raise PhysicalUnsupportedError("index not writable, so it cannot be rebuilt: logical level only",
                                           store=self.store)
        return super().probe_physical(artifacts)

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Vectors without a live id, excluded vectors and stale generations (``forensics``)."""
        from .forensics import scan_faiss

        return scan_faiss(store, cls.backend, options)

    def physical_root(self) -> Path:
        """The store directory: files in its sub-folders (a copy of an index or of the records) are read as
        bytes too, and named."""
        return self.dir

    def physical_files(self) -> list[Path]:
        if not os.access(self.dir, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"store directory {self.dir} is not readable", store=self.store)
        # everything but folders: the scanner refuses (and names) what it must not read
        return sorted(p for p in self.dir.iterdir() if not p.is_dir())
