"""The docstore's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class DocstoreHooks:
    demo_role = "documents"
    demo_default = True

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "docstore", "path": "stores/docstore/docstore.db"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from .store import DocStore

        docs = DocStore(options["path"], lineage=kit.lineage, store=store)
        try:
            for ref in subjects:
                docs.add_many(kit.documents(ref), subject=ref)
        finally:
            docs.close()

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        path = Path(options["path"])
        return {**options, "path": str(path.with_name(f"{path.stem}-tombstone-canary{path.suffix}"))}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Delete the canaries' file, its SQLite sidecars and its lock file."""
        from tombstone.storelock import lock_file_for

        path = Path(cls.canary_options(options)["path"])
        lock = lock_file_for(path)
        for file in (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal")), lock):
            file.unlink(missing_ok=True)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        con = sqlite3.connect(options["path"])
        try:
            return con.execute("SELECT id, text, metadata FROM documents ORDER BY id").fetchall()
        finally:
            con.close()
