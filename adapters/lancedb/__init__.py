"""LanceDB backend (local databases): the ``TombstoneLanceTable`` wrapper apps write through, and its adapter."""

from .store import TombstoneLanceTable

__all__ = ["LanceDBAdapter", "TombstoneLanceTable"]


def __getattr__(name: str):
    if name == "LanceDBAdapter":
        from .adapter import LanceDBAdapter

        return LanceDBAdapter
    raise AttributeError(name)
