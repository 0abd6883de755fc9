"""What a probe stage reports about one artifact at one level: a result, or why it did not run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tombstone.verify.levels import Level


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe of one artifact at one level."""

    level: Level
    """Which level the probe checks."""
    passed: bool
    """True when the probe found nothing of the artifact."""
    measurement: str | None = None
    """What was found, when the probe failed."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """Everything the probe did and saw, for the receipt."""
    id_found: bool = False
    """Physical probes: the artifact id's bytes were found."""
    content_found: bool = False
    """Physical probes: the artifact's content pattern was found."""

    def __post_init__(self) -> None:
        if not self.passed and not self.measurement:
            raise ValueError("a failed probe must say what it found")

    @property
    def ran(self) -> bool:
        return True


@dataclass(frozen=True)
class NotRun:
    """A level whose probe did not run for an artifact, and why."""

    level: Level
    """The level that was not probed."""
    why: str
    """Why not: the backend cannot be checked there, the deployment disabled it, the store failed, ..."""
    ceiling: bool = False
    """True when the backend can never be checked at this level (it does not declare the capability): the
    backend's ceiling, nothing a person can fix. False when it could have run but did not (a file was not
    readable, a privilege is missing, the deployment disabled the level, the store failed)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """Anything the stage learned before it stopped."""

    def __post_init__(self) -> None:
        if not self.why:
            raise ValueError("a probe that did not run must say why")

    @property
    def ran(self) -> bool:
        return False

    @property
    def passed(self) -> None:
        return None


Outcome = ProbeResult | NotRun
"""One level's outcome for one artifact."""

__all__ = ["NotRun", "Outcome", "ProbeResult"]
