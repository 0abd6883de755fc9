"""Probe fragments embedded and recorded off the write path (``tombstone.capture.deferred``): the write
returns before them, an erasure in the process waits for them, an artifact erased first never gets them, a
failing embedder loses only them; on SQLite and on a PostgreSQL lineage db."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest

from tombstone.capture import HashingEmbedder, deferred
from tombstone.capture.fragments import probe_queries
from tombstone.capture.vector import vectors_for_write
from tombstone.keys import LineageSecret
from tombstone.lineage.db import LineageDB

from support import BrokenFragments

SECRET = LineageSecret(b"d" * 32)
TEXTS = [f"chunk {i} says that order {1000 + i} was refunded to the card ending {i:04d} last week" for i in range(6)]


class SlowEmbedder(HashingEmbedder):
    """Blocks fragment batches (not chunk batches) until released, to catch the queue mid-flight."""

    def __init__(self) -> None:
        super().__init__(32)
        import threading

        self.release = threading.Event()

    def embed(self, texts):
        if texts and len(texts[0].split()) <= 8:  # the fragments: eight words at most
            assert self.release.wait(30)
        return super().embed(texts)

    __call__ = embed


def write(db: LineageDB, embedder, ids, subject="alice"):
    return vectors_for_write(embedder, db, store="s", backend="faiss", ids=ids, documents=TEXTS[:len(ids)],
                             subject=subject)


def probe_rows(db: LineageDB) -> int:
    return db._conn.execute("SELECT count(*) FROM probes").fetchone()[0]


@pytest.fixture
def sqlite_db(tmp_path):
    db = LineageDB(tmp_path / "lineage.db", SECRET, create=True)
    yield db
    deferred.flush(30)
    db.close()


def test_the_write_returns_before_its_probes_and_a_read_of_them_waits(sqlite_db, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    slow = SlowEmbedder()
    ids = [f"c{i}" for i in range(4)]
    write(sqlite_db, slow, ids)  # returns although the fragment batch is blocked
    assert sqlite_db.artifact("s", "c0") is not None and probe_rows(sqlite_db) == 0
    assert deferred.PROBES.pending == 1
    slow.release.set()
    got = sqlite_db.probe_vectors([sqlite_db.artifact("s", i) for i in ids])  # waits for the queue
    assert all(len(got[i]) == len(probe_queries(TEXTS[n])) for n, i in enumerate(ids))
    # the same vectors as the inline capture embeds with the chunks
    assert np.allclose(got["c0"][0], HashingEmbedder(32).embed([probe_queries(TEXTS[0])[0]])[0])


def test_inline_mode_records_the_probes_in_the_write(sqlite_db, monkeypatch):
    monkeypatch.setenv(deferred.MODE_ENV, "inline")
    write(sqlite_db, HashingEmbedder(32), ["c0", "c1"])
    assert deferred.PROBES.pending == 0 and probe_rows(sqlite_db) == len(probe_queries(TEXTS[0])) * 2


def test_an_artifact_erased_before_its_probes_land_never_gets_them(sqlite_db, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    slow = SlowEmbedder()
    write(sqlite_db, slow, ["c0", "c1"])
    sqlite_db.set_state([sqlite_db.artifact("s", "c0")], "suppressed")  # an erasure got there first
    slow.release.set()
    assert deferred.flush(30) == []
    assert sqlite_db.probes_for("s", "c0") == [] and sqlite_db.probes_for("s", "c1")


def test_a_failing_embedder_loses_only_the_probes_and_says_so(sqlite_db, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    vectors = write(sqlite_db, BrokenFragments(32), ["c0", "c1"])
    assert vectors.shape == (2, 32) and sqlite_db.artifact("s", "c1") is not None
    [problem] = deferred.flush(30)
    assert "2 chunk(s) in s" in problem and "model server went away" in problem
    assert probe_rows(sqlite_db) == 0


def test_a_bad_mode_is_a_config_error(monkeypatch):
    from tombstone.errors import ConfigError

    monkeypatch.setenv(deferred.MODE_ENV, "later")
    with pytest.raises(ConfigError, match="choose one of background, inline"):
        deferred.mode()


def test_deferred_probes_on_a_postgresql_lineage_db(tmp_path, monkeypatch):
    import psycopg

    from tombstone_adapters.pgvector.server import embedded_dsn

    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    server = os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path / "pg")
    name = f"lineage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    db = LineageDB(urlunsplit(urlsplit(server)._replace(path=f"/{name}")), SECRET, create=True)
    try:
        slow = SlowEmbedder()
        write(db, slow, ["c0", "c1", "c2"])
        db.set_state([db.artifact("s", "c2")], "suppressed")
        slow.release.set()
        assert deferred.flush(30) == []
        assert len(db.probes_for("s", "c0")) == len(probe_queries(TEXTS[0])) and db.probes_for("s", "c2") == []
    finally:
        db.close()


def test_a_wrapper_write_queues_its_probes_only_once_the_store_write_returned(sqlite_db, monkeypatch):
    monkeypatch.delenv(deferred.MODE_ENV, raising=False)
    slow = SlowEmbedder()
    seen = {}

    @deferred.after_write
    def store_write(ids):
        write(sqlite_db, slow, ids)
        seen["during"] = deferred.PROBES.pending  # the store write would run here: nothing competes with it
        return "written"

    @deferred.after_write
    def failing_write(ids):
        write(sqlite_db, slow, ids)
        raise OSError("disk full")

    assert store_write(["c0"]) == "written" and seen["during"] == 0 and deferred.PROBES.pending == 1
    slow.release.set()
    assert deferred.flush(30) == [] and sqlite_db.probes_for("s", "c0")
    with pytest.raises(OSError):
        failing_write(["c1"])
    assert deferred.PROBES.pending == 0 and sqlite_db.probes_for("s", "c1") == []


def test_closing_the_deployment_waits_for_its_queued_probe_vectors(tmp_path):
    """Tombstone.close() returns with the probe vectors its wrappers queued recorded and the lineage db whole
    (its write-ahead log checkpointed): a copy of the deployment taken then is quiescent."""
    import threading

    from tombstone import Tombstone, init_deployment

    config = init_deployment(tmp_path / "d", {"s": {"backend": "faiss", "path": "stores/s"}})
    embedder = SlowEmbedder()
    tomb = Tombstone(config)
    write(tomb.lineage, embedder, ["a-1", "a-2"])
    releaser = threading.Timer(0.2, embedder.release.set)  # the fragments are embedded only after close() began
    releaser.start()
    try:
        tomb.close()
    finally:
        releaser.join()
    assert not (config.root / "lineage.db-wal").exists()
    with Tombstone.open(config.path) as again:
        assert probe_rows(again.lineage) == len(probe_queries(TEXTS[0])) * 2
