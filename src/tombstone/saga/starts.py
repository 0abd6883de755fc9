"""How a saga begins: a subject's erasure started (or the unfinished one continued) under the subject's lock,
named artifacts' erasure, a store reclaim, a backup's recheck, a subject the lineage db does not know, and a
saga resumed by its id. Mixed into :class:`tombstone.saga.engine.Saga`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tombstone.errors import (
    AdapterNotFoundError,
    ConfigError,
    SagaError,
    ScopeViolationError,
    UnknownSubjectError,
    shown,
)
from tombstone.lineage.records import THIRD_PARTY_STORE, ArtifactRecord
from tombstone.receipt.signing import BACKUP_RECHECK_KIND, RECEIPT_KIND, SOURCE_RECEIPT_KIND, STORE_RECLAIM_KIND
from tombstone.saga.context import SagaContext
from tombstone.saga.files import _normal, create_deferred, create_saga, user_out_path
from tombstone.saga.lock import SubjectLock

if TYPE_CHECKING:
    from tombstone.saga.engine import Saga


def _context(owner: Any) -> SagaContext:
    """A SagaContext, or the context of an object that holds one (an open ``Tombstone``)."""
    return owner if isinstance(owner, SagaContext) else owner.context


def _subject_locked(ctx: SagaContext, subject: str, wait: float = 0.0) -> tuple[str, SubjectLock]:
    """The subject's key and its lock, taken (one saga per subject, or reference, at a time)."""
    key = ctx.lineage.subject_key(subject)
    lock = SubjectLock(ctx.lineage, key)
    lock.acquire(subject=subject, wait=wait)
    return key, lock


