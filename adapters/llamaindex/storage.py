"""``TombstoneLlamaStorage``: a LlamaIndex app's storage (docstore, index store, vector store) and ingestion cache
on a configured ``llamaindex`` store — the folder they are persisted to — with every node they take in recorded.

LlamaIndex keeps copies of a node outside the vector store: the docstore holds it whole, text included (with
``store_nodes_override``, or for a vector store that keeps no text), the index store lists its id, and an
ingestion pipeline's cache holds each transformation's output nodes, whole. Through these helpers each node is
recorded in the lineage db before it is stored (its subject from its metadata, ``subject`` by default; a node
without one is refused), reads leave out what an erasure has suppressed or erased, and ``persist`` writes the
folder and then removes from it every node an erasure has taken (an app that persists what it held in memory
never writes an erased node back)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.ingestion import IngestionCache
from llama_index.core.ingestion.cache import SimpleCache
from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.storage.docstore import SimpleDocumentStore
from llama_index.core.storage.index_store import SimpleIndexStore

from tombstone.capture.writes import check_write
from tombstone.lineage.records import ArtifactRecord
from tombstone.storelock import StoreLock, lock_file_for

from . import jsonfiles
from .adapter import BACKEND, NODE, suppressed_ids

CACHE_FILE = "pipeline/llama_cache"
"""Where ``TombstoneLlamaStorage.persist`` writes the ingestion cache, inside the store's folder."""


class _Owner:
    """The lineage side shared by the docstore and the cache: recording, and which ids are no longer live."""

    def __init__(self, tombstone: Any, store: str, subject_key: str, folder: Path) -> None:
        self.tombstone, self.store, self.subject_key, self.folder = tombstone, store, subject_key, folder
        self.lineage = tombstone.lineage

    def record(self, nodes: Sequence[BaseNode]) -> None:
        groups: dict[str, list[ArtifactRecord]] = {}
        for node in nodes:
            subject = (node.metadata or {}).get(self.subject_key)
            if not isinstance(subject, str) or not subject:
                raise ValueError(f"node {node.node_id} has no {self.subject_key!r} in its metadata: whose data it"
                                 " is must be known when it is stored, or no erasure could find it")
            text = node.get_content(metadata_mode=MetadataMode.NONE)
            groups.setdefault(subject, []).append(ArtifactRecord(
                store=self.store, artifact_id=node.node_id, backend=BACKEND, kind=NODE,
                content_hash=hashlib.sha256(text.encode("utf-8")).hexdigest()))
        check_write(self.lineage, self.store, list(groups))
        for subject, records in groups.items():
            self.lineage.record_artifacts(subject, records)

    def gone(self, ids: Iterable[str]) -> set[str]:
        """The ids an erasure has suppressed or taken: listed suppressed in the folder, or no longer live."""
        ids = list(dict.fromkeys(ids))
        found = self.lineage.artifacts_many([(self.store, i) for i in ids])
        return ({aid for (_, aid), art in found.items() if art.state != "live"}
                | (suppressed_ids(self.folder) & set(ids)))


class TombstoneLlamaDocstore(SimpleDocumentStore):
    """LlamaIndex's simple docstore whose writes record each node and whose reads leave erased ones out."""

    owner: _Owner

    def add_documents(self, docs: Sequence[BaseNode], allow_update: bool = True, batch_size: int | None = None,
                      store_text: bool = True) -> None:
        self.owner.record(docs)
        super().add_documents(docs, allow_update=allow_update, batch_size=batch_size, store_text=store_text)

    def get_document(self, doc_id: str, raise_error: bool = True) -> BaseNode | None:
        if self.owner.gone([doc_id]):
            if raise_error:
                raise ValueError(f"doc_id {doc_id} not found.")
            return None
        return super().get_document(doc_id, raise_error=raise_error)

    @property
    def docs(self) -> dict[str, BaseNode]:
        everything = super().docs
        gone = self.owner.gone(everything)
        return {k: v for k, v in everything.items() if k not in gone}

    def document_exists(self, doc_id: str) -> bool:
        return super().document_exists(doc_id) and not self.owner.gone([doc_id])


