"""Tombstone: erase a data subject from a RAG deployment and prove, level by level, how far it went.

``import tombstone`` imports no vendor client: each backend adapter imports its own SDK.
"""

from tombstone.api import Tombstone, init_deployment
from tombstone.contract import Adapter, Capability, ProbeResult, adapter_class, available_backends
from tombstone.errors import TombstoneError
from tombstone.lineage.db import ArtifactRecord, LineageDB
from tombstone.verify.levels import Findings, Level, Status, StatusKind, decide

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "ArtifactRecord",
    "Capability",
    "Findings",
    "Level",
    "LineageDB",
    "ProbeResult",
    "Status",
    "StatusKind",
    "Tombstone",
    "TombstoneError",
    "__version__",
    "adapter_class",
    "available_backends",
    "decide",
    "init_deployment",
]
