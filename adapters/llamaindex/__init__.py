"""LlamaIndex: ``TombstoneLlamaVectorStore``, LlamaIndex's vector store over a Tombstone wrapper, and
``TombstoneLlamaEmbedding``, a Tombstone embedder as LlamaIndex's embed model."""

__all__ = ["TombstoneLlamaEmbedding", "TombstoneLlamaVectorStore"]


def __getattr__(name: str):
    if name == "TombstoneLlamaVectorStore":
        from .vectorstore import TombstoneLlamaVectorStore

        return TombstoneLlamaVectorStore
    if name == "TombstoneLlamaEmbedding":
        from .embeddings import TombstoneLlamaEmbedding

        return TombstoneLlamaEmbedding
    raise AttributeError(name)
