"""Qdrant local mode against real storage directories: conformance, controls, rewrite, end to end."""

from __future__ import annotations

import contextlib
import errno
import pickle
import sqlite3
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from qdrant_client import models

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.errors import StoreUnavailableError
from tombstone.lineage.db import fingerprint_bytes
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.qdrant import TombstoneQdrant, merge_filter, point_id
from tombstone_adapters.qdrant.adapter import (QdrantAdapter, carried_ids, close_local_clients, local_client,
                                               pickled_floats)

from support import FrozenClock, raising_stub

DIM = 48
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def text(seed: str, n: int = 30) -> str:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return f"{seed}: " + " ".join(rng.choice(WORDS, n))


@pytest.fixture
def qtomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"qd": {"backend": "qdrant", "path": "stores/qd",
                                                          "collection": "chunks"}})
    client = local_client(config.stores["qd"].options["path"])
    client.create_collection("chunks", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb
    close_local_clients()


def path_of(tomb) -> Path:
    return Path(tomb.config.stores["qd"].options["path"])


def app(tomb) -> TombstoneQdrant:
    return TombstoneQdrant(local_client(path_of(tomb)), "chunks", lineage=tomb.lineage, store="qd",
                           embedder=HashingEmbedder(DIM))


def write(tomb, subject: str, n: int, *, start: int = 0, texts=None, vectors=None) -> list[str]:
    ids = [f"{subject}-pt-{start + i:05d}" for i in range(n)]
    app(tomb).upsert(ids, documents=texts or [text(f"{subject}-{start + i}") for i in range(n)],
                     payloads=[{"n": start + i} for i in range(n)], vectors=vectors, subject=subject)
    return ids


def scan(directory: Path, pattern: bytes) -> list[str]:
    """Independent byte scan, no Tombstone code."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and pattern in p.read_bytes())


def stored(tomb) -> dict:
    """Every persisted point, decoded from storage.sqlite: {artifact id: (payload, raw vector)}."""
    from tombstone_adapters.qdrant.points import read_points

    points = [p for _rowid, p in read_points(path_of(tomb) / "collection" / "chunks" / "storage.sqlite")]
    return {p.payload["tombstone_id"]: (p.payload, p.vector) for p in points}


def independent_patterns(art) -> list[bytes]:
    """The artifact's traces, derived with the standard library only: its id, its point uuid, the storage
    key (base64 of the pickled uuid, protocol 4) and its vector's first values as pickle writes them."""
    import base64
    import struct

    uuid_text = point_id(art.artifact_id)
    return [
        art.artifact_id.encode(),
        uuid_text.encode(),
        base64.b64encode(pickle.dumps(uuid_text, protocol=4)),
        b"".join(b"G" + struct.pack(">d", x) for x in art.fingerprint[:8]),
    ]


def secure_delete_off(adapter: QdrantAdapter) -> None:
    # This machine's SQLite zeroes freed cells by default; the control needs upstream's default.
    adapter._storage_connection("chunks").execute("PRAGMA secure_delete=OFF")


class TestQdrantConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, qtomb):
        counter = iter(range(0, 100_000, 100))

        def write_records(subject, n):
            return [qtomb.lineage.artifact("qd", i) for i in write(qtomb, subject, n, start=next(counter))]

        def visible(ids):
            view = TombstoneQdrant(local_client(path_of(qtomb)), "chunks", lineage=None, store="qd")
            return ({p.payload["tombstone_id"] for p in view.retrieve(ids)} | set(view.all_ids())) & set(ids)

        adapter = QdrantAdapter("qd", qtomb.config.stores["qd"].options)
        secure_delete_off(adapter)
        return ConformanceEnv(adapter=adapter, write=write_records, survivors=lambda: stored(qtomb), visible=visible,
                              vendor_failure=lambda: qdrant_failure(adapter))


@contextlib.contextmanager
def qdrant_failure(adapter):
    """Local mode's storage fails (sqlite3.OperationalError) on every call the client makes; the physical
    probe reads the storage directory instead, so listing it fails too (EIO)."""
    local = adapter.client._client
    unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.path))
    with mock.patch.object(adapter.client, "_client", raising_stub(local, sqlite3.OperationalError("injected"))), \
            mock.patch.object(adapter, "physical_files", side_effect=unreadable):
        yield


