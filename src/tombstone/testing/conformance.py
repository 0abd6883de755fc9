"""The adapter conformance suite. Every adapter, built-in or third-party, runs it.

Subclass :class:`AdapterConformance` in a test module and provide one fixture,
``conformance_env``, returning a :class:`ConformanceEnv` over a fresh store::

    class TestMyStore(AdapterConformance):
        @pytest.fixture
        def conformance_env(self, tmp_path):
            ...
            return ConformanceEnv(adapter=..., write=..., survivors=...)

Declared capabilities decide which tests apply. Each test's docstring says what a failure usually
means. The physical tests always run their control first: the probe must find the bytes before
erasure, and what the store's own delete leaves behind, or a pass after reclaim proves nothing.

``vendor_failure`` is required: a context manager under which the store's client raises its own
exception type (``unittest.mock.patch.object`` on the client, or on each vendor function the
operations call), so the suite can check that only TombstoneErrors leave the adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pytest

from tombstone.contract import Adapter, Capability
from tombstone.errors import PhysicalUnsupportedError, TombstoneError
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level


@dataclass
class ConformanceEnv:
    """What the suite needs from an adapter's test module."""

    adapter: Adapter
    """The adapter under test, serving a fresh store."""
    write: Callable[[str, int], list[ArtifactRecord]]
    """Write ``n`` artifacts for a subject through the store's wrapper; return their lineage records."""
    survivors: Callable[[], Any]
    """A comparable snapshot of everything the store returns (ids, content, metadata, query results)."""
    visible: Callable[[list[str]], set[str]]
    """Which of the given ids the wrapper's read paths (the app's view) still return."""
    native_delete_leaves_residue: bool = True
    """Whether the store's own delete is expected to leave the bytes behind (the physical control)."""
    native_delete_hides: bool = True
    """Whether the store's own delete leaves nothing its reads return (False where a read path the adapter's
    logical probe covers keeps it: Mem0's history of a deleted memory)."""
    vendor_failure: Callable[[], AbstractContextManager[Any]] | None = None
    """A context manager under which the store's client raises its own exception type (one of the
    adapter's ``vendor_errors()``) on every call that suppress, reclaim and the probes make; patch
    more than one thing if an operation reaches the store another way (e.g. reading its files)."""


