"""pgvector at scale: one subject's erasure as the table grows, and what each statement of its reclaim costs.

Each case (size) is built in one process (``python benchmarks/pgvector_scale.py build SIZE WORKDIR``) and
measured in another (``... case SIZE WORKDIR``), as ``tombstone erase`` runs in a process of its own. A case is
an embedded PostgreSQL with one pgvector table of ``size`` dim-384 unit vectors in subjects of 100 chunks,
lineage recorded for every chunk; the rows are loaded with ``COPY`` and the HNSW index built once after (the
bulk load: the floor of any rewrite of the table). The measuring process then:

- opens the store as an erasure does, and erases one subject end to end (``Tombstone.erase``), with the
  saga's steps from the journal's stamps;
- runs each statement of the reclaim on its own, timed, for a second subject's rows (``DELETE``, ``VACUUM
  FULL``, ``ANALYZE``, ``CHECKPOINT``), and ``REINDEX`` of the HNSW index (which the reclaim ran before
  ``VACUUM FULL`` until it was found to build the same graph again, and still runs where ``VACUUM FULL`` is
  refused): what grows with the table, and why;
- erases a batch of ``BATCH`` other subjects (``erase_many``) against one.

Sizes: ``TOMBSTONE_BENCH_PG_SIZES`` (default ``10000,100000,1000000``; above ``TOMBSTONE_BENCH_PG_ALL_UP_TO`` the
rebuilds timed on their own and the batch are left out). ``TOMBSTONE_BENCH_PG_BUILD_MEMORY`` is the bulk load's
index build memory; ``TOMBSTONE_BENCH_PG_CACHE`` a folder of measured cases, reused and kept. Every server started
is stopped again.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from scale import _steps  # the saga's steps from the journal's stamps, as the other scale cases read them

HEADINGS = ("pgvector at scale: one subject's erasure and its reclaim's statements",)
DIM = 384
CHUNKS = 100
BATCH = int(os.environ.get("TOMBSTONE_BENCH_PG_BATCH", "10"))
SIZES = tuple(int(n) for n in os.environ.get("TOMBSTONE_BENCH_PG_SIZES", "10000,100000,1000000").split(","))
MEMORY = os.environ.get("TOMBSTONE_BENCH_PG_MEMORY", "1GB")
BUILD_MEMORY = os.environ.get("TOMBSTONE_BENCH_PG_BUILD_MEMORY")
"""``maintenance_work_mem`` of the bulk load's index build, where set (else the server's): at a million rows the
graph is some 2 GB, and a build that spills out of memory runs for hours."""
"""``maintenance_work_mem`` of the statements timed with more memory than the server's default (the store option)."""
STATEMENTS = ("DELETE", "VACUUM FULL", "VACUUM FULL, more memory", "REINDEX, more memory", "ANALYZE", "CHECKPOINT")
ALL_MEMORY_UP_TO = int(os.environ.get("TOMBSTONE_BENCH_PG_ALL_UP_TO", "100000"))
"""The largest size whose case runs every statement: above it the whole-table rebuilds timed on their own (``VACUUM
FULL`` at the server's 64MB and with ``MEMORY``, ``REINDEX``) are left out, each a build of the graph that the
erasure's own ``VACUUM FULL`` already timed (at 64MB a graph many times larger than the memory), and so is the
batch (one ``VACUUM FULL`` again)."""
CACHE = Path(os.environ["TOMBSTONE_BENCH_PG_CACHE"]) if os.environ.get("TOMBSTONE_BENCH_PG_CACHE") else None
"""A folder of measured cases (``pg-SIZE.json``): a size found there is taken from it, one measured is kept there."""
TABLE, INDEX = "bench", "bench_embedding_hnsw"


def _vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _ids(ref: str) -> list[str]:
    return [f"{ref}-chunk-{k:03d}" for k in range(CHUNKS)]


