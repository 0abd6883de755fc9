"""Sagas with their step journal, dead letters, and the receipt chain sealed with the purge of what was erased."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tombstone.errors import LineageError
from tombstone.lineage.records import ArtifactRecord
from tombstone.lineage.sql import for_ids, packed, packed_json_text, unpacked, unpacked_json_text


class SagaRecords:
    """Sagas, their step journal, dead letters and the receipt chain (mixed into
    :class:`tombstone.lineage.db.LineageDB`)."""

    # -- sagas and journal --------------------------------------------------------------------

    def create_saga(self, saga_id: str, subject: str, out_path: str | None, plan: dict[str, Any] | None = None) -> None:
        """Create a running saga and, in the same transaction, journal its plan: a saga never exists without one."""
        with self.atomic() as conn:
            conn.execute(
                "INSERT INTO sagas VALUES (?, ?, ?, 'running', ?, NULL, ?)",
                (saga_id, self.subject_key(subject), self.secret.seal(subject.encode()), self._now(), out_path),
            )
            if plan is not None:
                self.journal(saga_id, "plan", "", "begin")
                self.journal(saga_id, "plan", "", "end", plan)

    def saga(self, saga_id: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT * FROM sagas WHERE saga_id = ?", (saga_id,)).fetchone()
        return self._saga(row) if row else None

    def _saga(self, row: Any) -> dict[str, Any]:
        saga = {key: row[key] for key in row.keys()}
        saga["subject"] = self.secret.unseal(bytes(saga.pop("subject_sealed"))).decode()
        return saga

    def running_out_paths(self) -> dict[str, str]:
        """The receipt file each unfinished saga will write, by saga id (sagas that chose none are left out)."""
        rows = self._conn.execute("SELECT saga_id, out_path FROM sagas WHERE state = 'running' AND out_path IS NOT NULL")
        return {row[0]: row[1] for row in rows}

    def set_out_path(self, saga_id: str, out_path: str) -> None:
        """Record where a running saga writes its receipt (a resume writes the same file)."""
        with self.atomic() as conn:
            conn.execute("UPDATE sagas SET out_path = ? WHERE saga_id = ? AND state = 'running'", (out_path, saga_id))

    def running_saga(self, subject_key: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT * FROM sagas WHERE subject_key = ? AND state = 'running'", (subject_key,)
        ).fetchone()
        return self._saga(row) if row else None

    def sagas(self, state: str | None = None) -> list[dict[str, Any]]:
        if state:
            rows = self._conn.execute("SELECT * FROM sagas WHERE state = ? ORDER BY started_at", (state,))
        else:
            rows = self._conn.execute("SELECT * FROM sagas ORDER BY started_at")
        return [self._saga(row) for row in rows]

    def journal(self, saga_id: str, step: str, target: str, phase: str, detail: dict[str, Any] | None = None) -> None:
        self.journal_many([(saga_id, step, target, phase, detail)])

    def journal_many(self, entries: Sequence[tuple[str, str, str, str, dict[str, Any] | None]]) -> None:
        """``journal`` for several sagas' entries (saga id, step, target, phase, detail) in one transaction:
        a batch's sagas journal a shared step together, all or none."""
        if not entries:
            return
        now = self._now()
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO journal (saga_id, step, target, phase, at, detail, worker) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(saga_id, step, target, phase, now, packed_json_text(detail or {}), self.worker)
                 for saga_id, step, target, phase, detail in entries])

    def step_result(self, saga_id: str, step: str, target: str = "") -> dict[str, Any] | None:
        """The detail journaled when the step ended, or None if it never ended."""
        row = self._conn.execute(
            "SELECT detail FROM journal WHERE saga_id = ? AND step = ? AND target = ? AND phase = 'end'"
            " ORDER BY seq DESC LIMIT 1",
            (saga_id, step, target),
        ).fetchone()
        return json.loads(unpacked_json_text(row[0])) if row else None

    def journal_entries(self, saga_id: str) -> list[dict[str, Any]]:
        """The saga's journal rows in order, each ``detail`` as JSON text (inflated where it was kept deflated)."""
        rows = self._conn.execute("SELECT * FROM journal WHERE saga_id = ? ORDER BY seq", (saga_id,))
        return [{**dict(row), "detail": unpacked_json_text(row["detail"])} for row in rows]

    # -- dead letters -------------------------------------------------------------------------

    def add_dead_letter(self, saga_id: str, store: str, step: str, artifacts: int, error: str, attempts: int) -> None:
        with self.atomic() as conn:
            conn.execute("INSERT INTO dead_letters (saga_id, store, step, artifacts, error, attempts, at)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", (saga_id, store, step, artifacts, error, attempts, self._now()))

    def dead_letters(self, state: str | None = "open") -> list[dict[str, Any]]:
        query = "SELECT d.*, s.subject_sealed FROM dead_letters d JOIN sagas s USING (saga_id)"
        rows = self._conn.execute(query + (" WHERE d.state = ?" if state else "") + " ORDER BY d.seq",
                                  (state,) if state else ()).fetchall()
        out = []
        for row in rows:
            item = dict(row)
            item["subject"] = self.secret.unseal(bytes(item.pop("subject_sealed"))).decode()
            out.append(item)
        return out

    def mark_dead_letters_retried(self, seqs: list[int]) -> None:
        with self.atomic() as conn:
            conn.executemany("UPDATE dead_letters SET state = 'retried' WHERE seq = ?", [(s,) for s in seqs])

    # -- receipt chain ------------------------------------------------------------------------

    def chain_head(self) -> tuple[int, str] | None:
        row = self._conn.execute("SELECT seq, receipt_hash FROM receipts ORDER BY seq DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else None

    def receipts(self, subject_key: str | None = None) -> list[dict[str, Any]]:
        """The sealed receipts of the chain, in order: ``seq``, ``saga_id``, ``subject_key``, ``receipt_hash``,
        ``previous_hash``, ``created_at`` and ``body`` (the signed receipt's canonical bytes, unsealed)."""
        query = "SELECT seq, saga_id, subject_key, receipt_hash, previous_hash, created_at, receipt_sealed FROM receipts"
        rows = self._conn.execute(query + (" WHERE subject_key = ?" if subject_key else "") + " ORDER BY seq",
                                  (subject_key,) if subject_key else ()).fetchall()
        out = []
        for row in rows:
            item = {key: row[key] for key in ("seq", "saga_id", "subject_key", "receipt_hash", "previous_hash",
                                              "created_at")}
            item["body"] = self._opened(row["receipt_sealed"])
            out.append(item)
        return out

    def receipt_seq(self, receipt_hash: str) -> int | None:
        """The chain position of a sealed receipt, or None when the chain holds no receipt with this hash."""
        row = self._conn.execute("SELECT seq FROM receipts WHERE receipt_hash = ?", (receipt_hash,)).fetchone()
        return row[0] if row else None

    def receipt_for_saga(self, saga_id: str) -> bytes | None:
        row = self._conn.execute("SELECT receipt_sealed FROM receipts WHERE saga_id = ?", (saga_id,)).fetchone()
        return self._opened(row[0]) if row else None

    def _opened(self, sealed: bytes) -> bytes:
        """A chain row's receipt: its canonical bytes, unsealed and inflated (kept deflated before sealing: a
        receipt states each store's evidence once per artifact, and shrinks about fifty-fold)."""
        return unpacked(self.secret.unseal(bytes(sealed)))

    def append_receipts(self, rows: Sequence[tuple[str, str, str, str | None, bytes, Iterable[ArtifactRecord]]]
                        ) -> list[int]:
        """Add receipts to the chain and close their sagas, in one transaction: all of them are sealed, or none.

        Each row is ``(saga_id, subject_key, receipt_hash, previous, body, purge)``, in chain order (each one's
        previous hash the one before it). ``purge`` names the saga's artifacts: in the same transaction their
        fingerprints, keyed content hashes, norms, probe vectors, semantic and model snapshots are removed, so
        once a receipt is sealed Tombstone's records keep nothing of what was erased but ids and statuses
        (``secure_delete`` zeroes the freed bytes; the write-ahead log is checkpointed and truncated afterwards,
        once for all the rows)."""
        now = self._now()
        rows = [(saga_id, key, digest, previous, body, [(a.store, a.artifact_id) for a in purge])
                for saga_id, key, digest, previous, body, purge in rows]
        purge = [pair for *_, pairs in rows for pair in pairs]
        seqs = []
        with self.atomic() as conn:
            for_ids(conn, "UPDATE artifacts SET fingerprint = NULL, content_hash = NULL, inv_norm = NULL"
                     " WHERE store = ? AND artifact_id IN ({ids})", purge)
            for table in ("probes", "probe_captures", "semantic_snapshots", "model_snapshots"):
                for_ids(conn, f"DELETE FROM {table} WHERE store = ? AND artifact_id IN ({{ids}})", purge)
            head = self.chain_head()
            for saga_id, subject_key, receipt_hash, previous, body, _ in rows:
                if (head[1] if head else None) != previous:
                    raise LineageError("receipt chain moved while this receipt was being signed; resume the saga")
                seq = (head[0] if head else 0) + 1
                conn.execute(
                    "INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (seq, saga_id, subject_key, receipt_hash, previous, now, self.secret.seal(packed(body))),
                )
                conn.execute(
                    "UPDATE sagas SET state = 'done', finished_at = ? WHERE saga_id = ?", (now, saga_id)
                )
                head = (seq, receipt_hash)
                seqs.append(seq)
        if purge and not self.postgres:
            # The WAL still holds page images from before the purge: fold them into the (zeroed) file.
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return seqs
