"""The receipt as a typed object, parsed once from its JSON and used by the CLI, the auditor and the gate.

:meth:`Receipt.parse` validates the JSON Schema first, so every field read here is known to exist with
its type. Receipts written by earlier releases of the same schema version parse unchanged (they carry
probes for the logical and physical levels only; :meth:`ArtifactEntry.probe` returns None for the rest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.lineage.records import ArtifactRecord
from tombstone.receipt.signing import load_receipt, validate_schema
from tombstone.verify.levels import Level, StatusKind


@dataclass(frozen=True)
class ProbeRecord:
    """One level's probe of one artifact, as the receipt recorded it."""

    level: Level
    ran: bool
    passed: bool | None
    measurement: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def why(self) -> str | None:
        """Why the probe did not run (None when it ran)."""
        return None if self.ran else str(self.detail.get("why") or "not run")


@dataclass(frozen=True)
class ArtifactEntry:
    """One artifact's line of a receipt."""

    artifact_id: str
    store: str
    backend: str
    kind: str
    status: StatusKind
    level: Level | None
    reason: str | None
    measurement: str | None
    fingerprint: tuple[float, ...] | None
    inv_norm: float | None
    evidence: dict[str, Any]
    probes: dict[Level, ProbeRecord]
    sealed_patterns: tuple[dict[str, str], ...] = ()
    """The content patterns sealed to auditor keys (schema 1.1); open with :meth:`open_patterns`."""
    action: str | None = None
    """What a person must do next (None: nothing). Receipts of schema 1.0 did not record it; for them it
    is read from the status: RESIDUAL and NEEDS_HUMAN need a person, anything else is not known."""

    def probe(self, level: Level) -> ProbeRecord | None:
        return self.probes.get(level)

    @property
    def status_text(self) -> str:
        """``VERIFIED(physical)``, ``UNVERIFIED(dlq: ...)``, ``RESIDUAL(logical: returned by get)``."""
        detail = self.level.value if self.level else (self.reason or "")
        if self.measurement:
            detail = f"{detail}: {self.measurement}"
        return f"{self.status.value}({detail})"

    def open_patterns(self, private_key: Any) -> dict[str, Any] | None:
        """The content patterns sealed to this auditor key, or None when none were sealed to it."""
        from tombstone.receipt.sealing import open_sealed

        return open_sealed(self.sealed_patterns, private_key) if self.sealed_patterns else None

    def record(self, patterns: Mapping[str, Any] | None = None) -> ArtifactRecord:
        """The artifact as a probe needs it: what the receipt carries (and, for an auditor holding a key it
        was sealed to, its opened content patterns), nothing from a lineage db."""
        fingerprint, inv_norm = self.fingerprint, self.inv_norm
        if patterns:
            fingerprint = tuple(float(x) for x in patterns.get("fingerprint") or ()) or None
            inv_norm = patterns.get("inv_norm")
        return ArtifactRecord(store=self.store, artifact_id=self.artifact_id, backend=self.backend, kind=self.kind,
                              fingerprint=fingerprint, inv_norm=inv_norm)


def _legacy_action(art: Mapping[str, Any]) -> str | None:
    if art["status"] in ("RESIDUAL", "NEEDS_HUMAN"):
        return f"act on {art['status']} (recorded by a release that did not name the next step)"
    return None


@dataclass(frozen=True)
class Receipt:
    """A whole receipt. ``data`` is the parsed JSON it came from (what the hash and signature cover)."""

    data: dict[str, Any]
    subject: str
    saga_id: str
    sequence: int
    started_at: str
    finished_at: str
    tool_version: str
    artifacts: tuple[ArtifactEntry, ...]
    out_of_scope: tuple[tuple[str, str], ...]
    summary: dict[str, int]
    previous_receipt_hash: str | None
    receipt_hash: str
    key_id: str
    statement: str | None = None
    """A statement about the erasure as a whole (e.g. no artifact recorded for the subject)."""

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "Receipt":
        """Validate against the published schema (ReceiptError naming the first problem), then read."""
        validate_schema(data)
        entries = []
        for art in data["artifacts"]:
            probes = {}
            for probe in art["evidence"]["probes"]:
                level = Level(probe["level"])
                probes[level] = ProbeRecord(level, probe["ran"], probe["passed"], probe.get("measurement"),
                                            dict(probe.get("detail") or {}))
            entries.append(ArtifactEntry(
                artifact_id=art["artifact_id"], store=art["store"], backend=art["backend"], kind=art["kind"],
                status=StatusKind(art["status"]), level=Level(art["level"]) if art["level"] else None,
                reason=art["reason"], measurement=art["measurement"],
                fingerprint=tuple(art["fingerprint"]) if art["fingerprint"] else None, inv_norm=art.get("inv_norm"),
                evidence=dict(art["evidence"]), probes=probes,
                sealed_patterns=tuple(dict(item) for item in art.get("sealed_patterns", ())),
                action=art.get("action") if "action" in art else _legacy_action(art)))
        return cls(
            data=dict(data), subject=data["subject"], saga_id=data["saga_id"], sequence=data["sequence"],
            started_at=data["started_at"], finished_at=data["finished_at"], tool_version=data["tool"]["version"],
            artifacts=tuple(entries),
            out_of_scope=tuple((item["what"], item["reason"]) for item in data["out_of_scope"]),
            summary=dict(data["summary"]), previous_receipt_hash=data["previous_receipt_hash"],
            receipt_hash=data["receipt_hash"], key_id=data["signature"]["key_id"], statement=data.get("statement"))

    @classmethod
    def load(cls, path: str | Path) -> "Receipt":
        """Read and parse a receipt file: ReceiptFormatError when it is not a readable receipt, ReceiptError
        when it does not match the schema; each one line."""
        return cls.parse(load_receipt(path))

    @property
    def schema_version(self) -> str:
        return str(self.data["schema_version"])

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", "tombstone.erasure-receipt"))

    @property
    def store_reclaim(self) -> dict[str, Any] | None:
        """A store reclaim receipt's section (store, backend, evidence, scans before and after); else None."""
        section = self.data.get("store_reclaim")
        return dict(section) if isinstance(section, Mapping) else None

    @property
    def store_left_recoverable(self) -> bool:
        """A store reclaim after which the scan still found deleted data."""
        section = self.store_reclaim
        return bool(section and section.get("after") and section["after"].get("recoverable"))

    @property
    def needs_action(self) -> list[ArtifactEntry]:
        """The artifacts a person must still act on."""
        return [entry for entry in self.artifacts if entry.action]

    def by_store(self) -> dict[str, list[ArtifactEntry]]:
        out: dict[str, list[ArtifactEntry]] = {}
        for entry in self.artifacts:
            out.setdefault(entry.store, []).append(entry)
        return dict(sorted(out.items()))


__all__ = ["ArtifactEntry", "ProbeRecord", "Receipt"]
