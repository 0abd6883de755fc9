"""What ``TombstoneVectorStore`` needs of each backend's wrapper: write, get by id, nearest records.

One binding per wrapper class (Chroma's ``TombstoneCollection``, ``FaissStore``, ``TombstoneQdrant``,
``PgVectorStore``, ``TombstonePinecone``); the vector store picks it from the wrapper it is given. Every
read goes through the wrapper's own read path, which hides suppressed records; the metadata keys a wrapper
adds for itself (the suppression flag, the artifact id, the document) are dropped from what comes back.
Scores are turned into relevance in [0, 1], higher is closer, whatever the store's distance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.documents import Document


@dataclass
class Hit:
    document: Document
    relevance: float
    vector: np.ndarray | None = None


def _clamp(x: float) -> float:
    return 0.0 if math.isnan(x) else min(1.0, max(0.0, x))


def relevance(kind: str, value: float) -> float:
    """A store's score as relevance in [0, 1]: ``similarity`` (cosine or dot, of normalised vectors),
    ``cosine_distance`` (1 - cosine), ``l2`` (euclidean), ``l2_squared``, ``neg_ip`` (minus the dot product)."""
    if kind == "similarity":
        return _clamp(value)
    if kind == "cosine_distance":
        return _clamp(1.0 - value)
    if kind == "l2":
        return _clamp(1.0 - value / math.sqrt(2))
    if kind == "l2_squared":
        return _clamp(1.0 - math.sqrt(max(value, 0.0)) / math.sqrt(2))
    if kind == "neg_ip":
        return _clamp(-value)
    raise ValueError(f"unknown score kind {kind!r}")


class Binding:
    """The calls the vector store makes, on one wrapper."""

    backend = ""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    @property
    def store(self) -> str:
        return self.wrapper.store

    @property
    def lineage(self) -> Any:
        return self.wrapper.lineage

    @property
    def embedder(self) -> Any:
        return self.wrapper.embedder

    @embedder.setter
    def embedder(self, value: Any) -> None:
        self.wrapper.embedder = value

    def write(self, ids: list[str], texts: list[str], metadatas: list[dict], subject: str, vectors: Any = None) -> None:
        """Write the records through the wrapper; ``vectors`` (one per record) are stored as given, else the
        wrapper's embedder embeds the texts."""
        raise NotImplementedError

    def get(self, ids: Sequence[str]) -> list[Document]:
        raise NotImplementedError

    def search(self, vector: np.ndarray, k: int, filter: Mapping[str, Any] | None,
               with_vectors: bool = False) -> list[Hit]:
        raise NotImplementedError


class ChromaBinding(Binding):
    backend = "chroma"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.upsert(ids=ids, documents=texts, metadatas=[m or None for m in metadatas], subject=subject,
                            embeddings=None if vectors is None else np.asarray(vectors, dtype=np.float32))

    @staticmethod
    def _where(filter):
        if not filter:
            return None
        items = [{k: v} for k, v in filter.items()]
        return items[0] if len(items) == 1 else {"$and": items}

    @staticmethod
    def _meta(m):
        from tombstone_adapters.chroma.wrapper import SUPPRESSED

        return {k: v for k, v in (m or {}).items() if k != SUPPRESSED}

    def get(self, ids):
        got = self.wrapper.get(ids=list(ids), include=["documents", "metadatas"])
        return [Document(id=i, page_content=d or "", metadata=self._meta(m))
                for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])]

    def _space(self) -> str:
        metadata = getattr(self.wrapper.collection, "metadata", None) or {}
        return {"cosine": "cosine_distance", "ip": "cosine_distance"}.get(metadata.get("hnsw:space", "l2"), "l2_squared")

    def search(self, vector, k, filter, with_vectors=False):
        count = self.wrapper.count()
        if not count:
            return []
        include = ["documents", "metadatas", "distances"] + (["embeddings"] if with_vectors else [])
        got = self.wrapper.query(query_embeddings=[np.asarray(vector, dtype=np.float32)], n_results=min(k, count),
                                 where=self._where(filter), include=include)
        space = self._space()
        vectors = got.get("embeddings")
        return [Hit(Document(id=i, page_content=d or "", metadata=self._meta(m)), relevance(space, dist),
                    np.asarray(vectors[0][n], dtype=np.float32) if with_vectors and vectors is not None else None)
                for n, (i, d, m, dist) in enumerate(zip(got["ids"][0], got["documents"][0], got["metadatas"][0],
                                                        got["distances"][0]))]


