"""LangChain: a ``VectorStore`` over Tombstone's wrappers, a ``RecordManager`` in the lineage db, and the
embeddings glue between them. The caches (``tombstone_adapters.caches``) are LangChain caches already.

Needs ``langchain-core`` (``pip install 'tombstone-rag[langchain]'``, part of ``all``).
"""

from .embeddings import LangChainEmbedder, TombstoneEmbeddings
from .record_manager import TombstoneRecordManager
from .vectorstore import TombstoneRetriever, TombstoneVectorStore

__all__ = ["LangChainEmbedder", "TombstoneEmbeddings", "TombstoneRecordManager", "TombstoneRetriever",
           "TombstoneVectorStore"]
