"""The logical probe's batched nearest-neighbour paths agree with the per-artifact ones, query for query,
and they cost one searcher call per batch of vectors instead of one per artifact."""

from __future__ import annotations

import numpy as np
import pytest

from tombstone.verify.logical import nearest_paths, nearest_paths_many


def exact_searcher(ids: list[str], matrix: np.ndarray, calls: list[int]):
    def search(vectors: np.ndarray, k: int):
        calls.append(len(vectors))
        order = np.argsort(-(vectors @ matrix.T), axis=1)[:, :k]
        return [[ids[j] for j in row] for row in order], [matrix[row] for row in order]
    return search


def test_batched_paths_match_one_artifact_at_a_time():
    rng = np.random.default_rng(5)
    ids = [f"a{i}" for i in range(300)]
    matrix = rng.normal(size=(300, 16)).astype(np.float32)
    # probes near each artifact's own vector (found), and plain noise (mostly not)
    items = [(aid, [("fragment1", matrix[i] + rng.normal(scale=0.1, size=16).astype(np.float32)),
                    ("padded_fingerprint", rng.normal(size=16).astype(np.float32))])
             for i, aid in enumerate(ids[:120])]
    one_calls: list[int] = []
    single = {aid: nearest_paths(aid, queries, {"raw": exact_searcher(ids, matrix, one_calls)}, 10)
              for aid, queries in items}
    many_calls: list[int] = []
    batched = nearest_paths_many(items, {"raw": exact_searcher(ids, matrix, many_calls)}, 10, batch=100)
    assert batched == single
    assert any(paths["raw.top40(fragment1)"] for paths in batched.values()), "nothing found: nothing compared"
    assert not all(paths["raw.top40(padded_fingerprint)"] for paths in batched.values())
    assert len(one_calls) == 120 and many_calls == [100, 100, 40]


def test_an_artifact_with_no_probe_vectors_gets_no_nearest_paths():
    calls: list[int] = []
    out = nearest_paths_many([("a0", []), ("a1", [("fragment1", np.ones(4, dtype=np.float32))])],
                             {"raw": exact_searcher(["a1"], np.ones((1, 4), dtype=np.float32), calls)}, 1)
    assert out["a0"] == {} and out["a1"] == {"raw.top40(fragment1)": True, "raw.mmr(fragment1)": True}


def test_mmr_for_many_queries_chooses_what_mmr_for_one_chooses():
    from tombstone.verify.logical import mmr_select, mmr_select_many

    rng = np.random.default_rng(11)
    queries = rng.normal(size=(50, 8))
    candidates = [rng.normal(size=(int(rng.integers(0, 40)), 8)) for _ in range(50)]
    candidates[3] = np.repeat(candidates[3][:1], 5, axis=0) if len(candidates[3]) else rng.normal(size=(5, 8))
    assert mmr_select_many(queries, candidates) == [mmr_select(q, c) for q, c in zip(queries, candidates)]


def test_mmr_runs_only_where_the_top_k_holds_the_artifact_and_decides_as_mmr_over_every_query():
    """MMR picks among the top-k, so the probe asks a searcher for the candidates' vectors only for the queries
    whose top-k holds the artifact: the verdicts equal MMR computed over every query's candidates, and a
    searcher that hands its vectors out lazily is asked for those rows alone (none, when nothing is found)."""
    from tombstone.verify.logical import mmr_select

    rng = np.random.default_rng(11)
    ids = [f"a{i}" for i in range(200)]
    matrix = rng.normal(size=(200, 16)).astype(np.float32)
    items = [(aid, [("fragment1", matrix[i] + rng.normal(scale=0.1, size=16).astype(np.float32)),
                    ("padded_fingerprint", rng.normal(size=16).astype(np.float32))])
             for i, aid in enumerate(ids[:80])]
    asked: list[int] = []

    def lazy(vectors: np.ndarray, k: int):
        order = np.argsort(-(vectors @ matrix.T), axis=1)[:, :k]
        found = [[ids[j] for j in row] for row in order]

        def candidates(rows):
            asked.extend(rows)
            return [matrix[order[r]] for r in rows]
        return found, candidates

    got = nearest_paths_many(items, {"raw": lazy}, 10, batch=64)
    for aid, queries in items:  # the reference: MMR over every query's candidates
        for label, vec in queries:
            order = np.argsort(-(matrix @ vec))[:10]
            chosen = mmr_select(vec, matrix[order])
            assert got[aid][f"raw.mmr({label})"] == (aid in [ids[order[i]] for i in chosen])
            assert got[aid]["raw.top40(" + label + ")"] == (aid in [ids[j] for j in order])
    holding = sum(paths[f"raw.top40({label})"] for paths in got.values() for label in ("fragment1", "padded_fingerprint"))
    assert holding and len(asked) == holding < 160  # control: some queries found it, and only those asked
    asked.clear()
    gone = [(f"x{i}", queries) for i, (_, queries) in enumerate(items)]  # ids no query returns: an erasure
    assert not any(any(p.values()) for p in nearest_paths_many(gone, {"raw": lazy}, 10).values())
    assert asked == []


