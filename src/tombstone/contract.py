"""The adapter contract: what every backend implements, and how backends are found.

An adapter serves one configured store. It declares its capabilities; the saga and the lattice read
those declarations and never guess from which methods a class overrides. Built-in adapters register
through the ``tombstone.adapters`` entry-point group exactly as a third-party package would::

    [project.entry-points."tombstone.adapters"]
    mystore = "my_package.adapter:MyStoreAdapter"
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from tombstone.errors import AdapterError, AdapterNotFoundError, ConfigError, PhysicalUnsupportedError
from tombstone.lineage.db import ArtifactRecord, fingerprint_bytes
from tombstone.verify.levels import Level
from tombstone.verify.scanner import scan_files

ENTRY_POINT_GROUP = "tombstone.adapters"
MIN_NONZERO_FINGERPRINT_DIMS = 4
DISTRIBUTION = "tombstone-rag"

# Backends Tombstone ships, with the extra that installs their client, for a helpful hint when the
# client is missing. A third-party adapter needs no entry here.
KNOWN_BACKENDS: dict[str, str | None] = {
    "docstore": None,
    "chroma": "chroma",
    "faiss": "faiss",
    "qdrant": "qdrant",
    "pgvector": "pgvector",
    "pinecone": "pinecone",
    "exact_cache": "caches",
    "semantic_cache": None,
}


class Capability(str, enum.Enum):
    """What an adapter can do; declared, never inferred."""

    HIDE = "hide"
    """Suppression hides the artifact while it is still stored (flag, exclusion set, column)."""
    IMMEDIATE_DELETE = "immediate_delete"
    """Suppression deletes at once (caches have no hide state)."""
    RECLAIM = "reclaim"
    """A physical reclaim recipe exists (rewrite, VACUUM, rebuild, ...)."""
    LOGICAL_PROBE = "logical_probe"
    """The store's query paths can be probed for the artifact."""
    PHYSICAL_SCAN = "physical_scan"
    """The store's persisted bytes can be read and scanned."""
    MANAGED = "managed"
    """A managed service: no access to persisted bytes at all."""


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


