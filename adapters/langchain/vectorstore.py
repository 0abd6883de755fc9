"""``TombstoneVectorStore``: a LangChain ``VectorStore`` over Tombstone's own wrappers.

Change the one line that constructs the vector store and keep the rest of the LangChain app::

    store = TombstoneVectorStore(TombstoneCollection(collection, lineage=tomb.lineage, store="chunks",
                                                     embedder=HashingEmbedder()), tombstone=tomb)
    store.add_documents([Document("Alice asked about order 1182", metadata={"subject": "alice"})])
    retriever = store.as_retriever()

Writes go through the wrapper, which records lineage (whose record, its fingerprint and probe vectors)
before the store is touched; the subject of each record is its metadata's ``subject_key`` (``"subject"``),
else the ``subject=`` argument, else ``default_subject``, else the write is refused. Every read — similarity
search (with scores, with relevance scores, by vector), MMR, ``get_by_ids``, the retriever — goes through
the wrapper's read path, which never returns a suppressed record. ``delete`` is an erasure, not the store's
delete: suppress → reclaim → verify through ``Tombstone.erase_artifacts``, one signed receipt per source
(``tombstone.source-erasure-receipt``). Writing an id that already holds a record erases the old record
the same way first, so an updated document leaves no bytes of its previous version behind.

The async variants run the same code on the calling thread: the lineage db's connection belongs to the
thread that opened it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from tombstone_adapters.caches.attribution import add_sources

from .bindings import Binding, binding_for
from .embeddings import embedder_of, embeddings_of, same_model

SUBJECT_KEY = "subject"
SOURCE_KEY = "source"


class TombstoneVectorStore(VectorStore):
    """A LangChain vector store over a Tombstone wrapper (``TombstoneCollection``, ``FaissStore``,
    ``TombstoneQdrant``, ``PgVectorStore`` or ``TombstonePinecone``; the backend is the wrapper's).

    ``tombstone``: the open deployment whose erasure ``delete`` (and an overwrite) runs; without it they
    raise. ``embedding``: LangChain ``Embeddings`` for queries; give it, or an ``embedder`` on the wrapper,
    not two different models (the other is derived from the one given). ``subject_key``: the metadata key
    naming each record's subject; ``default_subject``: the subject of records that name none (None: such a
    write is refused). ``source_key``: the metadata key naming a record's source, for deletes that no record
    manager names the source of (``TombstoneRecordManager`` does, for ``index()``).
    """

    def __init__(self, wrapper: Any, *, tombstone: Any = None, embedding: Embeddings | None = None,
                 subject_key: str = SUBJECT_KEY, default_subject: str | None = None,
                 source_key: str = SOURCE_KEY) -> None:
        self.binding: Binding = binding_for(wrapper)
        self.wrapper = wrapper
        self.tombstone = tombstone
        if embedding is None and self.binding.embedder is None:
            raise ValueError("give the wrapper an embedder or the vector store an embedding")
        if embedding is not None and self.binding.embedder is not None \
                and not same_model(embedding, self.binding.embedder):
            raise ValueError("the wrapper has an embedder and embedding= names another model: give one of them"
                             " (queries and the probes captured at write time must use the same model)")
        if embedding is not None and self.binding.embedder is None:
            self.binding.embedder = embedder_of(embedding)
        self._embedding = embedding if embedding is not None else embeddings_of(self.binding.embedder)
        self.subject_key = subject_key
        self.default_subject = default_subject
        self.source_key = source_key
        self.record_manager: Any = None
        """Set by ``TombstoneRecordManager``: it names the source of each record an index run deletes."""
        self.receipts: list[tuple[dict[str, Any], Path]] = []
        """The receipts of this store's erasures (deletes and overwrites), oldest first."""

    # -- what the store is ----------------------------------------------------------------------

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    @property
    def store(self) -> str:
        """The store's name in the deployment's config (and in the lineage db)."""
        return self.binding.store

    @property
    def backend(self) -> str:
        return self.binding.backend

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda score: score  # scores are relevance in [0, 1] already (``bindings.relevance``)

    # -- writes ---------------------------------------------------------------------------------

    def _subject_of(self, metadata: dict[str, Any], subject: str | None) -> str:
        named = metadata.get(self.subject_key)
        if named is not None and subject is not None and str(named) != subject:
            raise ValueError(f"a record's metadata names subject {str(named)!r} under {self.subject_key!r},"
                             f" but subject={subject!r} was passed")
        chosen = str(named) if named is not None else subject if subject is not None else self.default_subject
        if not chosen:
            raise ValueError(f"whose record is this? Put the subject in its metadata under {self.subject_key!r},"
                             " pass subject=, or construct the store with default_subject=")
        return chosen

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                  subject: str | None = None, **kwargs: Any) -> list[str]:
        """Add (or overwrite) records; each one's subject from its metadata, ``subject=`` or the default.
        Ids are kept (generated when missing); writing an id that holds a record erases the old one first."""
        if self.binding.lineage is None:
            raise ValueError("this wrapper was opened read-only (no lineage db): it cannot write")
        texts = list(texts)
        metas = [dict(m or {}) for m in metadatas] if metadatas is not None else [{} for _ in texts]
        given = list(ids) if ids is not None else [None] * len(texts)
        if len(metas) != len(texts) or len(given) != len(texts):
            raise ValueError("texts, metadatas and ids differ in length")
        ids_ = [str(i) if i is not None else str(uuid.uuid4()) for i in given]
        if len(set(ids_)) != len(ids_):
            raise ValueError("ids repeat within one write")
        subjects = [self._subject_of(m, subject) for m in metas]
        if not texts:
            return []
        lineage = self.binding.lineage
        existing = []
        for aid, who in zip(ids_, subjects):
            art = lineage.artifact(self.store, aid)
            if art is None:
                continue
            if art.subject_key != lineage.subject_key(who):
                raise ValueError(f"id {aid} in store {self.store} holds another subject's record: an id belongs to"
                                 " one subject for good")
            if art.state == "live":
                existing.append(aid)
        if existing:
            self._erase(existing, why="superseded",
                        what=f"overwritten by a new write of the same id through the LangChain vector store {self.store}")
        for who in dict.fromkeys(subjects):
            mine = [n for n, s in enumerate(subjects) if s == who]
            self.binding.write([ids_[n] for n in mine], [texts[n] for n in mine], [metas[n] for n in mine], who)
        return ids_

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        return self.add_texts(texts, metadatas, ids=ids, **kwargs)

    async def aadd_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        return self.add_documents(documents, **kwargs)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, wrapper: Any = None, **kwargs: Any) -> "TombstoneVectorStore":
        """``wrapper=`` (required) and the constructor's keywords; ``subject=`` applies to every text."""
        if wrapper is None:
            raise ValueError("TombstoneVectorStore.from_texts needs wrapper= (a Tombstone wrapper of the store)")
        subject = kwargs.pop("subject", None)
        store = cls(wrapper, embedding=embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids, subject=subject)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict] | None = None, *,
                          ids: list[str] | None = None, **kwargs: Any) -> "TombstoneVectorStore":
        return cls.from_texts(texts, embedding, metadatas, ids=ids, **kwargs)

    # -- deletes are erasures -------------------------------------------------------------------

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Erase these records (suppress → reclaim → verify), one receipt per source; ids with no record
        are skipped. Returns True once every receipt is written (``self.receipts`` has them)."""
        if ids is None:
            raise ValueError("delete erases the records it is given: pass their ids")
        lineage = self.binding.lineage
        if lineage is None:
            raise ValueError("this wrapper was opened read-only (no lineage db): it cannot erase")
        live = [aid for aid in dict.fromkeys(str(i) for i in ids)
                if (art := lineage.artifact(self.store, aid)) is not None and art.state == "live"]
        if live:
            self._erase(live, why="deleted", what=f"deleted through the LangChain vector store {self.store}")
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        return self.delete(ids, **kwargs)

    def _sources(self, ids: list[str]) -> dict[str, str | None]:
        """Each record's source: what the record manager recorded, else its metadata's ``source_key``."""
        known: dict[str, str | None] = {}
        if self.record_manager is not None:
            known = {k: v for k, v in self.record_manager.sources_of(ids).items() if v is not None}
        missing = [i for i in ids if i not in known]
        if missing:
            for doc in self.binding.get(missing):
                value = doc.metadata.get(self.source_key)
                if value is not None:
                    known[str(doc.id)] = str(value)
        return {i: known.get(i) for i in ids}

    def _erase(self, ids: list[str], *, why: str, what: str) -> None:
        if self.tombstone is None:
            raise ValueError("erasing needs the deployment: construct the store with tombstone=Tombstone(...)")
        groups: dict[str, list[str]] = {}
        for aid, source in self._sources(ids).items():
            reference = f"source:{source}" if source is not None else f"ids:{self.store}"
            groups.setdefault(reference, []).append(aid)
        for reference, members in groups.items():
            statement = (f"{len(members)} record(s) of {reference} {what}; an indexing cleanup deletes this way the"
                         " records of a source that its latest run no longer produced")
            self.receipts.append(self.tombstone.erase_artifacts(
                reference, [(self.store, aid) for aid in members], statement=statement, why=why))

    # -- reads (the wrapper's read paths: suppressed records never come back) --------------------

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        ids = [str(i) for i in ids]
        if not ids:
            return []
        found = {doc.id: doc for doc in self.binding.get(ids)}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return self.get_by_ids(ids)

    def _query_vector(self, query: str) -> np.ndarray:
        return np.asarray(self._embedding.embed_query(query), dtype=np.float32)

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4,
                                               filter: dict[str, Any] | None = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """(document, relevance in [0, 1], higher is closer). ``filter``: metadata key → value equality."""
        return [(h.document, h.relevance)
                for h in self.binding.search(np.asarray(embedding, dtype=np.float32), k, filter)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        return self.similarity_search_with_score_by_vector(self._query_vector(query).tolist(), k, filter)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None,
                                    **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter)]

    def similarity_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                          **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter)]

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict[str, Any] | None = None,
                                                **kwargs: Any) -> list[Document]:
        query = np.asarray(embedding, dtype=np.float32)
        hits = [h for h in self.binding.search(query, max(fetch_k, k), filter, with_vectors=True)
                if h.vector is not None]
        if not hits:
            return []
        chosen = maximal_marginal_relevance(query, [h.vector for h in hits], lambda_mult=lambda_mult, k=k)
        return [hits[i].document for i in chosen]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict[str, Any] | None = None, **kwargs: Any) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(self._query_vector(query).tolist(), k, fetch_k,
                                                            lambda_mult, filter)

    async def asimilarity_search_with_score(self, *args: Any, **kwargs: Any) -> list[tuple[Document, float]]:
        return self.similarity_search_with_score(*args, **kwargs)

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return self.similarity_search_by_vector(embedding, k, **kwargs)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return self.similarity_search(query, k, **kwargs)

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        return self.max_marginal_relevance_search(query, k, fetch_k, lambda_mult, **kwargs)

    async def amax_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                       lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(embedding, k, fetch_k, lambda_mult, **kwargs)

    def as_retriever(self, **kwargs: Any) -> "TombstoneRetriever":
        """A retriever whose results also become the sources of an answer cached inside ``attribution(...)``:
        erasing a retrieved record then erases the cached answers built from it."""
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return TombstoneRetriever(vectorstore=self, tags=tags, **kwargs)


class TombstoneRetriever(VectorStoreRetriever):
    """``VectorStoreRetriever`` that adds what it retrieved to the attribution in force
    (``tombstone_adapters.caches.attribution``), so the cache records the answer as built from it."""

    def _note(self, docs: list[Document]) -> list[Document]:
        store = self.vectorstore.store  # type: ignore[attr-defined]
        add_sources([(store, doc.id) for doc in docs if doc.id])
        return docs

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        return self._note(super()._get_relevant_documents(query, run_manager=run_manager, **kwargs))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        return self._note(await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs))


__all__ = ["SOURCE_KEY", "SUBJECT_KEY", "TombstoneRetriever", "TombstoneVectorStore"]