def test_merge_filter_keeps_the_callers_conditions():
    caller = models.Filter(must=[models.FieldCondition(key="n", match=models.MatchValue(value=1))],
                           must_not=[models.FieldCondition(key="x", match=models.MatchValue(value=2))])
    merged = merge_filter(caller)
    assert merged.must == caller.must and len(merged.must_not) == 2
    assert caller.must_not and len(caller.must_not) == 1, "the caller's filter must not be mutated"


def test_every_read_path_hides_suppressed(qtomb):
    mine = write(qtomb, "alice", 3, texts=[text("shared words here")] * 3)
    theirs = write(qtomb, "bob", 4)
    QdrantAdapter("qd", qtomb.config.stores["qd"].options).suppress([qtomb.lineage.artifact("qd", i) for i in mine])
    view = app(qtomb)
    by_n = models.Filter(must=[models.FieldCondition(key="n", match=models.MatchAny(any=[0, 1, 2]))])
    paths = {
        "query_points": [p.payload["tombstone_id"] for p in view.query_points(query_text=text("shared words here"), limit=10)],
        "query_points+filter": [p.payload["tombstone_id"] for p in view.query_points(query_text="x", limit=10, query_filter=by_n)],
        "scroll": [p.payload["tombstone_id"] for p in view.scroll(limit=100)[0]],
        "scroll+filter": [p.payload["tombstone_id"] for p in view.scroll(scroll_filter=by_n, limit=100)[0]],
        "retrieve": [p.payload["tombstone_id"] for p in view.retrieve(mine + theirs)],
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a suppressed point"
        assert set(returned) & set(theirs), f"{name} returned no survivor: path not exercised"
    assert view.count() == 4 and view.count(by_n) == 3


@pytest.mark.parametrize("secure_delete", [False, True])
def test_delete_control_then_reclaim(qtomb, secure_delete):
    """Control: after client.delete the probe finds the point's bytes when secure_delete is off; the setting
    in force is evidence. After reclaim an independent scan finds no id, uuid or pickled vector."""
    vectors = (np.random.default_rng(1).normal(size=(4, DIM)) * 2).astype(np.float32)
    mine = write(qtomb, "alice", 4, vectors=vectors)
    write(qtomb, "bob", 6)
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    adapter = QdrantAdapter("qd", qtomb.config.stores["qd"].options)
    before = adapter.probe_physical(arts)
    assert all(r.id_found and r.content_found for r in before.values())
    assert scan(path_of(qtomb), pickled_floats(arts[0].fingerprint)), "vectors are pickled as BINFLOAT"
    assert not scan(path_of(qtomb), fingerprint_bytes(arts[0].fingerprint)), "not as raw float32"
    if not secure_delete:
        secure_delete_off(adapter)
    assert adapter.secure_delete_in_force() is secure_delete
    adapter.native_delete(arts)
    after = adapter.probe_physical(arts)
    if not secure_delete:
        assert all(not r.passed and r.id_found for r in after.values()), "control: delete() left nothing"
        leftovers = [scan(path_of(qtomb), p) for p in independent_patterns(arts[0])]
        assert any(leftovers), "an independent scan must see what the probe saw"
    receipt, _ = qtomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    reclaim = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert reclaim["secure_delete_before"] is secure_delete and reclaim["secure_delete_at_delete"] is True
    if secure_delete:  # the points' own delete zeroed them: nothing else to do
        assert reclaim["mechanism"] == "in-place" and "rewrite" not in reclaim
    else:  # an earlier delete left the bytes in free space, where no delete reaches: zeroed where they lie
        assert reclaim["mechanism"] == "in-place" and sorted(reclaim["residue_after_delete"]) == sorted(mine)
        assert list(reclaim["free_space_zeroed"]) == ["collection/chunks/storage.sqlite"]
        assert reclaim["free_space_zeroed"]["collection/chunks/storage.sqlite"]["pages_written"] >= 1
        db = path_of(qtomb) / "collection" / "chunks" / "storage.sqlite"
        assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    for art in arts:
        for pattern in independent_patterns(art):
            assert scan(path_of(qtomb), pattern) == []


def test_bytes_the_free_space_zeroing_cannot_reach_are_rewritten(qtomb, monkeypatch):
    """Where the zeroing refuses (here: told the file is in a shape it does not know), the collection is rewritten and
    VACUUMed as before, and the erasure still ends VERIFIED."""
    import tombstone_adapters.qdrant.adapter as qdrant_adapter

    mine = write(qtomb, "alice", 4)
    write(qtomb, "bob", 6)
    adapter = qtomb.adapter("qd")
    secure_delete_off(adapter)
    adapter.native_delete([qtomb.lineage.artifact("qd", i) for i in mine])
    monkeypatch.setattr(qdrant_adapter, "zero_all_free_space", lambda *a, **k: None)
    receipt, _ = qtomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    reclaim = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert reclaim["mechanism"] == "rewrite" and sorted(reclaim["residue_after_delete"]) == sorted(mine)
    assert "free_space_zeroed" not in reclaim and reclaim["vacuumed"]


def test_survivors_identical_and_queries_unchanged(qtomb):
    vectors = (np.random.default_rng(2).normal(size=(30, DIM)) * 3).astype(np.float32)
    mine = write(qtomb, "alice", 5)
    theirs = write(qtomb, "bob", 30, vectors=vectors)
    before = {k: v for k, v in stored(qtomb).items() if k in theirs}
    view = app(qtomb)
    queries = [view.query_points(v.tolist(), limit=5, query_filter=models.Filter(
        must_not=[models.HasIdCondition(has_id=[point_id(i) for i in mine])])) for v in vectors[:5]]
    q_before = [[p.payload["tombstone_id"] for p in q] for q in queries]
    receipt, _ = qtomb.erase("alice")
    assert receipt["summary"]["VERIFIED"] == 5
    assert stored(qtomb) == before, "survivors' payloads and persisted vectors must be identical"
    view = app(qtomb)
    assert [[p.payload["tombstone_id"] for p in view.query_points(v.tolist(), limit=5)] for v in vectors[:5]] == q_before


@pytest.mark.parametrize("phase", ["copy-out", "copy-back"])
def test_rewrite_killed_midway_loses_no_survivor(qtomb, phase, monkeypatch):
    mine = write(qtomb, "alice", 3)
    write(qtomb, "bob", 12)
    expected = {k: v for k, v in stored(qtomb).items() if k not in mine}
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    rewrite = {**qtomb.config.stores["qd"].options, "reclaim": "rewrite"}
    adapter = QdrantAdapter("qd", rewrite)
    real_upsert = adapter.client.upsert

    class Crash(BaseException):
        pass

    def dying(collection, points, **kw):
        target = "chunks-tombstone-rewrite" if phase == "copy-out" else "chunks"
        if collection == target:
            real_upsert(collection, points=points[: len(points) // 2], **kw)  # half landed
            raise Crash()
        return real_upsert(collection, points=points, **kw)

    monkeypatch.setattr(adapter.client, "upsert", dying)
    with pytest.raises(Crash):
        adapter.reclaim(arts)
    monkeypatch.undo()
    assert (path_of(qtomb) / ".tombstone-rewrite.json").is_file()
    fresh = QdrantAdapter("qd", rewrite)  # finishes the interrupted rewrite
    assert stored(qtomb) == expected
    fresh.reclaim(arts)
    assert stored(qtomb) == expected
    assert all(r.passed for r in fresh.probe_physical(arts).values())
    assert not fresh.client.collection_exists("chunks-tombstone-rewrite")


class _Planted:
    """A pickle that creates a file when it is unpickled: what a planted row would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant(storage: Path, marker: Path) -> None:
    conn = sqlite3.connect(storage)
    with conn:
        conn.execute("INSERT INTO points VALUES (?, ?)", ("planted", pickle.dumps(_Planted(marker))))
    conn.close()


def test_the_restricted_unpickler_reads_points_and_refuses_anything_else(tmp_path):
    from qdrant_client._pydantic_compat import construct

    from tombstone_adapters.qdrant.points import UnsafePointError, loads

    point = construct(models.PointStruct, id=point_id("a"), vector={"dense": [0.5, 0.25],
                      "sparse": models.SparseVector(indices=[1], values=[0.5])}, payload={"a": [1, "x", None, True]})
    assert loads(pickle.dumps(point)) == point
    marker = tmp_path / "ran"
    with pytest.raises(UnsafePointError, match=r"names \w+\.open, which is not part of a point"):
        loads(pickle.dumps(_Planted(marker)))
    assert not marker.exists()


def test_a_planted_pickle_is_not_run_by_erase(qtomb, tmp_path):
    import subprocess
    import sys

    write(qtomb, "alice", 2)
    close_local_clients()  # the next client loads the directory from disk, as another process would
    marker = tmp_path / "pwned"
    plant(path_of(qtomb) / "collection" / "chunks" / "storage.sqlite", marker)
    result = subprocess.run([sys.executable, "-m", "tombstone", "erase", "alice", "--config", str(qtomb.config.path)],
                            capture_output=True, text=True, timeout=120)
    assert not marker.exists(), "a stored pickle ran during the erasure"
    assert result.returncode == 2, result.stdout + result.stderr
    assert "storage.sqlite holds a row that is not a plain point" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    with pytest.raises(Exception, match="not a plain point"):  # nor by the app's client in this process
        local_client(path_of(qtomb))
    assert not marker.exists()


def test_k_nearest_visible_points_come_back_when_hidden_points_outrank_them(qtomb):
    """The first ask is the limit plus the hidden points expected among it; a query left short is asked again
    for the limit plus every hidden id: the answer is the k nearest visible points, as the raw client ranks them."""
    same = text("invoice overdue")
    mine = write(qtomb, "alice", 30, texts=[same] * 30)  # identical: they outrank everything else
    theirs = write(qtomb, "bob", 40, start=100, texts=[f"{same} {n}" for n in range(40)])
    qtomb.lineage.record_suppressions("e1", [qtomb.lineage.artifact("qd", i) for i in mine])
    view = app(qtomb)
    got = view.query_points(query_text=same, limit=5)
    raw = local_client(path_of(qtomb)).query_points("chunks", query=HashingEmbedder(DIM).embed([same])[0].tolist(),
                                                    limit=70, with_payload=True).points
    expected = [p for p in raw if p.payload["tombstone_id"] not in set(mine)][:5]
    assert len(got) == 5 and {p.payload["tombstone_id"] for p in got} <= set(theirs)
    assert [p.score for p in got] == pytest.approx([p.score for p in expected], abs=1e-6)


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(qtomb):
    ids = write(qtomb, "alice", 2)
    arts = [qtomb.lineage.artifact("qd", i) for i in ids]
    qtomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    qtomb.adapter("qd").suppress(arts)
    assert write(qtomb, "alice", 2, texts=[text("again-0"), text("again-1")]) == ids  # upsert replaces payloads
    view = app(qtomb)
    assert view.retrieve(ids) == [] and not set(view.all_ids()) & set(ids)
    assert not {p.payload["tombstone_id"] for p in view.query_points(query_text=text("again-0"), limit=3)} & set(ids)
    receipt, _ = qtomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    write(qtomb, "alice", 1)
    assert [p.payload["tombstone_id"] for p in app(qtomb).retrieve([ids[0]])] == [ids[0]]


def test_read_only_a_leftover_rewrite_marker_is_left_alone_and_nothing_changes(qtomb):
    import hashlib
    import json

    from tombstone_adapters.qdrant.adapter import MARKER

    mine = write(qtomb, "alice", 2)
    write(qtomb, "bob", 2)
    client = local_client(path_of(qtomb))
    client.create_collection("chunks-tombstone-rewrite",
                             vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    (path_of(qtomb) / MARKER).write_text(json.dumps({"collection": "chunks", "phase": "copy-back"}))
    close_local_clients()  # as another process would find it: a killed reclaim's marker and staging copy

    def tree():
        return {str(p.relative_to(path_of(qtomb).parent)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in path_of(qtomb).parent.rglob("*") if p.is_file()}

    before = tree()
    adapter = QdrantAdapter.open_read_only("qd", qtomb.config.stores["qd"].options)
    try:
        found = adapter.probe_logical([qtomb.lineage.artifact("qd", i) for i in mine])
        assert not any(r.passed for r in found.values())  # the live points are seen
    finally:
        adapter.close()
    assert tree() == before, "a read-only open changed the store (marker recovery, lock file, rewritten rows)"


def test_in_place_reclaim_deletes_with_secure_delete_and_rewrites_nothing(qtomb):
    """The erasure's own delete, with secure_delete forced on even where the connection had it off (the
    control: with it off, the same delete leaves the bytes), zeroes the points where they lie: the
    survivors' rows are not rewritten, and an independent scan finds nothing."""
    mine = write(qtomb, "alice", 4)
    theirs = write(qtomb, "bob", 8)
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    adapter = qtomb.adapter("qd")
    secure_delete_off(adapter)
    for pattern in independent_patterns(arts[0]):
        assert scan(path_of(qtomb), pattern), "the bytes are there before"
    before = {k: v for k, v in stored(qtomb).items() if k in theirs}
    db = path_of(qtomb) / "collection" / "chunks" / "storage.sqlite"
    rowids = sqlite3.connect(db).execute("SELECT rowid FROM points ORDER BY rowid").fetchall()
    receipt, _ = qtomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    reclaim = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert reclaim["mechanism"] == "in-place" and reclaim["secure_delete_before"] is False
    for art in arts:
        for pattern in independent_patterns(art):
            assert scan(path_of(qtomb), pattern) == []
    assert stored(qtomb) == before
    after = sqlite3.connect(db).execute("SELECT rowid FROM points ORDER BY rowid").fetchall()
    assert len(after) == 8 and set(after) <= set(rowids), "survivors keep their rows: nothing was rewritten"


def test_the_logical_probe_asks_the_wrapper_only_where_the_raw_search_found_the_artifact(qtomb):
    """With nothing flagged the wrapper's query is the client's same call, filtered: the probe asks it only
    the queries whose raw results held the artifact. Control: a live artifact is returned by both searches;
    while flagged, every probe vector goes through the wrapper, which returns none of them."""
    mine = write(qtomb, "alice", 3)
    write(qtomb, "bob", 30)
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    adapter = qtomb.adapter("qd")
    vectors = qtomb.lineage.probe_vectors(arts)
    for r in adapter.probe_logical(arts, vectors).values():
        assert not r.passed and r.evidence["wrapper_searches"].startswith("where the raw search")
        assert any(p.startswith("raw.top40") for p in r.evidence["returned_by"])
        assert any(p.startswith("wrapper.top40") for p in r.evidence["returned_by"]), "control: the wrapper was asked"
    adapter.suppress(arts)
    for r in adapter.probe_logical(arts, vectors).values():
        assert r.evidence["wrapper_searches"] == "every probe vector"
        assert not any(p.startswith("wrapper.") for p in r.evidence["returned_by"])
        assert any(p.startswith("raw.top40") for p in r.evidence["returned_by"])
    receipt, _ = qtomb.erase("alice")
    for entry in receipt["artifacts"]:
        logical = next(p for p in entry["evidence"]["probes"] if p["level"] == "logical")
        assert entry["status"] == "VERIFIED" and logical["detail"]["nearest_neighbours"].startswith("not searched")


def test_one_listing_gives_the_payload_ids_and_the_flagged_ids_the_filtered_reads_give(qtomb):
    """The probe reads every live point's payload id and flag in one unfiltered scroll; what it counts as
    flagged is what the filter on the flag matches (local mode's own evaluation is the reference): the flag
    set by a suppression, a list holding True, a flagged point that carries no id (named by its point id);
    not an integer 1, a string "true" or a list without True."""
    from tombstone_adapters.qdrant import SUPPRESSED
    from tombstone_adapters.qdrant.wrapper import ID_KEY

    mine = write(qtomb, "alice", 3)
    write(qtomb, "bob", 5)
    adapter = qtomb.adapter("qd")
    adapter.suppress([qtomb.lineage.artifact("qd", i) for i in mine[:2]])
    odd = {"odd-list": [False, True], "odd-int": 1, "odd-str": "true", "odd-nolist": [False, 0]}
    client = adapter.client
    client.upsert("chunks", points=[models.PointStruct(id=point_id(name), vector=list(np.ones(DIM) / DIM ** 0.5),
                                                       payload={ID_KEY: [name, name + "-also"], SUPPRESSED: flag})
                                    for name, flag in odd.items()]
                  + [models.PointStruct(id=point_id("no-id"), vector=list(np.ones(DIM) / DIM ** 0.5),
                                        payload={SUPPRESSED: True})])
    def scrolled(flag_filter=None):  # the reference: the client's own scroll, filtered by local mode itself
        out, offset = [], None
        while True:
            points, offset = client.scroll("chunks", scroll_filter=flag_filter, limit=1000, offset=offset,
                                           with_payload=True)
            out += points
            if offset is None:
                return out

    def payload_ids():
        return {i for p in scrolled() for i in carried_ids(p)}

    def flagged_ids():
        flag = models.Filter(must=[models.FieldCondition(key=SUPPRESSED, match=models.MatchValue(value=True))])
        return frozenset(i for p in scrolled(flag) for i in (carried_ids(p) or {str(p.id)}))

    ids, flagged = adapter.listing()
    assert ids == payload_ids() and flagged == flagged_ids()
    assert set(mine[:2]) | {"odd-list", "odd-list-also", str(point_id("no-id"))} == flagged  # control: not empty
    assert {"odd-int", "odd-str", "odd-nolist", mine[2]}.isdisjoint(flagged)


def test_the_logical_probe_searches_only_ids_a_live_point_still_carries(qtomb):
    """Every search the probe runs names a point by its payload id, and the probe's filtered scroll reads that
    key on every live point: an erased artifact no point carries is not searched, with the verdicts a search of
    every probe vector gives. Controls: before the erasure every artifact is searched and found; a point the
    app writes afterwards under another point id but the same payload id is searched, and found."""
    from tombstone.verify import logical

    mine = write(qtomb, "alice", 4)
    theirs = write(qtomb, "bob", 20)
    adapter = qtomb.adapter("qd")
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    survivor = qtomb.lineage.artifact("qd", theirs[0])
    vectors = qtomb.lineage.probe_vectors(arts + [survivor])
    searched: list[list[str]] = []
    real = logical.nearest_paths_many

    def counting(items, searchers, k, **kw):
        searched.append(sorted(aid for aid, _ in items))
        return real(items, searchers, k, **kw)

    with mock.patch("tombstone_adapters.qdrant.adapter.nearest_paths_many", counting):
        before = adapter.probe_logical(arts, vectors)
    assert searched == [sorted(mine)] and all(not r.passed for r in before.values())
    raw = {aid: [p for p in r.evidence["returned_by"] if p.startswith("raw.top40")] for aid, r in before.items()}
    assert all(raw.values()), "control: the raw search returns each artifact before the erasure"
    receipt, _ = qtomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    searched.clear()
    with mock.patch("tombstone_adapters.qdrant.adapter.nearest_paths_many", counting):
        after = adapter.probe_logical(arts + [survivor], vectors)
    assert searched == [[theirs[0]]], "only the survivor's probe vectors went through the searches"
    assert all(after[a].passed and after[a].evidence["nearest_neighbours"].startswith("not searched") for a in mine)
    assert all(after[a].evidence["by_filter"].startswith("not asked") for a in mine)
    # the evidence counts the vectors not searched as it counts those searched (the fingerprint and fragments)
    assert [after[a].evidence["probe_vectors"] for a in mine] == [before[a].evidence["probe_vectors"] for a in mine] \
        == [len(vectors[a]) + 1 for a in mine]
    assert not after[theirs[0]].passed and "nearest_neighbours" not in after[theirs[0]].evidence
    # the verdicts of searching every probe vector of the erased artifacts, raw and through the wrapper
    client = local_client(path_of(qtomb))
    for art in arts:
        for label, v in logical.probe_set(art.fingerprint, vectors.get(art.artifact_id, []), DIM):
            for p in client.query_points("chunks", query=logical.fit_dim(v, DIM).tolist(), limit=40,
                                         with_payload=True).points:
                assert (p.payload or {}).get("tombstone_id") != art.artifact_id
    # control: the app writes the erased text again under another point id, carrying the same payload id
    stray = next(iter(vectors[mine[0]]))
    client.upsert("chunks", [models.PointStruct(id=point_id("another-" + mine[0]), vector=np.asarray(stray).tolist(),
                                                payload={"tombstone_id": mine[0]})])
    searched.clear()
    with mock.patch("tombstone_adapters.qdrant.adapter.nearest_paths_many", counting):
        again = adapter.probe_logical(arts, vectors)
    assert searched == [[mine[0]]]
    stray_result = again[mine[0]]
    assert not stray_result.passed and "raw.scroll(where id)" in stray_result.evidence["returned_by"]
    assert "raw.scroll()" in stray_result.evidence["returned_by"]
    assert any(p.startswith("raw.top40(fragment") for p in stray_result.evidence["returned_by"])
    # a payload id held in a list still matches a filter on the id: the listing counts each string of a list
    client.upsert("chunks", [models.PointStruct(id=point_id("listed-" + mine[1]), vector=np.asarray(stray).tolist(),
                                                payload={"tombstone_id": ["other", mine[1]]})])
    listed = adapter.probe_logical(arts, vectors)[mine[1]]
    assert not listed.passed and {"raw.scroll()", "raw.scroll(where id)"} <= set(listed.evidence["returned_by"])


def commits(adapter: QdrantAdapter) -> list[str]:
    """Every COMMIT the collection's connection runs, recorded by SQLite's trace hook."""
    seen: list[str] = []
    adapter._storage_connection("chunks").set_trace_callback(
        lambda sql: seen.append(sql) if sql.strip().upper().startswith("COMMIT") else None)
    return seen


def test_the_flag_and_the_delete_of_many_points_are_one_transaction_each(qtomb):
    """Local mode commits every point it writes on its own (the control: the app's own set_payload of 6 points
    commits 6 times); the erasure's flag and delete commit once each, and what they wrote is in the file."""
    mine = write(qtomb, "alice", 6)
    write(qtomb, "bob", 3)
    adapter = qtomb.adapter("qd")
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    seen = commits(adapter)
    adapter.client.set_payload("chunks", payload={"x": 1}, points=[point_id(i) for i in mine])
    assert len(seen) == 6, "the control: one commit per point"
    seen.clear()
    adapter.suppress(arts)
    assert len(seen) == 1
    assert all(stored(qtomb)[i][0].get("tombstone_suppressed") is True for i in mine), "the flags are in the file"
    seen.clear()
    adapter.reclaim(arts)
    assert len(seen) == 1
    assert set(stored(qtomb)) == {f"bob-pt-{i:05d}" for i in range(3)}


def test_a_flag_that_fails_midway_leaves_nothing_and_the_client_reloads_from_the_file(qtomb):
    """The third point's write fails: none of the points is flagged in the file, the client that had applied
    the first two in memory is closed, and a fresh one (what the retry uses) agrees with the file; the retry
    flags them all."""
    from qdrant_client.local.persistence import CollectionPersistence

    mine = write(qtomb, "alice", 5)
    adapter = qtomb.adapter("qd")
    arts = [qtomb.lineage.artifact("qd", i) for i in mine]
    real, calls = CollectionPersistence.persist, []

    def failing(self, point):
        calls.append(point.id)
        if len(calls) == 3:
            raise sqlite3.OperationalError("injected: disk I/O error")
        return real(self, point)

    old = adapter.client
    with mock.patch.object(CollectionPersistence, "persist", failing), pytest.raises(StoreUnavailableError):
        adapter.suppress(arts)
    assert len(calls) == 3, "the control: two points were written and applied before the failure"
    assert old._client.closed is True
    assert not any(stored(qtomb)[i][0].get("tombstone_suppressed") for i in mine)
    fresh = [p.payload for p in adapter.client.retrieve("chunks", ids=[point_id(i) for i in mine])]
    assert adapter.client is not old and len(fresh) == 5
    assert not any(p.get("tombstone_suppressed") for p in fresh)
    adapter.suppress(arts)
    assert all(stored(qtomb)[i][0].get("tombstone_suppressed") is True for i in mine)


def test_pickled_floats_is_how_pickle_writes_a_list_of_floats():
    values = [0.0, -0.0, 1.5, -2.25e-310, 3.4028234663852886e38, 1 / 3, float(np.float32(0.1))]
    written = pickle.dumps(values, protocol=4)
    assert pickled_floats(values) in written
    assert pickled_floats(np.asarray(values, dtype=np.float32)) == pickled_floats(
        [float(v) for v in np.asarray(values, dtype=np.float32)])
