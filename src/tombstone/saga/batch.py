"""Running sagas: one journaled step for many sagas at once, a batch's pass over every store, and the sealing of
its receipts in chain order (``Saga.run`` is a batch of one)."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tombstone.capture import deferred
from tombstone.faults import kill_point
from tombstone.gcpause import collector_paused
from tombstone.lineage.records import ArtifactRecord
from tombstone.receipt.signing import STORE_RECLAIM_KIND

if TYPE_CHECKING:
    from tombstone.saga.engine import Saga


STORE_STEPS = ("snapshot", "suppress", "reclaim", "verify")
"""The steps a saga runs per store (then the receipt, once)."""


def _group(artifacts: list[ArtifactRecord]) -> dict[str, list[ArtifactRecord]]:
    """Artifacts by store (stores in name order, each store's in plan order)."""
    groups: dict[str, list[ArtifactRecord]] = {}
    for art in artifacts:
        groups.setdefault(art.store, []).append(art)
    return dict(sorted(groups.items()))


def seal_receipts(items: Sequence[tuple[Saga, dict[str, list[ArtifactRecord]]]]) -> list[dict[str, Any]]:
    """Sign and deliver the receipts of sagas that share a lineage db, in chain order, then seal them all.

    Each receipt is signed on the one before it and its file written; then the chain rows, with the purge of
    what the lineage db kept of the erased content, go in one transaction (one write-ahead-log checkpoint for
    the batch). In a batch the files are written in chain order on a thread of their own while the next
    receipts are signed (a file's fsync waits on the disk, not on this process). If a receipt cannot be built
    or written, those delivered before it are sealed and the error raised: the rest stay running, for resume
    (no file after a failed one is written)."""
    if not items:
        return []
    lineage = items[0][0].lineage
    delivered: list[tuple[Saga, dict[str, Any], tuple, Future]] = []
    failed = threading.Event()
    # The chain has one head at a time: other sagas (other processes, other workers) wait here rather than
    # sign a receipt on a head that moves under them.
    # The receipt-names lock, which each saga takes to confirm its file, is taken once here for the batch.
    with lineage.chain_lock(), lineage.receipt_names_lock():
        head = lineage.chain_head()
        try:
            key = items[0][0].ctx.signer()  # read from its file once for the batch
            with _writer(len(items)) as writer:
                for saga, groups in items:
                    if failed.is_set():
                        break
                    receipt, row, write = saga._signed_receipt(groups, head, key)
                    delivered.append((saga, receipt, row, writer.submit(_unless(failed, write))))
                    head = (head[0] + 1 if head else 1, receipt["receipt_hash"])
                    if len(delivered) > WRITES_AHEAD:
                        wait_for(delivered[-WRITES_AHEAD - 1][3])  # no more than a few files' bytes held
        finally:
            # Sealing a receipt and purging what the lineage db kept of the erased content are one transaction:
            # a crash before it leaves both for resume (which needs the fingerprints to seal patterns again).
            # Every file was written (or failed) by now: the writer has ended.
            sealed = []
            for saga, receipt, row, written in delivered:
                if written.exception() is not None:
                    break
                sealed.append((saga, receipt, row))
            if sealed:
                lineage.append_receipts([row for _, _, row in sealed])
                for saga, _, _ in sealed:
                    saga._sealed()
    for _, _, _, written in delivered[len(sealed):]:
        if written.exception() is not None and not isinstance(written.exception(), _NotWritten):
            raise written.exception()
    return [receipt for _, receipt, _ in sealed]


WRITES_AHEAD = 2
"""How many signed receipts may wait for their file to be written while the next is signed."""


class _NotWritten(Exception):
    """A receipt file left unwritten because one before it could not be written."""


def _unless(failed: threading.Event, write: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        if failed.is_set():
            raise _NotWritten
        try:
            write()
        except BaseException:
            failed.set()
            raise
    return run


def wait_for(future: Future) -> None:
    with contextlib.suppress(BaseException):
        future.result()


class _Inline:
    """An executor that runs what it is given at once (one receipt: no thread to start)."""

    def submit(self, fn: Callable[[], None]) -> Future:
        done: Future = Future()
        try:
            fn()
        except BaseException as exc:  # handed to the caller through the future, as a thread's would be
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done


@contextlib.contextmanager
def _writer(count: int):
    if count < 2:
        yield _Inline()
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tombstone-receipts") as pool:
        yield pool


def run_step(sagas: Sequence[Saga], step: str, target: str, action: Callable[[list[Saga]], dict[str, Any]]) -> None:
    """Run one journaled step for every saga that has not finished it, with one call of ``action``.

    ``action(pending)`` acts once for all pending sagas and returns ``{saga_id: result}``; each saga
    journals ``begin`` before and its own ``end`` after. The kill points are the same whether one saga
    or a batch runs the step.
    """
    pending = [s for s in sagas if s.step_result(step, target) is None]
    if not pending:
        return
    point = f"saga:{step}:{target or '-'}"
    kill_point(f"{point}:before")
    lineage = pending[0].lineage  # a batch's sagas share their context's lineage db: one transaction a phase
    lineage.journal_many([(s.saga_id, step, target, "begin", None) for s in pending])
    kill_point(f"{point}:acting")
    results = action(pending)
    kill_point(f"{point}:acted")
    lineage.journal_many([(s.saga_id, step, target, "end", results[s.saga_id]) for s in pending])
    for s in pending:
        s._ended[(step, target)] = results[s.saga_id]
    kill_point(f"{point}:done")


def _store_reclaim_steps(saga: Saga, store: str) -> None:
    """A store reclaim's three journaled steps: the scan before (kept once taken, so a resumed reclaim still
    reports what the store held when it began), the recipe under the store's lock, the scan after."""
    ctx = saga.ctx

    def scanned(pending: list[Saga]) -> dict[str, Any]:
        report = ctx.scan_store(store)
        return {s.saga_id: {"scan": None if report is None else report.as_json(False)} for s in pending}

    def recipe(pending: list[Saga]) -> dict[str, Any]:
        adapter = ctx.adapter(store)
        # A failure propagates and leaves the saga running: 'tombstone resume' runs the recipe again (it is
        # idempotent: whatever is deleted by then goes), keeping the scan taken before.
        evidence = saga._locked(store, lambda a: a.reclaim_store())
        ctx.reopen(store)  # the recipe may have rewritten what the open adapter holds
        return {s.saga_id: {"backend": adapter.backend, "evidence": evidence} for s in pending}

    run_step([saga], "scan-before", store, scanned)
    run_step([saga], "reclaim-store", store, recipe)
    run_step([saga], "scan-after", store, scanned)


@collector_paused()
def run_batch(sagas: list[Saga]) -> list[tuple[dict[str, Any], Path]]:
    """Run sagas with one pass per store and step: one suppress call, one reclaim (one rewrite, one
    VACUUM) and one probe pass (one byte scan for all patterns) per store, for all of them.

    Every saga still journals its own steps (with its share of the result) and gets its own receipt, so a
    batch killed midway resumes saga by saga with plain ``tombstone resume``. Releases every subject lock.
    Python's cycle collector is held off while it runs (``tombstone.gcpause``).
    """
    # Probe vectors this process still has queued (``tombstone.capture.deferred``) land before anything is
    # suppressed: after that they would be refused, the artifacts no longer being live.
    for problem in deferred.flush():
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    try:
        plans = {s.saga_id: _group(s._plan()) for s in sagas}
        lead = sagas[0]
        lead.scope = {key: why for s in sagas for key, why in s.scope.items()}
        stores = sorted({store for groups in plans.values() for store in groups})
        total, done = len(STORE_STEPS) * len(stores) + 1, 0

        def arts_of(pending: list[Saga], store: str) -> list[ArtifactRecord]:
            """The store's artifacts of the sagas that erase them (not those a request keeps there)."""
            return [a for s in pending if store not in s.retained for a in plans[s.saga_id][store]]

        def previous(pending: list[Saga], step: str, store: str) -> dict[str, Any]:
            erasing = [s for s in pending if store not in s.retained]
            return erasing[0].step_result(step, store) or {} if erasing else {}

        def keeping(act: Callable[[list[Saga]], dict[str, Any]], store: str) -> Callable[[list[Saga]], dict[str, Any]]:
            """``act`` for the sagas that erase the store's records; the others journal that they kept them."""
            def run(pending: list[Saga]) -> dict[str, Any]:
                erasing = [s for s in pending if store not in s.retained]
                out = act(erasing) if erasing else {}
                return {**out, **{s.saga_id: {"recorded": False, "retained": s.retained[store]}
                                  for s in pending if store in s.retained}}
            return run

        readied: dict[str, list[str]] = {}

        def ready(store: str, pending: list[Saga]) -> None:
            """The store's physical probe's patterns and matcher, made ready from the batch's first step on
            the store (its snapshot), and again at its reclaim only for other artifacts (on a resume, the
            sagas left to reclaim may not be those left to snapshot)."""
            arts = arts_of(pending, store)
            if readied.get(store) != [a.artifact_id for a in arts]:
                readied[store] = [a.artifact_id for a in arts]
                early.enter_context(lead._physical_ready(store, arts))

        def snapshot(store: str) -> Callable[[list[Saga]], dict[str, Any]]:
            def act(pending: list[Saga]) -> dict[str, Any]:
                ready(store, pending)  # the matcher compiles on a thread of its own while the steps run
                owners = {a.artifact_id: s.saga_id for s in pending for a in plans[s.saga_id][store]}
                result = lead._snapshot(store, arts_of(pending, store), owners)
                if "artifacts" not in result:
                    return {s.saga_id: result for s in pending}
                return {s.saga_id: {**result, "artifacts": {a.artifact_id: result["artifacts"][a.artifact_id]
                                                            for a in plans[s.saga_id][store]}} for s in pending}
            return act

        def suppress(store: str) -> Callable[[list[Saga]], dict[str, Any]]:
            def act(pending: list[Saga]) -> dict[str, Any]:
                # Each saga's durable suppression record comes first: nothing may receive a status without
                # one, and a crash between the record and the store's hide is repaired by running this again.
                with lead.lineage.atomic():  # one commit for the batch
                    for s in pending:
                        s.lineage.record_suppressions(s.saga_id, plans[s.saga_id][store])
                # From here every wrapper of the deployment hides the records, before the store is touched.
                kill_point(f"saga:suppress:{store}:recorded")
                result = lead._suppress(store, arts_of(pending, store))
                return {s.saga_id: result for s in pending}
            return act

        def reclaim(store: str) -> Callable[[list[Saga]], dict[str, Any]]:
            def act(pending: list[Saga]) -> dict[str, Any]:
                ready(store, pending)  # unless its snapshot did
                result = lead._reclaim(store, arts_of(pending, store), previous(pending, "suppress", store))
                extra = {"batch_subjects": len(pending)} if len(sagas) > 1 else {}
                return {s.saga_id: {**result, **extra} for s in pending}
            return act

        def verify(store: str) -> Callable[[list[Saga]], dict[str, Any]]:
            def act(pending: list[Saga]) -> dict[str, Any]:
                kept = {a.artifact_id: s.retained[store] for s in pending if store in s.retained
                        for a in plans[s.saga_id][store]}
                result = lead._verify(store, [a for s in pending for a in plans[s.saga_id][store]],
                                      previous(pending, "suppress", store), previous(pending, "reclaim", store),
                                      retained=kept)
                return {s.saga_id: {"artifacts": {a.artifact_id: result["artifacts"][a.artifact_id]
                                                  for a in plans[s.saga_id][store]}} for s in pending}
            return act

        for s in sagas:
            plan = s.step_result("plan") or {}
            if plan.get("kind") == STORE_RECLAIM_KIND:
                _store_reclaim_steps(s, plan["store"])
        # Each store's physical probe's patterns and matcher are made ready from its first step on
        # (``_physical_ready``), and dropped once every store is verified.
        with contextlib.ExitStack() as early:
            for step, make in (("snapshot", snapshot), ("suppress", suppress), ("reclaim", reclaim),
                               ("verify", verify)):
                for store in stores:
                    act = make(store) if step == "verify" else keeping(make(store), store)
                    run_step([s for s in sagas if store in plans[s.saga_id]], step, store, act)
                    done += 1
                    if lead.progress:
                        lead.progress(step, store, done, total)
        signed = seal_receipts([(s, plans[s.saga_id]) for s in sagas])
        receipts = [(receipt, s.receipt_path) for receipt, s in zip(signed, sagas)]
        if lead.progress:
            lead.progress("receipt", "", total, total)
        return receipts
    finally:
        for s in sagas:
            if s.lock is not None:
                s.lock.release()


__all__ = ["STORE_STEPS", "run_batch", "run_step", "seal_receipts"]
