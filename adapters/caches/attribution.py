"""Who a cached answer belongs to and what it was built from.

LangChain calls a cache's ``update(prompt, llm_string, return_val)`` with nothing about the user or the
retrieved chunks, so the app says it around the call::

    with attribution(subject="alice", sources=[("chunks", "alice-chunk-0001")]):
        answer = llm.invoke(prompt)      # the cache records lineage for what it stores here
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

UNATTRIBUTED = "__unattributed__"


@dataclass(frozen=True)
class Attribution:
    subject: str
    """The subject the answer is for."""
    sources: tuple[tuple[str, str], ...] = ()
    """(store, artifact id) of every retrieved chunk the answer was built from."""


_current: contextvars.ContextVar[Attribution | None] = contextvars.ContextVar("tombstone_attribution", default=None)


@contextlib.contextmanager
def attribution(subject: str, sources: Sequence[tuple[str, str]] = ()) -> Iterator[Attribution]:
    value = Attribution(subject, tuple((s, i) for s, i in sources))
    token = _current.set(value)
    try:
        yield value
    finally:
        _current.reset(token)


def current() -> Attribution:
    """The attribution in force; without one, entries are recorded unattributed (reachable only through
    their sources, and a lineage gap if they have none)."""
    return _current.get() or Attribution(UNATTRIBUTED)
