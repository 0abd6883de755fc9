"""The caches' demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from tombstone_adapters.sqlitefile import SQLiteFileCanaries


class ExactCacheHooks(SQLiteFileCanaries):
    demo_role = "answers"
    demo_default = True

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "exact_cache", "path": "stores/exact_cache/llm_cache.db"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from .attribution import attribution
        from .exact_cache import TombstoneSQLiteCache

        cache = TombstoneSQLiteCache(options["path"], lineage=kit.lineage, store=store)
        try:
            for ref in subjects:
                prompt, generations, chunk_ids = kit.answer(ref)
                with attribution(ref, kit.answer_sources(chunk_ids)):
                    cache.update(prompt, kit.llm, generations)
        finally:
            cache.engine.dispose()

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        con = sqlite3.connect(options["path"])
        try:
            return con.execute("SELECT entry_id, prompt, llm, idx, response FROM tombstone_llm_cache"
                               " ORDER BY entry_id, idx").fetchall()
        finally:
            con.close()


class SemanticCacheHooks:
    demo_role = "answers"
    demo_default = True

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "semantic_cache", "path": "stores/semantic_cache", "collection": "answers"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from tombstone_adapters.chroma.hooks import DEMO_METADATA
        from tombstone_adapters.chroma.wrapper import persistent_client

        from .attribution import attribution
        from .semantic_cache import TombstoneSemanticCache

        collection = persistent_client(options["path"]).get_or_create_collection(
            options.get("collection", "answers"), metadata=DEMO_METADATA, embedding_function=None)
        cache = TombstoneSemanticCache(collection, lineage=kit.lineage, store=store, embedder=kit.embedder())
        for ref in subjects:
            prompt, generations, chunk_ids = kit.answer(ref)
            with attribution(ref, kit.answer_sources(chunk_ids)):
                cache.update(prompt, kit.llm, generations)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "collection": f"{options.get('collection', 'answers')}-tombstone-canary"}

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        from tombstone_adapters.chroma.hooks import read_collection

        return read_collection(options["path"], options.get("collection", "answers"))

    @classmethod
    def survivors_equal(cls, a: Any, b: Any) -> bool:
        from tombstone_adapters.chroma.hooks import same_collection

        return same_collection(a, b)