class AdapterConformance:
    """Tests every adapter must pass. Provide the ``conformance_env`` fixture in a subclass."""

    @pytest.fixture
    def conformance_env(self) -> ConformanceEnv:  # pragma: no cover - supplied by subclasses
        raise NotImplementedError("subclasses provide the conformance_env fixture")

    @pytest.fixture
    def env(self, conformance_env: ConformanceEnv) -> ConformanceEnv:
        yield conformance_env
        conformance_env.adapter.close()

    # -- declarations -------------------------------------------------------------------------

    def test_declares_backend_and_capabilities(self, env: ConformanceEnv) -> None:
        """The adapter must name its backend and declare capabilities; the lattice reads only those."""
        adapter = env.adapter
        assert isinstance(adapter.backend, str) and adapter.backend
        assert isinstance(adapter.capabilities, frozenset) and adapter.capabilities
        assert all(isinstance(c, Capability) for c in adapter.capabilities)
        assert Level.LOGICAL in adapter.levels
        if Capability.MANAGED in adapter.capabilities:
            assert Capability.PHYSICAL_SCAN not in adapter.capabilities, "a managed store cannot be byte-scanned"
        assert (Capability.HIDE in adapter.capabilities) != (Capability.IMMEDIATE_DELETE in adapter.capabilities)

    # -- logical ------------------------------------------------------------------------------

    def test_logical_probe_sees_live_artifacts(self, env: ConformanceEnv) -> None:
        """Control: a live artifact must fail the logical probe, or a later pass means nothing."""
        arts = env.write("conformance-subject", 3)
        results = env.adapter.probe_logical(arts)
        assert set(results) == {a.artifact_id for a in arts}
        assert all(not r.passed for r in results.values()), results

    def test_suppress_hides_from_every_path(self, env: ConformanceEnv) -> None:
        """After suppress, the wrapper's read paths return none of the artifacts; others stay visible."""
        mine = env.write("conformance-subject", 3)
        other = env.write("conformance-survivor", 2)
        ids = [a.artifact_id for a in mine]
        assert env.visible(ids) == set(ids), "control: the wrapper does not return live artifacts"
        env.adapter.suppress(mine)
        assert env.visible(ids) == set()
        assert env.visible([a.artifact_id for a in other]) == {a.artifact_id for a in other}, "a survivor disappeared"

    def test_suppress_is_idempotent(self, env: ConformanceEnv) -> None:
        """Steps are re-run after a crash; running suppress twice must be harmless."""
        mine = env.write("conformance-subject", 2)
        env.adapter.suppress(mine)
        env.adapter.suppress(mine)
        assert env.visible([a.artifact_id for a in mine]) == set()

    # -- physical -----------------------------------------------------------------------------

    def test_physical_probe_finds_live_bytes(self, env: ConformanceEnv) -> None:
        """Control: the scan must find a live artifact's bytes. If not, the patterns or files are wrong."""
        arts = env.write("conformance-subject", 3)
        if Capability.PHYSICAL_SCAN not in env.adapter.capabilities:
            with pytest.raises(PhysicalUnsupportedError):
                env.adapter.probe_physical(arts)
            return
        results = env.adapter.probe_physical(arts)
        assert all(not r.passed and r.id_found for r in results.values()), results

    def test_native_delete_control(self, env: ConformanceEnv) -> None:
        """Control: the store's own delete leaves bytes the probe must find (when the env says it does)."""
        if Capability.PHYSICAL_SCAN not in env.adapter.capabilities or not env.native_delete_leaves_residue:
            pytest.skip("no physical scan, or the store's own delete is not expected to leave residue")
        arts = env.write("conformance-subject", 3)
        env.adapter.native_delete(arts)
        logical = env.adapter.probe_logical(arts).values()
        if env.native_delete_hides:
            assert all(r.passed for r in logical)
        else:
            assert not any(r.passed for r in logical), "the store's own delete left nothing readable to find"
        results = env.adapter.probe_physical(arts)
        assert any(not r.passed for r in results.values()), "the store's own delete left nothing to find"

    def test_reclaim_removes_bytes_and_keeps_survivors(self, env: ConformanceEnv) -> None:
        """After suppress + reclaim the scan finds nothing of the erased; survivors are unchanged."""
        if Capability.RECLAIM not in env.adapter.capabilities:
            pytest.skip("no reclaim recipe")
        mine = env.write("conformance-subject", 3)
        others = env.write("conformance-survivor", 3)
        before = env.survivors()
        if Capability.PHYSICAL_SCAN in env.adapter.capabilities:
            assert all(not r.passed for r in env.adapter.probe_physical(mine).values())
        env.adapter.suppress(mine)
        env.adapter.reclaim(mine)
        env.adapter.reclaim(mine)  # idempotent
        after = env.survivors()
        expected = _without(before, {a.artifact_id for a in mine})
        assert after == expected, "reclaim changed or lost a survivor"
        assert all(r.passed for r in env.adapter.probe_logical(mine).values())
        assert all(not r.passed for r in env.adapter.probe_logical(others).values())
        if Capability.PHYSICAL_SCAN in env.adapter.capabilities:
            results = env.adapter.probe_physical(mine)
            assert all(r.passed for r in results.values()), results
            assert all(not r.passed for r in env.adapter.probe_physical(others).values())

    # -- semantic -----------------------------------------------------------------------------

    def test_semantic_hooks_answer_from_the_raw_store(self, env: ConformanceEnv) -> None:
        """An adapter that declares SEMANTIC_PROBE answers the semantic level's two questions from the raw
        store: the stored vector of each id it holds (and nothing for ids it does not), and each query's
        nearest records in rank order with their vectors, ``exclude`` left out. A record is its own nearest
        neighbour; a hidden (suppressed) record still answers, since the snapshot and the controls measure
        the store as it is."""
        adapter = env.adapter
        if Capability.SEMANTIC_PROBE not in adapter.capabilities:
            pytest.skip("no semantic probe declared")
        import numpy as np

        mine = env.write("conformance-subject", 3)
        others = env.write("conformance-survivor", 3)
        ids = [a.artifact_id for a in mine + others]
        vectors = adapter.stored_vectors(ids + ["conformance-no-such-id"])
        assert set(vectors) == set(ids)
        target = mine[0].artifact_id

        def unit(v):
            v = np.asarray(v, dtype=np.float64)
            return v / np.linalg.norm(v)

        [near] = adapter.semantic_neighbours(np.stack([vectors[target]]), 3)
        assert near.ids[0] == target and len(near.ids) == len(near.distances) == len(near.vectors) == 3, near
        assert np.allclose(unit(near.vectors[0]), unit(vectors[target]), atol=1e-5)
        [without] = adapter.semantic_neighbours(np.stack([vectors[target]]), 3, frozenset({target}))
        assert target not in without.ids and len(without.ids) == 3, without
        if Capability.HIDE in adapter.capabilities:
            adapter.suppress(mine)
            [hidden] = adapter.semantic_neighbours(np.stack([vectors[target]]), 3)
            assert hidden.ids[0] == target, "a suppressed record must still answer the raw store's search"

    @pytest.mark.parametrize("shallow", [False, True], ids=["default", "every-row-asked-again"])
    def test_batched_neighbour_searches_match_one_search_per_artifact(self, env: ConformanceEnv, shallow: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """The semantic level asks the store once for every erased artifact's queries, each row with every
        *other* erased artifact left out, and asks again only the rows that the first, shallower ask left
        short. With most of the store erased (most rows short), each artifact's neighbours are the same as
        one search of its own with the others excluded."""
        adapter = env.adapter
        if Capability.SEMANTIC_PROBE not in adapter.capabilities:
            pytest.skip("no semantic probe declared")
        import numpy as np

        from tombstone.verify import neighbourhood
        from tombstone.verify.neighbourhood import _search_each

        if shallow:  # a first ask no deeper than k: rows holding another erased artifact must be asked again
            monkeypatch.setattr(neighbourhood, "first_extra", lambda k: 0)
        erased = env.write("conformance-subject", 24)
        survivors = env.write("conformance-survivor", 3)
        own = adapter.stored_vectors([a.artifact_id for a in erased])
        asked = {aid: [("own", np.asarray(v, dtype=np.float32))] for aid, v in own.items()}
        names = set(own)
        batched = _search_each(adapter, lambda action: action(), asked, 2, names)
        for aid, [(_, query)] in asked.items():
            [alone] = adapter.semantic_neighbours(np.stack([query]), 2, frozenset(names - {aid}))
            [got] = batched[aid]
            assert got.ids == alone.ids and got.ids[0] == aid, (aid, got.ids, alone.ids)
            assert got.ids[1] in {a.artifact_id for a in survivors}
            assert np.allclose(got.vectors, alone.vectors, atol=1e-6)

    # -- errors -------------------------------------------------------------------------------

    def test_vendor_failures_leave_only_tombstone_errors(self, env: ConformanceEnv) -> None:
        """When the store's client fails, every operation raises a TombstoneError naming the backend or
        the store, caused by the vendor's exception. A raw vendor exception here usually means
        ``vendor_errors()`` misses a type the client raises; "not caused by the injected failure" means
        the env's ``vendor_failure`` does not reach that operation (patch what it calls)."""
        if env.vendor_failure is None:
            pytest.fail("the conformance env gives no vendor_failure: provide a context manager under which the"
                        " store's client raises its own exception type (see ConformanceEnv.vendor_failure)")
        adapter = env.adapter
        arts = env.write("conformance-subject", 2)
        operations: dict[str, Callable[[], Any]] = {
            "suppress": lambda: adapter.suppress(arts),
            "probe_logical": lambda: adapter.probe_logical(arts),
        }
        if Capability.RECLAIM in adapter.capabilities:
            operations["reclaim"] = lambda: adapter.reclaim(arts)
        if Capability.PHYSICAL_SCAN in adapter.capabilities:
            operations["probe_physical"] = lambda: adapter.probe_physical(arts)
        for name, operation in operations.items():
            with env.vendor_failure():
                with pytest.raises(TombstoneError) as raised:
                    operation()
            error = raised.value
            message = str(error)
            assert adapter.backend in message or adapter.store in message, (
                f"{name}: the error names neither the backend {adapter.backend!r} nor the store"
                f" {adapter.store!r}: {message!r}")
            assert _vendor_cause(error) is not None, (
                f"{name} raised {type(error).__name__} ({message!r}) not caused by the injected failure:"
                " vendor_failure does not reach this operation")


def _vendor_cause(error: BaseException) -> BaseException | None:
    """The first exception in ``error``'s chain that is not a TombstoneError (the vendor's), if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if not isinstance(current, TombstoneError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _without(snapshot: Any, ids: set[str]) -> Any:
    """Drop erased ids from a survivors snapshot shaped as {id: ...}."""
    if isinstance(snapshot, dict):
        return {k: v for k, v in snapshot.items() if k not in ids}
    return snapshot
