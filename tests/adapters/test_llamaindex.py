"""``TombstoneLlamaVectorStore`` on the real stores (embedded Chroma, FAISS files, Qdrant local mode): LlamaIndex's
vector-store behaviours (add, query, filters, get_nodes, delete by source document, delete_nodes), a
``VectorStoreIndex`` built and queried through it, and an erasure that ends VERIFIED(physical) with an
independent byte scan of the store's files agreeing."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (FilterOperator, MetadataFilter, MetadataFilters,  # noqa: E402
                                                  VectorStoreQuery)

from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.capture.vector import embed  # noqa: E402
from tombstone_adapters.llamaindex import TombstoneLlamaEmbedding, TombstoneLlamaVectorStore  # noqa: E402

from langchain_backends import DIM, Services, deployment, files_holding  # noqa: E402

BACKENDS = ("chroma", "faiss", "qdrant")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    s = Services(tmp_path_factory.mktemp("services"))
    yield s
    s.close()


def node(node_id: str, text: str, subject: str, source: str, **metadata) -> TextNode:
    n = TextNode(id_=node_id, text=text, metadata={"subject": subject, **metadata},
                 embedding=embed(HashingEmbedder(DIM), [text])[0].tolist())
    n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=source)
    return n


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_query_filters_get_and_delete_by_source(tmp_path, services, backend):
    with deployment(tmp_path / "d", backend, services) as (tomb, wrapper):
        store = TombstoneLlamaVectorStore(wrapper, tombstone=tomb)
        nodes = [node("alice-n1", "alice asked about her refund for order 1182", "alice", "doc-a", kind="ticket"),
                 node("alice-n2", "alice changed her delivery address to the new flat", "alice", "doc-a", kind="note"),
                 node("bob-n1", "bob booked a repair visit for his boiler on friday", "bob", "doc-b", kind="ticket")]
        assert store.add(nodes) == ["alice-n1", "alice-n2", "bob-n1"]
        with pytest.raises(ValueError, match="no 'subject'"):
            store.add([TextNode(id_="orphan", text="whose is this", embedding=[0.1] * DIM)])
        query = VectorStoreQuery(query_embedding=nodes[0].embedding, similarity_top_k=2)
        found = store.query(query)
        assert found.ids[0] == "alice-n1" and len(found.ids) == 2 and 0 <= found.similarities[0] <= 1
        assert found.nodes[0].get_content() == nodes[0].text
        only = MetadataFilters(filters=[MetadataFilter(key="kind", value="ticket", operator=FilterOperator.EQ)])
        tickets = store.query(VectorStoreQuery(query_embedding=nodes[0].embedding, similarity_top_k=3, filters=only))
        assert set(tickets.ids) == {"alice-n1", "bob-n1"}
        assert {n.node_id for n in store.get_nodes(["alice-n2", "bob-n1"])} == {"alice-n2", "bob-n1"}
        # delete by source document: exactly its nodes, erased with a receipt
        store.delete("doc-a")
        [(receipt, path)] = store.receipts
        assert path.is_file() and {a["artifact_id"] for a in receipt["artifacts"]} == {"alice-n1", "alice-n2"}
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        after = store.query(VectorStoreQuery(query_embedding=nodes[0].embedding, similarity_top_k=3))
        assert after.ids == ["bob-n1"]
        assert not store.get_nodes(["alice-n1", "alice-n2"])
        folder = tmp_path / "d" / "stores"
        assert not files_holding(folder, b"alice-n1") and not files_holding(folder, b"alice-n2")
        assert files_holding(folder, b"bob-n1")  # the control: the byte scan finds what is still stored
        store.delete_nodes(["bob-n1"])
        assert store.receipts[-1][0]["artifacts"][0]["status"] == "VERIFIED"
        assert not files_holding(folder, b"bob-n1")
        with pytest.raises(NotImplementedError):
            store.clear()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_vector_store_index_builds_and_queries_through_it_and_the_subject_is_erased(tmp_path, services, backend):
    with deployment(tmp_path / "d", backend, services) as (tomb, wrapper):
        store = TombstoneLlamaVectorStore(wrapper, tombstone=tomb)
        embed_model = TombstoneLlamaEmbedding(HashingEmbedder(DIM))
        docs = [Document(text="carol asked to close her savings account next month", doc_id="doc-c",
                         metadata={"subject": "carol"}),
                Document(text="dave reported a broken window in flat 4", doc_id="doc-d", metadata={"subject": "dave"})]
        index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                                embed_model=embed_model)
        hits = index.as_retriever(similarity_top_k=1).retrieve("close savings account")
        assert hits and hits[0].node.metadata["subject"] == "carol"
        receipt, _ = tomb.erase("carol")
        assert receipt["artifacts"] and {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        hits = index.as_retriever(similarity_top_k=2).retrieve("close savings account")
        assert [h.node.metadata["subject"] for h in hits] == ["dave"]
        assert not files_holding(tmp_path / "d" / "stores", b"carol asked to close")


def test_the_readme_example_runs_as_written(tmp_path):
    from langchain_backends import release

    from support import run_readme_example

    namespace = run_readme_example('doc_id="ticket-88"', tmp_path, lambda: release("chroma"))
    assert namespace["receipt"]["summary"]["VERIFIED"] == 1 and namespace["path"].is_file()
