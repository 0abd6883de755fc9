"""Caches: LangChain's exact SQLite cache and a semantic cache on Chroma, with lineage to their sources."""

from .attribution import attribution

__all__ = ["ExactCacheAdapter", "SemanticCacheAdapter", "TombstoneSQLiteCache", "TombstoneSemanticCache",
           "attribution"]


def __getattr__(name: str):
    if name == "ExactCacheAdapter":
        from . import exact

        return exact.ExactCacheAdapter
    if name == "TombstoneSQLiteCache":
        from . import exact_cache

        return exact_cache.TombstoneSQLiteCache
    if name == "SemanticCacheAdapter":
        from . import semantic

        return semantic.SemanticCacheAdapter
    if name == "TombstoneSemanticCache":
        from . import semantic_cache

        return semantic_cache.TombstoneSemanticCache
    raise AttributeError(name)
