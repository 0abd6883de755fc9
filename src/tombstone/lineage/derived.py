"""Lineage beyond the wrappers: copies sent to third parties, and artifacts a backend derived from others (a
model trained on examples)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tombstone.lineage.records import EXTERNAL_BACKEND, THIRD_PARTY_STORE, ArtifactRecord
from tombstone.lineage.sql import by_store, parts


def _owners(conn: Any, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The subject key owning each of the (store, id) pairs the lineage db knows."""
    owners: dict[tuple[str, str], str] = {}
    for store, ids in by_store(keys).items():
        for part in parts(ids):
            rows = conn.execute(f"SELECT artifact_id, subject_key FROM artifacts WHERE store = ?"
                                f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)).fetchall()
            owners.update({(store, row[0]): row[1] for row in rows})
    return owners


class DerivedRecords:
    """Copies sent to third parties and artifacts a backend derived (mixed into
    :class:`tombstone.lineage.db.LineageDB`)."""

    def record_third_party(self, subject: str, src_store: str, src_id: str, recipient: str, *,
                           sent_at: str | None = None, note: str = "") -> ArtifactRecord:
        """Record that a copy of an artifact left for a third party. It can only ever be NEEDS_HUMAN."""
        artifact = ArtifactRecord(store=THIRD_PARTY_STORE, artifact_id=f"{recipient}:{src_store}/{src_id}",
                                  backend=EXTERNAL_BACKEND, kind="external_copy")
        with self.atomic() as conn:
            self.record_artifacts(subject, [artifact], edges=[(src_store, src_id, artifact.store, artifact.artifact_id,
                                                               "sent_to_third_party")])
            conn.execute("INSERT INTO third_parties VALUES (?, ?, ?, ?) ON CONFLICT (artifact_id) DO UPDATE SET"
                         " recipient = excluded.recipient, sent_at = excluded.sent_at, note = excluded.note",
                         (artifact.artifact_id, recipient, sent_at or self._now(), note))
        return artifact

    def record_third_parties(self, sources: Iterable[tuple[str, str]], recipient: str, *, sent_at: str | None = None,
                             note: str = "", kind: str = "external_copy",
                             relation: str = "sent_to_third_party") -> list[ArtifactRecord]:
        """Record, in one transaction, that copies of many artifacts left for one third party (a model
        trained on them, an export): as :meth:`record_third_party`, each copy recorded for the subject that
        owns its source. Sources the lineage db does not know are skipped. Each copy can only ever be
        NEEDS_HUMAN."""
        sources = list(sources)
        now = self._now()
        sent_at = sent_at or now
        copies: list[ArtifactRecord] = []
        with self.atomic() as conn:
            owners = _owners(conn, sources)
            for store, ids in by_store(sources).items():
                for part in parts(ids):
                    batch = [(aid, ArtifactRecord(store=THIRD_PARTY_STORE, artifact_id=f"{recipient}:{store}/{aid}",
                                                  backend=EXTERNAL_BACKEND, kind=kind, subject_key=owners[(store, aid)]))
                             for aid in part if (store, aid) in owners]
                    conn.executemany(
                        "INSERT INTO artifacts (store, artifact_id, backend, kind, subject_key, fingerprint,"
                        " content_hash, created_at, state, inv_norm) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, 'live', NULL)"
                        " ON CONFLICT (store, artifact_id) DO UPDATE SET kind = excluded.kind, state = 'live'",
                        [(a.store, a.artifact_id, a.backend, a.kind, a.subject_key, now) for _, a in batch])
                    conn.executemany("INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                     [(store, aid, a.store, a.artifact_id, relation, now) for aid, a in batch])
                    conn.executemany(
                        "INSERT INTO third_parties VALUES (?, ?, ?, ?) ON CONFLICT (artifact_id) DO UPDATE SET"
                        " recipient = excluded.recipient, sent_at = excluded.sent_at, note = excluded.note",
                        [(a.artifact_id, recipient, sent_at, note) for _, a in batch])
                    copies += [a for _, a in batch]
        return copies

    def third_party(self, artifact_id: str) -> dict[str, str] | None:
        row = self._conn.execute("SELECT recipient, sent_at, note FROM third_parties WHERE artifact_id = ?",
                                 (artifact_id,)).fetchone()
        return {"recipient": row[0], "sent_at": row[1], "note": row[2]} if row else None

    # -- artifacts derived by a backend (a model trained on examples) ----------------------------

    def record_derived_artifacts(self, derived: Iterable[tuple[str, str, ArtifactRecord]], *, relation: str,
                                 replacing: str | None = None) -> tuple[list[ArtifactRecord], int]:
        """Record, in one transaction, artifacts derived from others (``(src_store, src_id, artifact)``): each
        owned by the subject that owns its source, with an edge source → artifact. Sources the lineage db does
        not know are skipped. With ``replacing`` (a third party's recipient, e.g. ``training run ft-7``), the
        copies :meth:`record_third_parties` recorded for that recipient from the same sources are replaced by
        these artifacts — a backend that can reach the copy takes it over from a person — unless an erasure
        has already begun on them. Returns the recorded artifacts and how many third-party copies they
        replaced."""
        derived = list(derived)
        now = self._now()
        recorded: list[ArtifactRecord] = []
        replaced = 0
        with self.atomic() as conn:
            owners = _owners(conn, [(s, i) for s, i, _ in derived])
            batch = [(s, i, a, owners[(s, i)]) for s, i, a in derived if (s, i) in owners]
            conn.executemany(
                "INSERT INTO artifacts (store, artifact_id, backend, kind, subject_key, fingerprint, content_hash,"
                " created_at, state, inv_norm) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, 'live', NULL)"
                " ON CONFLICT (store, artifact_id) DO UPDATE SET backend = excluded.backend, kind = excluded.kind,"
                " subject_key = excluded.subject_key, state = 'live'",
                [(a.store, a.artifact_id, a.backend, a.kind, key, now) for _, _, a, key in batch])
            conn.executemany("INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             [(s, i, a.store, a.artifact_id, relation, now) for s, i, a, _ in batch])
            if replacing:
                for s, i, _, _ in batch:
                    copy = f"{replacing}:{s}/{i}"
                    gone = conn.execute(
                        "DELETE FROM artifacts WHERE store = ? AND artifact_id = ? AND state = 'live'"
                        " AND NOT EXISTS (SELECT 1 FROM suppressions WHERE store = ? AND artifact_id = ?)",
                        (THIRD_PARTY_STORE, copy, THIRD_PARTY_STORE, copy)).rowcount
                    if gone:
                        conn.execute("DELETE FROM edges WHERE dst_store = ? AND dst_id = ?", (THIRD_PARTY_STORE, copy))
                        conn.execute("DELETE FROM third_parties WHERE artifact_id = ?", (copy,))
                        replaced += 1
            recorded = [ArtifactRecord(store=a.store, artifact_id=a.artifact_id, backend=a.backend, kind=a.kind,
                                       subject_key=key, created_at=now) for _, _, a, key in batch]
        return recorded, replaced
