"""Chroma: the in-place reclaim with and without its read of the collection before the HNSW tails are zeroed.

Each size is built by ``scale.py build chroma N`` (dim-384 unit vectors in subjects of 100 chunks, written with
their lineage through the wrapper, the vector segment persisted through its last write). Then, each time on a
fresh copy of the built deployment and in a process of its own, two subjects are erased one after the other
(``Tombstone.erase``; the first pays the store's one full-text merge, the second is what every later erasure
pays), either as the adapter does now (the read skipped where the vector segment's files hold every queued
write: ``ChromaAdapter.persisted_through``) or with the read forced, as every reclaim ran it before. The two
ways alternate; median of ``REPS``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HEADINGS = ("Chroma: the reclaim's read of the collection before zeroing the HNSW tails",)
SIZES = tuple(int(n) for n in os.environ.get("TOMBSTONE_BENCH_CHROMA_SETTLE_SIZES", "10000,100000").split(","))
REPS = 3
HERE = Path(__file__).resolve().parent
BUILT = dict(item.split("=", 1) for item in os.environ.get("TOMBSTONE_BENCH_CHROMA_SETTLE_BUILT", "").split(",")
             if item)
"""``SIZE=DIR,...``: a case ``scale.py build chroma SIZE DIR`` already built (its output saved as ``DIR/build.json``),
copied for each run and never changed."""
WAYS = ("skipped where persisted", "always read")


def measure(way: str, work: Path, first: str, later: str) -> dict:
    """Two erasures in this process on the deployment copied to ``work``."""
    from chroma_floor import _reclaim_time

    from tombstone import Tombstone
    from tombstone.config import load_config
    from tombstone_adapters.chroma.adapter import ChromaAdapter

    if way == WAYS[1]:
        ChromaAdapter.persisted_through = lambda self: None  # the read before the tails, as before
    out: dict = {}
    with Tombstone(load_config(work / "tombstone.toml")) as tomb:
        tomb.adapter("chroma")  # opened as an erasure opens it, before anything is timed
        for name, ref in (("first", first), ("next", later)):
            t = time.perf_counter()
            receipt, _ = tomb.erase(ref)
            out[name] = time.perf_counter() - t
            out[f"{name}_reclaim"] = _reclaim_time(tomb, receipt)
            out[f"{name}_verified"] = receipt["summary"].get("VERIFIED", 0)
            out[f"{name}_segment"] = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"].get("vector_segment")
    return out


def run(tmp: Path) -> dict:
    rows = []
    from chroma_floor import built_case, on_a_copy

    for size in SIZES:
        base, built = built_case(size, tmp, BUILT)
        row: dict = {"size": size, "runs": {way: [] for way in WAYS}}
        for rep in range(REPS):
            for way in WAYS:
                got = on_a_copy(Path(__file__), way, base, tmp / "work", built["refs"][rep], built["refs"][REPS + rep])
                assert got["first_verified"] == got["next_verified"] == 100, got
                row["runs"][way].append(got)
                print(f"  chroma {size} {way}: {got}", file=sys.stderr, flush=True)
        if str(size) not in BUILT:
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp / "work", ignore_errors=True)
        row["load"] = os.getloadavg()[0]
        rows.append(row)
    return {"rows": rows}


def section(result: dict) -> str:
    skip, read = WAYS
    lines = [
        f"## {HEADINGS[0]}",
        "",
        "Before it zeroes the HNSW files past the index's last element, the in-place reclaim used to have a fresh"
        " Chroma client read the collection (a segment Chroma has never persisted is written by the next process"
        " that loads it); it now skips that read where the vector segment's `max_seq_id` row is at or past the"
        " queue's last write (verification-levels.md, Chroma). Each size built once by `scale.py build chroma N`"
        " (dim-384 vectors, subjects of 100 chunks); each run on a fresh copy in a process of its own erases a first"
        " subject (with the store's one full-text merge) and then another, the two ways alternating, median of"
        f" {REPS}; *reclaim* is the step's own time from the saga's journal.",
        "",
        f"| vectors | first erasure: {skip} | {read} | its reclaim: {skip} | {read} | next erasure: {skip} | {read} |"
        f" its reclaim: {skip} | {read} | next ÷ next, read |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        runs = row["runs"]

        def med(way, key):
            return statistics.median(r[key] for r in runs[way])

        lines.append(f"| {row['size']:,} | {med(skip, 'first'):.2f} s | {med(read, 'first'):.2f} s |"
                     f" {med(skip, 'first_reclaim'):.2f} s | {med(read, 'first_reclaim'):.2f} s |"
                     f" {med(skip, 'next'):.2f} s | {med(read, 'next'):.2f} s | {med(skip, 'next_reclaim'):.2f} s |"
                     f" {med(read, 'next_reclaim'):.2f} s | {med(skip, 'next') / med(read, 'next'):.2f} |")
    said = sorted({r["next_segment"].split(" (")[0] for row in result["rows"] for r in row["runs"][skip]})
    loads = [row["load"] for row in result["rows"]]
    lines += ["", f"Every erasure here was verified (100 of 100 records). What the skipping runs' receipts said of the"
                  f" segment: {'; '.join(said)}. The host's one-minute load average after each size:"
                  f" {min(loads):.1f} to {max(loads):.1f} ({os.cpu_count()} cores)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    print(json.dumps(measure(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])))
