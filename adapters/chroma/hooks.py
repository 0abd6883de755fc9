"""Chroma's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Small HNSW batch and sync thresholds so even a small demo writes Chroma's segment files to disk.
DEMO_METADATA = {"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20}


def ulp_equal(a, b, ulps: int = 2) -> bool:
    """Equal up to ``ulps`` float32 units in the last place (Chroma re-normalises on every indexing)."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return False
    diff = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
    return int(diff.max(initial=0)) <= ulps


def read_collection(path: str, name: str) -> Any:
    """Records (document, metadata), vectors and the top-3 of the first three vectors, with the client."""
    import chromadb

    client = chromadb.PersistentClient(path=path)
    try:
        col = client.get_collection(name)
        got = col.get(include=["documents", "metadatas", "embeddings"])
        queries = np.asarray(got["embeddings"][:3], dtype=np.float32) if len(got["ids"]) else None
        top = col.query(query_embeddings=queries, n_results=3, include=[])["ids"] if queries is not None else []
        return ({i: (d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])},
                {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"])}, top)
    finally:
        chromadb.api.client.SharedSystemClient.clear_system_cache()


def same_collection(a: Any, b: Any) -> bool:
    (ra, va, qa), (rb, vb, qb) = a, b
    return ra == rb and qa == qb and va.keys() == vb.keys() and all(ulp_equal(va[i], vb[i]) for i in va)


class ChromaHooks:
    demo_role = "chunks"
    demo_default = True

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "chroma", "path": "stores/chroma", "collection": kit.collection, "id_key": "chunk_id"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from .wrapper import TombstoneCollection, persistent_client

        client = persistent_client(options["path"])
        collection = client.get_or_create_collection(options.get("collection", kit.collection),
                                                     metadata=DEMO_METADATA, embedding_function=None)
        chunks = TombstoneCollection(collection, lineage=kit.lineage, store=store, embedder=kit.embedder())
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            for chunk_id, text, meta in zip(ids, texts, metas):
                # each chunk was cut from a document: erasing the document reaches the chunk
                chunks.add(ids=[chunk_id], documents=[text], metadatas=[meta], subject=ref,
                           sources=kit.document_sources([chunk_id]))

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "collection": f"{options.get('collection', 'rag-chunks')}-tombstone-canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Drop the canaries' collection (and a rewrite copy of it a killed reclaim left), holding the
        persist directory's lock; the configured collection is not touched."""
        from pathlib import Path

        import chromadb
        import chromadb.errors

        from tombstone.storelock import StoreLock, lock_file_for

        from .wrapper import REWRITE_SUFFIX

        name = cls.canary_options(options)["collection"]
        if not (Path(options["path"]) / "chroma.sqlite3").is_file():
            return
        with StoreLock(lock_file_for(options["path"]), store=name):
            client = chromadb.PersistentClient(path=str(options["path"]))
            for collection in (name, name + REWRITE_SUFFIX):
                try:
                    client.delete_collection(collection)
                except chromadb.errors.NotFoundError:
                    pass

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        return read_collection(options["path"], options.get("collection", "rag-chunks"))

    @classmethod
    def survivors_equal(cls, a: Any, b: Any) -> bool:
        return same_collection(a, b)

    @classmethod
    def release(cls, options: Mapping[str, Any]) -> None:
        import sys

        if "chromadb" in sys.modules:
            # Chroma caches one system per persist path in a process; the files may be about to go.
            sys.modules["chromadb"].api.client.SharedSystemClient.clear_system_cache()
