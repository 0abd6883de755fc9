"""Dataset backend: reclaim time vs shard size, and the physical probe's decode rate.

One shard of N training examples (N = 10 000 and 1 000 000, texts of about 200 bytes) in each format —
JSONL, gzip JSONL, Parquet (zstd) — with ``ERASED`` examples spread through it erased. The reclaim (drop the
rows, rewrite the shard, re-hash, write a new manifest version, re-pin the current pointer) runs on a fresh
copy of the dataset each repetition; the physical probe (a byte scan of every file, a decode of every row,
the keyed content hash of every row) then runs on the reclaimed dataset.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from tombstone import ArtifactRecord
from tombstone.keys import LineageSecret

HEADINGS = ("Dataset: reclaim time vs shard size, and the probe's decode rate",)
SIZES = (10_000, 1_000_000)
FORMATS = ("jsonl", "jsonl.gz", "parquet")
ERASED = 10
_WORDS = np.array("account invoice refund parcel delivery ticket booking visit order payment policy claim".split())


def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(n)
    words = rng.choice(_WORDS, size=(n, 28))
    return [f"example {i}: " + " ".join(row) for i, row in enumerate(words)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(tmp: Path, sizes: tuple[int, ...] = SIZES, formats: tuple[str, ...] = FORMATS) -> dict:
    from tombstone_adapters.dataset import DatasetStore
    from tombstone_adapters.dataset.adapter import DatasetAdapter
    from tombstone_adapters.dataset.store import content_hash

    secret = LineageSecret(os.urandom(32))
    rows = []
    for n in sizes:
        texts = _texts(n)
        ids = [f"ex-{i:08d}-{(i * 2654435761) % (1 << 32):08x}" for i in range(n)]
        erased = sorted({(k * n) // ERASED + n // (2 * ERASED) for k in range(ERASED)})
        arts = [ArtifactRecord("train", ids[i], "dataset", "training_example",
                               content_hash=secret.content_key(content_hash(texts[i]))) for i in erased]
        reps = 3 if n <= 100_000 else 1
        for fmt in formats:
            base = tmp / f"base-{fmt}-{n}"
            DatasetStore(base, format=fmt, shard_rows=n).add(ids, texts, subject="bench")
            shard = next((base / "shards").iterdir())
            size = shard.stat().st_size
            reclaim, probe, ids_only = [], [], []
            for rep in range(reps):
                work = tmp / f"work-{fmt}-{n}-{rep}"
                shutil.copytree(base, work)
                adapter = DatasetAdapter("train", {"path": str(work)})
                adapter.content_key = secret.content_key
                adapter.suppress(arts)
                reclaim.append(_timed(lambda: adapter.reclaim(arts)))
                results: dict = {}
                probe.append(_timed(lambda: results.update(adapter.probe_physical(arts))))
                assert all(r.passed for r in results.values()), results
                adapter.content_key = None  # an independent verifier: ids only
                ids_only.append(_timed(lambda: adapter.probe_physical(arts)))
                if rep:
                    shutil.rmtree(work)
            shutil.rmtree(base)
            rows.append({"format": fmt, "rows": n, "shard_bytes": size, "reps": reps,
                         "reclaim": statistics.median(reclaim), "probe": statistics.median(probe),
                         "ids_only": statistics.median(ids_only)})
        del texts, ids
    return {"erased": ERASED, "rows": rows}


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        "One shard of N training examples (texts of about 200 bytes) per format; "
        f"{result['erased']} examples spread through it erased. *Reclaim*: drop the rows, rewrite the shard"
        " (temporary file, fsync, rename), re-hash it, write a new manifest version and re-pin the current pointer,"
        " on a fresh copy each repetition (median of 3 at 10k rows, one run at 1M). *Probe*: the physical probe on"
        " the reclaimed dataset — a byte scan of every file, a decode of every row, the keyed content hash of every"
        " row; *ids only*: the same without the lineage key, as an independent verifier runs it. Rates are rows"
        " of the shard per second.",
        "",
        "| format | rows | shard size | reclaim | rows/s rewritten | probe | rows/s probed | probe, ids only |"
        " rows/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        mib = row["shard_bytes"] / (1 << 20)
        lines.append(f"| {row['format']} | {row['rows']:,} | {mib:.1f} MiB | {row['reclaim']:.2f} s |"
                     f" {row['rows'] / row['reclaim']:,.0f} | {row['probe']:.2f} s | {row['rows'] / row['probe']:,.0f} |"
                     f" {row['ids_only']:.2f} s | {row['rows'] / row['ids_only']:,.0f} |")
    lines += [
        "",
        "A Parquet shard is compressed, so the probe decodes it rather than trust the byte scan; JSONL is decoded"
        " too, line by line. The difference between the two probe columns is the cost of reading every row's"
        " text, hashing it and keying the hash with the lineage secret (an ids-only probe of a Parquet shard reads"
        " the id column alone). The reclaim parses only the JSONL lines that can hold an erased id (one"
        " multi-pattern pass finds them) and filters a Parquet shard column-wise. The 1M-row figures are single"
        " runs, so they carry whatever else the machine was doing at that moment.",
    ]
    return "\n".join(lines)
