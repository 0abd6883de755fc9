"""Blocks in which no lineage db may be opened: the independent verifier's guarantee.

:func:`forbid_lineage` marks the current context (thread or task); ``LineageDB`` asks
:func:`lineage_forbidden_by` before it opens anything and refuses inside such a block.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["forbid_lineage", "lineage_forbidden_by"]

_forbidden: contextvars.ContextVar[str | None] = contextvars.ContextVar("lineage_forbidden", default=None)


@contextlib.contextmanager
def forbid_lineage(who: str) -> Iterator[None]:
    """Inside this block no lineage db may be opened: the independent verifier's guarantee."""
    token = _forbidden.set(who)
    try:
        yield
    finally:
        _forbidden.reset(token)


def lineage_forbidden_by() -> str | None:
    """Who forbade opening a lineage db in the current context, or None where it is allowed."""
    return _forbidden.get()
