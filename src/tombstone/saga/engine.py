"""The erasure saga: snapshot → suppress → reclaim → verify → receipt, each step journaled.

Every step is keyed (step, store) in the journal, written ``begin`` before it acts and ``end`` with its
result after. A step whose ``end`` is journaled is never run again; one that began but did not end is run
again from the start, so every step must be idempotent. That is what lets ``tombstone resume`` pick up a
saga killed at any point. A batch of sagas goes through the same step function: each store's step runs
once for all of them and each saga journals its own share, so a batch killed midway resumes saga by saga.

The saga sees the deployment only through a :class:`SagaContext` (lineage, adapters, clock, retries,
signer); verification is the pipeline of ``tombstone.verify.runner``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tombstone.clock import iso
from tombstone.errors import (
    AdapterNotFoundError,
    ConfigError,
    DeadLetterError,
    PhysicalUnsupportedError,
    ReclaimUnavailableError,
    SagaError,
    TombstoneError,
)
from tombstone.capabilities import Capability
from tombstone.faults import kill_point
from tombstone.fsutil import write_atomic
from tombstone.lineage.records import THIRD_PARTY_STORE, ArtifactRecord
from tombstone.receipt.signing import signed
from tombstone.receipt.build import (ALWAYS_OUT_OF_SCOPE, artifact_entry, backups_section, pretty, receipt_body,
                                     status_record)
from tombstone.receipt.signing import RECEIPT_KIND, STORE_RECLAIM_KIND
from tombstone.receipt.files import receipt_in, same_file_name
from tombstone.saga.context import RetryPolicy, SagaContext
from tombstone.saga.lock import SubjectLock
from tombstone.saga.starts import SagaStarts
from tombstone.saga.batch import STORE_STEPS, run_batch, run_step, seal_receipts  # noqa: F401  (re-exported)
from tombstone.saga.files import (_normal, create_deferred, create_saga, free_receipt_path, out_path_of,  # noqa: F401
                                  stored_out_path, user_out_path)
from tombstone.verify import model, runner, semantic
from tombstone.verify.levels import Level, StatusKind, decide

STEPS = ("snapshot", "suppress", "reclaim", "verify", "receipt")
NOTHING_RECORDED = ("the lineage db records no artifact for this subject, so nothing was erased; stores written"
                    " outside Tombstone's wrappers are not covered by this receipt")
INCOMPLETE_CAPTURE = {"complete": False, "why": (
    "its fragment probes were never recorded: the write queued them for background capture and the writing"
    " process ended (or its embedder failed) first; the logical probe went without them, and the semantic level"
    " does not measure it")}
"""An erased artifact's ``evidence.probe_capture`` when its probe capture was still pending (absent otherwise)."""


