"""A small RAG chain over each backend, through LangChain: ingest, answer (cached), erase a subject, and show
that neither retrieval nor either cache returns the subject's text again, and that the receipt verifies."""

from __future__ import annotations

from pathlib import Path

import chromadb
import pytest
from langchain_core.documents import Document
from langchain_core.globals import get_llm_cache, set_llm_cache
from langchain_core.language_models import FakeListLLM
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough

from tombstone.capture import HashingEmbedder
from tombstone.keys import load_private_key
from tombstone.receipt import RECEIPT_KIND, verify
from tombstone_adapters.caches import TombstoneSemanticCache, TombstoneSQLiteCache, attribution
from tombstone_adapters.langchain import TombstoneVectorStore

from langchain_backends import BACKENDS, DIM, Services, deployment, files_holding

ALICE = "Alice Marchetti asked on Tuesday why order 88213 was refunded to the card ending 4471"
BOB = "Bob Okafor moved his delivery for parcel 55120 to the Friday morning slot"
CAROL = "Carol Nguyen renewed the warranty of her dishwasher until next spring"
QUESTION = "Why was order 88213 refunded?"
ANSWER = "Because Alice Marchetti asked on Tuesday: order 88213 was refunded to the card ending 4471."
AFTER = "I have no record of that order."
PROMPT = PromptTemplate.from_template("Answer from the context.\nContext: {context}\nQuestion: {question}")


class RagLLM(FakeListLLM):
    """FakeListLLM whose cache key (its LLM string) names the model, not the canned responses."""

    @property
    def _identifying_params(self) -> dict:
        return {"model": "fake-rag-llm"}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    shared = Services(tmp_path_factory.mktemp("services"))
    yield shared
    shared.close()


@pytest.fixture
def no_global_cache():
    before = get_llm_cache()
    yield
    set_llm_cache(before)


def ingest(store: TombstoneVectorStore) -> None:
    store.add_documents([
        Document(ALICE, id="alice-chunk-0001", metadata={"subject": "alice", "source": "tickets/alice.md"}),
        Document(BOB, id="bob-chunk-0001", metadata={"subject": "bob", "source": "tickets/bob.md"}),
        Document(CAROL, id="carol-chunk-0001", metadata={"subject": "carol", "source": "tickets/carol.md"}),
    ])


def chain_of(store: TombstoneVectorStore, llm):
    def context(docs: list[Document]) -> str:
        return "\n".join(doc.page_content for doc in docs)

    retriever = store.as_retriever(search_kwargs={"k": 1})
    return {"context": retriever | context, "question": RunnablePassthrough()} | PROMPT | llm | StrOutputParser()


def caches(tomb):
    exact = TombstoneSQLiteCache(tomb.config.stores["llm_cache"].options["path"], lineage=tomb.lineage,
                                 store="llm_cache")
    options = tomb.config.stores["semantic"].options
    collection = chromadb.PersistentClient(path=str(options["path"])).get_or_create_collection(
        options["collection"], metadata={"hnsw:space": "cosine"}, embedding_function=None)
    semantic = TombstoneSemanticCache(collection, lineage=tomb.lineage, store="semantic", embedder=HashingEmbedder(DIM))
    return exact, semantic


@pytest.mark.parametrize("backend", BACKENDS)
def test_rag_chain_forgets_an_erased_subject(backend, tmp_path, services, no_global_cache):
    with deployment(tmp_path / "deploy", backend, services, caches=True) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        ingest(store)
        exact, semantic = caches(tomb)
        set_llm_cache(exact)  # the exact cache, globally, as any LangChain app sets it
        llm = RagLLM(responses=[ANSWER, AFTER])
        llm_semantic = RagLLM(responses=[ANSWER, AFTER], cache=semantic)
        # The support agent asks; the retriever finds Alice's chunk; both answers are cached as built from it.
        with attribution("support-agent-7"):
            assert chain_of(store, llm).invoke(QUESTION) == ANSWER
            assert chain_of(store, llm).invoke(QUESTION) == ANSWER  # from the cache: the LLM ran once
            assert chain_of(store, llm_semantic).invoke(QUESTION) == ANSWER
            assert chain_of(store, llm_semantic).invoke(QUESTION) == ANSWER
        assert llm.i == 1 and llm_semantic.i == 1
        assert [d.id for d in store.similarity_search(QUESTION, k=1)] == ["alice-chunk-0001"]

        receipt, path = tomb.erase("alice")

        verify(receipt, load_private_key(tomb.config.keys_dir).public_key())
        assert receipt["kind"] == RECEIPT_KIND and path.is_file()
        by_store = {a["store"]: a for a in receipt["artifacts"]}
        assert set(by_store) == {"chunks", "llm_cache", "semantic"}
        assert by_store["llm_cache"]["evidence"]["scope"] == "answer_built_from from chunks/alice-chunk-0001"
        for name in ("llm_cache", "semantic"):
            assert (by_store[name]["status"], by_store[name]["level"]) == ("VERIFIED", "physical")
        if backend == "pinecone":  # a managed store's ceiling: a passing logical probe, never VERIFIED
            assert by_store["chunks"]["status"] == "UNVERIFIED" and "managed" in by_store["chunks"]["reason"]
        else:
            assert (by_store["chunks"]["status"], by_store["chunks"]["level"]) == ("VERIFIED", "physical")

        # Retrieval: no search, MMR, id lookup or retriever returns her text.
        everything = store.similarity_search(QUESTION, k=10) + store.max_marginal_relevance_search(QUESTION, k=10)
        assert everything and all("Alice" not in d.page_content for d in everything)
        assert store.get_by_ids(["alice-chunk-0001"]) == []
        assert store.get_by_ids(["bob-chunk-0001"])[0].page_content == BOB
        # The caches: the same question reaches the LLM again, and gets the answer without her.
        with attribution("support-agent-7"):
            assert chain_of(store, llm).invoke(QUESTION) == AFTER
            assert chain_of(store, llm_semantic).invoke(QUESTION) == AFTER
        for directory in (Path(tomb.config.stores["llm_cache"].options["path"]).parent,
                          Path(tomb.config.stores["semantic"].options["path"])):
            assert files_holding(directory, ANSWER.encode()) == []
            assert files_holding(directory, b"Alice Marchetti") == []
        if backend in ("chroma", "faiss", "qdrant"):
            chunk_dir = Path(tomb.config.stores["chunks"].options["path"])
            assert files_holding(chunk_dir, b"Alice Marchetti") == []
            assert files_holding(chunk_dir, BOB.encode()) != []  # the control: survivors are still there


def test_async_chain_caches_and_forgets(tmp_path, services, no_global_cache):
    """ainvoke: the retriever, the cache lookups and updates run on the calling thread (the lineage db's)."""
    import asyncio

    with deployment(tmp_path / "deploy", "chroma", services, caches=True) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        ingest(store)
        exact, _ = caches(tomb)
        set_llm_cache(exact)
        llm = RagLLM(responses=[ANSWER, AFTER])

        async def ask() -> str:
            with attribution("support-agent-7"):
                return await chain_of(store, llm).ainvoke(QUESTION)

        assert asyncio.run(ask()) == ANSWER and asyncio.run(ask()) == ANSWER and llm.i == 1
        receipt, _ = tomb.erase("alice")
        assert {a["store"] for a in receipt["artifacts"]} == {"chunks", "llm_cache"}
        assert asyncio.run(ask()) == AFTER
