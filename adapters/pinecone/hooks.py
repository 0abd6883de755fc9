"""Pinecone's demo and canary hooks: the demo runs against the local EMULATOR of the data-plane API."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .settings import STOPPED_NOTE

EMULATOR_KEY_ENV = "PINECONE_EMULATOR_KEY"
"""The variable the demo's store reads its key from: always the dummy below, never a real key."""
EMULATOR_KEY = "local-emulator-key"


def forget_host(config_path: Path, host: str) -> None:
    """Remove ``host`` from every store of the config at ``config_path`` that names it (the emulator it
    named has stopped, and whatever listens on that port next must not receive the key)."""
    import tomllib

    import tomli_w

    from tombstone.fsutil import write_atomic

    try:
        data = tomllib.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no config (a scratch deployment already removed) or not one this demo wrote
    changed = False
    for options in (data.get("stores") or {}).values():
        if isinstance(options, dict) and options.get("host") == host:
            del options["host"]
            options.pop("allow_insecure_host", None)
            options["note"] = STOPPED_NOTE
            changed = True
    if changed:
        write_atomic(config_path, tomli_w.dumps(data).encode("utf-8"))


class PineconeHooks:
    demo_role = "chunks"

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        """Start the local emulator for this process and return the store config pointing at it. The store
        reads a dummy key from its own variable (never a real ``PINECONE_API_KEY``), and loses its host when
        the emulator stops."""
        from tombstone.config import CONFIG_NAME
        from tombstone.demo import Service

        from .emulator import PineconeEmulator

        emulator = PineconeEmulator(kit.embedding_dim, lag=0.05).start()
        host = emulator.host

        def stop() -> None:
            emulator.stop()
            forget_host(Path(kit.root) / CONFIG_NAME, host)

        kit.services.append(Service(
            stop=stop,
            note=f"pinecone: the demo ran against a local EMULATOR of Pinecone's data-plane API at {emulator.host}"
                 f" (visibility lag {emulator.lag} s), started and stopped by the demo; Pinecone itself was not contacted"))
        os.environ[EMULATOR_KEY_ENV] = EMULATOR_KEY  # the emulator accepts any key: never send it a real one
        return {"backend": "pinecone", "host": host, "namespace": "demo", "wait_seconds": 5.0,
                "api_key_env": EMULATOR_KEY_ENV, "allow_insecure_host": True}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from pinecone import Pinecone

        from . import settings
        from .wrapper import TombstonePinecone

        host, key = settings.connection(store, options)
        index = Pinecone(api_key=key).Index(host=host)
        records = TombstonePinecone(index, namespace=options.get("namespace", ""), lineage=kit.lineage, store=store,
                                    embedder=kit.embedder())
        for ref in subjects:
            ids, texts, metas = kit.chunks(ref)
            records.upsert(ids, documents=texts, metadatas=metas, subject=ref)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "namespace": "tombstone-canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Delete every record of the canaries' namespace (Pinecone drops a namespace with its last record);
        the configured namespace is not touched."""
        from pinecone import Pinecone
        from pinecone.exceptions import NotFoundException

        from . import settings

        key = os.environ.get(settings.key_env("canaries", options))
        if not key or not options.get("host"):
            return
        index = Pinecone(api_key=key).Index(host=settings.host("canaries", options))
        try:
            index.delete(delete_all=True, namespace=cls.canary_options(options)["namespace"])
        except NotFoundException:
            pass  # no such namespace: nothing to remove
