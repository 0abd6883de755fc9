"""``TombstoneLlamaVectorStore``: LlamaIndex's vector store over a Tombstone wrapper (Chroma, FAISS, Qdrant, pgvector,
sqlite-vec, LanceDB), so that a LlamaIndex app's nodes get lineage when they are written, are hidden from every
query from the moment an erasure records them, and are erased with a receipt when LlamaIndex deletes them.

Each node's subject is read from its metadata (``subject_key``, default ``subject``): a node without one is
refused, as a wrapper refuses a write without ``subject=``. The nodes of a source document (``ref_doc_id``) are
recorded in the lineage db's index records (namespace ``llamaindex/<store>``), so ``delete(ref_doc_id)`` erases
exactly them: one receipt per source, like the LangChain store's cleanups. Node text and metadata are stored by
the wrapper; the node's embedding, when LlamaIndex computed one, is stored as given.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, FilterOperator, MetadataFilters,
                                                  VectorStoreQuery, VectorStoreQueryResult)

from tombstone_adapters.langchain.bindings import binding_for

REF_DOC_KEY = "ref_doc_id"


def _equalities(filters: MetadataFilters | None) -> dict[str, Any]:
    """LlamaIndex's filters as key -> value equalities (the only kind every wrapper applies in the store)."""
    if filters is None:
        return {}
    out = {}
    for item in filters.filters:
        if isinstance(item, MetadataFilters) or item.operator != FilterOperator.EQ:
            raise NotImplementedError("TombstoneLlamaVectorStore applies equality filters (key == value) only")
        out[item.key] = item.value
    if out and str(getattr(filters.condition, "value", filters.condition)).lower() == "or" and len(out) > 1:
        raise NotImplementedError("TombstoneLlamaVectorStore applies AND of equality filters only")
    return out


class TombstoneLlamaVectorStore(BasePydanticVectorStore):
    """LlamaIndex's ``BasePydanticVectorStore`` over a Tombstone wrapper; pass ``tombstone`` (the open deployment)
    to erase on ``delete`` and ``delete_nodes``."""

    stores_text: bool = True
    flat_metadata: bool = True
    subject_key: str = "subject"

    _binding: Any = PrivateAttr()
    _tombstone: Any = PrivateAttr()
    _receipts: list = PrivateAttr(default_factory=list)

    def __init__(self, wrapper: Any, *, tombstone: Any = None, subject_key: str = "subject") -> None:
        super().__init__(subject_key=subject_key)
        self._binding = binding_for(wrapper)
        self._tombstone = tombstone
        self._receipts = []

    @property
    def client(self) -> Any:
        return self._binding.wrapper

    @property
    def receipts(self) -> list:
        """(receipt, path) of every erasure this store ran."""
        return self._receipts

    @property
    def _namespace(self) -> str:
        return f"llamaindex/{self._binding.store}"

    # -- writes ---------------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        groups: dict[str, list[BaseNode]] = {}
        for node in nodes:
            subject = (node.metadata or {}).get(self.subject_key)
            if not isinstance(subject, str) or not subject:
                raise ValueError(f"node {node.node_id} has no {self.subject_key!r} in its metadata: whose data it is"
                                 " must be known when it is written, or no erasure could find it")
            groups.setdefault(subject, []).append(node)
        for subject, group in groups.items():
            ids = [n.node_id for n in group]
            texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in group]
            metadatas = [{**(n.metadata or {}), **({REF_DOC_KEY: n.ref_doc_id} if n.ref_doc_id else {})} for n in group]
            embedded = all(n.embedding is not None for n in group)
            vectors = np.asarray([n.embedding for n in group], dtype=np.float32) if embedded else None
            self._binding.write(ids, texts, metadatas, subject, vectors)
            refs = [(n.node_id, n.ref_doc_id) for n in group if n.ref_doc_id]
            if refs and self._binding.lineage is not None:
                self._binding.lineage.index_update(self._namespace, [k for k, _ in refs], [r for _, r in refs],
                                                   time.time())
        return [n.node_id for n in nodes]

    # -- reads (the wrapper's: suppressed nodes never come back) ------------------------------------

    @staticmethod
    def _node(doc: Any) -> TextNode:
        return TextNode(id_=str(doc.id), text=doc.page_content, metadata=dict(doc.metadata))

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        if query.query_embedding is not None:
            vector = np.asarray(query.query_embedding, dtype=np.float32)
        elif query.query_str is not None and self._binding.embedder is not None:
            from tombstone.capture.vector import embed

            vector = embed(self._binding.embedder, [query.query_str])[0]
        else:
            raise ValueError("a query needs query_embedding (or query_str and a wrapper with an embedder)")
        where = _equalities(query.filters)
        k = query.similarity_top_k
        wanted_nodes = set(query.node_ids or [])
        wanted_docs = set(query.doc_ids or [])
        fetch = k if not (wanted_nodes or wanted_docs) else max(4 * k, 40)
        hits = [h for h in self._binding.search(vector, fetch, where or None)
                if (not wanted_nodes or str(h.document.id) in wanted_nodes)
                and (not wanted_docs or h.document.metadata.get(REF_DOC_KEY) in wanted_docs)][:k]
        return VectorStoreQueryResult(nodes=[self._node(h.document) for h in hits],
                                      similarities=[h.relevance for h in hits], ids=[str(h.document.id) for h in hits])

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                  **kwargs: Any) -> list[BaseNode]:
        if not node_ids:
            raise NotImplementedError("get_nodes needs node_ids: the wrappers read records by id")
        where = _equalities(filters)
        return [self._node(d) for d in self._binding.get(node_ids)
                if all(d.metadata.get(key) == value for key, value in where.items())]

    # -- erasure ---------------------------------------------------------------------------------

    def _erase(self, reference: str, ids: list[str], why: str) -> None:
        if self._tombstone is None:
            raise ValueError("erasing needs the deployment: construct the store with tombstone=Tombstone(...)")
        lineage = self._binding.lineage
        # the node in this store, and its copies in the deployment's LlamaIndex storage folders (docstore,
        # index store, ingestion cache: TombstoneLlamaStorage records them under the same node id)
        stores = [self._binding.store] + [name for name, spec in self._tombstone.config.stores.items()
                                          if spec.backend == "llamaindex"]
        found = lineage.artifacts_many([(store, aid) for store in stores for aid in dict.fromkeys(ids)])
        live = [key for key, art in found.items() if art.state == "live"]
        if live:
            nodes = len({aid for _, aid in live})
            statement = f"{nodes} node(s) of {reference} deleted through the LlamaIndex vector store"
            self._receipts.append(self._tombstone.erase_artifacts(reference, live, statement=statement, why=why))

    def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
        """Erase every node of the source document ``ref_doc_id`` (suppress, reclaim, verify; one receipt)."""
        ids = self._binding.lineage.index_keys(self._namespace, before=None, after=None, groups=[str(ref_doc_id)],
                                               limit=None)
        self._erase(f"source:{ref_doc_id}", ids, why="deleted")
        self._binding.lineage.index_delete(self._namespace, ids)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **kwargs: Any) -> None:
        if not node_ids:
            raise NotImplementedError("delete_nodes needs node_ids")
        self._erase(f"ids:{self._binding.store}", [str(i) for i in node_ids], why="deleted")
        self._binding.lineage.index_delete(self._namespace, [str(i) for i in node_ids])

    def clear(self, **kwargs: Any) -> None:
        raise NotImplementedError("clear would erase every subject of the store: erase them by subject with"
                                  " 'tombstone erase', or delete each source with delete(ref_doc_id)")


__all__ = ["TombstoneLlamaVectorStore"]
