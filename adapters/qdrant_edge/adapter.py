"""Adapter for Qdrant Edge (experimental): payload flag + filter, delete, a vacuum of every segment holding a
deleted point, the write-ahead log rolled over, byte scan of the shard's folder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.capture.vector import normalised_fingerprint
from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError
from tombstone.faults import kill_point
from tombstone.fsutil import write_atomic
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.logical import fit_dim, paths_result, probe_set

from .hooks import QdrantEdgeHooks
from .store import BACKEND, ID_KEY, SUPPRESSED, TombstoneEdgeShard, close_shard, point_id, shard_at

TOP = 40


class QdrantEdgeAdapter(QdrantEdgeHooks, Adapter):
    """Options: ``path`` (the shard's folder, required). Experimental: the shard's payloads are stored compressed,
    so the physical probe finds an erased point by its vector's bytes and, where it is written literally, its
    id."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN})
    levels = (Level.LOGICAL, Level.PHYSICAL)
    experimental = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.path = Path(options["path"])
        self.wrapped = TombstoneEdgeShard(self.path, store=store)

    @property
    def shard(self) -> Any:
        return shard_at(self.path, self.store)

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        return (OSError, RuntimeError, ValueError)

    def lock_path(self) -> Path:
        return self.path

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def _config(self) -> dict[str, Any]:
        return json.loads((self.path / "edge_config.json").read_text())

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        import qdrant_edge as qe

        # only points the shard still has: flagging a deleted one is refused
        ids = [str(r.id) for r in self.shard.retrieve([point_id(a) for a in self._ids(artifacts)], False, False)]
        if ids:
            self.shard.update(qe.UpdateOperation.set_payload(ids, {SUPPRESSED: True}))
            self.shard.flush()
        return {"mechanism": f"payload flag {SUPPRESSED} + must_not filter on every wrapper read", "points_flagged": len(ids)}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.wrapped.delete(self._ids(artifacts))

    def _load_with(self, optimizers: Any) -> None:
        """Close the shard and load it again with the vectors it has and ``optimizers`` (None: its own)."""
        import qdrant_edge as qe

        close_shard(self.path)
        vectors = {name: qe.EdgeVectorParams(size=v["size"], distance=getattr(qe.Distance, v["distance"]))
                   for name, v in self._config()["vectors"].items()}
        config = qe.EdgeConfig(vectors=vectors.get("") if set(vectors) == {""} else vectors, optimizers=optimizers)
        qe.EdgeShard.load(str(self.path), config).close()

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        import qdrant_edge as qe

        ids = self._ids(artifacts)
        present = len(self.shard.retrieve([point_id(a) for a in ids], False, False))
        before = (self.path / "edge_config.json").read_bytes()
        self.shard.update(qe.UpdateOperation.delete_points([point_id(a) for a in ids]))
        self.shard.flush()
        kill_point("reclaim:qdrant_edge:deleted")
        # every segment holding a deleted point is vacuumed (not only those past the 20% threshold)
        self._load_with(qe.EdgeOptimizersConfig(deleted_threshold=0.0, vacuum_min_vector_number=1))
        optimised = shard_at(self.path, self.store).optimize()
        close_shard(self.path)
        kill_point("reclaim:qdrant_edge:vacuumed")
        # the write-ahead log keeps every operation's payload, ids included. Its files are set aside, and removed
        # only if the shard then loads to exactly the points it had with them (nothing it held only in the log
        # is lost); otherwise they are put back, and the probe will find what they hold
        wal_removed = self._drop_wal()
        # the app's own settings back as they were: the file it had, byte for byte (the shard is closed)
        write_atomic(self.path / "edge_config.json", before)
        return {"steps": ["delete the points", "flush", "optimize with deleted_threshold 0 and vacuum_min_vector_number 1"
                          " (every segment holding a deleted point vacuumed)", "close; the write-ahead log's files"
                          " removed if the shard loads to the same points without them, else kept",
                          "the shard's own edge_config.json written back as it was"],
                "points_deleted": present, "optimised": bool(optimised), "wal_files_removed": wal_removed}

    def _digest(self) -> str:
        """A digest of every point the shard loads to (id, payload, vector), the shard closed after."""
        import hashlib

        import qdrant_edge as qe

        records, _ = shard_at(self.path, self.store).scroll(qe.ScrollRequest(limit=10_000_000, with_payload=True,
                                                                             with_vector=True))
        close_shard(self.path)
        digest = hashlib.sha256()
        for record in sorted(records, key=lambda r: str(r.id)):
            digest.update(json.dumps([str(record.id), record.payload, record.vector], sort_keys=True, default=str).encode())
        return digest.hexdigest()

    def _drop_wal(self) -> int:
        folder = self.path / "wal"
        if not folder.is_dir():
            return 0
        with_log = self._digest()
        aside = self.path / "wal.tombstone-aside"
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)
        folder.mkdir()
        try:
            same = self._digest() == with_log
        except Exception:
            same = False
        if not same:  # the log held something the segments do not: put it back as it was
            close_shard(self.path)
            shutil.rmtree(folder, ignore_errors=True)
            aside.rename(folder)
            return 0
        removed = sum(1 for p in aside.iterdir() if p.is_file())
        shutil.rmtree(aside)
        return removed

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        import qdrant_edge as qe

        probe_vectors = probe_vectors or {}
        ids = self._ids(artifacts)
        raw = {r.payload.get(ID_KEY) for r in self.shard.retrieve([point_id(a) for a in ids], True, False)}
        wrapped = {r.payload.get(ID_KEY) for r in self.wrapped.retrieve(ids)}
        dim = int(next(iter(self._config()["vectors"].values()))["size"])
        results = {}
        for art in artifacts:
            aid = art.artifact_id
            paths = {"raw.retrieve": aid in raw, "wrapper.retrieve": aid in wrapped}
            queries = probe_set(art.fingerprint, probe_vectors.get(aid, []), dim) if aid in raw else []
            for label, vector in queries:
                found = self.shard.search(qe.SearchRequest(query=qe.Query.Nearest(fit_dim(vector, dim).tolist()),
                                                           limit=TOP, with_payload=True))
                paths[f"raw.search{TOP}({label})"] = any((p.payload or {}).get(ID_KEY) == aid for p in found)
            results[aid] = paths_result(paths, len(queries), None if aid in raw else
                                        "the shard retrieves no point for this id")
        return results

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        """The id, and the fingerprint as a cosine shard stores the vector: normalised, float32."""
        patterns = super().physical_patterns(artifact)
        if patterns.get("content") and artifact.inv_norm:
            patterns["content-normalised"] = np.asarray(
                normalised_fingerprint(artifact.fingerprint, artifact.inv_norm), dtype="<f4").tobytes()
        return patterns

    def physical_files(self) -> list[Path]:
        files = sorted(p for p in self.path.rglob("*") if p.is_file())
        if not files:
            raise PhysicalUnsupportedError(f"no files in the Qdrant Edge shard {self.path}", store=self.store)
        return files

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        raise NotImplementedError("the qdrant_edge adapter cannot scan for deleted data yet (the shard's payloads are"
                                  " stored compressed); erase the subjects, or reclaim the store, instead")
