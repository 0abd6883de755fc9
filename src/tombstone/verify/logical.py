"""The logical level: does any query path the store offers still return the artifact?

The stage asks the adapter's ``probe_logical`` (every read path the wrapper knows, raw and wrapped),
handing it the fragment probe vectors captured at write time when the verifier has them (the saga does;
an independent auditor does not). The helpers below are shared by the vector stores' probes: the probe
vector set, top-k and MMR over the same candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tombstone.capabilities import Capability
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext

TOP_K = 40
MMR_K = 10
MMR_LAMBDA = 0.5


def padded_fingerprint(fingerprint: Sequence[float], dim: int) -> np.ndarray:
    """The 32-dim fingerprint padded with zeros to the store's dimension: a weak but free probe."""
    out = np.zeros(dim, dtype=np.float32)
    fp = np.asarray(fingerprint, dtype=np.float32)[:dim]
    out[: len(fp)] = fp
    return out


def probe_set(fingerprint: Sequence[float] | None, probe_vectors: Sequence[np.ndarray], dim: int) -> list[tuple[str, np.ndarray]]:
    """Every vector the logical probe queries with, labelled for the evidence."""
    out = [(f"fragment{i + 1}", np.asarray(v, dtype=np.float32)) for i, v in enumerate(probe_vectors)]
    if fingerprint is not None:
        out.append(("padded_fingerprint", padded_fingerprint(fingerprint, dim)))
    return out


