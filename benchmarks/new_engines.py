"""The embedded engines added last (sqlite-vec, LanceDB): residue after each one's own delete vs after the
erasure, and erase and scan times at 10k and 100k.

A store of dim-384 float32 unit vectors (random, seed 7) with a short text per row, in subjects of 10 chunks,
written through the backend's wrapper (lineage and probe fragments recorded with the offline hashing
embedder; the vectors given). Residue: 20 subjects deleted with the engine's own delete (sqlite-vec: vec0's
``DELETE`` with ``secure_delete`` off, upstream SQLite's default; LanceDB: ``delete`` then its default
``optimize``), then an independent byte search of the store's folder (no Tombstone code) for each row's vector
bytes, id and text; then the same 20 subjects erased (``Tombstone.erase``) and searched again. Times: one
subject's erase end to end (median of 3), and ``tombstone scan`` of the store (once), per size.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

HEADINGS = ("sqlite-vec: residue after its own delete vs after reclaim, and times at 10k and 100k",
            "LanceDB: residue after its own delete and optimize vs after the erasure, and times at 10k and 100k",
            "Qdrant Edge: residue after its own delete and optimize vs after the erasure, and times at 10k and 100k")
BACKENDS = ("sqlitevec", "lancedb", "qdrant_edge")
SIZES = (10_000, 100_000)
CHUNKS = 10
DIM = 384
RESIDUE_SUBJECTS = 20


def _build(root: Path, size: int, backend: str):
    import pyarrow as pa

    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder

    options = {"sqlitevec": {"backend": "sqlitevec", "path": "stores/vec/vectors.db"},
               "lancedb": {"backend": "lancedb", "path": "stores/vec", "table": "chunks"},
               "qdrant_edge": {"backend": "qdrant_edge", "path": "stores/vec"}}[backend]
    config = init_deployment(root, {"vec": options})
    path = Path(config.stores["vec"].options["path"])
    rng = np.random.default_rng(7)
    subjects = [f"s{n:06d}" for n in range(size // CHUNKS)]
    start = time.perf_counter()
    with Tombstone(config) as tomb:
        if backend == "sqlitevec":
            from tombstone_adapters.sqlitevec import VecStore

            store = VecStore(path, dim=DIM, lineage=tomb.lineage, embedder=HashingEmbedder(DIM), store="vec")
        elif backend == "qdrant_edge":
            from tombstone_adapters.qdrant_edge import TombstoneEdgeShard

            store = TombstoneEdgeShard(path, dim=DIM, lineage=tomb.lineage, embedder=HashingEmbedder(DIM), store="vec")
            store.add = lambda ids, texts, **kw: store.upsert(ids, texts, **kw)
        else:
            import lancedb

            from tombstone_adapters.lancedb import TombstoneLanceTable

            db = lancedb.connect(str(path))
            db.create_table("chunks", schema=pa.schema([("id", pa.string()), ("text", pa.string()),
                                                        ("vector", pa.list_(pa.float32(), DIM))]))
            store = TombstoneLanceTable(db, "chunks", lineage=tomb.lineage, embedder=HashingEmbedder(DIM), store="vec")
        per_call = 100 if backend == "lancedb" else 1  # LanceDB writes a data file and a version per add
        for at in range(0, len(subjects), per_call):
            for subject in subjects[at : at + per_call]:
                vectors = rng.normal(size=(CHUNKS, DIM)).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                ids = [f"{subject}-chunk-{i:02d}" for i in range(CHUNKS)]
                store.add(ids, [f"note {i} of {subject}: account details and a private message" for i in range(CHUNKS)],
                          subject=subject, vectors=vectors)
        if backend == "sqlitevec":
            store.close()
        elif backend == "lancedb":
            from datetime import timedelta

            import lance

            ds = lance.dataset(str(path / "chunks.lance"))
            ds.optimize.compact_files()  # the app's own housekeeping after loading: one data file per fragment
            lance.dataset(str(path / "chunks.lance")).cleanup_old_versions(older_than=timedelta(0))
    return config, path, subjects, time.perf_counter() - start


def _found(folder: Path, needles: dict[str, list[bytes]]) -> int:
    """Rows of which an independent byte search of every file in ``folder`` still finds any needle."""
    data = b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())
    return sum(any(n in data for n in ns) for ns in needles.values())


def _needles(path: Path, subjects: list[str], backend: str) -> dict[str, list[bytes]]:
    out = {}
    wanted = [f"{subject}-chunk-{i:02d}" for subject in subjects for i in range(CHUNKS)]
    if backend == "qdrant_edge":
        from tombstone_adapters.qdrant_edge.store import point_id, shard_at

        for record in shard_at(path, "vec").retrieve([point_id(a) for a in wanted], True, True):
            aid = record.payload["tombstone_id"]
            out[aid] = [np.asarray(record.vector, dtype="<f4").tobytes()[:128], aid.encode(),
                        record.payload["document"].encode()]
        return out
    if backend == "sqlitevec":
        from tombstone_adapters.sqlitevec.store import connect

        conn = connect(path, "vec")
        try:
            for aid in wanted:
                blob, text = conn.execute("SELECT embedding, text FROM chunks WHERE id = ?", (aid,)).fetchone()
                out[aid] = [bytes(blob)[:128], aid.encode(), text.encode()]
        finally:
            conn.close()
        return out
    import lance

    rows = lance.dataset(str(path / "chunks.lance")).to_table().to_pylist()
    keep = set(wanted)
    for row in rows:
        if row["id"] in keep:
            out[row["id"]] = [np.asarray(row["vector"], dtype=np.float32).tobytes()[:128], row["id"].encode(),
                              row["text"].encode()]
    return out


def _own_delete(path: Path, ids: list[str], backend: str) -> None:
    if backend == "qdrant_edge":
        import qdrant_edge as qe

        from tombstone_adapters.qdrant_edge.store import point_id, shard_at

        shard = shard_at(path, "vec")
        shard.update(qe.UpdateOperation.delete_points([point_id(i) for i in ids]))
        shard.flush()
        shard.optimize()
        return
    if backend == "sqlitevec":
        from tombstone_adapters.sqlitevec import VecStore

        store = VecStore(path, store="vec")
        store.delete(ids)
        store.close()
        return
    import lancedb

    table = lancedb.connect(str(path)).open_table("chunks")
    for at in range(0, len(ids), 500):
        table.delete("id IN (" + ", ".join(f"'{i}'" for i in ids[at : at + 500]) + ")")
    table.optimize()


def _scan(backend: str, options) -> dict | None:
    if backend == "qdrant_edge":
        return None  # the backend cannot scan yet
    if backend == "sqlitevec":
        from tombstone_adapters.sqlitevec.forensics import scan_sqlitevec

        return scan_sqlitevec("vec", options).as_json()
    from tombstone_adapters.lancedb.forensics import scan_lancedb

    return scan_lancedb("vec", options).as_json()


def _case(tmp: Path, size: int, backend: str) -> dict:
    from tombstone import Tombstone

    config, path, subjects, build = _build(tmp / f"{backend}-{size}", size, backend)
    folder = path if path.is_dir() else path.parent
    out: dict = {"backend": backend, "size": size, "build": build,
                 "mib": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20}
    options = config.stores["vec"].options
    with Tombstone(config) as tomb:
        if size == SIZES[0]:
            chosen = subjects[-RESIDUE_SUBJECTS:]
            needles = _needles(path, chosen, backend)
            out["rows"] = len(needles)
            out["before"] = _found(folder, needles)
            _own_delete(path, list(needles), backend)
            out["after_delete"] = _found(folder, needles)
            out["scan_after_delete"] = (_scan(backend, options) or {}).get("count", "not yet")
            outcomes: dict[str, int] = {}
            for subject in chosen:
                receipt, _ = tomb.erase(subject)
                _count(outcomes, receipt)
            out["residue_outcomes"] = outcomes
            out["after_reclaim"] = _found(folder, needles)
            out["scan_after_reclaim"] = (_scan(backend, options) or {}).get("count", "not yet")
        times, outcomes = [], {}
        for subject in subjects[:3]:
            start = time.perf_counter()
            receipt, _ = tomb.erase(subject)
            times.append(time.perf_counter() - start)
            _count(outcomes, receipt)
        out["outcomes"] = outcomes
        out["erase"] = statistics.median(times)
        start = time.perf_counter()
        out["scan"] = time.perf_counter() - start if _scan(backend, options) is not None else None
    return out


def _count(outcomes: dict[str, int], receipt: dict) -> None:
    """What the erasure's receipt said of each artifact: STATUS(level)."""
    for artifact in receipt["artifacts"]:
        key = f"{artifact['status']}({artifact.get('level') or '-'})"
        outcomes[key] = outcomes.get(key, 0) + 1


