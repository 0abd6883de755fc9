"""The LLM caches against real files: the exact cache (LangChain's SQLite cache) and the semantic cache
(a Chroma collection): conformance, and what only a cache does (neighbours deleted at suppression)."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from unittest import mock

import chromadb
import chromadb.errors
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.lineage.db import ArtifactRecord
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.caches import TombstoneSemanticCache, TombstoneSQLiteCache, attribution
from tombstone_adapters.caches.exact import ExactCacheAdapter, entry_id
from tombstone_adapters.caches.semantic import SemanticCacheAdapter
from tombstone_adapters.caches.semantic import entry_id as sem_id

from support import raising_stub

DIM = 64
# Low thresholds so Chroma really writes its HNSW segment files in small tests.
COLLECTION_META = {"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20}


class TestExactCacheConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, tmp_path):
        from langchain_core.outputs import Generation

        config = init_deployment(tmp_path / "c", {"cache": {"backend": "exact_cache", "path": "stores/cache.db"}})
        tomb = Tombstone(config)
        path = config.stores["cache"].options["path"]
        cache = TombstoneSQLiteCache(path, lineage=tomb.lineage, store="cache")
        counter = iter(range(100_000))

        def write(subject, n):
            out = []
            for _ in range(n):
                i = next(counter)
                prompt = f"question {i} from {subject}"
                tomb.lineage.record_artifacts(subject, [ArtifactRecord("src", f"src-{i}", "docstore", "document")])
                with attribution(subject, [("src", f"src-{i}")]):
                    cache.update(prompt, "llm", [Generation(text=f"answer {i}")])
                out.append(tomb.lineage.artifact("cache", entry_id(prompt, "llm")))
            return out

        def snapshot():
            con = sqlite3.connect(path)
            rows = con.execute("SELECT entry_id, prompt, llm, idx, response FROM tombstone_llm_cache").fetchall()
            con.close()
            return {r[0]: r[1:] for r in rows}

        def visible(ids):
            return set(snapshot()) & set(ids)

        # the control needs upstream SQLite's default: a plain DELETE leaves the freed cell in place
        adapter = ExactCacheAdapter("cache", {**config.stores["cache"].options, "secure_delete": False})

        @contextlib.contextmanager
        def vendor_failure():
            # SQLite fails every statement; the physical probe reads the files instead, so listing them fails too.
            conn = mock.Mock(spec=sqlite3.Connection)
            conn.execute.side_effect = sqlite3.OperationalError("injected: disk I/O error")
            unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.path))
            with mock.patch.object(adapter, "conn", conn), \
                    mock.patch.object(adapter, "physical_files", side_effect=unreadable):
                yield

        yield ConformanceEnv(adapter=adapter, write=write, survivors=snapshot, visible=visible,
                             vendor_failure=vendor_failure)
        cache.engine.dispose()
        tomb.close()


class TestSemanticCacheConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, tmp_path):
        from langchain_core.outputs import Generation

        config = init_deployment(tmp_path / "s", {"sem": {"backend": "semantic_cache", "path": "stores/sem",
                                                          "collection": "answers"}})
        path = config.stores["sem"].options["path"]
        col = chromadb.PersistentClient(path=path).create_collection("answers", embedding_function=None,
                                                                     metadata=COLLECTION_META)
        tomb = Tombstone(config)
        cache = TombstoneSemanticCache(col, lineage=tomb.lineage, store="sem", embedder=HashingEmbedder(DIM),
                                       threshold=0.2)
        counter = iter(range(100_000))
        prompts: dict[str, tuple[str, str]] = {}  # entry id -> (prompt, its answer)

        def write(subject, n):
            out = []
            for _ in range(n):
                i = next(counter)
                prompt, answer = f"question {i} from {subject} about order {i * 7919}", f"answer {i}"
                tomb.lineage.record_artifacts(subject, [ArtifactRecord("src", f"src-{i}", "docstore", "document")])
                with attribution(subject, [("src", f"src-{i}")]):
                    cache.update(prompt, "llm", [Generation(text=answer)])
                prompts[sem_id(prompt, "llm")] = (prompt, answer)
                out.append(tomb.lineage.artifact("sem", sem_id(prompt, "llm")))
            return out

        def snapshot():
            got = chromadb.PersistentClient(path=path).get_collection("answers").get(include=["documents", "metadatas"])
            return {i: (d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])}

        def visible(ids):
            """Entries the collection still returns by id, or whose own answer a lookup of their prompt gets."""
            listed = set(cache.entries.get(ids=list(ids), include=[])["ids"])
            looked_up = set()
            for eid in ids:
                prompt, answer = prompts[eid]
                hit = cache.lookup(prompt, "llm")
                if hit and hit[0].text == answer:
                    looked_up.add(eid)
            return (listed | looked_up) & set(ids)

        adapter = SemanticCacheAdapter("sem", config.stores["sem"].options)

        @contextlib.contextmanager
        def vendor_failure():
            # Every call into Chroma's Rust bindings raises; the physical probe reads the persist directory
            # instead, so listing it fails too.
            server = adapter.client._server
            failing = raising_stub(server.bindings, chromadb.errors.InternalError("injected"))
            unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.path))
            with mock.patch.object(server, "bindings", failing), \
                    mock.patch.object(adapter, "physical_files", side_effect=unreadable):
                yield

        yield ConformanceEnv(adapter=adapter, write=write, survivors=snapshot, visible=visible,
                             vendor_failure=vendor_failure)
        tomb.close()


def test_semantic_cache_hits_and_deletes_neighbours_at_suppression(tmp_path):
    from langchain_core.outputs import Generation

    config = init_deployment(tmp_path / "s", {"sem": {"backend": "semantic_cache", "path": "stores/sem",
                                                      "collection": "answers", "neighbours": 1}})
    path = config.stores["sem"].options["path"]
    col = chromadb.PersistentClient(path=path).create_collection("answers", embedding_function=None,
                                                                 metadata={"hnsw:space": "cosine"})
    with Tombstone(config) as tomb:
        cache = TombstoneSemanticCache(col, lineage=tomb.lineage, store="sem", embedder=HashingEmbedder(64), threshold=0.2)
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("docs", "alice-doc", "docstore", "document")])
        with attribution("alice", [("docs", "alice-doc")]):
            cache.update("when does my refund for order 1182 arrive", "llm", [Generation(text="Friday")])
        with attribution("carol", []):
            cache.update("when does my refund for order 1182 arrive please", "llm", [Generation(text="Friday!")])
            cache.update("completely different question about shipping labels", "llm", [Generation(text="No")])
        hit = cache.lookup("when does my refund for order 1182 arrive", "llm")
        assert hit and hit[0].text == "Friday"
        evidence = SemanticCacheAdapter("sem", config.stores["sem"].options).suppress(
            [tomb.lineage.artifact("sem", sem_id("when does my refund for order 1182 arrive", "llm"))])
        assert evidence["entries_deleted"] == 1
        assert evidence["neighbours_deleted"] == [sem_id("when does my refund for order 1182 arrive please", "llm")]
        assert cache.lookup("when does my refund for order 1182 arrive", "llm") is None
        assert cache.lookup("completely different question about shipping labels", "llm")[0].text == "No"
