"""The measurement behind the semantic level: neighbourhood drift, its snapshot, its controls, its test.

An artifact's **probe queries** are its own vector (fetched from the store) and, for each fragment probe
captured at write time, the fragment's direction anchored on the artifact (the normalised sum of the two
unit vectors, scaled to the artifact's norm), plus the same for the mean of the fragments: up to five
questions that the artifact itself answers first. (A bare eight-word fragment usually finds other chunks
that share its words before the chunk it came from, and then its Top-5 barely moves when the chunk goes:
RESULTS.md measures both.)

The **drift** of a probe is the cosine distance between the centroid of its Top-5 before the artifact was
removed and after, each neighbour's unit vector weighted by 1/rank² (normalised): the answer a retriever
gives is dominated by its first results, and an echo is a neighbour that takes the erased artifact's first
place. A clean deletion leaves a hole the size of a normal same-cluster deletion; a *smaller* hole — the
neighbourhood still answers as if the artifact were there — is the echo.

**Controls** are live artifacts of other subjects near the erased one, chosen when the snapshot is taken
(before suppression): their removal is simulated by filtering them out of the results (nothing is deleted),
with every artifact of the batch filtered out too, and their drifts under their own probe queries are the
reference distribution. The target's drift is measured after reclaim, on the store itself. The size of a
hole depends most on how close the neighbours are that take the deleted artifact's place, so the controls
are **matched** on it: among the ``POOL`` nearest candidates, those whose nearest surviving neighbour is
about as close to them as the erased artifact's is to it. In a corpus of templated documents (forms, support
notes that differ in a name, a date, an amount) an artifact with another subject's near-twin leaves a small
hole whether or not anything of it survives; ranked among ordinary neighbours it would be called an echo
far more often than the test's level. The price: an echo no closer to the artifact than the corpus's own
near-twins are to theirs is no longer told from one (RESULTS.md measures both).

The **decision** is a rank test of the target's mean drift among the controls' (``scipy.stats.mannwhitneyu``,
one-sided) together with a bootstrap confidence interval of that mean over its probe queries
(``scipy.stats.bootstrap``, one call for a batch's artifacts with as many probe queries, its resamples seeded
from that number, so that an artifact's interval depends on its drifts alone and a resumed saga decides the
same). Below
the controls at ``ALPHA`` with the interval's upper end under the controls' median: an echo.

Nothing here names a backend: adapters answer :meth:`tombstone.contract.Adapter.semantic_neighbours` and
:meth:`tombstone.contract.Adapter.stored_vectors`.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

TOP = 5
"""How many neighbours make a probe's answer."""
CONTROLS = 20
"""How many same-cluster controls are chosen."""
MIN_CONTROLS = 19
"""Fewer controls cannot put the target's rank below ``ALPHA`` (the smallest p is 1/(controls + 1))."""
MIN_PROBES = 1
"""Fewer usable probe queries than this and the artifact is not testable (with one, its bootstrap interval is
its single drift, and the rank test alone decides: a vector written without text has no fragment probes)."""
ALPHA = 0.05
"""Significance of the rank test."""
CONFIDENCE = 0.95
"""Confidence level of the bootstrap interval."""
RESAMPLES = 2000
"""Bootstrap resamples."""
POOL = 5 * CONTROLS
"""How many live artifacts of other subjects nearest to the erased one are the candidates its controls are
matched from (in the first round)."""
CANDIDATE_ROUNDS = 4
"""How many times the search for controls widens (×2 each) before it gives up."""
VERSION = 1
"""Layout version of a stored snapshot."""


@dataclass
class Neighbours:
    """What a store returned for one query: ids in rank order, the store's own distances (or scores) and
    the stored vectors, one row per id."""

    ids: list[str]
    distances: list[float]
    vectors: np.ndarray
    exact: bool = False
    """Ranked exactly (every stored vector scored): the same question asked again gets the same answer."""

    def __post_init__(self) -> None:
        vectors = np.asarray(self.vectors, dtype=np.float32)
        self.vectors = vectors.reshape(len(self.ids), -1) if self.ids else vectors.reshape(0, vectors.shape[-1] if vectors.ndim > 1 else 0)

    def rows_at(self, positions: Sequence[int]) -> np.ndarray:
        """The stored vectors of the rows at ``positions``, in that order (``vectors[positions]``): a result
        that gathers its vectors only when read (an exact ranking's) gathers just these."""
        return self.vectors[list(positions)]


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True))  # what np.linalg.norm(x, axis=-1) computes
    return x / np.where(norms == 0, 1, norms)


