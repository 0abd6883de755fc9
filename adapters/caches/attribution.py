"""Who a cached answer belongs to and what it was built from.

LangChain calls a cache's ``update(prompt, llm_string, return_val)`` with nothing about the user or the
retrieved chunks, so the app says it around the call::

    with attribution(subject="alice", sources=[("chunks", "alice-chunk-0001")]):
        answer = llm.invoke(prompt)      # the cache records lineage for what it stores here

Retrievers of ``tombstone_adapters.langchain`` add what they return to the attribution in force
(:func:`add_sources`), so a chain run inside ``attribution("alice")`` records its cached answer as built
from the chunks it retrieved.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

UNATTRIBUTED = "__unattributed__"


@dataclass
class Attribution:
    subject: str
    """The subject the answer is for."""
    sources: tuple[tuple[str, str], ...] = ()
    """(store, artifact id) of every retrieved chunk the answer was built from; retrievers inside the block
    add theirs (:func:`add_sources`)."""


_current: contextvars.ContextVar[Attribution | None] = contextvars.ContextVar("tombstone_attribution", default=None)


@contextlib.contextmanager
def attribution(subject: str, sources: Sequence[tuple[str, str]] = ()) -> Iterator[Attribution]:
    value = Attribution(subject, tuple((s, i) for s, i in sources))
    token = _current.set(value)
    try:
        yield value
    finally:
        _current.reset(token)


def add_sources(sources: Sequence[tuple[str, str]]) -> bool:
    """Add retrieved chunks to the sources of the attribution in force (a retriever calls this, e.g.
    ``tombstone_adapters.langchain``'s): an answer cached later in the same block is recorded as built from
    them. The attribution object is shared by the copies of the context LangChain runs each step in, so a
    chain's retriever step reaches the cache of its LLM step. False when no attribution is in force."""
    value = _current.get()
    if value is None:
        return False
    value.sources = tuple(dict.fromkeys((*value.sources, *((str(s), str(i)) for s, i in sources))))
    return True


def current() -> Attribution:
    """The attribution in force; without one, entries are recorded unattributed (reachable only through
    their sources, and a lineage gap if they have none)."""
    return _current.get() or Attribution(UNATTRIBUTED)
