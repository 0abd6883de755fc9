"""FAISS's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class FaissHooks:
    demo_role = "chunks"

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "faiss", "path": "stores/faiss"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from tombstone.errors import ConfigError

        from .store import FaissStore

        index = FaissStore(options["path"], dim=kit.embedding_dim, lineage=kit.lineage, store=store,
                           embedder=kit.embedder())
        if index.dim != kit.embedding_dim:
            raise ConfigError(f"the FAISS store at {options['path']} has dimension {index.dim},"
                              f" the demo embeds {kit.embedding_dim}")
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            index.add(ids, documents=texts, metadatas=metas, subject=ref)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "path": f"{options['path'].rstrip('/')}-tombstone-canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Delete the canaries' store folder and its lock file."""
        import shutil

        from tombstone.storelock import lock_file_for

        path = cls.canary_options(options)["path"]
        lock = lock_file_for(path)
        shutil.rmtree(path, ignore_errors=True)
        lock.unlink(missing_ok=True)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        from .store import FaissStore

        store = FaissStore(options["path"], create=False)
        recs = store.get()
        return ({i: (r["document"], r["metadata"]) for i, r in recs.items()},
                {i: v for i, v in zip(recs, store.vectors(list(recs)))},
                [[a for a, _ in row] for row in store.search(query_embeddings=store.vectors(list(recs)[:3]), k=3)])

    @classmethod
    def survivors_equal(cls, a: Any, b: Any) -> bool:
        from tombstone_adapters.chroma.hooks import same_collection

        return same_collection(a, b)