@lru_cache(maxsize=None)
def _rank_weights(n: int) -> np.ndarray:
    w = 1.0 / np.arange(1, min(n, TOP) + 1) ** 2
    w = w / w.sum()
    w.flags.writeable = False
    return w


def rank_weights(n: int) -> np.ndarray:
    """1/rank² for the first ``n`` ranks (at most ``TOP``), normalised."""
    return _rank_weights(min(n, TOP))


def centroid(vectors: np.ndarray) -> np.ndarray:
    """The rank-weighted centroid of the unit vectors of a Top-5 (rows in rank order)."""
    rows = np.asarray(vectors)
    return _centroids([rows], rows.reshape(len(rows), -1).shape[1] if rows.ndim == 2 else 0)[0]


def drift(before: np.ndarray, after: np.ndarray) -> float:
    """Cosine distance between the rank-weighted centroids of a Top-5 before and after."""
    return drifts([(before, after)])[0]


def _centroids(tops: Sequence[np.ndarray], dim: int) -> np.ndarray:
    """:func:`centroid` of many Top-5s at once (rows padded with zeros, which weigh nothing)."""
    rows = np.zeros((len(tops), TOP, dim))
    weights = np.zeros((len(tops), TOP))
    for n, top in enumerate(tops):
        top = np.asarray(top)[:TOP]
        if len(top):
            rows[n, : len(top)] = top.reshape(len(top), -1)[:, :dim]
            weights[n, : len(top)] = rank_weights(len(top))
    norms = np.sqrt(np.einsum("nid,nid->ni", rows, rows))
    return np.einsum("ni,nid->nd", weights / np.where(norms == 0, 1, norms), rows)


def drifts(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """:func:`drift` of each (before, after) pair of Top-5s, computed together."""
    if not pairs:
        return []
    dim = max([np.asarray(t).reshape(len(t), -1).shape[1] for pair in pairs for t in pair if len(t)], default=0)
    a = _centroids([b for b, _ in pairs], dim)
    b = _centroids([x for _, x in pairs], dim)
    # the norms as np.linalg.norm takes a vector's: the square root of its dot product with itself
    na, nb = np.sqrt(np.einsum("nd,nd->n", a, a)), np.sqrt(np.einsum("nd,nd->n", b, b))
    dots = np.einsum("nd,nd->n", a, b)
    out = []
    for x, y, dot in zip(na.tolist(), nb.tolist(), dots.tolist()):
        if x == 0 or y == 0:
            out.append(0.0 if x == y else 1.0)
            continue
        d = 1.0 - dot / (x * y)
        out.append(0.0 if d < 1e-9 else float(min(2.0, d)))  # the same Top-5 in float64: rounding, not drift
    return out


def fit(vector: np.ndarray, dim: int) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64).ravel()
    return v[:dim] if len(v) >= dim else np.pad(v, (0, dim - len(v)))


