"""Time, injectable: everything that stamps a time takes a ``Clock`` so tests can freeze it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the one time format Tombstone writes."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
