"""The semantic cache's adapter: the backing Chroma store's probes and reclaim, with the cache's entries
deleted at suppression (``TombstoneSemanticCache``, in ``semantic_cache``, writes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tombstone_adapters.chroma.adapter import ChromaAdapter

from tombstone.contract import Capability
from tombstone.lineage.db import ArtifactRecord

from .hooks import SemanticCacheHooks
from .semantic_cache import BACKEND, TombstoneSemanticCache, entry_id  # noqa: F401 (re-exported)


class SemanticCacheAdapter(SemanticCacheHooks, ChromaAdapter):
    """Options: those of the backing Chroma store (``path``, ``collection``) plus ``neighbours`` (default 0)."""

    backend = BACKEND
    capabilities = frozenset({Capability.IMMEDIATE_DELETE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                              Capability.PHYSICAL_SCAN, Capability.SEMANTIC_PROBE})

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        present = self._existing(self._ids(artifacts))
        neighbours: list[str] = []
        k = int(self.options.get("neighbours", 0))
        col = self.collection()
        if k and present:
            vectors = col.get(ids=present, include=["embeddings"])["embeddings"]
            found = col.query(query_embeddings=vectors, n_results=min(k + 1, col.count()), include=[])["ids"]
            neighbours = sorted({i for row in found for i in row} - set(present))
        doomed = present + neighbours
        if doomed:
            col.delete(ids=doomed)
        return {"mechanism": "entries deleted at suppression (a cache has no hide state)",
                "entries_deleted": len(present), "neighbours_deleted": neighbours}
