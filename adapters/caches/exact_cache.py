"""Exact LLM cache: LangChain's SQLite cache, wrapped.

``TombstoneSQLiteCache`` is a ``langchain_community`` ``SQLAlchemyCache`` on SQLite whose table carries
one more column, ``entry_id``: the artifact id of each cached answer. The prompt — the cache key — is
user content and never reaches the lineage db; the entry id stands for it, lives in the same row, and
leaves with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_community.cache import SQLAlchemyCache
from langchain_core.load.dump import dumps
from sqlalchemy import Column, Integer, String, create_engine
from sqlalchemy.orm import Session, declarative_base

from tombstone.capture.writes import check_write
from tombstone.fsutil import create_private
from tombstone.lineage.db import ArtifactRecord, LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

from .attribution import current

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