def probe_queries(own: np.ndarray, fragments: Sequence[np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """The artifact's probe queries: its own vector; each fragment probe anchored on it; the fragments'
    mean anchored on it (when there are several). Labels name them in the evidence."""
    own = np.asarray(own, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(own)) or 1.0
    u = own / norm
    out = [("own vector", own.astype(np.float32))]
    if not len(fragments):
        return out
    # every fragment's row at once: each row is computed on its own, the same numbers as one at a time
    units = unit(np.stack([fit(f, len(own)) for f in fragments]))
    anchored = (norm * unit(u + units)).astype(np.float32)
    out += [(f"fragment {i + 1}", row) for i, row in enumerate(anchored)]
    if len(units) > 1:
        out.append(("fragments' mean", (norm * unit(u + unit(np.mean(units, axis=0)))).astype(np.float32)))
    return out


def seed_of(name: str) -> int:
    """A seed derived from a name (the bootstrap's: from its number of probe queries), so a resumed saga
    draws the same resamples."""
    return int.from_bytes(hashlib.sha256(f"tombstone-semantic/{name}".encode()).digest()[:8], "little")


# -- snapshot ---------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What was measured of one artifact's neighbourhood before suppression (``meta`` is JSON-able; the
    arrays are stored as float32 bytes)."""

    meta: dict[str, Any]
    queries: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    """One row per usable probe query."""
    baselines: list[np.ndarray] = field(default_factory=list)
    """Per usable probe, the Top-5's vectors in rank order (the artifact's own among them)."""

    def encode(self) -> tuple[dict[str, Any], bytes]:
        """``meta`` with the arrays' layout, and the arrays' float32 bytes: the queries, then each distinct row
        of the baselines once (an artifact's probes mostly find the same Top-5: stored once, not once a probe),
        the layout naming each baseline's rows by their place among them."""
        meta = dict(self.meta)
        queries = np.asarray(self.queries, dtype="<f4")
        place: dict[bytes, int] = {}
        rows: list[bytes] = []
        baseline_rows = []
        for baseline in self.baselines:
            named = []
            for row in np.asarray(baseline, dtype="<f4"):
                key = row.tobytes()
                if key not in place:
                    place[key] = len(rows)
                    rows.append(key)
                named.append(place[key])
            baseline_rows.append(named)
        meta["layout"] = {"queries": list(queries.shape), "rows": len(rows), "baseline_rows": baseline_rows}
        return meta, queries.tobytes() + b"".join(rows)

    @classmethod
    def decode(cls, meta: dict[str, Any], blob: bytes) -> Snapshot:
        layout = meta.get("layout") or {"queries": [0, 0], "baselines": []}
        n, dim = layout["queries"]
        flat = np.frombuffer(blob, dtype="<f4")
        queries = flat[: n * dim].reshape(n, dim)
        baselines, at = [], n * dim
        if "baseline_rows" in layout:
            distinct = flat[at : at + layout["rows"] * dim].reshape(layout["rows"], dim)
            baselines = [distinct[np.asarray(named, dtype=np.intp)].reshape(len(named), dim)
                         for named in layout["baseline_rows"]]
        else:  # every baseline's rows in turn (snapshots recorded before the rows were stored once)
            for rows in layout["baselines"]:
                baselines.append(flat[at : at + rows * dim].reshape(rows, dim))
                at += rows * dim
        return cls(meta, queries, baselines)


def _search(adapter: Any, call: Callable, queries: Sequence[np.ndarray], k: int, exclude: Iterable[str]) -> list[Neighbours]:
    if not len(queries):
        return []
    vectors = np.stack([np.asarray(q, dtype=np.float32) for q in queries])
    exclude = frozenset(exclude)
    return list(call(lambda: adapter.semantic_neighbours(vectors, k, exclude)))


def first_extra(k: int) -> int:
    """How many rows past ``k`` the first ask of a batch's own searches takes (see :func:`_search_each`)."""
    return 4 * k + 16


def _search_each(adapter: Any, call: Callable, asked: Mapping[str, Sequence[tuple[str, np.ndarray]]], k: int,
                 erased: set[str]) -> dict[str, list[Neighbours]]:
    """For each erased artifact's queries, their ``k`` nearest records with every *other* erased artifact left
    out (the artifact itself stays in: its rank is what is measured). One search for all of them: the store
    leaves out the erased artifacts not asked about, and each row drops the other asked ones here."""
    order = [(aid, q) for aid, queries in asked.items() for _, q in queries]
    asking = set(asked)
    extra = max(0, len(asking) - 1)  # the other asked artifacts a row may hold, dropped below
    # A first ask a few times k deep; only a row that the other asked artifacts leave short of k is asked
    # again, for k plus all of them (in a batch that erases most of a store, most rows are short).
    first = k + min(extra, first_extra(k))
    results = _search(adapter, call, [q for _, q in order], first, erased - asking)

    def kept(aid: str, res: Neighbours) -> list[int]:
        return [n for n, i in enumerate(res.ids) if i == aid or i not in asking][:k]

    keeps = [kept(aid, res) for (aid, _), res in zip(order, results)]
    short = [n for n, res in enumerate(results) if first < k + extra and len(res.ids) == first and len(keeps[n]) < k]
    if short:
        for n, res in zip(short, _search(adapter, call, [order[n][1] for n in short], k + extra, erased - asking)):
            results[n], keeps[n] = res, kept(order[n][0], res)
    out: dict[str, list[Neighbours]] = {aid: [] for aid in asked}
    for (aid, _), res, keep in zip(order, results, keeps):
        out[aid].append(Neighbours([res.ids[n] for n in keep], [res.distances[n] for n in keep], res.rows_at(keep),
                                   res.exact))
    return out


def _control_drifts(results: Sequence[Neighbours], control: str) -> list[tuple[int, float, list[str]]]:
    """For each probe of a control whose Top-5 holds it: (its rank, the drift of removing it, the Top-5)."""
    found = [res for res in results if control in res.ids[:TOP]]
    moved = iter(drifts([(res.vectors[:TOP], res.vectors[[i for i, aid in enumerate(res.ids) if aid != control][:TOP]])
                         for res in found]))
    return [(res.ids[:TOP].index(control) + 1, next(moved), res.ids[:TOP]) if control in res.ids[:TOP] else None
            for res in results]


def take_snapshots(adapter: Any, artifacts: Sequence[Any], *, probe_vectors: Callable[[Sequence[Any]], Mapping[str, Sequence[Any]]],
                   artifact: Callable[[str, str], Any], call: Callable = lambda action: action(),
                   artifacts_many: Callable[[Iterable[tuple[str, str]]], Mapping[tuple[str, str], Any]] | None = None,
                   matched: bool = True) -> dict[str, Snapshot]:
    """Measure, before suppression, the neighbourhood of every artifact of one store that a batch erases.

    ``probe_vectors`` gives the fragment probes of artifact records (the lineage db's); ``artifact(store, id)``
    the lineage record of an id, or ``artifacts_many`` those of many (store, id) pairs at once (to choose
    controls: live artifacts of subjects not being erased); ``call`` runs each store operation (the saga's
    retries). ``matched``: choose the controls matched on how close their nearest surviving neighbours are
    (:func:`_choose_controls`); False: the nearest ones (the choice before that calibration, kept so the
    benchmark can compare the two on the same data). Returns one :class:`Snapshot` per artifact; its ``meta["outcome"]`` is
    ``measured``, ``not testable``, ``too few controls`` or ``not in the store``.
    """
    erased = {a.artifact_id for a in artifacts}
    erasing_subjects = {a.subject_key for a in artifacts}
    own = dict(call(lambda: adapter.stored_vectors(sorted(erased))))
    fragments = probe_vectors(list(artifacts))
    out: dict[str, Snapshot] = {}
    pending: dict[str, tuple[dict[str, Any], list[np.ndarray], list[np.ndarray]]] = {}
    asked: dict[str, list[tuple[str, np.ndarray]]] = {}
    for art in artifacts:
        aid = art.artifact_id
        if aid not in own:
            out[aid] = Snapshot({"version": VERSION, "outcome": "not in the store",
                                 "why": "the store did not hold it when the saga began"})
            continue
        asked[aid] = probe_queries(own[aid], fragments.get(aid, []))
    # every artifact's probe queries in one search, asked twice (the repeat measures the store's own noise;
    # a store that ranked every answer exactly gives the same again, and is not asked)
    firsts = _search_each(adapter, call, asked, TOP, erased)
    exact = all(res.exact for results in firsts.values() for res in results)
    agains = firsts if exact else _search_each(adapter, call, asked, TOP, erased)
    repeats = iter(drifts([] if exact else [(res.vectors[:TOP], res2.vectors[:TOP]) for aid in asked
                                            for res, res2 in zip(firsts[aid], agains[aid]) if aid in res.ids[:TOP]]))
    for aid, queries in asked.items():
        first = firsts[aid]
        probes, kept_queries, baselines, unusable, repeat = [], [], [], [], []
        for (label, q), res in zip(queries, first):
            top = res.ids[:TOP]
            if aid not in top:
                unusable.append(label)
                continue
            probes.append({"label": label, "rank": top.index(aid) + 1, "ids": top,
                           "distances": [round(float(d), 6) for d in res.distances[:TOP]]})
            kept_queries.append(q)
            baselines.append(res.vectors[:TOP])
            repeat.append(0.0 if exact else next(repeats))
        meta: dict[str, Any] = {"version": VERSION, "probes": probes, "unusable": unusable,
                                "queries_asked": len(queries), "noise_floor_repeat": max(repeat, default=0.0),
                                "nearest_similarity": nearest_similarity(own[aid], first[0], aid) if first else None}
        if len(probes) < MIN_PROBES:
            meta.update(outcome="not testable",
                        why=f"it is in its own Top-{TOP} for {len(probes)} of its {len(queries)} probe queries"
                            + (": its removal leaves no hole to measure" if not probes
                               else f", fewer than the {MIN_PROBES} a measurement needs"))
            out[aid] = Snapshot(meta)
            continue
        pending[aid] = (meta, kept_queries, baselines)
    lookup = _lookup(adapter.store, artifact, artifacts_many)
    chosen = _choose_controls(adapter, call, {aid: (own[aid], meta["nearest_similarity"]) for aid, (meta, _, _) in pending.items()},
                              erased, erasing_subjects, lookup, probe_vectors, matched)
    for aid, (meta, kept_queries, baselines) in pending.items():
        controls = chosen[aid]
        meta["controls"] = controls
        meta["controls_chosen"] = MATCHED if matched else NEAREST
        if len(controls) < MIN_CONTROLS:
            meta.update(outcome="too few controls",
                        why=f"the store holds {len(controls)} live artifacts of other subjects whose own probes"
                            f" find them, near this one; the rank test needs at least {MIN_CONTROLS}")
            out[aid] = Snapshot(meta)
            continue
        meta["outcome"] = "measured"
        out[aid] = Snapshot(meta, np.stack(kept_queries).astype(np.float32), baselines)
    return out


MATCHED = "matched on how close their nearest surviving neighbour is"
NEAREST = "nearest"


def nearest_similarity(vector: np.ndarray, res: Neighbours, self_id: str) -> float | None:
    """Cosine similarity between ``vector`` and the first result of ``res`` that is not ``self_id``: how close
    the neighbour is that takes its place when it goes (what the size of the hole depends on most); None
    when the store returned no other."""
    for aid, row in zip(res.ids, res.vectors):
        if aid != self_id:
            a, b = np.asarray(vector, dtype=np.float64).ravel(), np.asarray(row, dtype=np.float64).ravel()
            norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
            return round(float(a @ b) / norms, 6) if norms else 0.0
    return None


def similarity_gap(a: float | None, b: float | None) -> float:
    """How far apart two artifacts' nearest-neighbour similarities are (inf when one is unknown)."""
    return math.inf if a is None or b is None else abs(a - b)


def _lookup(store: str, artifact: Callable, artifacts_many: Callable | None) -> Callable[[Sequence[str]], dict[str, Any]]:
    """The lineage records of many ids of ``store`` (one query where the lineage answers many at once)."""
    if artifacts_many is not None:
        return lambda ids: {aid: rec for (_, aid), rec in artifacts_many([(store, i) for i in ids]).items()}
    return lambda ids: {aid: rec for aid in ids if (rec := artifact(store, aid)) is not None}


def _similarities(adapter: Any, call: Callable, ids: Sequence[str], erased: set[str]) -> dict[str, float | None]:
    """Each id's nearest surviving neighbour's similarity (every erased artifact filtered out): one fetch of
    their vectors and one batched query for all of them."""
    if not ids:
        return {}
    own = dict(call(lambda: adapter.stored_vectors(list(ids))))
    asked = [i for i in ids if i in own]
    results = _search(adapter, call, [own[i] for i in asked], 2, erased)
    return {i: nearest_similarity(own[i], res, i) for i, res in zip(asked, results)}


def _measure_controls(adapter: Any, call: Callable, records: Sequence[Any], erased: set[str],
                      probe_vectors: Callable) -> dict[str, dict[str, Any] | None]:
    """Each candidate's removal simulated by filtering it out (with every erased artifact): its usable probe
    queries, their ranks and drifts; None for one its own probes do not find. One batched query."""
    own = dict(call(lambda: adapter.stored_vectors([r.artifact_id for r in records])))
    frags = probe_vectors([r for r in records if r.artifact_id in own])
    asked: list[tuple[str, str, np.ndarray]] = []
    for rec in records:
        if rec.artifact_id in own:
            asked += [(rec.artifact_id, label, q)
                      for label, q in probe_queries(own[rec.artifact_id], frags.get(rec.artifact_id, []))]
    results = _search(adapter, call, [q for _, _, q in asked], TOP + 1, erased)
    by_control: dict[str, list] = {}
    for (cid, label, _), res in zip(asked, results):
        by_control.setdefault(cid, []).append((label, res))
    out: dict[str, dict[str, Any] | None] = {}
    for rec in records:
        cid = rec.artifact_id
        out[cid] = None
        if cid not in by_control:
            continue
        labels = [label for label, _ in by_control[cid]]
        measured = _control_drifts([res for _, res in by_control[cid]], cid)
        usable = [(label, m) for label, m in zip(labels, measured) if m is not None]
        if len(usable) < MIN_PROBES:
            continue
        own_top = measured[0][2] if measured[0] is not None else by_control[cid][0][1].ids[:TOP]
        out[cid] = {"id": cid, "labels": [label for label, _ in usable], "ranks": [m[0] for _, m in usable],
                    "drifts": [m[1] for _, m in usable], "own_baseline": own_top}
    return out


def _choose_controls(adapter: Any, call: Callable, targets: Mapping[str, tuple[np.ndarray, float | None]], erased: set[str],
                     erasing: set[str], lookup: Callable[[Sequence[str]], dict[str, Any]], probe_vectors: Callable,
                     matched: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Per erased artifact (``targets``: its vector and its nearest surviving neighbour's similarity), the
    ``CONTROLS`` live artifacts of other subjects whose own probes find them, with their drifts.

    Matched (the default): among the ``POOL`` nearest to it, those whose own nearest surviving neighbour is
    about as close as its own (smallest difference of the two similarities first, nearer ones first among
    equals). The hole a deletion leaves depends most on how close the neighbour is that takes the deleted
    artifact's place: in a corpus of templated documents an artifact with another subject's near-twin
    leaves a small hole whether or not anything of it survives, and ranked among ordinary neighbours it
    would be called an echo far more often than the test's level. Unmatched: the nearest ones.

    Batched across the targets: one query for every target's neighbourhood, one for the candidates'
    similarities and one per round of control measurements; a candidate shared by several targets is
    measured once. The search widens (×2) up to ``CANDIDATE_ROUNDS`` times for a target short of controls."""
    chosen: dict[str, list[dict[str, Any]]] = {aid: [] for aid in targets}
    tried: dict[str, set[str]] = {aid: set() for aid in targets}
    records: dict[str, Any] = {}
    similarity: dict[str, float | None] = {}
    measured: dict[str, dict[str, Any] | None] = {}
    fetch = POOL if matched else 3 * CONTROLS
    open_targets = list(targets)
    for _ in range(CANDIDATE_ROUNDS):
        if not open_targets:
            break
        nears = _search(adapter, call, [targets[aid][0] for aid in open_targets], fetch, erased)
        fresh = sorted({i for near in nears for i in near.ids} - records.keys())
        found = lookup(fresh)
        records.update({i: found.get(i) for i in fresh})
        eligible = {i for i in fresh if records[i] is not None and records[i].state == "live"
                    and records[i].subject_key not in erasing}
        if matched:
            similarity.update(_similarities(adapter, call, sorted(eligible - similarity.keys()), erased))
        queues: dict[str, list[str]] = {}
        for aid, near in zip(open_targets, nears):
            candidates = [i for i in near.ids if records.get(i) is not None and records[i].state == "live"
                          and records[i].subject_key not in erasing and i not in tried[aid]]
            own_similarity = targets[aid][1]
            if matched and own_similarity is not None:
                position = {i: n for n, i in enumerate(candidates)}
                candidates.sort(key=lambda i: (similarity_gap(similarity.get(i), own_similarity), position[i]))
            queues[aid] = candidates
        while True:
            # each target's next few candidates (a few more than it still needs: some may not be usable)
            batches = {}
            for aid, queue in queues.items():
                need = CONTROLS - len(chosen[aid])
                if need > 0 and queue:
                    batches[aid], queues[aid] = queue[: need + 2], queue[need + 2 :]
            if not batches:
                break
            todo = sorted({i for batch in batches.values() for i in batch} - measured.keys())
            if todo:
                measured.update(_measure_controls(adapter, call, [records[i] for i in todo], erased, probe_vectors))
            for aid, batch in batches.items():
                for cid in batch:
                    tried[aid].add(cid)
                    if measured.get(cid) is not None and len(chosen[aid]) < CONTROLS:
                        entry = dict(measured[cid])
                        if matched:
                            entry["similarity"] = similarity.get(cid)
                        chosen[aid].append(entry)
        open_targets = [aid for aid, near in zip(open_targets, nears)
                        if len(chosen[aid]) < CONTROLS and len(near.ids) >= fetch]
        fetch *= 2
    return chosen


# -- decision ---------------------------------------------------------------------------------


@dataclass
class Decision:
    """The target's measurement against its controls."""

    echo: bool
    """Significantly below the controls: the neighbourhood still answers as if the artifact were there."""
    drift: float
    """The target's mean drift over its usable probe queries."""
    ci: tuple[float, float]
    """Bootstrap confidence interval of that mean over the probe queries."""
    p: float
    """One-sided Mann-Whitney p of the target's drift below the controls'."""
    rank: int
    """The target's place among itself and the controls, smallest drift first (1 = below every control)."""
    control_drifts: list[float]
    """Each control's mean drift."""


def decide(drifts: Sequence[float], control_drifts: Sequence[float]) -> Decision:
    """The rank test and the bootstrap interval (see the module docstring) for one artifact."""
    return decide_many([(drifts, control_drifts)])[0]


def decide_many(measurements: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[Decision]:
    """:func:`decide` for many artifacts, each ``(drifts, control_drifts)``: one bootstrap call for all those
    with as many probe queries, one rank test for all those with as many controls.

    The resamples are drawn from a generator seeded by the number of probe queries alone, so an artifact's
    interval depends on its drifts only: the same in a batch as alone, and again when a saga resumes."""
    from scipy import stats

    ds = [np.asarray(d, dtype=np.float64) for d, _ in measurements]
    cs = [np.asarray(c, dtype=np.float64) for _, c in measurements]
    means = np.asarray([float(d.mean()) for d in ds])
    lo, hi, p = means.copy(), means.copy(), np.ones(len(ds))
    by_probes: dict[int, list[int]] = {}
    by_controls: dict[int, list[int]] = {}
    for n, (d, c) in enumerate(zip(ds, cs)):
        if np.ptp(d) > 0:  # a degenerate sample (all probes equal) gives its single value
            by_probes.setdefault(len(d), []).append(n)
        if len(c):
            by_controls.setdefault(len(c), []).append(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for size, rows in by_probes.items():
            interval = stats.bootstrap((np.stack([ds[n] for n in rows]),), np.mean, confidence_level=CONFIDENCE,
                                       n_resamples=RESAMPLES, method="percentile", axis=-1,
                                       rng=np.random.default_rng(seed_of(f"bootstrap:{size}")))
            lo[rows] = np.atleast_1d(interval.confidence_interval.low)
            hi[rows] = np.atleast_1d(interval.confidence_interval.high)
        for size, rows in by_controls.items():
            p[rows] = np.atleast_1d(stats.mannwhitneyu(means[rows][:, None], np.stack([cs[n] for n in rows]),
                                                       alternative="less", method="exact", axis=1).pvalue)
    out = []
    for n, (mean, c) in enumerate(zip(means.tolist(), cs)):
        low, high = (mean, mean) if math.isnan(lo[n]) or math.isnan(hi[n]) else (float(lo[n]), float(hi[n]))
        rank = 1 + int(np.sum(c < mean))
        echo = bool(len(c)) and float(p[n]) <= ALPHA and high < float(np.median(c))
        out.append(Decision(echo, mean, (low, high), float(p[n]), rank, [float(x) for x in c]))
    return out


__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "CONTROLS",
    "MIN_CONTROLS",
    "MIN_PROBES",
    "TOP",
    "Decision",
    "Neighbours",
    "Snapshot",
    "centroid",
    "decide",
    "decide_many",
    "drift",
    "drifts",
    "probe_queries",
    "rank_weights",
    "seed_of",
    "take_snapshots",
]
