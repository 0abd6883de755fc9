"""Open the Tombstone wrapper of a configured vector store, from the deployment's config alone.

For ``tombstone demo --via langchain`` and for apps that keep their store settings in ``tombstone.toml``:
``open_wrapper(tomb, "chunks", embedder=...)`` builds the same wrapper the store's own demo writes through
(creating the collection, index or table when it is missing), ready for ``TombstoneVectorStore``.
"""

from __future__ import annotations

import os
from typing import Any

VECTOR_BACKENDS = ("chroma", "faiss", "qdrant", "pgvector", "pinecone", "sqlitevec", "lancedb")


def open_wrapper(tomb: Any, store: str, *, embedder: Any, dim: int,
                 collection_metadata: dict[str, Any] | None = None) -> Any:
    """The wrapper of configured store ``store`` (one of ``VECTOR_BACKENDS``), writing lineage to ``tomb``'s
    lineage db. A new collection, index or table gets ``dim`` dimensions and cosine distance (FAISS: L2;
    a new Chroma collection gets ``collection_metadata``, default cosine space). Close it with
    :func:`close_wrapper`."""
    cfg = tomb.config.stores[store]
    options, lineage = cfg.options, tomb.lineage
    if cfg.backend == "chroma":
        from tombstone_adapters.chroma import TombstoneCollection
        from tombstone_adapters.chroma.wrapper import persistent_client

        client = persistent_client(options["path"])
        collection = client.get_or_create_collection(options.get("collection", "rag-chunks"),
                                                     metadata=collection_metadata or {"hnsw:space": "cosine"},
                                                     embedding_function=None)
        return TombstoneCollection(collection, lineage=lineage, store=store, embedder=embedder)
    if cfg.backend == "faiss":
        from tombstone_adapters.faiss import FaissStore

        return FaissStore(options["path"], dim=dim, lineage=lineage, store=store, embedder=embedder)
    if cfg.backend == "qdrant":
        from qdrant_client import models

        from tombstone_adapters.qdrant import TombstoneQdrant, local_client

        client = local_client(options["path"])
        name = options.get("collection", "rag-chunks")
        if not client.collection_exists(name):
            client.create_collection(name, vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE))
        return TombstoneQdrant(client, name, lineage=lineage, store=store, embedder=embedder)
    if cfg.backend == "pgvector":
        import psycopg

        from tombstone_adapters.pgvector.server import dsn_from
        from tombstone_adapters.pgvector.store import PgVectorStore

        conn = psycopg.connect(dsn_from(options, store), autocommit=True)
        columns = {role: options[f"{role}_column"] for role in ("id", "document", "metadata", "embedding")
                   if options.get(f"{role}_column")}
        return PgVectorStore(conn, options["table"], schema=options.get("schema"), dim=dim, columns=columns or None,
                             distance=options.get("distance", "cosine"), lineage=lineage, store=store,
                             embedder=embedder)
    if cfg.backend == "pinecone":
        from pinecone import Pinecone

        from tombstone_adapters.pinecone import TombstonePinecone

        key = os.environ.get(str(options.get("api_key_env", "PINECONE_API_KEY")))
        if not key:
            raise ValueError(f"store {store!r}: set ${options.get('api_key_env', 'PINECONE_API_KEY')}")
        index = Pinecone(api_key=key).Index(host=options["host"])
        return TombstonePinecone(index, namespace=options.get("namespace", ""), lineage=lineage, store=store,
                                 embedder=embedder)
    if cfg.backend == "sqlitevec":
        from tombstone_adapters.sqlitevec import VecStore

        return VecStore(options["path"], table=options.get("table", "chunks"), dim=dim, lineage=lineage, store=store,
                        embedder=embedder)
    if cfg.backend == "lancedb":
        import lancedb
        import pyarrow as pa

        from tombstone_adapters.lancedb import TombstoneLanceTable
        from tombstone_adapters.lancedb.store import table_names

        db = lancedb.connect(str(options["path"]))
        if options["table"] not in table_names(db):
            db.create_table(options["table"], schema=pa.schema([("id", pa.string()), ("text", pa.string()),
                                                                ("vector", pa.list_(pa.float32(), dim)),
                                                                ("metadata", pa.string())]))
        return TombstoneLanceTable(db, options["table"], lineage=lineage, store=store, embedder=embedder)
    raise ValueError(f"store {store!r} is a {cfg.backend} store; the LangChain vector store serves"
                     f" {', '.join(VECTOR_BACKENDS)}")


def close_wrapper(wrapper: Any) -> None:
    """Release what :func:`open_wrapper` opened for the wrapper (a PostgreSQL connection)."""
    conn = getattr(wrapper, "conn", None)
    if conn is not None and hasattr(conn, "close"):
        conn.close()
    if type(wrapper).__name__ == "VecStore":
        wrapper.close()


__all__ = ["VECTOR_BACKENDS", "close_wrapper", "open_wrapper"]
