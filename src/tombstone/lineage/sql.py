"""Helpers the lineage db's parts share: ids grouped by store and sliced for ``IN (...)``, JSON text for
stored details, and the hook run before probe vectors are read."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

PROBE_READ_HOOKS: list[Callable[[], object]] = []
"""Called before probe vectors are read: ``tombstone.capture.deferred`` registers the wait for this process's
queued probe vectors here (the lineage db knows nothing of capture)."""


def by_store(keys: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(store, id) pairs as each store's distinct ids."""
    out: dict[str, list[str]] = {}
    for store, artifact_id in keys:
        out.setdefault(store, []).append(artifact_id)
    return {store: list(dict.fromkeys(ids)) for store, ids in out.items()}


def json_text(obj: Any) -> str:
    """JSON text of a journal detail or snapshot record, keys sorted (orjson: a batch journals thousands of
    artifacts' results per step; the standard encoder where orjson refuses a value, such as an integer past
    64 bits). A NaN is written as null: a receipt refuses NaN anyway."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    except TypeError:
        return json.dumps(obj, sort_keys=True)


PACKED = "z:"
"""How JSON text kept deflated begins (base64 of its zlib stream after it); JSON text of an object never does."""
PACK_OVER = 2048
"""JSON text longer than this (characters) is kept deflated by ``packed_json_text``."""


def packed(data: bytes) -> bytes:
    """``data`` deflated for keeping (zlib, its fastest level: what is kept restates the same names and
    evidence for every artifact, and shrinks tenfold and more even so)."""
    return zlib.compress(data, 1)


def unpacked(data: bytes) -> bytes:
    """What ``packed`` was given. Data kept before it was deflated is JSON, which begins with ``{``; a zlib
    stream never does."""
    return data if data[:1] == b"{" else zlib.decompress(data)


def packed_json_text(obj: Any) -> str:
    """``json_text`` of ``obj``, or, past ``PACK_OVER`` characters, that text deflated and in base64 after
    ``PACKED``: still text, so the column is the same in SQLite and PostgreSQL. For the saga journal's long
    details (a verify step's results restate the same names and evidence for every artifact, about 100 KB a
    subject in a batch, and shrink about tenfold)."""
    text = json_text(obj)
    if len(text) <= PACK_OVER:
        return text
    return PACKED + base64.b64encode(packed(text.encode("utf-8"))).decode("ascii")


def unpacked_json_text(text: str) -> str:
    """The JSON text ``packed_json_text`` was given (a row written before long texts were deflated holds the JSON
    itself)."""
    if text.startswith(PACKED):
        return unpacked(base64.b64decode(text[len(PACKED):])).decode("utf-8")
    return text


def parts(values: list, size: int = 500) -> Iterator[list]:
    """``values`` in slices of at most ``size``: the parameters of one ``IN (...)`` each."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def for_ids(conn: Any, sql: str, keys: Iterable[tuple[str, str]], head: tuple[Any, ...] = ()) -> None:
    """Run ``sql`` once per store and slice of its ids, rather than once per (store, id) pair: its parameters
    are ``head``, the store, then the slice's ids, which ``{ids}`` in ``sql`` stands for (``?, ?, ...``)."""
    for store, ids in by_store(keys).items():
        for part in parts(ids):
            conn.execute(sql.format(ids=",".join("?" * len(part))), (*head, store, *part))


def before_probe_reads() -> None:
    for hook in PROBE_READ_HOOKS:
        hook()
