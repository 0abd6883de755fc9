"""Tombstone: erase a data subject from a RAG deployment and prove, level by level, how far it went.

``import tombstone`` imports no vendor client: each backend adapter imports its own SDK.
"""

from tombstone.api import Tombstone, init_deployment
from tombstone.capabilities import Capability
from tombstone.contract import Adapter, adapter_class, available_backends
from tombstone.errors import TombstoneError
from tombstone.lineage.db import LineageDB
from tombstone.lineage.records import ArtifactRecord
from tombstone.receipt.model import Receipt
from tombstone.verify.levels import Findings, Level, Status, StatusKind, decide
from tombstone.verify.result import NotRun, ProbeResult
from tombstone.version import __version__

__all__ = [
    "Adapter",
    "ArtifactRecord",
    "Capability",
    "Findings",
    "Level",
    "LineageDB",
    "NotRun",
    "ProbeResult",
    "Receipt",
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