class FaissBinding(Binding):
    backend = "faiss"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.add(ids, documents=texts, metadatas=metadatas, subject=subject,
                         embeddings=None if vectors is None else np.asarray(vectors, dtype=np.float32))

    def get(self, ids):
        return [Document(id=i, page_content=rec["document"] or "", metadata=dict(rec["metadata"] or {}))
                for i, rec in self.wrapper.get(list(ids)).items()]

    def search(self, vector, k, filter, with_vectors=False):
        import faiss

        hits = self.wrapper.search(query_embeddings=np.asarray(vector, dtype=np.float32)[None, :], k=k,
                                   where=dict(filter) if filter else None)[0]
        if not hits:
            return []
        records = self.wrapper.get([i for i, _ in hits])
        kind = "l2_squared" if self.wrapper.hnsw.metric_type == faiss.METRIC_L2 else "similarity"
        vectors = self.wrapper.vectors([i for i, _ in hits]) if with_vectors else None
        return [Hit(Document(id=i, page_content=records[i]["document"] or "", metadata=dict(records[i]["metadata"] or {})),
                    relevance(kind, d), vectors[n] if vectors is not None else None)
                for n, (i, d) in enumerate(hits) if i in records]


def _strip(payload: Mapping[str, Any] | None, *keys: str) -> dict[str, Any]:
    return {k: v for k, v in (payload or {}).items() if k not in keys}


class QdrantBinding(Binding):
    backend = "qdrant"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.upsert(ids, documents=texts, payloads=metadatas, subject=subject,
                            vectors=None if vectors is None else np.asarray(vectors, dtype=np.float32))

    def _doc(self, point) -> Document:
        from tombstone_adapters.qdrant.wrapper import DOCUMENT_KEY, ID_KEY, SUPPRESSED

        payload = point.payload or {}
        return Document(id=payload.get(ID_KEY), page_content=payload.get(DOCUMENT_KEY) or "",
                        metadata=_strip(payload, DOCUMENT_KEY, ID_KEY, SUPPRESSED))

    def get(self, ids):
        return [self._doc(p) for p in self.wrapper.retrieve(list(ids))]

    def _kind(self) -> str:
        from qdrant_client import models

        params = self.wrapper.client.get_collection(self.wrapper.collection).config.params.vectors
        distance = getattr(params, "distance", None)
        return "l2" if distance == models.Distance.EUCLID else "similarity"

    def search(self, vector, k, filter, with_vectors=False):
        from qdrant_client import models

        query_filter = models.Filter(must=[models.FieldCondition(key=key, match=models.MatchValue(value=value))
                                           for key, value in filter.items()]) if filter else None
        points = self.wrapper.query_points(np.asarray(vector, dtype=np.float32).tolist(), limit=k,
                                           query_filter=query_filter, with_vectors=with_vectors)
        kind = self._kind()
        return [Hit(self._doc(p), relevance(kind, p.score),
                    np.asarray(p.vector, dtype=np.float32) if with_vectors and p.vector is not None else None)
                for p in points]


class PgVectorBinding(Binding):
    backend = "pgvector"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.add(ids, documents=texts, metadatas=metadatas, subject=subject,
                         embeddings=None if vectors is None else np.asarray(vectors, dtype=np.float32))

    def get(self, ids):
        return [Document(id=r["id"], page_content=r["document"] or "", metadata=dict(r["metadata"] or {}))
                for r in self.wrapper.get(list(ids))]

    def search(self, vector, k, filter, with_vectors=False):
        rows = self.wrapper.search(query_embeddings=np.asarray(vector, dtype=np.float32)[None, :], k=k,
                                   where=dict(filter) if filter else None)[0]
        kind = {"cosine": "cosine_distance", "l2": "l2", "ip": "neg_ip"}[self.wrapper.distance]
        vectors = self.wrapper.vectors_by_id([r["id"] for r in rows]) if with_vectors and rows else {}
        return [Hit(Document(id=r["id"], page_content=r["document"] or "", metadata=dict(r["metadata"] or {})),
                    relevance(kind, r["distance"]), vectors.get(r["id"]))
                for r in rows]


class PineconeBinding(Binding):
    """Pinecone's scores are taken as similarities (a ``cosine`` or ``dotproduct`` index)."""

    backend = "pinecone"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.upsert(ids, documents=texts, metadatas=metadatas, subject=subject,
                            vectors=None if vectors is None else np.asarray(vectors, dtype=np.float32))

    @staticmethod
    def _doc(vid, metadata) -> Document:
        from tombstone_adapters.pinecone.wrapper import DOCUMENT_KEY, ID_KEY, SUPPRESSED

        metadata = metadata or {}
        return Document(id=metadata.get(ID_KEY) or vid, page_content=metadata.get(DOCUMENT_KEY) or "",
                        metadata=_strip(metadata, DOCUMENT_KEY, ID_KEY, SUPPRESSED))

    def get(self, ids):
        ids = list(ids)
        if not ids:
            return []
        return [self._doc(vid, v.metadata) for vid, v in self.wrapper.fetch(ids).items()]

    def search(self, vector, k, filter, with_vectors=False):
        flt = {key: {"$eq": value} for key, value in filter.items()} if filter else None
        matches = self.wrapper.query(np.asarray(vector, dtype=np.float32).tolist(), top_k=k, filter=flt,
                                     include_values=with_vectors)
        return [Hit(self._doc(m.id, m.metadata), relevance("similarity", m.score),
                    np.asarray(m.values, dtype=np.float32) if with_vectors and m.values else None)
                for m in matches]


