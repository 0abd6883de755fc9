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


def test_bulk_writes_inside_a_larger_transaction_take_no_savepoint_and_still_land_all_or_nothing(tmp_path):
    """A verify step's state change, suppression clearing and probe purge share one transaction. Each of them
    joins it without a savepoint of its own (under one, SQLite first copies every page the statement changes
    into the savepoint's journal: a batch's purge of its probe vectors ran three times as slow). A failure later
    in the enclosing block still undoes all of it; at the top level each is its own transaction."""
    import numpy as np

    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("alice", [art("a1"), art("a2")],
                        probes=[("s", aid, q * 64, np.ones(8)) for aid in ("a1", "a2") for q in "pq"])
    arts = [db.artifact("s", "a1"), db.artifact("s", "a2")]
    db.record_suppressions("saga-1", arts)

    def hidden() -> set[str]:
        return {r[0] for r in db._conn.execute("SELECT artifact_id FROM suppressions WHERE cleared_at IS NULL")}

    statements: list[str] = []
    db._conn.set_trace_callback(statements.append)
    try:
        with pytest.raises(RuntimeError):
            with db.atomic():
                db.set_state(arts, "decided")
                db.clear_suppressions(arts)
                db.purge_probes(arts)
                raise RuntimeError("after the writes, inside the enclosing transaction")
    finally:
        db._conn.set_trace_callback(None)
    assert [s for s in statements if s.upper().startswith(("BEGIN", "COMMIT", "ROLLBACK"))] == ["BEGIN IMMEDIATE",
                                                                                                  "ROLLBACK"]
    assert not [s for s in statements if "SAVEPOINT" in s.upper()], statements
    # the enclosing rollback undid every one of them
    assert {a.artifact_id: a.state for a in db.artifacts_for(db.subject_key("alice"))} == {"a1": "live", "a2": "live"}
    assert len(db.probes_for("s", "a1")) == 2 and hidden() == {"a1", "a2"}
    # the same block without the failure lands whole
    with db.atomic():
        db.set_state(arts, "decided")
        db.clear_suppressions(arts)
        db.purge_probes(arts)
    assert {a.state for a in db.artifacts_for(db.subject_key("alice"))} == {"decided"}
    assert db.probes_for("s", "a1") == [] and hidden() == set()
    # a default nested block is still a savepoint (test_atomic_nested_savepoint_rolls_back_inner_only)
    statements.clear()
    db._conn.set_trace_callback(statements.append)
    with db.atomic(), db.atomic():
        pass
    db._conn.set_trace_callback(None)
    assert "SAVEPOINT sp1" in statements
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


def test_the_bulk_lookups_give_what_the_single_ones_give(tmp_path):
    """``lineage_gaps`` and ``live_sharing_content_many`` (the verify step's, for thousands of artifacts) give,
    artifact by artifact, what ``lineage_gap`` and ``live_sharing_content`` give: over gaps of every kind (a
    source the db does not know, an edge to an artifact it does not know, a derived kind with no source, two
    unknown sources), shared content within the subject and across subjects, and a shared copy no longer live."""
    from tombstone.lineage.db import DERIVED_KINDS

    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    derived_kind = sorted(DERIVED_KINDS)[0]
    db.record_artifacts("alice", [art(f"a{i}", content_hash=f"{i % 3:064d}") for i in range(6)]
                        + [ArtifactRecord("cache", "orphan", "docstore", derived_kind),
                           ArtifactRecord("cache", "built", "docstore", derived_kind)],
                        edges=[("s", "a0", "cache", "built", "cached_from"), ("s", "a1", "cache", "gone", "cached_from"),
                               ("s", "never", "s", "a2", "copied_from"), ("s", "zz-never", "s", "a2", "copied_from"),
                               ("s", "aa-never", "s", "a3", "copied_from")])
    db.record_artifacts("bob", [art("b0", content_hash=f"{0:064d}"), art("b1", content_hash=f"{1:064d}"),
                                art("b9", content_hash=f"{9:064d}")])
    db.set_state([db.artifact("s", "b1")], "decided")
    arts = [db.artifact(s, i) for s, i in [("s", f"a{n}") for n in range(6)] + [("cache", "orphan"), ("cache", "built"),
                                                                                  ("s", "b0"), ("s", "b9")]]
    gaps = db.lineage_gaps(arts)
    assert gaps == {(a.store, a.artifact_id): db.lineage_gap(a) for a in arts}
    assert gaps[("s", "a1")] and gaps[("s", "a2")] and gaps[("cache", "orphan")] and gaps[("s", "a3")], "the control"
    assert gaps[("s", "a2")] == "derived (copied_from) from s/never, which the lineage db does not know"
    assert gaps[("s", "a0")] is None and gaps[("cache", "built")] is None
    sharing = db.live_sharing_content_many(arts)
    for a in arts:
        assert sorted(o.artifact_id for o in sharing[(a.store, a.artifact_id)]) == sorted(
            o.artifact_id for o in db.live_sharing_content(a))
    assert [o.artifact_id for o in sharing[("s", "a0")]] == ["b0"] and sharing[("s", "a1")] == [], "b1 is not live"
    assert sorted(o.artifact_id for o in sharing[("s", "b0")]) == ["a0", "a3"]
    db.close()