class TombstoneIngestionCache(IngestionCache):
    """An ingestion pipeline's cache whose entries record their nodes; an entry holding an erased node is a miss."""

    _owner: Any = PrivateAttr(default=None)

    def put(self, key: str, nodes: Sequence[BaseNode], collection: str | None = None) -> None:
        self._owner.record(nodes)
        super().put(key, nodes, collection=collection)

    def get(self, key: str, collection: str | None = None) -> Sequence[BaseNode] | None:
        nodes = super().get(key, collection=collection)
        if nodes is not None and self._owner.gone(n.node_id for n in nodes):
            return None
        return nodes


class TombstoneLlamaStorage:
    """The LlamaIndex storage of the configured ``llamaindex`` store ``store`` of the open deployment.

    ``storage_context`` (hand it to an index, with ``vector_store`` if one is given: a ``TombstoneLlamaVectorStore``
    keeps its own lineage) and ``cache`` (hand it to an ``IngestionPipeline``) are loaded from the store's folder
    where it holds them. ``persist()`` writes both there, under the store's lock."""

    def __init__(self, tombstone: Any, store: str, *, vector_store: Any = None, subject_key: str = "subject") -> None:
        spec = tombstone.config.stores.get(store)
        if spec is None or spec.backend != BACKEND:
            raise ValueError(f"no store {store!r} of the {BACKEND} backend in the deployment's config")
        self.folder = Path(spec.options["persist_dir"])
        self.owner = _Owner(tombstone, store, subject_key, self.folder)
        docstore_file, index_file = self.folder / "docstore.json", self.folder / "index_store.json"
        docstore = (TombstoneLlamaDocstore.from_persist_path(str(docstore_file)) if docstore_file.is_file()
                    else TombstoneLlamaDocstore())
        docstore.owner = self.owner
        index_store = (SimpleIndexStore.from_persist_path(str(index_file)) if index_file.is_file()
                       else SimpleIndexStore())
        kwargs: dict[str, Any] = {"docstore": docstore, "index_store": index_store}
        if vector_store is not None:
            kwargs["vector_store"] = vector_store
        elif (self.folder / "default__vector_store.json").is_file():
            from llama_index.core.vector_stores import SimpleVectorStore

            kwargs["vector_store"] = SimpleVectorStore.from_persist_dir(str(self.folder))
        self.storage_context = StorageContext.from_defaults(**kwargs)
        cache_file = self.folder / CACHE_FILE
        simple = SimpleCache.from_persist_path(str(cache_file)) if cache_file.is_file() else SimpleCache()
        self.cache = TombstoneIngestionCache(cache=simple)
        self.cache._owner = self.owner

    @property
    def docstore(self) -> TombstoneLlamaDocstore:
        return self.storage_context.docstore

    def persist(self) -> dict[str, int]:
        """Write the storage and the cache to the folder, then remove from its JSON every node an erasure has
        taken (the app's memory still held it); returns what was removed per file."""
        with StoreLock(lock_file_for(self.folder), store=self.owner.store):
            self.storage_context.persist(persist_dir=str(self.folder))
            self.cache.persist(str(self.folder / CACHE_FILE))
            gone = self.owner.gone(self._ids())
            if not gone:
                return {}
            return jsonfiles.scrub(self.folder, jsonfiles.Matcher(gone, {}, None))

    def _ids(self) -> set[str]:
        ids = set(SimpleDocumentStore.docs.fget(self.docstore))
        for struct in self.storage_context.index_store.index_structs():
            ids |= set(getattr(struct, "nodes_dict", {}) or {})
        for collection in self.cache.cache.to_dict().values() if hasattr(self.cache.cache, "to_dict") else ():
            for entry in (collection or {}).values():
                ids |= {n.get("__data__", {}).get("id_") for n in entry.get("nodes", []) if isinstance(n, dict)}
        return {i for i in ids if isinstance(i, str)}


__all__ = ["CACHE_FILE", "TombstoneIngestionCache", "TombstoneLlamaDocstore", "TombstoneLlamaStorage"]
