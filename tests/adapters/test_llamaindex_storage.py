"""LlamaIndex's own copies of a node, for real: a docstore and index store persisted as JSON, and an ingestion
pipeline's cache, kept through ``TombstoneLlamaStorage`` on a ``llamaindex`` store. The conformance suite, the
control (LlamaIndex's own delete leaves the node in the ingestion cache), erasures by subject and through the
vector store's ``delete(ref_doc_id)`` that end VERIFIED(physical) with the persisted JSON and the cache clean,
copies by content whatever their name, and a persist after an erasure that does not write the node back."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import shutil
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex, load_index_from_storage  # noqa: E402
from llama_index.core.ingestion import IngestionPipeline  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.schema import TextNode  # noqa: E402

from tombstone import Tombstone, init_deployment  # noqa: E402
from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.testing import AdapterConformance, ConformanceEnv  # noqa: E402
from tombstone_adapters.llamaindex import (LlamaStorageAdapter, TombstoneLlamaEmbedding,  # noqa: E402
                                           TombstoneLlamaStorage, TombstoneLlamaVectorStore)

from langchain_backends import DIM, Services, deployment  # noqa: E402
from support import FrozenClock  # noqa: E402


def independent_scan(directory: Path, needle: bytes) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


@pytest.fixture
def ltomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"li": {"backend": "llamaindex", "persist_dir": "stores/li"}})
    Path(config.stores["li"].options["persist_dir"]).mkdir(parents=True)
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb


def folder(tomb) -> Path:
    return Path(tomb.config.stores["li"].options["persist_dir"])


def nodes_of(subject: str, n: int, start: int = 0) -> list[TextNode]:
    return [TextNode(id_=f"{subject}-node-{start + i:04d}", text=f"{subject} private note {start + i}: card ending"
                     f" {4000 + start + i}", metadata={"subject": subject}) for i in range(n)]


class TestLlamaStorageConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, ltomb):
        counter = iter(range(10_000))
        adapter = LlamaStorageAdapter("li", ltomb.config.stores["li"].options)
        adapter.content_key = ltomb.secret.content_key

        def write_arts(subject: str, n: int):
            storage = TombstoneLlamaStorage(ltomb, "li")
            nodes = nodes_of(subject, n, start=100 * next(counter))
            storage.docstore.add_documents(nodes)
            storage.cache.put(f"run-{nodes[0].node_id}", nodes)  # a pipeline's cache entry of the same nodes
            storage.persist()
            return [ltomb.lineage.artifact("li", node.node_id) for node in nodes]

        def survivors():
            data = json.loads((folder(ltomb) / "docstore.json").read_text())
            return {k: v["__data__"]["text"] for k, v in data["docstore/data"].items()}

        def visible(ids):
            docstore = TombstoneLlamaStorage(ltomb, "li").docstore
            return {i for i in ids if docstore.get_document(i, raise_error=False) is not None} | \
                   (set(docstore.docs) & set(ids))

        @contextlib.contextmanager
        def vendor_failure():
            broken = OSError(errno.EIO, "injected: Input/output error")
            with mock.patch("tombstone_adapters.llamaindex.jsonfiles.json_files", side_effect=broken), \
                    mock.patch("tombstone_adapters.llamaindex.adapter.write_atomic", side_effect=broken), \
                    mock.patch.object(adapter, "physical_files", side_effect=broken):
                yield

        # LlamaIndex's own delete leaves the cache entry, which a pipeline's next run reads
        return ConformanceEnv(adapter=adapter, write=write_arts, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure, native_delete_hides=False)


def build_app(tomb, embed=True) -> tuple[TombstoneLlamaStorage, list]:
    """An ingestion pipeline with a cache, then an index whose docstore keeps the nodes, all persisted."""
    storage = TombstoneLlamaStorage(tomb, "li")
    docs = [Document(text="Alice asked for a refund on order 1182. She lives at 3 Oak Road.", doc_id="doc-alice",
                     metadata={"subject": "alice"}),
            Document(text="Bob booked a boiler repair for Friday morning.", doc_id="doc-bob",
                     metadata={"subject": "bob"})]
    embed_model = TombstoneLlamaEmbedding(HashingEmbedder(DIM))
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(chunk_size=64, chunk_overlap=0), embed_model],
                                 cache=storage.cache)
    nodes = pipeline.run(documents=docs)
    VectorStoreIndex(nodes, storage_context=storage.storage_context, embed_model=embed_model,
                     store_nodes_override=True)
    storage.persist()
    return storage, nodes


def test_llamaindexs_own_delete_leaves_the_node_in_the_ingestion_cache_and_the_erasure_removes_it(ltomb):
    """The control: LlamaIndex's ``delete_ref_doc`` takes the node out of the docstore and the index, but its
    ingestion cache keeps it whole, where the probes and an independent scan find it. Erasing the subject
    rewrites every file: VERIFIED(physical), the scan finds nothing, Bob's node stays."""
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    [bob] = [n.node_id for n in nodes if n.metadata["subject"] == "bob"]
    assert set(independent_scan(folder(ltomb), alice.encode())) == {
        "docstore.json", "index_store.json", "default__vector_store.json", "pipeline/llama_cache"}
    index = load_index_from_storage(storage.storage_context,
                                    embed_model=TombstoneLlamaEmbedding(HashingEmbedder(DIM)))
    index.delete_ref_doc("doc-alice", delete_from_docstore=True)  # LlamaIndex's own delete
    storage.storage_context.persist(persist_dir=str(folder(ltomb)))  # and its own persist
    assert independent_scan(folder(ltomb), b"3 Oak Road") == ["pipeline/llama_cache"]
    adapter = LlamaStorageAdapter("li", ltomb.config.stores["li"].options)
    adapter.content_key = ltomb.secret.content_key
    [result] = adapter.probe_logical([ltomb.lineage.artifact("li", alice)]).values()
    assert not result.passed and result.evidence["returned_by"] == ["pipeline/llama_cache"]

    receipt, _ = ltomb.erase("alice")
    assert {(a["artifact_id"], a["status"], a["level"]) for a in receipt["artifacts"]} == {(alice, "VERIFIED",
                                                                                            "physical")}
    assert independent_scan(folder(ltomb), alice.encode()) == []
    assert independent_scan(folder(ltomb), b"Oak Road") == []
    # Bob's node stays in the docstore, the index and the vector store; the cache entries that held Alice's node
    # (one pipeline run over both documents) are gone whole: a later run recomputes them
    assert set(independent_scan(folder(ltomb), bob.encode())) == {"docstore.json", "index_store.json",
                                                                   "default__vector_store.json"}
    assert json.loads((folder(ltomb) / "pipeline/llama_cache").read_text())["llama_cache"] == {}


