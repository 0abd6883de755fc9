"""A survivor census for fault tests: what every record of a store is before a fault, and which of them
are lost, changed or no longer found by a search afterwards.

Records are read with each backend's own client (``Adapter.read_survivors``, as the crash harness does), not
through Tombstone's wrappers or probes (a LoRA store's are its shards' trained examples, with the SHA-256 of
the weights file that serves them). Each record becomes an :class:`Entry`: a digest of what it holds (text,
metadata, payload, weights) and its vector where the store keeps one.

    before = census(config_path)
    ...                                   # the fault, the erasure, the recovery
    problems = compare(before, census(config_path), erased)   # erased: {(store, artifact id)}
    problems += unsearchable(config_path, census(config_path))  # each survivor's own vector finds it

``compare`` and ``unsearchable`` return one line per problem; an empty list means no survivor was lost.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.config import load_config
from tombstone.contract import adapter_class

VECTOR_TOLERANCE = 1e-6
"""Largest absolute difference allowed per vector component: Chroma re-normalises on every indexing, so a
rewrite may move a component by a float32 ULP or two; anything more is a changed vector."""


@dataclass(frozen=True)
class Entry:
    digest: str
    vector: tuple[float, ...] | None = None


Census = dict[str, dict[str, Entry]]
"""store name → record id → entry."""


def _digest(value: Any) -> str:
    """Of the value's JSON with sorted keys: a record read back with its metadata's keys in another order is
    the same record."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode("utf-8")).hexdigest()


def store_entries(backend: str, options: Mapping[str, Any]) -> dict[str, Entry]:
    """Every record of one store, read with the vendor's client (``Adapter.read_survivors``): either records,
    vectors and a top-3 (the vector stores' form) or rows whose first field is the id (a vector, when the row
    holds one, is a tuple of floats)."""
    cls = adapter_class(backend)
    try:
        raw = cls.read_survivors(options)
    finally:
        cls.release(options)
    if isinstance(raw, tuple) and len(raw) == 3 and isinstance(raw[0], dict):  # records, vectors, top-3
        records, vectors, _top = raw
        return {str(i): Entry(_digest(records[i]), tuple(float(x) for x in np.asarray(vectors[i]).ravel()))
                for i in records}
    out = {}
    for row in raw:  # (id, field, ...) rows; a vector, when kept, is a tuple of floats
        vector = next((tuple(map(float, f)) for f in row[1:] if isinstance(f, tuple)), None)
        out[str(row[0])] = Entry(_digest(row[1:]), vector)
    return out


def census(config_path: str | Path, stores: Iterable[str] | None = None) -> Census:
    """The records of ``stores`` (default: every store of the deployment)."""
    config = load_config(config_path)
    names = sorted(config.stores) if stores is None else list(stores)
    return {name: store_entries(config.stores[name].backend, config.stores[name].options) for name in names}


def compare(before: Census, after: Census, erased: Iterable[tuple[str, str]]) -> list[str]:
    """One line per survivor (a record of ``before`` that is not in ``erased``) missing from ``after`` or
    changed in it. A survivor whose content was the same as an erased record's (the shard and weights file of
    a LoRA shard that the erasure retrains without the subject) is checked for presence only."""
    gone = set(erased)
    problems = []
    for store, entries in before.items():
        now = after.get(store, {})
        shared = {e.digest for i, e in entries.items() if (store, i) in gone}
        for rid, entry in sorted(entries.items()):
            if (store, rid) in gone:
                continue
            if rid not in now:
                problems.append(f"{store}/{rid}: lost")
                continue
            if entry.digest in shared:
                continue
            if entry.digest != now[rid].digest:
                problems.append(f"{store}/{rid}: content changed")
            elif entry.vector is not None and not _close(entry.vector, now[rid].vector):
                problems.append(f"{store}/{rid}: vector changed")
    return problems


def _close(a: tuple[float, ...], b: tuple[float, ...] | None) -> bool:
    return b is not None and len(a) == len(b) and bool(np.max(np.abs(np.subtract(a, b)), initial=0.0)
                                                         <= VECTOR_TOLERANCE)


def unsearchable(config_path: str | Path, current: Census, k: int = 3) -> list[str]:
    """One line per record with a vector that a search with its own vector does not return in the top ``k``
    (through the adapter opened read-only: the store's own index)."""
    config = load_config(config_path)
    problems = []
    for store, entries in current.items():
        with_vectors = {i: e.vector for i, e in entries.items() if e.vector is not None}
        if not with_vectors:
            continue
        cfg = config.stores[store]
        cls = adapter_class(cfg.backend)
        adapter = cls.open_read_only(store, cfg.options)
        try:
            ids = sorted(with_vectors)
            found = adapter.semantic_neighbours(np.asarray([with_vectors[i] for i in ids], dtype=np.float32), k)
            problems += [f"{store}/{i}: not found by a search with its own vector"
                         for i, hits in zip(ids, found) if i not in hits.ids]
        finally:
            adapter.close()
            cls.release(cfg.options)
    return problems


def count(current: Census) -> int:
    return sum(len(entries) for entries in current.values())


__all__ = ["Census", "Entry", "census", "compare", "count", "store_entries", "unsearchable"]
