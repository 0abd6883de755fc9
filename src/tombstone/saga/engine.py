"""The erasure saga: suppress → reclaim → verify → receipt, each step journaled.

Every step is keyed (step, store) in the journal, written ``begin`` before it acts and ``end``
with its result after. A step whose ``end`` is journaled is never run again; one that began but
did not end is run again from the start, so every step must be idempotent. That is what lets
``tombstone resume`` pick up a saga killed at any point.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tombstone.errors import (
    AdapterNotFoundError,
    ConfigError,
    PhysicalUnsupportedError,
    ScopeViolationError,
    ReclaimUnavailableError,
    SagaError,
    TombstoneError,
    UnknownSubjectError,
)
from tombstone.lineage.db import THIRD_PARTY_STORE, ArtifactRecord
from tombstone.contract import Capability
from tombstone.clock import iso
from tombstone.faults import kill_point
from tombstone.fsutil import write_atomic
from tombstone.saga.lock import SubjectLock
from tombstone.keys import load_private_key
from tombstone.receipt import RECEIPT_KIND, SCHEMA_VERSION, canonical_bytes, sign
from tombstone.verify.levels import Findings, Status, StatusKind, decide

if TYPE_CHECKING:
    from tombstone.api import Tombstone

STEPS = ("suppress", "reclaim", "verify", "receipt")

ALWAYS_OUT_OF_SCOPE = (
    ("backups", "backups and snapshots taken outside the configured store files are not probed"),
    ("write-ahead logs and archives", "WAL segments shipped or archived outside the store files are not probed"),
    ("replicas", "replicas and mirrors of the stores are not probed"),
    ("provider logs", "logs kept by hosting providers and API gateways cannot be reached"),
    ("copies outside the wrappers", "data copied by code that did not go through a Tombstone wrapper has no lineage"),
)


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


class DeadLetter(Exception):
    """A store operation failed past its retry budget (or with an error retrying cannot help)."""

    def __init__(self, error: str, attempts: int) -> None:
        super().__init__(error)
        self.error, self.attempts = error, attempts


def _group(artifacts: list[ArtifactRecord]) -> dict[str, list[ArtifactRecord]]:
    groups: dict[str, list[ArtifactRecord]] = {}
    for art in artifacts:
        groups.setdefault(art.store, []).append(art)
    return dict(sorted(groups.items()))


class Saga:
    """One subject's erasure. Create with :meth:`start` or :meth:`resume`, then :meth:`run`."""

    def __init__(self, tomb: "Tombstone", saga_id: str, subject: str, out_path: str | None,
                 lock: SubjectLock | None = None) -> None:
        self.lock = lock
        self.progress: Callable[[str, str, int, int], None] | None = None
        """Called as ``progress(step, store, done, total)`` after each step, for a progress display."""
        self.tomb = tomb
        self.lineage = tomb.lineage
        self.saga_id = saga_id
        self.subject = subject
        self.out_path = out_path

    @classmethod
    def start(cls, tomb: "Tombstone", subject: str, out_path: str | None = None,
              artifacts: list[tuple[str, str]] | None = None, wait: float = 0.0) -> "Saga":
        """Start an erasure, or continue the unfinished one for the same subject.

        ``artifacts`` limits the erasure to some (store, id) pairs of the subject's lineage graph; asking
        for anything outside it — another subject's artifact — raises ScopeViolationError.
        """
        if not subject or not subject.strip():
            raise UnknownSubjectError("subject reference is empty")
        key = tomb.lineage.subject_key(subject)
        scope = tomb.lineage.closure(key)
        if not scope:
            raise UnknownSubjectError(f"unknown subject {subject!r}: the lineage db records no artifact for it",
                                      subject=subject)
        if artifacts is not None:
            known = {(a.store, a.artifact_id): (a, why) for a, why in scope}
            outside = [pair for pair in artifacts if tuple(pair) not in known]
            if outside:
                store, aid = outside[0]
                raise ScopeViolationError(
                    f"artifact {aid} in store {store} is not in {subject!r}'s lineage graph (another subject's, or unknown)",
                    store=store, subject=subject)
            scope = [known[tuple(pair)] for pair in artifacts]
        # One saga per subject at a time: taken before looking for a running saga, so two processes
        # never both continue (or both create) one. Held until the saga ends or the process dies.
        lock = SubjectLock(tomb.lineage, key)
        lock.acquire(subject=subject, wait=wait)
        try:
            return cls._start_locked(tomb, subject, key, scope, out_path, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _start_locked(cls, tomb, subject, key, scope, out_path, lock) -> "Saga":
        running = tomb.lineage.running_saga(key)
        if running is not None:
            return cls(tomb, running["saga_id"], subject, out_path or running["out_path"], lock)
        # Preflight: a store that cannot even be opened stops a new saga before anything changes.
        # A store with no adapter does not: that artifact is reported UNVERIFIED(no adapter).
        for store in sorted({a.store for a, _ in scope} - {THIRD_PARTY_STORE}):
            try:
                tomb.adapter(store)
            except (AdapterNotFoundError, ConfigError):
                continue
        saga_id = str(uuid.uuid4())
        # The plan is journaled with the saga itself, in one transaction: the set of artifacts is fixed for
        # the saga's life, so a resume works on exactly what a clean run would have, even if the app
        # wrote more in between, and no crash can leave a saga without its plan.
        kill_point("saga:create:before")
        tomb.lineage.create_saga(saga_id, subject, out_path,
                                 plan={"artifacts": [[a.store, a.artifact_id, why] for a, why in scope]})
        kill_point("saga:create:done")
        return cls(tomb, saga_id, subject, out_path, lock)

    @classmethod
    def resume(cls, tomb: "Tombstone", saga_id: str, wait: float = 0.0) -> "Saga":
        saga = tomb.lineage.saga(saga_id)
        if saga is None:
            raise SagaError(f"no saga {saga_id!r}")
        lock = SubjectLock(tomb.lineage, saga["subject_key"])
        lock.acquire(subject=saga["subject"], wait=wait)
        saga = tomb.lineage.saga(saga_id)  # re-read under the lock: another process may have finished it
        if saga["state"] != "running":
            lock.release()
            raise SagaError(f"saga {saga_id} already finished")
        return cls(tomb, saga_id, saga["subject"], saga["out_path"], lock)

    # -- driver -------------------------------------------------------------------------------

    def _step(self, step: str, target: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        done = self.lineage.step_result(self.saga_id, step, target)
        if done is not None:
            return done
        point = f"saga:{step}:{target or '-'}"
        kill_point(f"{point}:before")
        self.lineage.journal(self.saga_id, step, target, "begin")
        kill_point(f"{point}:acting")
        result = action()
        kill_point(f"{point}:acted")
        self.lineage.journal(self.saga_id, step, target, "end", result)
        kill_point(f"{point}:done")
        return result

    def _plan(self) -> list[ArtifactRecord]:
        plan = self.lineage.step_result(self.saga_id, "plan")
        if plan is None:
            raise SagaError(f"saga {self.saga_id} has no plan; it cannot be resumed")
        self.scope = {(store, aid): why for store, aid, why in plan["artifacts"]}
        artifacts = []
        for store, aid, _ in plan["artifacts"]:
            art = self.lineage.artifact(store, aid)
            if art is None:
                raise SagaError(f"saga {self.saga_id}: planned artifact {store}/{aid} vanished from the lineage db")
            artifacts.append(art)
        return artifacts

    def run(self) -> dict[str, Any]:
        """Run every step not yet done; return the signed receipt. Releases the subject's lock."""
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self) -> dict[str, Any]:
        groups = _group(self._plan())
        total, done = 3 * len(groups) + 1, 0
        for step, action in (("suppress", self._suppress), ("reclaim", self._reclaim), ("verify", self._verify)):
            for store, arts in groups.items():
                self._step(step, store, lambda: action(store, arts))
                done += 1
                if self.progress:
                    self.progress(step, store, done, total)
        receipt = self._receipt(groups)
        if self.progress:
            self.progress("receipt", "", total, total)
        return receipt

    def _retrying(self, store: str, step: str, count: int, action: Callable[[], Any]) -> Any:
        """Run a store operation; back off and retry errors marked retryable; past the budget, or on an
        error retrying cannot help, record a dead letter and raise DeadLetter."""
        policy: RetryPolicy = self.tomb.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                return action()
            except (AdapterNotFoundError, ConfigError, PhysicalUnsupportedError, ReclaimUnavailableError):
                raise  # not failures of the store: each has its own status
            except TombstoneError as exc:
                if exc.retryable and attempt < policy.attempts:
                    self.tomb.sleep(min(policy.cap_seconds, policy.base_seconds * 2 ** (attempt - 1)))
                    continue
                self.lineage.add_dead_letter(self.saga_id, store, step, count, str(exc), attempt)
                raise DeadLetter(str(exc), attempt) from exc

    # -- steps --------------------------------------------------------------------------------

    def _suppress(self, store: str, arts: list[ArtifactRecord]) -> dict[str, Any]:
        # The durable record comes first: nothing may receive a status without one, and a crash
        # between the record and the store's hide is repaired by re-running this (idempotent) step.
        self.lineage.record_suppressions(self.saga_id, arts)
        if store == THIRD_PARTY_STORE:
            return {"evidence": {"mechanism": "none: the copy is outside every store; a person must follow it up"}}
        try:
            evidence = self._retrying(store, "suppress", len(arts), lambda: self.tomb.adapter(store).suppress(arts))
        except (AdapterNotFoundError, ConfigError) as exc:
            return {"no_adapter": str(exc)}
        except DeadLetter as exc:
            return {"error": exc.error, "dlq": True, "attempts": exc.attempts}
        self.lineage.set_state(arts, "suppressed")
        return {"evidence": evidence}

    def _reclaim(self, store: str, arts: list[ArtifactRecord], suppressed: dict[str, Any] | None = None) -> dict[str, Any]:
        if suppressed is None:
            suppressed = self.lineage.step_result(self.saga_id, "suppress", store) or {}
        if store == THIRD_PARTY_STORE:
            return {"skipped": "copies held by third parties cannot be reclaimed from here"}
        if "evidence" not in suppressed:
            return {"skipped": "suppression did not complete"}
        adapter = self.tomb.adapter(store)
        if not adapter.has(Capability.RECLAIM):
            return {"skipped": f"{adapter.backend} has no reclaim recipe"}
        # Evidence only (counts move; decisions rest on the id): how many live artifacts of other
        # subjects share each erased artifact's content before anything is reclaimed.
        duplicates = {a.artifact_id: n for a in arts if (n := len(self.lineage.live_sharing_content(a)))}
        try:
            evidence = self._retrying(store, "reclaim", len(arts), lambda: adapter.reclaim(arts))
        except ReclaimUnavailableError as exc:
            return {"skipped": str(exc), "duplicates_before_reclaim": duplicates}
        except DeadLetter as exc:
            return {"error": exc.error, "dlq": True, "attempts": exc.attempts, "duplicates_before_reclaim": duplicates}
        self.lineage.set_state(arts, "reclaimed")
        return {"evidence": evidence, "duplicates_before_reclaim": duplicates}

    def _verify(self, store: str, arts: list[ArtifactRecord], suppressed: dict[str, Any] | None = None,
                reclaimed: dict[str, Any] | None = None) -> dict[str, Any]:
        if suppressed is None:
            suppressed = self.lineage.step_result(self.saga_id, "suppress", store) or {}
        if reclaimed is None:
            reclaimed = self.lineage.step_result(self.saga_id, "reclaim", store) or {}
        error = suppressed.get("error") or reclaimed.get("error")
        no_adapter = suppressed.get("no_adapter")
        logical: dict[str, Any] = {}
        physical: dict[str, Any] = {}
        unsupported = None
        if store == THIRD_PARTY_STORE:
            pass  # nothing to probe: decided by the third-party rule
        elif not (error or no_adapter):
            try:
                adapter = self.tomb.adapter(store)
                vectors = self.lineage.probe_vectors(arts)
                logical = self._retrying(store, "verify", len(arts), lambda: adapter.probe_logical(arts, vectors))
                try:
                    physical = self._retrying(store, "verify", len(arts), lambda: adapter.probe_physical(arts))
                except PhysicalUnsupportedError as exc:
                    unsupported = str(exc)
            except DeadLetter as exc:
                error = exc.error
        decided: dict[str, Any] = {}
        verified = []
        for art in arts:
            lp = logical.get(art.artifact_id)
            pp = physical.get(art.artifact_id)
            physical_passed = None
            duplicate = None
            if pp is not None:
                physical_passed = pp.passed
                sharing = self.lineage.live_sharing_content(art) if not pp.id_found else []
                if sharing:
                    # The id is gone, but a live artifact of another subject has the same content:
                    # its bytes are that survivor's (no scan can tell identical bytes apart, and a
                    # store may re-encode them), and the survivor must not be deleted. Decided on
                    # the lineage graph, which a resume does not change.
                    physical_passed = True
                    duplicate = (f"{len(sharing)} live artifact(s) of other subjects hold the same content"
                                 f"{' (bytes found)' if pp.content_found else ''}")
            third = self.lineage.third_party(art.artifact_id) if store == THIRD_PARTY_STORE else None
            findings = Findings(
                artifact_id=art.artifact_id,
                scope_violation=None if (art.store, art.artifact_id) in self.scope else "not in the saga's plan",
                lineage_gap=self.lineage.lineage_gap(art),
                third_party=(f"{third['recipient']} received a copy ({third['sent_at']})"
                             f"{': ' + third['note'] if third['note'] else ''}") if third else None,
                suppressed=self.lineage.is_suppressed(art.store, art.artifact_id),
                dlq_error=error,
                no_adapter=no_adapter,
                logical_passed=lp.passed if lp else None,
                logical_measurement=lp.measurement if lp else None,
                physical_unsupported=unsupported,
                physical_passed=physical_passed,
                physical_measurement=pp.measurement if pp else None,
                duplicate_content=duplicate,
            )
            status = decide(findings)
            if status.kind is StatusKind.VERIFIED:
                verified.append(art)
            decided[art.artifact_id] = {
                "status": _status_json(status),
                "probes": [
                    _probe_json("logical", lp, None if lp else (error or no_adapter or "not run")),
                    _probe_json("physical", pp, None if pp else (unsupported or error or no_adapter or "not run")),
                ],
            }
        self.lineage.set_state(arts, "decided")
        # Probe vectors are fragments' embeddings: kept only until they have served their purpose.
        self.lineage.purge_probes(verified)
        return {"artifacts": decided}

    def _receipt(self, groups: dict[str, list[ArtifactRecord]]) -> dict[str, Any]:
        # The chain has one head at a time: other sagas (other processes, other workers) wait here
        # rather than sign a receipt on a head that moves under them.
        with self.lineage.chain_lock():
            return self._receipt_locked(groups)

    def _receipt_locked(self, groups: dict[str, list[ArtifactRecord]]) -> dict[str, Any]:
        saga = self.lineage.saga(self.saga_id)
        head = self.lineage.chain_head()
        entries = []
        for store, arts in groups.items():
            sup = self.lineage.step_result(self.saga_id, "suppress", store) or {}
            rec = self.lineage.step_result(self.saga_id, "reclaim", store) or {}
            ver = (self.lineage.step_result(self.saga_id, "verify", store) or {}).get("artifacts", {})
            for art in arts:
                decided = ver[art.artifact_id]
                entries.append(
                    {
                        "artifact_id": art.artifact_id,
                        "store": art.store,
                        "backend": art.backend,
                        "kind": art.kind,
                        **decided["status"],
                        "fingerprint": list(art.fingerprint) if art.fingerprint is not None else None,
                        "inv_norm": art.inv_norm,
                        "evidence": {
                            "scope": self.scope.get((art.store, art.artifact_id), "owned"),
                            "suppression": {"recorded": True, **sup},
                            "reclaim": rec or None,
                            "probes": decided["probes"],
                        },
                    }
                )
        summary = {kind.value: 0 for kind in StatusKind}
        for entry in entries:
            summary[entry["status"]] += 1
        from tombstone import __version__

        body = {
            "schema_version": SCHEMA_VERSION,
            "kind": RECEIPT_KIND,
            "subject": self.subject,
            "saga_id": self.saga_id,
            "sequence": (head[0] if head else 0) + 1,
            "started_at": saga["started_at"],
            "finished_at": iso(self.tomb.clock()),
            "tool": {"name": "tombstone-rag", "version": __version__},
            "artifacts": entries,
            "out_of_scope": [{"what": w, "status": "OUT_OF_SCOPE", "reason": r} for w, r in ALWAYS_OUT_OF_SCOPE],
            "summary": summary,
            "previous_receipt_hash": head[1] if head else None,
        }
        receipt = sign(body, load_private_key(self.tomb.config.keys_dir))
        data = canonical_bytes(receipt)
        out = Path(self.out_path) if self.out_path else self.tomb.default_receipt_path(self.subject)
        # The file is written before the chain row: if the process dies in between, the saga is
        # still running and resume signs and writes a fresh receipt; the chain never names a
        # receipt that was not delivered.
        kill_point("saga:receipt:before-file")
        try:
            write_atomic(out, pretty(receipt))
        except OSError as exc:
            raise SagaError(
                f"cannot write receipt to {out}: {exc.strerror or exc}; the saga is kept, run 'tombstone resume'"
            ) from exc
        kill_point("saga:receipt:before-chain")
        self.lineage.append_receipt(self.saga_id, self.lineage.subject_key(self.subject),
                                    receipt["receipt_hash"], body["previous_receipt_hash"], data)
        self.receipt_path = out
        return receipt


def _status_json(status: Status) -> dict[str, Any]:
    return {
        "status": status.kind.value,
        "level": status.level.value if status.level else None,
        "reason": status.reason,
        "measurement": status.measurement,
    }


def _probe_json(level: str, result: Any, not_run: str | None) -> dict[str, Any]:
    if result is None:
        return {"level": level, "ran": False, "passed": None, "measurement": None, "detail": {"why": not_run}}
    return {
        "level": level,
        "ran": True,
        "passed": result.passed,
        "measurement": result.measurement,
        "detail": result.evidence,
    }


def pretty(receipt: dict[str, Any]) -> bytes:
    import json

    return (json.dumps(receipt, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()




def run_batch(sagas: list[Saga]) -> list[tuple[dict[str, Any], Path]]:
    """Run many subjects' sagas with one pass per store and step: one suppress call, one reclaim (one
    rewrite, one VACUUM) and one probe pass (one byte scan for all patterns) per store, for all of them.

    Every saga still journals its own steps (with the shared result) and gets its own receipt, so a batch
    killed midway resumes saga by saga with plain ``tombstone resume``.
    """
    try:
        plans = {s.saga_id: _group(s._plan()) for s in sagas}
        lead = sagas[0]
        lead.scope = {key: why for s in sagas for key, why in s.scope.items()}
        stores = sorted({store for groups in plans.values() for store in groups})
        for step in ("suppress", "reclaim", "verify"):
            for store in stores:
                pending = [s for s in sagas
                           if store in plans[s.saga_id] and s.lineage.step_result(s.saga_id, step, store) is None]
                if not pending:
                    continue
                arts = [a for s in pending for a in plans[s.saga_id][store]]
                for s in pending:
                    s.lineage.journal(s.saga_id, step, store, "begin")
                kill_point(f"batch:{step}:{store}:acting")
                if step == "suppress":
                    for s in pending:  # each saga's own durable record, before the store is touched
                        s.lineage.record_suppressions(s.saga_id, plans[s.saga_id][store])
                    result = lead._suppress(store, arts)
                    shared = {s.saga_id: result for s in pending}
                elif step == "reclaim":
                    result = lead._reclaim(store, arts, suppressed=pending[0].lineage.step_result(pending[0].saga_id, "suppress", store) or {})
                    shared = {s.saga_id: {**result, "batch_subjects": len(pending)} for s in pending}
                else:
                    first = pending[0]
                    result = lead._verify(store, arts,
                                          suppressed=first.lineage.step_result(first.saga_id, "suppress", store) or {},
                                          reclaimed=first.lineage.step_result(first.saga_id, "reclaim", store) or {})
                    shared = {s.saga_id: {"artifacts": {a.artifact_id: result["artifacts"][a.artifact_id]
                                                        for a in plans[s.saga_id][store]}} for s in pending}
                for s in pending:
                    s.lineage.journal(s.saga_id, step, store, "end", shared[s.saga_id])
        return [(s._receipt(plans[s.saga_id]), s.receipt_path) for s in sagas]
    finally:
        for s in sagas:
            if s.lock is not None:
                s.lock.release()

