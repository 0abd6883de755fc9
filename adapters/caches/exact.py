"""Exact LLM cache: LangChain's SQLite cache, wrapped.

``TombstoneSQLiteCache`` is a ``langchain_community`` ``SQLAlchemyCache`` on SQLite whose table carries
one more column, ``entry_id``: the artifact id of each cached answer. The prompt — the cache key — is
user content and never reaches the lineage db; the entry id stands for it, lives in the same row, and
leaves with it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_community.cache import SQLAlchemyCache
from langchain_core.load.dump import dumps
from sqlalchemy import Column, Integer, String, create_engine
from sqlalchemy.orm import Session, declarative_base

from tombstone.capture.writes import check_write
from tombstone.faults import kill_point
from tombstone.fsutil import Snapshot, create_private
from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError, TombstoneError
from tombstone.lineage.db import ArtifactRecord, LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for
from tombstone.verify.levels import Level
from tombstone.verify.scanner import check_regular

from .attribution import current
from .hooks import ExactCacheHooks

BACKEND = "exact_cache"
TABLE = "tombstone_llm_cache"
_Base = declarative_base()


class TombstoneLLMCacheRow(_Base):  # type: ignore[misc,valid-type]
    """LangChain's FullLLMCache columns, plus the entry's artifact id."""

    __tablename__ = TABLE
    prompt = Column(String, primary_key=True)
    llm = Column(String, primary_key=True)
    idx = Column(Integer, primary_key=True)
    response = Column(String)
    entry_id = Column(String, index=True)


def entry_id(prompt: str, llm_string: str) -> str:
    return "llmcache-" + hashlib.sha256(f"{prompt}\x00{llm_string}".encode()).hexdigest()[:32]


class TombstoneSQLiteCache(SQLAlchemyCache):
    """Set it with ``langchain_core.globals.set_llm_cache``; wrap LLM calls in ``attribution(...)``.

    ``update`` holds the store's lock (``<file>.tombstone.lock``; ``tombstone.storelock``), waiting at
    most ``lock_wait`` seconds while an erasure changes or probes the file.

    The cache holds prompts and answers: a database file it creates is mode 0600 (its journal files take
    that mode), the folders it creates for it 0700; a file or folder already there keeps its mode."""

    def __init__(self, database_path: str | Path, *, lineage: LineageDB | None = None, store: str = BACKEND,
                 lock_wait: float = STORE_LOCK_WAIT) -> None:
        if str(database_path) not in ("", ":memory:"):
            create_private(Path(database_path))  # before SQLite opens it
        super().__init__(create_engine(f"sqlite:///{database_path}"), cache_schema=TombstoneLLMCacheRow)
        self.lineage, self.store = lineage, store
        self.lock = StoreLock(lock_file_for(database_path), wait=lock_wait, store=store)

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Any]) -> None:
        eid = entry_id(prompt, llm_string)
        if self.lineage is not None:
            who = current()
            check_write(self.lineage, self.store, [who.subject])
            # Lineage first: assume the cache write will fail.
            self.lineage.record_artifacts(
                who.subject,
                [ArtifactRecord(store=self.store, artifact_id=eid, backend=BACKEND, kind="cache_entry",
                                content_hash=hashlib.sha256(f"{prompt}\x00{llm_string}".encode()).hexdigest())],
                edges=[(s, i, self.store, eid, "answer_built_from") for s, i in who.sources],
            )
        rows = [TombstoneLLMCacheRow(prompt=prompt, llm=llm_string, response=dumps(gen), idx=i, entry_id=eid)
                for i, gen in enumerate(return_val)]
        with self.lock, Session(self.engine) as session, session.begin():
            for row in rows:
                session.merge(row)

    def lookup(self, prompt: str, llm_string: str) -> list[Any] | None:
        """The cached generations, read back as what was stored: LangChain's own ``loads``, limited to its
        core classes (generations, messages) and quiet about being in beta — under warnings-as-errors the
        parent's lookup would hand back the serialised JSON as the answer's text."""
        import warnings

        from langchain_core._api import LangChainBetaWarning
        from langchain_core.load import loads
        from sqlalchemy import select

        stmt = (select(TombstoneLLMCacheRow.response).where(TombstoneLLMCacheRow.prompt == prompt)
                .where(TombstoneLLMCacheRow.llm == llm_string).order_by(TombstoneLLMCacheRow.idx))
        with Session(self.engine) as session:
            rows = session.execute(stmt).fetchall()
        if not rows:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LangChainBetaWarning)
            return [loads(row[0], allowed_objects="core") for row in rows]

    # LangChain's async callers would run these in a thread pool; the lineage db's connection belongs to the
    # thread that opened it, so they run here, on the caller's thread.
    async def alookup(self, prompt: str, llm_string: str) -> list[Any] | None:
        return self.lookup(prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: Sequence[Any]) -> None:
        self.update(prompt, llm_string, return_val)


class ExactCacheAdapter(ExactCacheHooks, Adapter):
    """Options: ``path`` (the SQLite file), ``secure_delete`` (bool, optional)."""

    backend = BACKEND
    capabilities = frozenset({Capability.IMMEDIATE_DELETE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                              Capability.PHYSICAL_SCAN})
    levels = (Level.LOGICAL, Level.PHYSICAL)
    read_only_supported = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        self.path = Path(options["path"])
        if not self.path.is_file():
            raise StoreUnavailableError(f"no cache database at {self.path}", store=store, retryable=False)
        try:
            check_regular(self.physical_files())  # SQLite would block forever on a FIFO at -journal
        except TombstoneError as exc:
            raise StoreUnavailableError(f"cannot open cache database {self.path}: {exc}", store=store,
                                        retryable=False) from exc
        self._snapshot: Snapshot | None = None
        database = self.path
        if self.read_only:
            # A mode=ro connection to a WAL database still creates its -wal and -shm files: read-only, the
            # logical probe reads a private copy; the physical probe reads the originals.
            self._snapshot = Snapshot(prefix="tombstone-exact-cache-")
            database = self._snapshot.copy_files(self.physical_files()) / self.path.name
        self.conn = sqlite3.connect(database, isolation_level=None, timeout=30)
        if options.get("secure_delete") is not None:
            self.conn.execute(f"PRAGMA secure_delete={'ON' if options['secure_delete'] else 'OFF'}")

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """SQLite's errors, and OSError from the database file itself."""
        return (sqlite3.Error, OSError)

    def close(self) -> None:
        self.conn.close()
        if self._snapshot is not None:
            self._snapshot.close()

    def lock_path(self) -> Path:
        """The SQLite file: its lock file is ``<file>.tombstone.lock``, the one the cache's updates take."""
        return self.path

    def _ids(self, artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def _delete(self, ids: list[str]) -> int:
        return sum(self.conn.execute(f"DELETE FROM {TABLE} WHERE entry_id = ?", (i,)).rowcount for i in ids)

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        # A cache has no hide state: suppression is deletion, and a miss only costs a recomputation.
        return {"mechanism": "row deleted at suppression (a cache has no hide state)",
                "rows_deleted": self._delete(self._ids(artifacts))}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self._delete(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        deleted = self._delete(self._ids(artifacts))
        kill_point("reclaim:exact_cache:after-delete")
        mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.execute("VACUUM")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": ["DELETE (again, idempotent)", "VACUUM"], "rows_deleted": deleted, "journal_mode": mode,
                "secure_delete": bool(self.conn.execute("PRAGMA secure_delete").fetchone()[0])}

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        results = {}
        for art in artifacts:
            hit = self.conn.execute(f"SELECT count(*) FROM {TABLE} WHERE entry_id = ?", (art.artifact_id,)).fetchone()[0]
            results[art.artifact_id] = ProbeResult(
                level=Level.LOGICAL, passed=not hit, measurement=f"{hit} cached generation(s) still stored" if hit else None,
                evidence={"paths": ["select by entry_id"],
                          "note": "a lookup needs the prompt, which Tombstone never keeps; the entry id stands for it"})
        return results

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Free pages, freeblocks and unallocated page space of the cache's SQLite file (``forensics``)."""
        from .forensics import scan_exact_cache

        return scan_exact_cache(store, cls.backend, TABLE, options)

    def physical_root(self) -> Path:
        """The folder holding the cache database: every other file in it and below it is read as bytes too,
        but for what a Tombstone deployment keeps there (``verify.physical.deployment_owned``)."""
        return self.path.parent

    def physical_files(self) -> list[Path]:
        if not os.access(self.path, os.R_OK):
            raise PhysicalUnsupportedError(f"cache database {self.path} is not readable", store=self.store)
        return [self.path] + [Path(f"{self.path}{s}") for s in ("-wal", "-journal", "-shm")]
