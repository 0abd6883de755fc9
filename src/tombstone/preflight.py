"""The preflight every state-changing command runs before it touches any store, and what a failure after the
first change says.

Before an erasure, a resume, a store reclaim, a compaction or a dead-letter retry changes anything, the
deployment is checked without writing a byte of it:

- the signing key loads, and its public half is the deployment's published ``keys/signing.pub`` (a key
  from another deployment would seal receipts nobody can verify against the published key);
- the receipts directory (and any file named with ``--out``) can be written: a temporary file is created
  and removed there (where the directory is still to be made, in the nearest folder that exists);
- the lineage db is healthy: it opened, and its schema is the current one;
- every store the command will touch opens read-only (:meth:`tombstone.contract.Adapter.open_read_only`:
  no write, no lock file, no recovery; Chroma's client reads a private copy), so a misspelt option, a
  wrong collection name, a missing or truncated store file is one line before anything changed.

A failure there is a TombstoneError (the CLI: one line, exit 2) and nothing was changed. A failure once an
erasure has begun (its saga is recorded) leaves the saga running: :func:`mark_under_way` gives the
exception the command that finishes it, and the CLI prints one line with it and exits 3.
"""

from __future__ import annotations

import os
import time
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tombstone.errors import (
    ConfigError,
    KeyMaterialError,
    LineageError,
    StoreUnavailableError,
    TombstoneError,
    shown,
)

RESUME_HINT = "tombstone_under_way"
"""The attribute :func:`mark_under_way` sets on an exception raised after the first change."""
NOTHING_CHANGED = "nothing was changed"


def check_deployment(config: Any, lineage: Any, *, out: str | Path | None = None) -> None:
    """The signing key, the receipts directory (and ``out``'s folder) and the lineage db: one TombstoneError
    naming the first problem; nothing is written."""
    check_signing_key(config.keys_dir)
    check_writable(Path(config.receipts_dir), "the receipts directory")
    if out is not None:
        check_writable(Path(out).absolute().parent, f"the folder of --out {out}")
    check_lineage(lineage)


def check_signing_key(keys_dir: Path) -> None:
    """The signing key loads and its public half is the published ``signing.pub``."""
    from cryptography.hazmat.primitives import serialization

    from tombstone.keys import PUBLIC_KEY, SIGNING_KEY, load_private_key, load_public_key

    try:
        private = load_private_key(keys_dir)
    except KeyMaterialError as exc:
        raise KeyMaterialError(f"{cause(exc)}; {NOTHING_CHANGED}") from exc
    published_path = keys_dir / PUBLIC_KEY
    if not published_path.is_file():
        raise KeyMaterialError(f"no published public key at {published_path}: receipts signed now could not be"
                               f" checked with 'tombstone receipt verify --key {published_path}'; restore it from"
                               f" where it was published; {NOTHING_CHANGED}")
    try:
        published = load_public_key(published_path)
    except KeyMaterialError as exc:
        raise KeyMaterialError(f"{cause(exc)}; {NOTHING_CHANGED}") from exc
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    if private.public_key().public_bytes(*raw) != published.public_bytes(*raw):
        raise KeyMaterialError(f"the signing key {keys_dir / SIGNING_KEY} is not this deployment's: its public"
                               f" half does not match {published_path}, so its receipts would fail 'tombstone"
                               f" receipt verify --key {published_path}'; restore the deployment's signing key;"
                               f" {NOTHING_CHANGED}")


def check_writable(folder: Path, what: str) -> None:
    """``folder`` can take a new file: one is created with ``mkstemp`` and removed at once. A folder not made
    yet is checked through the nearest folder that exists (which must be a folder)."""
    probe = folder
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{what} {folder} cannot be used: {probe} is not a folder; {NOTHING_CHANGED}")
    try:
        fd, name = tempfile.mkstemp(prefix=".tombstone-preflight-", suffix=".tmp", dir=probe)
    except OSError as exc:
        raise ConfigError(f"{what} {folder} is not writable ({exc.strerror or exc}): receipts could not be"
                          f" written there; {NOTHING_CHANGED}") from exc
    os.close(fd)
    os.unlink(name)


def check_lineage(lineage: Any) -> None:
    """The lineage db opened (the caller holds it open) and its schema is the current one."""
    from tombstone.lineage.migrations import MIGRATIONS

    current = max(version for version, _, _ in MIGRATIONS)
    try:
        version = lineage.schema_version()
        lineage.sagas("running")
    except Exception as exc:  # a damaged file: SQLite's or PostgreSQL's own error
        if isinstance(exc, TombstoneError):
            raise
        raise LineageError(f"lineage db {lineage.where} cannot be read ({cause(exc)}); {NOTHING_CHANGED}") from exc
    if version != current:
        raise LineageError(f"lineage db {lineage.where} has schema version {version}, not {current};"
                           f" {NOTHING_CHANGED}")


