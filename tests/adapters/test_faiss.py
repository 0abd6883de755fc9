"""FAISS (IndexHNSWFlat in IndexIDMap2) against real index files: conformance, control, rebuild, end to end."""

from __future__ import annotations

import contextlib
import errno
import zlib
from pathlib import Path
from unittest import mock

import faiss
import numpy as np
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.lineage.db import fingerprint_bytes
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.faiss import FaissStore
from tombstone_adapters.faiss.adapter import FaissAdapter

from support import FrozenClock

DIM = 64
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def text(seed: str, n: int = 30) -> str:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return f"{seed}: " + " ".join(rng.choice(WORDS, n))


@pytest.fixture
def ftomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "faiss", "path": "stores/vec"}})
    FaissStore(config.stores["vec"].options["path"], dim=DIM, ef_search=128)
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb


def app_store(tomb) -> FaissStore:
    return FaissStore(tomb.config.stores["vec"].options["path"], lineage=tomb.lineage, store="vec",
                      embedder=HashingEmbedder(DIM))


def write(tomb, subject: str, n: int, *, start: int = 0, texts=None) -> list[str]:
    ids = [f"{subject}-vec-{start + i:05d}" for i in range(n)]
    app_store(tomb).add(ids, documents=texts or [text(f"{subject}-{start + i}") for i in range(n)],
                        metadatas=[{"n": start + i} for i in range(n)], subject=subject)
    return ids


def store_dir(tomb) -> Path:
    return Path(tomb.config.stores["vec"].options["path"])


def scan(directory: Path, pattern: bytes) -> list[str]:
    """Independent byte scan, no Tombstone code."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and pattern in p.read_bytes())


def snapshot(tomb, queries=None, k=5):
    s = FaissStore(store_dir(tomb), create=False)
    recs = s.get()
    vecs = s.vectors(list(recs))
    snap = {i: (r["document"], r["metadata"], v.tobytes()) for (i, r), v in zip(recs.items(), vecs)}
    if queries is None:
        return snap
    return snap, s.search(query_embeddings=queries, k=k)


class TestFaissConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, ftomb):
        counter = iter(range(0, 100_000, 100))

        def write_records(subject, n):
            return [ftomb.lineage.artifact("vec", i) for i in write(ftomb, subject, n, start=next(counter))]

        def visible(ids):
            s = FaissStore(store_dir(ftomb), create=False)
            found = set(s.get(ids=list(ids))) | set(s.get())
            q = s.vectors([i for i in ids if i in s.side["labels"]])
            if len(q):
                found |= {aid for row in s.search(query_embeddings=q, k=10) for aid, _ in row}
            return found & set(ids)

        adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
        return ConformanceEnv(adapter=adapter, write=write_records, survivors=lambda: snapshot(ftomb), visible=visible,
                              vendor_failure=lambda: faiss_failure(adapter))


@contextlib.contextmanager
def faiss_failure(adapter):
    """faiss fails as it does, with RuntimeError: searching, reconstructing and serialising the index; the
    physical probe lists the store directory instead, so that fails too (EIO), and so does linking a
    generation's index file (a commit that changed only the sidecar then writes the index, and fails)."""
    error = RuntimeError("injected: Error in faiss::Index: std::bad_alloc")
    index_class = type(adapter.faiss.index)
    unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.faiss.dir))
    with mock.patch.object(index_class, "search", side_effect=error), \
            mock.patch.object(index_class, "reconstruct", side_effect=error), \
            mock.patch.object(faiss, "serialize_index", side_effect=error), \
            mock.patch.object(adapter.faiss, "files", side_effect=unreadable), \
            mock.patch("os.link", side_effect=unreadable):
        yield


def test_hnsw_cannot_remove_and_native_delete_leaves_vectors(ftomb):
    """Control: remove_ids is unsupported on IndexHNSWFlat; dropping the mapping leaves the vector bytes."""
    mine = write(ftomb, "alice", 3)
    write(ftomb, "bob", 5)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    with pytest.raises(RuntimeError):
        adapter.faiss.index.remove_ids(np.array([0], dtype=np.int64))
    before = adapter.probe_physical(arts)
    assert all(r.id_found and r.content_found for r in before.values())
    adapter.native_delete(arts)
    after = adapter.probe_physical(arts)
    assert all(not r.id_found and r.content_found and not r.passed for r in after.values())
    assert scan(store_dir(ftomb), fingerprint_bytes(arts[0].fingerprint))[0].startswith("index-")
    receipt, _ = ftomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    for art in arts:
        assert scan(store_dir(ftomb), art.artifact_id.encode()) == []
        assert scan(store_dir(ftomb), fingerprint_bytes(art.fingerprint)) == []


def test_suppressed_never_returned_and_search_still_gives_k(ftomb):
    mine = write(ftomb, "alice", 10, texts=[text("shared query words")] * 10)
    theirs = write(ftomb, "bob", 20)
    FaissAdapter("vec", ftomb.config.stores["vec"].options).suppress([ftomb.lineage.artifact("vec", i) for i in mine])
    s = app_store(ftomb)
    hits = s.search(query_texts=[text("shared query words")], k=8)[0]
    assert len(hits) == 8 and not {a for a, _ in hits} & set(mine)
    assert not set(s.get(ids=mine)) and set(s.get(ids=theirs)) == set(theirs)
    assert not set(s.get(where={"n": 0})) & set(mine) and s.count() == 20
    assert s.ids() == list(s.get()) and set(s.ids()) == set(theirs)  # the listing without the records
    assert s.search(query_texts=[text("x")], k=5, where={"n": 3})[0][0][0] == theirs[3]


