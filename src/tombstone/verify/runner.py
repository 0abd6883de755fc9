"""The verification pipeline: one stage per level, chosen per store, run in level order.

Each level is a module of this package (``logical``, ``physical``, ``semantic``, ``model``) exposing
``STAGE``: an object with ``level``, the ``capability`` an adapter must declare for it to run,
``unsupported(adapter)`` (why not, when it does not) and ``run(ctx, adapter, artifacts) -> StageOutput``.
The runner finds a stage for every :class:`Level`, so adding a level is a new module plus its lattice
rule. A stage runs for a store only when the deployment enables the level and the store's adapter
declares the capability; otherwise every artifact gets a :class:`NotRun` saying which.

A stage that raises NotImplementedError is reported as not run with that message. A level whose capability
the adapter does not declare is the backend's ceiling (``NotRun.ceiling``: nothing a person can fix); one
that raises PhysicalUnsupportedError could have run but could not here (an unreadable file, a missing
privilege: a person can act). Either way the lattice makes it UNVERIFIED, never VERIFIED.
Store failures propagate to the caller (the saga retries and dead-letters them) unless the context asks
for them to be recorded as not run (the auditor, who must report what it could not check).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol, TypeVar

from tombstone.errors import DeadLetterError, PhysicalUnsupportedError, TombstoneError
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Findings, Level
from tombstone.verify.result import NotRun, Outcome, ProbeResult

T = TypeVar("T")
ALL_LEVELS = frozenset(Level)


@dataclass
class StageOutput:
    """What one stage established for the artifacts of one store."""

    outcomes: dict[str, Outcome]
    """Per artifact id: what the probe reported (this goes into the receipt)."""
    decided: dict[str, Outcome] = field(default_factory=dict)
    """Per artifact id, when the lattice must decide on another outcome than the report (attribution)."""
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per artifact id: further :class:`Findings` fields the stage established (``duplicate_content``)."""


class Stage(Protocol):
    level: Level
    capability: Any

    def unsupported(self, adapter: Any) -> str: ...

    def run(self, ctx: VerifyContext, adapter: Any, artifacts: Sequence[ArtifactRecord]) -> StageOutput: ...

    # Optional: ``prepared(adapter, artifacts)``, a context manager entered before the first stage runs and
    # left after the last, for work a stage can do while the stages below it run.


@dataclass
class VerifyContext:
    """What the stages may use besides the adapter. The auditor's has no lineage in it."""

    call: Callable[[Callable[[], Any]], Any] = lambda action: action()
    """Runs each store operation: the saga's retries with backoff and dead letters; a plain call otherwise."""
    probe_vectors: Callable[[Sequence[ArtifactRecord]], Mapping[str, Sequence[Any]]] | None = None
    """The fragment probe vectors captured at write time, when the verifier has the lineage db."""
    probe_counts: Callable[[Sequence[ArtifactRecord]], Mapping[str, int]] | None = None
    """How many of them each artifact has, without reading them (evidence of a probe that needs none)."""
    probes_incomplete: Callable[[Sequence[ArtifactRecord]], set[str]] | None = None
    """Ids of the artifacts whose probe capture never finished (``tombstone.capture.pending``): the semantic
    level is not measured for them."""
    live_sharing_content: Callable[[ArtifactRecord], Sequence[ArtifactRecord]] | None = None
    """Live artifacts of other subjects with the same content (the duplicate-content decision)."""
    live_sharing_content_many: Callable[[Sequence[ArtifactRecord]], Mapping[tuple[str, str], Sequence[ArtifactRecord]]] | None = None
    """The same for many artifacts at once, keyed by (store, id); used instead where given."""
    semantic_snapshots: Callable[[str, Sequence[str]], Mapping[str, tuple[dict[str, Any], bytes]]] | None = None
    """``(store, artifact ids) -> {id: (meta, vectors)}``: what the saga's snapshot step measured of each
    artifact's neighbourhood before suppression (the semantic level); None for a verifier without one."""
    model_snapshots: Callable[[str, Sequence[str]], Mapping[str, tuple[dict[str, Any], str | None]]] | None = None
    """``(store, artifact ids) -> {id: (meta, text)}``: what the saga's snapshot step recorded of each trained
    example before suppression (the model level); None for a verifier without one."""
    enabled: frozenset[Level] = ALL_LEVELS
    """The levels the deployment enables."""
    reference: Callable[[str, str], str] | None = None
    """``(store, artifact id) -> keyed reference``: how a receipt names another subject's artifact that it must
    not name in the clear (the semantic level's controls): an HMAC with the lineage secret. None: a hash salted
    afresh for each verification (nobody can check it against an id)."""
    record_errors: bool = False
    """Store failures become NotRun instead of propagating (the auditor)."""


