"""``TombstoneRecordManager``: LangChain's indexing ``RecordManager``, keeping its records in the lineage db.

``langchain_core.indexing.index()`` asks a record manager which documents it already wrote and, with
``cleanup="incremental"``, ``"scoped_full"`` or ``"full"``, which it must delete: those of a source that the
latest run no longer produced (an updated document's old chunks), or every one the run did not see. It
deletes them through the vector store's ``delete``; given a ``TombstoneVectorStore``, that is an erasure —
suppress → reclaim → verify — with one signed receipt per source (``tombstone.source-erasure-receipt``,
its subject ``source:<source id>``). This record manager tells the vector store the source of each record,
so the grouping holds even when ``source_id_key`` is a function rather than a metadata key.

The records (key, source, time) live in the lineage db's ``index_records`` table: on the same SQLite file
or PostgreSQL database as the lineage they belong with. Sources are stored keyed and sealed with the
lineage secret, as subjects are. Times are this machine's clock (``time.time()``), as LangChain's
in-memory record manager's; run one indexer per namespace at a time.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.indexing import RecordManager


class TombstoneRecordManager(RecordManager):
    """Records of the ``namespace`` (one per index: e.g. ``"chroma/kb-chunks"``) in the lineage db of
    ``vector_store`` (a ``TombstoneVectorStore``), which it tells each deleted record's source."""

    def __init__(self, namespace: str, vector_store: Any) -> None:
        super().__init__(namespace)
        lineage = getattr(getattr(vector_store, "binding", None), "lineage", None)
        if lineage is None:
            raise ValueError("TombstoneRecordManager needs a TombstoneVectorStore whose wrapper has a lineage db")
        self.lineage = lineage
        self.vector_store = vector_store
        vector_store.record_manager = self
        self._last = 0.0

    def create_schema(self) -> None:
        """Nothing to do: the lineage db's migrations created the table."""

    async def acreate_schema(self) -> None:
        self.create_schema()

    def get_time(self) -> float:
        now = time.time()
        self._last = max(now, self._last)
        return self._last

    async def aget_time(self) -> float:
        return self.get_time()

    def update(self, keys: Sequence[str], *, group_ids: Sequence[str | None] | None = None,
               time_at_least: float | None = None) -> None:
        if group_ids is not None and len(group_ids) != len(keys):
            raise ValueError("Length of keys must match length of group_ids")
        now = self.get_time()
        if time_at_least is not None and time_at_least > now:
            raise ValueError(f"time_at_least ({time_at_least}) is in the future of this clock ({now})")
        groups = list(group_ids) if group_ids is not None else [None] * len(keys)
        self.lineage.index_update(self.namespace, list(keys), [None if g is None else str(g) for g in groups], now)

    async def aupdate(self, keys: Sequence[str], *, group_ids: Sequence[str | None] | None = None,
                      time_at_least: float | None = None) -> None:
        self.update(keys, group_ids=group_ids, time_at_least=time_at_least)

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return self.lineage.index_exists(self.namespace, list(keys))

    async def aexists(self, keys: Sequence[str]) -> list[bool]:
        return self.exists(keys)

    def list_keys(self, *, before: float | None = None, after: float | None = None,
                  group_ids: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
        return self.lineage.index_keys(self.namespace, before=before, after=after,
                                       groups=None if group_ids is None else [str(g) for g in group_ids],
                                       limit=limit)

    async def alist_keys(self, *, before: float | None = None, after: float | None = None,
                         group_ids: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
        return self.list_keys(before=before, after=after, group_ids=group_ids, limit=limit)

    def delete_keys(self, keys: Sequence[str]) -> None:
        self.lineage.index_delete(self.namespace, list(keys))

    async def adelete_keys(self, keys: Sequence[str]) -> None:
        self.delete_keys(keys)

    def key_encoder(self, document: Document) -> str:
        """A document's key for ``index(..., key_encoder=record_manager.key_encoder)``: deterministic, as
        ``index()`` needs, but keyed with the lineage secret. LangChain's own encoders (SHA-1 by default)
        hash content and metadata in the clear, and the key becomes the record's id in the store, the lineage
        db and every receipt: anyone holding one could confirm a guessed text. With this one only the holder
        of the lineage secret can."""
        data = json.dumps([document.page_content, document.metadata], sort_keys=True, ensure_ascii=False, default=str)
        digest = hashlib.sha256(b"tombstone-index-key\x00" + data.encode("utf-8")).hexdigest()
        return "doc-" + self.lineage.secret.content_key(digest)[:48]

    def sources_of(self, keys: Sequence[str]) -> dict[str, str | None]:
        """The source (group id) each key was recorded with; keys without a record are left out."""
        return self.lineage.index_groups(self.namespace, list(keys))


__all__ = ["TombstoneRecordManager"]
