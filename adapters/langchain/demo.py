"""``tombstone demo --via langchain``: the same deterministic deployment, written the way a LangChain app
writes it. Chunk stores are filled through ``TombstoneVectorStore.add_documents`` (the subject named in each
chunk's metadata, ``subject_ref``); each cached answer comes from a small RAG chain — the subject's chunks
retrieved through ``as_retriever``, a prompt, a fake LLM that gives the demo's deterministic answer — with
the cache plugged in as LangChain's LLM cache, inside ``attribution(subject)``. Documents (the docstore)
have no LangChain part and are written through their wrapper as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .stores import VECTOR_BACKENDS, close_wrapper, open_wrapper

CACHE_BACKENDS = ("exact_cache", "semantic_cache")
PROMPT = "Answer from the context.\nContext: {context}\nQuestion: {question}"


def fill(kit: Any, store: str, backend: str, options: Mapping[str, Any], subjects: Sequence[str]) -> bool:
    """Fill one demo store through LangChain; False when LangChain has no part in it (the caller then
    fills it through the store's own demo hook)."""
    if backend in VECTOR_BACKENDS:
        fill_chunks(kit, store, subjects)
        return True
    if backend in CACHE_BACKENDS:
        fill_answers(kit, store, backend, options, subjects)
        return True
    return False


def _vector_store(kit: Any, store: str) -> tuple[Any, Any]:
    from tombstone_adapters.chroma.hooks import DEMO_METADATA

    from .vectorstore import TombstoneVectorStore

    wrapper = open_wrapper(kit.tomb, store, embedder=kit.embedder(), dim=kit.embedding_dim,
                           collection_metadata=DEMO_METADATA)
    return TombstoneVectorStore(wrapper, tombstone=kit.tomb, subject_key="subject_ref"), wrapper


def fill_chunks(kit: Any, store: str, subjects: Sequence[str]) -> None:
    from langchain_core.documents import Document

    vectors, wrapper = _vector_store(kit, store)
    try:
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            vectors.add_documents([Document(text, id=i, metadata=meta) for i, text, meta in zip(ids, texts, metas)])
            # each chunk was cut from a document: erasing the document reaches the chunk
            edges = [(doc_store, doc_id, store, chunk_id, relation)
                     for chunk_id, (doc_store, doc_id, relation) in zip(ids, kit.document_sources(ids))]
            if edges:
                kit.lineage.record_artifacts(ref, [], edges=edges)
    finally:
        close_wrapper(wrapper)


def _cache(kit: Any, store: str, backend: str, options: Mapping[str, Any]) -> Any:
    if backend == "exact_cache":
        from tombstone_adapters.caches import TombstoneSQLiteCache

        return TombstoneSQLiteCache(options["path"], lineage=kit.lineage, store=store)
    from tombstone_adapters.caches import TombstoneSemanticCache
    from tombstone_adapters.chroma.hooks import DEMO_METADATA
    from tombstone_adapters.chroma.wrapper import persistent_client

    collection = persistent_client(options["path"]).get_or_create_collection(
        options.get("collection", "answers"), metadata=DEMO_METADATA, embedding_function=None)
    return TombstoneSemanticCache(collection, lineage=kit.lineage, store=store, embedder=kit.embedder())


def fill_answers(kit: Any, store: str, backend: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
    from langchain_core.language_models import FakeListLLM
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    from tombstone_adapters.caches import attribution

    class DemoLLM(FakeListLLM):
        """The demo's deterministic LLM; its cache key names the model, not its canned answers."""

        @property
        def _identifying_params(self) -> dict[str, Any]:
            return {"model": kit.llm}

    cache = _cache(kit, store, backend, options)
    chunk_stores = [s for s in kit.stores_with_role("chunks") if kit.tomb.config.stores[s].backend in VECTOR_BACKENDS]
    vectors, wrapper = _vector_store(kit, chunk_stores[0]) if chunk_stores else (None, None)
    try:
        for ref in subjects:
            question, generations, chunk_ids = kit.answer(ref)
            if vectors is not None:  # the subject's own chunks: a retriever filtered to them
                retriever = vectors.as_retriever(search_kwargs={"k": 1, "filter": {"subject_ref": ref}})
                context = retriever | RunnableLambda(lambda docs: "\n".join(d.page_content for d in docs))
            else:
                context = RunnableLambda(lambda _: "")
            llm = DemoLLM(responses=[generations[0].text], cache=cache)
            chain = ({"context": context, "question": RunnablePassthrough()} | PromptTemplate.from_template(PROMPT)
                     | llm | StrOutputParser())
            # The answer is built from the chunks the demo quotes, and from whatever the retriever returned.
            with attribution(ref, kit.answer_sources(chunk_ids)):
                chain.invoke(question)
    finally:
        if wrapper is not None:
            close_wrapper(wrapper)
        if backend == "exact_cache":
            cache.engine.dispose()


__all__ = ["CACHE_BACKENDS", "fill", "fill_answers", "fill_chunks"]
