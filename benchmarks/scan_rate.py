"""Physical scanner throughput on the patterns a physical probe really searches for.

One file of random bytes (512 MiB by default) and 1,000 patterns in two sets: random binary 26-byte strings
(what vector fingerprints look like: no shared prefix, any byte, NUL included) and ASCII ids sharing a
prefix (what artifact ids look like). Per set: a plain read in 8 MiB chunks, ``scan_files`` as the probe
runs it (hyperscan, the file split among the scan threads), on one thread, with the Aho-Corasick fallback
on one thread, ``grep -c -a -F -f`` for the ASCII set where grep exists, and the matcher alone on one thread
over 64 MiB already in memory (no read, no chunking: the ceiling of one scan thread). Median of ``reps`` runs
each, all measured side by side in one process, as time, rate and share of the plain read's rate.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import median_time
from tombstone.verify import scanner
from tombstone.verify.scanner import scan_files, scan_threads

HEADINGS = ("Physical scanner throughput",)


def _without_hyperscan(fn):
    def run():
        saved = sys.modules.get("hyperscan")
        sys.modules["hyperscan"] = None  # as where no wheel installs: the Aho-Corasick fallback
        try:
            return fn()
        finally:
            if saved is None:
                sys.modules.pop("hyperscan", None)
            else:
                sys.modules["hyperscan"] = saved
    return run


def run(tmp: Path, size_mb: int = 512, patterns: int = 1000, reps: int = 5) -> dict:
    rng = np.random.default_rng(3)
    path = tmp / "blob.bin"
    with open(path, "wb") as fh:
        for _ in range(size_mb // 64):
            fh.write(rng.integers(0, 256, size=64 << 20, dtype=np.uint8).tobytes())
    sets = {
        "binary": [rng.integers(0, 256, size=26, dtype=np.uint8).tobytes() for _ in range(patterns)],
        "ascii ids": [f"artifact-{rng.integers(1 << 60):016x}".encode() for _ in range(patterns)],
    }

    def read_only():
        buf = bytearray(8 << 20)
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass

    threads = scan_threads()
    out: dict = {"mb": size_mb, "patterns": patterns, "pattern_bytes": 26, "reps": reps, "threads": threads,
                 "engine": scanner._Matcher([b"x"]).engine, "sets": {}}
    for name, pats in sets.items():
        keyed = {str(i): p for i, p in enumerate(pats)}
        row = {
            "read": median_time(read_only, reps),
            "scan": median_time(lambda: scan_files([path], keyed), reps),
            "scan_1": median_time(lambda: scan_files([path], keyed, threads=1), reps),
            "aho_1": median_time(_without_hyperscan(lambda: scan_files([path], keyed, threads=1)),
                                 1 if name == "binary" else reps),
            "grep": None,
        }
        if name == "ascii ids" and shutil.which("grep"):
            pattern_file = tmp / "patterns.txt"
            pattern_file.write_bytes(b"\n".join(pats) + b"\n")
            row["grep"] = median_time(lambda: subprocess.run(["grep", "-c", "-a", "-F", "-f", str(pattern_file),
                                                              str(path)], stdout=subprocess.DEVNULL, check=False),
                                      reps)
        # the matcher alone, over bytes already in memory: what one scan thread can reach at best
        matcher = scanner._Matcher(pats)
        scratch = matcher.scratch()
        with open(path, "rb") as fh:
            block = memoryview(fh.read(64 << 20))
        row["matcher_1"] = median_time(lambda: matcher.find(block, scratch), reps) * (size_mb / 64)
        out["sets"][name] = row
    path.unlink()
    return out


def section(result: dict) -> str:
    mb = result["mb"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"One {mb} MiB file of random bytes (read from the page cache), {result['patterns']} patterns of"
        f" {result['pattern_bytes']} bytes per set, median of {result['reps']} (the Aho-Corasick fallback on binary"
        f" patterns: one run). *binary*: random bytes, as vector fingerprints are; *ascii ids*: ids sharing the"
        f" prefix `artifact-`. `scan_files` is what the physical probe runs: {result['engine']}, the file split"
        f" among {result['threads']} scan thread(s).",
        "",
        "| patterns | pass | median time | rate | share of the plain read's rate |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["sets"].items():
        read = row["read"]
        passes = [("plain read (8 MiB chunks)", read),
                  (f"`scan_files` ({result['threads']} threads)", row["scan"]),
                  ("`scan_files`, one thread", row["scan_1"]),
                  ("`scan_files`, one thread, Aho-Corasick fallback", row["aho_1"])]
        if row.get("grep") is not None:
            passes.append(("`grep -c -a -F -f`", row["grep"]))
        if row.get("matcher_1") is not None:
            passes.append(("the matcher alone, one thread, bytes in memory (per 512 MiB)".replace("512", str(mb)),
                           row["matcher_1"]))
        for label, secs in passes:
            lines.append(f"| {name} | {label} | {secs * 1000:.0f} ms | {mb / secs:.0f} MiB/s | {read / secs:.0%} |")
    notes = []
    for name, row in result["sets"].items():
        if row.get("matcher_1") is None:
            continue
        ceiling = result["threads"] * mb / row["matcher_1"]
        notes.append(f"{name}: `scan_files` at {mb / row['scan']:.0f} MiB/s is {row['matcher_1'] / result['threads'] / row['scan']:.0%}"
                     f" of {result['threads']} times the matcher's own one-thread rate ({ceiling:.0f} MiB/s), which"
                     f" is {row['read'] * ceiling / mb:.0%} of this run's plain read")
    if notes:
        lines += ["", "The plain read copies pages from the page cache at memory speed; a scan can go no faster"
                  " than its matcher on the scan threads. " + "; ".join(notes) + ". The share of the plain read that"
                  " a scan can reach is bounded by that ceiling, and moves with how fast this host copies memory"
                  " from one run to the next."]
    return "\n".join(lines)
