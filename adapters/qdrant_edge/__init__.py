"""Qdrant Edge backend (experimental): the ``TombstoneEdgeShard`` wrapper apps write through, and its adapter."""

from .store import TombstoneEdgeShard, close_all

__all__ = ["QdrantEdgeAdapter", "TombstoneEdgeShard", "close_all"]


def __getattr__(name: str):
    if name == "QdrantEdgeAdapter":
        from .adapter import QdrantEdgeAdapter

        return QdrantEdgeAdapter
    raise AttributeError(name)
