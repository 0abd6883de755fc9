"""sqlite-vec's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone_adapters.sqlitefile import SQLiteFileCanaries


class SqliteVecHooks(SQLiteFileCanaries):
    demo_role = "chunks"
    demo_default = False

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "sqlitevec", "path": "stores/sqlitevec/vectors.db", "table": "chunks"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        from .store import VecStore

        vec = VecStore(options["path"], table=options.get("table", "chunks"), dim=kit.embedding_dim,
                       lineage=kit.lineage, embedder=kit.embedder(), store=store)
        try:
            for ref in subjects:
                ids, texts, metas = kit.chunks(ref)
                # each chunk was cut from a document: erasing the document reaches the chunk
                vec.add(ids, texts, metadatas=metas, subject=ref, sources=[[e] for e in kit.document_sources(ids)])
        finally:
            vec.close()

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every row (id, text, metadata, vector bytes), read through sqlite-vec's own table."""
        from .store import connect

        conn = connect(Path(options["path"]), "survivors")
        try:
            table = options.get("table", "chunks")
            return sorted(conn.execute(f"SELECT id, text, metadata, embedding FROM {table}"))
        finally:
            conn.close()
