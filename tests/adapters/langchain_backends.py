"""Deployments on each vector backend for the LangChain tests: real stores (embedded Chroma, FAISS files,
Qdrant local mode, sqlite-vec, a local LanceDB table, the embedded PostgreSQL with pgvector, the Pinecone emulator driven by the real SDK)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone_adapters.langchain.stores import close_wrapper, open_wrapper

BACKENDS = ("chroma", "faiss", "qdrant", "pgvector", "pinecone", "sqlitevec", "lancedb")
DIM = 64


class Services:
    """The servers some backends need, started on first use and shared by a test module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dsn: str | None = None
        self._emulator: Any = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            from tombstone_adapters.pgvector.server import embedded_dsn

            self._dsn = os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(self.root / "pg")
        return self._dsn

    @property
    def emulator(self) -> Any:
        if self._emulator is None:
            from tombstone_adapters.pinecone import PineconeEmulator

            self._emulator = PineconeEmulator(DIM).start()
            os.environ.setdefault("PINECONE_API_KEY", "emulator-key")
        return self._emulator

    def close(self) -> None:
        if self._emulator is not None:
            self._emulator.stop()


def chunk_store(backend: str, services: Services) -> dict[str, Any]:
    """The config of a fresh chunk store on ``backend``."""
    tag = uuid.uuid4().hex[:10]
    return {
        "chroma": lambda: {"backend": "chroma", "path": "stores/chunks", "collection": "kb-chunks"},
        "faiss": lambda: {"backend": "faiss", "path": "stores/faiss"},
        "qdrant": lambda: {"backend": "qdrant", "path": "stores/qdrant", "collection": "kb-chunks"},
        "pgvector": lambda: {"backend": "pgvector", "dsn": services.dsn, "table": f"kb_{tag}"},
        "sqlitevec": lambda: {"backend": "sqlitevec", "path": "stores/vec/chunks.db", "table": "kb_chunks"},
        "lancedb": lambda: {"backend": "lancedb", "path": "stores/lance", "table": "kb_chunks"},
        "pinecone": lambda: {"backend": "pinecone", "host": services.emulator.host, "namespace": f"kb-{tag}",
                             "allow_insecure_host": True, "wait_seconds": 2.0},
    }[backend]()


@contextlib.contextmanager
def deployment(root: Path, backend: str, services: Services, *, caches: bool = False,
               extra: dict[str, dict[str, Any]] | None = None) -> Iterator[tuple[Tombstone, Any]]:
    """An open deployment with a ``chunks`` store on ``backend`` (and, with ``caches``, an exact cache
    ``llm_cache`` and a semantic cache ``semantic``; ``extra``: more stores), and the chunk store's wrapper."""
    stores = {"chunks": chunk_store(backend, services), **(extra or {})}
    if caches:
        stores["llm_cache"] = {"backend": "exact_cache", "path": "stores/llm_cache.db"}
        stores["semantic"] = {"backend": "semantic_cache", "path": "stores/semantic", "collection": "answers"}
    config = init_deployment(root, stores)
    with Tombstone(config) as tomb:
        wrapper = open_wrapper(tomb, "chunks", embedder=HashingEmbedder(DIM), dim=DIM)
        try:
            yield tomb, wrapper
        finally:
            close_wrapper(wrapper)
            release(backend)


def release(backend: str) -> None:
    """Drop what this process keeps of a store between tests (Chroma's systems, Qdrant's local clients)."""
    if backend == "qdrant":
        from tombstone_adapters.qdrant import close_local_clients

        close_local_clients()
    import chromadb

    chromadb.api.client.SharedSystemClient.clear_system_cache()


HNSW_BUFFERS = ("data_level0.bin", "link_lists.bin", "length.bin")
"""hnswlib allocates these buffers without zeroing them and writes them whole: an element's unused link slots
(and, for a segment Chroma has not persisted yet, every slot of ``length.bin``, written again by each client
that loads the segment — a wrapper reopening after an in-place reclaim is one) hold whatever the writing
process's memory held there before. In a test that process still holds the erased
text (it is the test's own constant), so it can surface there whether or not the record was ever stored.
Tombstone's physical probe looks for ids and vectors, not text."""


def files_holding(directory: Path, needle: bytes) -> list[str]:
    """An independent byte scan of a store's files (no Tombstone code), HNSW buffers aside."""
    return sorted(str(p) for p in directory.rglob("*")
                  if p.is_file() and p.name not in HNSW_BUFFERS and needle in p.read_bytes())
