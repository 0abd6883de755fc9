"""What a read-only scan of one store reports (``tombstone scan``, ``Adapter.scan_deleted``).

The adapter contract names :class:`ScanReport` as what ``scan_deleted`` returns, and every adapter's
forensics builds one: it lives here, below the contract, and imports nothing of Tombstone's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


__all__ = ["ScanPlace", "ScanReport"]