def test_a_persist_after_an_erasure_does_not_write_the_node_back(ltomb):
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    receipt, _ = ltomb.erase("alice")  # the app still holds the node in memory
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert storage.docstore.get_document(alice, raise_error=False) is None  # hidden from the app's reads
    assert alice not in storage.docstore.docs
    removed = storage.persist()  # writes what it held in memory, then takes the erased node out again
    assert removed and independent_scan(folder(ltomb), alice.encode()) == []
    assert independent_scan(folder(ltomb), b"Oak Road") == []


def test_a_copy_is_recognised_by_its_content_whatever_its_name(ltomb):
    """A ``.bak`` of the docstore, a renamed copy of the cache in a sub-folder and a gzip copy of the docstore
    under another name are JSON too: each rewritten without the node (the gzip one with gzip again)."""
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    shutil.copy(folder(ltomb) / "docstore.json", folder(ltomb) / "docstore.json.bak")
    (folder(ltomb) / "old").mkdir()
    shutil.copy(folder(ltomb) / "pipeline" / "llama_cache", folder(ltomb) / "old" / "cache-2026.dat")
    (folder(ltomb) / "old" / "ds.1").write_bytes(gzip.compress((folder(ltomb) / "docstore.json").read_bytes()))
    assert len(independent_scan(folder(ltomb), b"3 Oak Road")) == 4  # the gzip copy hides it from a plain scan
    assert b"3 Oak Road" in gzip.decompress((folder(ltomb) / "old" / "ds.1").read_bytes())
    receipt, _ = ltomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert independent_scan(folder(ltomb), b"Oak Road") == [] and independent_scan(folder(ltomb), alice.encode()) == []
    assert json.loads((folder(ltomb) / "docstore.json.bak").read_text())["docstore/data"]  # Bob's node kept
    kept = json.loads(gzip.decompress((folder(ltomb) / "old" / "ds.1").read_bytes()))["docstore/data"]
    assert kept and alice not in kept and b"Oak Road" not in gzip.decompress((folder(ltomb) / "old" / "ds.1").read_bytes())


