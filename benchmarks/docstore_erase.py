"""SQLite docstore: time to erase one subject.

Full sagas (suppress, reclaim, logical and physical probes, signed receipt), one subject at a time, over a
docstore of ``SUBJECTS`` subjects × ``DOCS`` documents; reports the median, p90 and max wall time per erasure.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from builds import docstore_build
from common import DOCS
from tombstone import Tombstone

HEADINGS = ("SQLite docstore: time to erase one subject",)


def run(tmp: Path) -> dict:
    config, subjects = docstore_build(tmp / "erase")
    times = []
    with Tombstone(config) as tomb:
        for s in subjects:
            start = time.perf_counter()
            receipt, _ = tomb.erase(s)
            times.append(time.perf_counter() - start)
            assert receipt["summary"]["VERIFIED"] == DOCS, receipt["summary"]
    return {"subjects": len(subjects), "docs": len(subjects) * DOCS, "median": statistics.median(times),
            "p90": float(np.percentile(times, 90)), "max": max(times)}


def section(result: dict) -> str:
    return "\n".join([
        f"## {HEADINGS[0]}",
        "",
        f"Full saga per subject (suppress, reclaim, logical and physical probes, signed receipt) over a store"
        f" of {result['docs']} documents, {result['subjects']} erasures in sequence.",
        "",
        "| median | p90 | max |",
        "|---|---|---|",
        f"| {result['median'] * 1000:.1f} ms | {result['p90'] * 1000:.1f} ms | {result['max'] * 1000:.1f} ms |",
    ])