def check_stores(config: Any, stores: Iterable[str], allow_missing: Iterable[str] = (), *,
                 nothing_changed: bool = True) -> list[str]:
    """Open every store in ``stores`` read-only and close it again. A store not configured, a backend no
    installed adapter serves, an option missing or wrong, a store that cannot be opened: one TombstoneError.
    Stores in ``allow_missing`` that cannot be opened are passed over (their artifacts end UNVERIFIED(no
    adapter)). A backend without a read-only mode is only looked up (its store is opened by the saga). With
    ``nothing_changed`` the error says that nothing was changed (not so for a saga under way).

    Returns the stores some of whose files (or their folders) this process cannot write. Such a store may be
    meant to be read-only (its reclaim is then skipped, and the receipt says why), or its client may refuse
    to open it: the caller opens these first, before any store whose client writes when it opens."""
    from tombstone.contract import adapter_class
    from tombstone.lineage.records import THIRD_PARTY_STORE

    allowed = set(allow_missing)
    unwritable = []
    for store in sorted(set(stores) - {THIRD_PARTY_STORE}):
        try:
            if store not in config.stores:
                raise ConfigError(
                    f"store {store!r} holds artifacts of this erasure (the lineage db says so) but is not configured"
                    f" in {config.path}; restore it in the config, or pass --allow-missing-store {store} to erase"
                    " without it (its artifacts will be UNVERIFIED(no adapter))", store=store)
            cfg = config.stores[store]
            cls = adapter_class(cfg.backend)
            if not cls.read_only_supported:
                continue
            try:
                writable = _preflight_store(cls, store, dict(cfg.options))
            except TombstoneError:
                raise
            except Exception as exc:  # a vendor's error the adapter did not map
                raise StoreUnavailableError(f"store {store!r} cannot be opened: {cause(exc)}", store=store) from exc
            if not writable:
                unwritable.append(store)
        except TombstoneError as exc:
            if store in allowed:
                continue
            if not nothing_changed:
                raise
            said = nothing_changed_error(exc, store)
            if said is exc:
                raise
            raise said from exc
    return unwritable


def _preflight_store(cls: Any, store: str, options: dict[str, Any], attempts: int = 3) -> bool:
    """``cls.preflight``, tried again when the store could not be read: an application writing to it at the
    same moment may have replaced the file the check was reading (a new index generation)."""
    for attempt in range(attempts):
        try:
            return cls.preflight(store, options)
        except StoreUnavailableError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def nothing_changed_error(exc: TombstoneError, store: str | None = None) -> TombstoneError:
    """``exc``, of the same type, saying that nothing was changed (as it is if it says so, or if its type
    takes other fields)."""
    if NOTHING_CHANGED in str(exc):
        return exc
    try:
        return type(exc)(f"{exc}; {NOTHING_CHANGED}", store=store or exc.store)
    except TypeError:
        return exc


def stores_of_plan(plan: dict[str, Any] | None) -> set[str]:
    """The stores a recorded saga's plan touches (a store reclaim's store included)."""
    plan = plan or {}
    stores = {str(entry[0]) for entry in plan.get("artifacts") or []}
    if plan.get("store"):
        stores.add(str(plan["store"]))
    return stores


def cause(exc: BaseException) -> str:
    """What went wrong, as one line: a TombstoneError's message, anything else with its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines)
    if isinstance(exc, TombstoneError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def resume_command(config_path: Path) -> str:
    return f"tombstone resume --config {config_path}"


def mark_under_way(exc: BaseException, what: str, config_path: Path) -> BaseException:
    """Note on ``exc``, raised once ``what`` (an erasure, a store reclaim) has begun, how to finish it; the
    CLI prints that in the error's line and exits 3. Returns ``exc``."""
    if getattr(exc, RESUME_HINT, None) is None:
        hint = f"{what} is under way: fix that and run '{resume_command(config_path)}'"
        try:
            setattr(exc, RESUME_HINT, hint)
        except (AttributeError, TypeError):  # an exception type that takes no attributes
            pass
    return exc


def under_way_hint(exc: BaseException) -> str | None:
    """The note :func:`mark_under_way` left on ``exc``, or None."""
    return getattr(exc, RESUME_HINT, None)


def what_of(subjects: list[str]) -> str:
    """How the hint names the erasure: one subject's, a store reclaim, or a batch."""
    if len(subjects) == 1:
        subject = subjects[0]
        if subject.startswith("store:"):
            return f"the reclaim of store {shown(subject[len('store:'):])}"
        return f"the erasure of {shown(subject)}"
    return f"the erasure of {len(subjects)} subjects"


__all__ = ["NOTHING_CHANGED", "cause", "check_deployment", "check_lineage", "check_signing_key", "check_stores",
           "check_writable", "mark_under_way", "resume_command", "stores_of_plan", "under_way_hint", "what_of"]
