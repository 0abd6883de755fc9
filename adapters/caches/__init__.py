"""Caches: LangChain's exact SQLite cache and a semantic cache on Chroma, with lineage to their sources."""

from .attribution import attribution

__all__ = ["ExactCacheAdapter", "SemanticCacheAdapter", "TombstoneSQLiteCache", "TombstoneSemanticCache",
           "attribution"]


def __getattr__(name: str):
    if name in ("ExactCacheAdapter", "TombstoneSQLiteCache"):
        from . import exact

        return getattr(exact, name)
    if name in ("SemanticCacheAdapter", "TombstoneSemanticCache"):
        from . import semantic

        return getattr(semantic, name)
    raise AttributeError(name)
