"""Mem0: ``TombstoneMemory``, a Mem0 ``Memory`` on Qdrant local mode whose memories get lineage by ``user_id``,
and ``Mem0Adapter``, which erases them from the vector store and from Mem0's SQLite history."""

__all__ = ["Mem0Adapter", "TombstoneMemory"]


def __getattr__(name: str):
    if name == "TombstoneMemory":
        from .memory import TombstoneMemory

        return TombstoneMemory
    if name == "Mem0Adapter":
        from .adapter import Mem0Adapter

        return Mem0Adapter
    raise AttributeError(name)
