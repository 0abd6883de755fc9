"""A fault-injecting store wrapper for tests: ``backend = "faulty"`` wraps any other backend.

    [stores.docs]
    backend = "faulty"
    wraps = "docstore"          # the real backend underneath
    path = "stores/docs/docstore.db"
    fail_suppress = 2           # the first 2 suppress calls raise (per process)
    fail_reclaim = 0
    fail_probe = 0
    fail_open = 0               # opening the store fails this many times
    retryable = true            # raise a retryable StoreUnavailableError (else a non-retryable one)

Faults are counted in a small state file next to the store (``.faults.json``), so they hold across the
processes of a crash-and-resume test. Everything else is the wrapped adapter's, unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter, ProbeResult, adapter_class
from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.lineage.db import ArtifactRecord


class FaultyAdapter(Adapter):
    backend = "faulty"
    capabilities = frozenset()  # replaced per instance by the wrapped adapter's
    for_tests = True

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        if not options.get("wraps"):
            raise ConfigError(f"store {store!r}: the faulty backend needs wraps = \"<backend>\"")
        anchor = Path(options.get("path") or options.get("data_dir") or ".")
        self._state = (anchor if anchor.is_dir() else anchor.parent) / ".faults.json"
        self._fault("open")
        self.inner = adapter_class(options["wraps"])(store, {k: v for k, v in options.items()
                                                            if k != "wraps" and not k.startswith("fail_")})
        self.capabilities = self.inner.capabilities  # type: ignore[misc]
        self.levels = self.inner.levels  # type: ignore[misc]

    def _fault(self, what: str) -> None:
        budget = int(self.options.get(f"fail_{what}", 0))
        if not budget:
            return
        counts = json.loads(self._state.read_text()) if self._state.exists() else {}
        if counts.get(what, 0) >= budget:
            return
        counts[what] = counts.get(what, 0) + 1
        self._state.write_text(json.dumps(counts))
        raise StoreUnavailableError(f"injected fault: {what} failed ({counts[what]} of {budget})",
                                    store=self.store, retryable=bool(self.options.get("retryable", True)))

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        self._fault("suppress")
        return self.inner.suppress(artifacts)

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        self._fault("reclaim")
        return self.inner.reclaim(artifacts)

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        self._fault("probe")
        return self.inner.probe_logical(artifacts, probe_vectors)

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        return self.inner.probe_physical(artifacts)

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.inner.native_delete(artifacts)

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()):
        return self.inner.semantic_neighbours(vectors, k, exclude)

    def stored_vectors(self, ids):
        return self.inner.stored_vectors(ids)

    def close(self) -> None:
        self.inner.close()
