"""``tombstone scan`` per backend at 100,000 records, next to a plain read of the same store.

Per backend, a store of ``TOMBSTONE_BENCH_FSCAN_RECORDS`` records (default 100,000): an id like
``doc-000123``, a short document text and (vector stores) a dim-384 float32 unit vector, random with a fixed
numpy seed; loaded with the store's own client in large batches, no lineage db. Then every 100th record is
deleted with the store's own delete (not Tombstone's reclaim), so the scan has something to find:

- docstore: ``DocStore.delete`` (a plain DELETE) with SQLite's upstream default, ``secure_delete`` off;
- faiss: ``FaissStore.drop_mapping`` (``remove_ids`` cannot remove from HNSW: the app forgets the id);
- chroma: ``collection.delete``;
- qdrant (local mode): ``client.delete``, its SQLite connection set to upstream's ``secure_delete`` off;
- pgvector (embedded PostgreSQL): a plain ``DELETE``.

Then it measures ``scan_options`` (what ``tombstone scan --backend ... --option ...`` runs) against a plain
read of the same data: every byte of the store's files in 8 MiB chunks, or for pgvector a ``SELECT *`` of
every row through a server-side cursor; one untimed run of each first (page cache warm), then the median of
3, the two alternated. A scan before the delete is the control (a store that deleted nothing).

After the timings, an independent byte search (no Tombstone code) counts how many of the deleted records
are still in the store's files: their ids (for FAISS, whose sidecar forgets the id, their vectors' bytes;
for pgvector the table's heap and index files in the embedded server's data directory).

Each case runs in four processes of its own (``python benchmarks/forensic_scan.py PHASE BACKEND N DIR``:
``load``, ``control``, ``delete``, ``measure``), so each phase finds the files as the store's client left them
on exit, a crash loses only its case, and memory is returned. When the first scan (``control``) runs past
``SCAN_LIMIT`` seconds (``TOMBSTONE_BENCH_FSCAN_SCAN_LIMIT``) it is stopped and its case reported as such.
``TOMBSTONE_BENCH_FSCAN_BACKENDS`` picks backends; ``TOMBSTONE_BENCH_FSCAN_CASES``
(``faiss:100000,chroma:5000``) replaces the list of cases, so one backend can run at a lower count.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import numpy as np

HEADINGS = ("tombstone scan: time and rate per backend at 100k records",)
DIM = 384
SEED = 7
EVERY = 100  # every 100th record is deleted: 1%
REPS = 3
CHUNK = 8 << 20
RECORDS = int(os.environ.get("TOMBSTONE_BENCH_FSCAN_RECORDS", "100000"))
BACKENDS = tuple(os.environ.get("TOMBSTONE_BENCH_FSCAN_BACKENDS", "docstore,faiss,chroma,qdrant,pgvector").split(","))
PHASE_TIMEOUT = 3600
SCAN_LIMIT = int(os.environ.get("TOMBSTONE_BENCH_FSCAN_SCAN_LIMIT", "900"))
COLLECTION = "bench"
TABLE = "bench"
HERE = Path(__file__).resolve().parent


# -- the records ----------------------------------------------------------------------------------


def ident(i: int) -> str:
    return f"doc-{i:06d}"


def document(i: int) -> str:
    return f"document {i}: a support ticket about an order, a refund and a parcel"


def vectors(n: int) -> np.ndarray:
    v = np.random.default_rng(SEED).standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def deleted_ids(n: int) -> list[str]:
    return [ident(i) for i in range(0, n, EVERY)]


# -- per backend: load, delete, scan options, what a plain read reads ------------------------------


def _load(backend: str, work: Path, n: int) -> None:
    ids = [ident(i) for i in range(n)]
    docs = [document(i) for i in range(n)]
    if backend == "docstore":
        from tombstone_adapters.docstore import DocStore

        store = DocStore(work / "docstore" / "docs.db")
        try:
            for s in range(0, n, 10_000):
                store.add_many([(ids[i], docs[i], {}) for i in range(s, min(n, s + 10_000))], subject="bench")
        finally:
            store.close()
        return
    vecs = vectors(n)
    if backend == "faiss":
        from tombstone_adapters.faiss.store import FaissStore

        FaissStore(work / "faiss", dim=DIM).add(ids, documents=docs, embeddings=vecs)
    elif backend == "chroma":
        import chromadb

        client = chromadb.PersistentClient(path=str(work / "chroma"))
        col = client.create_collection(COLLECTION, metadata={"hnsw:space": "cosine"}, embedding_function=None)
        step = min(5000, client.get_max_batch_size())
        for s in range(0, n, step):
            col.add(ids=ids[s:s + step], documents=docs[s:s + step], embeddings=vecs[s:s + step])
    elif backend == "qdrant":
        from qdrant_client import QdrantClient, models

        from tombstone_adapters.qdrant.wrapper import DOCUMENT_KEY, ID_KEY, point_id

        client = QdrantClient(path=str(work / "qdrant"))
        client.create_collection(COLLECTION, vectors_config=models.VectorParams(size=DIM,
                                                                               distance=models.Distance.COSINE))
        for s in range(0, n, 2000):
            # the payload the wrapper writes: the record's id under ID_KEY (how the scan names a deleted point)
            client.upsert(COLLECTION, points=[
                models.PointStruct(id=point_id(ids[i]), vector=vecs[i].tolist(),
                                   payload={ID_KEY: ids[i], DOCUMENT_KEY: docs[i]})
                for i in range(s, min(n, s + 2000))])
        client.close()
    elif backend == "pgvector":
        import psycopg
        from pgvector.psycopg import register_vector

        from tombstone_adapters.pgvector import PgVectorStore

        with psycopg.connect(_dsn(work), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            with suppress(psycopg.Error):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            PgVectorStore(conn, TABLE, dim=DIM)  # the table as the project creates it, HNSW index included
            # bulk load as pgvector advises: rows first (binary COPY), the HNSW index built afterwards
            index = f"{TABLE}_embedding_hnsw"
            conn.execute(f"DROP INDEX IF EXISTS {index}")
            register_vector(conn)
            with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, document, embedding) FROM STDIN"
                                                " WITH (FORMAT BINARY)") as copy:
                copy.set_types(["text", "text", "vector"])
                for i in range(n):
                    copy.write_row((ids[i], docs[i], vecs[i]))
            conn.execute("SET maintenance_work_mem = '2GB'")
            conn.execute(f"CREATE INDEX {index} ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
            conn.execute(f"VACUUM ANALYZE {TABLE}")  # after a bulk load; the planner statistics sample ids
    else:
        raise ValueError(f"unknown backend {backend}")


def _delete(backend: str, work: Path, ids: list[str]) -> None:
    if backend == "docstore":
        from tombstone_adapters.docstore import DocStore

        store = DocStore(work / "docstore" / "docs.db", secure_delete=False)
        try:
            store.delete(ids)
        finally:
            store.close()
    elif backend == "faiss":
        from tombstone_adapters.faiss.store import FaissStore

        FaissStore(work / "faiss", create=False).drop_mapping(ids)
    elif backend == "chroma":
        import chromadb

        chromadb.PersistentClient(path=str(work / "chroma")).get_collection(COLLECTION).delete(ids=ids)
    elif backend == "qdrant":
        from qdrant_client import QdrantClient, models

        from tombstone_adapters.qdrant.wrapper import point_id

        client = QdrantClient(path=str(work / "qdrant"))
        # local mode's own SQLite connection for the collection, at upstream SQLite's default
        client._client.collections[COLLECTION].storage.storage.execute("PRAGMA secure_delete=OFF")
        client.delete(COLLECTION, points_selector=models.PointIdsList(points=[point_id(i) for i in ids]))
        client.close()
    elif backend == "pgvector":
        import psycopg

        with psycopg.connect(_dsn(work), autocommit=True) as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (ids,))
            conn.execute("SELECT pg_stat_force_next_flush()")
    else:
        raise ValueError(f"unknown backend {backend}")


def _dsn(work: Path) -> str:
    from tombstone_adapters.pgvector.server import embedded_dsn

    return embedded_dsn(work / "pg" / "data")


def _options(backend: str, work: Path) -> dict:
    return {"docstore": lambda: {"path": str(work / "docstore" / "docs.db")},
            "faiss": lambda: {"path": str(work / "faiss")},
            "chroma": lambda: {"path": str(work / "chroma"), "collection": COLLECTION},
            "qdrant": lambda: {"path": str(work / "qdrant"), "collection": COLLECTION},
            "pgvector": lambda: {"dsn": _dsn(work), "table": TABLE}}[backend]()


def _files(backend: str, work: Path) -> list[Path]:
    """Every regular file of the store (its folder; the docstore's folder holds its file and WAL)."""
    root = work / {"docstore": "docstore", "faiss": "faiss", "chroma": "chroma", "qdrant": "qdrant"}[backend]
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _scan(backend: str, options: dict):
    from tombstone.scan import scan_options

    return scan_options(backend, backend, options)


def _summary(report) -> dict:
    return {"recoverable": report.recoverable, "count": report.count, "bytes": report.bytes,
            "ids_named": len(report.ids()),
            "places": [{"place": p.place, "kind": p.kind, "count": p.count, "bytes": p.bytes,
                        "ids": len(p.ids), "recoverable": p.recoverable} for p in report.places],
            "notes": list(report.notes)}


# -- the phases, each in its own process -------------------------------------------------------------


def _store_bytes(backend: str, work: Path) -> dict:
    if backend == "pgvector":
        import psycopg

        with psycopg.connect(_dsn(work), autocommit=True) as conn:
            return {"bytes": conn.execute("SELECT pg_total_relation_size(%s::regclass)", (TABLE,)).fetchone()[0],
                    "heap_bytes": conn.execute("SELECT pg_relation_size(%s::regclass)", (TABLE,)).fetchone()[0]}
    files = _files(backend, work)
    return {"bytes": sum(p.stat().st_size for p in files), "files": len(files)}


def phase_load(backend: str, n: int, work: Path) -> dict:
    start = time.perf_counter()
    _load(backend, work, n)
    return {"load": time.perf_counter() - start, **_store_bytes(backend, work)}


def phase_control(backend: str, n: int, work: Path) -> dict:
    """The store as loaded, before its client deletes anything: what a scan of a clean store says."""
    options = _options(backend, work)
    start = time.perf_counter()
    report = _scan(backend, options)
    return {"control_scan": time.perf_counter() - start, "before": _summary(report)}


def phase_delete(backend: str, n: int, work: Path) -> dict:
    ids = deleted_ids(n)
    start = time.perf_counter()
    _delete(backend, work, ids)
    return {"delete": time.perf_counter() - start, "deleted": len(ids)}


_ID = re.compile(rb"doc-\d{6}")


def _in_files(backend: str, work: Path, n: int) -> int:
    """How many of the deleted records a plain byte search still finds in the store's files: their ids, or
    for FAISS (whose sidecar no longer names them) their vectors' bytes. No Tombstone code."""
    deleted = deleted_ids(n)
    if backend == "faiss":
        blobs = [p.read_bytes() for p in _files(backend, work)]
        vecs = vectors(n)
        return sum(any(vecs[i].tobytes() in b for b in blobs) for i in range(0, n, EVERY))
    if backend == "pgvector":
        import psycopg

        with psycopg.connect(_dsn(work), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            root = Path(conn.execute("SELECT current_setting('data_directory')").fetchone()[0])
            rels = [r for (r,) in conn.execute(
                "SELECT pg_relation_filepath(oid) FROM pg_class WHERE oid = %s::regclass OR oid IN"
                " (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)", (TABLE, TABLE))]
        files = [p for rel in rels for p in (root / rel).parent.glob(Path(rel).name + "*") if p.is_file()]
    else:
        files = _files(backend, work)
    found: set[bytes] = set()
    for p in files:
        found |= set(_ID.findall(p.read_bytes()))
    return len({i.encode() for i in deleted} & found)


def phase_measure(backend: str, n: int, work: Path) -> dict:
    options = _options(backend, work)
    out: dict = _store_bytes(backend, work)
    if backend == "pgvector":
        import psycopg

        dsn = options["dsn"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            out["rows"] = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]

        def read() -> int:
            rows = 0
            with psycopg.connect(dsn) as conn, conn.cursor(name="plain_read", binary=True) as cur:
                cur.execute(f"SELECT * FROM {TABLE}")
                while batch := cur.fetchmany(10_000):
                    rows += len(batch)
            return rows
    else:
        files = _files(backend, work)

        def read() -> int:
            buf = bytearray(CHUNK)
            total = 0
            for p in files:
                with open(p, "rb", buffering=0) as fh:
                    while got := fh.readinto(buf):
                        total += got
            return total

    first = _scan(backend, options)  # untimed: warms the page cache and the imports
    got = read()
    expected = out["rows"] if backend == "pgvector" else out["bytes"]
    if got != expected:
        raise RuntimeError(f"the plain read read {got}, expected {expected}")
    scans, reads = [], []
    load_before = os.getloadavg()[0]
    for _ in range(REPS):
        t = time.perf_counter()
        report = _scan(backend, options)
        scans.append(time.perf_counter() - t)
        t = time.perf_counter()
        read()
        reads.append(time.perf_counter() - t)
    out["after"] = _summary(report)
    out["stable"] = _summary(first) == out["after"]
    out["scan"], out["read"] = statistics.median(scans), statistics.median(reads)
    out["scans"], out["reads"] = scans, reads
    out["loadavg"] = [load_before, os.getloadavg()[0]]  # what else ran on the machine meanwhile
    out["in_files"] = _in_files(backend, work, n)
    return out


PHASES = {"load": phase_load, "control": phase_control, "delete": phase_delete, "measure": phase_measure}


def _limit(phase: str) -> int:
    return {"control": SCAN_LIMIT, "measure": (REPS + 1) * SCAN_LIMIT + 600}.get(phase, PHASE_TIMEOUT)


def _cases(backends) -> list[tuple[str, int]]:
    """``TOMBSTONE_BENCH_FSCAN_CASES``, or every backend at ``RECORDS``."""
    env = os.environ.get("TOMBSTONE_BENCH_FSCAN_CASES")
    if env:
        return [(b, int(n)) for b, n in (item.split(":") for item in env.split(","))]
    return [(b, RECORDS) for b in backends]


def _run_phase(phase: str, backend: str, n: int, work: Path) -> dict | str:
    """The phase's JSON, or why it failed (one line)."""
    env = {**os.environ, "TMPDIR": str(work / "tmp")}  # the scans' private copies go with the case
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), phase, backend, str(n), str(work)],
                              capture_output=True, text=True, check=False, timeout=_limit(phase), env=env)
    except subprocess.TimeoutExpired:
        return f"{phase}: stopped after {_limit(phase)} s" + (" (one scan)" if phase == "control" else "")
    if proc.returncode != 0:
        print(f"  {backend} {n}: {phase} failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or [f"exit {proc.returncode}"]
        return f"{phase}: {last[0][:160]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(tmp: Path, backends=BACKENDS) -> dict:
    rows = []
    for backend, n in _cases(backends):
        work = tmp / f"{backend}-{n}"
        (work / "tmp").mkdir(parents=True)
        row: dict = {"backend": backend, "records": n}
        for phase in PHASES:
            got = _run_phase(phase, backend, n, work)
            if isinstance(got, str):
                row["failed"] = got
                break
            row.update(got)
            print(f"  {backend} {n}: {phase} done", file=sys.stderr, flush=True)
        rows.append(row)
        if "failed" not in row:
            print(f"  {backend} {n}: scan {row['scan']:.2f} s, read {row['read']:.2f} s,"
                  f" found {row['after']['count']}", file=sys.stderr, flush=True)
        shutil.rmtree(work, ignore_errors=True)
    if all("failed" in r for r in rows):
        raise RuntimeError("every case failed: " + "; ".join(f"{r['backend']}: {r['failed']}" for r in rows))
    return {"target": RECORDS, "dim": DIM, "every": EVERY, "reps": REPS, "seed": SEED, "cores": os.cpu_count(),
            "scan_limit": SCAN_LIMIT, "rows": rows}


# -- RESULTS.md -------------------------------------------------------------------------------------


def _secs(s: float) -> str:
    if s >= 10:
        return f"{s:.1f} s"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.2f} ms"


