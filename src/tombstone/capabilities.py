"""What an adapter can do. Declared by each adapter, never inferred from the methods it overrides."""

from __future__ import annotations

import enum


class Capability(str, enum.Enum):
    """One thing an adapter declares it can do; the saga, the verify stages and the lattice read these."""

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
    SEMANTIC_PROBE = "semantic_probe"
    """The store's neighbourhoods can be measured before and after erasure (vector stores)."""
    MODEL_PROBE = "model_probe"
    """The store holds model weights that can be probed for what they learned from the artifact."""
    MANAGED = "managed"
    """A managed service: no access to persisted bytes at all."""


__all__ = ["Capability"]
