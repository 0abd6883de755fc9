"""LlamaIndex: ``TombstoneLlamaVectorStore``, LlamaIndex's vector store over a Tombstone wrapper;
``TombstoneLlamaEmbedding``, a Tombstone embedder as LlamaIndex's embed model; and ``TombstoneLlamaStorage``, the
app's docstore, index store and ingestion cache on a ``llamaindex`` store (``LlamaStorageAdapter``)."""

__all__ = ["LlamaStorageAdapter", "TombstoneLlamaEmbedding", "TombstoneLlamaStorage", "TombstoneLlamaVectorStore"]


def __getattr__(name: str):
    if name == "TombstoneLlamaVectorStore":
        from .vectorstore import TombstoneLlamaVectorStore

        return TombstoneLlamaVectorStore
    if name == "TombstoneLlamaEmbedding":
        from .embeddings import TombstoneLlamaEmbedding

        return TombstoneLlamaEmbedding
    if name == "TombstoneLlamaStorage":
        from .storage import TombstoneLlamaStorage

        return TombstoneLlamaStorage
    if name == "LlamaStorageAdapter":
        from .adapter import LlamaStorageAdapter

        return LlamaStorageAdapter
    raise AttributeError(name)
