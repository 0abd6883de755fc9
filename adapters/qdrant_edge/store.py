"""Qdrant Edge (experimental), wrapped: an in-process ``EdgeShard`` in one folder, lineage recorded on write,
flagged points never returned.

An Edge shard is the Qdrant server's segment design run in the calling process: segments (vectors in
``vector_storage/``, payloads in ``payload_storage/``, a deleted-flags file, an id tracker) and a write-ahead
log (``wal/``). A delete sets a point's deleted flag and leaves its vector and payload in the segment until an
optimisation vacuums it, which the shard runs only when asked (``optimize``) and only for segments past
``deleted_threshold`` (0.2 by default) with at least ``vacuum_min_vector_number`` vectors (1000); the WAL
keeps every operation, the payload (ids) included, until its files are rolled over.

The shard is opened once per process and folder (``shard_at``): the wrapper and the adapter share it, and the
reclaim, which closes and reopens it, hands the new one to both.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture.vector import Embedder, embed, record_write
from tombstone.errors import StoreUnavailableError
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

BACKEND = "qdrant_edge"
ID_KEY = "tombstone_id"
DOCUMENT_KEY = "document"
SUPPRESSED = "tombstone_suppressed"
TESTED = ("0.9.",)
"""The qdrant-edge-py releases whose storage this backend knows (the extra pins them)."""
_NAMESPACE = uuid.UUID("2b3c6a0e-6f1d-4f5a-9c1e-8f1d2a3b4c5d")
_SHARDS: dict[str, Any] = {}
_GUARD = threading.Lock()


def point_id(artifact_id: str) -> str:
    """The shard's point id of an artifact: a UUID derived from its id (the id itself is in the payload)."""
    return str(uuid.uuid5(_NAMESPACE, artifact_id))


def check_release(store: str) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("qdrant-edge-py")
    except PackageNotFoundError:
        raise StoreUnavailableError(f"the {BACKEND} backend needs qdrant-edge-py: pip install"
                                    " 'tombstone-rag[qdrant-edge]'", store=store, retryable=False) from None
    if not found.startswith(TESTED):
        raise StoreUnavailableError(f"qdrant-edge-py {found} is outside the tested range ({', '.join(t + 'x' for t in TESTED)})",
                                    store=store, retryable=False)


def shard_at(path: str | Path, store: str, *, dim: int | None = None, create: bool = False) -> Any:
    """The process's open shard of ``path`` (loaded, or created with ``dim`` cosine vectors when ``create``)."""
    check_release(store)
    import qdrant_edge as qe

    key = str(Path(path).resolve())
    with _GUARD:
        shard = _SHARDS.get(key)
        if shard is not None:
            return shard
        folder = Path(path)
        if (folder / "edge_config.json").is_file():
            shard = qe.EdgeShard.load(str(folder))
        elif create and dim:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            shard = qe.EdgeShard.create(str(folder), qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=int(dim),
                                                                                             distance=qe.Distance.Cosine)))
        else:
            raise StoreUnavailableError(f"no Qdrant Edge shard at {folder} (no edge_config.json)", store=store,
                                        retryable=False)
        _SHARDS[key] = shard
        return shard


def close_shard(path: str | Path) -> None:
    """Flush and close the process's shard of ``path`` (the next ``shard_at`` loads it again)."""
    with _GUARD:
        shard = _SHARDS.pop(str(Path(path).resolve()), None)
    if shard is not None:
        shard.flush()
        shard.close()


def close_all() -> None:
    for key in list(_SHARDS):
        close_shard(key)


def unflagged() -> Any:
    import qdrant_edge as qe

    return qe.Filter(must_not=[qe.FieldCondition(key=SUPPRESSED, match=qe.MatchValue(True))])


class TombstoneEdgeShard:
    """The app's Edge shard, written with lineage, read with flagged and suppressed points left out."""

    def __init__(self, path: str | Path, *, dim: int | None = None, lineage: LineageDB | None = None,
                 embedder: Embedder | None = None, store: str = BACKEND, lock_wait: float = STORE_LOCK_WAIT) -> None:
        self.path = Path(path)
        self.store = store
        self.lineage = lineage
        self.embedder = embedder
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        shard_at(self.path, store, dim=dim, create=dim is not None)
        self.lock = StoreLock(lock_file_for(self.path), wait=lock_wait, store=store)

    @property
    def shard(self) -> Any:
        return shard_at(self.path, self.store)

    def upsert(self, ids: Sequence[str], documents: Sequence[str] | None = None, *, subject: str,
               payloads: Sequence[Mapping[str, Any] | None] | None = None, vectors: Any = None,
               sources: Sequence[Sequence[tuple[str, str, str]]] | None = None) -> None:
        import qdrant_edge as qe

        if self.lineage is None or self.embedder is None:
            raise ValueError("this shard was opened without a lineage db or an embedder: it cannot write")
        ids = [str(i) for i in ids]
        written = record_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                               documents=documents, embeddings=vectors, subject=subject, sources=sources)
        with self.lock:
            hidden = suppressed_among(self.lineage, self.store, ids)
            points = []
            for n, aid in enumerate(ids):
                payload = {k: v for k, v in dict(payloads[n] or {} if payloads else {}).items() if k != SUPPRESSED}
                payload[ID_KEY] = aid
                if documents is not None:
                    payload[DOCUMENT_KEY] = documents[n]
                if aid in hidden:
                    payload[SUPPRESSED] = True
                points.append(qe.Point(id=point_id(aid), vector=np.asarray(written[n], dtype=np.float32).tolist(),
                                       payload=payload))
            self.shard.update(qe.UpdateOperation.upsert_points(points))
            self.shard.flush()

    def _visible(self, record: Any) -> bool:
        payload = record.payload or {}
        if payload.get(SUPPRESSED):
            return False
        return not (self.hidden is not None and payload.get(ID_KEY) in self.hidden.current())

    def search(self, query: Any = None, *, text: str | None = None, k: int = 4) -> list[Any]:
        """The ``k`` nearest visible points (``ScoredPoint``: ``payload``, ``score``, ``vector``)."""
        import qdrant_edge as qe

        if text is not None:
            query = embed(self.embedder, [text])[0]
        hidden = set(self.hidden.current()) if self.hidden is not None else set()
        request = qe.SearchRequest(query=qe.Query.Nearest(np.asarray(query, dtype=np.float32).tolist()),
                                   limit=k + len(hidden), filter=unflagged(), with_payload=True, with_vector=True)
        return [p for p in self.shard.search(request) if self._visible(p)][:k]

    def retrieve(self, ids: Sequence[str]) -> list[Any]:
        records = self.shard.retrieve([point_id(str(i)) for i in ids], True, True)
        return [r for r in records if self._visible(r)]

    def delete(self, ids: Sequence[str]) -> None:
        """The shard's own delete (what an app calls): a deleted flag; vector and payload stay in the segment."""
        import qdrant_edge as qe

        with self.lock:
            self.shard.update(qe.UpdateOperation.delete_points([point_id(str(i)) for i in ids]))
            self.shard.flush()


__all__ = ["BACKEND", "ID_KEY", "SUPPRESSED", "TombstoneEdgeShard", "check_release", "close_all", "close_shard",
           "point_id", "shard_at", "unflagged"]