@dataclass
class Verdict:
    """One artifact's outcomes at every level."""

    reported: dict[Level, Outcome]
    """What each level's probe reported, in level order (the receipt's evidence)."""
    decided: dict[Level, Outcome]
    """What the lattice decides on (equal to ``reported`` except where a stage attributed a finding)."""
    findings: dict[str, Any] = field(default_factory=dict)
    """Further findings the stages established."""

    def findings_for(self, artifact_id: str, **identity: Any) -> Findings:
        """The lattice's input: these outcomes plus what the lineage says about the artifact."""
        return Findings(artifact_id=artifact_id, probes=dict(self.decided), **identity, **self.findings)


@cache
def stages() -> tuple[Stage, ...]:
    """One stage per level, lowest level first: ``tombstone.verify.<level>.STAGE``."""
    found = []
    for level in sorted(Level, key=lambda lv: lv.rank):
        stage = importlib.import_module(f"tombstone.verify.{level.value}").STAGE
        if stage.level is not level:
            raise TypeError(f"tombstone.verify.{level.value}.STAGE checks {stage.level}, not {level}")
        found.append(stage)
    return tuple(found)


def not_run(why: str) -> dict[Level, Outcome]:
    """Every level not run, for one reason (a store that failed or has no adapter)."""
    return {stage.level: NotRun(stage.level, why) for stage in stages()}


def run(ctx: VerifyContext, adapter: Any, artifacts: Sequence[ArtifactRecord]) -> dict[str, Verdict]:
    """Run every applicable stage over ``artifacts`` (all of one store); one verdict per artifact id."""
    verdicts = {art.artifact_id: Verdict({}, {}) for art in artifacts}

    def skip(level: Level, why: str, ceiling: bool = False) -> None:
        for verdict in verdicts.values():
            verdict.reported[level] = verdict.decided[level] = NotRun(level, why, ceiling)

    # A stage may get ready while the stages below it run (the physical one builds its matcher)
    with contextlib.ExitStack() as ready:
        for stage in stages():
            if stage.level in ctx.enabled and hasattr(stage, "prepared"):
                ready.enter_context(stage.prepared(adapter, artifacts))
        _run_stages(ctx, adapter, artifacts, verdicts, skip)
    return verdicts


def _run_stages(ctx: VerifyContext, adapter: Any, artifacts: Sequence[ArtifactRecord], verdicts: dict[str, Verdict],
                skip: Callable[..., None]) -> None:
    for stage in stages():
        level = stage.level
        if level not in ctx.enabled:
            skip(level, f"the {level.value} level is not enabled in this deployment's configuration")
            continue
        if not adapter.has(stage.capability):
            skip(level, stage.unsupported(adapter), ceiling=True)
            continue
        try:
            out = stage.run(ctx, adapter, artifacts)
        except NotImplementedError as exc:
            skip(level, str(exc) or f"the {level.value} probe is not implemented")
            continue
        except PhysicalUnsupportedError as exc:  # could have run: a file, a privilege, a mode is missing
            skip(level, str(exc))
            continue
        except DeadLetterError:
            raise
        except TombstoneError as exc:
            if not ctx.record_errors:
                raise
            skip(level, str(exc))
            continue
        for aid, verdict in verdicts.items():
            reported = out.outcomes.get(aid) or NotRun(level, "the probe returned nothing for this artifact")
            verdict.reported[level] = reported
            verdict.decided[level] = out.decided.get(aid, reported)
            verdict.findings.update(out.findings.get(aid, {}))


def probe_record(outcome: Outcome) -> dict[str, Any]:
    """One probe as the receipt's evidence records it."""
    if isinstance(outcome, ProbeResult):
        return {"level": outcome.level.value, "ran": True, "passed": outcome.passed,
                "measurement": outcome.measurement, "detail": outcome.evidence}
    return {"level": outcome.level.value, "ran": False, "passed": None, "measurement": None,
            "detail": {"why": outcome.why, **outcome.evidence}}


def probe_records(outcomes: Mapping[Level, Outcome]) -> list[dict[str, Any]]:
    """Every level's probe record, in level order."""
    return [probe_record(outcomes[stage.level]) for stage in stages() if stage.level in outcomes]


__all__ = ["ALL_LEVELS", "Stage", "StageOutput", "Verdict", "VerifyContext", "not_run", "probe_record",
           "probe_records", "run", "stages"]