class SagaStarts:
    """The constructors of :class:`~tombstone.saga.engine.Saga` (each returns an instance of the class it is called on)."""

    @classmethod
    def start(cls, owner: Any, subject: str, out_path: str | None = None,
              artifacts: list[tuple[str, str]] | None = None, wait: float = 0.0,
              allow_missing: Sequence[str] = (), defer_create: bool = False,
              closure: list[tuple[ArtifactRecord, str]] | None = None) -> "Saga":
        """Start an erasure, or continue the unfinished one for the same subject.

        ``owner`` is a SagaContext or an open Tombstone. ``artifacts`` limits the erasure to some
        (store, id) pairs of the subject's lineage graph; asking for anything outside it — another
        subject's artifact — raises ScopeViolationError. Every store in scope must be configured and
        served by an installed adapter, or the saga does not start (ConfigError, AdapterNotFoundError);
        stores named in ``allow_missing`` (deliberately removed) are erased without, and their artifacts
        end UNVERIFIED(no adapter). With ``defer_create``, a new saga is recorded only by
        :func:`create_deferred` (a batch records all of its new sagas in one transaction). ``closure`` is the
        subject's lineage closure (``LineageDB.closure``) as the caller has just read it (a batch reads each
        subject's once, for its preflight and its plan).
        """
        ctx = _context(owner)
        subject = _normal(subject)
        key = ctx.lineage.subject_key(subject)
        scope = ctx.lineage.closure(key) if closure is None else list(closure)
        if not scope:
            raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it",
                                      subject=subject)
        if artifacts is not None:
            known = {(a.store, a.artifact_id): (a, why) for a, why in scope}
            outside = [pair for pair in artifacts if tuple(pair) not in known]
            if outside:
                store, aid = outside[0]
                raise ScopeViolationError(
                    f"artifact {aid} in store {store} is not in {shown(subject)}'s lineage graph (another subject's, or unknown)",
                    store=store, subject=subject)
            scope = [known[tuple(pair)] for pair in artifacts]
        # One saga per subject at a time: taken before looking for a running saga, so two processes
        # never both continue (or both create) one. Held until the saga ends or the process dies.
        lock = SubjectLock(ctx.lineage, key)
        lock.acquire(subject=subject, wait=wait)
        try:
            return cls._start_locked(ctx, subject, key, scope, out_path, lock, frozenset(allow_missing), defer_create)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def start_artifacts(cls, owner: Any, reference: str, artifacts: Sequence[tuple[str, str]], *,
                        kind: str = SOURCE_RECEIPT_KIND, statement: str | None = None, why: str = "named",
                        out_path: str | None = None, wait: float = 0.0,
                        allow_missing: Sequence[str] = ()) -> "Saga":
        """Erase named (store, id) artifacts, whoever owns them, under ``reference`` (not a subject: e.g. the
        source whose superseded records an index cleanup removes), plus everything derived from them.

        The receipt is of ``kind`` (``SOURCE_RECEIPT_KIND``) with ``reference`` as its subject and
        ``statement`` saying why these records went; each artifact's scope is ``why`` (or what it was
        derived from). Every artifact must be recorded in the lineage db (ScopeViolationError otherwise).
        One saga per reference at a time, as per subject: when one is unfinished, it is returned instead
        (``continued`` is True): run it, then start again.
        """
        ctx = _context(owner)
        if not reference or not reference.strip():
            raise UnknownSubjectError("reference is empty")
        if kind == RECEIPT_KIND:
            raise ValueError("a subject's erasure starts with Saga.start")
        pairs = list(dict.fromkeys((str(store), str(aid)) for store, aid in artifacts))
        if not pairs:
            raise UnknownSubjectError(f"nothing to erase for {shown(reference)}: no artifacts named")
        scope: dict[tuple[str, str], tuple[ArtifactRecord, str]] = {}
        frontier = []
        for store, aid in pairs:
            art = ctx.lineage.artifact(store, aid)
            if art is None:
                raise ScopeViolationError(f"artifact {aid} in store {store} is not recorded in the lineage db",
                                          store=store)
            scope[(store, aid)] = (art, why)
            frontier.append(art)
        while frontier:  # what was derived from them (a cached answer built from a chunk) goes with them
            src = frontier.pop()
            for dst_store, dst_id, relation in ctx.lineage.edges_of(src)["derived"]:
                if (dst_store, dst_id) not in scope and (derived := ctx.lineage.artifact(dst_store, dst_id)):
                    scope[(dst_store, dst_id)] = (derived, f"{relation} from {src.store}/{src.artifact_id}")
                    frontier.append(derived)
        key, lock = _subject_locked(ctx, reference, wait)
        try:
            running = ctx.lineage.running_saga(key)
            if running is not None:
                plan = ctx.lineage.step_result(running["saga_id"], "plan") or {}
                if plan.get("kind", RECEIPT_KIND) != kind:
                    raise SagaError(f"{shown(reference)} has an unfinished erasure of another kind; finish it with"
                                    " 'tombstone resume' first")
                saga = cls(ctx, running["saga_id"], reference, running["out_path"], lock)
                saga.continued = True
                return saga
            ordered = sorted(scope.values(), key=lambda pair: (pair[0].store, pair[0].artifact_id))
            preflight(ctx, {a.store for a, _ in ordered}, frozenset(allow_missing))
            saga_id = str(uuid.uuid4())
            stored = create_saga(ctx, saga_id, reference, out_path, plan={
                "artifacts": [[a.store, a.artifact_id, reason] for a, reason in ordered],
                "kind": kind, "statement": statement})
            return cls(ctx, saga_id, reference, stored, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def start_store_reclaim(cls, owner: Any, store: str, *, out_path: str | None = None,
                            wait: float = 0.0) -> "Saga":
        """Reclaim a whole store: apply its backend's recipe to everything its own client already deleted
        (``Adapter.reclaim_store``), with ``tombstone scan`` before and after. Journaled like any saga (the
        scan before, the recipe, the scan after are steps, so a resume keeps the first count), and sealed by
        a receipt of kind ``STORE_RECLAIM_KIND`` whose subject is ``store:NAME``. One at a time per store."""
        ctx = _context(owner)
        if not ctx.has_store(store):
            raise ConfigError(f"store {store!r} is not configured", store=store)
        reference = f"store:{store}"
        key, lock = _subject_locked(ctx, reference, wait)
        try:
            running = ctx.lineage.running_saga(key)
            if running is not None:
                return cls(ctx, running["saga_id"], reference, running["out_path"], lock)
            saga_id = str(uuid.uuid4())
            stored = create_saga(ctx, saga_id, reference, out_path, plan={
                "artifacts": [], "kind": STORE_RECLAIM_KIND, "store": store,
                "statement": f"store {store}: the reclaim recipe applied to the whole store, for what its own"
                             " client had already deleted; no subject's records were named"})
            return cls(ctx, saga_id, reference, stored, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def start_backup_recheck(cls, owner: Any, subject: str, section: dict[str, Any], statement: str,
                             wait: float = 0.0) -> "Saga":
        """A follow-up of a subject's erasure: what the physical probe found in a restored copy of a declared
        backup (``tombstone.backups``), sealed in the subject's chain as a receipt of kind
        ``BACKUP_RECHECK_KIND`` with no artifacts and its ``backup_recheck`` section. Nothing is touched."""
        ctx = _context(owner)
        subject = _normal(subject)
        key, lock = _subject_locked(ctx, subject, wait)
        try:
            if ctx.lineage.running_saga(key) is not None:
                raise SagaError(f"an erasure of {shown(subject)} is under way: finish it ('tombstone resume') first")
            saga_id = str(uuid.uuid4())
            stored = create_saga(ctx, saga_id, subject, None, plan={
                "artifacts": [], "kind": BACKUP_RECHECK_KIND, "statement": statement, "backup_recheck": section})
            return cls(ctx, saga_id, subject, stored, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def start_unknown(cls, owner: Any, subject: str, defer_create: bool = False) -> "Saga":
        """A saga for a subject the lineage db records nothing for: its receipt says so, signed and chained,
        so a batch can account for every subject it was given. ``defer_create`` as for :meth:`start`."""
        ctx = _context(owner)
        subject = _normal(subject)
        key, lock = _subject_locked(ctx, subject)
        try:
            running = ctx.lineage.running_saga(key)
            if running is not None:
                return cls(ctx, running["saga_id"], subject, running["out_path"], lock)
            saga_id = str(uuid.uuid4())
            saga = cls(ctx, saga_id, subject, None, lock)
            saga._creation = (None, {"artifacts": []})
            if not defer_create:
                create_deferred(ctx, [saga])
            return saga
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _start_locked(cls, ctx: SagaContext, subject, key, scope, out_path, lock, allow_missing,
                      defer_create: bool = False) -> "Saga":
        running = ctx.lineage.running_saga(key)
        if running is not None:
            saga = cls(ctx, running["saga_id"], subject, running["out_path"], lock)
            if out_path:  # the caller names another file for the continued saga's receipt
                with ctx.lineage.receipt_names_lock():
                    stored = user_out_path(ctx, out_path, saga.saga_id)
                    if stored != running["out_path"]:
                        ctx.lineage.set_out_path(saga.saga_id, stored)
                        saga.replaced_out_path = running["out_path"]
                        saga.out_path = stored
            return saga
        retained = retained_stores(ctx, key, {a.store for a, _ in scope})
        preflight(ctx, {a.store for a, _ in scope} - set(retained), allow_missing)
        saga_id = str(uuid.uuid4())
        # The plan is journaled with the saga itself, in one transaction: the set of artifacts is fixed for
        # the saga's life, so a resume works on exactly what a clean run would have, even if the app
        # wrote more in between, and no crash can leave a saga without its plan.
        saga = cls(ctx, saga_id, subject, None, lock)
        saga._creation = (out_path, {"artifacts": [[a.store, a.artifact_id, why] for a, why in scope],
                                     **({"retained": retained} if retained else {})})
        saga._planned = [a for a, _ in scope]
        if not defer_create:
            create_deferred(ctx, [saga])
        return saga

    @classmethod
    def resume(cls, owner: Any, saga_id: str, wait: float = 0.0) -> "Saga":
        ctx = _context(owner)
        saga = ctx.lineage.saga(saga_id)
        if saga is None:
            raise SagaError(f"no saga {saga_id!r}")
        lock = SubjectLock(ctx.lineage, saga["subject_key"])
        lock.acquire(subject=saga["subject"], wait=wait)
        saga = ctx.lineage.saga(saga_id)  # re-read under the lock: another process may have finished it
        if saga["state"] != "running":
            lock.release()
            raise SagaError(f"saga {saga_id} already finished")
        return cls(ctx, saga_id, saga["subject"], saga["out_path"], lock)


def retained_stores(ctx: SagaContext, subject_key: str, stores: set[str]) -> dict[str, str]:
    """The stores of ``stores`` whose records an erasure request keeps under an exception, with why."""
    from tombstone.requests import Requests

    today = ctx.clock().date()
    return {store: why for store, why in Requests(ctx.lineage).retained(subject_key, today).items() if store in stores}


def preflight(ctx: SagaContext, stores: set[str], allow_missing: frozenset[str] = frozenset()) -> None:
    """Open every store a new saga will touch; a config mistake stops it before anything changes.

    A store the lineage db knows but the config no longer lists, a backend no installed adapter serves
    (a typo gets a suggestion), a missing option or a store that cannot be opened: one TombstoneError.
    Stores in ``allow_missing`` are skipped when they cannot be opened: their artifacts end
    UNVERIFIED(no adapter).
    """
    for store in sorted(stores - {THIRD_PARTY_STORE}):
        try:
            ctx.adapter(store)
        except (AdapterNotFoundError, ConfigError) as exc:
            if store in allow_missing:
                continue
            if not ctx.has_store(store):
                raise ConfigError(
                    f"store {store!r} holds artifacts of this subject (the lineage db says so) but is not configured;"
                    f" restore it in the config, or pass --allow-missing-store {store} to erase without it"
                    " (its artifacts will be UNVERIFIED(no adapter))", store=store) from exc
            raise


__all__ = ["SagaStarts", "preflight", "retained_stores"]
