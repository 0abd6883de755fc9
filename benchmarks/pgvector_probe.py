"""pgvector: the physical probe reading the relation files in parts as they arrive, against copying them first.

The probe reads a table's relation files through ``pg_read_binary_file`` (a server may be on another machine:
SQL is the only way to its files). It scans each 64 MiB part as it arrives, the next part read meanwhile
(``physical_streams``). Before, it copied every file to a local temporary folder and then scanned the copies;
that path is measured here as the reference, through the same adapter with only the snapshot swapped (the
same checks, CHECKPOINT, reads, scan and attribution).

Per size (``TOMBSTONE_BENCH_PG_PROBE_SIZES``, default ``100000,1000000`` rows of dim-384 unit vectors, loaded with
``COPY`` into a table with its primary key and no HNSW index: the probe's cost is per byte read, and the
index would only add bytes), the physical probe of 100 stored rows, each way in turn, median of
``REPEATS``; both must find every one of the rows. Every server started is stopped again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HEADINGS = ("pgvector: the physical probe, read in parts as they arrive vs copied to disk first",)
DIM = 384
CHUNKS = 100
REPEATS = 3
TABLE = "probe_bench"
SIZES = tuple(int(n) for n in os.environ.get("TOMBSTONE_BENCH_PG_PROBE_SIZES", "100000,1000000").split(","))


def _rows(size: int):
    rng = np.random.default_rng(size)
    for start in range(0, size, 10_000):
        v = rng.standard_normal((min(10_000, size - start), DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        for i, vec in enumerate(v, start):
            yield f"s{i // CHUNKS:05d}-chunk-{i % CHUNKS:03d}", vec


def case(size: int, tmp: Path) -> dict:
    import psycopg

    from tombstone.lineage.records import ArtifactRecord, fingerprint_of
    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn
    from tombstone_adapters.pgvector.adapter import PgVectorAdapter
    from tombstone_adapters.pgvector.server import stop_embedded

    data_dir = tmp / "pgdata"
    out: dict = {"size": size}
    try:
        arts = []
        with psycopg.connect(embedded_dsn(data_dir), autocommit=True) as conn:
            PgVectorStore(conn, TABLE, dim=DIM, store="pg")
            conn.execute(f"DROP INDEX {TABLE}_embedding_hnsw")  # the wrapper's HNSW index
            t = time.perf_counter()
            with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, document, embedding) FROM STDIN") as copy:
                for aid, vec in _rows(size):
                    copy.write_row((aid, f"{aid}: words of a support ticket about an order and a parcel",
                                    "[" + ",".join(f"{x:.9g}" for x in vec) + "]"))
                    if len(arts) < CHUNKS:
                        arts.append(ArtifactRecord("pg", aid, "pgvector", "vector", fingerprint=fingerprint_of(vec)))
            out["load"] = time.perf_counter() - t
            conn.execute("CHECKPOINT")
        adapter = PgVectorAdapter("pg", {"data_dir": str(data_dir), "table": TABLE})
        try:
            streamed, copied, written = [], [], []

            @contextlib.contextmanager
            def copying():  # the probe as it was: every part written to a local file, the files scanned after
                folder = Path(tempfile.mkdtemp(prefix="tombstone-bench-pgcopy-"))
                try:
                    files: dict[Path, str] = {}
                    with adapter._streams() as streams:
                        for stream in streams:
                            path = folder / f"{len(files):04d}"
                            with open(path, "wb") as fh:
                                for part in stream.chunks:
                                    fh.write(part)
                            files[path] = stream.name
                    written.append(sum(p.stat().st_size for p in files))
                    yield files
                finally:
                    shutil.rmtree(folder, ignore_errors=True)

            for _ in range(REPEATS):
                for way, times in (("streamed", streamed), ("copied", copied)):
                    swapped = {"physical_streams": lambda: None, "physical_snapshot": copying} if way == "copied" else {}
                    for name, value in swapped.items():
                        setattr(adapter, name, value)
                    t = time.perf_counter()
                    results = adapter.probe_physical(arts)
                    times.append(time.perf_counter() - t)
                    for name in swapped:
                        delattr(adapter, name)
                    assert all(r.id_found and r.content_found for r in results.values()), way
                    out["bytes"] = results[arts[0].artifact_id].evidence["bytes_scanned"]
        finally:
            adapter.close()
    finally:
        stop_embedded(data_dir)
    out.update(streamed=statistics.median(streamed), copied=statistics.median(copied), written=max(written),
               load_average=os.getloadavg()[0])
    return out


def run(tmp: Path) -> dict:
    cases, failed = [], []
    for size in SIZES:
        work = tmp / f"probe-{size}"
        work.mkdir(parents=True)
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(size), str(work)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"  pgvector probe {size}: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            failed.append(f"{size:,}")
            continue
        cases.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  pgvector probe {size}: {cases[-1]}", file=sys.stderr, flush=True)
    if not cases:
        raise RuntimeError(f"every case failed: {', '.join(failed)}")
    return {"cases": cases, "failed": failed}


def section(result: dict) -> str:
    lines = [f"## {HEADINGS[0]}", "",
             "The physical probe of 100 stored rows of a pgvector table (dim-384 unit vectors loaded with `COPY`; the"
             " table with its primary key, no HNSW index: the probe's cost is per byte read) on the embedded"
             " PostgreSQL, each way in turn, median of 3. *Read in parts*: what the probe does, each 64 MiB part"
             " of every relation file scanned as it arrives through `pg_read_binary_file` while the next is read;"
             " *copied first*: what it did before, every part written to a local temporary folder and the"
             " copies scanned after (the same adapter, checks, reads and scan). Both find every one of the rows.",
             "", "| rows | relation files read | read in parts | copied first | parts ÷ copied | written to local disk"
             " (copied first) |", "|---|---|---|---|---|---|"]
    for c in result["cases"]:
        lines.append(f"| {c['size']:,} | {c['bytes'] / 2**20:,.0f} MiB | {c['streamed']:.2f} s | {c['copied']:.2f} s |"
                     f" {c['streamed'] / c['copied']:.2f}× | {c['written'] / 2**20:,.0f} MiB |")
    lines += ["", "Read in parts, nothing is written to the verifying machine's disk (a table of any size needs no"
              " free space there) and at most three parts are held in memory at once (the one being scanned, the"
              " next being read, and a seam of a pattern's length between them)."]
    if result.get("failed"):
        lines += ["", f"Failed (see the run's log): {', '.join(result['failed'])}."]
    loads = [c["load_average"] for c in result["cases"]]
    lines += ["", f"The host's one-minute load average as each case ended: {min(loads):.1f} to {max(loads):.1f} (2 cores)."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(case(int(sys.argv[1]), Path(sys.argv[2]))))
