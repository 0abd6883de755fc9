"""The status lattice: one status per artifact, decided by the first rule that matches.

The order is the specification's and it is the honesty of the tool. In particular a store that
cannot be checked physically (rule 5) is decided *before* a physical failure or a pass can be
considered, so it shows up UNVERIFIED and never VERIFIED by omission.

1. scope_violation       raise ScopeViolationError
   retained              OUT_OF_SCOPE(retained by exception: why)   (kept under an Art. 17(3) exception: untouched)
2. not_suppressed        raise NotSuppressedError (no durable suppression record)
   dlq                   UNVERIFIED(dlq: last error)
   no_adapter            UNVERIFIED(no adapter)
   lineage_gap           UNVERIFIED(lineage gap: ...)
3. third_party           NEEDS_HUMAN(third party: ...)
4. logical_fail          RESIDUAL(logical)
5. physical_unsupported  UNVERIFIED(physical: why)      (whenever the physical probe did not run)
6. physical_fail         RESIDUAL(physical)             (the artifact id, or content nobody else owns)
   duplicate_content     UNVERIFIED(duplicate content)  (id gone; remaining bytes belong to a live survivor)
7. model_residual        RESIDUAL(model)
8. semantic_residual     RESIDUAL(semantic)
   semantic_not_testable UNVERIFIED(semantic: not testable, why)   (enabled, but too few usable probes)
   logical_not_run       UNVERIFIED(logical probe did not run)
9. verified              VERIFIED(highest level whose probe ran and passed)

A level that did not run (``NotRun`` in ``Findings.probes``) never makes anything VERIFIED: only the
physical level's absence is a status of its own (rule 5); the semantic and model levels, when they did
not run, simply do not raise the VERIFIED level above the highest one that did.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from tombstone.errors import NotSuppressedError, ScopeViolationError


class Level(str, enum.Enum):
    """The four verification levels, lowest first."""

    LOGICAL = "logical"
    PHYSICAL = "physical"
    SEMANTIC = "semantic"
    MODEL = "model"

    @property
    def rank(self) -> int:
        return _LEVEL_ORDER.index(self)


_LEVEL_ORDER = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC, Level.MODEL)


class StatusKind(str, enum.Enum):
    """The five statuses an artifact can end with."""

    VERIFIED = "VERIFIED"
    UNVERIFIED = "UNVERIFIED"
    RESIDUAL = "RESIDUAL"
    OUT_OF_SCOPE = "OUT_OF_SCOPE"
    NEEDS_HUMAN = "NEEDS_HUMAN"


@dataclass(frozen=True)
class Status:
    """Exactly one status for one artifact."""

    kind: StatusKind
    """Which of the five statuses."""
    level: Level | None = None
    """The level, for VERIFIED and RESIDUAL only."""
    reason: str | None = None
    """Why, for UNVERIFIED, OUT_OF_SCOPE and NEEDS_HUMAN only."""
    measurement: str | None = None
    """What was still found, for RESIDUAL only."""
    rule: str = ""
    """Name of the lattice rule that produced this status."""
    action: str | None = None
    """What a person must do next; None when nothing is left to act on (VERIFIED, or the backend's
    ceiling: a managed store's UNVERIFIED, content a live survivor holds)."""

    def __post_init__(self) -> None:
        needs_level = self.kind in (StatusKind.VERIFIED, StatusKind.RESIDUAL)
        if needs_level != (self.level is not None):
            raise ValueError(f"{self.kind.value} {'needs' if needs_level else 'takes no'} level")
        needs_reason = self.kind in (
            StatusKind.UNVERIFIED,
            StatusKind.OUT_OF_SCOPE,
            StatusKind.NEEDS_HUMAN,
        )
        if needs_reason != bool(self.reason):
            raise ValueError(f"{self.kind.value} {'needs' if needs_reason else 'takes no'} reason")
        if (self.kind is StatusKind.RESIDUAL) != bool(self.measurement):
            raise ValueError("RESIDUAL needs a measurement, and only RESIDUAL has one")
        if self.kind in (StatusKind.RESIDUAL, StatusKind.NEEDS_HUMAN) and not self.action:
            raise ValueError(f"{self.kind.value} always leaves something for a person to do")
        if self.kind is StatusKind.VERIFIED and self.action:
            raise ValueError("VERIFIED leaves nothing to do")

    def __str__(self) -> str:
        inner = self.level.value if self.level else self.reason
        if self.measurement:
            inner = f"{inner}: {self.measurement}"
        return f"{self.kind.value}({inner})"


@dataclass(frozen=True)
class Findings:
    """Everything verification learned about one artifact; the only input of the lattice.

    ``probes`` holds one outcome per level: a ``ProbeResult`` when the level's probe ran, a ``NotRun``
    (with why) when it did not; a level absent from the mapping did not run either. Decisions rest on
    things that are stable across a crash and resume (an id's presence, the lineage graph); counts that
    move with a background flush belong in the evidence, not here.
    """

    artifact_id: str
    """The artifact being decided."""
    scope_violation: str | None = None
    """Set when the artifact belongs to a subject other than the one being erased."""
    suppressed: bool = False
    """A durable suppression record exists for the artifact."""
    dlq_error: str | None = None
    """Last error, when the artifact went to the dead-letter list."""
    no_adapter: str | None = None
    """Backend name, when no installed adapter serves the artifact's store."""
    lineage_gap: str | None = None
    """What is missing, when the lineage graph around the artifact is incomplete."""
    third_party: str | None = None
    """Who received a copy, when the artifact left for a third party."""
    retained: str | None = None
    """Why, when an erasure request keeps the artifact's store under an exception (``tombstone.requests``):
    the erasure left it untouched and no probe ran on it."""
    duplicate_content: str | None = None
    """Set when the id is gone but its content bytes belong to another live artifact."""
    semantic_not_testable: str | None = None
    """Why, when the semantic level was enabled but the artifact is in its own Top-5 for too few of its
    probe queries to measure its neighbourhood's drift."""
    probes: Mapping[Level, Any] = field(default_factory=dict)
    """Level → ``ProbeResult`` or ``NotRun`` (``tombstone.verify.result``)."""

    def ran(self, level: Level) -> bool:
        outcome = self.probes.get(level)
        return outcome is not None and outcome.ran

    def failed(self, level: Level) -> bool:
        """The level's probe ran and found something."""
        return self.ran(level) and not self.probes[level].passed

    def measurement(self, level: Level) -> str | None:
        outcome = self.probes.get(level)
        return outcome.measurement if outcome is not None and outcome.ran else None

    def why_not_run(self, level: Level) -> str | None:
        outcome = self.probes.get(level)
        if outcome is None:
            return f"no {level.value} probe ran"
        return None if outcome.ran else outcome.why

    def at_ceiling(self, level: Level) -> bool:
        """The level did not run because the backend can never be checked there (declared, not a failure)."""
        outcome = self.probes.get(level)
        return outcome is not None and not outcome.ran and bool(getattr(outcome, "ceiling", False))


@dataclass(frozen=True)
class Rule:
    """One row of the lattice."""

    name: str
    matches: Callable[[Findings], bool]
    decide: Callable[[Findings], Status]


def _raise_scope(f: Findings) -> Status:
    raise ScopeViolationError(f"artifact {f.artifact_id} belongs to another subject: {f.scope_violation}")


def _raise_not_suppressed(f: Findings) -> Status:
    raise NotSuppressedError(f"artifact {f.artifact_id} has no durable suppression record")


def _verified(f: Findings) -> Status:
    passed = [lv for lv in _LEVEL_ORDER if f.ran(lv) and f.probes[lv].passed]
    return Status(StatusKind.VERIFIED, level=passed[-1], rule="verified")  # the highest: _LEVEL_ORDER is by rank


def _residual(name: str, level: Level, default: str, action: str) -> Rule:
    """RESIDUAL(level) when the level's probe ran and found something."""
    return Rule(
        name,
        lambda f: f.failed(level),
        lambda f: Status(StatusKind.RESIDUAL, level=level, measurement=f.measurement(level) or default, rule=name,
                         action=action),
    )


AGAIN = "run 'tombstone erase' for the subject again"
"""The usual next step once the cause is fixed: a new saga re-runs every step (they are idempotent)."""


RULES: tuple[Rule, ...] = (
    Rule("scope_violation", lambda f: f.scope_violation is not None, _raise_scope),
    Rule(
        "retained",
        lambda f: f.retained is not None,
        lambda f: Status(StatusKind.OUT_OF_SCOPE, reason=f"retained by exception: {f.retained}", rule="retained"),
    ),
    Rule("not_suppressed", lambda f: not f.suppressed, _raise_not_suppressed),
    Rule(
        "dlq",
        lambda f: f.dlq_error is not None,
        lambda f: Status(StatusKind.UNVERIFIED, reason=f"dlq: {f.dlq_error}", rule="dlq",
                         action="fix the store error, then run 'tombstone dlq retry'"),
    ),
    Rule(
        "no_adapter",
        lambda f: f.no_adapter is not None,
        lambda f: Status(StatusKind.UNVERIFIED, reason=f"no adapter: {f.no_adapter}", rule="no_adapter",
                         action=f"install the store's adapter or restore the store in the config, then {AGAIN}"),
    ),
    Rule(
        "lineage_gap",
        lambda f: f.lineage_gap is not None,
        lambda f: Status(StatusKind.UNVERIFIED, reason=f"lineage gap: {f.lineage_gap}", rule="lineage_gap",
                         action="find where the artifact came from and record the missing link ('tombstone where'),"
                                f" then {AGAIN}"),
    ),
    Rule(
        "third_party",
        lambda f: f.third_party is not None,
        lambda f: Status(StatusKind.NEEDS_HUMAN, reason=f"third party: {f.third_party}", rule="third_party",
                         action="ask the recipient to delete its copy and keep their confirmation"),
    ),
    _residual("logical_fail", Level.LOGICAL, "still returned by a query path",
              f"a query path still returns it: {AGAIN}; if it stays, the store's adapter misses a read path"),
    Rule(
        "physical_unsupported",
        lambda f: not f.ran(Level.PHYSICAL),
        lambda f: Status(StatusKind.UNVERIFIED, reason=f"physical: {f.why_not_run(Level.PHYSICAL)}",
                         rule="physical_unsupported",
                         action=None if f.at_ceiling(Level.PHYSICAL)
                         else f"make the store's files readable to Tombstone (see the reason), then {AGAIN}"),
    ),
    _residual("physical_fail", Level.PHYSICAL, "bytes still in storage",
              f"the bytes are still stored: {AGAIN}; if they stay, the store's reclaim recipe does not reach them"),
    Rule(
        "duplicate_content",
        lambda f: f.duplicate_content is not None,
        lambda f: Status(
            StatusKind.UNVERIFIED,
            reason=f"duplicate content: {f.duplicate_content}",
            rule="duplicate_content",
        ),
    ),
    _residual("model_residual", Level.MODEL, "the model still reproduces the artifact",
              "retrain the shard without the subject's examples, then erase again"),
    _residual("semantic_residual", Level.SEMANTIC, "the neighbourhood still answers as if the artifact were there",
              "look for near-copies or summaries of the artifact the lineage graph does not know"),
    Rule(
        "semantic_not_testable",
        lambda f: f.semantic_not_testable is not None,
        lambda f: Status(StatusKind.UNVERIFIED, reason=f"semantic: not testable, {f.semantic_not_testable}",
                         rule="semantic_not_testable"),
    ),
    Rule(
        "logical_not_run",
        lambda f: not f.ran(Level.LOGICAL),
        lambda f: Status(StatusKind.UNVERIFIED, reason="logical probe did not run", rule="logical_not_run",
                         action=f"{AGAIN} once the store can be queried"),
    ),
    Rule("verified", lambda f: True, _verified),
)


def _decision_key(f: Findings) -> tuple[Any, ...]:
    """Everything of ``f`` the rules below read, except the artifact's id (which only the two raising rules
    name): findings that agree on it get the same status."""
    outcomes = []
    for level in _LEVEL_ORDER:
        outcome = f.probes.get(level)
        if outcome is None:
            outcomes.append(None)
        elif outcome.ran:
            outcomes.append((True, outcome.passed, outcome.measurement))
        else:
            outcomes.append((False, outcome.why, bool(getattr(outcome, "ceiling", False))))
    return (f.retained, f.dlq_error, f.no_adapter, f.lineage_gap, f.third_party, f.duplicate_content,
            f.semantic_not_testable, len(f.probes), *outcomes)


_DECIDED: dict[tuple[Any, ...], Status] = {}
"""Statuses already decided, by ``_decision_key``: a batch's thousands of artifacts come in a few shapes."""
_DECIDED_AT_MOST = 4096


def decide(findings: Findings) -> Status:
    """Return the status of the first rule that matches ``findings``.

    Raises ScopeViolationError or NotSuppressedError for the two rules that must never yield a status.
    """
    if findings.scope_violation is not None or not findings.suppressed:
        return _decide(findings)  # the two rules that raise, naming the artifact
    key = _decision_key(findings)
    status = _DECIDED.get(key)
    if status is None:
        if len(_DECIDED) >= _DECIDED_AT_MOST:
            _DECIDED.clear()
        status = _DECIDED[key] = _decide(findings)
    return status


def _decide(findings: Findings) -> Status:
    for rule in RULES:
        if rule.matches(findings):
            return rule.decide(findings)
    raise AssertionError("the last rule always matches")  # pragma: no cover


__all__ = ["Findings", "Level", "RULES", "Rule", "Status", "StatusKind", "decide"]
