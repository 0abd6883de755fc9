"""Crash and resume: kill/resume trials (``tombstone.testing.crash``).

For each group of stores: a clean run lists the kill points it passes; for every point, ``tombstone erase``
is killed with SIGKILL there, ``tombstone resume`` finishes the saga, and the receipt's statuses and every
store's survivors are compared with the clean run's. Reports trials, those inside a reclaim recipe, those
agreeing, and the mean wall time per trial.
"""

from __future__ import annotations

import time
from pathlib import Path

HEADINGS = ("Crash and resume: kill/resume trials",)
GROUPS = {"graph": "chroma,docstore,exact_cache,semantic_cache", "files": "faiss,qdrant,pgvector"}


def run(tmp: Path) -> dict:
    from tombstone.testing.crash import prepare, run_trials

    out = {}
    for group, backends in GROUPS.items():
        prepared = prepare(GROUPS[group], tmp / f"crash-{group}")
        start = time.perf_counter()
        results = run_trials(prepared, tmp / f"crash-{group}-trials")
        elapsed = time.perf_counter() - start
        inside = sum(p.startswith(("reclaim:", "faiss:")) for p, _ in results)
        out[group] = {"backends": backends, "trials": len(results), "agree": sum(r is None for _, r in results),
                      "inside_reclaim": inside, "seconds_per_trial": elapsed / max(1, len(results)),
                      "failed": [p for p, r in results if r]}
    return out


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        "`tombstone erase` killed with SIGKILL at every named kill point a clean run passes (step boundaries while a"
        " step acts, and points inside each reclaim recipe), then `tombstone resume`; a trial agrees when the"
        " receipt's statuses equal the clean run's on an identical copy and every store's survivors are unchanged"
        " (Chroma vectors within 2 float32 ULPs, everything else byte-identical).",
        "",
        "| stores | kill points | inside reclaim | agreeing with the clean run | time per trial |",
        "|---|---|---|---|---|",
    ]
    for c in result.values():
        lines.append(f"| {c['backends']} | {c['trials']} | {c['inside_reclaim']} | {c['agree']} / {c['trials']} |"
                     f" {c['seconds_per_trial']:.1f} s |")
    failed = [p for c in result.values() for p in c["failed"]]
    lines += ["", f"Disagreeing kill points: {', '.join(failed) if failed else 'none'}."]
    return "\n".join(lines)
