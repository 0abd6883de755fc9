"""Batches: cost per subject.

Erasing subjects from a FAISS store of ``vectors`` vectors (128-dim): single erasures (median of 5), then
one batch of 10 and one of 100 different subjects; time per subject, and its ratio to a single erasure.
Single erasures pay a reclaim (the default in place: zeros where the erased vectors lie) and a full scan of
the store's files each; a batch pays them once, and each of its subjects still gets its own saga and receipt.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from common import DOCS, chunk_text
from tombstone import Tombstone, init_deployment
from tombstone.capture.vector import capture_vectors

HEADINGS = ("Batches: cost per subject",)
SIZES = (1, 10, 100)


def run(tmp: Path, vectors: int = 10_000) -> dict:
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.faiss import FaissStore

    config = init_deployment(tmp / "batch", {"faiss": {"backend": "faiss", "path": "stores/faiss"}})
    subjects = [f"bench-{i:05d}" for i in range(vectors // DOCS + 1)]
    with Tombstone(config) as tomb:
        embedder = HashingEmbedder(128)
        store = FaissStore(config.stores["faiss"].options["path"], dim=128, store="faiss", embedder=embedder)
        # Lineage per subject as the wrapper records it, the index written in large batches (each FAISS
        # commit rewrites the whole index file, so a write per subject would dominate the setup).
        for start in range(0, len(subjects), 500):
            group = subjects[start : start + 500]
            ids = [f"{ref}-chunk-{k}" for ref in group for k in range(DOCS)]
            texts = [chunk_text(start + i, k) for i in range(len(group)) for k in range(DOCS)]
            cap = capture_vectors(embedder, store="faiss", backend="faiss", ids=ids, documents=texts)
            with tomb.lineage.atomic():
                for j, ref in enumerate(group):
                    tomb.lineage.record_artifacts(ref, cap.records[j * DOCS : (j + 1) * DOCS])
            store.add(ids, documents=texts, embeddings=cap.vectors)
        out: dict = {"vectors": store.ntotal}
        single = []
        for ref in subjects[:5]:
            t0 = time.perf_counter()
            receipt, _ = tomb.erase(ref)
            single.append(time.perf_counter() - t0)
            assert receipt["summary"]["VERIFIED"] == DOCS
        out[1] = statistics.median(single)
        offset = 5
        for size in SIZES[1:]:
            batch = subjects[offset : offset + size]
            offset += size
            t0 = time.perf_counter()
            done = tomb.erase_many(batch)
            out[size] = (time.perf_counter() - t0) / size
            assert all(r["summary"]["VERIFIED"] == DOCS for r, _ in done)
    return out


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"Erasing subjects from a FAISS store of {result['vectors']} vectors (128-dim): single erasures (median of 5),"
        " then one batch of 10 and one of 100 different subjects (`tombstone erase --subjects-file`), each"
        " batch with one reclaim (in place, the default) and one scan of the store's files for all its subjects,"
        " and one saga and signed receipt per subject.",
        "",
        "| subjects per erasure | time per subject | vs single |",
        "|---|---|---|",
    ]
    for size in SIZES:
        lines.append(f"| {size} | {result[size] * 1000:.0f} ms | {result[size] / result[1]:.2f}x |")
    return "\n".join(lines)