def _said(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{n} {key}" for key, n in sorted(outcomes.items()))


def run(tmp: Path) -> dict:
    return {backend: {"rows": [_case(tmp, size, backend) for size in SIZES]} for backend in BACKENDS}


WHAT = {
    "sqlitevec": ("A vec0 table (sqlite-vec 0.1.6 through apsw)", "vec0's own `DELETE` (`secure_delete` off, upstream"
                  " SQLite's default)", "`VecStore`", "vec0's own DELETE",
                  " (each place a deleted row is found counts: its id-map row carved from free space, its entry in the"
                  " id map's index, its vector's slot)",
                  "One subject's erase reads every chunk's vectors (to zero a slot vec0 marked deleted wherever it is)"
                  " and passes over every page's free space, so it grows with the file; a batch pays both once."),
    "lancedb": ("A local LanceDB table (lancedb 0.40, written 100 subjects per `add`, then compacted and its old"
                " versions cleaned up, as an app's housekeeping would)", "LanceDB's own `delete` and then its default"
                " `optimize`", "`TombstoneLanceTable`", "delete + optimize", " (deleted ids decoded from the table's"
                " files)", "One subject's erase rewrites the fragments that held its rows and decodes every `.lance`"
                " file of the database for the physical probe, so it grows with the table; a batch pays both once."),
    "qdrant_edge": ("A Qdrant Edge shard (qdrant-edge-py 0.9, cosine)", "the shard's own `delete_points` and then its"
                    " `optimize`", "`TombstoneEdgeShard`", "delete + optimize", " (`tombstone scan` cannot scan this"
                    " backend yet)", "One subject's erase vacuums the segments that held its points and reads every"
                    " file of the shard for the physical probe, so it grows with the shard; a batch pays both once."
                    " Where a receipt says RESIDUAL, the erasure met an indexed segment (the shard builds one past its indexing threshold), where qdrant-edge-py 0.9 deletes nothing (verification-levels.md, Qdrant Edge): the probes found the points, as they must."),
}


def section(result: dict) -> str:
    out = []
    for heading, backend in zip(HEADINGS, BACKENDS):
        if backend not in result:
            continue
        rows = result[backend]["rows"]
        first = rows[0]
        n = first["rows"]
        table, deleted, wrapper, short, counted, growth = WHAT[backend]
        out += [
            f"## {heading}",
            "",
            f"{table} of dim-{DIM} float32 unit vectors with a short text per row, in subjects of {CHUNKS} chunks,"
            f" written through {wrapper} (lineage recorded). Residue: {RESIDUE_SUBJECTS} subjects ({n} rows)"
            f" deleted with {deleted}, then an independent byte search of the store's folder (no Tombstone code)"
            " for each row's vector bytes, id and text; then the same subjects erased with `Tombstone.erase` and"
            f" searched again; *`tombstone scan`* is what the read-only scan counts at each point{counted}.",
            "",
            "| after | rows the byte search still finds | `tombstone scan`: deleted records |",
            "|---|---|---|",
            f"| written (the control) | {first['before']} / {n} | |",
            f"| {short} | {first['after_delete']} / {n} | {first['scan_after_delete']} |",
            f"| Tombstone's erasure ({_said(first['residue_outcomes'])}) | {first['after_reclaim']} / {n} |"
            f" {first['scan_after_reclaim']} |",
            "",
            "| rows | store MiB | written through the wrapper | one subject's erase (median of 3) | what its receipts said | `tombstone scan` |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            scan = f"{r['scan']:.2f} s" if r.get("scan") is not None else "not yet"
            out.append(f"| {r['size']:,} | {r['mib']:.0f} | {r['build']:.1f} s | {r['erase']:.2f} s | {_said(r['outcomes'])} |"
                       f" {scan} |")
        out += ["", growth, ""]
    return "\n".join(out).rstrip()
