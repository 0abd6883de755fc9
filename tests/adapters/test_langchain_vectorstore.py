"""TombstoneVectorStore beyond the standard suite: suppressed records on every read path, whose records
are written for whom, overwrites as erasures, the embedding rules."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

from tombstone.capture import HashingEmbedder
from tombstone_adapters.langchain import TombstoneEmbeddings, TombstoneVectorStore

from langchain_backends import BACKENDS, DIM, Services, deployment

ALICE = "Alice Marchetti asked why order 88213 was refunded to her card"
BOB = "Bob Okafor asked why order 55120 was delivered to the wrong address"
CAROL = "Carol Nguyen asked why order 77341 was charged twice this month"


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    shared = Services(tmp_path_factory.mktemp("services"))
    yield shared
    shared.close()


def ingest(store: TombstoneVectorStore) -> None:
    store.add_documents([Document(ALICE, id="alice-chunk-0001", metadata={"subject": "alice", "n": 1}),
                         Document(BOB, id="bob-chunk-0001", metadata={"subject": "bob", "n": 2}),
                         Document(CAROL, id="carol-chunk-0001", metadata={"subject": "carol", "n": 3})])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_suppressed_record_never_comes_back_on_any_read_path(backend, tmp_path, services):
    with deployment(tmp_path / "deploy", backend, services) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        ingest(store)
        query = "why was order 88213 refunded"
        assert store.similarity_search(query, k=1)[0].id == "alice-chunk-0001"
        scored = store.similarity_search_with_relevance_scores(query, k=3)
        assert all(0.0 <= score <= 1.0 for _, score in scored) and scored[0][1] >= scored[-1][1]
        assert [d.id for d in store.similarity_search(query, k=3, filter={"subject": "bob"})] == ["bob-chunk-0001"]
        assert store.get_by_ids(["alice-chunk-0001"])[0].metadata == {"subject": "alice", "n": 1}

        # The erasure's first step, alone (as if it were interrupted right after it): the durable suppression
        # record, then the store's hide. Hidden, not yet gone.
        art = tomb.lineage.artifact("chunks", "alice-chunk-0001")
        tomb.lineage.record_suppressions("an-interrupted-saga", [art])
        tomb.adapter("chunks").suppress([art])

        vector = store.embeddings.embed_query(query)
        retriever = store.as_retriever(search_kwargs={"k": 3})
        paths = {
            "similarity_search": store.similarity_search(query, k=3),
            "with_score": [d for d, _ in store.similarity_search_with_score(query, k=3)],
            "with_relevance_scores": [d for d, _ in store.similarity_search_with_relevance_scores(query, k=3)],
            "by_vector": store.similarity_search_by_vector(vector, k=3),
            "mmr": store.max_marginal_relevance_search(query, k=3, fetch_k=3),
            "mmr_by_vector": store.max_marginal_relevance_search_by_vector(vector, k=3, fetch_k=3),
            "filter": store.similarity_search(query, k=3, filter={"subject": "alice"}),
            "get_by_ids": store.get_by_ids(["alice-chunk-0001", "bob-chunk-0001"]),
            "retriever": retriever.invoke(query),
            "mmr_retriever": store.as_retriever(search_type="mmr", search_kwargs={"k": 3}).invoke(query),
            "threshold_retriever": store.as_retriever(search_type="similarity_score_threshold",
                                                      search_kwargs={"k": 3, "score_threshold": 0.0}).invoke(query),
            "async_search": asyncio.run(store.asimilarity_search(query, k=3)),
            "async_mmr": asyncio.run(store.amax_marginal_relevance_search(query, k=3, fetch_k=3)),
            "async_get_by_ids": asyncio.run(store.aget_by_ids(["alice-chunk-0001"])),
            "async_retriever": asyncio.run(retriever.ainvoke(query)),
        }
        for name, docs in paths.items():
            assert all(d.id != "alice-chunk-0001" and "Alice" not in d.page_content for d in docs), name
        assert {d.id for d in paths["similarity_search"]} == {"bob-chunk-0001", "carol-chunk-0001"}


def test_whose_record_is_written(tmp_path, services):
    with deployment(tmp_path / "deploy", "chroma", services) as (tomb, wrapper):
        lineage = tomb.lineage
        strict = TombstoneVectorStore(wrapper, tombstone=tomb)
        with pytest.raises(ValueError, match="whose record"):
            strict.add_texts(["no one's text"])
        with pytest.raises(ValueError, match="names subject 'bob'"):
            strict.add_texts([BOB], [{"subject": "bob"}], subject="alice")
        strict.add_texts([ALICE], ids=["alice-chunk-0001"], subject="alice")
        strict.add_texts([BOB], [{"owner": "bob"}], ids=["bob-chunk-0001"], subject="bob")
        keyed = TombstoneVectorStore(wrapper, tombstone=tomb, subject_key="owner", default_subject="shared-kb")
        keyed.add_texts([CAROL, "A note for everyone"], [{"owner": "carol"}, {}], ids=["carol-chunk-0001", "shared-0001"])
        owners = {aid: lineage.artifact("chunks", aid).subject_key for aid in
                  ("alice-chunk-0001", "bob-chunk-0001", "carol-chunk-0001", "shared-0001")}
        assert owners == {"alice-chunk-0001": lineage.subject_key("alice"), "bob-chunk-0001": lineage.subject_key("bob"),
                          "carol-chunk-0001": lineage.subject_key("carol"), "shared-0001": lineage.subject_key("shared-kb")}
        # An id belongs to one subject: another subject's write to it is refused before anything changes.
        with pytest.raises(ValueError, match="another subject"):
            strict.add_texts(["Mallory's text"], ids=["alice-chunk-0001"], subject="mallory")
        assert strict.get_by_ids(["alice-chunk-0001"])[0].page_content == ALICE and strict.receipts == []


def test_an_overwrite_erases_the_old_record_first(tmp_path, services):
    with deployment(tmp_path / "deploy", "chroma", services) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        store.add_texts([ALICE], [{"source": "crm/alice.md"}], ids=["alice-chunk-0001"], subject="alice")
        chunk_dir = Path(tomb.config.stores["chunks"].options["path"])
        vector = wrapper.embedder.embed([ALICE])[0].astype("<f4")
        old_bytes = {"text": b"88213", "vector": vector.tobytes(),
                     "unit vector": (vector / np.linalg.norm(vector)).astype("<f4").tobytes()}

        def holding(what: str, files) -> list[Path]:
            return [p for p in files if p.is_file() and old_bytes[what] in p.read_bytes()]

        documents = lambda: sorted(chunk_dir.glob("chroma.sqlite3*"))  # noqa: E731 - where Chroma keeps text
        # the control: before the overwrite the old text and the old vector are on disk
        assert holding("text", documents()) and holding("vector", chunk_dir.rglob("*"))
        store.add_texts(["Alice Marchetti's order was refunded in full"], [{"source": "crm/alice.md"}],
                        ids=["alice-chunk-0001"], subject="alice")
        [(receipt, _)] = store.receipts
        assert receipt["subject"] == "source:crm/alice.md" and "overwritten" in receipt["statement"]
        [entry] = receipt["artifacts"]
        assert (entry["artifact_id"], entry["evidence"]["scope"], entry["status"]) == (
            "alice-chunk-0001", "superseded", "VERIFIED")
        assert [d.page_content for d in store.get_by_ids(["alice-chunk-0001"])] == [
            "Alice Marchetti's order was refunded in full"]
        # Gone from the files that hold documents, and the vector (both forms) gone from every file. Not
        # asserted: a 5-byte text fragment absent from the HNSW placeholders, whose length.bin Chroma fills
        # with uninitialised process memory (verification-levels.md, Chroma).
        assert not holding("text", documents())
        assert not holding("vector", chunk_dir.rglob("*")) and not holding("unit vector", chunk_dir.rglob("*"))
        # deleted by id, with no source: the receipt says so
        store.add_texts([BOB], ids=["bob-chunk-0001"], subject="bob")
        assert store.delete(["bob-chunk-0001", "never-written"]) is True
        assert store.receipts[-1][0]["subject"] == "ids:chunks"
        assert [a["artifact_id"] for a in store.receipts[-1][0]["artifacts"]] == ["bob-chunk-0001"]


def test_embedding_and_erasure_rules(tmp_path, services):
    with deployment(tmp_path / "deploy", "faiss", services) as (tomb, wrapper):
        with pytest.raises(ValueError, match="give one of them"):
            TombstoneVectorStore(wrapper, tombstone=tomb, embedding=DeterministicFakeEmbedding(size=DIM))
        same = TombstoneVectorStore(wrapper, tombstone=tomb, embedding=TombstoneEmbeddings(wrapper.embedder))
        assert same.embeddings.embedder is wrapper.embedder
        wrapper.embedder = None
        fake = DeterministicFakeEmbedding(size=DIM)
        store = TombstoneVectorStore(wrapper, tombstone=tomb, embedding=fake)
        assert store.embeddings is fake
        store.add_texts([ALICE], ids=["alice-chunk-0001"], subject="alice")  # captured with the fake model
        assert tomb.lineage.probes_for("chunks", "alice-chunk-0001")
        assert store.similarity_search(ALICE, k=1)[0].id == "alice-chunk-0001"
        with pytest.raises(ValueError, match="pass their ids"):
            store.delete()
        with pytest.raises(ValueError, match="tombstone="):
            TombstoneVectorStore(wrapper, embedding=fake).delete(["alice-chunk-0001"])
        with pytest.raises(TypeError, match="not a Tombstone vector wrapper"):
            TombstoneVectorStore(object(), embedding=TombstoneEmbeddings(HashingEmbedder(DIM)))
        with pytest.raises(ValueError, match="wrapper="):
            TombstoneVectorStore.from_texts(["x"], fake)
