"""FAISS backend (IndexHNSWFlat in IndexIDMap2, persisted as index, state and records files): the store apps use, and its adapter."""

from .store import FaissStore

__all__ = ["FaissAdapter", "FaissStore"]


def __getattr__(name: str):
    if name == "FaissAdapter":
        from .adapter import FaissAdapter

        return FaissAdapter
    raise AttributeError(name)
