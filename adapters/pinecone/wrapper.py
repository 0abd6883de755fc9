"""The Pinecone index wrapper apps write and read through (the real ``pinecone`` SDK underneath).

Writes record lineage and carry ``tombstone_suppressed: false`` and the artifact id in metadata; every
read path (``query``, ``fetch``) merges ``tombstone_suppressed != true`` into the caller's filter and
post-filters the results. A wrapper with the lineage db also leaves out the ids an erasure has recorded as
suppressed and not yet reclaimed (``tombstone_id $nin [...]``), from that moment, before the flag is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture import deferred
from tombstone.capture.vector import Embedder, embed, vectors_for_write
from tombstone.lineage.db import LineageDB

BACKEND = "pinecone"
SUPPRESSED = "tombstone_suppressed"
ID_KEY = "tombstone_id"
DOCUMENT_KEY = "document"
VISIBLE = {SUPPRESSED: {"$ne": True}}
NIN_LIMIT = 10_000
"""The most values Pinecone takes in one ``$nin``."""
TOP_K_LIMIT = 10_000
"""The largest ``top_k`` Pinecone answers."""


def merge_filter(caller: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"$and": [dict(caller), dict(VISIBLE)]} if caller else dict(VISIBLE)


def _visible(metadata: Mapping[str, Any] | None) -> bool:
    return not (metadata or {}).get(SUPPRESSED)


class TombstonePinecone:
    """A Pinecone index (``pc.Index(host=...)``) wrapped; ``lineage=None`` gives a read-only view."""

    def __init__(self, index: Any, *, namespace: str = "", lineage: LineageDB | None, store: str,
                 embedder: Embedder | None = None) -> None:
        self.index, self.namespace = index, namespace
        self.lineage, self.store, self.embedder = lineage, store, embedder
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None

    @deferred.after_write
    def upsert(self, ids: Sequence[str], documents=None, metadatas=None, vectors=None, *, subject) -> None:
        if self.lineage is None or self.embedder is None:
            raise ValueError("this wrapper was opened read-only (no lineage db or embedder)")
        ids = [str(i) for i in ids]
        vectors = vectors_for_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                                    documents=documents, embeddings=vectors, subject=subject)
        docs = list(documents) if documents is not None else [None] * len(ids)
        metas = list(metadatas) if metadatas is not None else [None] * len(ids)
        # An id an erasure has suppressed is written hidden: writing it again never clears its suppression.
        hidden = suppressed_among(self.lineage, self.store, ids)
        records = []
        for aid, vec, doc, meta in zip(ids, vectors, docs, metas):
            metadata = {k: v for k, v in (meta or {}).items() if k != SUPPRESSED}
            metadata.update({SUPPRESSED: aid in hidden, ID_KEY: aid})
            if doc is not None:
                metadata[DOCUMENT_KEY] = doc
            records.append({"id": aid, "values": vec.tolist(), "metadata": metadata})
        self.index.upsert(vectors=records, namespace=self.namespace)

    def query(self, vector=None, *, text: str | None = None, top_k: int = 10, filter=None, **kwargs):
        """Matches (``ScoredVector``), suppressed ones never included."""
        if text is not None:
            vector = embed(self.embedder, [text])[0].tolist()
        kwargs["include_metadata"] = True
        hidden = self.hidden.current() if self.hidden is not None else frozenset()
        flt, asked = merge_filter(filter), top_k
        if hidden and len(hidden) <= NIN_LIMIT:
            flt = {"$and": [flt, {ID_KEY: {"$nin": sorted(hidden)}}]}
        elif hidden:  # more than one $nin takes: ask for that many more and drop them
            asked = min(TOP_K_LIMIT, top_k + len(hidden))
        result = self.index.query(vector=list(vector), top_k=asked, filter=flt, namespace=self.namespace, **kwargs)
        return [m for m in result.matches if _visible(m.metadata) and m.id not in hidden][:top_k]

    def fetch(self, ids: Sequence[str]) -> dict[str, Any]:
        hidden = self.hidden.current() if self.hidden is not None else frozenset()
        vectors = self.index.fetch(ids=list(ids), namespace=self.namespace).vectors
        return {i: v for i, v in vectors.items() if _visible(v.metadata) and i not in hidden}