def build(size: int, tmp: Path) -> dict:
    """The case's deployment under ``tmp/deploy``, its server stopped again; what the measuring process needs."""
    import psycopg

    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone.capture.vector import capture_vectors
    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn
    from tombstone_adapters.pgvector.server import stop_embedded

    config = init_deployment(tmp / "deploy", {"pg": {"backend": "pgvector", "data_dir": "stores/pgdata",
                                                      "table": TABLE}})
    data_dir = config.stores["pg"].options["data_dir"]
    embedder = HashingEmbedder(DIM)
    refs = [f"s{i:05d}" for i in range(size // CHUNKS)]
    out: dict = {"refs": refs}
    start = time.perf_counter()
    try:
        with Tombstone(config) as tomb, psycopg.connect(embedded_dsn(data_dir), autocommit=True) as conn:
            PgVectorStore(conn, TABLE, dim=DIM, store="pg")  # the table and its HNSW index, as the wrapper makes them
            conn.execute(f"DROP INDEX {INDEX}")  # loaded first and indexed once, as a bulk load does
            rows = []
            for i, ref in enumerate(refs):
                docs = [f"{ref} chunk {k}: words of a support ticket about an order and a parcel" for k in range(CHUNKS)]
                cap = capture_vectors(embedder, store="pg", backend="pgvector", ids=_ids(ref), documents=docs,
                                      embeddings=_vectors(CHUNKS, i))
                tomb.lineage.record_artifacts(ref, cap.records, probes=cap.probes)
                rows += [(aid, doc, "[" + ",".join(f"{x:.7g}" for x in v) + "]")
                         for aid, doc, v in zip(_ids(ref), docs, cap.vectors)]
            out["lineage"] = time.perf_counter() - start
            t = time.perf_counter()
            with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, document, embedding) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            out["copy"] = time.perf_counter() - t
            if BUILD_MEMORY:
                conn.execute(f"SET maintenance_work_mem = '{BUILD_MEMORY}'")
            out["build_memory"] = conn.execute("SHOW maintenance_work_mem").fetchone()[0]
            t = time.perf_counter()
            conn.execute(f"CREATE INDEX {INDEX} ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
            out["index_build"] = time.perf_counter() - t
            conn.execute("RESET maintenance_work_mem")
            conn.execute(f"ANALYZE {TABLE}")
            conn.execute("CHECKPOINT")
            out["settings"] = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                               for name in ("maintenance_work_mem", "max_parallel_maintenance_workers", "shared_buffers")}
            out["server"] = conn.execute("SELECT current_setting('server_version'),"
                                         " (SELECT extversion FROM pg_extension WHERE extname = 'vector')").fetchone()
    finally:
        stop_embedded(data_dir)
    out["load"] = time.perf_counter() - start
    return out


def case(size: int, tmp: Path) -> dict:
    """Measure a case ``build`` made, in a process of its own."""
    import psycopg

    from tombstone import Tombstone
    from tombstone.config import load_config
    from tombstone_adapters.pgvector import embedded_dsn
    from tombstone_adapters.pgvector.server import stop_embedded

    built = json.loads((tmp / "build.json").read_text())
    config, refs = load_config(tmp / "deploy" / "tombstone.toml"), built["refs"]
    data_dir = config.stores["pg"].options["data_dir"]
    out: dict = {"size": size, **{k: built[k] for k in ("load", "lineage", "copy", "index_build", "settings", "server")}}
    try:
        with Tombstone(config) as tomb:
            t = time.perf_counter()
            tomb.adapter("pg")
            out["open"] = time.perf_counter() - t
            t = time.perf_counter()
            receipt, _ = tomb.erase(refs[0])
            out["erase"] = time.perf_counter() - t
            assert receipt["summary"].get("VERIFIED") == CHUNKS, receipt["summary"]
            out["steps"] = _steps(tomb, receipt["saga_id"])
            reclaim = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
            out["reclaim_steps"], out["reclaim_memory"] = reclaim["steps"], reclaim.get("maintenance_work_mem")
            out["build_memory"] = built.get("build_memory")
            with psycopg.connect(embedded_dsn(data_dir), autocommit=True) as conn:
                out["table_mib"] = conn.execute(f"SELECT pg_table_size('{TABLE}')").fetchone()[0] / 1048576
                out["index_mib"] = conn.execute(f"SELECT pg_relation_size('{INDEX}')").fetchone()[0] / 1048576
                timed: dict[str, float | None] = {}
                for name, statement, params in (
                        ("DELETE", f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (_ids(refs[1]),)),
                        ("VACUUM FULL", f"VACUUM FULL {TABLE}", None),
                        ("VACUUM FULL, more memory", f"VACUUM FULL {TABLE}", MEMORY),
                        ("REINDEX, more memory", f"REINDEX INDEX {INDEX}", MEMORY),
                        ("ANALYZE", f"ANALYZE {TABLE}", None), ("CHECKPOINT", "CHECKPOINT", None)):
                    if size > ALL_MEMORY_UP_TO and name in ("VACUUM FULL", "VACUUM FULL, more memory",
                                                            "REINDEX, more memory"):
                        timed[name] = None
                        continue
                    memory = params if isinstance(params, str) else None
                    if memory:
                        conn.execute(f"SET maintenance_work_mem = '{memory}'")
                    t = time.perf_counter()
                    conn.execute(statement, None if memory else params)
                    timed[name] = time.perf_counter() - t
                    if memory:
                        conn.execute("RESET maintenance_work_mem")
                out["statements"] = timed
                out["memory"] = MEMORY
            if size <= ALL_MEMORY_UP_TO:
                t = time.perf_counter()
                batch = tomb.erase_many(refs[2 : 2 + BATCH])
                out["batch"] = time.perf_counter() - t
                out["batch_subjects"] = len(batch)
                assert all(r["summary"].get("VERIFIED") == CHUNKS for r, _ in batch)
            out["load_average"] = os.getloadavg()[0]
    finally:
        stop_embedded(data_dir)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["measured_at"] = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return out


GRAPH_ROWS, GRAPH_MEMORY = 20_000, "16MB"


def graph(tmp: Path) -> dict:
    """Bytes an HNSW build's graph takes in memory per dim-384 row, from pgvector's notice of the row at which
    the graph of ``GRAPH_ROWS`` rows outgrew ``GRAPH_MEMORY``, against the built index's bytes per row on disk
    (what ``graph_memory`` in the adapter sizes the reclaim's memory from)."""
    import psycopg

    from tombstone_adapters.pgvector import embedded_dsn
    from tombstone_adapters.pgvector.server import stop_embedded

    data, notices = tmp / "graph" / "data", []
    try:
        with psycopg.connect(embedded_dsn(data), autocommit=True) as conn:
            conn.add_notice_handler(lambda n: notices.append(n.message_primary or ""))
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute(f"CREATE TABLE g (id bigint PRIMARY KEY, e vector({DIM}))")
            with conn.cursor() as cur, cur.copy("COPY g (id, e) FROM STDIN") as copy:
                for i, v in enumerate(_vectors(GRAPH_ROWS, 7)):
                    copy.write_row((i, "[" + ",".join(f"{x:.7g}" for x in v) + "]"))
            conn.execute(f"SET maintenance_work_mem = '{GRAPH_MEMORY}'")
            conn.execute("CREATE INDEX g_hnsw ON g USING hnsw (e vector_cosine_ops)")
            index = conn.execute("SELECT pg_relation_size('g_hnsw')").fetchone()[0]
            memory = conn.execute("SELECT setting::bigint * 1024 FROM pg_settings"
                                  " WHERE name = 'maintenance_work_mem'").fetchone()[0]
    finally:
        stop_embedded(data)
    found = [int(m.group(1)) for n in notices if (m := re.search(r"no longer fits .* after (\d+) tuples", n))]
    if not found:
        raise RuntimeError(f"no notice that the graph outgrew {GRAPH_MEMORY}: {notices}")
    return {"rows": GRAPH_ROWS, "memory": GRAPH_MEMORY, "fit_rows": found[0], "in_memory": memory / found[0],
            "on_disk": index / GRAPH_ROWS}


def run(tmp: Path, sizes=SIZES) -> dict:
    cases, failed = [], []
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "graph", str(tmp)], capture_output=True,
                          text=True, check=False)
    per_row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    if per_row is None:
        print(f"  pgvector graph per row: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
    for size in sizes:
        kept = CACHE / f"pg-{size}.json" if CACHE is not None else None
        if kept is not None and kept.is_file():  # measured by an earlier run, in processes of its own
            cases.append({**json.loads(kept.read_text()), "reused": True})
            print(f"  pgvector {size}: from {kept}", file=sys.stderr, flush=True)
            continue
        work = tmp / f"pg-{size}"
        work.mkdir(parents=True)
        me = str(Path(__file__).resolve())
        proc = subprocess.run([sys.executable, me, "build", str(size), str(work)], capture_output=True, text=True,
                              check=False)
        if proc.returncode == 0:
            (work / "build.json").write_text(proc.stdout.strip().splitlines()[-1])
            proc = subprocess.run([sys.executable, me, "case", str(size), str(work)], capture_output=True, text=True,
                                  check=False)
        if proc.returncode != 0:
            print(f"  pgvector {size}: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            failed.append(f"{size:,}")
            continue
        cases.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(cases[-1]))
        print(f"  pgvector {size}: erase {cases[-1]['erase']:.2f} s", file=sys.stderr, flush=True)
    if not cases:
        raise RuntimeError(f"every case failed: {', '.join(failed)}")
    return {"cases": cases, "failed": failed, "batch": BATCH, "graph": per_row}


def _seconds(value: float | None) -> str:
    return "not run" if value is None else f"{value:.2f} s"


def _graph_sentence(g: dict | None) -> str:
    if not g:
        return "the graph's memory per row was not measured in this run."
    return (f"measured here, an index of {g['rows']:,} dim-384 rows built with {g['memory']} had its graph outgrow"
            f" the memory after {g['fit_rows']:,} rows: about {g['in_memory']:,.0f} bytes a row in memory,"
            f" {g['in_memory'] / g['on_disk']:.2f} times the built index's {g['on_disk']:,.0f} bytes a row on disk.")


def section(result: dict) -> str:
    cases = sorted(result["cases"], key=lambda c: c["size"])
    first = cases[0]
    version, ext = first["server"]
    settings = ", ".join(f"`{k}` {v}" for k, v in first["settings"].items())
    memory = first.get("memory", MEMORY)
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"The embedded PostgreSQL {version} with pgvector {ext} ({settings}; the defaults), one table of dim-384 unit"
        f" vectors in subjects of {CHUNKS} chunks with an HNSW index (cosine, pgvector's default parameters), lineage"
        " recorded for every chunk. Each case is built in one process (rows loaded with `COPY`, the index built once"
        " after: the *bulk load*, the floor of any rewrite of the table) and measured in another: one subject's"
        " erasure end to end (`Tombstone.erase`, its reclaim with the memory in the *reclaim memory* column), then"
        " each statement of the reclaim run on its own for a second subject's rows (`VACUUM FULL` with the"
        f" server's `maintenance_work_mem` and again with {memory}, as the store option `maintenance_work_mem` sets"
        " it for the reclaim; and `REINDEX` of the HNSW index, which the reclaim runs only where `VACUUM FULL` is"
        f" refused), then a batch of {result['batch']} other subjects (`erase_many`). One run per size on two"
        " shared cores; *peak memory* is the measuring Python process's (the server's processes are apart).",
        "",
        "| vectors | table + index MiB | bulk load: COPY, index build (memory) | one subject's erase | reclaim memory |"
        f" of which reclaim | of which verify | DELETE | VACUUM FULL | VACUUM FULL, {memory} |"
        f" REINDEX (HNSW), {memory} | ANALYZE | CHECKPOINT | batch: subjects, time (x one subject) | peak memory |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        st = c["statements"]
        batch = (f"{c['batch_subjects']}: {c['batch']:.2f} s ({c['batch'] / c['erase']:.1f}x)" if "batch" in c
                 else "not run")
        lines.append(
            f"| {c['size']:,} | {c['table_mib']:.0f} + {c['index_mib']:.0f} | {c['copy']:.1f} s,"
            f" {c['index_build']:.1f} s ({c.get('build_memory') or c['settings']['maintenance_work_mem']}) |"
            f" {c['erase']:.2f} s | {c.get('reclaim_memory') or c['settings']['maintenance_work_mem']} |"
            f" {c['steps'].get('reclaim', 0):.2f} s | {c['steps'].get('verify', 0):.2f} s |"
            + "".join(f" {_seconds(st.get(name))} |" for name in STATEMENTS)
            + f" {batch} | {c['peak_rss_mib']:.0f} MiB |")
    lines += ["", f"The reclaim's steps, as its receipt lists them: {'; '.join(first['reclaim_steps'])}."]
    unsized = [f"{c['size']:,}" for c in cases if not c.get("reclaim_memory")]
    if unsized:
        lines += ["", f"The erasures at {', '.join(unsized)} ran before the embedded server's reclaim had memory of"
                  " its own: with the server's 64MB (the *VACUUM FULL, 1GB* column is what 1GB does)."]
    skipped = [f"{c['size']:,}" for c in cases if any(c["statements"].get(n) is None for n in STATEMENTS)]
    if skipped:
        lines += ["", f"At {', '.join(skipped)} the rebuilds timed on their own (*VACUUM FULL* with 64MB and with"
                  f" {memory}, *REINDEX*) and the batch were not run: each builds the same graph as the erasure's own"
                  " `VACUUM FULL`, which the *of which reclaim* column times, and with less memory than the graph"
                  " needs each would be many times slower (the 100,000 row shows 64MB against 1GB)."]
    for a, b in zip(cases, cases[1:]):
        grow = lambda key: f"{b[key] / a[key]:.1f}x" if a.get(key) else "n/a"  # noqa: E731,B023
        stmt = ", ".join(f"{name} {b['statements'][name] / a['statements'][name]:.1f}x" for name in STATEMENTS
                         if a["statements"].get(name) and b["statements"].get(name) is not None)
        lines += ["", f"From {a['size']:,} to {b['size']:,} vectors ({b['size'] // a['size']}x the data): one"
                  f" subject's erase {grow('erase')} (its reclaim"
                  f" {b['steps'].get('reclaim', 0) / max(a['steps'].get('reclaim', 0), 1e-9):.1f}x), the index build"
                  f" of the bulk load {grow('index_build')}; each statement on its own: {stmt}."]
    spill = [c for c in cases if c["statements"].get("VACUUM FULL") and c["statements"].get("VACUUM FULL, more memory")]
    if spill:
        c = spill[-1]
        lines += ["", f"At {c['size']:,} rows `VACUUM FULL` with the server's {c['settings']['maintenance_work_mem']}"
                  f" took {c['statements']['VACUUM FULL']:.0f} s, with {memory}"
                  f" {c['statements']['VACUUM FULL, more memory']:.0f} s"
                  f" ({c['statements']['VACUUM FULL'] / c['statements']['VACUUM FULL, more memory']:.1f}x)."]
    reused = [f"{c['size']:,} ({c.get('measured_at', 'date not kept')})" for c in cases if c.get("reused")]
    if reused:
        lines += ["", "Sizes taken from an earlier run's case files (`TOMBSTONE_BENCH_PG_CACHE`), each measured in"
                  f" processes of its own: {', '.join(reused)}."]
    loads = [c["load_average"] for c in cases if "load_average" in c]
    if loads:
        lines += ["", f"The host's one-minute load average as each case ended: {min(loads):.1f} to {max(loads):.1f}"
                  f" ({os.cpu_count()} cores)."]
    if result.get("failed"):
        lines += ["", f"Sizes that failed in this run (see its output): {', '.join(result['failed'])}."]
    lines += ["", "What grows, and why: the DELETE touches only the subject's rows (through the primary key), but"
              " `VACUUM FULL` writes the whole table again into a new file and builds every index of it from"
              " scratch, HNSW graph included: mostly the bulk load's index build again, growing with the table as"
              " that build does. It is what makes the erased vectors leave the files: a plain `VACUUM` marks the"
              " rows' space free and leaves their bytes and the graph's copies of them where they are (the"
              " residue table above). `REINDEX` alone costs about as much as `VACUUM FULL` with the same memory: the"
              " reclaim ran it before `VACUUM FULL`, which built the graph a second time, and now runs it only where"
              " `VACUUM FULL` is refused. `ANALYZE` samples a fixed number of rows, so it grows little; the"
              " `CHECKPOINT` writes what the rewrite left in shared buffers.",
              "", "Memory decides the rebuild's pace. pgvector builds the graph in `maintenance_work_mem` and, once"
              " the graph outgrows it, goes on inserting row by row into the index on disk (its notice: \"hnsw graph"
              " no longer fits into maintenance_work_mem after N tuples\"); " + _graph_sentence(result.get("graph"))
              + " At 100,000 rows (a 195 MiB index) PostgreSQL's default of 64MB holds a third of the graph (the"
              " rebuild's times with each memory are above). At 1,000,000 rows the graph is about 2.1 GB: 1GB"
              " would hold half of it (a rebuild with 1GB was not timed at that size). So on the embedded server the reclaim sets its session's"
              " `maintenance_work_mem` to 1GB or, where the table's largest HNSW index needs more, 1.25 bytes a byte"
              " of it (at most a quarter of the machine's memory); on a server given by `dsn` it keeps the server's"
              " setting, and where the graph will not fit in it, its steps say so and name the store option"
              " `maintenance_work_mem` that raises it.",
              "", "A batch shares the one `VACUUM FULL`, and its logical probe searches only the ids a row still"
              " holds (every search returns rows named by their id), so after a clean erasure it searches"
              " nothing: before this, a batch of 10 subjects at 10,000 rows ran 8,000 searches (in a profile, 16.5 s of"
              " a 20.5 s batch, on cores shared with another run)."]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "graph":
        print(json.dumps(graph(Path(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] in ("build", "case"):
        step = build if sys.argv[1] == "build" else case
        print(json.dumps(step(int(sys.argv[2]), Path(sys.argv[3]))))
    else:
        sys.exit("usage: python benchmarks/run.py pgvector_scale   (or: pgvector_scale.py build|case SIZE WORKDIR)")
