"""Capture for every vector backend: one embedding call, fingerprints, probe vectors, lineage rows."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tombstone.capture import deferred
from tombstone.capture.deferred import writer as deferred_writer
from tombstone.capture.writes import check_write
from tombstone.capture.calls import Embedder, embed
from tombstone.capture.fragments import probe_queries, query_sha256
from tombstone.lineage.db import ArtifactRecord



def hnsw_inv_norm(vector: np.ndarray) -> float:
    """``1 / (sqrt(sum of squares) + 1e-30)`` in float32, summed in order — exactly what hnswlib's
    cosine space multiplies each component by before it stores a vector."""
    v = np.asarray(vector, dtype=np.float32)
    total = np.cumsum(v * v, dtype=np.float32)[-1]
    return float(np.float32(1.0) / (np.sqrt(total, dtype=np.float32) + np.float32(1e-30)))


def normalised_fingerprint(fingerprint: Sequence[float], inv_norm: float) -> tuple[float, ...]:
    """The fingerprint as a cosine-space HNSW index stores it (bit-exact with hnswlib)."""
    return tuple(_normalised(fingerprint, inv_norm).tolist())


def normalised_fingerprint_bytes(fingerprint: Sequence[float], inv_norm: float) -> bytes:
    """:func:`normalised_fingerprint` as the float32 little-endian bytes the index holds."""
    return _normalised(fingerprint, inv_norm).astype("<f4", copy=False).tobytes()


def _normalised(fingerprint: Sequence[float], inv_norm: float) -> np.ndarray:
    return (np.asarray(fingerprint, dtype=np.float32) * np.float32(inv_norm)).astype(np.float32, copy=False)


def content_hash(document: str | None, vector: np.ndarray) -> str:
    data = document.encode("utf-8") if document is not None else np.asarray(vector, dtype="<f4").tobytes()
    return hashlib.sha256(data).hexdigest()


@dataclass
class VectorCapture:
    """What a vector wrapper records for one write."""

    vectors: np.ndarray
    """The chunks' own vectors, float32 (n, dim), in input order."""
    records: list[ArtifactRecord]
    """Lineage rows, one per chunk."""
    probes: list[tuple[str, str, str, np.ndarray]]
    """(store, artifact id, sha256 of the probe query, vector) rows."""
    deferred: list[tuple[str, str, str]] = field(default_factory=list)
    """(store, artifact id, probe query) rows left for ``tombstone.capture.deferred`` to embed and record."""
    pending: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(store, artifact id, ticket, writer): the artifacts of ``deferred``, as the lineage db records their
    pending capture (``LineageDB.record_artifacts(pending=...)``, in the lineage rows' transaction)."""

    def submit(self, lineage: Any, embedder: "Embedder") -> None:
        """Queue the deferred probe fragments; call once the lineage rows are committed."""
        if self.deferred:
            deferred.submit(lineage, embedder, self.deferred, [(s, a, t) for s, a, t, _ in self.pending])


def capture_vectors(
    embedder: Embedder,
    *,
    store: str,
    backend: str,
    ids: Sequence[str],
    documents: Sequence[str | None] | None,
    embeddings: np.ndarray | Sequence[Sequence[float]] | None = None,
    kind: str = "vector",
    defer: bool = False,
) -> VectorCapture:
    """Embed chunks (unless given) and their probe fragments in one call; build lineage rows.

    Each chunk with text gets up to three probe queries: its first, middle and last eight words. With
    ``defer`` the fragments are not embedded here: they are left in ``deferred`` for the caller to queue
    (``VectorCapture.submit``) once the lineage rows are committed.
    """
    n = len(ids)
    docs = list(documents) if documents is not None else [None] * n
    if len(docs) != n:
        raise ValueError("ids and documents differ in length")
    fragments: list[tuple[int, str]] = [(i, q) for i, d in enumerate(docs) if d for q in probe_queries(d)]
    texts = [] if embeddings is not None else [d or "" for d in docs]
    deferred = [(store, str(ids[i]), q) for i, q in fragments] if defer else []
    pending = []
    if defer:
        fragments = []
        ticket, who = secrets.token_hex(8), deferred_writer()
        pending = [(store, aid, ticket, who) for aid in dict.fromkeys(aid for _, aid, _ in deferred)]
    out = embed(embedder, texts + [q for _, q in fragments])
    if embeddings is not None:
        vectors = np.asarray(embeddings, dtype=np.float32).reshape(n, -1)
        probe_vecs = out
    else:
        vectors, probe_vecs = out[:n], out[n:]
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    # hnswlib's inverse norm, for all rows at once (cumsum runs in order along each row).
    inv_norms = np.float32(1.0) / (np.sqrt(np.cumsum(vectors * vectors, axis=1, dtype=np.float32)[:, -1])
                                   + np.float32(1e-30))
    fingerprints = vectors[:, :32].tolist()
    records = [
        ArtifactRecord(
            store=store,
            artifact_id=str(ids[i]),
            backend=backend,
            kind=kind,
            fingerprint=tuple(fingerprints[i]),
            content_hash=content_hash(docs[i], vectors[i]),
            inv_norm=float(inv_norms[i]),
        )
        for i in range(n)
    ]
    probes = [(store, str(ids[i]), query_sha256(q), probe_vecs[k]) for k, (i, q) in enumerate(fragments)]
    return VectorCapture(vectors=vectors, records=records, probes=probes, deferred=deferred, pending=pending)


def record_write(embedder: Embedder, lineage: Any, *, store: str, backend: str, ids: Sequence[str],
                 documents: Sequence[str | None] | None, embeddings: Any, subject: str,
                 sources: Sequence[Sequence[tuple[str, str, str]]] | None = None) -> np.ndarray:
    """The write path of a wrapper that records lineage edges too: the subject checked, the chunks embedded
    (unless given) with their probe fragments, the lineage rows and each id's ``sources`` (``(store, artifact
    id, relation)`` per id: what it was cut from) recorded first — assume the store write will fail — and the
    vectors to store returned."""
    check_write(lineage, store, [subject])
    cap = capture_vectors(embedder, store=store, backend=backend, ids=ids, documents=documents, embeddings=embeddings,
                          defer=deferred.mode() == "background")
    edges = [(s_store, s_id, store, aid, relation)
             for aid, edges_of in zip(ids, sources or [()] * len(ids)) for s_store, s_id, relation in edges_of]
    lineage.record_artifacts(subject, cap.records, probes=cap.probes, pending=cap.pending, edges=edges)
    cap.submit(lineage, embedder)
    return cap.vectors


def vectors_for_write(
    embedder: Embedder | None,
    lineage: Any,
    *,
    store: str,
    backend: str,
    ids: Sequence[str],
    documents: Sequence[str | None] | None,
    embeddings: Any = None,
    subject: str | None = None,
) -> np.ndarray:
    """The write path every vector wrapper shares. With a lineage db: embed the chunks (unless given) and
    their probe fragments in one call, record lineage first — assume the store write will fail — and
    return the vectors to store. Without one (a bare store): just the vectors."""
    if lineage is not None:
        check_write(lineage, store, [subject])
        if embedder is None:
            raise ValueError("the wrapper needs an embedder")
        cap = capture_vectors(embedder, store=store, backend=backend, ids=ids, documents=documents,
                              embeddings=embeddings, defer=deferred.mode() == "background")
        lineage.record_artifacts(subject, cap.records, probes=cap.probes, pending=cap.pending)
        cap.submit(lineage, embedder)
        return cap.vectors
    if embeddings is not None:
        return np.asarray(embeddings, dtype=np.float32)
    if embedder is None or documents is None:
        raise ValueError("no embeddings and no embedder to make them")
    return embed(embedder, list(documents))

