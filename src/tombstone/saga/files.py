"""Where a saga's receipt goes, and how a saga is recorded: the file each saga chooses when it is created (the
caller's, or a free default name under the receipts directory), never one another saga holds or chose."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tombstone.display import normal_subject
from tombstone.errors import ConfigError, SagaError, UnknownSubjectError
from tombstone.faults import kill_point
from tombstone.receipt.files import file_name_key, numbered, receipt_in, same_file_name
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


def _taken_by_others(ctx: SagaContext, saga_id: str, named: str | None = None) -> dict[Path, str]:
    """The receipt files other unfinished sagas have chosen, with the saga that chose each; with ``named``,
    only files whose name begins with it (compared as ``file_name_key`` does). A batch starts one saga after
    another, so without that each would read every file the ones before it chose."""
    prefix = None if named is None else os.path.normcase(named).casefold()
    return {out_path_of(ctx, stored): other for other, stored in ctx.lineage.running_out_paths().items()
            if other != saga_id
            and (prefix is None or os.path.normcase(os.path.basename(stored)).casefold().startswith(prefix))}


def free_receipt_path(ctx: SagaContext, base: Path, saga_id: str) -> Path:
    """The first of ``base``, ``base`` with ``.2``, ``.3``, ... before its suffix, that no file holds (or that
    holds this saga's own unsealed receipt) and no other unfinished saga has chosen. Call it under
    ``receipt_names_lock``."""
    # every candidate's name begins with the base's stem
    taken = {file_name_key(other) for other in _taken_by_others(ctx, saga_id, named=base.stem)}
    n = 1
    while True:
        candidate = numbered(base, n)
        if file_name_key(candidate) not in taken:
            held = receipt_in(candidate)
            if not candidate.exists() or (held is not None and held["saga_id"] == saga_id):
                return candidate
        n += 1


def user_out_path(ctx: SagaContext, out: str, saga_id: str) -> str:
    """Check a receipt file the caller named (``--out``) and return it as recorded (absolute). Refuses one that
    holds another saga's receipt (a sealed one above all), or that another unfinished saga will write.
    Call it under ``receipt_names_lock``."""
    path = Path(out).absolute()
    held = receipt_in(path)
    if held is not None and held["saga_id"] != saga_id:
        seq = ctx.lineage.receipt_seq(held["receipt_hash"])
        what = f"sealed receipt #{seq}" if seq is not None else "a receipt"
        raise ConfigError(f"--out {out} already holds {what} (saga {held['saga_id']}); refusing to overwrite it:"
                          " name another file, or leave --out out to get a new file under receipts_dir")
    for other_path, other in _taken_by_others(ctx, saga_id).items():
        if same_file_name(path, other_path):
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
                plan: dict[str, Any]) -> str:
    """Record a new saga with its plan and the receipt file it will write, chosen now (the caller's file, or
    a free default name) so that a resume after a crash writes the same file. Returns that file as recorded."""
    with ctx.lineage.receipt_names_lock():
        if out_path:
            stored = user_out_path(ctx, out_path, saga_id)
        else:
            stored = stored_out_path(ctx, free_receipt_path(ctx, ctx.receipt_path(subject), saga_id))
        kill_point("saga:create:before")
        ctx.lineage.create_saga(saga_id, subject, stored, plan=plan)
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
            stored = [create_saga(ctx, s.saga_id, s.subject, *s._creation) for s in part]
        for s, out in zip(part, stored):
            s.out_path, s._creation = out, None
            kill_point("saga:create:done")


__all__ = ["create_deferred", "create_saga", "free_receipt_path", "out_path_of", "stored_out_path", "user_out_path"]
