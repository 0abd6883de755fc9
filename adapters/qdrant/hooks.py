"""Qdrant local mode's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class QdrantHooks:
    demo_role = "chunks"

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "qdrant", "path": "stores/qdrant", "collection": kit.collection}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from qdrant_client import models

        from .local import local_client
        from .wrapper import TombstoneQdrant

        client = local_client(options["path"])
        name = options.get("collection", kit.collection)
        if not client.collection_exists(name):
            client.create_collection(name, vectors_config=models.VectorParams(size=kit.embedding_dim,
                                                                              distance=models.Distance.COSINE))
        points = TombstoneQdrant(client, name, lineage=kit.lineage, store=store, embedder=kit.embedder())
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            points.upsert(ids, documents=texts, payloads=metas, subject=ref)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "collection": f"{options.get('collection', 'rag-chunks')}-tombstone-canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Drop the canaries' collection (and a rewrite copy of it, and its rewrite marker, a killed reclaim
        left), holding the directory's lock; the configured collection is not touched."""
        from .local import held
        from .wrapper import MARKER, REWRITE_SUFFIX

        name = cls.canary_options(options)["collection"]
        path = Path(options["path"])
        if not (path / "meta.json").is_file():
            return
        with held(path, store=name) as client:
            for collection in (name, name + REWRITE_SUFFIX):
                if client.collection_exists(collection):
                    client.delete_collection(collection)
            try:
                if json.loads((path / MARKER).read_text()).get("collection") == name:
                    (path / MARKER).unlink()
            except (OSError, ValueError, AttributeError):
                pass

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every stored point, decoded from the collection's SQLite file with the restricted unpickler."""
        from .points import read_points

        name = options.get("collection", "rag-chunks")
        points = [p for _rowid, p in read_points(Path(options["path"]) / "collection" / name / "storage.sqlite")]
        return sorted((p.payload["tombstone_id"], json.dumps(p.payload, sort_keys=True), tuple(p.vector))
                      for p in points)
