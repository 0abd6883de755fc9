"""Crash-and-resume trials: kill ``tombstone erase`` with SIGKILL at a named point, resume, compare.

Used by the test suite (``tests/core/test_crash_resume.py``) and by ``benchmarks/run.py`` for RESULTS.md. A
trial copies a template deployment, runs ``tombstone erase`` in a subprocess with ``TOMBSTONE_KILL_AT``
set, runs ``tombstone resume`` (or ``erase`` again when the kill came before the saga existed), and
compares the receipt's statuses and every store's survivors with a clean run on an identical copy.
Survivors are read without Tombstone's adapters. Chroma vectors may differ by 2 float32 ULPs (Chroma
re-normalises on every indexing); everything else must be byte-identical.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np

GROUPS = {
    "graph": "chroma,docstore,exact_cache,semantic_cache",
    "files": "faiss,qdrant,pgvector",
}
SUBJECT = "user-0001"


def cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}, cwd=cwd, timeout=300)


def copy_deployment(src: Path, dst: Path) -> None:
    """Copy a deployment; an embedded PostgreSQL data directory must stay owned by the server's user."""
    shutil.copytree(src, dst)
    data = dst / "stores" / "pgvector" / "pgdata"
    if data.exists() and os.geteuid() == 0:
        import pwd

        owner = pwd.getpwnam("pgserver")
        for path in [data, *data.rglob("*")]:
            os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
        (data / "postmaster.pid").unlink(missing_ok=True)


def stop_embedded_postgres(root: Path) -> None:
    data = root / "stores" / "pgvector" / "pgdata"
    if (data / "postmaster.pid").exists():
        from pgserver import pg_ctl

        try:
            pg_ctl(["-D", str(data), "-m", "immediate", "stop"], user="pgserver")
        except Exception:
            pass


def statuses(root: Path) -> dict:
    receipt = json.loads((root / "receipts" / f"{SUBJECT}.json").read_text())
    return {(a["store"], a["artifact_id"]): (a["status"], a["level"], a["reason"]) for a in receipt["artifacts"]}


def _ulp_equal(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and int(np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64)).max(initial=0)) <= 2


