"""Probe captures lost with the process that queued them (``tombstone.capture.pending``).

A writer process writes the corpus through the real Chroma or FAISS wrapper in background capture mode and is
killed (SIGKILL, from the kill point ``probes:before-record`` its queue's worker reaches once the fragments are
embedded and before they are recorded): its chunks have lineage rows and no fragment probes. The next wrapper
opened on the store with its embedder finishes the capture from the text the store holds; an erasure before
that says, on the receipt, that the probes are incomplete, and does not measure the semantic level.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder, deferred
from tombstone.capture.fragments import probe_queries
from tombstone.testing.echoes import corpus
from tombstone.verify import semantic

DOCS = corpus(120, topics=4)
TARGET = 7
"""The erased document (``doc-007``, owned by ``subject-007``): an ordinary deletion in this corpus."""
LEVELS = ("logical", "physical", "semantic", "model")

WRITER = textwrap.dedent("""
    import os, sys
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone.testing.echoes import corpus

    config, backend, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
    docs = corpus(120, topics=4)
    ids = [f"doc-{i:03d}" for i in range(len(docs))]
    subjects = [f"subject-{i:03d}" for i in range(len(docs))]
    tomb = Tombstone.open(config)
    path = tomb.config.stores["vectors"].options["path"]
    embedder = HashingEmbedder(384)
    if backend == "chroma":
        import chromadb
        from tombstone_adapters.chroma.wrapper import TombstoneCollection

        col = chromadb.PersistentClient(path=path).create_collection(
            "chunks", metadata={"hnsw:space": "cosine"}, embedding_function=None)
        store = TombstoneCollection(col, lineage=tomb.lineage, store="vectors", embedder=embedder)
        store.add(ids=ids, documents=[d.text for d in docs], subject=subjects)  # one write, one queued job
    else:
        from tombstone_adapters.faiss import FaissStore

        store = FaissStore(path, dim=384, ef_search=128, lineage=tomb.lineage, store="vectors", embedder=embedder)
        os.environ["TOMBSTONE_PROBE_CAPTURE"] = "inline"  # the others' probes land with their writes
        for i, doc in enumerate(docs):
            if i != target:
                store.add([ids[i]], documents=[doc.text], subject=subjects[i])
        os.environ["TOMBSTONE_PROBE_CAPTURE"] = "background"
        store.add([ids[target]], documents=[docs[target].text], subject=subjects[target])
    # the queue's worker reaches the kill point (leaving waits for it at exit) and the process dies there
