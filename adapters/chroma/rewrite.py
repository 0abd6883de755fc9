"""The Chroma adapter's rewrite: the collection copied from its survivors into fresh segments, the original
dropped once the copy is complete (``tombstone compact``, ``reclaim --store``, ``reclaim = "rewrite"``, and
what the in-place recipe cannot reach)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tombstone.errors import StoreUnavailableError
from tombstone.faults import kill_point
from tombstone.lineage.db import ArtifactRecord

from . import clients
from .wrapper import REWRITE_SUFFIX

PAGE = 1000
"""Records read (and written) per call while copying."""


class ChromaRewrite:
    """Mixin of :class:`~tombstone_adapters.chroma.adapter.ChromaAdapter`."""

    def reclaim_store(self) -> dict[str, Any]:
        """Everything deleted goes: the collection rewritten from its survivors, the SQLite file VACUUMed."""
        clients.refuse_foreign_clients(self.path, self.store)
        return {"mechanism": "rewrite", **self._reclaim_rewrite([])}

    def compact(self) -> dict[str, Any]:
        """The collection rewritten from its survivors into new segments: the slots an in-place reclaim left
        in the graph go with the old segment."""
        clients.refuse_foreign_clients(self.path, self.store)
        return {"mechanism": "rewrite", **self._reclaim_rewrite([])}

    def _reclaim_rewrite(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        present = self._existing(self._ids(artifacts))
        if present:
            self.collection().delete(ids=present)
        kill_point("reclaim:chroma:after-delete")
        rewrite = self._rewrite()
        kill_point("reclaim:chroma:after-rewrite")
        zeroed = self._settle_and_zero_tails()
        purged = self._purge_queue()
        kill_point("reclaim:chroma:after-purge")
        vacuum = self._vacuum()
        kill_point("reclaim:chroma:after-vacuum")
        return {
            "steps": ["delete", "rewrite from survivors", "zero HNSW slots past cur_element_count",
                      "purge embeddings queue", "VACUUM", "remove orphan segment directories"],
            "deleted": len(present),
            "rewrite": rewrite,
            "hnsw_bytes_zeroed": zeroed,
            "queue_rows_purged": purged,
            "vacuum": vacuum,
            "orphan_segment_dirs_removed": self._remove_orphans(),
        }

    def _survivors(self, col) -> dict[str, Any]:
        out: dict[str, list] = {"ids": [], "embeddings": [], "documents": [], "metadatas": []}
        offset = 0
        while True:
            page = col.get(include=["embeddings", "documents", "metadatas"], limit=PAGE, offset=offset)
            if not page["ids"]:
                break
            out["ids"] += page["ids"]
            out["embeddings"] += list(np.asarray(page["embeddings"], dtype=np.float32))
            out["documents"] += list(page["documents"] or [None] * len(page["ids"]))
            out["metadatas"] += list(page["metadatas"] or [None] * len(page["ids"]))
            offset += len(page["ids"])
        return out

    def _rewrite(self) -> dict[str, Any]:
        """Copy the survivors into a fresh collection (and so fresh segments), then swap names.

        Crash-safe: the original is dropped only after the copy has been checked complete, and a
        leftover copy from a killed attempt is discarded while the original still exists.
        """
        old = self.collection()
        tmp_name = self.name + REWRITE_SUFFIX
        if self._get(tmp_name) is not None:
            self.client.delete_collection(tmp_name)
        survivors = self._survivors(old)
        kwargs: dict[str, Any] = {"embedding_function": None}
        hnsw = (old.configuration_json or {}).get("hnsw")
        if old.metadata:
            kwargs["metadata"] = dict(old.metadata)
        elif hnsw:
            kwargs["configuration"] = {"hnsw": dict(hnsw)}
        fresh = self.client.create_collection(tmp_name, **kwargs)
        kill_point("reclaim:chroma:copy-created")
        batch = max(1, min(self.client.get_max_batch_size(), PAGE))
        ids = survivors["ids"]
        for start in range(0, len(ids), batch):
            end = start + batch
            fresh.add(
                ids=ids[start:end],
                embeddings=np.asarray(survivors["embeddings"][start:end], dtype=np.float32),
                documents=survivors["documents"][start:end],
                metadatas=survivors["metadatas"][start:end],
            )
        if fresh.count() != len(ids) or set(self._survivors(fresh)["ids"]) != set(ids):
            raise StoreUnavailableError("chroma rewrite is incomplete; the original collection was kept",
                                        store=self.store)
        old_id = str(old.id)
        kill_point("reclaim:chroma:copy-complete")
        self.client.delete_collection(self.name)  # the copy is complete: nothing is lost from here on
        kill_point("reclaim:chroma:original-dropped")
        fresh.modify(name=self.name)
        self._col = fresh
        return {"survivors": len(ids), "old_collection_id": old_id, "new_collection_id": str(fresh.id)}


__all__ = ["ChromaRewrite", "PAGE"]