def test_a_compressed_copy_it_cannot_scrub_is_found_and_one_it_cannot_open_is_unchecked(ltomb):
    """A gzip copy that is not JSON (a text export) still holds the id: found in the inflated bytes, RESIDUAL.
    A zstd file cannot be opened here: the node found nowhere else is UNVERIFIED, never VERIFIED."""
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    (folder(ltomb) / "export.gz").write_bytes(gzip.compress(f"{alice}\tAlice\t3 Oak Road\n".encode()))
    receipt, _ = ltomb.erase("alice")
    [art] = receipt["artifacts"]
    assert art["status"] == "RESIDUAL" and art["level"] == "physical"
    storage, nodes = build_app(ltomb)
    [bob_node] = [n for n in nodes if n.metadata["subject"] == "bob"]
    (folder(ltomb) / "export.gz").unlink()
    (folder(ltomb) / "blob.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(32))
    receipt, _ = ltomb.erase("bob")
    assert {a["status"] for a in receipt["artifacts"]} == {"UNVERIFIED"}
    assert "zstd" in json.dumps(receipt["artifacts"][0]) and bob_node


def test_an_unreadable_copy_leaves_the_node_residual(ltomb):
    """A copy that is not JSON (a text dump) still holds the id: the byte scan finds it, the receipt says
    RESIDUAL(physical), never VERIFIED."""
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    (folder(ltomb) / "notes.txt").write_text(f"exported {alice}: Alice, 3 Oak Road\n")
    receipt, _ = ltomb.erase("alice")
    [art] = receipt["artifacts"]
    assert art["status"] == "RESIDUAL" and art["level"] == "physical"


def test_deleting_a_source_through_the_vector_store_erases_its_copies_in_the_storage(tmp_path):
    services = Services(tmp_path / "services")
    try:
        with deployment(tmp_path / "d", "chroma", services, extra={"li": {"backend": "llamaindex",
                                                                          "persist_dir": "stores/li"}}) as (tomb,
                                                                                                            wrapper):
            Path(tomb.config.stores["li"].options["persist_dir"]).mkdir(parents=True, exist_ok=True)
            store = TombstoneLlamaVectorStore(wrapper, tombstone=tomb)
            storage = TombstoneLlamaStorage(tomb, "li", vector_store=store)
            embed_model = TombstoneLlamaEmbedding(HashingEmbedder(DIM))
            doc = Document(text="Carol's passport number is X1234567", doc_id="doc-carol", metadata={"subject": "carol"})
            VectorStoreIndex.from_documents([doc], storage_context=storage.storage_context, embed_model=embed_model,
                                            store_nodes_override=True)
            storage.persist()
            li = Path(tomb.config.stores["li"].options["persist_dir"])
            assert independent_scan(li, b"X1234567") == ["docstore.json"]
            store.delete("doc-carol")
            receipt, _ = store.receipts[-1]
            assert {a["store"] for a in receipt["artifacts"]} == {"chunks", "li"}
            assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
            assert independent_scan(li, b"X1234567") == []
            assert independent_scan(tmp_path / "d" / "stores", b"X1234567") == []
    finally:
        services.close()


def test_the_readme_example_runs_as_written(tmp_path):
    from langchain_backends import release

    from support import run_readme_example

    namespace = run_readme_example("TombstoneLlamaStorage", tmp_path, lambda: release("chroma"))
    arts = namespace["receipt"]["artifacts"]
    assert {a["store"] for a in arts} == {"chunks", "li"} and {a["status"] for a in arts} == {"VERIFIED"}
    assert independent_scan(tmp_path / "li2" / "stores", b"4417") == []


def test_json_nested_deeper_than_can_be_read_is_left_to_the_byte_scan(ltomb):
    """A hostile file of JSON nested a hundred thousand deep that holds the node's id: neither the walk nor the
    reclaim can go through it, nothing raises, and the byte scan finds the id there: RESIDUAL, never VERIFIED."""
    storage, nodes = build_app(ltomb)
    [alice] = [n.node_id for n in nodes if n.metadata["subject"] == "alice"]
    depth = 100_000
    (folder(ltomb) / "deep.json").write_text("[" * depth + json.dumps(alice) + "]" * depth)
    receipt, _ = ltomb.erase("alice")
    [art] = receipt["artifacts"]
    assert art["status"] == "RESIDUAL" and art["level"] == "physical" and "deep.json" in art["measurement"]