def mmr_select(query: np.ndarray, candidates: np.ndarray, k: int = MMR_K, lambda_: float = MMR_LAMBDA) -> list[int]:
    """Maximal marginal relevance over ``candidates`` (rows); returns the chosen row indices in order."""
    if len(candidates) == 0:
        return []

    def unit(x: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        return x / np.where(norms == 0, 1, norms)

    cand = unit(np.asarray(candidates, dtype=np.float64))
    relevance = cand @ unit(np.asarray(query, dtype=np.float64))
    chosen: list[int] = []
    while len(chosen) < min(k, len(cand)):
        if chosen:
            redundancy = (cand @ cand[chosen].T).max(axis=1)
        else:
            redundancy = np.zeros(len(cand))
        score = lambda_ * relevance - (1 - lambda_) * redundancy
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
    return chosen


def mmr_select_many(queries: np.ndarray, candidates: Sequence[np.ndarray], k: int = MMR_K,
                    lambda_: float = MMR_LAMBDA) -> list[list[int]]:
    """``mmr_select`` for many queries at once, each with its own candidates (row counts may differ): the
    same choices, in the same order, computed for all of them together."""
    sizes = [len(c) for c in candidates]
    width = max(sizes, default=0)
    if width == 0:
        return [[] for _ in candidates]
    dim = max((np.asarray(c).shape[-1] for c in candidates if len(c)), default=0)
    n = len(candidates)

    def unit(x: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        return x / np.where(norms == 0, 1, norms)

    cand = np.zeros((n, width, dim))
    for i, c in enumerate(candidates):
        if len(c):
            cand[i, : len(c)] = unit(np.asarray(c, dtype=np.float64))
    valid = np.arange(width)[None, :] < np.asarray(sizes)[:, None]
    relevance = np.einsum("nkd,nd->nk", cand, unit(np.asarray(queries, dtype=np.float64)))
    redundancy = np.zeros((n, width))
    taken = ~valid
    chosen = np.zeros((n, min(k, width)), dtype=np.int64)
    rows = np.arange(n)
    for step in range(min(k, width)):
        score = lambda_ * relevance - (1 - lambda_) * (redundancy if step else 0.0)
        score = np.where(taken, -np.inf, score)
        pick = np.argmax(score, axis=1)
        chosen[:, step] = pick
        taken[rows, pick] = True
        here = np.einsum("nkd,nd->nk", cand, cand[rows, pick])  # each candidate against the one just chosen
        redundancy = here if step == 0 else np.maximum(redundancy, here)
    return [chosen[i, : min(k, size)].tolist() for i, size in enumerate(sizes)]


Searcher = ("Callable[[np.ndarray, int], tuple[list[list[str]], "
            "list[np.ndarray] | Callable[[list[int]], list[np.ndarray]]]]")


def nearest_paths(artifact_id: str, queries: list[tuple[str, np.ndarray]], searchers: dict, k: int) -> dict[str, bool]:
    """Run every probe vector through every searcher (top-k, then MMR over those k) in one batch each.

    ``searchers`` maps a path name to ``search(vectors, k) -> (ids per query, candidate vectors per
    query)``; the candidate vectors may instead be a function of the query rows that need them. Returns ``{"<path>.top<k>(<probe>)": hit, "<path>.mmr(<probe>)": hit, ...}``.
    """
    paths: dict[str, bool] = {}
    if not queries or k <= 0:
        return paths
    vectors = np.stack([v for _, v in queries]).astype(np.float32)
    for name, search in searchers.items():
        ids_per_query, candidates = search(vectors, k)
        for q, (label, vec) in enumerate(queries):
            ids = list(ids_per_query[q])
            paths[f"{name}.top{TOP_K}({label})"] = artifact_id in ids
            # MMR picks among the top-k: it can return the artifact only where the top-k holds it
            chosen = mmr_select(vec, np.asarray(candidate_vectors(candidates, [q])[0])) if artifact_id in ids else []
            paths[f"{name}.mmr({label})"] = artifact_id in [ids[i] for i in chosen]
    return paths


BATCH_QUERIES = 512
"""Probe vectors per searcher call when many artifacts are probed together."""


def nearest_paths_many(items: Sequence[tuple[str, list[tuple[str, np.ndarray]]]], searchers: dict, k: int,
                       batch: int = BATCH_QUERIES, within: Mapping[str, str] | None = None) -> dict[str, dict[str, bool]]:
    """``nearest_paths`` for many artifacts at once: the probe vectors of all of them go through each searcher
    in calls of up to ``batch`` vectors (one call per batch and path, not one per artifact and path). Returns
    each artifact's paths, exactly as ``nearest_paths`` would for it alone.

    ``within`` maps a searcher to an earlier one whose top-k holds everything it can return for the same
    query (a wrapper whose query is the raw store's same call, filtered): it is asked only the queries whose
    top-k there held the artifact, and the others are misses on both its paths, as its search would find."""
    out: dict[str, dict[str, bool]] = {aid: {} for aid, _ in items}
    if k <= 0:
        return out
    flat = [(aid, label, vec) for aid, queries in items for label, vec in queries]
    if not flat:
        return out
    within = dict(within or {})
    for name, search in searchers.items():
        rows = flat
        outer = within.get(name)
        if outer is not None:
            if outer not in searchers or list(searchers).index(outer) > list(searchers).index(name):
                raise ValueError(f"searcher {name!r} is within {outer!r}, which must be searched before it")
            rows = [row for row in flat if out[row[0]][f"{outer}.top{TOP_K}({row[1]})"]]
            for aid, label, _ in flat:
                out[aid][f"{name}.top{TOP_K}({label})"] = False
                out[aid][f"{name}.mmr({label})"] = False
        for start in range(0, len(rows), batch):
            part = rows[start:start + batch]
            vectors = np.stack([v for _, _, v in part]).astype(np.float32)
            ids_per_query, candidates = search(vectors, k)
            # MMR picks among the top-k, so it can return the artifact only where the top-k holds it: only
            # those queries need the candidates' vectors and the selection (after an erasure, usually none)
            holding = [q for q, (aid, _, _) in enumerate(part) if aid in ids_per_query[q]]
            picks: dict[int, list[int]] = {}
            if holding:
                vecs = candidate_vectors(candidates, holding)
                picks = dict(zip(holding, mmr_select_many(vectors[holding], [np.asarray(v) for v in vecs])))
            for q, (aid, label, vec) in enumerate(part):
                ids = list(ids_per_query[q])
                paths = out[aid]
                paths[f"{name}.top{TOP_K}({label})"] = aid in ids
                paths[f"{name}.mmr({label})"] = q in picks and aid in [ids[i] for i in picks[q]]
    return out


def candidate_vectors(candidates: Any, rows: list[int]) -> list[np.ndarray]:
    """The candidates' vectors of the given query rows: a searcher returns them as a list (one array per
    query) or as a function of the rows, called only when some row needs them."""
    if callable(candidates):
        return list(candidates(rows))
    return [candidates[q] for q in rows]


class ProbeVectors(Mapping[str, Sequence[np.ndarray]]):
    """The probe vectors of the artifacts one probe call is about, keyed by artifact id, read from the lineage
    db in one go when first asked for. A probe that searches none of them (FAISS, once its id map no longer
    holds the ids) reads none; ``count(id)`` says how many an artifact has without reading them."""

    def __init__(self, read: Callable[[Sequence[ArtifactRecord]], Mapping[str, Sequence[np.ndarray]]],
                 artifacts: Sequence[ArtifactRecord],
                 counts: Callable[[Sequence[ArtifactRecord]], Mapping[str, int]] | None = None) -> None:
        self._read, self._counts = read, counts
        self._artifacts = list(artifacts)
        self._vectors: dict[str, Sequence[np.ndarray]] | None = None
        self._counted: dict[str, int] | None = None

    def _all(self) -> dict[str, Sequence[np.ndarray]]:
        if self._vectors is None:
            self._vectors = dict(self._read(self._artifacts))
        return self._vectors

    def __getitem__(self, artifact_id: str) -> Sequence[np.ndarray]:
        return self._all()[artifact_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __bool__(self) -> bool:  # ``probe_vectors or {}`` must not read them
        return bool(self._artifacts)

    def count(self, artifact_id: str) -> int:
        if self._vectors is None and self._counts is not None:
            if self._counted is None:
                self._counted = dict(self._counts(self._artifacts))
            return self._counted.get(artifact_id, 0)
        return len(self._all().get(artifact_id, ()))


def probe_count(fingerprint: Sequence[float] | None, probe_vectors: Mapping[str, Sequence[Any]],
                artifact_id: str) -> int:
    """How many vectors ``probe_set`` would query with for the artifact, reading none where the mapping can
    count them (:class:`ProbeVectors`)."""
    count = getattr(probe_vectors, "count", None)
    fragments = count(artifact_id) if callable(count) else len(probe_vectors.get(artifact_id, ()))
    return fragments + (fingerprint is not None)


def paths_result(paths: Mapping[str, bool], probe_vectors: int, not_searched: str | None = None) -> Any:
    """The logical level's result of one artifact from the read paths asked (path -> returned it): passed when
    none returned it; ``not_searched`` says why no nearest-neighbour search was asked (none could return it)."""
    from tombstone.verify.result import ProbeResult

    returned = sorted(p for p, hit in paths.items() if hit)
    evidence: dict[str, Any] = {"paths": sorted(paths), "returned_by": returned, "probe_vectors": probe_vectors}
    if not_searched:
        evidence["nearest_neighbours"] = f"not searched: {not_searched}"
    return ProbeResult(level=Level.LOGICAL, passed=not returned,
                       measurement=f"returned by {', '.join(returned)}" if returned else None, evidence=evidence)


def fit_dim(vector: np.ndarray, dim: int) -> np.ndarray:
    """Truncate or zero-pad a probe vector to the store's dimension."""
    v = np.asarray(vector, dtype=np.float32)
    return v[:dim] if len(v) >= dim else np.pad(v, (0, dim - len(v)))


class LogicalStage:
    """The logical level as a stage of the verification pipeline."""

    level = Level.LOGICAL
    capability = Capability.LOGICAL_PROBE

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        return f"{adapter.backend} declares no logical probe"

    def run(self, ctx: "VerifyContext", adapter: Any, artifacts: Sequence[ArtifactRecord]):
        from tombstone.verify.runner import StageOutput

        vectors = ProbeVectors(ctx.probe_vectors, artifacts, ctx.probe_counts) if ctx.probe_vectors is not None else None
        return StageOutput(outcomes=dict(ctx.call(lambda: adapter.probe_logical(artifacts, vectors))))


STAGE = LogicalStage()
