"""LangChain's standard cache suites (langchain-tests) on both Tombstone caches, as ``set_llm_cache`` uses
them: a real lineage db underneath, entries recorded unattributed when no attribution is in force."""

from __future__ import annotations

import chromadb
import pytest
from langchain_tests.integration_tests.cache import AsyncCacheTestSuite, SyncCacheTestSuite

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone_adapters.caches import TombstoneSemanticCache, TombstoneSQLiteCache

STORES = {"llm_cache": {"backend": "exact_cache", "path": "stores/llm_cache.db"},
          "semantic": {"backend": "semantic_cache", "path": "stores/semantic", "collection": "answers"}}


@pytest.fixture
def tomb(tmp_path):
    with Tombstone(init_deployment(tmp_path / "deploy", STORES)) as t:
        yield t
    chromadb.api.client.SharedSystemClient.clear_system_cache()


def exact_cache(tomb) -> TombstoneSQLiteCache:
    return TombstoneSQLiteCache(tomb.config.stores["llm_cache"].options["path"], lineage=tomb.lineage, store="llm_cache")


def semantic_cache(tomb) -> TombstoneSemanticCache:
    options = tomb.config.stores["semantic"].options
    collection = chromadb.PersistentClient(path=str(options["path"])).get_or_create_collection(
        options["collection"], metadata={"hnsw:space": "cosine"}, embedding_function=None)
    return TombstoneSemanticCache(collection, lineage=tomb.lineage, store="semantic", embedder=HashingEmbedder(64))


class TestExactCache(SyncCacheTestSuite):
    @pytest.fixture
    def cache(self, tomb):
        return exact_cache(tomb)


class TestExactCacheAsync(AsyncCacheTestSuite):
    @pytest.fixture
    async def cache(self, tomb):
        return exact_cache(tomb)


class TestSemanticCache(SyncCacheTestSuite):
    @pytest.fixture
    def cache(self, tomb):
        return semantic_cache(tomb)


class TestSemanticCacheAsync(AsyncCacheTestSuite):
    @pytest.fixture
    async def cache(self, tomb):
        return semantic_cache(tomb)
