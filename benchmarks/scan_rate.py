"""Physical scanner throughput.

One file of random bytes and a set of 26-byte patterns: a plain read in 8 MiB chunks, ``scan_files`` (one
pass for all patterns) and ``grep -c -a -F -f`` where grep exists; median of ``reps`` runs each, reported
as time, rate and ratio to the plain read.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from common import median_time
from tombstone.verify.scanner import scan_files

HEADINGS = ("Physical scanner throughput",)


def run(tmp: Path, size_mb: int = 128, patterns: int = 600, reps: int = 5) -> dict:
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=size_mb << 20, dtype=np.uint8).tobytes()
    path = tmp / "blob.bin"
    path.write_bytes(data)
    del data
    pats = [f"artifact-{rng.integers(1 << 60):016x}".encode() for _ in range(patterns)]
    pattern_file = tmp / "patterns.txt"
    pattern_file.write_bytes(b"\n".join(pats) + b"\n")

    def read_only():
        with open(path, "rb") as fh:
            while fh.read(8 << 20):
                pass

    read = median_time(read_only, reps)
    scan = median_time(lambda: scan_files([path], {str(i): p for i, p in enumerate(pats)}), reps)
    grep = None
    if shutil.which("grep"):
        grep = median_time(lambda: subprocess.run(["grep", "-c", "-a", "-F", "-f", str(pattern_file), str(path)],
                                                  stdout=subprocess.DEVNULL, check=False), reps)
    return {"mb": size_mb, "patterns": patterns, "pattern_bytes": len(pats[0]), "reps": reps,
            "read": read, "scan": scan, "grep": grep}


def section(result: dict) -> str:
    mbps = lambda secs: result["mb"] / secs
    read = result["read"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"One {result['mb']} MiB file of random bytes, {result['patterns']} patterns of {result['pattern_bytes']}"
        f" bytes, median of {result['reps']}.",
        "",
        "| pass | median time | rate | vs plain read |",
        "|---|---|---|---|",
        f"| plain read (8 MiB chunks) | {read * 1000:.0f} ms | {mbps(read):.0f} MiB/s | 1.00x |",
        f"| `scan_files` (one pass, all patterns) | {result['scan'] * 1000:.0f} ms | {mbps(result['scan']):.0f} MiB/s |"
        f" {result['scan'] / read:.2f}x |",
    ]
    if result["grep"] is not None:
        lines.append(f"| `grep -c -a -F -f` | {result['grep'] * 1000:.0f} ms | {mbps(result['grep']):.0f} MiB/s |"
                     f" {result['grep'] / read:.2f}x |")
    return "\n".join(lines)