def _matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    return not filter or all(metadata.get(key) == value for key, value in filter.items())


def _filtered(fetch: Callable[[int], list], k: int, keep: Callable[[Any], bool], start: int) -> list:
    """The first ``k`` rows ``keep`` accepts, asking ``fetch(n)`` for the nearest ``n`` rows with ``n`` growing
    fourfold until ``k`` are kept or the store has no more (a store that filters nothing itself)."""
    n = max(start, k)
    while True:
        rows = fetch(n)
        kept = [r for r in rows if keep(r)]
        if len(kept) >= k or len(rows) < n:
            return kept[:k]
        n *= 4


class SqliteVecBinding(Binding):
    """sqlite-vec's ``VecStore``: metadata as the row's JSON, a filter applied to the nearest rows asked for."""

    backend = "sqlitevec"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        self.wrapper.add(ids, texts, subject=subject, metadatas=metadatas, vectors=vectors)

    def get(self, ids):
        return [Document(id=h.id, page_content=h.text or "", metadata=dict(h.metadata)) for h in self.wrapper.get(list(ids))]

    def search(self, vector, k, filter, with_vectors=False):
        hits = _filtered(lambda n: self.wrapper.search(vector, k=n), k, lambda h: _matches(h.metadata, filter), 4 * k)
        vectors = self.wrapper.vectors([h.id for h in hits]) if with_vectors else {}
        return [Hit(Document(id=h.id, page_content=h.text or "", metadata=dict(h.metadata)),
                    relevance("cosine_distance", h.distance), vectors.get(h.id)) for h in hits]


class LanceDBBinding(Binding):
    """LanceDB's ``TombstoneLanceTable``: metadata as a JSON string column ``metadata``, a filter applied to the
    nearest rows asked for."""

    backend = "lancedb"

    def write(self, ids, texts, metadatas, subject, vectors=None):
        import json

        self.wrapper.add(ids, texts, subject=subject, metadatas=[{"metadata": json.dumps(m or {}, sort_keys=True)}
                                                                 for m in metadatas], vectors=vectors)

    def _doc(self, row) -> Document:
        import json

        return Document(id=row[self.wrapper.id_column], page_content=row.get(self.wrapper.text_column) or "",
                        metadata=json.loads(row.get("metadata") or "{}"))

    def get(self, ids):
        return [self._doc(row) for row in self.wrapper.get(list(ids))]

    def search(self, vector, k, filter, with_vectors=False):
        rows = _filtered(lambda n: self.wrapper.search(vector, k=n), k, lambda r: _matches(self._doc(r).metadata, filter),
                         4 * k)
        column = self.wrapper.vector_column
        return [Hit(self._doc(r), relevance("l2_squared", r["_distance"]),
                    np.asarray(r[column], dtype=np.float32) if with_vectors else None) for r in rows]


def binding_for(wrapper: Any) -> Binding:
    """The binding of a Tombstone wrapper, by its class (imports only the backend it is)."""
    module = type(wrapper).__module__
    candidates = (
        ("tombstone_adapters.chroma", "TombstoneCollection", ChromaBinding),
        ("tombstone_adapters.faiss", "FaissStore", FaissBinding),
        ("tombstone_adapters.qdrant", "TombstoneQdrant", QdrantBinding),
        ("tombstone_adapters.pgvector", "PgVectorStore", PgVectorBinding),
        ("tombstone_adapters.pinecone", "TombstonePinecone", PineconeBinding),
        ("tombstone_adapters.sqlitevec", "VecStore", SqliteVecBinding),
        ("tombstone_adapters.lancedb", "TombstoneLanceTable", LanceDBBinding),
    )
    import importlib

    for package, name, binding in candidates:
        if module.startswith(package + ".") or module == package:
            cls = getattr(importlib.import_module(package), name)
            if isinstance(wrapper, cls):
                return binding(wrapper)
    for package, name, binding in candidates:  # a subclass defined elsewhere
        try:
            cls = getattr(importlib.import_module(package), name)
        except ImportError:
            continue
        if isinstance(wrapper, cls):
            return binding(wrapper)
    raise TypeError(f"{type(wrapper).__name__} is not a Tombstone vector wrapper (TombstoneCollection, FaissStore,"
                    " TombstoneQdrant, PgVectorStore, TombstonePinecone, VecStore or TombstoneLanceTable)")


__all__ = ["Binding", "Hit", "binding_for", "relevance"]
