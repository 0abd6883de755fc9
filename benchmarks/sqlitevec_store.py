"""sqlite-vec: residue after vec0's own delete vs after reclaim, and erase and scan times at 10k and 100k.

A vec0 table of dim-384 float32 unit vectors (random, seed 7) with a short text per row, in subjects of 10
chunks, written through ``VecStore`` (lineage and probe fragments recorded with the offline hashing
embedder; the vectors given). Residue: 20 subjects deleted with vec0's own ``DELETE`` (``secure_delete``
off, upstream SQLite's default), then an independent byte search of the folder (no Tombstone code) for each
row's vector bytes, id and text; then the same 20 subjects erased (``Tombstone.erase``) and searched again.
Times: one subject's erase end to end (median of 3), and ``tombstone scan`` of the store (once), per size.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

HEADINGS = ("sqlite-vec: residue after its own delete vs after reclaim, and times at 10k and 100k",)
SIZES = (10_000, 100_000)
CHUNKS = 10
DIM = 384
RESIDUE_SUBJECTS = 20


def _build(root: Path, size: int):
    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.sqlitevec import VecStore

    config = init_deployment(root, {"vec": {"backend": "sqlitevec", "path": "stores/vec/vectors.db"}})
    path = Path(config.stores["vec"].options["path"])
    rng = np.random.default_rng(7)
    subjects = [f"s{n:06d}" for n in range(size // CHUNKS)]
    start = time.perf_counter()
    with Tombstone(config) as tomb:
        vec = VecStore(path, dim=DIM, lineage=tomb.lineage, embedder=HashingEmbedder(DIM), store="vec")
        for subject in subjects:
            vectors = rng.normal(size=(CHUNKS, DIM)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            ids = [f"{subject}-chunk-{i:02d}" for i in range(CHUNKS)]
            vec.add(ids, [f"note {i} of {subject}: account details and a private message" for i in range(CHUNKS)],
                    subject=subject, vectors=vectors)
        vec.close()
    return config, path, subjects, time.perf_counter() - start


def _found(folder: Path, needles: dict[str, list[bytes]]) -> int:
    """Rows of which an independent byte search of every file in ``folder`` still finds any needle."""
    data = b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())
    return sum(any(n in data for n in ns) for ns in needles.values())


def _needles(tomb, path: Path, subjects: list[str]) -> dict[str, list[bytes]]:
    import apsw  # noqa: F401  (the connection below is apsw's)
    from tombstone_adapters.sqlitevec.store import connect

    conn = connect(path, "vec")
    out = {}
    try:
        for subject in subjects:
            for i in range(CHUNKS):
                aid = f"{subject}-chunk-{i:02d}"
                blob, text = conn.execute("SELECT embedding, text FROM chunks WHERE id = ?", (aid,)).fetchone()
                out[aid] = [bytes(blob)[:128], aid.encode(), text.encode()]
    finally:
        conn.close()
    return out


def _case(tmp: Path, size: int) -> dict:
    from tombstone import Tombstone
    from tombstone_adapters.sqlitevec import VecStore
    from tombstone_adapters.sqlitevec.forensics import scan_sqlitevec

    config, path, subjects, build = _build(tmp / f"vec-{size}", size)
    out: dict = {"size": size, "build": build, "mib": path.stat().st_size / 2**20}
    with Tombstone(config) as tomb:
        if size == SIZES[0]:
            chosen = subjects[-RESIDUE_SUBJECTS:]
            needles = _needles(tomb, path, chosen)
            out["rows"] = len(needles)
            out["before"] = _found(path.parent, needles)
            vec = VecStore(path, store="vec")
            vec.delete(list(needles))
            vec.close()
            out["after_delete"] = _found(path.parent, needles)
            start = time.perf_counter()
            out["scan_after_delete"] = scan_sqlitevec("vec", config.stores["vec"].options).as_json()["count"]
            out["scan_time"] = time.perf_counter() - start
            for subject in chosen:
                receipt, _ = tomb.erase(subject)
                assert receipt["summary"].get("VERIFIED") == CHUNKS, receipt["summary"]
            out["after_reclaim"] = _found(path.parent, needles)
            out["scan_after_reclaim"] = scan_sqlitevec("vec", config.stores["vec"].options).as_json()["count"]
        times = []
        for subject in subjects[:3]:
            start = time.perf_counter()
            receipt, _ = tomb.erase(subject)
            times.append(time.perf_counter() - start)
            assert receipt["summary"].get("VERIFIED") == CHUNKS, receipt["summary"]
        out["erase"] = statistics.median(times)
        start = time.perf_counter()
        scan_sqlitevec("vec", config.stores["vec"].options)
        out["scan"] = time.perf_counter() - start
    return out


def run(tmp: Path) -> dict:
    return {"rows": [_case(tmp, size) for size in SIZES]}


def section(result: dict) -> str:
    first = result["rows"][0]
    n = first["rows"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"A vec0 table (sqlite-vec 0.1.6 through apsw) of dim-{DIM} float32 unit vectors with a short text per row,"
        f" in subjects of {CHUNKS} chunks, written through `VecStore` (lineage recorded). Residue: {RESIDUE_SUBJECTS}"
        f" subjects ({n} rows) deleted with vec0's own `DELETE` (`secure_delete` off, upstream SQLite's default),"
        " then an independent byte search of the store's folder (no Tombstone code) for each row's vector bytes,"
        " id and text; then the same subjects erased with `Tombstone.erase` and searched again; *`tombstone scan`*"
        " is what the read-only scan counts at each point (each place a deleted row is found counts: its id-map row"
        " carved from free space, its entry in the id map's index, its vector's slot).",
        "",
        "| after | rows the byte search still finds | `tombstone scan`: deleted records |",
        "|---|---|---|",
        f"| written (the control) | {first['before']} / {n} | |",
        f"| vec0's own DELETE | {first['after_delete']} / {n} | {first['scan_after_delete']} |",
        f"| Tombstone's erasure | {first['after_reclaim']} / {n} | {first['scan_after_reclaim']} |",
        "",
        "| rows | file MiB | written through the wrapper | one subject's erase (median of 3) | `tombstone scan` |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['size']:,} | {r['mib']:.0f} | {r['build']:.1f} s | {r['erase']:.2f} s | {r['scan']:.2f} s |")
    lines += ["", "One subject's erase reads every chunk's vectors (to zero a slot vec0 marked deleted wherever it is)"
                  " and passes over every page's free space, so it grows with the file; a batch pays both once."]
    return "\n".join(lines)