def test_probe_vectors_for_many_artifacts_are_each_ones_own_in_order(tmp_path):
    import numpy as np

    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("alice", [art(f"a{i}") for i in range(3)]
                        + [ArtifactRecord("t", "a0", "docstore", "document")])
    rng = np.random.default_rng(3)
    rows = [(store, aid, f"{q:064x}", rng.standard_normal(4).astype(np.float32))
            for store, aid in [("s", "a0"), ("s", "a2"), ("t", "a0")] for q in rng.permutation(3)]
    assert db.record_probes(rows) == 9
    arts = [db.artifact("s", "a0"), db.artifact("s", "a1"), db.artifact("s", "a2")]
    got = db.probe_vectors(arts)
    assert set(got) == {"a0", "a1", "a2"} and got["a1"] == []
    for a in arts:
        expected = db.probes_for(a.store, a.artifact_id)
        assert [q for q, _ in expected] == sorted(q for q, _ in expected)
        assert [v.tolist() for v in got[a.artifact_id]] == [v.tolist() for _, v in expected]
    assert len(got["a0"]) == 3, "the other store's probes of the same id are not these"
    assert db.probe_counts(arts) == {a: len(v) for a, v in got.items()} == {"a0": 3, "a1": 0, "a2": 3}
    db.close()


def test_artifacts_many_and_has_artifacts_agree_with_the_single_lookups(tmp_path):
    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    db.record_artifacts("alice", [art(f"a{i}") for i in range(3)] + [ArtifactRecord("t", "a0", "docstore", "document")])
    pairs = [("s", "a0"), ("s", "a2"), ("t", "a0"), ("s", "nope"), ("u", "a0")]
    got = db.artifacts_many(pairs)
    assert got == {p: db.artifact(*p) for p in pairs if db.artifact(*p) is not None}
    assert set(got) == {("s", "a0"), ("s", "a2"), ("t", "a0")}
    assert db.has_artifacts(db.subject_key("alice")) and not db.has_artifacts(db.subject_key("bob"))
    db.close()


def test_closure_reads_edges_in_bulk_and_reaches_what_one_edge_query_per_artifact_reaches(tmp_path):
    """The closure reads the outgoing edges of the whole frontier in one query; the scope and the reason given
    for each artifact are those of reading one artifact's edges at a time (the walk before it read in bulk),
    on a graph with shared derivations, a cycle, several stores and an edge to an artifact the db never
    recorded."""
    import random

    db = LineageDB(tmp_path / "l.db", SECRET, create=True)
    rng = random.Random(11)
    nodes = [(store, f"{store}{i}") for store in ("s", "t", "u") for i in range(40)]
    owner = {n: f"subject{rng.randrange(4)}" for n in nodes}
    edges = {(a, b) for a in nodes for b in nodes if a != b and rng.random() < 0.03}
    edges |= {(nodes[0], nodes[1]), (nodes[1], nodes[2]), (nodes[2], nodes[0])}  # a cycle
    for subject in sorted(set(owner.values())):
        db.record_artifacts(subject, [ArtifactRecord(s, i, "docstore", "document") for (s, i) in nodes
                                      if owner[(s, i)] == subject],
                            edges=[(a[0], a[1], b[0], b[1], rng.choice(["cached_from", "derived_from"]))
                                   for a, b in sorted(edges) if owner[a] == subject])
    db.record_artifacts(owner[nodes[0]], [], edges=[("s", "s0", "v", "never-recorded", "cached_from")])

    def one_at_a_time(key):
        out = {(a.store, a.artifact_id): (a, "owned") for a in db.artifacts_for(key)}
        frontier = list(out)
        while frontier:
            store, aid = frontier.pop()
            for dst_store, dst_id, relation in db.edges_of(ArtifactRecord(store, aid, "", ""))["derived"]:
                art = db.artifact(dst_store, dst_id)
                if (dst_store, dst_id) in out or art is None:
                    continue
                out[(dst_store, dst_id)] = (art, f"{relation} from {store}/{aid}")
                frontier.append((dst_store, dst_id))
        return sorted(out.values(), key=lambda pair: (pair[0].store, pair[0].artifact_id))

    queries: list[str] = []
    db._conn.set_trace_callback(lambda sql: queries.append(sql) if "FROM edges" in sql else None)
    for subject in sorted(set(owner.values())):
        key = db.subject_key(subject)
        queries.clear()
        got = db.closure(key)
        walked = len(got)
        bulk_queries = len(queries)
        assert got == one_at_a_time(key)
        assert len(queries) - bulk_queries == 2 * walked  # the reference: two edge queries per artifact walked
        assert bulk_queries < walked, (bulk_queries, walked)
        assert any(why != "owned" for _, why in got)  # the graph reaches past each subject's own artifacts
    # a subject whose chunks nothing was derived from (the common case): one query per store
    db.record_artifacts("plain", [ArtifactRecord(store, f"p{store}{i}", "docstore", "document")
                                  for store in ("s", "t") for i in range(30)])
    queries.clear()
    assert [why for _, why in db.closure(db.subject_key("plain"))] == ["owned"] * 60
    assert len(queries) == 2
    db._conn.set_trace_callback(None)
    db.close()
