"""The semantic probe's questions to a Chroma collection: nearest records (suppressed ones included) and
stored vectors.

A collection of up to ``EXACT_UP_TO`` records is answered exactly: its embeddings are read once through
Chroma's own ``get`` (one array; read again only when the persist directory's database has changed since)
and ranked in numpy with the collection's distance, which is the ranking Chroma's HNSW search approximates.
Chroma's search turns every row it returns into Python lists, and the semantic level asks it for thousands
of neighbourhoods at a time: for a small collection that conversion, not the search, was most of a batch's
semantic level. A larger collection is asked through its own search. Stored vectors of a small collection come from the same
read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.verify.neighbourhood import Neighbours

EXACT_UP_TO = 20_000
"""Largest collection whose neighbours are ranked exactly from its embeddings (read whole: 30 MiB at dim 384)."""
PAGE = 1000
"""Query vectors (and ids) per call to Chroma, and query rows per exact ranking."""


def distances(space: str, queries: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Chroma's distance of every query row to every matrix row, as hnswlib computes it in that space:
    ``l2`` the squared Euclidean distance, ``ip`` one minus the inner product, ``cosine`` one minus the
    cosine similarity."""
    if space == "cosine":
        def unit(m: np.ndarray) -> np.ndarray:
            norms = np.linalg.norm(m, axis=1, keepdims=True)
            return m / np.where(norms > 0, norms, 1.0)
        return 1.0 - unit(queries) @ unit(matrix).T
    if space == "ip":
        return 1.0 - queries @ matrix.T
    sq = np.einsum("ij,ij->i", matrix, matrix)
    return np.maximum(np.einsum("ij,ij->i", queries, queries)[:, None] - 2.0 * (queries @ matrix.T) + sq[None, :], 0.0)


def rank_exact(space: str, ids: Sequence[str], matrix: np.ndarray, vectors: np.ndarray, k: int,
               exclude: frozenset[str]) -> list[Neighbours]:
    """Each query row's ``k`` nearest rows of ``matrix`` (named by ``ids``), the excluded ids left out."""
    keep = np.fromiter((i not in exclude for i in ids), bool, len(ids))
    names = np.asarray(ids, dtype=object)[keep]
    rows = matrix[keep]
    take = min(k, len(names))
    out: list[Neighbours] = []
    if take == 0:
        return [Neighbours([], [], np.zeros((0, vectors.shape[1]), np.float32), exact=True) for _ in vectors]
    for start in range(0, len(vectors), PAGE):
        d = distances(space, vectors[start : start + PAGE], rows)
        near = np.argpartition(d, take - 1, axis=1)[:, :take] if take < d.shape[1] else np.tile(np.arange(d.shape[1]), (len(d), 1))
        near_d = np.take_along_axis(d, near, axis=1)
        order = np.argsort(near_d, axis=1, kind="stable")
        near, near_d = np.take_along_axis(near, order, axis=1), np.take_along_axis(near_d, order, axis=1)
        for picked, dist, index in zip(names[near].tolist(), near_d.astype(float).tolist(), near):
            out.append(_Ranked(picked, dist, rows, index))
    return out


class _Ranked(Neighbours):
    """One query's rows of an exact ranking, whose stored vectors are gathered from the matrix when first
    read: most of a batch's searches are read for their ids, or for a few of their rows."""

    def __init__(self, ids: list[str], distances: list[float], rows: np.ndarray, index: np.ndarray) -> None:
        self.ids, self.distances, self.exact = ids, distances, True
        self._rows, self._index, self._vectors = rows, index, None

    @property
    def vectors(self) -> np.ndarray:  # type: ignore[override]
        if self._vectors is None:
            self._vectors = self._rows[self._index]
        return self._vectors

    @vectors.setter
    def vectors(self, value: np.ndarray) -> None:
        self._vectors = value

    def rows_at(self, positions: Sequence[int]) -> np.ndarray:
        if self._vectors is not None:
            return self._vectors[list(positions)]
        return self._rows[self._index[list(positions)]]


