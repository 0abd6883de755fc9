"""``langchain_core.indexing.index()`` with TombstoneRecordManager: cleanups are erasures, one receipt per
source, and an updated document's old chunks leave no bytes behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.indexing import aindex, index

from tombstone.keys import load_private_key
from tombstone.receipt import SOURCE_RECEIPT_KIND, verify
from tombstone_adapters.langchain import TombstoneRecordManager, TombstoneVectorStore

from langchain_backends import BACKENDS, Services, deployment, files_holding

OLD = "Alice Marchetti lives at 12 Elm Street and prefers morning deliveries to the side door"
NEW = "Alice Marchetti moved to 99 Oak Avenue and prefers evening deliveries to the front desk"
STEADY = "Alice Marchetti pays by invoice at the end of each month with reference AM-2231"
OTHER = "Bob Okafor asked for his invoices to be sent to the billing office in Leeds"


def doc(text: str, source: str, subject: str) -> Document:
    return Document(text, metadata={"source": source, "subject": subject})


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    shared = Services(tmp_path_factory.mktemp("services"))
    yield shared
    shared.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_cleanups_erase_with_a_receipt_per_source(backend, tmp_path, services):
    with deployment(tmp_path / "deploy", backend, services) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        records = TombstoneRecordManager(f"{backend}/kb", store)
        public = load_private_key(tomb.config.keys_dir).public_key()

        def run(docs, cleanup):
            return index(docs, records, store, cleanup=cleanup, source_id_key="source",
                         key_encoder=records.key_encoder)

        first = run([doc(OLD, "crm/alice.md", "alice"), doc(STEADY, "crm/alice.md", "alice"),
                     doc(OTHER, "crm/bob.md", "bob")], "incremental")
        assert (first["num_added"], first["num_deleted"]) == (3, 0)
        [old_id] = [d.id for d in store.similarity_search(OLD, k=1)]
        assert store.receipts == []

        # Alice's record changes: the next run writes the new chunk and erases the old one.
        second = run([doc(NEW, "crm/alice.md", "alice"), doc(STEADY, "crm/alice.md", "alice")], "incremental")
        assert (second["num_added"], second["num_skipped"], second["num_deleted"]) == (1, 1, 1)
        [(receipt, path)] = store.receipts
        verify(receipt, public)
        assert receipt["kind"] == SOURCE_RECEIPT_KIND and receipt["subject"] == "source:crm/alice.md"
        assert "crm/alice.md" in receipt["statement"] and path.is_file()
        [entry] = receipt["artifacts"]
        assert entry["artifact_id"] == old_id and entry["evidence"]["scope"] == "deleted"
        if backend == "pinecone":
            assert entry["status"] == "UNVERIFIED" and "managed" in entry["reason"]
        else:
            assert (entry["status"], entry["level"]) == ("VERIFIED", "physical")
        texts = [d.page_content for d in store.similarity_search(OLD, k=10)]
        assert OLD not in texts and NEW in texts and STEADY in texts and OTHER in texts
        assert store.get_by_ids([old_id]) == []
        if backend in ("chroma", "faiss", "qdrant"):
            chunk_dir = Path(tomb.config.stores["chunks"].options["path"])
            assert files_holding(chunk_dir, b"12 Elm Street") == []
            assert files_holding(chunk_dir, b"99 Oak Avenue") != []  # the control

        # A full cleanup with only Bob's document left: Alice's source goes, one receipt for it.
        third = run([doc(OTHER, "crm/bob.md", "bob")], "full")
        assert (third["num_skipped"], third["num_deleted"]) == (1, 2)
        assert [r["subject"] for r, _ in store.receipts] == ["source:crm/alice.md", "source:crm/alice.md"]
        verify(store.receipts[-1][0], public)
        assert len(store.receipts[-1][0]["artifacts"]) == 2
        assert [d.page_content for d in store.similarity_search(NEW, k=10)] == [OTHER]
        assert records.list_keys() == [d.id for d in store.similarity_search(OTHER, k=1)]


def test_record_manager_rows_and_sources(tmp_path, services):
    """The record manager's own contract, on the lineage db: exists, list_keys filters, sources, delete."""
    with deployment(tmp_path / "deploy", "faiss", services) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        records = TombstoneRecordManager("kb", store)
        other = TombstoneRecordManager("other-namespace", TombstoneVectorStore(wrapper, tombstone=tomb))
        t0 = records.get_time()
        records.update(["k1", "k2"], group_ids=["crm/alice.md", None], time_at_least=t0)
        t1 = records.get_time()
        records.update(["k3"], group_ids=["crm/bob.md"])
        other.update(["k1"], group_ids=["elsewhere"])
        assert records.exists(["k1", "k3", "nope"]) == [True, True, False]
        assert records.list_keys(before=t1) == ["k1", "k2"]
        assert records.list_keys(after=t1) == ["k3"]
        assert records.list_keys(group_ids=["crm/alice.md", "crm/bob.md"]) == ["k1", "k3"]
        assert records.list_keys(limit=1) == ["k1"]
        assert records.sources_of(["k1", "k2", "nope"]) == {"k1": "crm/alice.md", "k2": None}
        assert other.sources_of(["k1"]) == {"k1": "elsewhere"}
        with pytest.raises(ValueError, match="future"):
            records.update(["k4"], time_at_least=records.get_time() + 3600)
        records.delete_keys(["k1"])
        assert records.exists(["k1"]) == [False] and other.exists(["k1"]) == [True]
        # sources are kept keyed and sealed, never in the clear
        raw = Path(tomb.config.lineage_db).read_bytes() + b"".join(
            p.read_bytes() for p in Path(tomb.config.lineage_db).parent.glob("lineage.db-wal"))
        assert b"crm/alice.md" not in raw and b"crm/bob.md" not in raw
        assert records.key_encoder(Document("x", metadata={"a": 1})) == records.key_encoder(Document("x", metadata={"a": 1}))
        assert records.key_encoder(Document("x")) != records.key_encoder(Document("y"))


def test_aindex_runs_the_same_erasure(tmp_path, services):
    with deployment(tmp_path / "deploy", "chroma", services) as (tomb, wrapper):
        store = TombstoneVectorStore(wrapper, tombstone=tomb)
        records = TombstoneRecordManager("kb", store)

        async def run(docs):
            return await aindex(docs, records, store, cleanup="incremental", source_id_key="source",
                                key_encoder=records.key_encoder)

        asyncio.run(run([doc(OLD, "crm/alice.md", "alice")]))
        result = asyncio.run(run([doc(NEW, "crm/alice.md", "alice")]))
        assert (result["num_added"], result["num_deleted"]) == (1, 1)
        [(receipt, _)] = store.receipts
        assert receipt["subject"] == "source:crm/alice.md"
        assert [d.page_content for d in store.similarity_search(OLD, k=5)] == [NEW]
