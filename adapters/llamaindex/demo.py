"""``tombstone demo --via llamaindex``: the same deterministic deployment, written the way a LlamaIndex app writes
it. A ``llamaindex`` store is added (the folder LlamaIndex persists its storage to). Each chunk store is filled as
a LlamaIndex index: the subjects' chunks are nodes (the subject in their metadata, ``subject_ref``) run through an
ingestion pipeline whose cache is the storage's, then indexed into a ``TombstoneLlamaVectorStore`` over the
chunk store's wrapper with the docstore keeping the nodes too (``store_nodes_override``); the storage is then
persisted. An erasure of a subject so reaches the chunk store, the docstore, the index store and the ingestion
cache. Stores LlamaIndex has no part in (documents, answers) are written through their own demo hooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tombstone_adapters.langchain.stores import VECTOR_BACKENDS, close_wrapper, open_wrapper

from .adapter import BACKEND

STORE = "llamaindex"
"""The name of the storage store the demo adds."""


def demo_stores(kit: Any) -> dict[str, dict[str, Any]]:
    """The stores this way of writing adds to the demo's: LlamaIndex's persist folder."""
    return {STORE: {"backend": BACKEND, "persist_dir": f"stores/{STORE}"}}


def fill(kit: Any, store: str, backend: str, options: Mapping[str, Any], subjects: Sequence[str]) -> bool:
    """Fill one demo store as a LlamaIndex app; False when LlamaIndex has no part in it. The storage store is
    filled along with the chunk stores (before it, in the demo's order)."""
    if backend == BACKEND:
        return True
    if backend not in VECTOR_BACKENDS:
        return False
    fill_chunks(kit, store, subjects)
    return True


def fill_chunks(kit: Any, store: str, subjects: Sequence[str]) -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.schema import TextNode

    from tombstone_adapters.chroma.hooks import DEMO_METADATA

    from .embeddings import TombstoneLlamaEmbedding
    from .storage import TombstoneLlamaStorage
    from .vectorstore import TombstoneLlamaVectorStore

    wrapper = open_wrapper(kit.tomb, store, embedder=kit.embedder(), dim=kit.embedding_dim,
                           collection_metadata=DEMO_METADATA)
    try:
        vectors = TombstoneLlamaVectorStore(wrapper, tombstone=kit.tomb, subject_key="subject_ref")
        storage = TombstoneLlamaStorage(kit.tomb, STORE, vector_store=vectors, subject_key="subject_ref")
        embed_model = TombstoneLlamaEmbedding(kit.embedder())
        pipeline = IngestionPipeline(transformations=[embed_model], cache=storage.cache)
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            nodes = pipeline.run(nodes=[TextNode(id_=i, text=t, metadata=dict(m)) for i, t, m in zip(ids, texts, metas)])
            VectorStoreIndex(nodes, storage_context=storage.storage_context, embed_model=embed_model,
                             store_nodes_override=True)
            # each chunk was cut from a document: erasing the document reaches the chunk and its copies
            edges = [(doc_store, doc_id, target, chunk_id, relation)
                     for chunk_id, (doc_store, doc_id, relation) in zip(ids, kit.document_sources(ids))
                     for target in (store, STORE)]
            if edges:
                kit.lineage.record_artifacts(ref, [], edges=edges)
        storage.persist()
    finally:
        close_wrapper(wrapper)


__all__ = ["STORE", "demo_stores", "fill"]
