"""SQLite docstore backend: the ``DocStore`` wrapper apps use, and its adapter."""

from .adapter import DocstoreAdapter
from .store import DocStore, Document

__all__ = ["DocStore", "DocstoreAdapter", "Document"]
