"""The lineage db: which subject owns which artifact, in which store, derived from what."""

from tombstone.lineage.db import LineageDB
from tombstone.lineage.guard import forbid_lineage
from tombstone.lineage.locks import AdvisoryLock, FileLock
from tombstone.lineage.postgres import is_dsn, redact_dsn
from tombstone.lineage.records import (
    DERIVED_KINDS,
    EXTERNAL_BACKEND,
    FINGERPRINT_DIMS,
    THIRD_PARTY_STORE,
    ArtifactRecord,
    fingerprint_bytes,
    fingerprint_of,
)

__all__ = [
    "DERIVED_KINDS",
    "EXTERNAL_BACKEND",
    "FINGERPRINT_DIMS",
    "THIRD_PARTY_STORE",
    "AdvisoryLock",
    "ArtifactRecord",
    "FileLock",
    "LineageDB",
    "fingerprint_bytes",
    "fingerprint_of",
    "forbid_lineage",
    "is_dsn",
    "redact_dsn",
]
