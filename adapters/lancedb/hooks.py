"""LanceDB's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from typing import Any


class LanceDBHooks:
    demo_role = "chunks"
    demo_default = False

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "lancedb", "path": "stores/lancedb", "table": kit.collection.replace("-", "_")}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        import lancedb
        import pyarrow as pa

        from .store import TombstoneLanceTable, table_names

        db = lancedb.connect(str(options["path"]))
        name = options["table"]
        if name not in table_names(db):
            db.create_table(name, schema=pa.schema([("id", pa.string()), ("text", pa.string()),
                                                    ("vector", pa.list_(pa.float32(), kit.embedding_dim))]))
        table = TombstoneLanceTable(db, name, lineage=kit.lineage, embedder=kit.embedder(), store=store)
        for ref in subjects:
            ids, texts, _metas = kit.chunks(ref)
            # each chunk was cut from a document: erasing the document reaches the chunk
            table.add(ids, texts, subject=ref, sources=[[e] for e in kit.document_sources(ids)])

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "table": f"{options['table']}_tombstone_canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Remove the canaries' table (and its hidden-ids table and lock files); the configured one is untouched."""
        from tombstone.storelock import lock_file_for

        from .store import HIDDEN_SUFFIX, table_path

        name = cls.canary_options(options)["table"]
        for table in (name, name + HIDDEN_SUFFIX):
            folder = table_path(options["path"], table)
            shutil.rmtree(folder, ignore_errors=True)
            lock_file_for(folder).unlink(missing_ok=True)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every row of the latest version, read with Lance's own dataset reader."""
        import lance

        from .store import table_path

        rows = lance.dataset(str(table_path(options["path"], options["table"]))).to_table().to_pylist()
        return sorted((r.get("id"), r.get("text"), tuple(r.get("vector") or ())) for r in rows)
