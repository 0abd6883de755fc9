"""What the lineage db knows about one artifact, and how a fingerprint is encoded.

An :class:`ArtifactRecord` names an artifact (store, id, backend, kind) and carries its fingerprint:
the first :data:`FINGERPRINT_DIMS` dimensions of its vector as float32 values, persisted as
little-endian bytes (:func:`fingerprint_bytes`). Never the artifact's content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FINGERPRINT_DIMS = 32
"""How many leading dimensions of a vector its fingerprint keeps."""
THIRD_PARTY_STORE = "third-party"
"""The pseudo-store copies sent to third parties are recorded under (see ``LineageDB.record_third_party``)."""
EXTERNAL_BACKEND = "external"
"""Backend name of third-party copies: no adapter can reach them."""
DERIVED_KINDS = frozenset({"cache_entry", "semantic_cache_entry"})
"""Artifact kinds that are always derived from another artifact, so a missing source is a lineage gap."""


def fingerprint_of(vector: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    """The artifact's fingerprint: the first 32 dimensions of its vector, as float32 values."""
    arr = np.asarray(vector, dtype=np.float32).ravel()[:FINGERPRINT_DIMS]
    return tuple(float(x) for x in arr)


def fingerprint_bytes(fingerprint: Sequence[float]) -> bytes:
    """The fingerprint as the float32 little-endian bytes a store would persist."""
    return np.asarray(fingerprint, dtype="<f4").tobytes()


@dataclass(frozen=True)
class ArtifactRecord:
    """One artifact as the lineage db knows it. Never its content."""

    store: str
    """Configured store name."""
    artifact_id: str
    """The id the store knows the artifact by."""
    backend: str
    """Adapter name of the store."""
    kind: str
    """What the artifact is: ``document``, ``vector``, ``cache_entry``, ..."""
    subject_key: str = ""
    """Keyed hash of the owning subject (filled in by the db)."""
    fingerprint: tuple[float, ...] | None = None
    """First 32 dims of the vector, for vector artifacts."""
    content_hash: str | None = None
    """sha256 hex of the content."""
    created_at: str = ""
    """When the wrapper recorded it."""
    state: str = "live"
    """live, suppressed, reclaimed or decided."""
    inv_norm: float | None = None
    """1 / L2 norm of the full vector (float32), for stores that persist normalised vectors."""

    def __post_init__(self) -> None:
        if not self.artifact_id or not isinstance(self.artifact_id, str):
            raise ValueError("artifact_id must be a non-empty string")
        if self.fingerprint is not None and len(self.fingerprint) > FINGERPRINT_DIMS:
            raise ValueError("fingerprint holds at most 32 dims")
