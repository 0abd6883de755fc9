"""Embeddings both ways: a Tombstone embedder as LangChain ``Embeddings``, and LangChain ``Embeddings`` as
the embedder a Tombstone wrapper captures with.

A wrapper embeds each chunk and its three probe fragments in one call to its embedder, and the vector store
embeds queries with its ``Embeddings``: both must be the same model, or queries and probes search another
space than the one the records were written in. ``TombstoneVectorStore`` takes one and derives the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings

from tombstone.capture.vector import embed


class TombstoneEmbeddings(Embeddings):
    """A Tombstone embedder (``HashingEmbedder``, ``MiniLMEmbedder``, any ``texts -> array`` callable) as
    LangChain ``Embeddings``."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return embed(self.embedder, list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return embed(self.embedder, [text])[0].tolist()


class LangChainEmbedder:
    """LangChain ``Embeddings`` as the embedder a Tombstone wrapper captures with (chunks and probe fragments
    go through ``embed_documents``)."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings
        self.dim: int | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32)
        if vectors.size:
            self.dim = vectors.shape[1]
        return vectors

    __call__ = embed


def embedder_of(embeddings: Embeddings) -> Any:
    """The Tombstone embedder behind ``embeddings``: the wrapped one for ``TombstoneEmbeddings``."""
    return embeddings.embedder if isinstance(embeddings, TombstoneEmbeddings) else LangChainEmbedder(embeddings)


def embeddings_of(embedder: Any) -> Embeddings:
    """LangChain ``Embeddings`` for a Tombstone embedder: the original ones for a ``LangChainEmbedder``."""
    return embedder.embeddings if isinstance(embedder, LangChainEmbedder) else TombstoneEmbeddings(embedder)


def same_model(embeddings: Embeddings, embedder: Any) -> bool:
    """Whether ``embeddings`` and ``embedder`` are one model (one wraps the other)."""
    return ((isinstance(embeddings, TombstoneEmbeddings) and embeddings.embedder is embedder)
            or (isinstance(embedder, LangChainEmbedder) and embedder.embeddings is embeddings))


__all__ = ["LangChainEmbedder", "TombstoneEmbeddings", "embedder_of", "embeddings_of", "same_model"]
