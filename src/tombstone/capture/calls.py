"""Calling an embedding function: the one place that knows its two calling conventions."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Embedder = Callable[[list[str]], "np.ndarray | Sequence[Sequence[float]]"]
"""Any callable from a list of texts to one vector per text."""


def embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """``embedder(texts)`` as float32 rows (or ``embedder(input=texts)``, Chroma's convention)."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    try:
        out = embedder(texts)
    except TypeError:
        out = embedder(input=texts)  # chromadb EmbeddingFunction convention
    return np.asarray(out, dtype=np.float32)


__all__ = ["Embedder", "embed"]
