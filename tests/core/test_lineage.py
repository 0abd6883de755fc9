"""The lineage db: migrations, atomicity, keyed subjects, sealed values, scope."""

from __future__ import annotations

import sqlite3

import pytest

from tombstone.errors import KeyMaterialError, LineageError, ScopeViolationError
from tombstone.keys import LineageSecret
from tombstone.lineage.db import ArtifactRecord, LineageDB
from tombstone.lineage.migrations import MIGRATIONS

SECRET = LineageSecret(b"k" * 32)


def art(i: str, **kw) -> ArtifactRecord:
    return ArtifactRecord(store="s", artifact_id=i, backend="docstore", kind="document", **kw)


def test_migrations_recorded_and_reopen_is_a_noop(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    assert db.schema_version() == MIGRATIONS[-1][0]
    db.close()
    db = LineageDB(tmp_path / "l.db", SECRET)
    assert db.schema_version() == MIGRATIONS[-1][0]
    assert db._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_newer_db_is_refused(tmp_path):
    LineageDB(tmp_path / "l.db", SECRET, create=True).close()
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 'x')")
    conn.commit()
    conn.close()
    with pytest.raises(LineageError, match="newer"):
        LineageDB(tmp_path / "l.db", SECRET)


def test_subject_reference_never_stored(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("alice@example.com", [art("a1", content_hash="ab" * 32)])
    db.create_saga("saga-1", "alice@example.com", None)
    db._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    raw = (tmp_path / "l.db").read_bytes()
    assert b"alice@example.com" not in raw and b"alice" not in raw
    db = LineageDB(tmp_path / "l.db", SECRET)
    assert db.saga("saga-1")["subject"] == "alice@example.com"
    assert db.artifacts_for(db.subject_key("alice@example.com"))[0].artifact_id == "a1"
    db.close()
    with pytest.raises(KeyMaterialError):
        LineageDB(tmp_path / "l.db", LineageSecret(b"z" * 32)).saga("saga-1")


def test_subject_keys_depend_on_the_secret():
    assert SECRET.subject_key("a") != LineageSecret(b"q" * 32).subject_key("a")
    assert SECRET.subject_key("a") == SECRET.subject_key("a") != SECRET.subject_key("b")


def test_record_is_one_transaction(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("bob", [art("b1")])
    with pytest.raises(ScopeViolationError):
        # a1 is new and fine, b1 belongs to bob: nothing of this call may land
        db.record_artifacts("alice", [art("a1"), art("b1")])
    assert db.artifacts_for(db.subject_key("alice")) == []
    assert db.artifact("s", "a1") is None
    db.close()


def test_atomic_nested_savepoint_rolls_back_inner_only(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    with db.atomic():
        db.record_artifacts("alice", [art("a1")])
        with pytest.raises(ScopeViolationError):
            db.record_artifacts("bob", [art("a1")])
        db.record_artifacts("alice", [art("a2")])
    assert {a.artifact_id for a in db.artifacts_for(db.subject_key("alice"))} == {"a1", "a2"}
    db.close()


def test_fingerprint_round_trip_and_probes(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    fp = tuple(float(i) / 8 for i in range(32))
    import numpy as np

    db.record_artifacts("alice", [art("v1", fingerprint=fp)], probes=[("s", "v1", "q" * 64, np.ones(8))],
                        edges=[("s", "v1", "cache", "c1", "cached_from")])
    got = db.artifact("s", "v1")
    assert got.fingerprint == fp
    assert len(db.probes_for("s", "v1")) == 1
    db.purge_probes([got])
    assert db.probes_for("s", "v1") == []
    db.close()


def test_duplicate_content_attribution(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("alice", [art("a1", content_hash="c" * 64)])
    db.record_artifacts("bob", [art("b1", content_hash="c" * 64)])
    assert [a.artifact_id for a in db.live_sharing_content(db.artifact("s", "a1"))] == ["b1"]
    db.set_state([db.artifact("s", "b1")], "decided")
    assert db.live_sharing_content(db.artifact("s", "a1")) == []
    db.close()


def test_suppressed_among_answers_is_suppressed_for_many_ids(tmp_path):
    """The bulk form the verify step asks (hundreds of ids a query) gives what ``is_suppressed`` gives one by
    one, across query boundaries, per store; cleared suppressions still count, as they do there."""
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    ids = [f"a{i:04d}" for i in range(1203)]
    db.create_saga("saga-1", "alice", None)
    marked = [art(i) for i in ids[::3]]
    db.record_suppressions("saga-1", marked)
    db.clear_suppressions(marked[:10])
    other = ArtifactRecord(store="t", artifact_id=ids[1], backend="docstore", kind="document")
    db.record_suppressions("saga-1", [other])
    got = db.suppressed_among("s", ids + ["never-written", ids[0]])
    assert got == {i for i in ids if db.is_suppressed("s", i)} == set(ids[::3])
    assert ids[1] not in got and db.suppressed_among("t", ids) == {ids[1]}
    assert db.suppressed_among("s", []) == set()
    db.close()