def test_rebuild_keeps_survivors_and_search_results(ftomb):
    mine = write(ftomb, "alice", 5)
    theirs = write(ftomb, "bob", 60)
    queries = HashingEmbedder(DIM)([text(f"bob-{i}") for i in range(8)])
    before_snap, _ = snapshot(ftomb, queries)
    receipt, _ = ftomb.erase("alice")
    after_snap, after_hits = snapshot(ftomb, queries)
    assert after_snap == {k: v for k, v in before_snap.items() if k in theirs}
    # same queries, same answers over the survivors (exact: efSearch covers the whole small graph)
    exact = FaissStore(store_dir(ftomb), create=False)
    for q, hits in zip(queries, after_hits):
        vecs = exact.vectors(theirs)
        order = np.argsort(((vecs - q) ** 2).sum(1))[:5]
        assert [a for a, _ in hits] == [theirs[i] for i in order]
    assert receipt["summary"]["VERIFIED"] == 5
    generation = FaissStore(store_dir(ftomb), create=False).generation
    assert sorted(p.name for p in store_dir(ftomb).iterdir()) == sorted(
        ["CURRENT", "heads.bin", "heads.ids", "records.jsonl", f"index-{generation:06d}.faiss",
         f"state-{generation:06d}.json"]), "old generations must be deleted"


@pytest.mark.parametrize("mode", ["rewrite", "in-place"])
def test_kill_before_switch_keeps_old_generation(ftomb, monkeypatch, mode):
    """Killed before CURRENT switches: the rewrite leaves the committed generation exactly as it was; the
    in-place recipe has already written the zeros into the committed index file (the erased records, which
    the saga suppresses first, lose their vectors; every survivor is untouched). Either way a fresh
    attempt finishes the erasure."""
    mine = write(ftomb, "alice", 2)
    write(ftomb, "bob", 10)
    before = snapshot(ftomb)
    adapter = FaissAdapter("vec", {**ftomb.config.stores["vec"].options, "reclaim": mode})
    import tombstone_adapters.faiss.commits as commits_module

    real = commits_module._write_atomic

    def dies_on_current(path, data):
        if path.name == "CURRENT":
            raise KeyboardInterrupt  # stands in for the process dying
        real(path, data)

    monkeypatch.setattr(commits_module, "_write_atomic", dies_on_current)
    with pytest.raises(KeyboardInterrupt):
        adapter.reclaim([ftomb.lineage.artifact("vec", i) for i in mine])
    monkeypatch.undo()
    after_kill = snapshot(ftomb)
    if mode == "rewrite":
        assert after_kill == before, "a killed rebuild must leave the committed generation intact"
    else:
        assert {k: v for k, v in after_kill.items() if k not in mine} == \
            {k: v for k, v in before.items() if k not in mine}
        assert all(after_kill[k][:2] == before[k][:2] and not any(after_kill[k][2]) for k in mine)
    fresh = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    fresh.reclaim([ftomb.lineage.artifact("vec", i) for i in mine])
    assert snapshot(ftomb) == {k: v for k, v in before.items() if k not in mine}


def test_not_writable_dead_letters(ftomb, monkeypatch):
    """An index that cannot be written cannot be reclaimed: the reclaim is a dead letter naming why, the
    receipt says UNVERIFIED(dlq) rather than report what the probes would find in files left as they were,
    and the wrapper still hides the records. Once the folder is writable again, `dlq retry` finishes it.
    (Tests run as root, for whom permissions do not deny writes, so the access check is simulated; the disk
    fault tests mount the folder read-only.)"""
    mine = write(ftomb, "alice", 2)
    import tombstone_adapters.faiss.adapter as mod

    real_access = mod.os.access
    monkeypatch.setattr(mod.os, "access", lambda p, m: not (m & mod.os.W_OK))
    receipt, _ = ftomb.erase("alice")
    for art in receipt["artifacts"]:
        assert art["status"] == "UNVERIFIED" and art["reason"].startswith("dlq: cannot reclaim FAISS store")
        assert "not writable" in art["reason"]
    [letter] = ftomb.lineage.dead_letters()
    assert (letter["store"], letter["step"]) == ("vec", "reclaim")
    assert not set(app_store(ftomb).get(ids=mine))
    monkeypatch.setattr(mod.os, "access", real_access)
    [(retried, _)] = ftomb.retry_dead_letters()
    assert {a["status"] for a in retried["artifacts"]} == {"VERIFIED"}
    assert not set(app_store(ftomb).get(ids=mine))


def test_id_with_quotes_is_found_in_its_json_spelling(ftomb):
    s = app_store(ftomb)
    s.add(['odd "quoted" \\id-0001'], documents=[text("odd")], subject="carol")
    art = ftomb.lineage.artifact("vec", 'odd "quoted" \\id-0001')
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    assert adapter.probe_physical([art])[art.artifact_id].id_found
    receipt, _ = ftomb.erase("carol")
    assert receipt["artifacts"][0]["status"] == "VERIFIED"



