"""Several workers: scaling 1 → 2 → 4.

``erased`` sagas queued over a docstore and a pgvector table (``kept`` more subjects survive), the lineage
db and the queue on the same embedded PostgreSQL, drained by N ``tombstone worker --drain`` processes
started together (N = 1, 2, 4). Median of ``reps`` runs each: wall time from starting the workers to the
last one exiting, and the span from the first step journaled to the last receipt.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tombstone import Tombstone, init_deployment
from tombstone.receipt import load_receipt

HEADINGS = ("Several workers: scaling 1 → 2 → 4",)
COUNTS = (1, 2, 4)


def run(tmp: Path, erased: int = 48, kept: int = 48, reps: int = 3) -> dict:
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from tombstone import demo
    from tombstone.workers import enqueue
    from tombstone_adapters.pgvector.server import embedded_dsn

    server = embedded_dsn(tmp / "workers-pg")
    refs = [demo.subject_name(i) for i in range(1, erased + kept + 1)]
    out: dict[Any, Any] = {"erased": erased, "kept": kept, "reps": reps, "cores": os.cpu_count()}
    for n in COUNTS:
        walls, spans, verified, artifacts = [], [], 0, 0
        for rep in range(reps):
            name = f"bench_workers_{n}_{rep}"
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            lineage_dsn = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
            config = init_deployment(tmp / f"workers-{n}-{rep}", {
                "docs": {"backend": "docstore", "path": "stores/docs/docstore.db"},
                "pg": {"backend": "pgvector", "dsn": server, "table": f"chunks_{n}_{rep}"},
            }, lineage_dsn=lineage_dsn)
            with Tombstone(config) as tomb:
                demo.fill(tomb, "docs", refs)
                demo.fill(tomb, "pg", refs)
                enqueue(tomb, refs[:erased])
            start = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, "-m", "tombstone", "worker", "--config", str(config.path),
                                       "--name", f"w{i}", "--drain", "--lease", "10", "--poll", "0.2"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONWARNINGS": "ignore"}) for i in range(n)]
            for proc in procs:
                stdout, stderr = proc.communicate(timeout=1800)
                assert proc.returncode == 0, stdout + stderr
            walls.append(time.perf_counter() - start)
            with psycopg.connect(lineage_dsn) as conn:
                done = conn.execute("SELECT count(*) FROM sagas WHERE state = 'done'").fetchone()[0]
                first = conn.execute("SELECT min(at) FROM journal WHERE step <> 'plan'").fetchone()[0]
                last = conn.execute("SELECT max(finished_at) FROM sagas").fetchone()[0]
            assert done == erased, f"{done} of {erased} sagas finished with {n} workers"
            spans.append((datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds())
            for ref in refs[:erased]:
                receipt = load_receipt(config.receipts_dir / f"{ref}.json")
                verified += receipt["summary"]["VERIFIED"]
                artifacts += len(receipt["artifacts"])
        out[n] = {"wall": statistics.median(walls), "span": statistics.median(spans), "verified": verified,
                  "artifacts": artifacts}
    return out


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"{result['erased']} sagas queued with `tombstone erase --queue` (3 documents in a docstore and 9 chunks in a"
        f" pgvector table per subject; {result['kept']} more subjects survive), then drained by N"
        " `tombstone worker --drain` processes started together. The lineage db, the queue and the pgvector"
        f" table share one embedded PostgreSQL on this machine ({result['cores']} cores). Median of"
        f" {result['reps']} runs each. *Wall* counts from starting the workers to the last one exiting (process"
        " start-up included); *sagas* counts from the first step journaled to the last receipt.",
        "",
        "| workers | wall | sagas | sagas per second | speed-up (sagas) | artifacts VERIFIED (all runs) |",
        "|---|---|---|---|---|---|",
    ]
    for n in COUNTS:
        w = result[n]
        lines.append(f"| {n} | {w['wall']:.1f} s | {w['span']:.1f} s | {result['erased'] / w['span']:.1f} |"
                     f" {result[1]['span'] / w['span']:.2f}x | {w['verified']} of {w['artifacts']} |")
    lines += [
        "",
        "Each saga's pgvector reclaim rewrites the whole table (`VACUUM FULL`) under an exclusive lock"
        " and each docstore reclaim runs `VACUUM` on the one SQLite file, so those steps serialise across"
        " workers whatever their number; suppression and the probes overlap. Where many subjects go at once,"
        " a batch (above) pays each rewrite once. Every artifact of every receipt is counted: a pgvector reclaim"
        " waits, before its `VACUUM FULL`, for any transaction older than its `DELETE` still running on the"
        " server (the other workers' journal writes in the lineage db included), which would otherwise keep the"
        " deleted rows in the rewritten table (verification-levels.md, pgvector).",
    ]
    return "\n".join(lines)