""")


def doc_id(i: int) -> str:
    return f"doc-{i:03d}"


def deployment(root, backend: str):
    options = {"backend": backend, "path": "stores/vectors"}
    if backend == "chroma":
        options["collection"] = "chunks"
    return init_deployment(root, {"vectors": options}, levels=LEVELS)


def killed_writer(root, backend: str):
    """A deployment whose writer was killed before its queued probe capture was recorded."""
    config = deployment(root, backend)
    env = {**os.environ, "TOMBSTONE_KILL_AT": "probes:before-record"}
    env.pop(deferred.MODE_ENV, None)
    proc = subprocess.run([sys.executable, "-c", WRITER, str(config.path), backend, str(TARGET)], env=env,
                          capture_output=True, text=True, timeout=300)
    # the control: the process was killed (its probes' job is queued only once the store write returned, so
    # the store holds every record; whether the print came first is up to the threads)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return config


def counts(config) -> dict[str, int]:
    db = sqlite3.connect(config.lineage_db)
    try:
        return {"artifacts": db.execute("SELECT count(*) FROM artifacts").fetchone()[0],
                "pending": db.execute("SELECT count(*) FROM probe_captures").fetchone()[0],
                "target_probes": db.execute("SELECT count(*) FROM probes WHERE artifact_id = ?",
                                            (doc_id(TARGET),)).fetchone()[0],
                "probes": db.execute("SELECT count(*) FROM probes").fetchone()[0]}
    finally:
        db.close()


def open_wrapper(tomb, backend: str):
    embedder = HashingEmbedder(384)
    path = tomb.config.stores["vectors"].options["path"]
    if backend == "chroma":
        import chromadb
        from tombstone_adapters.chroma.wrapper import TombstoneCollection

        col = chromadb.PersistentClient(path=path).get_collection("chunks", embedding_function=None)
        return TombstoneCollection(col, lineage=tomb.lineage, store="vectors", embedder=embedder)
    from tombstone_adapters.faiss import FaissStore

    return FaissStore(path, lineage=tomb.lineage, store="vectors", embedder=embedder, create=False)


def erase_target(config) -> dict:
    with Tombstone(config) as tomb:
        receipt, _ = tomb.erase(f"subject-{TARGET:03d}")
    [entry] = receipt["artifacts"]
    return entry


def probe(entry: dict, level: str) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == level)


def pending_left(backend: str) -> int:
    """How many captures the killed writer left: every chunk of Chroma's one write, FAISS's last write."""
    return len(DOCS) if backend == "chroma" else 1


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["chroma", "faiss"])
def test_the_next_wrapper_open_finishes_the_capture_a_killed_writer_left(tmp_path, backend, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    config = killed_writer(tmp_path / "d", backend)
    before = counts(config)
    assert before["artifacts"] == len(DOCS) and before["pending"] == pending_left(backend)
    assert before["target_probes"] == 0  # the control: the probes really are missing

    with Tombstone(config) as tomb:
        open_wrapper(tomb, backend)
        assert deferred.flush(60) == []
        got = tomb.lineage.probe_vectors([tomb.lineage.artifact("vectors", doc_id(TARGET))])[doc_id(TARGET)]
    after = counts(config)
    assert after["pending"] == 0
    assert after["probes"] == sum(len(probe_queries(d.text)) for d in DOCS)
    # the vectors the write would have recorded: the fragments of the text the store holds, embedded again
    fragments = probe_queries(DOCS[TARGET].text)
    expected = sorted(HashingEmbedder(384).embed(fragments), key=lambda v: v.tobytes())
    assert len(got) == len(fragments)
    assert all(np.allclose(a, b) for a, b in zip(sorted(got, key=lambda v: v.tobytes()), expected))

    entry = erase_target(config)  # measured at the semantic level like any other
    assert (entry["status"], entry["level"]) == ("VERIFIED", "semantic"), entry
    assert "probe_capture" not in entry["evidence"] and probe(entry, "semantic")["ran"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["chroma", "faiss"])
def test_an_erasure_before_the_capture_is_finished_says_the_probes_are_incomplete(tmp_path, backend, monkeypatch):
    """No wrapper is opened (``tombstone erase`` opens none): the capture cannot be finished, and the receipt
    says so; the same erasure once the capture is finished is VERIFIED(semantic) (the test above)."""
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    config = killed_writer(tmp_path / "d", backend)
    assert counts(config)["target_probes"] == 0 and counts(config)["pending"] == pending_left(backend)

    entry = erase_target(config)
    assert entry["evidence"]["probe_capture"]["complete"] is False
    assert "never recorded" in entry["evidence"]["probe_capture"]["why"]
    sem = probe(entry, "semantic")
    assert sem["ran"] is False and sem["detail"]["why"] == semantic.INCOMPLETE
    assert (entry["status"], entry["level"]) == ("VERIFIED", "physical"), entry  # never VERIFIED(semantic)
    assert probe(entry, "logical")["ran"] and probe(entry, "physical")["ran"]
    # the sealed receipt purged the erased artifact's pending capture with its other records
    db = sqlite3.connect(config.lineage_db)
    assert db.execute("SELECT count(*) FROM probe_captures WHERE artifact_id = ?", (doc_id(TARGET),)).fetchone()[0] == 0
    db.close()


# -- the pending record itself, on a real lineage db and stores (fast) ------------------------------------

from tombstone.keys import LineageSecret  # noqa: E402
from tombstone.lineage.db import LineageDB  # noqa: E402
from tombstone.lineage.records import ArtifactRecord  # noqa: E402
from support import BrokenFragments  # noqa: E402

TEXTS = [f"chunk {i} says that order {1000 + i} was refunded to the card ending {i:04d} last week" for i in range(3)]


def pending_rows(db: LineageDB) -> dict[str, str]:
    return dict(db._conn.execute("SELECT artifact_id, ticket FROM probe_captures").fetchall())


def test_only_the_latest_writes_recorded_probes_clear_its_pending_capture(tmp_path):
    db = LineageDB(tmp_path / "lineage.db", LineageSecret(b"p" * 32), create=True)
    try:
        art = ArtifactRecord(store="s", artifact_id="c0", backend="faiss", kind="vector")
        vector = np.ones(4, dtype=np.float32)
        db.record_artifacts("alice", [art], pending=[("s", "c0", "first", "w")])
        db.record_artifacts("alice", [art], pending=[("s", "c0", "second", "w")])  # written again, queued again
        db.record_probes([("s", "c0", "q1", vector)], done=[("s", "c0", "first")])
        assert pending_rows(db) == {"c0": "second"}  # the earlier job's probes do not finish the later write
        db.record_probes([("s", "c0", "q2", vector)], done=[("s", "c0", "second")])
        assert pending_rows(db) == {}
        db.record_artifacts("alice", [art], pending=[("s", "c0", "third", "w")])
        db.record_artifacts("alice", [art])  # written again with its probes inline (or without text): complete
        assert pending_rows(db) == {}
        db.record_artifacts("alice", [art], pending=[("s", "c0", "fourth", "w")])
        db.set_state([art], "suppressed")  # an erasure got there first: its probes stay incomplete
        db.record_probes([("s", "c0", "q3", vector)], done=[("s", "c0", "fourth")])
        assert pending_rows(db) == {"c0": "fourth"} and db.probes_incomplete([art]) == {"c0"}
        db.purge_probes([art])
        assert pending_rows(db) == {} and db.probes_for("s", "c0") == []
    finally:
        db.close()


def test_a_capture_a_live_writer_still_holds_is_left_to_it(tmp_path, monkeypatch):
    """A pending capture of another running process of this host is in that process's queue: a wrapper opened
    meanwhile leaves it alone, and finishes it once that process is gone."""
    from tombstone.capture.deferred import _started, writer_alive
    from tombstone_adapters.faiss import FaissStore

    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    db = LineageDB(tmp_path / "lineage.db", LineageSecret(b"p" * 32), create=True)
    try:
        store = FaissStore(tmp_path / "s", dim=32, lineage=db, store="s", embedder=BrokenFragments(32))
        store.add(["c0", "c1"], documents=TEXTS[:2], subject="alice")
        [problem] = deferred.flush(30)  # the control: the capture failed, the chunks have no probes
        assert "model server went away" in problem and set(pending_rows(db)) == {"c0", "c1"}
        other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        try:
            import socket

            held_by = f"{socket.gethostname()}:{other.pid}:{_started(other.pid)}"
            assert writer_alive(held_by) and not writer_alive(f"{socket.gethostname()}:{other.pid}:1")
            with db.atomic() as conn:
                conn.execute("UPDATE probe_captures SET writer = ?", (held_by,))
            FaissStore(tmp_path / "s", lineage=db, store="s", embedder=HashingEmbedder(32), create=False)
            assert deferred.flush(30) == [] and set(pending_rows(db)) == {"c0", "c1"}
        finally:
            other.stdin.close()
            other.wait(30)
        assert not writer_alive(held_by)
        FaissStore(tmp_path / "s", lineage=db, store="s", embedder=HashingEmbedder(32), create=False)
        assert deferred.flush(30) == [] and pending_rows(db) == {}
        assert len(db.probes_for("s", "c1")) == len(probe_queries(TEXTS[1]))
    finally:
        db.close()


def test_a_capture_is_not_finished_from_text_the_store_no_longer_holds(tmp_path, monkeypatch):
    """Chroma: a record whose document was changed outside the wrapper, or deleted, keeps its capture pending
    (its fragments cannot be its own); the others are finished, in the open itself in inline mode."""
    import chromadb
    from tombstone_adapters.chroma.wrapper import TombstoneCollection

    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    db = LineageDB(tmp_path / "lineage.db", LineageSecret(b"p" * 32), create=True)
    try:
        col = chromadb.PersistentClient(path=str(tmp_path / "chroma")).create_collection("chunks", embedding_function=None)
        TombstoneCollection(col, lineage=db, store="s", embedder=BrokenFragments(32)).add(
            ids=["c0", "c1", "c2"], documents=TEXTS, subject="alice")
        assert len(deferred.flush(30)) == 1 and set(pending_rows(db)) == {"c0", "c1", "c2"}
        other = "a different text written around the wrapper, eight words or more"
        col.update(ids=["c1"], documents=[other], embeddings=HashingEmbedder(32)([other]))
        col.delete(ids=["c2"])
        monkeypatch.setenv(deferred.MODE_ENV, "inline")
        TombstoneCollection(col, lineage=db, store="s", embedder=HashingEmbedder(32))
        assert set(pending_rows(db)) == {"c1", "c2"}
        assert len(db.probes_for("s", "c0")) == len(probe_queries(TEXTS[0]))
        assert db.probes_for("s", "c1") == [] and db.probes_for("s", "c2") == []
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["qdrant", "pgvector"])
def test_qdrant_and_pgvector_wrappers_finish_a_pending_capture_when_opened(tmp_path, backend, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    db = LineageDB(tmp_path / "lineage.db", LineageSecret(b"p" * 32), create=True)
    closers = []
    try:
        if backend == "qdrant":
            from qdrant_client import models
            from tombstone_adapters.qdrant import TombstoneQdrant, close_local_clients, local_client

            closers.append(close_local_clients)
            local_client(tmp_path / "q").create_collection(
                "chunks", vectors_config=models.VectorParams(size=32, distance=models.Distance.COSINE))

            def open_store(embedder):
                return TombstoneQdrant(local_client(tmp_path / "q"), "chunks", lineage=db, store="s", embedder=embedder)

            def write(store):
                store.upsert(["c0", "c1"], documents=TEXTS[:2], subject="alice")
        else:
            import psycopg
            from tombstone_adapters.pgvector import PgVectorStore
            from tombstone_adapters.pgvector.server import embedded_dsn

            conn = psycopg.connect(os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path / "pg"),
                                   autocommit=True)
            closers.append(conn.close)
            table = f"chunks_{os.getpid()}_{id(tmp_path) % 100000}"
            closers.append(lambda: conn.execute(f"DROP TABLE IF EXISTS {table}"))

            def open_store(embedder):
                return PgVectorStore(conn, table, dim=32, lineage=db, store="s", embedder=embedder)

            def write(store):
                store.add(["c0", "c1"], documents=TEXTS[:2], subject="alice")
        write(open_store(BrokenFragments(32)))
        assert len(deferred.flush(30)) == 1 and set(pending_rows(db)) == {"c0", "c1"}  # the control
        assert db.probes_for("s", "c0") == []
        monkeypatch.setenv(deferred.MODE_ENV, "inline")
        open_store(HashingEmbedder(32))
        assert pending_rows(db) == {}
        assert [len(db.probes_for("s", c)) for c in ("c0", "c1")] == [len(probe_queries(t)) for t in TEXTS[:2]]
    finally:
        for close in reversed(closers):
            close()
        db.close()