def survivors(root: Path) -> dict:
    """Every surviving record of every store, read without Tombstone's adapters."""
    out: dict = {}
    stores = root / "stores"
    if (stores / "docstore").exists():
        con = sqlite3.connect(stores / "docstore" / "docstore.db")
        out["docstore"] = con.execute("SELECT id, text, metadata FROM documents ORDER BY id").fetchall()
        con.close()
    if (stores / "exact_cache").exists():
        con = sqlite3.connect(stores / "exact_cache" / "llm_cache.db")
        out["exact_cache"] = con.execute("SELECT entry_id, prompt, llm, idx, response FROM tombstone_llm_cache"
                                         " ORDER BY entry_id, idx").fetchall()
        con.close()
    for name, collection in (("chroma", "rag-chunks"), ("semantic_cache", "answers")):
        if (stores / name).exists():
            import chromadb

            client = chromadb.PersistentClient(path=str(stores / name))
            col = client.get_collection(collection)
            got = col.get(include=["documents", "metadatas", "embeddings"])
            queries = np.asarray(got["embeddings"][:3], dtype=np.float32) if len(got["ids"]) else None
            top = col.query(query_embeddings=queries, n_results=3, include=[])["ids"] if queries is not None else []
            out[name] = ({i: (d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])},
                         {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"])}, top)
            chromadb.api.client.SharedSystemClient.clear_system_cache()
    if (stores / "faiss").exists():
        from tombstone_adapters.faiss import FaissStore

        store = FaissStore(stores / "faiss", create=False)
        recs = store.get()
        out["faiss"] = ({i: (r["document"], r["metadata"]) for i, r in recs.items()},
                        {i: v for i, v in zip(recs, store.vectors(list(recs)))},
                        [[a for a, _ in row] for row in store.search(query_embeddings=store.vectors(list(recs)[:3]), k=3)])
    if (stores / "qdrant").exists():
        con = sqlite3.connect(next((stores / "qdrant").glob("collection/*/storage.sqlite")))
        points = [pickle.loads(b) for (b,) in con.execute("SELECT point FROM points")]
        con.close()
        out["qdrant"] = sorted((p.payload["tombstone_id"], json.dumps(p.payload, sort_keys=True), tuple(p.vector)) for p in points)
    if (stores / "pgvector").exists():
        import psycopg

        from tombstone_adapters.pgvector import embedded_dsn

        with psycopg.connect(embedded_dsn(stores / "pgvector" / "pgdata"), autocommit=True) as conn:
            out["pgvector"] = conn.execute("SELECT id, document, metadata::text, embedding::text FROM rag_chunks"
                                           " ORDER BY id").fetchall()
    return out


def same_survivors(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        if key in ("chroma", "semantic_cache", "faiss"):
            (ra, va, qa), (rb, vb, qb) = a[key], b[key]
            if ra != rb or qa != qb or va.keys() != vb.keys():
                return False
            if not all(_ulp_equal(va[i], vb[i]) for i in va):
                return False
        elif a[key] != b[key]:
            return False
    return True


def prepare(group: str, base: Path) -> dict:
    """Build a group's template deployment, run it cleanly once; return template, statuses, survivors and
    the kill points the clean run passed (step boundaries' before/done excluded: they repeat acting/acted)."""
    template = base / "template"
    built = cli("demo", "--workdir", str(template), "--backends", GROUPS[group], "--subjects", "3", "--erase", "none")
    if built.returncode != 0:
        raise RuntimeError(built.stderr)
    stop_embedded_postgres(template)
    clean = base / "clean"
    copy_deployment(template, clean)
    listing = base / "points.txt"
    ran = cli("erase", SUBJECT, "--config", str(clean / "tombstone.toml"), env={"TOMBSTONE_LIST_KILL_POINTS": str(listing)})
    if ran.returncode != 0:
        raise RuntimeError(ran.stderr)
    points = [p for p in listing.read_text().split() if not p.endswith((":before#1", ":done#1"))]
    prepared = {"template": template, "statuses": statuses(clean), "survivors": survivors(clean), "points": points}
    stop_embedded_postgres(clean)
    return prepared


def run_trial(root: Path, point: str, expected: dict) -> str | None:
    config = str(root / "tombstone.toml")
    killed = cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": point})
    if killed.returncode != -signal.SIGKILL:
        return f"not killed (rc {killed.returncode}): {killed.stderr[-500:]}"
    if point.startswith("saga:create:before"):
        # killed before the saga existed: nothing to resume, the operator runs erase again
        resumed = cli("erase", SUBJECT, "--config", config)
    else:
        resumed = cli("resume", "--config", config)
        if "no interrupted erasure" in resumed.stdout:
            return "resume found nothing to resume"
    if resumed.returncode != 0:
        return f"resume failed (rc {resumed.returncode}): {resumed.stderr[-500:]}"
    if not (root / "receipts" / f"{SUBJECT}.json").exists():
        return "no receipt after resume"
    if statuses(root) != expected["statuses"]:
        return f"statuses differ from the clean run: {statuses(root)}"
    if not same_survivors(survivors(root), expected["survivors"]):
        return "survivors differ from the clean run"
    return None


def run_trials(group: str, prepared: dict, workdir: Path) -> list[tuple[str, str | None]]:
    """Every kill point of a prepared group: (point, problem or None)."""
    results = []
    for n, point in enumerate(prepared["points"]):
        root = workdir / f"trial-{n}"
        copy_deployment(prepared["template"], root)
        try:
            results.append((point, run_trial(root, point, prepared)))
        finally:
            stop_embedded_postgres(root)
            shutil.rmtree(root, ignore_errors=True)
    return results