def _rate(mib: float, s: float) -> str:
    r = mib / s
    return f"{r:.0f} MiB/s" if r >= 100 else f"{r:.1f} MiB/s" if r >= 1 else f"{r:.3g} MiB/s"


def _share(x: float) -> str:
    pct = x * 100
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.1f}%" if pct >= 0.1 else f"{pct:.2g}%"


def _found(row: dict) -> str:
    """What the scan found of the deleted records: where it only counts (FAISS orphan vectors, PostgreSQL
    dead tuples), the largest count one place holds; the ids it names; and in brackets what a byte search of
    the files finds (the control on the scan)."""
    after, deleted = row["after"], row["deleted"]
    named = after["ids_named"]
    counted = max((p for p in after["places"] if p["count"] and not p["ids"]), key=lambda p: p["count"],
                  default=None)
    parts = [f"{counted['count']:,} {counted['kind']}"] if counted else []
    if named or not counted:
        parts.append(f"{named:,} of {deleted:,} by id")
    return f"{', '.join(parts)} (a byte search finds {row['in_files']:,})"


def _mib(b: float) -> float:
    return b / (1 << 20)


def _row(r: dict) -> str:
    head = f"| {r['backend']} | {r['records']:,} |"
    mib = _mib(r.get("bytes", 0))
    shown = (f"{mib:.0f}" if mib >= 10 else f"{mib:.1f}") if "bytes" in r else "-"
    if "failed" in r:
        size = shown
        load = _secs(r["load"]) if "load" in r else "-"
        if r["failed"].startswith("control: stopped"):
            return (f"{head} {size} | {load} | not measured: the first scan ran past {_limit('control')} s and was"
                    " stopped | - | - | - | - | - | - |")
        return f"{head} {size} | {load} | failed in {r['failed']} | - | - | - | - | - | - |"
    size = _mib(r["bytes"])
    control = "yes" if r["before"]["recoverable"] else "no"
    return (f"{head} {shown} | {_secs(r['load'])} | {_secs(r['scan'])} | {_rate(size, r['scan'])} |"
            f" {_secs(r['read'])} | {_rate(size, r['read'])} | {_share(r['read'] / r['scan'])} | {_found(r)} |"
            f" {'yes' if r['after']['recoverable'] else 'no'} (before the delete: {control}) |")


