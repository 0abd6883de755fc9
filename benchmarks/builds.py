"""Store builds shared by several tables: the SQLite docstore, vector-store writers (through the wrapper
or raw), a vector deployment filled with subjects, and per-step saga times from the journal."""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np

from common import CHROMA_META, DIM, DOCS, SUBJECTS, chunk_text
from tombstone import Tombstone, init_deployment


def docstore_build(root: Path):
    """A docstore deployment with ``SUBJECTS`` subjects of ``DOCS`` documents each."""
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(root, {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    subjects = [f"bench-{i:04d}" for i in range(SUBJECTS)]
    with Tombstone(config) as tomb:
        store = DocStore(config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        rng = np.random.default_rng(7)
        for s in subjects:
            docs = [(f"{s}-doc-{k}-{rng.integers(1 << 40):010x}", f"note {k} of {s} " + "lorem ipsum " * 30, {})
                    for k in range(DOCS)]
            store.add_many(docs, subject=s)
        store.close()
    return config, subjects


def store_config(backend: str) -> dict:
    return {"pgvector": {"backend": "pgvector", "data_dir": "stores/pgvector/pgdata", "table": "bench"},
            "chroma": {"backend": "chroma", "path": "stores/chroma", "collection": "bench"},
            "faiss": {"backend": "faiss", "path": "stores/faiss"},
            "qdrant": {"backend": "qdrant", "path": "stores/qdrant", "collection": "bench"}}[backend]


def writer(backend: str, path: str, tomb, embedder, name: str = "bench", wrapped: bool = True) -> Callable:
    """A function ``write(ids, texts, subject)`` for one backend: through the wrapper, or raw."""
    if backend == "chroma":
        import chromadb

        from tombstone_adapters.chroma import TombstoneCollection

        col = chromadb.PersistentClient(path=path).get_or_create_collection(name, metadata=CHROMA_META,
                                                                            embedding_function=None)
        if not wrapped:
            return lambda ids, texts, subject: col.add(ids=ids, embeddings=embedder(texts), documents=texts)
        w = TombstoneCollection(col, lineage=tomb.lineage, store=backend, embedder=embedder)
        return lambda ids, texts, subject: w.add(ids=ids, documents=texts, subject=subject)
    if backend == "pgvector":
        import psycopg

        from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

        conn = psycopg.connect(embedded_dsn(tomb.config.stores[backend].options["data_dir"]), autocommit=True)
        table = PgVectorStore(conn, name, dim=DIM, lineage=tomb.lineage if wrapped else None, store=backend,
                              embedder=embedder)
        if not wrapped:
            return lambda ids, texts, subject: table.add(ids, documents=texts)
        return lambda ids, texts, subject: table.add(ids, documents=texts, subject=subject)
    if backend == "faiss":
        from tombstone_adapters.faiss import FaissStore

        store = FaissStore(Path(path) / name if name != "bench" else path, dim=DIM, store=backend,
                           lineage=tomb.lineage if wrapped else None, embedder=embedder)
        if not wrapped:
            return lambda ids, texts, subject: store.add(ids, documents=texts)
        return lambda ids, texts, subject: store.add(ids, documents=texts, subject=subject)
    if backend == "qdrant":
        import uuid

        from qdrant_client import models

        from tombstone_adapters.qdrant import TombstoneQdrant, local_client

        client = local_client(path)
        if not client.collection_exists(name):
            client.create_collection(name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        if not wrapped:
            def raw(ids, texts, subject):
                vecs = embedder(texts)
                client.upsert(name, points=[models.PointStruct(id=str(uuid.uuid5(uuid.NAMESPACE_URL, i)), vector=v.tolist(),
                                                               payload={"document": t, "id": i})
                                            for i, v, t in zip(ids, vecs, texts)])
            return raw
        w = TombstoneQdrant(client, name, lineage=tomb.lineage, store=backend, embedder=embedder)
        return lambda ids, texts, subject: w.upsert(ids, documents=texts, subject=subject)
    raise ValueError(backend)


def vector_build(backend: str, root: Path, subjects: int):
    """A deployment of one vector backend with ``subjects`` subjects of ``DOCS`` chunks, written through the wrapper."""
    from tombstone.capture import HashingEmbedder

    config = init_deployment(root, {backend: store_config(backend)})
    refs = [f"bench-{i:04d}" for i in range(subjects)]
    with Tombstone(config) as tomb:
        write = writer(backend, config.stores[backend].options.get("path", ""), tomb, HashingEmbedder(DIM))
        for i, ref in enumerate(refs):
            write([f"{ref}-chunk-{k}" for k in range(DOCS)], [chunk_text(i, k) for k in range(DOCS)], ref)
    return config, refs


def saga_step_times(backend: str, root: Path, erasures: int = 20) -> dict[str, float]:
    """Median time per saga step over ``erasures`` full single-subject sagas on a store of ``SUBJECTS``
    subjects, from the journal's begin/end stamps."""
    config, refs = vector_build(backend, root, SUBJECTS)
    steps: dict[str, list[float]] = {}
    with Tombstone(config) as tomb:
        for ref in refs[:erasures]:
            receipt, _ = tomb.erase(ref)
            assert receipt["summary"]["VERIFIED"] == DOCS, receipt["summary"]
            begins = {}
            for e in tomb.lineage.journal_entries(receipt["saga_id"]):
                t = datetime.strptime(e["at"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
                if e["phase"] == "begin":
                    begins[e["step"]] = t
                else:
                    steps.setdefault(e["step"], []).append(t - begins[e["step"]])
    return {k: statistics.median(v) for k, v in steps.items()}