@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
def test_a_special_file_in_the_store_leaves_the_artifact_unverified_and_never_hangs(ftomb, plant):
    import json
    import os
    import subprocess
    import sys

    mine = write(ftomb, "alice", 2)
    planted = store_dir(ftomb) / "index-999999.faiss"
    if plant == "fifo":
        os.mkfifo(planted)
    else:
        planted.symlink_to("/dev/zero")
    out = ftomb.config.path.parent / "alice-receipt.json"
    result = subprocess.run([sys.executable, "-m", "tombstone", "erase", "alice", "--config", str(ftomb.config.path),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr  # written, but a person must act
    receipt = json.loads(out.read_text())
    assert {a["artifact_id"] for a in receipt["artifacts"]} == set(mine)
    for entry in receipt["artifacts"]:
        assert entry["status"] == "UNVERIFIED", entry
        assert "index-999999.faiss" in entry["reason"], entry["reason"]


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(ftomb):
    ids = write(ftomb, "alice", 2)
    arts = [ftomb.lineage.artifact("vec", i) for i in ids]
    ftomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    adapter = ftomb.adapter("vec")
    adapter.suppress(arts)
    adapter.reclaim(arts)  # the ids are gone from the index: the app may add them again before the saga ends
    assert write(ftomb, "alice", 2, texts=[text("again-0"), text("again-1")]) == ids
    store = app_store(ftomb)
    assert store.get(ids=ids) == {} and not set(store.get()) & set(ids)
    assert not {aid for aid, _ in store.search(query_texts=[text("again-0")], k=3)[0]} & set(ids)
    receipt, _ = ftomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    write(ftomb, "alice", 1, start=5)
    assert set(app_store(ftomb).get(ids=["alice-vec-00005"])) == {"alice-vec-00005"}


def test_in_place_reclaim_zeroes_the_vectors_and_compact_removes_the_slots(ftomb, tmp_path):
    """The default reclaim rewrites no graph: the erased vectors are zeroed where they lie, their ids and
    texts leave the sidecar, the slots stay (hidden) until `tombstone compact` rebuilds without them."""
    from click.testing import CliRunner

    from tombstone.cli import main

    mine = write(ftomb, "alice", 4)
    theirs = write(ftomb, "bob", 30)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    queries = HashingEmbedder(DIM)([text(f"bob-{i}") for i in range(6)] + [text(f"alice-{i}") for i in range(4)])
    for art in arts:  # the control: the bytes are there to be found before
        assert scan(store_dir(ftomb), fingerprint_bytes(art.fingerprint))
    before_snap, _ = snapshot(ftomb, queries)
    receipt, _ = ftomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    reclaim = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert reclaim["mechanism"] == "in-place" and reclaim["vectors_zeroed"] == 4
    for art in arts:  # independent byte scan: neither id nor vector bytes anywhere
        assert scan(store_dir(ftomb), art.artifact_id.encode()) == []
        assert scan(store_dir(ftomb), fingerprint_bytes(art.fingerprint)) == []
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.index.ntotal == 34 and len(store.side["zeroed"]) == 4  # the slots stay in the graph
    after_snap, hits = snapshot(ftomb, queries)
    assert after_snap == {k: v for k, v in before_snap.items() if k in theirs}
    assert all(len(row) == 5 and {a for a, _ in row} <= set(theirs) for row in hits)
    assert all(not np.any(store.hnsw.storage.reconstruct(int(label))) for label in store.side["zeroed"])
    result = CliRunner().invoke(main, ["compact", "--config", str(ftomb.config.path)], catch_exceptions=False)
    assert result.exit_code == 0 and "vec (faiss): rebuild" in result.output and "zeroed_slots_removed 4" in result.output
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.index.ntotal == 30 and store.side["zeroed"] == []
    assert snapshot(ftomb, queries)[0] == after_snap


def test_a_kill_inside_the_in_place_reclaim_is_finished_by_resume(tmp_path):
    """Killed after zeroing in memory and before the commit: the committed generation still holds the
    vectors (the store is as before), and resume zeroes them and ends VERIFIED(physical)."""
    import signal

    from tombstone.testing import crash

    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "faiss", "path": "stores/vec"}})
    FaissStore(config.stores["vec"].options["path"], dim=DIM)
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", 3)
        write(tomb, "bob", 10)
        fps = [tomb.lineage.artifact("vec", i).fingerprint for i in mine]
    directory = Path(config.stores["vec"].options["path"])
    killed = crash.cli("erase", "alice", "--config", str(config.path),
                       env={"TOMBSTONE_KILL_AT": "reclaim:faiss:zeroed-in-memory"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert all(scan(directory, fingerprint_bytes(fp)) for fp in fps)  # nothing committed yet
    resumed = crash.cli("resume", "--config", str(config.path))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "3 VERIFIED(physical)" in resumed.stdout
    assert not any(scan(directory, fingerprint_bytes(fp)) for fp in fps)
    assert len(FaissStore(directory, create=False).get()) == 10


def test_reclaim_rewrite_option_rebuilds_the_graph_on_every_erasure(ftomb):
    mine = write(ftomb, "alice", 3)
    write(ftomb, "bob", 12)
    adapter = FaissAdapter("vec", {**ftomb.config.stores["vec"].options, "reclaim": "rewrite"})
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter.suppress(arts)
    evidence = adapter.reclaim(arts)
    assert evidence["mechanism"] == "rewrite" and evidence["vectors_after"] == 12
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.index.ntotal == 12 and store.side["zeroed"] == []
    assert all(r.passed for r in adapter.probe_physical(arts).values())


def test_in_place_erasure_writes_zeros_into_the_committed_file_and_links_it(ftomb):
    """Neither the suppression nor the in-place reclaim writes the index anew: each new generation's index
    file is the same inode, the erased vectors zeroed where they lie, and the file is byte for byte what
    faiss would write for the index in memory. Control: a file whose tail does not read as the index in
    memory is not written into; the reclaim then writes the index anew."""
    from tombstone_adapters.faiss.generations import flat_codes_offset

    mine = write(ftomb, "alice", 3)
    write(ftomb, "bob", 20)
    store = FaissStore(store_dir(ftomb), create=False)
    inode = store.index_path.stat().st_ino
    assert flat_codes_offset(store.index_path, store.index) is not None
    fps = [ftomb.lineage.artifact("vec", i).fingerprint for i in mine]
    assert all(scan(store_dir(ftomb), fingerprint_bytes(fp)) for fp in fps)  # control: the bytes are there
    receipt, _ = ftomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["index_file"] == "zeroed where it lies"
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.index_path.stat().st_ino == inode and store.generation >= 3
    assert store.index_path.read_bytes() == faiss.serialize_index(store.index).tobytes()
    assert not any(scan(store_dir(ftomb), fingerprint_bytes(fp)) for fp in fps)
    # control: a file that does not read as the index in memory is never written into
    earlier = store_dir(ftomb).parent / "earlier.faiss"
    earlier.write_bytes(store.index_path.read_bytes())
    theirs = write(ftomb, "carol", 2)
    store = FaissStore(store_dir(ftomb), create=False)
    assert flat_codes_offset(earlier, store.index) is None  # another generation: other counts
    flipped = store_dir(ftomb).parent / "flipped.faiss"
    data = bytearray(store.index_path.read_bytes())
    data[flat_codes_offset(store.index_path, store.index) + 1] ^= 0xFF  # a byte of the first vector
    flipped.write_bytes(bytes(data))
    assert flat_codes_offset(flipped, store.index) is None
    import tombstone_adapters.faiss.erasing as erasing_module

    with mock.patch.object(erasing_module, "flat_codes_offset", return_value=None):
        receipt, _ = ftomb.erase("carol")
    assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["index_file"] == "written anew"
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.index_path.read_bytes() == faiss.serialize_index(store.index).tobytes()
    assert not set(theirs) & set(store.get())


def test_an_opened_store_maps_its_vectors_and_the_in_place_zeros_reach_every_reader(ftomb):
    """Opening a store maps its vectors from the index file instead of reading them in, so the in-place
    reclaim's zeros, written into the file, are what a process that opened the store before the erasure sees:
    it keeps no copy of the erased vectors. Control: a process that took the vectors into its own memory
    (``FaissStore.index``, as a caller that changes the index does) still holds them until it reloads. An
    app's next write through the mapped reader reads the vectors in and commits as before; a zeroing that
    cannot go through the file zeroes the vectors in memory and writes the index anew."""
    import tombstone_adapters.faiss.erasing as erasing_module

    mine = write(ftomb, "alice", 3)
    write(ftomb, "bob", 20)
    reader, owner = FaissStore(store_dir(ftomb), create=False), FaissStore(store_dir(ftomb), create=False)
    assert reader._mapped and owner._mapped
    owner.index  # its vectors read into its own memory
    assert not owner._mapped
    labels = [reader.side["labels"][i] for i in mine]
    before = np.stack([reader._index.reconstruct(label) for label in labels])
    assert np.abs(before).sum(axis=1).min() > 0  # control: the vectors are there
    receipt, _ = ftomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["index_file"] == "zeroed where it lies"
    assert not np.any([reader._index.reconstruct(label) for label in labels]), "the mapping shows the zeros"
    assert np.array_equal(np.stack([owner._index.reconstruct(label) for label in labels]), before), \
        "control: a copy in a process's own memory keeps them until it reloads"
    theirs = write(ftomb, "carol", 2)
    reader.add(["dave-0"], documents=[text("dave")], embeddings=np.ones((1, DIM), np.float32))
    assert not reader._mapped and reader.ntotal == 26
    assert sorted(reader.get(ids=["dave-0", *theirs, *mine])) == sorted(["dave-0", *theirs])
    reopened = FaissStore(store_dir(ftomb), create=False)
    assert reopened._mapped and reopened.search(query_embeddings=np.ones((1, DIM)), k=1)[0][0][0] == "dave-0"
    with mock.patch.object(erasing_module, "_zero_slots", return_value=False):
        receipt, _ = ftomb.erase("carol")
    assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["index_file"] == "written anew"
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    fps = [ftomb.lineage.artifact("vec", i).fingerprint for i in theirs]
    assert not any(scan(store_dir(ftomb), fingerprint_bytes(fp)) for fp in fps)


def test_a_store_read_into_memory_is_zeroed_there_and_in_the_file(ftomb, monkeypatch):
    """Where faiss cannot map the vectors (a faiss before 1.11, a file system without mmap) the store reads
    them in; the in-place reclaim then zeroes them in memory and in the file where they lie, and the file is
    what faiss would write for the index in memory. Control: the bytes are there before the erasure."""
    import tombstone_adapters.faiss.store as store_module

    monkeypatch.delattr(store_module.faiss, "IO_FLAG_MMAP_IFC")
    mine = write(ftomb, "alice", 3)
    write(ftomb, "bob", 12)
    store = FaissStore(store_dir(ftomb), create=False)
    assert not store._mapped
    fps = [ftomb.lineage.artifact("vec", i).fingerprint for i in mine]
    assert all(scan(store_dir(ftomb), fingerprint_bytes(fp)) for fp in fps)  # control
    receipt, _ = ftomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["index_file"] == "zeroed where it lies"
    assert not any(scan(store_dir(ftomb), fingerprint_bytes(fp)) for fp in fps)
    adapter_store = ftomb.adapter("vec").faiss
    assert not adapter_store._mapped
    assert adapter_store.index_path.read_bytes() == faiss.serialize_index(adapter_store._index).tobytes()


def test_logical_probe_searches_only_ids_the_map_still_holds_and_agrees_with_a_full_search(ftomb):
    """Both FAISS searches name their results through the id map, so an id the map no longer holds cannot be
    returned by any search: its probe vectors are not searched. The verdicts equal those of searching every
    probe vector; the control: a suppressed (still mapped) artifact is searched, and the raw index returns it."""
    from tombstone.verify import logical

    mine = write(ftomb, "alice", 6)
    theirs = write(ftomb, "bob", 30)
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter.suppress(arts)
    searched: list[int] = []
    real = logical.nearest_paths_many

    def counting(items, searchers, k, **kw):
        searched.append(len(items))
        return real(items, searchers, k, **kw)

    with mock.patch("tombstone_adapters.faiss.adapter.nearest_paths_many", counting):
        before = adapter.probe_logical(arts)
    assert searched == [6]  # suppressed, not reclaimed: still mapped, so searched
    assert all(not r.passed and any(p.startswith("raw.top") for p in r.evidence["returned_by"])
               for r in before.values())
    adapter.reclaim(arts)
    searched.clear()
    with mock.patch("tombstone_adapters.faiss.adapter.nearest_paths_many", counting):
        after = adapter.probe_logical(arts + [ftomb.lineage.artifact("vec", theirs[0])])
    assert searched == [1]  # only the survivor's probe vectors went through the searches
    assert all(after[a].passed and "not searched" in after[a].evidence["nearest_neighbours"] for a in mine)
    survivor = after[theirs[0]]
    assert not survivor.passed and "nearest_neighbours" not in survivor.evidence
    # the same verdicts from searching every probe vector of the erased artifacts
    store, dim = adapter.faiss, adapter.faiss.index.d
    queries = [(a.artifact_id, [(label, logical.fit_dim(v, dim)) for label, v in
                                logical.probe_set(a.fingerprint, [], dim)]) for a in arts]
    id_of = store._id_of()
    full = real(queries, {"raw": lambda v, k: ([[id_of.get(x) for x in row if x >= 0]
                                                  for row in store.raw_search(v, k)[1].tolist()], []),
                          "wrapper": lambda v, k: ([[i for i, _ in row] for row in store.search(query_embeddings=v, k=k)],
                                                   [])}, 10)
    assert all(not any(paths.values()) for paths in full.values()) and len(full) == 6


def test_the_logical_probe_reads_probe_vectors_only_for_ids_the_map_still_holds(ftomb):
    """The verify step hands the probe its artifacts' probe vectors as a mapping read on first use. While the
    map holds the ids (suppressed, not reclaimed) they are read and searched; once it does not, none is read,
    and the evidence still counts them (the lineage db's index, not the vectors)."""
    from tombstone.verify.logical import ProbeVectors

    mine = write(ftomb, "alice", 4)
    write(ftomb, "bob", 10)
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    counts = ftomb.lineage.probe_counts(arts)
    assert all(n > 0 for n in counts.values())  # the hashing embedder's fragments were captured
    reads: list[int] = []

    def read(records):
        reads.append(len(records))
        return ftomb.lineage.probe_vectors(records)

    adapter.suppress(arts)
    before = adapter.probe_logical(arts, ProbeVectors(read, arts, ftomb.lineage.probe_counts))
    assert reads == [4]  # control: still mapped, so read (once for all) and searched
    assert all(not r.passed for r in before.values())
    assert {a: r.evidence["probe_vectors"] for a, r in before.items()} == {a: n + 1 for a, n in counts.items()}
    adapter.reclaim(arts)
    reads.clear()
    after = adapter.probe_logical(arts, ProbeVectors(read, arts, ftomb.lineage.probe_counts))
    assert reads == [] and all(r.passed for r in after.values())
    assert {a: r.evidence["probe_vectors"] for a, r in after.items()} == {a: n + 1 for a, n in counts.items()}


def test_suppress_and_in_place_reclaim_write_what_changed_not_every_record(ftomb):
    """The records file is appended to and blanked where its lines lie: a suppression leaves it byte for byte
    as it was (only a small state file is written); the in-place reclaim overwrites the erased records' lines
    with spaces and nothing else. Control: before the reclaim a plain byte scan finds their texts there."""
    mine = write(ftomb, "alice", 3)
    theirs = write(ftomb, "bob", 20)
    records = store_dir(ftomb) / "records.jsonl"
    before = records.read_bytes()
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter.suppress(arts)
    assert records.read_bytes() == before
    state = FaissStore(store_dir(ftomb), create=False).state_path
    assert state.stat().st_size < 300
    texts = [FaissStore(store_dir(ftomb), create=False).side["records"][i]["document"].encode() for i in mine]
    assert all(t in before for t in texts) and all(i.encode() in before for i in mine)  # control
    adapter.reclaim(arts)
    after = records.read_bytes()
    assert len(after) == len(before)
    changed = [k for k in range(len(before)) if before[k] != after[k]]
    assert changed and all(after[k] == 0x20 for k in changed)  # only spaces written
    assert not any(t in after for t in texts) and not any(i.encode() in after for i in mine)
    assert set(FaissStore(store_dir(ftomb), create=False).get()) == set(theirs)


def test_a_crash_after_the_switch_leaves_lines_to_blank_which_scan_names_and_the_next_erasure_blanks(ftomb, monkeypatch):
    """The generation that dropped the records names their lines; a process that dies before blanking them
    leaves them readable in the file (no id maps to them: hidden everywhere). `tombstone scan` names them;
    the physical probe finds them (RESIDUAL, never VERIFIED by omission); the next reclaim blanks them."""
    from tombstone_adapters.faiss.store import FaissStore as Store

    mine = write(ftomb, "alice", 2)
    write(ftomb, "bob", 10)
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter.suppress(arts)
    monkeypatch.setattr(Store, "_blank", lambda self, labels: None)  # dies right after the switch
    adapter.reclaim(arts)
    monkeypatch.undo()
    records = (store_dir(ftomb) / "records.jsonl").read_bytes()
    assert all(i.encode() in records for i in mine)
    fresh = FaissStore(store_dir(ftomb), create=False)
    assert not set(mine) & set(fresh.get()) and len(fresh.get()) == 10
    report = FaissAdapter.scan_deleted("vec", ftomb.config.stores["vec"].options)
    place = next(p for p in report.places if p.kind.startswith("dropped records' lines"))
    assert place.count == 2 and place.bytes > 0 and report.recoverable
    heads = next(p for p in report.places if p.kind.startswith("dropped records' ids"))
    assert heads.place == "heads.ids" and heads.count == 2 and heads.bytes == sum(len(i) for i in mine)
    probe = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    assert not any(r.passed for r in probe.probe_physical(arts).values())
    probe.reclaim(arts)
    assert all(r.passed for r in probe.probe_physical(arts).values())
    assert not any(i.encode() in (store_dir(ftomb) / "records.jsonl").read_bytes() for i in mine)
    assert not any(i.encode() in (store_dir(ftomb) / "heads.ids").read_bytes() for i in mine)
    report = FaissAdapter.scan_deleted("vec", ftomb.config.stores["vec"].options)
    assert not any(p.count for p in report.places if p.kind.startswith("dropped records"))


def test_a_commit_killed_before_the_switch_leaves_a_tail_the_next_write_cuts_off(ftomb, monkeypatch):
    write(ftomb, "bob", 5)
    import tombstone_adapters.faiss.commits as commits_module

    real = commits_module._write_atomic

    def dies_on_current(path, data):
        if path.name == "CURRENT":
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(commits_module, "_write_atomic", dies_on_current)
    with pytest.raises(KeyboardInterrupt):
        write(ftomb, "carol", 2, texts=["carol's unfinished write"] * 2)
    monkeypatch.undo()
    records = store_dir(ftomb) / "records.jsonl"
    assert b"carol's unfinished write" in records.read_bytes()  # past the committed length
    assert len(FaissStore(store_dir(ftomb), create=False).get()) == 5
    report = FaissAdapter.scan_deleted("vec", ftomb.config.stores["vec"].options)
    assert next(p for p in report.places if p.kind == "bytes past the committed length").bytes > 0
    assert next(p for p in report.places if p.kind == "heads past the committed length").bytes > 0
    assert b"carol-vec" in (store_dir(ftomb) / "heads.ids").read_bytes()
    write(ftomb, "dave", 1, start=50)
    assert b"carol's unfinished write" not in records.read_bytes()
    assert b"carol-vec" not in (store_dir(ftomb) / "heads.ids").read_bytes()
    assert len(FaissStore(store_dir(ftomb), create=False).get()) == 6


def test_a_store_with_a_json_sidecar_is_read_and_written_in_the_records_layout(ftomb):
    """A store persisted as ``sidecar-<N>.json`` (every record in one document) opens as it was; its next
    commit writes the records file and state, and the sidecar goes."""
    import json as _json

    ids = write(ftomb, "bob", 6)
    store = FaissStore(store_dir(ftomb), create=False)
    legacy = {k: store.side[k] for k in ("next_label", "excluded", "zeroed")}
    legacy["labels"] = dict(store.side["labels"])
    legacy["records"] = dict(store.side["records"])  # every record read from its line
    (store_dir(ftomb) / f"sidecar-{store.generation:06d}.json").write_text(_json.dumps(legacy))
    store.state_path.unlink()
    (store_dir(ftomb) / "records.jsonl").unlink()
    old = FaissStore(store_dir(ftomb), create=False)
    assert set(old.get()) == set(ids)
    more = write(ftomb, "carol", 2, start=10)
    files = sorted(p.name for p in store_dir(ftomb).iterdir())
    assert not [f for f in files if f.startswith("sidecar-")] and "records.jsonl" in files
    assert set(FaissStore(store_dir(ftomb), create=False).get()) == set(ids) | set(more)


def test_a_commit_from_an_older_generation_writes_nothing(ftomb):
    """Every writer refreshes under the lock before it commits; a commit that skipped that (a store object
    left behind by another process's commit) refuses, rather than cut the records file back past the lines
    the newer generation holds."""
    from tombstone.errors import StoreUnavailableError

    write(ftomb, "bob", 3)
    stale = FaissStore(store_dir(ftomb), create=False)
    write(ftomb, "carol", 2, start=10)
    records = (store_dir(ftomb) / "records.jsonl").read_bytes()
    with pytest.raises(StoreUnavailableError, match="moved to generation"):
        stale.commit(index_changed=False)
    assert (store_dir(ftomb) / "records.jsonl").read_bytes() == records
    assert len(FaissStore(store_dir(ftomb), create=False).get()) == 5


@pytest.mark.parametrize("hidden", [4, 12])
def test_a_search_left_short_by_hidden_ids_is_searched_again_and_the_others_are_not(ftomb, hidden):
    """While ids are suppressed in the lineage db (the store not yet touched), the index's own search runs for
    every query, asking for k plus twice the hidden ids expected among them and four more; only a query left
    with fewer than k visible ids is searched again past them (with the exclusion selector): none where 4 ids
    near the first query are hidden (k = 6 asks 12), that query where 12 are (6 asks 14). Every row equals
    the first k visible ids of a wide raw search. Control: the raw top k of the first query holds the hidden
    ids."""
    mine = write(ftomb, "alice", hidden, texts=[text("shared query words")] * hidden)
    theirs = write(ftomb, "bob", 30)
    ftomb.lineage.record_suppressions("e1", [ftomb.lineage.artifact("vec", i) for i in mine])
    store = app_store(ftomb)
    queries = HashingEmbedder(DIM)([text("shared query words"), text("bob-17")])
    id_of = {label: i for i, label in store.side["labels"].items()}
    _, wide = store.raw_search(queries, len(mine) + len(theirs))
    wide = [[id_of[label] for label in row if label >= 0] for row in wide.tolist()]
    assert set(mine[:4]) <= set(wide[0][:6]), "control: the raw top 6 holds hidden ids"
    assert not set(mine) & set(wide[1][:6]), "control: the second query's raw top 6 holds none"
    searched = []
    search = store.index.search

    def counting(x, k, params=None, **kwargs):
        searched.append((len(x), k, params is not None))
        return search(x, k, params=params, **kwargs)

    with mock.patch.object(store.index, "search", side_effect=counting):
        got = store.search(query_embeddings=queries, k=6)
    if hidden == 4:
        assert searched == [(2, 12, False)], "no query was left short: none is searched again"
    else:
        assert searched[0] == (2, 14, False) and [(n, p) for n, _, p in searched[1:]] == [(1, True)], \
            "only the query left short is searched again"
    for row, wide_row in zip(got, wide):
        assert [aid for aid, _ in row] == [i for i in wide_row if i not in mine][:6]


def test_opening_parses_ids_and_labels_and_reads_a_record_when_asked(ftomb, tmp_path):
    """Opening a store parses each line's id and label only; a record's document and metadata are read from
    its line the first time they are asked for, and equal what was written, whatever the id and document
    hold (quotes, the key names themselves, non-ASCII). A line blanked after the load (by a newer
    generation) is a record gone, not an error. A line in another key order is parsed whole, and so is every
    line when one cannot be cut where this writer's lines are."""
    import json as _json

    from tombstone_adapters.faiss.store import read_generation

    odd = ['q"uote\\d, "document": x', "zoë-ß", 'k", "label": 5']
    docs = ['text with , "document": inside', "ünïcode ✓", ""]
    metas = [{"n": 1, "nested": {"a": [1, 2]}}, {}, {"s": '", "label": 9'}]
    app_store(ftomb).add(odd, documents=docs, metadatas=metas, subject="odd")
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.side["records"]._held == {}, "opening read no document"
    got = store.get(ids=odd)
    assert [got[i]["document"] for i in odd] == docs and [got[i]["metadata"] for i in odd] == metas
    assert set(store.side["records"]._held) == set(odd)
    # a newer generation blanked one line after this store read its own: that record is gone, no error
    other = FaissStore(store_dir(ftomb), create=False)
    offset, length = other._lines.place(other.side["labels"][odd[1]])
    with open(store_dir(ftomb) / "records.jsonl", "r+b") as fh:
        fh.seek(offset)
        fh.write(b" " * length)
    assert odd[1] not in other.get(ids=[odd[1]]) and other.get(ids=[odd[0]])[odd[0]]["document"] == docs[0]
    # a line whose keys come in another order is parsed whole
    root = tmp_path / "handmade"
    root.mkdir()
    lines = (_json.dumps({"label": 0, "metadata": {"m": 1}, "document": "d0", "id": "a"}) + "\n"
             + _json.dumps({"id": "b", "label": 1, "document": "d1", "metadata": {}}) + "\n"
             + _json.dumps({"document": "d2", "metadata": {"x": 1, "document": 2}, "id": "c", "label": 2})
             + "\n").encode()
    (root / "records.jsonl").write_bytes(lines)
    (root / "state-000001.json").write_text(_json.dumps({"next_label": 3, "excluded": [], "zeroed": [],
                                                          "records_length": len(lines), "dead": []}))
    side, _, _ = read_generation(root, 1)
    assert side["labels"] == {"a": 0, "b": 1, "c": 2}
    assert dict(side["records"]) == {"a": {"document": "d0", "metadata": {"m": 1}},
                                     "b": {"document": "d1", "metadata": {}},
                                     "c": {"document": "d2", "metadata": {"x": 1, "document": 2}}}


def test_a_listing_reads_the_records_lines_in_one_pass_and_equals_reading_each(ftomb):
    """``get()`` over many records reads their lines in one pass over the records file (not one read per
    record); what it returns equals reading each line on its own. Control: before the listing no document
    was read."""
    from tombstone_adapters.faiss import store as store_module

    ids = write(ftomb, "bob", 300)
    one_by_one = FaissStore(store_dir(ftomb), create=False)
    each = {i: one_by_one.get(ids=[i])[i] for i in ids}
    store = FaissStore(store_dir(ftomb), create=False)
    assert store.side["records"]._held == {}
    opened = []
    real_open = open

    def counting(path, *args, **kwargs):
        if str(path).endswith("records.jsonl"):
            opened.append(path)
        return real_open(path, *args, **kwargs)

    one_line = mock.patch.object(store_module.LazyRecords, "_read", side_effect=AssertionError("a read per line"))
    from tombstone_adapters.faiss import records as records_module

    with mock.patch.object(records_module, "open", counting, create=True), one_line:
        listing = store.get()
        by_where = store.get(where={"n": 7})
    assert listing == each and list(by_where) == ["bob-vec-00007"]
    assert len(opened) == 1, "one read of the records file for the listing, none for the where after it"
    fresh = FaissStore(store_dir(ftomb), create=False)
    with mock.patch.object(store_module.LazyRecords, "_read", wraps=fresh.side["records"]._read) as per_line:
        assert fresh.get(ids=ids[:3]) == {i: each[i] for i in ids[:3]}
    assert per_line.call_count == 3  # control: a few records are read line by line


def _lines_and_labels(root: Path, generation: int, monkeypatch=None):
    """What ``read_generation`` makes of a generation: id -> label, each known line's (label, offset, length),
    the lines to blank, and whether the heads files were read."""
    from tombstone_adapters.faiss.store import read_generation

    side, lines, to_blank = read_generation(root, generation)
    labels, offsets, lengths = lines.known()
    return (side["labels"], sorted(zip(labels.tolist(), offsets.tolist(), lengths.tolist())), to_blank,
            side["heads"] is not None)


def _without_heads(root: Path, generation: int) -> None:
    """The state as a store written before the heads files has it (the files themselves left in place)."""
    import json as _json

    state = root / f"state-{generation:06d}.json"
    data = _json.loads(state.read_text())
    data.pop("heads")
    state.write_text(_json.dumps(data))


def test_opening_reads_ids_and_labels_from_the_heads_files_which_agree_with_the_records_file(ftomb, tmp_path):
    """A store keeps its lines' ids, labels and places in the heads files beside the records file, so opening
    it parses no line; what they say equals what parsing the records file says, whatever the ids hold. The
    in-place reclaim zeros the erased rows and spaces their ids where they lie (the files keep their size).
    Control: before the reclaim a plain byte scan finds the erased ids in heads.ids."""
    import shutil

    from tombstone_adapters.faiss import generations as generations_module

    odd = ['q"uote\\d, "document": x', "zoë-ß", 'k", "label": 5']
    app_store(ftomb).add(odd, documents=["a", "b", "c"], subject="odd")
    mine = write(ftomb, "alice", 3)
    theirs = write(ftomb, "bob", 12)
    root = store_dir(ftomb)
    heads_ids = root / "heads.ids"
    assert all(i.encode() in heads_ids.read_bytes() for i in mine + odd)  # control
    with mock.patch.object(generations_module, "_parse_lines", side_effect=AssertionError("parsed the records")):
        opened = FaissStore(root, create=False)
        assert set(opened.get()) == set(odd + mine + theirs)
    generation = opened.generation
    copy = tmp_path / "parsed"
    shutil.copytree(root, copy)
    _without_heads(copy, generation)
    by_heads, by_parse = _lines_and_labels(root, generation), _lines_and_labels(copy, generation)
    assert by_heads[3] and not by_parse[3]
    assert by_heads[:3] == by_parse[:3]
    sizes = {p.name: p.stat().st_size for p in root.iterdir() if p.name.startswith("heads.")}

    def crcs_held() -> set[int]:
        rows = np.fromfile(root / "heads.bin", "<i8").reshape(-1, 6)[1:]
        return set(rows[:, 3].tolist()) & {zlib.crc32(i.encode()) for i in mine}

    assert len(crcs_held()) == len(mine)  # control: each erased id's row holds its CRC
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    adapter.suppress(arts)
    adapter.reclaim(arts)
    assert {p.name: p.stat().st_size for p in root.iterdir() if p.name.startswith("heads.")} == sizes
    assert not crcs_held(), "an erased row keeps no CRC of its id"
    assert scan(root, mine[0].encode()) == [] and all(r.passed for r in adapter.probe_physical(arts).values())
    after = FaissStore(root, create=False)
    assert after.side["heads"] is not None and set(after.get()) == set(odd + theirs)
    shutil.rmtree(copy)
    shutil.copytree(root, copy)
    _without_heads(copy, after.generation)
    assert _lines_and_labels(root, after.generation)[:3] == _lines_and_labels(copy, after.generation)[:3]


def test_a_store_without_heads_is_parsed_and_its_next_commit_writes_them(ftomb):
    """A store whose state names no heads (written before them) opens by parsing the records file; its next
    commit writes the heads anew for every line, the lines still to blank included, and from then on they are
    read. Heads that do not agree with their state (another token, cut short) are not read: the records file
    is parsed, and the result is the same."""
    import json as _json

    from tombstone_adapters.faiss.store import FaissStore as Store

    mine = write(ftomb, "alice", 2)
    theirs = write(ftomb, "bob", 8)
    root = store_dir(ftomb)
    generation = FaissStore(root, create=False).generation
    expected = _lines_and_labels(root, generation)
    _without_heads(root, generation)
    (root / "heads.bin").unlink()
    (root / "heads.ids").write_bytes(b"")
    assert _lines_and_labels(root, generation)[:3] == expected[:3] and not _lines_and_labels(root, generation)[3]
    # the next commit drops alice and dies before blanking her lines: her lines are still to blank
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    arts = [ftomb.lineage.artifact("vec", i) for i in mine]
    with mock.patch.object(Store, "_blank", lambda self, labels: None):
        adapter.faiss.drop_mapping(mine)
    generation = FaissStore(root, create=False).generation
    labels, lines, to_blank, read_heads = _lines_and_labels(root, generation)
    assert read_heads and set(labels) == set(theirs) and sorted(to_blank.values()) == sorted(mine)
    assert len(lines) == 10 and all(i.encode() in (root / "heads.ids").read_bytes() for i in mine)
    adapter = FaissAdapter("vec", ftomb.config.stores["vec"].options)
    adapter.reclaim(arts)
    assert not any(i.encode() in (root / "heads.ids").read_bytes() for i in mine)
    assert all(r.passed for r in adapter.probe_physical(arts).values())
    generation = FaissStore(root, create=False).generation
    good = _lines_and_labels(root, generation)
    assert good[3] and set(good[0]) == set(theirs)
    state = root / f"state-{generation:06d}.json"
    data = _json.loads(state.read_text())
    for heads in ([data["heads"][0] + 1, *data["heads"][1:]], [data["heads"][0], data["heads"][1] + 1,
                                                                data["heads"][2]]):
        state.write_text(_json.dumps({**data, "heads": heads}))
        assert _lines_and_labels(root, generation) == (*good[:3], False)


def test_an_id_holding_a_newline_leaves_the_store_without_heads(ftomb):
    """The ids file holds one id per line, so an id with a newline in it cannot go there: the store then keeps
    no heads files (none left behind), is read by parsing the records file, and works as before."""
    ids = write(ftomb, "bob", 4)
    root = store_dir(ftomb)
    assert (root / "heads.ids").exists()
    app_store(ftomb).add(["two\nlines"], documents=["d"], subject="odd")
    store = FaissStore(root, create=False)
    assert store.side["heads"] is None and not (root / "heads.ids").exists() and not (root / "heads.bin").exists()
    assert set(store.get()) == set(ids) | {"two\nlines"}


@pytest.mark.parametrize("colliding", [False, True])
def test_the_id_to_label_map_read_from_the_heads_acts_as_a_dict(colliding, monkeypatch):
    """The id -> label map a store opens with (ids, labels and CRCs as the heads files give them, no dict of
    every id) answers every mapping operation as a dict with the same history does: lookups, sets, deletes,
    iteration, length, the label array and the filtered listing, before and after it makes its dict. With
    every CRC equal (each lookup meets only collisions) the ids themselves decide; so do they where many ids are
    found at once (``look_up``)."""
    import random
    import zlib as _zlib

    from tombstone_adapters.faiss import labels as labels_module
    from tombstone_adapters.faiss.labels import IdLabels, id_label_pairs, label_array

    ids = [f"id-{k:04d}" for k in range(400)] + ["zoë", 'q"uote']
    labels = np.arange(1000, 1000 + len(ids), dtype=np.int64)
    crcs = (np.full(len(ids), 7, np.int64) if colliding
            else np.array([_zlib.crc32(i.encode()) for i in ids], np.int64))
    if colliding:
        monkeypatch.setattr(labels_module, "_crc", lambda _id: 7)
    mapping, twin = IdLabels(list(ids), labels, crcs), dict(zip(ids, labels.tolist()))
    rng = random.Random(5)
    for step in range(600):
        if step == 400:  # from here on every lookup goes to the dict it makes
            monkeypatch.setattr(labels_module, "_LOOKUPS_BEFORE_DICT", 0)
            mapping["trigger"] = twin["trigger"] = 1
        key = rng.choice(ids + [f"new-{k}" for k in range(20)])
        op = rng.randrange(5)
        if op == 4:  # many found at once, by one sorted search: each then answers as the dict does
            some = rng.sample(ids + [f"new-{k}" for k in range(20)], 30)
            mapping.look_up(some)
            assert [mapping.get(k) for k in some] == [twin.get(k) for k in some]
        elif op == 0:
            assert mapping.get(key) == twin.get(key) and (key in mapping) == (key in twin)
        elif op == 1:
            mapping[key] = twin[key] = step
        elif op == 2:
            assert mapping.pop(key, None) == twin.pop(key, None)
        else:
            hidden = set(rng.sample(sorted(twin.values()), 5))
            assert sorted(mapping.shown(hidden)) == sorted(i for i, label in twin.items() if label not in hidden)
        assert len(mapping) == len(twin) and sorted(mapping) == sorted(twin)
        assert sorted(label_array(mapping).tolist()) == sorted(twin.values())
        pair_ids, pair_labels = id_label_pairs(mapping)
        assert dict(zip(pair_ids, pair_labels.tolist())) == twin
    assert mapping == twin and dict(mapping.items()) == twin
