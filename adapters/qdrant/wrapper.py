"""The Qdrant (local mode) collection wrapper apps write and read through.

Qdrant point ids must be integers or UUIDs, so the wrapper gives each artifact the point id
``uuid5(NAMESPACE, artifact_id)`` and keeps the artifact id in the payload (``tombstone_id``).
Every read path — ``query_points``/``search``, ``scroll``, ``retrieve``, ``count`` — hides what an
erasure has suppressed and not yet reclaimed. The set of those ids comes from the lineage db
(``tombstone.capture.hidden``): with nothing suppressed a read is the client's own call, with no
``must_not`` condition for the store to evaluate over the whole collection; while something is, searches ask
for that many more points and drop the hidden ones, and every result is post-filtered on the in-store flag
too. A paginated ``scroll`` or a ``count`` while something is hidden, and a wrapper without a lineage db,
filter on the flag inside the store.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from qdrant_client import models

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture import deferred, pending
from tombstone.capture.vector import Embedder, embed, vectors_for_write
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT

from .local import adopt, current, held

BACKEND = "qdrant"
REWRITE_SUFFIX = "-tombstone-rewrite"
"""A collection being rewritten by a reclaim or compact carries the store's name with this suffix."""
MARKER = ".tombstone-rewrite.json"
"""The file, in the store's folder, that names a rewrite under way (for resume)."""
SUPPRESSED = "tombstone_suppressed"
ID_KEY = "tombstone_id"
DOCUMENT_KEY = "document"
NAMESPACE = uuid.UUID("3d6f0a57-2b8e-4c1e-9a43-7d5b0c2e9f14")


def point_id(artifact_id: str) -> str:
    """The Qdrant point id of an artifact."""
    return str(uuid.uuid5(NAMESPACE, artifact_id))


def hidden() -> models.FieldCondition:
    return models.FieldCondition(key=SUPPRESSED, match=models.MatchValue(value=True))


def merge_filter(caller: models.Filter | None) -> models.Filter:
    """The caller's filter with ``must_not: suppressed = true`` added (points without the flag pass)."""
    if caller is None:
        return models.Filter(must_not=[hidden()])
    merged = caller.model_copy(deep=True)
    merged.must_not = list(merged.must_not or []) + [hidden()]
    return merged


def _visible(payload: dict | None) -> bool:
    return not (payload or {}).get(SUPPRESSED)


