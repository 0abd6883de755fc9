"""``tombstone scan``: how much deleted data a store still holds today, without the lineage db.

A scan is read-only: the backend's :meth:`~tombstone.contract.Adapter.scan_deleted` reads a private copy of
whatever its client would write to on opening (``tombstone.fsutil.Snapshot``) and never changes a byte of
the store. It reports, per place (a file, a table, a segment), what the store itself marks deleted or
unreachable but still holds: counts and bytes, and — only when asked — the ids it can recover. Never
content.

The core knows no backend: each adapter package implements ``scan_deleted`` (in its ``forensics``
module), and this module only finds the store, calls it and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tombstone.errors import ConfigError


@dataclass
class ScanPlace:
    """One place of a store where deleted or unreachable data may remain."""

    place: str
    """Where: a file name, a table, a segment folder."""
    kind: str
    """What was looked at there (``sqlite free pages``, ``freeblocks``, ...)."""
    count: int = 0
    """How many deleted records (or slots, tuples, pages) still hold data there."""
    bytes: int = 0
    """How many bytes of it are not zero (what a reader of the file could recover)."""
    ids: list[str] = field(default_factory=list)
    """The deleted records' ids it could recover (kept only with ``show_ids``)."""
    note: str = ""
    """What the numbers mean for this place, or why it was not looked at."""
    bytes_count: bool = True
    """Whether non-zero bytes alone make the place recoverable; False where the client's own housekeeping
    (schema migrations, say) leaves free space in a store that never deleted a record, so only the deleted
    records found there count."""

    @property
    def recoverable(self) -> bool:
        return self.count > 0 or (self.bytes_count and self.bytes > 0)

    def as_json(self, show_ids: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"place": self.place, "kind": self.kind, "count": self.count, "bytes": self.bytes,
                               "recoverable": self.recoverable}
        if show_ids:
            out["ids"] = sorted(self.ids)
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class ScanReport:
    """What a scan of one store found."""

    store: str
    backend: str
    places: list[ScanPlace] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the scan could not look at (so a clean report is never read as more than it is)."""

    @property
    def recoverable(self) -> bool:
        return any(p.recoverable for p in self.places)

    @property
    def count(self) -> int:
        return sum(p.count for p in self.places)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.places)

    def ids(self) -> list[str]:
        return sorted({i for p in self.places for i in p.ids})

    def as_json(self, show_ids: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"store": self.store, "backend": self.backend, "recoverable": self.recoverable,
                               "count": self.count, "bytes": self.bytes,
                               "places": [p.as_json(show_ids) for p in self.places], "notes": list(self.notes)}
        if show_ids:
            out["ids"] = self.ids()
        return out


def scan_options(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    """Scan one store given its backend and options (no deployment needed)."""
    from tombstone.contract import adapter_class

    cls = adapter_class(backend)
    try:
        report = cls.scan_deleted(store, dict(options))
    except NotImplementedError as exc:
        raise ConfigError(str(exc) or f"the {backend} adapter cannot scan for deleted data", store=store) from exc
    return report


def scan_configured(config_path: str | None, store: str) -> ScanReport:
    """Scan the store ``store`` of a configuration file (only its ``[stores]`` are read)."""
    from tombstone.config import load_config

    config = load_config(config_path)
    if store not in config.stores:
        known = ", ".join(sorted(config.stores)) or "none"
        raise ConfigError(f"no store {store!r} in {config.path} (stores: {known})")
    sc = config.stores[store]
    return scan_options(sc.name, sc.backend, sc.options)


__all__ = ["ScanPlace", "ScanReport", "scan_configured", "scan_options"]
