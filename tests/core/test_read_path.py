"""The read path costs nothing while nothing is suppressed, and hides a suppressed record from the moment
its suppression is journaled — in another process, with the lineage db on SQLite or PostgreSQL — before the
store itself is touched; k results come back when k visible ones exist; a caller's own filters keep working."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import chromadb
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone_adapters.chroma import SUPPRESSED, TombstoneCollection

from test_workers import lineage_dsn, server  # noqa: F401  (fixtures: a real PostgreSQL)

DIM = 64


def deployment(root, *, lineage_dsn=None):
    config = init_deployment(root, {"vectors": {"backend": "chroma", "path": "stores/vectors", "collection": "docs"}},
                             lineage_dsn=lineage_dsn)
    chromadb.PersistentClient(path=config.stores["vectors"].options["path"]).create_collection(
        "docs", embedding_function=None, metadata={"hnsw:space": "cosine"})
    return config


def wrapper(tomb):
    client = chromadb.PersistentClient(path=tomb.config.stores["vectors"].options["path"])
    return TombstoneCollection(client.get_collection("docs"), lineage=tomb.lineage, store="vectors",
                               embedder=HashingEmbedder(DIM))


def write(tomb, subject, texts):
    ids = [f"{subject}-{n:03d}" for n in range(len(texts))]
    wrapper(tomb).add(ids=ids, documents=texts, metadatas=[{"n": n, "who": subject} for n in range(len(ids))],
                      subject=subject)
    return ids


def returned(view, query):
    return set(view.query(query_texts=[query], n_results=10)["ids"][0]) | set(view.get()["ids"])


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_suppression_journaled_in_another_process_hides_the_record_before_the_store_is_touched(
        tmp_path, engine, request):
    dsn = request.getfixturevalue("lineage_dsn") if engine == "postgresql" else None
    config = deployment(tmp_path / "d", lineage_dsn=dsn)
    topic = "refund for order 1182 delayed parcel"
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", [f"{topic} note {n}" for n in range(3)])
        theirs = write(tomb, "bob", [f"{topic} reply {n}" for n in range(3)])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOMBSTONE_PAUSE_AT": "saga:suppress:vectors:recorded=20"}
    erase = subprocess.Popen([sys.executable, "-m", "tombstone", "erase", "alice", "--config", str(config.path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Tombstone(config) as tomb:
            view = wrapper(tomb)
            assert set(mine) <= returned(view, topic)  # control: visible before the erasure
            deadline = time.monotonic() + 60
            while not all(tomb.lineage.is_suppressed("vectors", i) for i in mine):
                assert time.monotonic() < deadline and erase.poll() is None, erase.stderr.read() if erase.poll() else ""
                time.sleep(0.05)
            # the erasure is paused after journaling, before touching the store: no flag is set yet
            raw = chromadb.PersistentClient(path=config.stores["vectors"].options["path"]).get_collection("docs")
            assert not any((m or {}).get(SUPPRESSED) for m in raw.get(ids=mine)["metadatas"])
            seen = returned(view, topic)
            assert not seen & set(mine), "a record suppressed in another process came back"
            assert set(theirs) <= seen
    finally:
        out, err = erase.communicate(timeout=300)
    assert erase.returncode == 0, err


def test_k_results_come_back_when_many_suppressed_neighbours_outrank_them(tmp_path):
    config = deployment(tmp_path / "d")
    topic = "invoice overdue reminder account balance"
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", [f"{topic} {topic}"] * 30)  # identical: they outrank everything else
        theirs = write(tomb, "bob", [f"{topic} bob {n}" for n in range(8)])
        tomb.lineage.record_suppressions("s-1", [tomb.lineage.artifact("vectors", i) for i in mine])
        view = wrapper(tomb)
        got = view.query(query_texts=[topic], n_results=5, include=["documents"])
        assert len(got["ids"][0]) == 5 and set(got["ids"][0]) <= set(theirs)
        assert got["metadatas"] is None  # the caller did not ask for them
        # the caller's own where still applies (and is not replaced by the hiding)
        only = view.query(query_texts=[topic], n_results=5, where={"n": 2})["ids"][0]
        assert only == [theirs[2]]
        assert view.count() == 8
        assert view.get(ids=mine)["ids"] == [] and set(view.get(ids=mine + theirs)["ids"]) == set(theirs)
        # paging through while something is hidden never yields a hidden record and misses none
        pages = [view.get(limit=3, offset=o)["ids"] for o in range(0, 9, 3)]
        assert sorted(i for page in pages for i in page) == sorted(theirs)


def test_with_nothing_suppressed_a_query_is_the_stores_own_call(tmp_path, monkeypatch):
    """No metadata filter reaches the store when nothing is hidden (the cost that made reads 18x slower)."""
    config = deployment(tmp_path / "d")
    with Tombstone(config) as tomb:
        write(tomb, "alice", ["one thing", "another thing"])
        view = wrapper(tomb)
        calls = []
        real = view._call

        def spy(method, **kwargs):
            calls.append((method, kwargs.get("where")))
            return real(method, **kwargs)

        monkeypatch.setattr(view, "_call", spy)
        view.query(query_texts=["thing"], n_results=2)
        view.get(ids=["alice-000"])
        assert calls == [("query", None), ("get", None)]
        # control: with something hidden the query over-fetches past it (sized from the hidden share: one of
        # two records, so one more than k here) instead of filtering
        tomb.lineage.record_suppressions("s-1", [tomb.lineage.artifact("vectors", "alice-000")])
        calls.clear()
        assert view.query(query_texts=["thing"], n_results=2)["ids"][0] == ["alice-001"]
        assert calls == [("count", None), ("query", None)]
        calls.clear()
        view.query(query_texts=["thing"], n_results=2)
        assert calls == [("query", None)]  # the collection is counted once per hidden set


def test_with_five_percent_hidden_every_query_gets_the_k_nearest_visible_records(tmp_path, monkeypatch):
    """The first ask is sized from the hidden share; a query whose results still fall short is asked again,
    wider, up to k plus every hidden id: whatever the guess, the answer is the k nearest visible records."""
    config = deployment(tmp_path / "d")
    topics = ["refund", "parcel", "invoice", "booking", "visit", "ticket", "payment", "claim"]
    with Tombstone(config) as tomb:
        ids = write(tomb, "alice", [f"{topics[n % 8]} note {n} {topics[(n * 3) % 8]} {n % 5}" for n in range(200)])
        hidden = ids[::20]  # 5%
        tomb.lineage.record_suppressions("s-1", [tomb.lineage.artifact("vectors", i) for i in hidden])
        view = wrapper(tomb)
        raw = view._collection
        asked = []
        real = view._call

        def spy(method, **kwargs):
            q = kwargs.get("query_embeddings")
            asked.append((method, kwargs.get("n_results"), 0 if q is None else len(q)))
            return real(method, **kwargs)

        monkeypatch.setattr(view, "_call", spy)
        queries = [f"{t} note {t}" for t in topics] + [f"{a} {b}" for a in topics for b in topics[:3]]
        vectors = HashingEmbedder(DIM).embed(queries)
        got = view.query(query_embeddings=vectors, n_results=10, include=["distances"])
        everything = raw.query(query_embeddings=vectors, n_results=200, include=["distances"])
        for row, dist, full, full_dist in zip(got["ids"], got["distances"], everything["ids"], everything["distances"]):
            expected = [d for i, d in zip(full, full_dist) if i not in set(hidden)][:10]
            assert len(row) == 10 and not set(row) & set(hidden)
            assert dist == pytest.approx(expected, abs=1e-5)  # the same distances: ties may come in either order
        queries_asked = [a for a in asked if a[0] == "query"]
        assert queries_asked[0][1] == 10 + 1  # k plus twice the expected hidden among 10 at a 5% share
        assert all(rows < len(queries) for _, _, rows in queries_asked[1:])  # only the queries left short are asked again
