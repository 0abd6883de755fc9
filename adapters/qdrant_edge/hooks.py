"""Qdrant Edge's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class QdrantEdgeHooks:
    demo_role = "chunks"
    demo_default = False

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "qdrant_edge", "path": "stores/qdrant_edge"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from .store import TombstoneEdgeShard

        shard = TombstoneEdgeShard(options["path"], dim=kit.embedding_dim, lineage=kit.lineage, embedder=kit.embedder(),
                                   store=store)
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            # each chunk was cut from a document: erasing the document reaches the chunk
            shard.upsert(ids, texts, subject=ref, payloads=metas, sources=[[e] for e in kit.document_sources(ids)])

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        path = Path(options["path"])
        return {**options, "path": str(path.with_name(f"{path.name}-tombstone-canary"))}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        from tombstone.storelock import lock_file_for

        from .store import close_shard

        path = Path(cls.canary_options(options)["path"])
        close_shard(path)
        shutil.rmtree(path, ignore_errors=True)
        lock_file_for(path).unlink(missing_ok=True)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        import qdrant_edge as qe

        from .store import shard_at

        records, _ = shard_at(options["path"], "survivors").scroll(qe.ScrollRequest(limit=1_000_000, with_payload=True,
                                                                                    with_vector=True))
        return sorted((str(r.id), sorted((r.payload or {}).items()), tuple(r.vector or ())) for r in records)
