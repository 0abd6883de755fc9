"""Probe vectors, pending probe captures and the semantic and model snapshots kept in the lineage db until an
artifact's receipt is sealed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from tombstone.lineage.records import ArtifactRecord
from tombstone.lineage.sql import before_probe_reads, by_store, for_ids, json_text, parts


class ProbeRecords:
    """The lineage db's probe vectors, pending captures and the semantic and model levels' snapshots
    (mixed into :class:`tombstone.lineage.db.LineageDB`)."""

    def record_probes(self, probes: Iterable[tuple[str, str, str, np.ndarray]],
                      done: Iterable[tuple[str, str, str]] = ()) -> int:
        """Record (store, artifact id, sha256 of the probe query, vector) rows of artifacts that are still live
        (``tombstone.capture.deferred``): an artifact erased meanwhile gets none. In the same transaction the
        pending captures ``done`` names — (store, artifact id, ticket) — are cleared, where the artifact is
        still live and no later write replaced the ticket. Returns the probe rows written."""
        written = 0
        with self.atomic() as conn:
            for store, aid, query, vector in probes:
                written += conn.execute(
                    "INSERT INTO probes SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM artifacts WHERE store = ?"
                    " AND artifact_id = ? AND state = 'live') ON CONFLICT (store, artifact_id, query_sha256)"
                    " DO UPDATE SET vector = excluded.vector",
                    (store, aid, query, np.asarray(vector, dtype="<f4").tobytes(), store, aid)).rowcount
            conn.executemany(
                "DELETE FROM probe_captures WHERE store = ? AND artifact_id = ? AND ticket = ? AND EXISTS"
                " (SELECT 1 FROM artifacts a WHERE a.store = probe_captures.store"
                " AND a.artifact_id = probe_captures.artifact_id AND a.state = 'live')",
                list(done))
        return written

    def pending_captures(self, store: str) -> list[tuple[str, str, str]]:
        """The store's artifacts whose probe capture is pending: (artifact id, ticket, writer), by id."""
        return [tuple(row) for row in self._conn.execute(
            "SELECT artifact_id, ticket, writer FROM probe_captures WHERE store = ? ORDER BY artifact_id", (store,))]

    def probes_incomplete(self, artifacts: Iterable[ArtifactRecord]) -> set[str]:
        """Ids of the artifacts whose probe capture never finished (after this process's queued probes are
        recorded): their fragment probe vectors are missing."""
        before_probe_reads()
        out: set[str] = set()
        for store, ids in by_store((a.store, a.artifact_id) for a in artifacts).items():
            for part in parts(ids):
                out.update(row[0] for row in self._conn.execute(
                    f"SELECT artifact_id FROM probe_captures WHERE store = ?"
                    f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)))
        return out

    def probe_vectors(self, artifacts: Iterable[ArtifactRecord]) -> dict[str, list[np.ndarray]]:
        """Probe vectors of each artifact, keyed by artifact id (after this process's queued probes are
        recorded)."""
        before_probe_reads()  # once for the batch, not once per artifact
        arts = list(artifacts)
        found: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
        for store, ids in by_store((a.store, a.artifact_id) for a in arts).items():
            for part in parts(ids):
                for aid, query, vector in self._conn.execute(
                        f"SELECT artifact_id, query_sha256, vector FROM probes WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)):
                    found.setdefault((store, aid), []).append((query, np.frombuffer(vector, dtype="<f4")))
        # each artifact's in the order _probes gives them (by the query's hash)
        return {a.artifact_id: [v for _, v in sorted(found.get((a.store, a.artifact_id), []), key=lambda p: p[0])]
                for a in arts}

    def probe_counts(self, artifacts: Iterable[ArtifactRecord]) -> dict[str, int]:
        """How many probe vectors each artifact has, keyed by artifact id, without reading them (the primary
        key's index answers it); after this process's queued probes are recorded."""
        before_probe_reads()
        arts = list(artifacts)
        found: dict[tuple[str, str], int] = {}
        for store, ids in by_store((a.store, a.artifact_id) for a in arts).items():
            for part in parts(ids):
                for aid, n in self._conn.execute(
                        f"SELECT artifact_id, count(*) FROM probes WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))}) GROUP BY artifact_id", (store, *part)):
                    found[(store, aid)] = n
        return {a.artifact_id: found.get((a.store, a.artifact_id), 0) for a in arts}

    def probes_for(self, store: str, artifact_id: str) -> list[tuple[str, np.ndarray]]:
        before_probe_reads()
        return self._probes(store, artifact_id)

    def _probes(self, store: str, artifact_id: str) -> list[tuple[str, np.ndarray]]:
        rows = self._conn.execute(
            "SELECT query_sha256, vector FROM probes WHERE store = ? AND artifact_id = ? ORDER BY query_sha256",
            (store, artifact_id),
        )
        return [(q, np.frombuffer(v, dtype="<f4")) for q, v in rows]

    def purge_probes(self, artifacts: Iterable[ArtifactRecord]) -> None:
        keys = [(a.store, a.artifact_id) for a in artifacts]
        with self.atomic(savepoint=False) as conn:
            for_ids(conn, "DELETE FROM probes WHERE store = ? AND artifact_id IN ({ids})", keys)
            for_ids(conn, "DELETE FROM probe_captures WHERE store = ? AND artifact_id IN ({ids})", keys)

    # -- semantic snapshots (tombstone.verify.semantic) ---------------------------------------

    def save_semantic_snapshots(self, store: str, by_saga: dict[str, dict[str, tuple[dict[str, Any], bytes]]]) -> None:
        """Record, per saga and artifact id, what the semantic level measured before suppression:
        ``(meta, vectors)`` (JSON-able metadata, float32 bytes), a batch's sagas in one statement. Replaces an
        earlier snapshot of the same artifact. The rows hold the artifact's own vector: they are deleted with
        its probe vectors when its receipt is sealed."""
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO semantic_snapshots VALUES (?, ?, ?, ?, ?) ON CONFLICT (store, artifact_id)"
                " DO UPDATE SET saga_id = excluded.saga_id, meta = excluded.meta, vectors = excluded.vectors",
                [(store, aid, saga_id, json_text(meta), vectors)
                 for saga_id, snapshots in sorted(by_saga.items())
                 for aid, (meta, vectors) in sorted(snapshots.items())],
            )

    def semantic_snapshots(self, store: str, artifact_ids: Iterable[str]) -> dict[str, tuple[dict[str, Any], bytes]]:
        """The recorded snapshots of these artifacts of ``store`` (those that have one): ``(meta, vectors)``."""
        out = {}
        for part in parts(list(dict.fromkeys(artifact_ids))):
            for aid, meta, vectors in self._conn.execute(
                    "SELECT artifact_id, meta, vectors FROM semantic_snapshots WHERE store = ? AND artifact_id IN"
                    f" ({','.join('?' * len(part))})", (store, *part)):
                out[aid] = (_loads(meta), bytes(vectors))
        return out

    # -- model snapshots (tombstone.verify.model) ----------------------------------------------

    def save_model_snapshots(self, saga_id: str, store: str, snapshots: dict[str, tuple[dict[str, Any], str | None]]) -> None:
        """Record, per artifact id, what the model level needs after the erasure: ``(meta, text)`` (JSON-able
        metadata; the trained example's text, kept sealed with the lineage secret, or None). Replaces an
        earlier snapshot of the same artifact. Deleted when the artifact's receipt is sealed."""
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO model_snapshots VALUES (?, ?, ?, ?, ?) ON CONFLICT (store, artifact_id)"
                " DO UPDATE SET saga_id = excluded.saga_id, meta = excluded.meta, text_sealed = excluded.text_sealed",
                [(store, aid, saga_id, json_text(meta),
                  None if text is None else self.secret.seal(text.encode("utf-8")))
                 for aid, (meta, text) in sorted(snapshots.items())],
            )

    def model_snapshots(self, store: str, artifact_ids: Iterable[str]) -> dict[str, tuple[dict[str, Any], str | None]]:
        """The recorded model snapshots of these artifacts of ``store`` (those that have one): ``(meta, text)``."""
        out = {}
        for aid in artifact_ids:
            row = self._conn.execute("SELECT meta, text_sealed FROM model_snapshots WHERE store = ? AND artifact_id = ?",
                                     (store, aid)).fetchone()
            if row is not None:
                text = None if row[1] is None else self.secret.unseal(bytes(row[1])).decode("utf-8")
                out[aid] = (json.loads(row[0]), text)
        return out


def _loads(text: str) -> Any:
    """JSON text written by ``json_text``: orjson reads it (a batch's semantic snapshots are thousands), the
    standard library what orjson refuses (an integer past 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
