"""Shared by every benchmark module: sizes, timing medians, the temporary directory, the RESULTS.md header.

Timings are medians of repeated runs measured side by side in one process on this machine; compare
ratios, not absolute numbers, across machines.
"""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "RESULTS.md"
SUBJECTS = 200
DOCS = 3
DIM = 384
CHROMA_META = {"hnsw:space": "cosine", "hnsw:batch_size": 100, "hnsw:sync_threshold": 200}


def chunk_text(i: int, k: int) -> str:
    """Chunk ``k`` of subject ``i``: 120 words, the same on every run."""
    rng = np.random.default_rng(i * 10 + k)
    words = "account invoice refund parcel delivery ticket booking visit order payment policy claim".split()
    return f"subject {i} chunk {k}: " + " ".join(rng.choice(words, 120))


def median_time(fn: Callable[[], object], reps: int = 5) -> float:
    """Median wall time of ``reps`` calls of ``fn``, in seconds."""
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def side_by_side(fns: dict[str, Callable[[], object]], reps: int = 5) -> dict[str, float]:
    """Median wall time of each function, the functions called in turn within every repetition."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - start)
    return {name: statistics.median(r) for name, r in runs.items()}


@contextmanager
def temp_dir() -> Iterator[Path]:
    """A fresh directory for one benchmark run, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="tombstone-bench-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def header() -> str:
    """The top of RESULTS.md: title and the environment the figures were measured in."""
    from tombstone import __version__

    return (
        "# Results\n"
        "\n"
        f"Written by `python benchmarks/run.py` (tombstone-rag {__version__}, Python {platform.python_version()},"
        f" SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores). Re-run it to refresh this file;"
        " timings are medians measured side by side in one run, so compare ratios across machines."
    )