class TombstoneQdrant:
    """A Qdrant collection, wrapped. ``lineage=None`` gives a read-only view (no capture).

    On a local-mode directory, writes hold the directory's lock (``<directory>.tombstone.lock``, see
    ``tombstone_adapters.qdrant.local``), waiting at most ``lock_wait`` seconds while an erasure in
    another process has the directory; the client becomes the process's shared one (``local_client``),
    and is closed and opened again when another process takes a turn, so go through the wrapper (or
    ``local_client``) rather than keeping the client object."""

    def __init__(self, client: Any, collection: str, *, lineage: LineageDB | None, store: str,
                 embedder: Embedder | None = None, lock_wait: float = STORE_LOCK_WAIT, hidden: Any = None,
                 point_of: Callable[[str], str] = point_id) -> None:
        self._given, self.collection = client, collection
        self.point_of = point_of
        self.lineage, self.store, self.embedder = lineage, store, embedder
        self.path = adopt(client)
        self.lock_wait = lock_wait
        self.hidden = hidden if hidden is not None else HiddenIds(lineage, store) if lineage is not None else None
        """Ids suppressed and not yet reclaimed: from the lineage db, or ``hidden`` (anything with
        ``current() -> frozenset``); None: no lineage db, the in-store flag decides on every read (a payload
        filter local mode evaluates over every point)."""
        # probe captures a writer that died left pending: finished from the documents the payloads hold
        pending.finish(lineage, store, embedder, self._stored_documents)

    def _stored_documents(self, ids: list[str]) -> dict[str, Any]:
        """The documents the collection's payloads hold for these ids (those it has)."""
        by_point = {self.point_of(i): i for i in ids}
        points = self._run(lambda client: client.retrieve(self.collection, ids=list(by_point), with_payload=True))
        return {by_point[str(p.id)]: (p.payload or {}).get(DOCUMENT_KEY) for p in points if str(p.id) in by_point}

    @property
    def client(self) -> Any:
        """The client: for a local-mode directory, the process's open one (taking a turn if need be)."""
        return self._run(lambda client: client)

    def _run(self, act: Callable[[Any], Any], *, write: bool = False) -> Any:
        if self.path is None:
            return act(self._given)
        if not write:
            client = current(self.path)
            if client is not None:  # open here, so no other process has the directory
                return act(client)
        with held(self.path, wait=self.lock_wait, store=self.store) as client:
            return act(client)

    # -- writes -------------------------------------------------------------------------------

    @deferred.after_write
    def upsert(self, ids: Sequence[str], documents=None, payloads=None, vectors=None, *, subject) -> None:
        """Write points for ``subject``; ``ids`` are artifact ids (strings)."""
        if self.lineage is None or self.embedder is None:
            raise ValueError("this wrapper was opened read-only (no lineage db or embedder)")
        ids = [str(i) for i in ids]
        vectors = vectors_for_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                                    documents=documents, embeddings=vectors, subject=subject)
        docs = list(documents) if documents is not None else [None] * len(ids)
        extra = list(payloads) if payloads is not None else [None] * len(ids)
        points = []
        for aid, vec, doc, more in zip(ids, vectors, docs, extra):
            payload = {k: v for k, v in (more or {}).items() if k != SUPPRESSED}
            payload[ID_KEY] = aid
            if doc is not None:
                payload[DOCUMENT_KEY] = doc
            points.append(models.PointStruct(id=self.point_of(aid), vector=vec.tolist(), payload=payload))

        def write(client: Any) -> Any:
            # Under the store's lock: an id an erasure has suppressed is written hidden (an upsert replaces
            # the whole payload, flag included), so writing it again never clears its suppression.
            hidden = suppressed_among(self.lineage, self.store, ids)
            for point in points:
                if point.payload[ID_KEY] in hidden:
                    point.payload[SUPPRESSED] = True
            return client.upsert(self.collection, points=points)

        self._run(write, write=True)

    # -- reads (every one hides suppressed points) --------------------------------------------

    def _hidden_now(self) -> frozenset[str] | None:
        return self.hidden.current() if self.hidden is not None else None

    def _shown(self, points: Sequence[Any], hidden: frozenset[str] | None, limit: int | None = None) -> list[Any]:
        out = [p for p in points if _visible(p.payload) and not (hidden and (p.payload or {}).get(ID_KEY) in hidden)]
        return out if limit is None else out[:limit]

    def query_points(self, query=None, *, query_text: str | None = None, limit: int = 10,
                     query_filter: models.Filter | None = None, **kwargs) -> list[models.ScoredPoint]:
        if query_text is not None:
            query = embed(self.embedder, [query_text])[0].tolist()
        kwargs["with_payload"] = True
        hidden = self._hidden_now()
        if hidden is None:
            result = self._run(lambda client: client.query_points(
                self.collection, query=query, limit=limit, query_filter=merge_filter(query_filter), **kwargs))
            return self._shown(result.points, None)
        # Asked for the limit plus twice the hidden points expected among them (the hidden share of the
        # collection), and again for the limit plus every hidden id only when that left the answer short: each
        # point asked for is built with its payload, which for thousands of hidden ids cost more than the search.
        first = self._first_ask(limit, hidden)
        result = self._run(lambda client: client.query_points(
            self.collection, query=query, limit=first, query_filter=query_filter, **kwargs))
        shown = self._shown(result.points, hidden, limit)
        if len(shown) < limit and len(result.points) == first and first < limit + len(hidden):
            result = self._run(lambda client: client.query_points(
                self.collection, query=query, limit=limit + len(hidden), query_filter=query_filter, **kwargs))
            shown = self._shown(result.points, hidden, limit)
        return shown

    search = query_points

    def _first_ask(self, limit: int, hidden: frozenset[str]) -> int:
        """``limit`` plus twice the hidden points expected among them, at least one more; the collection is
        counted once per hidden set."""
        if not hidden:
            return limit
        if getattr(self, "_count_for", None) is not hidden:
            total = self._run(lambda client: client.count(self.collection, exact=True).count)
            self._count_for, self._count = hidden, max(1, int(total))
        return limit + max(1, math.ceil(2 * limit * min(1.0, len(hidden) / self._count)))

    def scroll(self, scroll_filter: models.Filter | None = None, limit: int = 10, offset=None, **kwargs):
        kwargs["with_payload"] = True
        hidden = self._hidden_now()
        # pages stay exact only if the store skips hidden points itself: filter inside while any is hidden
        flt = scroll_filter if hidden == frozenset() else merge_filter(scroll_filter)
        points, next_offset = self._run(lambda client: client.scroll(
            self.collection, scroll_filter=flt, limit=limit, offset=offset, **kwargs))
        return self._shown(points, hidden), next_offset

    def retrieve(self, ids: Sequence[str], **kwargs) -> list[models.Record]:
        """Points by artifact id."""
        kwargs["with_payload"] = True
        hidden = self._hidden_now()
        ids = [i for i in ids if not (hidden and str(i) in hidden)]
        if not ids:
            return []
        points = self._run(lambda client: client.retrieve(self.collection, ids=[self.point_of(i) for i in ids], **kwargs))
        return self._shown(points, hidden)

    def count(self, count_filter: models.Filter | None = None) -> int:
        hidden = self._hidden_now()
        flt = count_filter if hidden == frozenset() and not self._any_flagged() else merge_filter(count_filter)
        return self._run(lambda client: client.count(self.collection, count_filter=flt, exact=True).count)

    def _any_flagged(self) -> bool:
        """Whether any point carries the in-store flag (one indexed-or-not lookup of a single point)."""
        points, _ = self._run(lambda client: client.scroll(
            self.collection, scroll_filter=models.Filter(must=[hidden()]), limit=1, with_payload=False))
        return bool(points)

    def all_ids(self) -> list[str]:
        out, offset = [], None
        while True:
            points, offset = self.scroll(limit=1000, offset=offset)
            out += [p.payload[ID_KEY] for p in points if p.payload and ID_KEY in p.payload]
            if offset is None:
                return out
