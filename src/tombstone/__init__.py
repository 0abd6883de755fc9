"""Tombstone: erase a data subject from a RAG deployment and prove, level by level, how far it went.

``import tombstone`` imports no vendor client: each backend adapter imports its own SDK.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tombstone.version import __version__

_EXPORTS = {
    "Tombstone": "tombstone.api", "init_deployment": "tombstone.api",
    "Capability": "tombstone.capabilities",
    "Adapter": "tombstone.contract", "adapter_class": "tombstone.contract", "available_backends": "tombstone.contract",
    "TombstoneError": "tombstone.errors",
    "LineageDB": "tombstone.lineage.db",
    "ArtifactRecord": "tombstone.lineage.records",
    "Receipt": "tombstone.receipt.model",
    "Findings": "tombstone.verify.levels", "Level": "tombstone.verify.levels", "Status": "tombstone.verify.levels",
    "StatusKind": "tombstone.verify.levels", "decide": "tombstone.verify.levels",
    "NotRun": "tombstone.verify.result", "ProbeResult": "tombstone.verify.result",
}
"""Where each public name lives. They are imported on first use (PEP 562), so that ``tombstone --help`` and
``tombstone --version`` do not pay for numpy and the lineage db's imports."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tombstone' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from tombstone.api import Tombstone, init_deployment
    from tombstone.capabilities import Capability
    from tombstone.contract import Adapter, adapter_class, available_backends
    from tombstone.errors import TombstoneError
    from tombstone.lineage.db import LineageDB
    from tombstone.lineage.records import ArtifactRecord
    from tombstone.receipt.model import Receipt
    from tombstone.verify.levels import Findings, Level, Status, StatusKind, decide
    from tombstone.verify.result import NotRun, ProbeResult

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
