"""The deterministic offline embedder used by the demo and the tests.

Feature hashing of word unigrams and bigrams into a fixed number of dimensions, L2-normalised.
It needs no model and no network, and the same text gives the same vector on every machine. It is
not a semantic model: apps bring their own embedding function for real use.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """``embed(texts) -> float32 array (n, dim)``; callable like most embedding functions."""

    def __init__(self, dim: int = 384) -> None:
        if dim < 32:
            raise ValueError("dim must be at least 32 (the fingerprint length)")
        self.dim = dim

    def _features(self, text: str) -> list[str]:
        words = [w.lower() for w in _TOKEN.findall(text)]
        return words + [f"{a} {b}" for a, b in zip(words, words[1:])]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if (value >> 63) & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out

    __call__ = embed
