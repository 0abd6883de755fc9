"""What every wrapper checks before a write records lineage: the subject, the store name, an open deployment.

A write whose lineage row could never be erased is refused before anything is recorded or stored: an empty,
missing or oversized subject reference (:func:`tombstone.inputs.check_subject`), or, when the wrapper was
given the lineage db of an open :class:`tombstone.api.Tombstone` (``lineage=tomb.lineage``), a store name
that deployment's config does not list (an erasure would find no adapter for it). A lineage db opened on its
own carries no config, so only the subject is checked there. A write through the lineage db of a Tombstone
that was closed is refused too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from tombstone.errors import ConfigError, LineageError
from tombstone.inputs import check_subject

_DEPLOYMENTS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
"""Lineage db -> the config of the Tombstone that opened it (None once that Tombstone is closed)."""


def register(lineage: Any, config: Any) -> None:
    """Say that ``lineage`` belongs to the deployment ``config`` describes (``Tombstone`` does, when opened)."""
    _DEPLOYMENTS[lineage] = config


def closed(lineage: Any) -> None:
    """Say that the Tombstone owning ``lineage`` was closed."""
    if lineage in _DEPLOYMENTS:
        _DEPLOYMENTS[lineage] = None


def check_write(lineage: Any, store: str, subjects: Iterable[Any]) -> None:
    """Refuse, in one TombstoneError line, a write to ``store`` for ``subjects`` whose lineage could never be
    erased (see the module's docstring). Call it before recording anything."""
    seen: set[str] = set()
    for subject in subjects:
        if not (isinstance(subject, str) and subject in seen):
            seen.add(check_subject(subject))
    if lineage is None or lineage not in _DEPLOYMENTS:
        return
    config = _DEPLOYMENTS[lineage]
    if config is None:
        raise LineageError("this deployment was closed (Tombstone.close()): open it again before writing through"
                           " its lineage db")
    if store not in config.stores:
        known = ", ".join(sorted(config.stores)) or "none"
        raise ConfigError(f"store {store!r} is not configured in {config.path} (configured: {known}): a write there"
                          " could never be erased; add it under [stores] or name a configured store", store=store)


__all__ = ["check_write", "closed", "register"]
