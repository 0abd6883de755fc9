"""The exception tree every Tombstone failure belongs to.

::

    TombstoneError
    ├── ConfigError              missing, unreadable or invalid tombstone.toml
    ├── KeyMaterialError         signing key or lineage secret missing or unusable
    ├── UnknownSubjectError      the lineage db has no artifact for the subject
    ├── LineageError             the lineage db is unreadable or inconsistent
    ├── ScopeViolationError      the saga was asked to touch another subject's artifact
    ├── NotSuppressedError       a status was requested for an artifact with no suppression record
    ├── AdapterError             an adapter could not do what was asked
    │   ├── AdapterNotFoundError no installed adapter for a backend name
    │   ├── StoreUnavailableError the store cannot be opened or read (``retryable``)
    │   ├── PhysicalUnsupportedError the backend cannot be checked at the physical level
    │   └── ReclaimUnavailableError this store cannot be reclaimed here (e.g. not writable)
    ├── ReceiptError             a receipt fails its schema, was tampered with, or fails its signature
    ├── ReceiptFormatError       a file is not a readable receipt (missing, not strict JSON)
    ├── DeadLetterError          a store operation failed past its retry budget; its artifacts went to the dead-letter list
    └── SagaError                a saga cannot run (already running, nothing to resume, ...)
        └── SubjectBusyError     another process or worker is running this subject's saga

Context travels as keyword-only fields (``store=``, ``subject=``) so that the CLI and the
saga can report it without parsing messages; ``retryable`` tells the saga whether backing off
and trying again can help.
"""

from __future__ import annotations


class TombstoneError(Exception):
    """Root of every error Tombstone raises on purpose.

    The CLI turns any ``TombstoneError`` into one line on stderr and a non-zero exit.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        store: str | None = None,
        subject: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.store = store
        """Name of the store involved, when one is."""
        self.subject = subject
        """Subject reference involved, when one is."""
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return self.message


class ConfigError(TombstoneError):
    """The configuration file is missing, unreadable or invalid."""


class KeyMaterialError(TombstoneError):
    """The signing key or the lineage secret is missing or unusable."""


class UnknownSubjectError(TombstoneError):
    """The lineage db records no artifact for this subject."""


class LineageError(TombstoneError):
    """The lineage db cannot be opened or is inconsistent."""


class ScopeViolationError(TombstoneError):
    """An erasure would touch an artifact that belongs to another subject."""


class NotSuppressedError(TombstoneError):
    """A status was requested for an artifact that has no durable suppression record."""


class AdapterError(TombstoneError):
    """An adapter failed to perform an operation."""


class AdapterNotFoundError(AdapterError):
    """No installed adapter answers to the backend name."""


class StoreUnavailableError(AdapterError):
    """The store cannot be opened, read or written right now."""

    retryable = True


class PhysicalUnsupportedError(AdapterError):
    """The backend offers no way to inspect its persisted bytes.

    Raised by ``probe_physical`` instead of reporting absence: the lattice turns it into
    UNVERIFIED, never VERIFIED.
    """


class ReclaimUnavailableError(AdapterError):
    """The store's reclaim recipe cannot run here (read-only files, missing privileges).

    Not a failure of the saga: the reclaim step records why it was skipped and the probes report
    what is still there.
    """


class ReceiptError(TombstoneError):
    """A receipt does not match its schema, has been altered, or its signature does not verify."""


class ReceiptFormatError(TombstoneError):
    """A file is not a readable receipt: missing, unreadable, too large, not strict JSON (duplicate keys,
    NaN or Infinity, nesting too deep) or not a JSON object. Bad input, not a failed verification."""


class DeadLetterError(TombstoneError):
    """A store operation failed past its retry budget (or with an error retrying cannot help); its
    artifacts went to the dead-letter list, which ``tombstone dlq retry`` tries again."""

    def __init__(self, error: str, attempts: int, *, store: str | None = None) -> None:
        super().__init__(error, store=store)
        self.error = error
        """The last failure, as one line."""
        self.attempts = attempts
        """How many times the operation was tried."""


class SagaError(TombstoneError):
    """A saga cannot be started or resumed."""


class SubjectBusyError(SagaError):
    """Another process (or worker) is running this subject's saga."""


SHOWN_SUBJECT_CHARS = 80


def shown(subject: str) -> str:
    """A subject reference as error messages echo it: quoted, and cut to 80 characters."""
    text = repr(subject)
    return text if len(text) <= SHOWN_SUBJECT_CHARS else text[: SHOWN_SUBJECT_CHARS - 4] + "...'"