class ChromaNeighbours:
    """``semantic_neighbours`` and ``stored_vectors`` for the Chroma adapter (which supplies ``collection``,
    ``_space`` and ``path``)."""

    _embeddings: tuple[Any, list[str], np.ndarray] | None = None

    def _state(self) -> tuple:
        """What changes when the collection's records do: the persist directory's database and its log."""
        out = []
        for name in ("chroma.sqlite3", "chroma.sqlite3-wal"):
            try:
                st = os.stat(Path(self.path) / name)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    _rows: dict[str, int] | None = None
    """Each id's row in the matrix ``_embeddings`` holds, made on the first lookup by id."""

    _counted: tuple[tuple, int] | None = None

    def _count(self, col: Any) -> int:
        """The collection's count, asked of Chroma again only when the persist directory's database has changed
        since (a batch's semantic level asks a few dozen times; Chroma answers each in about 2 ms). The
        files' state is read before the count, so a write between the two is seen by the next call."""
        state = self._state()
        if self._counted is None or self._counted[0] != state:
            self._counted = (state, col.count())
        return self._counted[1]

    def _all_embeddings(self, col: Any) -> tuple[list[str], np.ndarray]:
        state = self._state()  # read before the embeddings: a write between the two is seen by the next call
        if self._embeddings is not None and self._embeddings[0] == state:
            return self._embeddings[1], self._embeddings[2]
        got = col.get(include=["embeddings"])
        ids = list(got["ids"])
        embs = got["embeddings"]
        matrix = np.asarray(embs if embs is not None and len(ids) else np.zeros((0, 0)), dtype=np.float32)
        self._embeddings, self._rows = (state, ids, matrix), None
        return ids, matrix

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """The raw collection's nearest records (suppressed ones included), the excluded ones left out: ranked
        exactly for a collection of up to ``EXACT_UP_TO`` records, else by Chroma's search, over-fetched by the
        excluded share and filtered (the over-fetched rows come back as ids and distances only; the stored
        vectors are read once for the rows kept)."""
        col = self.collection()
        vectors = np.asarray(vectors, dtype=np.float32)
        count = self._count(col)
        if 0 < count <= EXACT_UP_TO:
            ids, matrix = self._all_embeddings(col)
            if len(ids) and matrix.ndim == 2 and matrix.shape[1] == vectors.shape[1]:
                return rank_exact(self._space(), ids, matrix, vectors, k, frozenset(exclude))
        fetch = min(count, k + len(exclude))
        if fetch <= 0:
            return [Neighbours([], [], np.zeros((0, vectors.shape[1]))) for _ in vectors]
        # First ask for what the excluded share of the collection suggests (half again, and a few more); a
        # row left short of k is asked again for k plus every excluded record.
        share = min(len(exclude) / max(count, 1), 0.99)
        first = min(fetch, math.ceil(1.5 * k / (1 - share)) + 4)
        out = []
        for start in range(0, len(vectors), PAGE):
            page = vectors[start : start + PAGE]
            res = col.query(query_embeddings=page, n_results=first, include=["distances"])
            found = [(list(ids), list(dists)) for ids, dists in zip(res["ids"], res["distances"])]
            short = [n for n, (ids, _) in enumerate(found)
                     if len(ids) == first < fetch and sum(1 for aid in ids if aid not in exclude) < k]
            if short:
                again = col.query(query_embeddings=page[short], n_results=fetch, include=["distances"])
                for n, ids, dists in zip(short, again["ids"], again["distances"]):
                    found[n] = (list(ids), list(dists))
            rows = []
            for ids, dists in found:
                keep = [i for i, aid in enumerate(ids) if aid not in exclude][:k]
                rows.append(([ids[i] for i in keep], [float(dists[i]) for i in keep]))
            stored = self.stored_vectors(sorted({aid for ids, _ in rows for aid in ids}))
            for ids, dists in rows:
                kept = [n for n, aid in enumerate(ids) if aid in stored]  # a record deleted since drops out
                out.append(Neighbours([ids[n] for n in kept], [dists[n] for n in kept],
                                      np.asarray([stored[ids[n]] for n in kept], dtype=np.float32).reshape(len(kept), -1)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        """The stored vectors of those of ``ids`` the collection holds: from the embeddings read for the exact
        ranking where the collection is that small (the same read, unchanged since), else through ``get``."""
        col = self.collection()
        ids = list(ids)
        count = self._count(col)
        if 0 < count <= EXACT_UP_TO:
            names, matrix = self._all_embeddings(col)
            if matrix.ndim == 2 and len(names) == len(matrix):
                if self._rows is None:
                    self._rows = {name: row for row, name in enumerate(names)}
                rows = self._rows
                return {i: matrix[rows[i]].copy() for i in dict.fromkeys(ids) if i in rows}
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), PAGE):
            got = col.get(ids=ids[start : start + PAGE], include=["embeddings"])
            out.update({i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"])})
        return out