class Adapter(abc.ABC):
    """Base class of every backend adapter. One instance serves one configured store.

    Subclasses set ``backend`` and ``capabilities`` and implement the abstract methods. Every
    method takes the artifacts to act on; none may touch an artifact it was not given (survivors
    are never deleted).
    """

    backend: ClassVar[str]
    """The name users write in ``backend = "..."``."""
    capabilities: ClassVar[frozenset[Capability]]
    """Declared capabilities; the lattice and the saga read them."""
    levels: ClassVar[tuple[Level, ...]] = (Level.LOGICAL, Level.PHYSICAL)
    """Levels this backend can be verified at, lowest first."""

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        self.store = store
        self.options = dict(options)

    def require(self, *keys: str) -> None:
        """Raise one ConfigError line naming the options this backend needs, if any of ``keys`` is missing."""
        if any(key not in self.options for key in keys):
            needs = " and ".join(f'{key} = "..."' for key in keys)
            raise ConfigError(f"store {self.store!r}: the {self.backend} backend needs {needs}")

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    @abc.abstractmethod
    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """Hide (or, for caches, delete) the artifacts on every query path. Idempotent. Returns evidence."""

    @abc.abstractmethod
    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """Run the backend's physical recipe so the artifacts' bytes leave storage. Idempotent.

        Survivors must be unchanged afterwards. Returns evidence (steps run, settings in force).
        """

    @abc.abstractmethod
    def probe_logical(
        self,
        artifacts: Sequence[ArtifactRecord],
        probe_vectors: Mapping[str, Sequence[Any]] | None = None,
    ) -> dict[str, ProbeResult]:
        """Ask every query path the wrapper knows whether it still returns each artifact.

        ``probe_vectors`` maps artifact ids to the fragment embeddings captured at write time
        (vector stores query with them; an independent verifier has none and passes ``None``).
        """

    @abc.abstractmethod
    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        """The store's own ordinary delete, with no reclaim. Used by controls in tests and checks."""

    def physical_files(self) -> list[Path]:
        """Every file in which the store persists bytes. Raises PhysicalUnsupportedError if none can be read."""
        raise PhysicalUnsupportedError(f"{self.backend} has no readable files", store=self.store)

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        """Byte patterns whose presence means the artifact is still stored.

        Keys starting with ``id`` are the artifact id in each form the store writes it; keys starting
        with ``content`` (the fingerprint, in each encoding the store uses) are what byte-identical copies
        owned by other subjects would share, so their hits are attributed on the lineage graph.
        """
        patterns = {"id": artifact.artifact_id.encode("utf-8")}
        if self.fingerprint_scannable(artifact):
            patterns["content"] = fingerprint_bytes(artifact.fingerprint)
        return patterns

    @staticmethod
    def fingerprint_scannable(artifact: ArtifactRecord) -> bool:
        """Whether the fingerprint is distinctive enough to search for as bytes.

        A fingerprint that is mostly zeros (sparse embeddings of short texts) matches every run of zero
        bytes in a file; it is left out, and the id alone decides. Never the other way round: leaving a
        pattern out can only lose a RESIDUAL that the id would still catch.
        """
        fp = artifact.fingerprint
        return fp is not None and sum(1 for x in fp if x != 0.0) >= MIN_NONZERO_FINGERPRINT_DIMS

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        """Byte-scan every persisted file once for all patterns of all artifacts.

        Raises PhysicalUnsupportedError when the backend cannot be checked; never reports absence it
        did not observe.
        """
        if not self.has(Capability.PHYSICAL_SCAN):
            raise PhysicalUnsupportedError(
                f"{self.backend} offers no access to its persisted bytes", store=self.store
            )
        files = self.physical_files()
        per_artifact = {art.artifact_id: self.physical_patterns(art) for art in artifacts}
        patterns = {f"{kind}\x00{aid}": pattern for aid, pats in per_artifact.items() for kind, pattern in pats.items()}
        report = scan_files(files, patterns)
        results = {}
        for art in artifacts:
            kinds = per_artifact[art.artifact_id]
            id_hits = [
                hit for kind in kinds if kind.startswith("id") for hit in report.found(f"{kind}\x00{art.artifact_id}")
            ]
            content_hits = [
                hit for kind in kinds if kind.startswith("content") for hit in report.found(f"{kind}\x00{art.artifact_id}")
            ]
            found = []
            if id_hits:
                found.append(f"id found {len(id_hits)}x in {_names(id_hits)}")
            if content_hits:
                found.append(f"content found {len(content_hits)}x in {_names(content_hits)}")
            results[art.artifact_id] = ProbeResult(
                level=Level.PHYSICAL,
                passed=not found,
                measurement="; ".join(found) or None,
                evidence={
                    "files_scanned": [Path(f).name for f in report.files],
                    "bytes_scanned": report.bytes_scanned,
                    "patterns": sorted(kinds),
                    "id_hits": len(id_hits),
                    "content_hits": len(content_hits),
                },
                id_found=bool(id_hits),
                content_found=bool(content_hits),
            )
        return results

    def close(self) -> None:
        """Release connections and handles."""


def _names(hits) -> str:
    return ", ".join(sorted({Path(h.file).name for h in hits}))


def adapter_class(backend: str) -> type[Adapter]:
    """Load the adapter class registered for ``backend`` in the entry-point group."""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == backend]
    extra = KNOWN_BACKENDS.get(backend)
    hint = f"; install it with: pip install '{DISTRIBUTION}[{extra}]'" if extra else ""
    if not matches:
        raise AdapterNotFoundError(f"no adapter installed for backend {backend!r}{hint}")
    try:
        cls = matches[0].load()
    except ImportError as exc:
        raise AdapterNotFoundError(f"the {backend!r} adapter cannot be imported ({exc}){hint}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise AdapterError(f"entry point {backend!r} does not name an Adapter subclass")
    return cls


def available_backends() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def open_adapter(store: str, backend: str, options: Mapping[str, Any]) -> Adapter:
    return adapter_class(backend)(store, options)
