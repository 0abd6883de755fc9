"""Pinecone (managed), driven through the REAL pinecone SDK against a local EMULATOR of its data-plane
HTTP API (the service cannot be reached from here). The emulator's visibility lag is explicit."""

from __future__ import annotations

import zlib
from unittest import mock

import numpy as np
import pytest
from pinecone import Pinecone
from pinecone.exceptions import ServiceException

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.lineage.db import ArtifactRecord
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.pinecone import PineconeEmulator, TombstonePinecone
from tombstone_adapters.pinecone.adapter import PineconeAdapter

from conftest import FrozenClock, raising_stub

DIM = 32
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def text(seed: str, n: int = 30) -> str:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return f"{seed}: " + " ".join(rng.choice(WORDS, n))


@pytest.fixture
def emulator():
    with PineconeEmulator(DIM, lag=0.02) as emu:
        yield emu


@pytest.fixture
def pctomb(tmp_path, emulator, monkeypatch):
    monkeypatch.setenv("PINECONE_API_KEY", "emulator-key")
    config = init_deployment(tmp_path / "deploy", {"pc": {"backend": "pinecone", "host": emulator.host,
                                                          "namespace": "tenant-a", "wait_seconds": 2.0}})
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb


def index(emulator):
    return Pinecone(api_key="emulator-key").Index(host=emulator.host)


def app(tomb, emulator, namespace="tenant-a") -> TombstonePinecone:
    return TombstonePinecone(index(emulator), namespace=namespace, lineage=tomb.lineage, store="pc",
                             embedder=HashingEmbedder(DIM))


def write(tomb, emulator, subject, n, *, start=0, texts=None):
    ids = [f"{subject}-vec-{start + i:05d}" for i in range(n)]
    app(tomb, emulator).upsert(ids, documents=texts or [text(f"{subject}-{start + i}") for i in range(n)],
                               metadatas=[{"n": start + i} for i in range(n)], subject=subject)
    return ids


def settle(emulator):
    import time

    time.sleep(emulator.lag * 3)


class TestPineconeConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, pctomb, emulator):
        counter = iter(range(0, 100_000, 100))
        adapter = PineconeAdapter("pc", pctomb.config.stores["pc"].options)

        def write_records(subject, n):
            ids = write(pctomb, emulator, subject, n, start=next(counter))
            settle(emulator)
            return [pctomb.lineage.artifact("pc", i) for i in ids]

        def survivors():
            settle(emulator)
            view = TombstonePinecone(index(emulator), namespace="tenant-a", lineage=None, store="pc")
            ids, token = [], None
            while True:
                page = index(emulator).list_paginated(namespace="tenant-a", limit=100, pagination_token=token)
                ids += [v.id for v in page.vectors]
                token = page.pagination.next if page.pagination else None
                if not token:
                    break
            return {i: (list(v.values), dict(v.metadata)) for i, v in view.fetch(ids).items()}

        def visible(ids):
            view = TombstonePinecone(index(emulator), namespace="tenant-a", lineage=None, store="pc")
            return set(view.fetch(list(ids))) & set(ids)

        def vendor_failure():
            # The service answers every data-plane call with 503.
            unavailable = ServiceException("injected: service unavailable", 503)
            return mock.patch.object(adapter, "index", raising_stub(adapter.index, unavailable))

        return ConformanceEnv(adapter=adapter, write=write_records, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


def test_lag_within_the_bound_is_unverified_managed_with_a_passing_logical_probe(pctomb, emulator):
    mine = write(pctomb, emulator, "alice", 3)
    write(pctomb, emulator, "bob", 4)
    settle(emulator)
    emulator.lag = 0.3  # the service now takes 0.3 s to show each write; the bound is 2 s
    receipt, _ = pctomb.erase("alice")
    for art in receipt["artifacts"]:
        assert art["status"] == "UNVERIFIED" and art["level"] is None
        assert art["reason"] == ("physical: managed: no physical check possible (Pinecone offers no persist "
                                 "directory, snapshot or file-read API)")
        logical, physical, semantic, model = art["evidence"]["probes"]
        assert logical["ran"] and logical["passed"] is True
        assert physical["ran"] is False and semantic["ran"] is False and model["ran"] is False
        suppress_wait = art["evidence"]["suppression"]["evidence"]["wait"]
        reclaim_wait = art["evidence"]["reclaim"]["evidence"]["wait"]
        assert suppress_wait["visible"] and reclaim_wait["visible"]
        assert reclaim_wait["waited_s"] >= 0.25, "the wait for eventual consistency must be real"
    assert sorted(art["artifact_id"] for art in receipt["artifacts"]) == mine


def test_lag_beyond_the_bound_is_residual_logical_with_the_measurement(pctomb, emulator):
    mine = write(pctomb, emulator, "alice", 2)
    settle(emulator)
    emulator.lag = 30.0  # deletes take far longer than the 2 s bound: the service still serves the ids
    receipt, _ = pctomb.erase("alice")
    for art in receipt["artifacts"]:
        assert (art["status"], art["level"]) == ("RESIDUAL", "logical"), art
        assert "raw.fetch" in art["measurement"] and "s after index.delete" in art["measurement"]
        assert art["evidence"]["reclaim"]["evidence"]["wait"]["visible"] is False


def test_every_read_path_hides_suppressed(pctomb, emulator):
    mine = write(pctomb, emulator, "alice", 3, texts=[text("shared words")] * 3)
    theirs = write(pctomb, emulator, "bob", 4)
    settle(emulator)
    PineconeAdapter("pc", pctomb.config.stores["pc"].options).suppress([pctomb.lineage.artifact("pc", i) for i in mine])
    view = app(pctomb, emulator)
    paths = {
        "query": [m.id for m in view.query(text=text("shared words"), top_k=10)],
        "query+filter": [m.id for m in view.query(text="x", top_k=10, filter={"n": {"$lte": 2}})],
        "fetch": list(view.fetch(mine + theirs)),
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a suppressed record"
        assert set(returned) & set(theirs), f"{name} returned no survivor: path not exercised"


def test_namespaces_are_kept_apart(pctomb, emulator):
    mine = write(pctomb, emulator, "alice", 2)
    other = TombstonePinecone(index(emulator), namespace="tenant-b", lineage=None, store="pc")
    index(emulator).upsert(vectors=[{"id": mine[0], "values": [0.5] * DIM, "metadata": {"owner": "b"}}],
                           namespace="tenant-b")
    settle(emulator)
    pctomb.erase("alice")
    settle(emulator)
    assert mine[0] in other.fetch([mine[0]]), "a record in another namespace must be untouched"


def test_physical_probe_raises_rather_than_reporting_absence(pctomb, emulator):
    write(pctomb, emulator, "alice", 1)
    adapter = PineconeAdapter("pc", pctomb.config.stores["pc"].options)
    with pytest.raises(PhysicalUnsupportedError, match="managed"):
        adapter.probe_physical([pctomb.lineage.artifact("pc", "alice-vec-00000")])


def test_missing_api_key_is_a_clear_error(pctomb, emulator, monkeypatch):
    write(pctomb, emulator, "alice", 1)
    monkeypatch.delenv("PINECONE_API_KEY")
    with pytest.raises(StoreUnavailableError, match="no Pinecone API key: set PINECONE_API_KEY"):
        pctomb.erase("alice")
    assert pctomb.lineage.sagas() == [], "nothing started, nothing lost"


def test_unreachable_service_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PINECONE_API_KEY", "k")
    adapter = PineconeAdapter("pc", {"host": "http://127.0.0.1:9", "wait_seconds": 0.1})
    with pytest.raises(StoreUnavailableError, match="pinecone: ") as raised:
        adapter.suppress([ArtifactRecord("pc", "x", "pinecone", "vector")])
    assert raised.value.retryable and raised.value.store == "pc"
