"""The logical probe's batched nearest-neighbour paths agree with the per-artifact ones, query for query,
and they cost one searcher call per batch of vectors instead of one per artifact."""

from __future__ import annotations

import numpy as np

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
