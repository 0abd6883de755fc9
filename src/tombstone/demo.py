"""``tombstone demo``: a small, deterministic RAG deployment built through the wrappers.

The same arguments always give the same subjects, ids, texts and vectors, so two demo runs can be
compared byte for byte (apart from times, saga ids and signatures).
"""

from __future__ import annotations

import random
import shutil
import sys
import uuid
from pathlib import Path

from tombstone.api import Tombstone, init_deployment
from tombstone.config import CONFIG_NAME
from tombstone.errors import ConfigError

MARKER = ".tombstone-demo"
DEMO_BACKENDS = ("chroma", "docstore")
DEFAULT_BACKENDS = "chroma,docstore"
CHROMA_COLLECTION = "rag-chunks"
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
    if subjects < 1 or subjects > 10_000:
        raise ConfigError("--subjects must be between 1 and 10000")
    _prepare(workdir, force)
    stores = {}
    if "chroma" in backends:
        stores["vectors"] = {"backend": "chroma", "path": "stores/vectors", "collection": CHROMA_COLLECTION,
                             "id_key": "chunk_id"}
    if "docstore" in backends:
        stores["docs"] = {"backend": "docstore", "path": "stores/docs/docstore.db"}
    config = init_deployment(workdir, stores)
    refs = [subject_name(i) for i in range(1, subjects + 1)]
    with Tombstone(config) as tomb:
        if "chroma" in backends:
            _fill_chroma(tomb, config.stores["vectors"].options["path"], refs)
        if "docstore" in backends:
            from tombstone_adapters.docstore import DocStore

            docs = DocStore(config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
            try:
                for ref in refs:
                    docs.add_many(demo_documents(ref), subject=ref)
            finally:
                docs.close()
    assert (workdir / CONFIG_NAME).exists()
    return refs


def _fill_chroma(tomb: Tombstone, path: str, refs: list[str]) -> None:
    import chromadb

    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.chroma import TombstoneCollection

    client = chromadb.PersistentClient(path=path)
    collection = client.create_collection(CHROMA_COLLECTION, metadata=CHROMA_METADATA, embedding_function=None)
    chunks = TombstoneCollection(collection, lineage=tomb.lineage, store="vectors",
                                 embedder=HashingEmbedder(EMBEDDING_DIM))
    for ref in refs:
        docs = demo_documents(ref)
        ids = [f"{doc_id}#chunk-0" for doc_id, _, _ in docs]
        chunks.add(ids=ids, documents=[t for _, t, _ in docs],
                   metadatas=[{**m, "chunk_id": i} for i, (_, _, m) in zip(ids, docs)], subject=ref)
