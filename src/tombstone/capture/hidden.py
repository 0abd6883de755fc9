"""What a wrapper must not return: a store's suppressed ids that reclaim has not yet removed.

Read from the lineage db — shared by every process of the deployment — and cached until the store's
suppression generation changes, which costs one indexed single-row read per call, and on a SQLite lineage db
not even that while no process has committed anything to it since the last call (its wal-index header is
unchanged: :mod:`tombstone.lineage.walstamp`). With nothing
suppressed the set is empty and a wrapper's query is the store's own call; otherwise the wrapper drops the
hidden ids from the store's results and asks for as many more as it dropped (Chroma and FAISS first ask for
``k`` and search again only a query whose results held a hidden id; Qdrant asks for ``k + len(hidden)``),
instead of making the store evaluate a metadata filter over the whole collection on every query.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any

_threads = threading.local()


def _this_threads(lineage: Any) -> Any:
    """A connection of the current thread's own to the same SQLite lineage db, opened once per thread.

    A SQLite connection belongs to the thread that opened it, and apps read from others: LangChain runs a
    chain's retriever in a worker thread, a web server serves requests from a pool."""
    opened = getattr(_threads, "dbs", None)
    if opened is None:
        opened = _threads.dbs = {}
    db = opened.get(id(lineage))
    if db is None or db[0] is not lineage:
        from tombstone.lineage.db import LineageDB

        db = opened[id(lineage)] = (lineage, LineageDB(lineage.path, lineage.secret, clock=lineage.clock))
    return db[1]


class HiddenIds:
    """The ids suppressed in one store and not yet reclaimed, as of the last call."""

    def __init__(self, lineage: Any, store: str) -> None:
        self.lineage = lineage
        self.store = store
        self._generation = -1
        self._ids: frozenset[str] = frozenset()
        self._stamp: bytes | None = None
        """The lineage db's commit stamp read before the generation was: while it is unchanged, nothing was
        committed since, and the set stands without a read."""

    def current(self) -> frozenset[str]:
        try:
            return self._current(self.lineage)
        except sqlite3.ProgrammingError:
            if getattr(self.lineage, "path", None) is None:
                raise
            # read from another thread than the one that opened the db
            return self._current(_this_threads(self.lineage))

    def _current(self, lineage: Any) -> frozenset[str]:
        stamp = _stamp(lineage)
        if stamp is not None and stamp == self._stamp:
            return self._ids
        generation = lineage.suppression_generation(self.store)
        if generation != self._generation:
            self._ids = frozenset(lineage.hidden_ids(self.store))
            self._generation = generation
        self._stamp = stamp
        return self._ids


def _stamp(lineage: Any) -> bytes | None:
    read = getattr(lineage, "commit_stamp", None)
    return read() if read is not None else None


class FixedHidden:
    """A hidden set known in advance (what a verifier read from the store's own flag), with the
    :class:`HiddenIds` interface, for a wrapper opened without the lineage db."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._ids = frozenset(ids)

    def current(self) -> frozenset[str]:
        return self._ids


def keep_positions(ids: Sequence[Any], hidden: frozenset[str], limit: int | None = None) -> list[int]:
    """Positions of the ids that are not hidden, at most ``limit`` of them, in order."""
    out = [i for i, value in enumerate(ids) if str(value) not in hidden]
    return out if limit is None else out[:limit]


def suppressed_among(lineage: Any, store: str, ids: Sequence[Any]) -> set[str]:
    """Which of ``ids`` an erasure has suppressed in ``store`` and not yet finished with (the durable
    suppression record, written before the store is touched, cleared once the record is gone). A wrapper
    writing one of them writes it hidden: a re-upsert during an erasure never clears its suppression.
    Call it under the store's lock, so that a suppression recorded after the call flags the write."""
    if lineage is None or not ids:
        return set()
    hidden = lineage.hidden_ids(store)
    return {str(i) for i in ids if str(i) in hidden}


__all__ = ["HiddenIds", "keep_positions", "suppressed_among"]