class Saga(SagaStarts):
    """One subject's erasure. Create with :meth:`start` or :meth:`resume`, then :meth:`run`."""

    def __init__(self, ctx: SagaContext, saga_id: str, subject: str, out_path: str | None,
                 lock: SubjectLock | None = None) -> None:
        self.ctx = ctx
        self.lock = lock
        self.progress: Callable[[str, str, int, int], None] | None = None
        """Called as ``progress(step, store, done, total)`` after each step, for a progress display."""
        self.lineage = ctx.lineage
        self.saga_id = saga_id
        self.subject = subject
        self.out_path = out_path
        """Where the receipt goes, as recorded with the saga: relative to the receipts directory, or whole."""
        self.replaced_out_path: str | None = None
        """The file a continued saga was to write before the caller named another (its unsealed receipt, if
        one was written there, is removed once the new file is sealed)."""
        self.scope: dict[tuple[str, str], str] = {}
        self.retained: dict[str, str] = {}
        """Stores whose records an erasure request keeps under an exception (``tombstone.requests``), with why:
        fixed in the plan, left untouched, and OUT_OF_SCOPE on the receipt."""
        self.continued = False
        """True when :meth:`start_artifacts` returned an unfinished saga of the same reference instead of a
        new one (run it, then start again)."""
        self._creation: tuple[str | None, dict[str, Any]] | None = None
        """(out path, plan) of a saga started with ``defer_create`` and not yet recorded (``create_deferred``)."""
        self._planned: list[ArtifactRecord] | None = None
        """The records of a plan this process made (in plan order): :meth:`_plan` takes them rather than read
        them again (a batch's plans are read once, when they are made)."""
        self._ended: dict[tuple[str, str], Any] = {}
        """What this process journaled as the end of each step, by (step, target): read back from here rather
        than decoded from the journal again (a batch's receipts would otherwise parse every verdict twice)."""

    # -- driver -------------------------------------------------------------------------------

    def step_result(self, step: str, target: str = "") -> dict[str, Any] | None:
        """The detail journaled when the step ended (``LineageDB.step_result``), or None if it never ended.
        What this process journaled itself is returned as it was handed to the journal; the test suite checks
        that it equals what the journal gives back."""
        key = (step, target)
        if key not in self._ended:
            result = self.lineage.step_result(self.saga_id, step, target)
            if result is None:
                return None
            self._ended[key] = result
        return self._ended[key]

    def _plan(self) -> list[ArtifactRecord]:
        plan = self.step_result("plan")
        if plan is None:
            raise SagaError(f"saga {self.saga_id} has no plan; it cannot be resumed")
        self.scope = {(store, aid): why for store, aid, why in plan["artifacts"]}
        self.retained = dict(plan.get("retained") or {})
        planned, self._planned = self._planned, None
        if planned is not None and [[a.store, a.artifact_id] for a in planned] == [p[:2] for p in plan["artifacts"]]:
            return planned
        artifacts = []
        known = self.lineage.artifacts_many((store, aid) for store, aid, _ in plan["artifacts"])
        for store, aid, _ in plan["artifacts"]:
            art = known.get((store, aid))
            if art is None:
                raise SagaError(f"saga {self.saga_id}: planned artifact {store}/{aid} vanished from the lineage db")
            artifacts.append(art)
        return artifacts

    def run(self) -> dict[str, Any]:
        """Run every step not yet done; return the signed receipt. Releases the subject's lock."""
        return run_batch([self])[0][0]

    def _retrying(self, store: str, step: str, count: int, action: Callable[[], Any], *, reopen: bool = True) -> Any:
        """Run a store operation; back off and retry errors marked retryable; past the budget, or on an
        error retrying cannot help, record a dead letter and raise DeadLetterError. With ``reopen`` (an
        ``action`` that asks for the store's adapter on each attempt), each retry opens the store afresh."""
        policy: RetryPolicy = self.ctx.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                return action()
            except (AdapterNotFoundError, ConfigError, PhysicalUnsupportedError, ReclaimUnavailableError):
                raise  # not failures of the store: each has its own status
            except DeadLetterError:
                raise
            except TombstoneError as exc:
                if exc.retryable and attempt < policy.attempts:
                    # the retry opens the store afresh: a session the server dropped, or a client left in a
                    # bad state, would fail every attempt the same way
                    if reopen:
                        self.ctx.reopen(store)
                    self.ctx.sleep(policy.wait(attempt))
                    continue
                self.lineage.add_dead_letter(self.saga_id, store, step, count, str(exc), attempt)
                raise DeadLetterError(str(exc), attempt, store=store) from exc

    def _locked(self, store: str, act: Callable[[Any], Any]) -> Any:
        """``act(adapter)`` holding the store's lock (``Adapter.store_lock``), so no other erasure and no
        wrapper write changes the store meanwhile. Taken per attempt: retries back off without it."""
        adapter = self.ctx.adapter(store)
        with adapter.store_lock():
            return act(adapter)

    # -- steps (each acts on one store, for every artifact of every saga in the batch) -----------

    def _snapshot(self, store: str, arts: list[ArtifactRecord], owners: dict[str, str]) -> dict[str, Any]:
        """Before anything is hidden: the semantic level's snapshot of each artifact's neighbourhood
        (``verify.semantic.snapshot``), kept in the lineage db until the receipt is sealed. Skipped where the
        level is not enabled or the store declares no semantic probe."""
        if store == THIRD_PARTY_STORE:
            return {"skipped": "copies held by third parties have no neighbourhood to measure"}
        weights = self._model_snapshot(store, arts, owners)
        if weights is not None:
            return weights
        if Level.SEMANTIC not in self.ctx.levels:
            return {"skipped": "the semantic level is not enabled in this deployment's configuration"}
        try:
            adapter = self.ctx.adapter(store)
        except (AdapterNotFoundError, ConfigError) as exc:
            return {"skipped": str(exc)}
        if not adapter.has(Capability.SEMANTIC_PROBE):
            return {"skipped": f"{adapter.backend} declares no semantic probe"}
        return semantic.snapshot(adapter, arts, self.lineage, owners)

    def _model_snapshot(self, store: str, arts: list[ArtifactRecord], owners: dict[str, str]) -> dict[str, Any] | None:
        """For a store that holds model weights: what the model level needs after the erasure — each trained
        example's text (sealed), shard, weights and canary, and the probes' measurement while the subject's
        shards still serve (``verify.model.snapshot``). None for any other store."""
        try:
            adapter = self.ctx.adapter(store)
        except (AdapterNotFoundError, ConfigError):
            return None
        if not adapter.has(Capability.MODEL_PROBE):
            return None
        if Level.MODEL not in self.ctx.levels:
            return {"skipped": "the model level is not enabled in this deployment's configuration"}
        return model.snapshot(adapter, arts, self.lineage, owners)

    def _suppress(self, store: str, arts: list[ArtifactRecord]) -> dict[str, Any]:
        if store == THIRD_PARTY_STORE:
            return {"evidence": {"mechanism": "none: the copy is outside every store; a person must follow it up"}}
        try:
            evidence = self._retrying(store, "suppress", len(arts), lambda: self._locked(store, lambda a: a.suppress(arts)))
        except (AdapterNotFoundError, ConfigError) as exc:
            return {"no_adapter": str(exc)}
        except DeadLetterError as exc:
            return {"error": exc.error, "dlq": True, "attempts": exc.attempts}
        self.lineage.set_state(arts, "suppressed")
        return {"evidence": evidence}

    def _reclaim(self, store: str, arts: list[ArtifactRecord], suppressed: dict[str, Any]) -> dict[str, Any]:
        if store == THIRD_PARTY_STORE:
            return {"skipped": "copies held by third parties cannot be reclaimed from here"}
        if "evidence" not in suppressed:
            return {"skipped": "suppression did not complete"}
        adapter = self.ctx.adapter(store)
        if not adapter.has(Capability.RECLAIM):
            return {"skipped": f"{adapter.backend} has no reclaim recipe"}
        # Evidence only (counts move; decisions rest on the id): how many live artifacts of other
        # subjects share each erased artifact's content before anything is reclaimed.
        sharing = self.lineage.live_sharing_content_many(arts)
        duplicates = {a.artifact_id: n for a in arts if (n := len(sharing[(a.store, a.artifact_id)]))}
        try:
            evidence = self._retrying(store, "reclaim", len(arts), lambda: self._locked(store, lambda a: a.reclaim(arts)))
        except ReclaimUnavailableError as exc:
            return {"skipped": str(exc), "duplicates_before_reclaim": duplicates}
        except DeadLetterError as exc:
            return {"error": exc.error, "dlq": True, "attempts": exc.attempts, "duplicates_before_reclaim": duplicates}
        self.lineage.set_state(arts, "reclaimed")
        return {"evidence": evidence, "duplicates_before_reclaim": duplicates}

    def _physical_ready(self, store: str, arts: list[ArtifactRecord]) -> contextlib.AbstractContextManager[None]:
        """The physical stage's ``prepared`` for ``arts``, entered before the store's reclaim: the patterns
        computed and the matcher compiled (on a thread of its own) while the reclaim and the logical probe run,
        for the verification's physical probe of the same records. Nothing when the level is not enabled or
        the store cannot be opened (the steps themselves meet and report that)."""
        if Level.PHYSICAL not in self.ctx.levels or store == THIRD_PARTY_STORE or not arts:
            return contextlib.nullcontext()
        try:
            adapter = self.ctx.adapter(store)
        except TombstoneError:
            return contextlib.nullcontext()
        from tombstone.verify import physical

        return physical.prepared(adapter, arts)

    def _verify(self, store: str, arts: list[ArtifactRecord], suppressed: dict[str, Any],
                reclaimed: dict[str, Any], retained: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Probe and decide ``arts``; those in ``retained`` (artifact id -> why) were left untouched under an
        exception: no probe runs on them, the lattice makes them OUT_OF_SCOPE, they stay live."""
        retained = retained or {}
        probed = [a for a in arts if a.artifact_id not in retained]
        error = suppressed.get("error") or reclaimed.get("error")
        no_adapter = suppressed.get("no_adapter")
        verdicts: dict[str, runner.Verdict] = {}
        if store != THIRD_PARTY_STORE and probed and not (error or no_adapter):
            verify_ctx = runner.VerifyContext(
                call=lambda action: self._retrying(store, "verify", len(arts),  # the probes hold their adapter
                                                   lambda: self._locked(store, lambda _: action()), reopen=False),
                probe_vectors=self.lineage.probe_vectors,
                probe_counts=self.lineage.probe_counts,
                probes_incomplete=self.lineage.probes_incomplete,
                live_sharing_content=self.lineage.live_sharing_content,
                live_sharing_content_many=self.lineage.live_sharing_content_many,
                semantic_snapshots=self.lineage.semantic_snapshots,
                model_snapshots=self.lineage.model_snapshots,
                enabled=self.ctx.levels,
                reference=self.lineage.secret.artifact_ref,
            )
            try:
                verdicts = runner.run(verify_ctx, self.ctx.adapter(store), probed)
            except DeadLetterError as exc:
                error = exc.error
        why = error or no_adapter or "not run"
        decided: dict[str, Any] = {}
        verified = []
        suppressed_ids = self.lineage.suppressed_among(store, [a.artifact_id for a in arts])
        gaps = self.lineage.lineage_gaps(arts)
        incomplete = self.lineage.probes_incomplete(arts)
        for art in arts:
            skipped = f"retained by exception: {retained[art.artifact_id]}" if art.artifact_id in retained else why
            verdict = verdicts.get(art.artifact_id) or runner.Verdict(runner.not_run(skipped), runner.not_run(skipped))
            third = self.lineage.third_party(art.artifact_id) if store == THIRD_PARTY_STORE else None
            findings = verdict.findings_for(
                art.artifact_id,
                scope_violation=None if (art.store, art.artifact_id) in self.scope else "not in the saga's plan",
                lineage_gap=gaps[(art.store, art.artifact_id)],
                third_party=(f"{third['recipient']} received a copy ({third['sent_at']})"
                             f"{': ' + third['note'] if third['note'] else ''}") if third else None,
                suppressed=art.artifact_id in suppressed_ids,
                dlq_error=error,
                no_adapter=no_adapter,
                retained=retained.get(art.artifact_id),
            )
            status = decide(findings)
            if status.kind is StatusKind.VERIFIED:
                verified.append(art)
            decided[art.artifact_id] = {"status": status_record(status),
                                        "probes": runner.probe_records(verdict.reported)}
            if art.artifact_id in incomplete:
                decided[art.artifact_id]["probe_capture"] = INCOMPLETE_CAPTURE
        with self.lineage.atomic():  # one commit for the three
            self.lineage.set_state(probed, "decided")
            # No query path returns these any more (the logical probe ran and passed): wrappers can stop
            # filtering them. Anything else stays hidden, e.g. after a failed reclaim or a slow managed delete.
            self.lineage.clear_suppressions([a for a in arts if verdicts.get(a.artifact_id) is not None
                                             and verdicts[a.artifact_id].reported.get(Level.LOGICAL) is not None
                                             and verdicts[a.artifact_id].reported[Level.LOGICAL].passed is True])
            # Probe vectors are fragments' embeddings: kept only until they have served their purpose.
            self.lineage.purge_probes(verified)
        return {"artifacts": decided}

    # -- receipt ------------------------------------------------------------------------------

    def _receipt(self, groups: dict[str, list[ArtifactRecord]]) -> dict[str, Any]:
        return seal_receipts([(self, groups)])[0]

    def _signed_receipt(self, groups: dict[str, list[ArtifactRecord]], head: tuple[int, str] | None,
                        key: Any = None) -> tuple[dict[str, Any], tuple, Callable[[], None]]:
        """Build and sign this saga's receipt on ``head`` with ``key`` (the context's signer when None) and choose
        its file; returns it with its chain row (sealed by the caller, after every file of the batch is written)
        and what writes the file (which the caller runs, on a thread of its own in a batch, before the row)."""
        saga = self.lineage.saga(self.saga_id)
        entries = []
        for store, arts in groups.items():
            sup = self.step_result("suppress", store) or {}
            rec = self.step_result("reclaim", store) or {}
            ver = (self.step_result("verify", store) or {}).get("artifacts", {})
            for art in arts:
                entries.append(artifact_entry(art, ver[art.artifact_id],
                                              scope=self.scope.get((art.store, art.artifact_id), "owned"),
                                              suppression=sup, reclaim=rec, auditors=self.ctx.auditors))
        plan = self.step_result("plan") or {}
        store_reclaim = None
        if plan.get("kind") == STORE_RECLAIM_KIND:
            store = plan["store"]
            store_reclaim = {"store": store, **(self.step_result("reclaim-store", store) or {}),
                             "before": self.step_result("scan-before", store).get("scan"),
                             "after": self.step_result("scan-after", store).get("scan")}
        finished = self.ctx.clock()
        kind = plan.get("kind") or RECEIPT_KIND
        body = receipt_body(subject=self.subject, saga_id=self.saga_id, sequence=(head[0] if head else 0) + 1,
                            started_at=saga["started_at"], finished_at=iso(finished), entries=entries,
                            previous_receipt_hash=head[1] if head else None,
                            statement=plan.get("statement") or (None if entries else NOTHING_RECORDED),
                            kind=kind, store_reclaim=store_reclaim,
                            backups=backups_section(self.ctx.backups, entries, finished) if kind == RECEIPT_KIND else (),
                            backup_recheck=plan.get("backup_recheck"))
        receipt, data = signed(body, key if key is not None else self.ctx.signer())
        out = self._destination()
        text = pretty(receipt, finite=True)  # its canonical bytes (above) refuse NaN

        def write() -> None:
            # The file is written before the chain row: if the process dies in between, the saga is
            # still running and resume signs and rewrites the same file; the chain never names a
            # receipt that was not delivered.
            kill_point("saga:receipt:before-file")
            try:
                write_atomic(out, text)
            except OSError as exc:
                raise SagaError(f"cannot write receipt to {out}: {exc.strerror or exc}; the saga is kept, run"
                                " 'tombstone resume'") from exc
            self.receipt_path = out
            kill_point("saga:receipt:before-chain")

        row = (self.saga_id, self.lineage.subject_key(self.subject), receipt["receipt_hash"],
               body["previous_receipt_hash"], data,
               [art for store, arts in groups.items() if store not in self.retained for art in arts])
        return receipt, row, write

    def _sealed(self) -> None:
        """After the chain row: a receipt file of this saga's from before the caller moved it goes."""
        if self.replaced_out_path:
            stale = out_path_of(self.ctx, self.replaced_out_path)
            held = receipt_in(stale)
            if not same_file_name(stale, self.receipt_path) and held and held["saga_id"] == self.saga_id:
                stale.unlink(missing_ok=True)  # this saga's unsealed receipt from before the caller moved it

    def _destination(self) -> Path:
        """The file this saga's receipt goes to: the one recorded when the saga was created, rewritten if it
        holds this saga's own unsealed receipt. If it has since been taken (another saga's receipt, or any
        file at a default name), the next free name is chosen and recorded, so that nothing is overwritten."""
        with self.lineage.receipt_names_lock():
            if self.out_path is None:  # a saga created before receipt files were chosen at creation
                chosen = free_receipt_path(self.ctx, self.ctx.receipt_path(self.subject), self.saga_id)
            else:
                path = out_path_of(self.ctx, self.out_path)
                held = receipt_in(path)
                user_file = Path(self.out_path).is_absolute()
                if (held is None and (user_file or not path.exists())) or (held and held["saga_id"] == self.saga_id):
                    return path
                chosen = free_receipt_path(self.ctx, path, self.saga_id)
            self.out_path = stored_out_path(self.ctx, chosen)
            self.lineage.set_out_path(self.saga_id, self.out_path)
            return chosen


__all__ = ["ALWAYS_OUT_OF_SCOPE", "RetryPolicy", "STEPS", "STORE_STEPS", "Saga", "SagaContext", "run_batch", "run_step"]
