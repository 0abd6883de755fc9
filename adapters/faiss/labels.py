"""The id -> label map of a loaded FAISS generation (``IdLabels``), kept as the heads files give it: the ids in a
list, their labels and CRC-32s in arrays, no dict of every id until something asks for every pair."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Mapping, MutableMapping

import numpy as np


def _crc(artifact_id: str) -> int:
    return zlib.crc32(artifact_id.encode("utf-8"))


_LOOKUPS_BEFORE_DICT = 50_000
"""Lookups by id after which :class:`IdLabels` makes its dict (a listing or a bulk read asks for every id)."""


class _Materialized(Exception):
    """Raised inside :class:`IdLabels` when a lookup made the dict: the caller looks there instead."""


class IdLabels(MutableMapping):
    """id -> label of a loaded generation, kept as the heads files give it (the ids in a list, their labels and
    CRC-32s in arrays) rather than as a dict of every id: opening a store of a million records builds no such
    dict. An id is found by its CRC (the CRCs sorted once, on the first lookup; the id compared on each
    candidate row). Ids set or removed after the load are kept beside the loaded ones. What needs every pair
    (``items``, ``values``, equality) makes the dict once and uses it from then on; ``label_array`` and
    ``shown`` give the labels and a filtered listing without it."""

    def __init__(self, ids: list[str], labels: np.ndarray, crcs: np.ndarray) -> None:
        self._ids, self._labels, self._crcs = ids, labels, crcs
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        """(row order by CRC, the CRCs in that order), made on the first lookup."""
        self._removed: set[str] = set()
        """Loaded ids removed (or set again, the new label being in ``_added``)."""
        self._added: dict[str, int] = {}
        self._dict: dict[str, int] | None = None
        """Every pair, once something asked for all of them (or for many ids one by one: a listing, a bulk
        read); from then on the only state."""
        self._lookups = 0
        self._found: dict[str, int | None] = {}
        """The loaded row of each id looked up so far (None: not loaded): an erasure asks for the same ids
        several times."""

    def _row(self, key: str) -> int | None:
        if key in self._removed or not isinstance(key, str):
            return None
        if key in self._found:
            return self._found[key]
        self._lookups += 1
        if self._lookups > _LOOKUPS_BEFORE_DICT:
            self._all()
            raise _Materialized
        row = self._found[key] = self._find(key)
        return row

    def _by_crc(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            crcs = self._crcs.astype(np.uint32)  # CRC-32s: 32 bits, which sort several times faster than 64
            order = np.argsort(crcs)
            self._sorted = (order, crcs[order])
        return self._sorted

    def look_up(self, keys: Iterable[str]) -> None:
        """Find the loaded rows of many ids with one sorted search for all of them, for the lookups that follow
        (an erasure asks for each of its ids several times, a batch for thousands). Counted as no lookup: a
        bulk search makes no dict."""
        if self._dict is not None:
            return
        found = self._found
        todo = [k for k in dict.fromkeys(keys) if isinstance(k, str) and k not in found]
        if len(todo) < 8:
            return
        order, crcs = self._by_crc()
        if not len(crcs):
            found.update(dict.fromkeys(todo))
            return
        wanted = np.fromiter((_crc(k) for k in todo), np.uint32, len(todo))
        at = np.minimum(crcs.searchsorted(wanted), len(crcs) - 1)
        rows = np.where(crcs[at] == wanted, order[at], -1).tolist()
        ids = self._ids
        for key, row in zip(todo, rows):
            # the first row with the CRC holds another id only where two ids share a CRC: searched in full
            found[key] = None if row < 0 else row if ids[row] == key else self._find(key)

    def _find(self, key: str) -> int | None:
        """The loaded row holding ``key`` (removed or not), or None."""
        order, crcs = self._by_crc()
        crc = _crc(key)
        at = int(crcs.searchsorted(np.uint32(crc)))  # the same dtype: no copy of the array per call
        while at < len(crcs) and crcs[at] == crc:
            row = int(order[at])
            if self._ids[row] == key:
                return row
            at += 1
        return None

    def _all(self) -> dict[str, int]:
        if self._dict is None:
            pairs = dict(zip(self._ids, self._labels.tolist()))
            for key in self._removed:
                pairs.pop(key, None)
            pairs.update(self._added)
            # The loaded lists stay as they are: a reader in another thread may be halfway through a lookup.
            self._dict = pairs
        return self._dict

    def __getitem__(self, key: str) -> int:
        if self._dict is None:
            if key in self._added:
                return self._added[key]
            try:
                row = self._row(key)
            except _Materialized:
                return self._dict[key]  # type: ignore[index]
            if row is None:
                raise KeyError(key)
            return int(self._labels[row])
        return self._dict[key]

    def __contains__(self, key: object) -> bool:
        if self._dict is None:
            try:
                return key in self._added or self._row(key) is not None  # type: ignore[arg-type]
            except _Materialized:
                pass
        return key in self._dict  # type: ignore[operator]

    def __setitem__(self, key: str, label: int) -> None:
        if self._dict is None:
            try:
                if key not in self._added and self._row(key) is not None:
                    self._removed.add(key)
                self._added[key] = label
                return
            except _Materialized:
                pass
        self._dict[key] = label  # type: ignore[index]

    def __delitem__(self, key: str) -> None:
        if self._dict is None:
            try:
                if key in self._added:
                    del self._added[key]
                elif self._row(key) is not None:
                    self._removed.add(key)
                else:
                    raise KeyError(key)
                return
            except _Materialized:
                pass
        del self._dict[key]  # type: ignore[attr-defined]

    def __iter__(self):
        if self._dict is not None:
            return iter(self._dict)
        loaded = iter(self._ids) if not self._removed else (i for i in self._ids if i not in self._removed)
        return itertools.chain(loaded, list(self._added))

    def __len__(self) -> int:
        if self._dict is not None:
            return len(self._dict)
        return len(self._ids) - len(self._removed) + len(self._added)

    def items(self):
        return self._all().items()

    def values(self):
        return self._all().values()

    def keys(self):
        return self._all().keys() if self._dict is not None else super().keys()

    def __eq__(self, other: object) -> bool:
        return self._all() == (dict(other.items()) if isinstance(other, Mapping) else other)

    __hash__ = None  # type: ignore[assignment]

    def _loaded_shown(self) -> np.ndarray:
        """Which loaded rows are still in the mapping (not removed or set again)."""
        shown = np.ones(len(self._ids), bool)
        if self._removed:
            found = self._found
            rows = [found[key] if key in found else self._find(key) for key in self._removed]
            shown[[row for row in rows if row is not None]] = False
        return shown

    def label_array(self) -> np.ndarray:
        """Every label in the mapping (in no particular order), without the dict."""
        if self._dict is not None:
            return np.fromiter(self._dict.values(), np.int64, len(self._dict))
        added = np.fromiter(self._added.values(), np.int64, len(self._added))
        return np.concatenate([self._labels[self._loaded_shown()], added])

    def shown(self, hidden: set[int]) -> list[str]:
        """The ids whose label is not in ``hidden``, loaded ones first, without the dict."""
        if self._dict is not None:
            return [i for i, label in self._dict.items() if label not in hidden]
        keep = self._loaded_shown() & ~np.isin(self._labels, np.fromiter(hidden, np.int64, len(hidden)))
        return (list(itertools.compress(self._ids, keep.tolist()))
                + [i for i, label in self._added.items() if label not in hidden])

    def pairs(self) -> tuple[list[str], np.ndarray]:
        """Every (id, label), as a list of ids and an array of their labels."""
        if self._dict is not None:
            return list(self._dict), np.fromiter(self._dict.values(), np.int64, len(self._dict))
        shown = self._loaded_shown()
        ids = self._ids if shown.all() else list(itertools.compress(self._ids, shown.tolist()))
        return (ids + list(self._added),
                np.concatenate([self._labels[shown], np.fromiter(self._added.values(), np.int64, len(self._added))]))


def label_array(labels: Mapping[str, int]) -> np.ndarray:
    """The labels of an id -> label mapping, as an array."""
    if isinstance(labels, IdLabels):
        return labels.label_array()
    return np.fromiter(labels.values(), np.int64, len(labels))


def id_label_pairs(labels: Mapping[str, int]) -> tuple[list[str], np.ndarray]:
    if isinstance(labels, IdLabels):
        return labels.pairs()
    return list(labels), np.fromiter(labels.values(), np.int64, len(labels))


__all__ = ["IdLabels", "id_label_pairs", "label_array"]
