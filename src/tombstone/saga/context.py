"""What a saga needs from the deployment, and nothing more: the saga never sees the ``Tombstone`` facade."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tombstone.clock import Clock
from tombstone.verify.runner import ALL_LEVELS
from tombstone.verify.levels import Level


@dataclass(frozen=True)
class RetryPolicy:
    """How the saga retries a store error marked retryable: exponential backoff, bounded."""

    attempts: int = 4
    """Tries in all, the first included; after the last the artifacts go to the dead-letter list."""
    base_seconds: float = 0.5
    """The first wait; each further wait doubles."""
    cap_seconds: float = 8.0
    """No single wait is longer."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_seconds < 0 or self.cap_seconds < 0:
            raise ValueError("attempts >= 1 and non-negative waits")

    def wait(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failure."""
        return min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1))


@dataclass
class SagaContext:
    """The deployment as a saga sees it."""

    lineage: Any
    """The open lineage db (``tombstone.lineage.db.LineageDB``)."""
    adapter: Callable[[str], Any]
    """The adapter serving a configured store; raises AdapterNotFoundError or ConfigError."""
    clock: Clock
    """The time source for receipts and the journal."""
    sleep: Callable[[float], None]
    """How to wait between retries (tests pass a fake)."""
    retry: RetryPolicy
    """Retries of store errors marked retryable."""
    signer: Callable[[], Ed25519PrivateKey]
    """Loads the deployment's signing key, when a receipt is to be signed."""
    receipt_path: Callable[[str], Path]
    """Where a subject's receipt goes when the caller named no file (before a counter is added to a name
    that is taken)."""
    levels: frozenset[Level] = ALL_LEVELS
    """The verification levels the deployment enables."""
    auditors: tuple[Any, ...] = ()
    """Auditors' X25519 public keys: receipts seal content patterns to them (none: no patterns at all)."""
    has_store: Callable[[str], bool] = lambda store: True
    """Whether the configuration lists a store (to tell a removed store from a broken one)."""
    receipts_dir: Path | None = None
    """The directory default receipt names are recorded relative to (so a moved deployment's resume writes
    into its own receipts directory); paths outside it are recorded whole."""
    scan_store: Callable[[str], Any] = lambda store: None
    """``tombstone scan`` of a configured store (a ``tombstone.scan.ScanReport``), or None where its backend
    has no scan: what a store reclaim counts before and after."""
    reopen: Callable[[str], None] = lambda store: None
    """Close a store's adapter so the next use opens it again (after a recipe rewrote the store's files)."""
    backups: tuple[Any, ...] = ()
    """The deployment's declared copies (``tombstone.config.BackupConfig``): each erasure receipt lists those
    that still hold the subject, and until when."""


__all__ = ["RetryPolicy", "SagaContext"]
