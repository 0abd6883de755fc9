"""Where a saga's receipt goes, and how a saga is recorded: the file each saga chooses when it is created (the
caller's, or a free default name under the receipts directory), never one another saga holds or chose."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tombstone.display import normal_subject
from tombstone.errors import ConfigError, SagaError, UnknownSubjectError
from tombstone.faults import kill_point
from tombstone.receipt.files import file_name_key, numbered, receipt_in
from tombstone.saga.context import SagaContext

if TYPE_CHECKING:
    from tombstone.saga.engine import Saga


def out_path_of(ctx: SagaContext, stored: str) -> Path:
    """A recorded receipt path as a file: a relative one is inside the receipts directory (an absolute one is
    a file the caller named with ``--out``). A relative one that would leave the receipts directory is
    refused: only ``--out`` writes a receipt elsewhere."""
    path = Path(stored)
    if path.is_absolute():
        return path
    if not path.parts or ".." in path.parts:
        raise SagaError(f"the receipt file recorded for this saga, {stored!r}, is not inside the receipts directory;"
                        " refusing to write there (only --out names a file elsewhere)")
    return Path(ctx.receipts_dir or ".") / path


def stored_out_path(ctx: SagaContext, path: Path) -> str:
    """How a chosen default receipt file is recorded: relative to the receipts directory when inside it."""
    if ctx.receipts_dir is not None:
        try:
            return path.relative_to(ctx.receipts_dir).as_posix()
        except ValueError:
            pass
    return str(path.absolute())


class RunningFiles:
    """The receipt files unfinished sagas have chosen, by name (``file_name_key``), with the sagas that chose
    each: read once and kept up to date by the caller (``chose``) while it creates a batch's sagas under
    ``receipt_names_lock``, rather than read again for each saga (a batch of n sagas read n times n rows)."""

    def __init__(self, ctx: SagaContext) -> None:
        self.ctx = ctx
        self._by_key: dict[str, set[str]] = {}
        for saga_id, stored in ctx.lineage.running_out_paths().items():
            self.chose(saga_id, stored)

    def chose(self, saga_id: str, stored: str) -> None:
        """``saga_id`` will write ``stored`` (as ``stored_out_path`` or ``user_out_path`` recorded it). A recorded
        path that leaves the receipts directory is passed over: its saga refuses to write there (``out_path_of``),
        and it does not stop other sagas from choosing theirs."""
        try:
            path = out_path_of(self.ctx, stored)
        except SagaError:
            return
        self._by_key.setdefault(file_name_key(path), set()).add(saga_id)

    def other(self, path: Path, saga_id: str) -> str | None:
        """The unfinished saga other than ``saga_id`` that chose ``path`` (by name), or None."""
        return next((other for other in sorted(self._by_key.get(file_name_key(path), ())) if other != saga_id), None)


def free_receipt_path(ctx: SagaContext, base: Path, saga_id: str, running: RunningFiles | None = None) -> Path:
    """The first of ``base``, ``base`` with ``.2``, ``.3``, ... before its suffix, that no file holds (or that
    holds this saga's own unsealed receipt) and no other unfinished saga has chosen (``running``: read now when
    not given). Call it under ``receipt_names_lock``."""
    running = running or RunningFiles(ctx)
    n = 1
    while True:
        candidate = numbered(base, n)
        if running.other(candidate, saga_id) is None:
            held = receipt_in(candidate)
            if not candidate.exists() or (held is not None and held["saga_id"] == saga_id):
                return candidate
        n += 1


def user_out_path(ctx: SagaContext, out: str, saga_id: str, running: RunningFiles | None = None) -> str:
    """Check a receipt file the caller named (``--out``) and return it as recorded (absolute). Refuses one that
    holds another saga's receipt (a sealed one above all), or that another unfinished saga will write
    (``running``: read now when not given). Call it under ``receipt_names_lock``."""
    path = Path(out).absolute()
    held = receipt_in(path)
    if held is not None and held["saga_id"] != saga_id:
        seq = ctx.lineage.receipt_seq(held["receipt_hash"])
        what = f"sealed receipt #{seq}" if seq is not None else "a receipt"
        raise ConfigError(f"--out {out} already holds {what} (saga {held['saga_id']}); refusing to overwrite it:"
                          " name another file, or leave --out out to get a new file under receipts_dir")
    other = (running or RunningFiles(ctx)).other(path, saga_id)
    if other is not None:
        raise ConfigError(f"--out {out} is where unfinished saga {other} will write its receipt; name another file")
    return str(path)


def _normal(subject: str) -> str:
    """A subject reference as sagas and receipts carry it: NFC, valid Unicode, not empty."""
    if not subject or not subject.strip():
        raise UnknownSubjectError("subject reference is empty")
    try:
        return normal_subject(subject)
    except ValueError as exc:
        raise UnknownSubjectError(str(exc)) from exc


def create_saga(ctx: SagaContext, saga_id: str, subject: str, out_path: str | None,
                plan: dict[str, Any], running: RunningFiles | None = None) -> str:
    """Record a new saga with its plan and the receipt file it will write, chosen now (the caller's file, or
    a free default name) so that a resume after a crash writes the same file. Returns that file as recorded.
    ``running``: the files unfinished sagas chose, kept by a caller that creates many (read now when not
    given); the new saga's file is added to it."""
    with ctx.lineage.receipt_names_lock():
        running = running or RunningFiles(ctx)
        if out_path:
            stored = user_out_path(ctx, out_path, saga_id, running)
        else:
            stored = stored_out_path(ctx, free_receipt_path(ctx, ctx.receipt_path(subject), saga_id, running))
        kill_point("saga:create:before")
        ctx.lineage.create_saga(saga_id, subject, stored, plan=plan)
        running.chose(saga_id, stored)
    return stored


def create_deferred(ctx: SagaContext, sagas: Sequence["Saga"], chunk: int = 256) -> None:
    """Record the sagas started with ``defer_create`` (with their plans and receipt files), up to ``chunk`` in
    one transaction, under the receipt-names lock until it commits: one commit for a batch's new sagas rather
    than one each. A failure records none of the chunk."""
    waiting = [s for s in sagas if s._creation is not None]
    for start in range(0, len(waiting), chunk):
        part = waiting[start : start + chunk]
        # the lock is held until the transaction commits: no other process chooses a name the batch has chosen
        with ctx.lineage.receipt_names_lock(), ctx.lineage.atomic():
            running = RunningFiles(ctx)  # read once for the chunk, each new saga's file added as it is chosen
            stored = [create_saga(ctx, s.saga_id, s.subject, *s._creation, running=running) for s in part]
        for s, out in zip(part, stored):
            s.out_path, s._creation = out, None
            kill_point("saga:create:done")


__all__ = ["RunningFiles", "create_deferred", "create_saga", "free_receipt_path", "out_path_of", "stored_out_path",
           "user_out_path"]
