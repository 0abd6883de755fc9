"""The lineage db opened read-only, for the report and the local viewer: they must never write to a deployment.

A SQLite lineage db is opened with ``mode=ro`` and ``PRAGMA query_only``, so no statement can change it
(SQLite itself may still create the ``-shm`` index a reader of a WAL database needs); a PostgreSQL one gets a
session whose transactions are all READ ONLY. Nothing is migrated: a lineage db written by another release
is refused with one line rather than changed. The queries are :class:`LineageDB`'s own.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tombstone.clock import system_clock
from tombstone.config import Config
from tombstone.errors import LineageError
from tombstone.keys import LINEAGE_SECRET, LineageSecret
from tombstone.lineage.db import LineageDB
from tombstone.lineage.migrations import MIGRATIONS
from tombstone.lineage.postgres import PgConnection


class ReadOnlyLineage(LineageDB):
    """A :class:`LineageDB` whose connection cannot write. Only the query methods are meant to be used;
    any method that writes fails inside the database."""

    def __init__(self, target: str | Path, secret: LineageSecret) -> None:  # noqa: D107 (no super().__init__)
        self._setup(target, secret, system_clock)
        if self.postgres:
            try:
                self._conn = PgConnection(str(target))
                self._conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            except Exception as exc:
                raise LineageError(f"cannot open lineage db {self.where}: {str(exc).strip()}") from exc
        else:
            if not self.path.is_file():
                raise LineageError(f"lineage db {self.path} does not exist: run 'tombstone init' to create it"
                                   " (or point lineage_db in the config at the existing one)")
            try:
                self._conn = sqlite3.connect(self.path.absolute().as_uri() + "?mode=ro", uri=True,
                                             isolation_level=None, timeout=30, check_same_thread=False)
                self._conn.row_factory = sqlite3.Row
                self._conn.execute("PRAGMA query_only=ON")
                self._conn.execute("PRAGMA busy_timeout=30000")
            except sqlite3.DatabaseError as exc:
                raise LineageError(f"cannot open lineage db {self.path} read-only: {exc}") from exc
        try:
            self._check_schema()
        except BaseException:
            self._conn.close()
            raise

    def _check_schema(self) -> None:
        try:
            version = self.schema_version()
        except Exception as exc:  # no schema_migrations table, or not a database at all
            raise LineageError(f"{self.where} is not a lineage db (it has no Tombstone schema)") from exc
        current = max(v for v, _, _ in MIGRATIONS)
        if version is None or version < current:
            raise LineageError(f"lineage db {self.where} is at schema version {version}, this release reads {current}:"
                               " run 'tombstone status' once to migrate it, then try again")
        if version > current:
            raise LineageError(f"lineage db {self.where} was written by a newer Tombstone (migration {version})")

    @classmethod
    def open(cls, config: Config) -> "ReadOnlyLineage":
        """The deployment's lineage db, read-only, with its secret (which unseals subjects and receipts)."""
        if not (config.keys_dir / LINEAGE_SECRET).exists():
            raise LineageError(f"no lineage secret at {config.keys_dir / LINEAGE_SECRET}: the lineage db's receipts"
                               " and subjects cannot be read without it")
        return cls(config.lineage_target, LineageSecret.load(config.keys_dir))


__all__ = ["ReadOnlyLineage"]
