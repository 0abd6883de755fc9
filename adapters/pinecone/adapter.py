"""Adapter for Pinecone (managed): logical-only, freshness-aware, honestly UNVERIFIED-managed.

Pinecone has no persist directory, snapshot or file-read API, so ``probe_physical`` raises instead of
reporting absence, and no Pinecone artifact is ever VERIFIED: the best it gets is
UNVERIFIED(managed) with a passing logical probe in its evidence. The service is eventually
consistent, so suppression and deletion are followed by a bounded wait until reads show them; the wait
and its outcome are evidence on the receipt.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, TombstoneError
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.logical import TOP_K, fit_dim, nearest_paths, probe_set
from tombstone.verify.neighbourhood import Neighbours

from .wrapper import BACKEND, ID_KEY, SUPPRESSED, TombstonePinecone
from . import settings
from .hooks import PineconeHooks

_BATCH = 100


class PineconeAdapter(PineconeHooks, Adapter):
    """Options: ``host`` (the index's data-plane host), ``namespace`` (default ``""``), ``api_key_env``
    (default ``PINECONE_API_KEY``), ``wait_seconds`` (bound on each visibility wait, default 30),
    ``poll_seconds`` (first poll interval, doubled up to 2 s)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.MANAGED,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.SEMANTIC)
    read_only_supported = True  # its probes only fetch and query

    def __init__(self, store: str, options: Mapping[str, Any], *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(store, options)
        host, key = settings.connection(store, options)  # a PINECONE_* key, sent only to an https:// host
        from pinecone import Pinecone

        self.namespace = str(options.get("namespace", ""))
        self.index = Pinecone(api_key=key).Index(host=host)
        self.wait_seconds = float(options.get("wait_seconds", 30))
        self.poll_seconds = float(options.get("poll_seconds", 0.05))
        self.sleep, self.clock = sleep, clock
        self._deleted_at: dict[str, float] = {}

    @classmethod
    def credential_destination(cls, store: str, options: Mapping[str, Any]) -> str | None:
        """Every probe sends the API key to the configured host."""
        return settings.destination(store, options)

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """The SDK's base exception, a refused or reset connection, and the HTTP transport's own errors
        (urllib3 in older SDKs, httpx in newer ones), which some versions let through unwrapped."""
        from pinecone.exceptions import PineconeException

        errors: list[type[BaseException]] = [PineconeException, ConnectionError]
        for module, name in (("urllib3.exceptions", "HTTPError"), ("httpx", "HTTPError")):
            try:
                errors.append(getattr(importlib.import_module(module), name))
            except ImportError:
                continue
        return tuple(errors)

    def map_vendor_error(self, exc: BaseException) -> TombstoneError:
        """As the base, but what retrying cannot fix is not retryable: a rejected key or request, an index
        that is not there (HTTP 400, 401, 403, 404, 422) and the SDK's own argument checks."""
        error = super().map_vendor_error(exc)
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
        if status in (400, 401, 403, 404, 422) or isinstance(exc, (ValueError, TypeError)):
            error.retryable = False
        return error

    def store_lock(self) -> contextlib.AbstractContextManager[Any]:
        """No lock. Nothing here is rewritten: suppress updates and reclaim deletes the named ids, one API
        call each, which other writes and other erasures (of other ids) cannot undo or be undone by, and
        the service orders concurrent requests itself. There is no file to lock beside, and processes on
        other machines reach the same index."""
        return contextlib.nullcontext()

    def _fetch(self, ids: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for start in range(0, len(ids), _BATCH):
            out.update(self.index.fetch(ids=ids[start : start + _BATCH], namespace=self.namespace).vectors)
        return out

    def _wait(self, done: Callable[[], bool]) -> dict[str, Any]:
        """Poll ``done`` with backoff until it holds or the bound passes; the outcome is evidence."""
        start, delay, polls = self.clock(), self.poll_seconds, 0
        while True:
            polls += 1
            if done():
                return {"visible": True, "waited_s": round(self.clock() - start, 3), "polls": polls}
            if self.clock() - start >= self.wait_seconds:
                return {"visible": False, "waited_s": round(self.clock() - start, 3), "polls": polls,
                        "bound_s": self.wait_seconds}
            self.sleep(delay)
            delay = min(delay * 2, 2.0)

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        ids = list(self._fetch(self._ids(artifacts)))
        for aid in ids:
            self.index.update(id=aid, set_metadata={SUPPRESSED: True}, namespace=self.namespace)

        def flagged() -> bool:
            current = self._fetch(ids)
            return all((v.metadata or {}).get(SUPPRESSED) for v in current.values())

        return {"mechanism": f"metadata {SUPPRESSED}=true + $ne filter on every wrapper query path",
                "records_flagged": len(ids), "wait": self._wait(flagged)}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.index.delete(ids=self._ids(artifacts), namespace=self.namespace)

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        ids = self._ids(artifacts)
        for start in range(0, len(ids), _BATCH):
            self.index.delete(ids=ids[start : start + _BATCH], namespace=self.namespace)
        now = self.clock()
        self._deleted_at.update({i: now for i in ids})
        probes = {a.artifact_id: a.fingerprint for a in artifacts if a.fingerprint is not None}

        def gone() -> bool:
            if self._fetch(ids):
                return False
            for aid, fp in probes.items():  # the query path too, with the artifact's own fingerprint
                if aid in {m.id for m in self._query(fp, TOP_K)}:
                    return False
            return True

        return {"steps": ["index.delete(ids)", "wait until fetch and query stop returning them"],
                "deleted_requested": len(ids), "wait": self._wait(gone),
                "note": "freed storage is not observable from a client of a managed service"}

    def _dim(self) -> int:
        return int(self.index.describe_index_stats().dimension)

    def _query(self, vector, k: int, flt=None, values: bool = False):
        dim = self._dim()
        return self.index.query(vector=fit_dim(np.asarray(vector, dtype=np.float32), dim).tolist(),
                                top_k=max(1, k), filter=flt, namespace=self.namespace, include_metadata=True,
                                include_values=values).matches

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        probe_vectors = probe_vectors or {}
        dim = self._dim()
        view = TombstonePinecone(self.index, namespace=self.namespace, lineage=None, store=self.store)
        fetched_raw = self._fetch(self._ids(artifacts))
        fetched_view = view.fetch(self._ids(artifacts))

        def searcher(raw: bool):
            def search(vectors: np.ndarray, k: int):
                ids, cands = [], []
                for v in vectors:
                    if raw:
                        matches = self._query(v, k, values=True)
                    else:
                        matches = view.query(v.tolist(), top_k=k, include_values=True)
                    ids.append([m.id for m in matches])
                    cands.append(np.asarray([m.values for m in matches], dtype=np.float32))
                return ids, cands

            return search

        results = {}
        for art in artifacts:
            aid = art.artifact_id
            zero = np.zeros(dim, dtype=np.float32)
            by_id = {ID_KEY: {"$eq": aid}}
            paths = {
                "raw.fetch": aid in fetched_raw,
                "raw.query(filter id)": bool(self._query(zero if art.fingerprint is None else art.fingerprint, TOP_K, by_id)),
                "wrapper.fetch": aid in fetched_view,
            }
            queries = [(label, fit_dim(v, dim)) for label, v in probe_set(art.fingerprint, probe_vectors.get(aid, []), dim)]
            paths.update(nearest_paths(aid, queries, {"raw": searcher(True), "wrapper": searcher(False)}, TOP_K))
            returned = sorted(p for p, hit in paths.items() if hit)
            measurement = None
            if returned:
                measurement = f"returned by {', '.join(returned)}"
                if aid in self._deleted_at:
                    measurement += f" {self.clock() - self._deleted_at[aid]:.1f} s after index.delete"
            results[aid] = ProbeResult(level=Level.LOGICAL, passed=not returned, measurement=measurement,
                                       evidence={"paths": sorted(paths), "returned_by": returned,
                                                 "probe_vectors": len(queries), "namespace": self.namespace})
        return results

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """The index's nearest records in the store's namespace (no suppression filter), over-fetched by
        ``len(exclude)``; the distances are Pinecone's scores as it returns them."""
        out = []
        for v in np.asarray(vectors, dtype=np.float32):
            matches = [m for m in self._query(v, k + len(exclude), values=True) if m.id not in exclude][:k]
            out.append(Neighbours([m.id for m in matches], [float(m.score) for m in matches],
                                  np.asarray([m.values for m in matches], dtype=np.float32).reshape(len(matches), -1)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        return {i: np.asarray(v.values, dtype=np.float32) for i, v in self._fetch(list(ids)).items()}

    def unsupported_reason(self, level: Level) -> str | None:
        if level is Level.PHYSICAL:
            return "managed: no physical check possible (Pinecone offers no persist directory, snapshot or file-read API)"
        return None

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        raise PhysicalUnsupportedError(self.unsupported_reason(Level.PHYSICAL), store=self.store)