def test_a_searcher_within_another_is_asked_only_where_that_one_found_the_artifact():
    """A wrapper whose query is the raw store's same call, filtered, returns a subset of the raw results:
    declared ``within`` the raw searcher it is asked only the queries whose raw top-k held the artifact,
    and its verdicts equal searching it on every query. Control: a wrapper that hides one artifact, so its
    verdicts differ from the raw ones where it was asked."""
    rng = np.random.default_rng(3)
    ids = [f"a{i}" for i in range(200)]
    matrix = rng.normal(size=(200, 16)).astype(np.float32)
    items = [(aid, [("fragment1", matrix[i] + rng.normal(scale=0.1, size=16).astype(np.float32)),
                    ("padded_fingerprint", rng.normal(size=16).astype(np.float32))])
             for i, aid in enumerate(ids[:60])]
    hidden = {"a0"}

    def wrapper_of(calls):
        raw = exact_searcher(ids, matrix, [])

        def search(vectors, k):
            calls.append(len(vectors))
            found, cands = raw(vectors, k)
            keep = [[n for n, i in enumerate(row) if i not in hidden] for row in found]
            return [[row[n] for n in kept] for row, kept in zip(found, keep)], \
                [c[kept] for c, kept in zip(cands, keep)]
        return search

    full_calls: list[int] = []
    full = nearest_paths_many(items, {"raw": exact_searcher(ids, matrix, []), "wrapper": wrapper_of(full_calls)}, 10)
    some_calls: list[int] = []
    within = nearest_paths_many(items, {"raw": exact_searcher(ids, matrix, []), "wrapper": wrapper_of(some_calls)},
                                10, within={"wrapper": "raw"})
    assert within == full
    found = sum(p[f"raw.top40({label})"] for p in full.values() for label in ("fragment1", "padded_fingerprint"))
    assert full_calls == [120] and some_calls == [found] and 0 < found < 120
    assert full["a0"]["raw.top40(fragment1)"] and not full["a0"]["wrapper.top40(fragment1)"]  # control
    with pytest.raises(ValueError):
        nearest_paths_many(items, {"wrapper": wrapper_of([]), "raw": exact_searcher(ids, matrix, [])}, 10,
                           within={"wrapper": "raw"})


def test_probe_vectors_are_read_once_when_first_used_and_counted_without_reading():
    from tombstone.lineage.records import ArtifactRecord
    from tombstone.verify.logical import ProbeVectors, probe_count

    arts = [ArtifactRecord("s", f"a{i}", "faiss", "vector", fingerprint=(0.5,) * 32 if i else None) for i in range(3)]
    vectors = {"a0": [np.ones(4, np.float32)] * 2, "a1": [], "a2": [np.zeros(4, np.float32)]}
    reads, counted = [], []

    def read(records):
        reads.append([r.artifact_id for r in records])
        return {r.artifact_id: vectors[r.artifact_id] for r in records}

    def counts(records):
        counted.append(len(records))
        return {r.artifact_id: len(vectors[r.artifact_id]) for r in records}

    lazy = ProbeVectors(read, arts, counts)
    assert (lazy or {}) is lazy and reads == []  # the adapters' ``probe_vectors or {}`` reads nothing
    assert [probe_count(a.fingerprint, lazy, a.artifact_id) for a in arts] == [2, 1, 2]
    assert reads == [] and counted == [3]  # one count for all of them, no vector read
    assert len(lazy["a0"]) == 2 and lazy.get("a1") == [] and lazy.get("zz") is None
    assert reads == [["a0", "a1", "a2"]]  # one read for the batch, the first time a vector is asked for
    assert sorted(lazy) == ["a0", "a1", "a2"] and len(lazy) == 3 and reads == [["a0", "a1", "a2"]]
    assert [probe_count(a.fingerprint, lazy, a.artifact_id) for a in arts] == [2, 1, 2]  # from the vectors now
    assert not ProbeVectors(read, [], counts)
    plain = {"a0": vectors["a0"]}
    assert probe_count(None, plain, "a0") == 2 and probe_count([0.1], plain, "a9") == 1
