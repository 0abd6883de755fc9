"""What a wrapper must not return: a store's suppressed ids that reclaim has not yet removed.

Read from the lineage db — shared by every process of the deployment — and cached until the store's
suppression generation changes, which costs one indexed single-row read per call. With nothing
suppressed the set is empty and a wrapper's query is the store's own call; otherwise the wrapper asks for
``k + len(hidden)`` results and drops the hidden ids (``post_filter``), instead of making the store
evaluate a metadata filter over the whole collection on every query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class HiddenIds:
    """The ids suppressed in one store and not yet reclaimed, as of the last call."""

    def __init__(self, lineage: Any, store: str) -> None:
        self.lineage = lineage
        self.store = store
        self._generation = -1
        self._ids: frozenset[str] = frozenset()

    def current(self) -> frozenset[str]:
        generation = self.lineage.suppression_generation(self.store)
        if generation != self._generation:
            self._ids = frozenset(self.lineage.hidden_ids(self.store))
            self._generation = generation
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
