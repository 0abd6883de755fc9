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

from support import FrozenClock, raising_stub

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
                                                          "allow_insecure_host": True,
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


def test_every_read_path_hides_ids_suppressed_in_the_lineage_db_before_the_flag_is_written(pctomb, emulator,
                                                                                             monkeypatch):
    """An erasure records its suppression in the lineage db before it writes the flag: a wrapper with the
    lineage db leaves those ids out from then on (a ``$nin`` in the filter, then a post-filter; past the
    most one ``$nin`` takes, a wider ask). Control: a wrapper without the lineage db still returns them."""
    from tombstone_adapters.pinecone import wrapper as pc_wrapper

    mine = write(pctomb, emulator, "alice", 3, texts=[text("shared words")] * 3)
    theirs = write(pctomb, emulator, "bob", 4)
    settle(emulator)
    pctomb.lineage.record_suppressions("e1", [pctomb.lineage.artifact("pc", i) for i in mine])
    view = app(pctomb, emulator)
    bare = TombstonePinecone(index(emulator), namespace="tenant-a", lineage=None, store="pc",
                             embedder=HashingEmbedder(DIM))
    assert set(mine) <= {m.id for m in bare.query(text=text("shared words"), top_k=10)}  # control
    assert set(bare.fetch(mine)) == set(mine)
    for limit in (pc_wrapper.NIN_LIMIT, 2):  # one $nin, then more hidden ids than one $nin takes
        monkeypatch.setattr(pc_wrapper, "NIN_LIMIT", limit)
        paths = {
            "query": [m.id for m in view.query(text=text("shared words"), top_k=4)],
            "query+filter": [m.id for m in view.query(text="x", top_k=10, filter={"n": {"$lte": 2}})],
            "fetch": list(view.fetch(mine + theirs)),
        }
        for name, returned in paths.items():
            assert not set(returned) & set(mine), f"{name} returned a suppressed record"
            assert set(returned) & set(theirs), f"{name} returned no survivor: path not exercised"
        assert len(paths["query"]) == 4, "k survivors still come back"


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
    adapter = PineconeAdapter("pc", {"host": "http://127.0.0.1:9", "allow_insecure_host": True, "wait_seconds": 0.1})
    with pytest.raises(StoreUnavailableError, match="pinecone: ") as raised:
        adapter.suppress([ArtifactRecord("pc", "x", "pinecone", "vector")])
    assert raised.value.retryable and raised.value.store == "pc"


def _cli(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_the_key_is_read_only_from_a_pinecone_variable(pctomb, emulator, monkeypatch):
    write(pctomb, emulator, "alice", 1)
    import tomli_w

    config = pctomb.config.path
    data = {"stores": {"pc": {**pctomb.config.stores["pc"].options, "backend": "pinecone",
                              "api_key_env": "AWS_SECRET_ACCESS_KEY"}}}
    hostile = config.with_name("hostile.toml")
    hostile.write_text(config.read_text().split("[stores")[0] + tomli_w.dumps(data))
    seen = len(emulator.requests)
    result = _cli("erase", "alice", "--config", str(hostile), env={"AWS_SECRET_ACCESS_KEY": "aws-secret"})
    assert result.returncode == 2 and "PINECONE_*" in result.stderr, result.stderr
    assert "aws-secret" not in emulator.api_keys and len(emulator.requests) == seen


def test_the_key_goes_only_to_an_https_host_unless_the_store_allows_an_emulator(pctomb, emulator):
    from tombstone.errors import ConfigError

    options = {k: v for k, v in pctomb.config.stores["pc"].options.items() if k != "allow_insecure_host"}
    seen = len(emulator.requests)
    with pytest.raises(ConfigError, match="must be an https:// URL"):
        PineconeAdapter("pc", options)
    with pytest.raises(ConfigError, match="must be an https:// URL"):
        PineconeAdapter("pc", {**options, "allow_insecure_host": "yes"})  # only the boolean true
    assert len(emulator.requests) == seen
    assert PineconeAdapter("pc", {**options, "host": "https://idx-1.svc.example.pinecone.io"}).namespace == "tenant-a"


def test_the_auditor_sends_no_key_to_a_host_from_a_config_it_was_handed(pctomb, emulator, tmp_path):
    import json

    import tomli_w

    write(pctomb, emulator, "alice", 2)
    receipt, _ = pctomb.erase("alice")
    receipt_path = tmp_path / "alice.json"
    receipt_path.write_text(json.dumps(receipt))
    handed = tmp_path / "stores.toml"
    handed.write_text(tomli_w.dumps({"stores": {"pc": {"backend": "pinecone",
                                                       **pctomb.config.stores["pc"].options}}}))
    key = str(pctomb.config.keys_dir / "signing.pub")
    seen = len(emulator.requests)
    refused = _cli("audit", str(receipt_path), "--config", str(handed), "--key", key,
                   env={"PINECONE_API_KEY": "auditors-own-key"})
    assert len(emulator.requests) == seen and "auditors-own-key" not in emulator.api_keys
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "UNCHECKED:" in refused.stdout and "--trust-config" in refused.stdout
    trusted = _cli("audit", str(receipt_path), "--config", str(handed), "--key", key, "--trust-config",
                   env={"PINECONE_API_KEY": "auditors-own-key"})
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert "auditors-own-key" in emulator.api_keys


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(pctomb, emulator):
    ids = write(pctomb, emulator, "alice", 2)
    arts = [pctomb.lineage.artifact("pc", i) for i in ids]
    pctomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    pctomb.adapter("pc").suppress(arts)
    assert write(pctomb, emulator, "alice", 2, texts=[text("again-0"), text("again-1")]) == ids
    view = app(pctomb, emulator)
    assert view.fetch(ids) == {}
    assert not {m.id for m in view.query(text=text("again-0"), top_k=3)} & set(ids)
    receipt, _ = pctomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"UNVERIFIED"}  # managed: its best
    write(pctomb, emulator, "alice", 1)
    assert set(app(pctomb, emulator).fetch([ids[0]])) == {ids[0]}
