"""Adapter for a Mem0 deployment on Qdrant local mode: the memories are points of a collection whose point ids
are Mem0's memory ids, and Mem0's SQLite history db keeps every memory's text, deleted or not.

Everything Qdrant local mode needs (the payload flag, the in-place delete with ``secure_delete``, the rewrite,
the probes) is the Qdrant adapter's; this one maps artifact ids to point ids unchanged and adds the history db:
its rows of the erased memories (and, for memories Mem0 inferred with an LLM, the session messages recorded
with them) are deleted with ``secure_delete`` on and its free space zeroed; the logical probe also reads the
history db (by memory id and by the text's hash), and the physical probe scans its files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter
from tombstone.errors import ConfigError
from tombstone.lineage.db import ArtifactRecord
from tombstone.sqlite_pages import zero_all_free_space
from tombstone.verify.levels import Level
from tombstone.contract import ProbeResult
from tombstone_adapters.qdrant.adapter import QdrantAdapter

from . import history

BACKEND = "mem0"
MESSAGE = "message"
"""The kind of a session message Mem0 keeps in its history db (recorded for memories inferred by an LLM)."""


def _memories(artifacts: Sequence[ArtifactRecord]) -> list[ArtifactRecord]:
    return [a for a in artifacts if a.kind != MESSAGE]


class Mem0Adapter(QdrantAdapter):
    """Options: ``path`` (Mem0's Qdrant local-mode directory), ``collection`` (Mem0's ``collection_name``) and
    ``history_path`` (Mem0's ``history_db_path``); ``reclaim`` as for Qdrant."""

    backend = BACKEND
    read_only_supported = False
    point_of = staticmethod(str)
    """Mem0 chooses its points' ids (the memory ids), which are the artifact ids."""

    demo_role = None
    demo_store = classmethod(Adapter.demo_store.__func__)
    demo_fill = classmethod(Adapter.demo_fill.__func__)
    canary_options = classmethod(Adapter.canary_options.__func__)
    discard_canary_place = classmethod(Adapter.discard_canary_place.__func__)

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        if "history_path" not in options:
            raise ConfigError(f'store {store!r}: the mem0 backend needs history_path = "..." (Mem0\'s history_db_path)',
                              store=store)
        self.history = Path(options["history_path"])
        history.check_history(self.history, store)  # before the Qdrant directory is opened (and locked)
        super().__init__(store, options)

    def _hashes(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, str]:
        return {a.content_hash: a.artifact_id for a in artifacts if a.content_hash}

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """The history db first — the rows of the memories and messages deleted with ``secure_delete`` on, its
        free space zeroed (Mem0 deletes its old messages with ``secure_delete`` off) — then the points, as
        the Qdrant adapter reclaims them (its scan of the files covers the history db too)."""
        memory_ids = [a.artifact_id for a in _memories(artifacts)]
        message_ids = [a.artifact_id for a in artifacts if a.kind == MESSAGE]
        deleted = history.purge(self.history, self.store, memory_ids, message_ids, self._hashes(artifacts),
                                self.content_key)
        zeroed = zero_all_free_space(self.history, kill="reclaim:mem0:history-free-space")
        evidence = super().reclaim(_memories(artifacts)) if memory_ids else {"mechanism": "in-place", "deleted": 0}
        return {**evidence, "history": {"rows_deleted": deleted, "free_space_zeroed": zeroed}}

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return super().suppress(_memories(artifacts))

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        """What Mem0's own ``delete`` does to the store: the point goes (its history rows stay)."""
        super().native_delete(_memories(artifacts))

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        memories = _memories(artifacts)
        results = super().probe_logical(memories, probe_vectors) if memories else {}
        rows = history.rows_holding(self.history, self.store, [a.artifact_id for a in memories],
                                    [a.artifact_id for a in artifacts if a.kind == MESSAGE], self._hashes(artifacts),
                                    self.content_key)
        out = {}
        for art in artifacts:
            aid = art.artifact_id
            base = results.get(aid)
            evidence = dict(base.evidence) if base is not None else {"paths": [], "returned_by": []}
            held = sorted(rows.get(aid, ()))
            paths = ["history(memory_id)", "history(text)"] if art.kind != MESSAGE else ["messages(id)",
                                                                                        "messages(text)"]
            if self.content_key is None:  # an independent verifier has no secret: rows are matched by id only
                paths = paths[:1]
            evidence["paths"] = sorted(set(evidence["paths"]) | set(paths))
            returned = sorted(set(evidence["returned_by"]) | set(held))
            evidence["returned_by"] = returned
            out[aid] = ProbeResult(level=Level.LOGICAL, passed=not returned,
                                   measurement=f"returned by {', '.join(returned)}" if returned else None,
                                   evidence=evidence)
        return out

    def physical_files(self) -> list[Path]:
        """The Qdrant directory's files and the history db with its journal and write-ahead log."""
        extra = [self.history] + [Path(f"{self.history}{s}") for s in ("-wal", "-journal")]
        return super().physical_files() + [p for p in extra if p.is_file()]


__all__ = ["BACKEND", "MESSAGE", "Mem0Adapter"]
