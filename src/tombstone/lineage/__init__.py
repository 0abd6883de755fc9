"""The lineage db: which subject owns which artifact, in which store, derived from what."""

from tombstone.lineage.db import ArtifactRecord, LineageDB

__all__ = ["ArtifactRecord", "LineageDB"]
