"""Embedded Chroma backend: the ``TombstoneCollection`` wrapper apps use, and its adapter."""

from .wrapper import SUPPRESSED, TombstoneCollection, merge_where

__all__ = ["ChromaAdapter", "SUPPRESSED", "TombstoneCollection", "merge_where"]


def __getattr__(name: str):
    if name == "ChromaAdapter":
        from .adapter import ChromaAdapter

        return ChromaAdapter
    raise AttributeError(name)