def _machine(rows: list[dict], cores: int | None) -> str:
    seen = [x for r in rows for x in r.get("loadavg", [])]
    if not seen:
        return ""
    return (f" The 1-minute load average, read before and after each case's timed runs, was {min(seen):.1f} to"
            f" {max(seen):.1f} on {cores} cores.")


def section(result: dict) -> str:
    rows = result["rows"]
    target = result["target"]
    lowered = [r for r in rows if r["records"] != target]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"Per backend a store of {target:,} records"
        + (" (also " + ", ".join(f"{r['backend']} at {r['records']:,}" for r in lowered) + ")" if lowered else "")
        + f": an id like `doc-000123`, a short document text and, in the vector stores, a dim-{result['dim']}"
        f" float32 unit vector (random, numpy seed {result['seed']}; the docstore holds the text only), loaded"
        " with the store's own client in large batches, no lineage db (Qdrant's points carry their id in the"
        " payload key its wrapper writes, which is how the scan names a point). Then every"
        f" {result['every']}th record ({1 / result['every']:.0%}) was deleted with the store's own delete, not"
        " Tombstone's reclaim: the docstore's plain `DELETE` and Qdrant local mode's `client.delete`, both with"
        " SQLite's upstream default `secure_delete` off (this machine's Python build turns it on, which zeroes"
        " freed cells); FAISS `drop_mapping` (HNSW cannot `remove_ids`: the app forgets the id, the vector"
        " stays); Chroma's `collection.delete` as it runs here; a plain `DELETE` in an embedded PostgreSQL."
        " *Scan*: `scan_options`, what `tombstone scan --backend ... --option ...` runs (read-only, on a"
        " private copy of the files where the backend's scan takes one). *Plain read*: every byte of the"
        " store's files in 8 MiB chunks; for pgvector a `SELECT *` of every row through a server-side cursor,"
        " 10,000 rows a fetch. One untimed run of each first (page cache warm), then the median of"
        f" {result['reps']} of each, the two alternated, on this machine's {result['cores']} cores. *MiB*: the"
        " store's files; for pgvector `pg_total_relation_size` (heap, TOAST and both indexes). *Load*: the raw"
        " client's load, once (pgvector: binary `COPY`, then the HNSW index built, then `VACUUM ANALYZE`)."
        " *Rate*: MiB over the median time; *scan's share*: the scan's rate as a share of the plain read's."
        " *Deleted records found*: what the scan reports, and in brackets how many of the deleted records a"
        " plain byte search (no Tombstone code) still finds in the files, by id (FAISS: by the vector's bytes;"
        " pgvector: the table's heap and index files). *Recoverable*: the scan's verdict after the delete, and"
        f" on the store as loaded (the control). A case whose first scan runs past {result['scan_limit']} s is"
        " stopped there." + _machine(rows, result["cores"]),
        "",
        "| backend | records | MiB | load | scan median | scan rate | plain read median | plain read rate |"
        " scan's share | deleted records found | recoverable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(r) for r in rows]
    ok = [r for r in rows if "failed" not in r]
    full = [r for r in ok if r["records"] == target]
    facts = []
    if len(full) > 1:
        slow = max(full, key=lambda r: r["scan"])
        fast = min(full, key=lambda r: r["scan"])
        low = min(full, key=lambda r: r["read"] / r["scan"])
        facts.append(f"At {target:,} records the slowest scan is {slow['backend']}'s, {_secs(slow['scan'])}"
                     f" ({slow['scan'] / fast['scan']:,.0f}x the fastest, {fast['backend']}'s {_secs(fast['scan'])});"
                     f" the lowest share of its plain read's rate is {low['backend']}'s,"
                     f" {_share(low['read'] / low['scan'])}.")
    for r in ok:
        if r["records"] != target:
            facts.append(f"{r['backend']} at {r['records']:,} records: {_secs(r['scan'])} a scan,"
                         f" {_share(r['read'] / r['scan'])} of its plain read's rate.")
    stopped = [r for r in rows if r.get("failed", "").startswith("control: stopped")]
    for r in stopped:
        facts.append(f"{r['backend']} at {r['records']:,} records: the first scan (of the store as loaded) did not"
                     f" finish within {result['scan_limit']} s and was stopped, so that case has no figures.")
    failed = [r for r in rows if "failed" in r and r not in stopped]
    if failed:
        facts.append("Failed in this run: " + "; ".join(f"{r['backend']} at {r['records']:,} ({r['failed']})"
                                                        for r in failed) + ".")
    if facts:
        lines += ["", " ".join(facts)]
    for r in ok:
        before = r["before"]
        if before["recoverable"]:
            held = [p for p in before["places"] if p["recoverable"]]
            named = f"{before['ids_named']:,} ids named" if before["ids_named"] else "no record named"
            lines += ["", f"{r['backend']} at {r['records']:,} records: the scan of the store as loaded, before any"
                      f" delete, already read as recoverable ({named}; "
                      + ", ".join((f"{p['count']:,} records, " if p["count"] else "")
                                  + f"{p['bytes']:,} non-zero bytes in {p['kind']}" for p in held) + ")."]
    for r in ok:
        after = r["after"]
        if r["in_files"] < r["deleted"] and r["backend"] != "pgvector":
            text = (f"{r['backend']} at {r['records']:,} records: a byte search finds {r['in_files']:,} of the"
                    f" {r['deleted']:,} deleted ids in the store's files after the delete; the scan names"
                    f" {after['ids_named']:,}")
            if after["recoverable"] and not after["ids_named"] and not any(p["count"] for p in after["places"]):
                text += ", and its verdict rests on " + ", ".join(
                    f"{p['bytes']:,} non-zero bytes in {p['kind']}" for p in after["places"] if p["recoverable"])
            lines += ["", text + "."]
    for r in ok:
        if r["backend"] == "pgvector":
            kinds = [p["kind"] for p in r["after"]["places"]]
            dead = "counted from the statistics collector (`n_dead_tup`: pgstattuple is not installed in the" \
                   " embedded server), so the scan reads no table page" if any("n_dead_tup" in k for k in kinds) \
                else "counted by pgstattuple, which reads the heap"
            lines += ["", f"pgvector: of its {_mib(r['bytes']):.0f} MiB, {_mib(r['heap_bytes']):.0f} MiB are the"
                      f" heap, which the `SELECT *` reads; the dead tuples are {dead}."]
    if lowered:
        lines += ["", "Other counts in this run (`TOMBSTONE_BENCH_FSCAN_CASES`): " + "; ".join(
            f"{r['backend']} at {r['records']:,} records" for r in lowered) + "."]
    unstable = [r["backend"] for r in ok if not r.get("stable", True)]
    if unstable:
        lines += ["", f"The scan's findings differed between its runs for: {', '.join(unstable)}."]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] in PHASES:
        sys.path.insert(0, str(HERE))
        print(json.dumps(PHASES[sys.argv[1]](sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))))
    else:
        sys.exit("usage: python benchmarks/run.py forensic_scan   (or: forensic_scan.py PHASE BACKEND N WORKDIR)")
