"""``TombstoneLlamaEmbedding``: a Tombstone embedder as LlamaIndex's embed model, so that the vectors LlamaIndex
computes for nodes and queries are the ones the wrapper's lineage capture computes."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

from tombstone.capture.vector import embed


class TombstoneLlamaEmbedding(BaseEmbedding):
    _embedder: Any = PrivateAttr()

    def __init__(self, embedder: Any, **kwargs: Any) -> None:
        super().__init__(model_name=type(embedder).__name__, **kwargs)
        self._embedder = embedder

    def _get_query_embedding(self, query: str) -> list[float]:
        return embed(self._embedder, [query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return embed(self._embedder, [text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return embed(self._embedder, list(texts)).tolist()


__all__ = ["TombstoneLlamaEmbedding"]
