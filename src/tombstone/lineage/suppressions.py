"""Durable suppression records: written before a store is touched, read by every wrapper of the deployment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tombstone.lineage.records import ArtifactRecord
from tombstone.lineage.sql import by_store, for_ids


class SuppressionRecords:
    """Durable suppression records and each store's suppression generation (mixed into
    :class:`tombstone.lineage.db.LineageDB`)."""

    # -- suppression --------------------------------------------------------------------------

    def record_suppressions(self, saga_id: str, artifacts: Iterable[ArtifactRecord]) -> None:
        """The durable suppression record: from its commit on, every wrapper hides the artifacts."""
        now = self._now()
        artifacts = list(artifacts)
        with self.atomic(savepoint=False) as conn:
            conn.executemany(
                "INSERT INTO suppressions (store, artifact_id, saga_id, suppressed_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (store, artifact_id) DO UPDATE SET cleared_at = NULL",
                [(a.store, a.artifact_id, saga_id, now) for a in artifacts],
            )
            self._bump_generations(conn, {a.store for a in artifacts})

    def clear_suppressions(self, artifacts: Iterable[ArtifactRecord]) -> None:
        """The store's reclaim removed these records: wrappers need not filter them any more."""
        now = self._now()
        artifacts = list(artifacts)
        with self.atomic(savepoint=False) as conn:
            for_ids(conn, "UPDATE suppressions SET cleared_at = ? WHERE store = ? AND artifact_id IN ({ids})"
                     " AND cleared_at IS NULL", [(a.store, a.artifact_id) for a in artifacts], (now,))
            self._bump_generations(conn, {a.store for a in artifacts})

    @staticmethod
    def _bump_generations(conn: Any, stores: Iterable[str]) -> None:
        conn.executemany(
            "INSERT INTO suppression_generations (store, generation) VALUES (?, 1)"
            " ON CONFLICT (store) DO UPDATE SET generation = suppression_generations.generation + 1",
            [(store,) for store in sorted(stores)],
        )

    def suppression_generation(self, store: str) -> int:
        """Changes whenever the store's set of hidden ids does (0: never anything suppressed)."""
        row = self._conn.execute("SELECT generation FROM suppression_generations WHERE store = ?",
                                 (store,)).fetchone()
        return int(row[0]) if row else 0

    def hidden_ids(self, store: str) -> set[str]:
        """Ids suppressed in ``store`` whose records reclaim has not removed: what wrappers must not return."""
        rows = self._conn.execute("SELECT artifact_id FROM suppressions WHERE store = ? AND cleared_at IS NULL",
                                  (store,))
        return {row[0] for row in rows}

    def is_suppressed(self, store: str, artifact_id: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM suppressions WHERE store = ? AND artifact_id = ?", (store, artifact_id)
        ).fetchone()
        return row is not None

    def suppressed_pairs(self, artifacts: Iterable[ArtifactRecord]) -> set[tuple[str, str]]:
        """Which of ``artifacts`` have ever been suppressed, as (store, id) pairs (``is_suppressed`` for many)."""
        out: set[tuple[str, str]] = set()
        for store, ids in by_store((a.store, a.artifact_id) for a in artifacts).items():
            out.update((store, aid) for aid in self.suppressed_among(store, ids))
        return out

    def suppressed_among(self, store: str, artifact_ids: Iterable[str]) -> set[str]:
        """Which of ``artifact_ids`` in ``store`` have ever been suppressed (``is_suppressed`` for many, a few
        hundred ids a query)."""
        ids = list(dict.fromkeys(artifact_ids))
        out: set[str] = set()
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            rows = self._conn.execute(
                f"SELECT artifact_id FROM suppressions WHERE store = ? AND artifact_id IN ({', '.join('?' * len(part))})",
                (store, *part))
            out.update(row[0] for row in rows)
        return out

    def suppressed_ids(self, store: str) -> set[str]:
        rows = self._conn.execute("SELECT artifact_id FROM suppressions WHERE store = ?", (store,))
        return {row[0] for row in rows}
