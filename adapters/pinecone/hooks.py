"""Pinecone's demo and canary hooks: the demo runs against the local EMULATOR of the data-plane API."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


class PineconeHooks:
    demo_role = "chunks"

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        """Start the local emulator for this process and return the store config pointing at it."""
        from tombstone.demo import Service

        from .emulator import PineconeEmulator

        emulator = PineconeEmulator(kit.embedding_dim, lag=0.05).start()
        kit.services.append(Service(
            stop=emulator.stop,
            note=f"pinecone: the demo ran against a local EMULATOR of Pinecone's data-plane API at {emulator.host}"
                 f" (visibility lag {emulator.lag} s), started and stopped by the demo; Pinecone itself was not contacted"))
        # The emulator accepts any key; a real key, if set, is not sent anywhere but to the emulator.
        os.environ.setdefault("PINECONE_API_KEY", "local-emulator-key")
        return {"backend": "pinecone", "host": emulator.host, "namespace": "demo", "wait_seconds": 5.0}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from pinecone import Pinecone

        from .wrapper import TombstonePinecone

        index = Pinecone(api_key=os.environ[options.get("api_key_env", "PINECONE_API_KEY")]).Index(host=options["host"])
        records = TombstonePinecone(index, namespace=options.get("namespace", ""), lineage=kit.lineage, store=store,
                                    embedder=kit.embedder())
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            records.upsert(ids, documents=texts, metadatas=metas, subject=ref)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "namespace": "tombstone-canary"}
