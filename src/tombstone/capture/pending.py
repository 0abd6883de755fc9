"""Finishing the probe captures a process left pending when it ended before its queue drained.

A wrapper write in background mode records, with its lineage rows, that each chunk's probe capture is
pending (``tombstone.capture.deferred``). Tombstone keeps no chunk text, so the fragments can only be
computed again from the text the store itself still holds. A wrapper opened with a lineage db and an embedder
calls :func:`finish` for its store: each pending artifact whose writer is gone (not a live process of this
host, not a job of this process's queue) and whose stored text is still the text its lineage row recorded
(the keyed content hash matches) has its fragments embedded with the wrapper's embedder and recorded, in
the background or, with ``TOMBSTONE_PROBE_CAPTURE=inline``, before the open returns. What cannot be finished
— the store no longer holds the record, holds other text, or holds none — stays pending, and an erasure of
it says its probes are incomplete.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from tombstone.capture import deferred
from tombstone.capture.calls import embed
from tombstone.capture.fragments import probe_queries, query_sha256
from tombstone.capture.vector import content_hash

BATCH = 500
"""Pending artifacts read from the store, and queued, at a time."""


def finish(lineage: Any, store: str, embedder: Callable[[list[str]], Any] | None,
           documents: Callable[[list[str]], Mapping[str, str | None]]) -> int:
    """Finish ``store``'s pending probe captures from the store's text (``documents(ids)`` → the text the
    store holds for each id it still has). Returns how many artifacts' captures were queued (or, inline,
    recorded). Never raises for a store that cannot be read: the captures stay pending."""
    if lineage is None or embedder is None:
        return 0
    try:
        rows = [(aid, ticket) for aid, ticket, who in lineage.pending_captures(store)
                if not deferred.PROBES.holds(ticket) and not deferred.writer_alive(who)]
    except Exception:  # noqa: BLE001 - an older lineage db mid-migration, a closed one: nothing to finish here
        return 0
    inline = deferred.mode() == "inline"
    finished = 0
    for start in range(0, len(rows), BATCH):
        part = rows[start : start + BATCH]
        try:
            texts = documents([aid for aid, _ in part])
        except Exception:  # noqa: BLE001 - the store cannot be read now: the captures stay pending
            return finished
        known = lineage.artifacts_many((store, aid) for aid, _ in part)
        jobs: list[tuple[str, str, str]] = []
        done: list[tuple[str, str, str]] = []
        for aid, ticket in part:
            art, text = known.get((store, aid)), texts.get(aid)
            if art is None or art.state != "live" or not text or art.content_hash is None:
                continue
            if lineage.secret.content_key(content_hash(text, None)) != art.content_hash:
                continue  # the store holds other text than the write recorded: its fragments would not be its own
            fragments = probe_queries(text)
            if fragments:
                jobs += [(store, aid, q) for q in fragments]
                done.append((store, aid, ticket))
        if not done:
            continue
        if inline:
            try:
                vectors = embed(embedder, [q for _, _, q in jobs])
            except Exception as exc:  # noqa: BLE001 - as a write's own capture: only the probes are lost
                warnings.warn(f"probe vectors of {len(done)} chunk(s) in {store} are still missing:"
                              f" {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)
                return finished
            lineage.record_probes([(s, a, query_sha256(q), vectors[k]) for k, (s, a, q) in enumerate(jobs)], done)
        else:
            deferred.PROBES.submit(lineage, embedder, jobs, done)
        finished += len(done)
    return finished


__all__ = ["BATCH", "finish"]
