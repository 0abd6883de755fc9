"""Benchmarks that write RESULTS.md. Re-run with:  python benchmarks/run.py

Timings are medians of repeated runs measured side by side in one process on this machine;
compare ratios, not absolute numbers, across machines.
"""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tombstone import Tombstone, __version__, init_deployment
from tombstone.verify.physical import scan_files
from tombstone_adapters.docstore import DocStore, DocstoreAdapter

ROOT = Path(__file__).resolve().parents[1]
SUBJECTS = 200
DOCS = 3


def build(root: Path, secure_delete: bool | None = None):
    config = init_deployment(root, {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    subjects = [f"bench-{i:04d}" for i in range(SUBJECTS)]
    with Tombstone(config) as tomb:
        store = DocStore(config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        rng = np.random.default_rng(7)
        for s in subjects:
            docs = [(f"{s}-doc-{k}-{rng.integers(1 << 40):010x}", f"note {k} of {s} " + "lorem ipsum " * 30, {})
                    for k in range(DOCS)]
            store.add_many(docs, subject=s)
        store.close()
    return config, subjects


def residue(tmp: Path) -> dict:
    """Per subject: does the physical probe find the ids after a plain DELETE, and after reclaim?"""
    config, subjects = build(tmp / "residue")
    found_after_delete = found_after_reclaim = 0
    with Tombstone(config) as tomb:
        adapter = DocstoreAdapter("docs", {**config.stores["docs"].options, "secure_delete": False})
        for s in subjects:
            arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(s))
            adapter.native_delete(arts)
            found_after_delete += any(not r.passed for r in adapter.probe_physical(arts).values())
            adapter.reclaim(arts)
            found_after_reclaim += any(not r.passed for r in adapter.probe_physical(arts).values())
        adapter.close()
    return {"after_delete": found_after_delete, "after_reclaim": found_after_reclaim}


def erase_times(tmp: Path) -> list[float]:
    config, subjects = build(tmp / "erase")
    times = []
    with Tombstone(config) as tomb:
        for s in subjects:
            start = time.perf_counter()
            receipt, _ = tomb.erase(s)
            times.append(time.perf_counter() - start)
            assert receipt["summary"]["VERIFIED"] == DOCS, receipt["summary"]
    return times


def scan_rate(tmp: Path, size_mb: int = 128, patterns: int = 600) -> dict:
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=size_mb << 20, dtype=np.uint8).tobytes()
    path = tmp / "blob.bin"
    path.write_bytes(data)
    pats = [f"artifact-{rng.integers(1 << 60):016x}".encode() for _ in range(patterns)]
    pattern_file = tmp / "patterns.txt"
    pattern_file.write_bytes(b"\n".join(pats) + b"\n")

    def t(fn, reps=5):
        runs = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    def read_only():
        with open(path, "rb") as fh:
            while fh.read(8 << 20):
                pass

    read = t(read_only)
    scan = t(lambda: scan_files([path], {str(i): p for i, p in enumerate(pats)}))
    grep = None
    if shutil.which("grep"):
        grep = t(lambda: subprocess.run(["grep", "-c", "-a", "-F", "-f", str(pattern_file), str(path)],
                                        stdout=subprocess.DEVNULL, check=False))
    return {"mb": size_mb, "patterns": patterns, "read": read, "scan": scan, "grep": grep}


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tombstone-bench-"))
    try:
        res = residue(tmp)
        times = erase_times(tmp)
        rate = scan_rate(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mbps = lambda secs: rate["mb"] / secs
    lines = [
        "# Results",
        "",
        f"Written by `python benchmarks/run.py` (tombstone-rag {__version__}, Python {platform.python_version()},"
        f" SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores). Re-run it to refresh this file;"
        " timings are medians measured side by side in one run, so compare ratios across machines.",
        "",
        "## SQLite docstore: residue after a plain delete vs after reclaim",
        "",
        f"{SUBJECTS} subjects with {DOCS} documents each, `secure_delete` off (SQLite's upstream default;"
        " this machine's Python turns it on). For each subject: the store's own `DELETE`, a physical probe,"
        " then Tombstone's reclaim (DELETE + checkpoint + VACUUM) and the probe again.",
        "",
        "| after | subjects whose ids the physical probe still found |",
        "|---|---|",
        f"| plain DELETE | {res['after_delete']} / {SUBJECTS} |",
        f"| Tombstone reclaim | {res['after_reclaim']} / {SUBJECTS} |",
        "",
        "## SQLite docstore: time to erase one subject",
        "",
        f"Full saga per subject (suppress, reclaim, logical and physical probes, signed receipt) over a store"
        f" of {SUBJECTS * DOCS} documents, {SUBJECTS} erasures in sequence.",
        "",
        "| median | p90 | max |",
        "|---|---|---|",
        f"| {statistics.median(times) * 1000:.1f} ms | {np.percentile(times, 90) * 1000:.1f} ms |"
        f" {max(times) * 1000:.1f} ms |",
        "",
        "## Physical scanner throughput",
        "",
        f"One {rate['mb']} MiB file of random bytes, {rate['patterns']} patterns of 26 bytes, median of 5.",
        "",
        "| pass | median time | rate | vs plain read |",
        "|---|---|---|---|",
        f"| plain read (8 MiB chunks) | {rate['read'] * 1000:.0f} ms | {mbps(rate['read']):.0f} MiB/s | 1.00x |",
        f"| `scan_files` (one pass, all patterns) | {rate['scan'] * 1000:.0f} ms | {mbps(rate['scan']):.0f} MiB/s |"
        f" {rate['scan'] / rate['read']:.2f}x |",
    ]
    if rate["grep"] is not None:
        lines.append(
            f"| `grep -c -a -F -f` | {rate['grep'] * 1000:.0f} ms | {mbps(rate['grep']):.0f} MiB/s |"
            f" {rate['grep'] / rate['read']:.2f}x |"
        )
    lines.append("")
    (ROOT / "RESULTS.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
