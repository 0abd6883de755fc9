"""The docstore's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from tombstone_adapters.sqlitefile import SQLiteFileCanaries


class DocstoreHooks(SQLiteFileCanaries):
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
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        con = sqlite3.connect(options["path"])
        try:
            return con.execute("SELECT id, text, metadata FROM documents ORDER BY id").fetchall()
        finally:
            con.close()
