"""Vector stores (Chroma, FAISS, Qdrant local): four tables from one pass per backend.

- residue: ``2 * SUBJECTS`` subjects written through the wrapper, ``SUBJECTS`` erased with the store's own
  delete, a physical probe, one Tombstone reclaim, the probe again; subjects whose ids / fingerprints are found.
- time per saga step: median over 20 single-subject erasures, from the journal's begin/end stamps.
- scan throughput: ``scan_files`` vs ``grep -c -a -F -f`` over the residue store's files after its reclaim,
  the two called in turn, median of 5.

The write path has its own table (``write_path``).
"""

from __future__ import annotations

import subprocess
from importlib.metadata import version
from pathlib import Path

from builds import saga_step_times, vector_build
from common import DIM, DOCS, SUBJECTS, side_by_side
from tombstone import Tombstone
from tombstone.verify.scanner import scan_files

HEADINGS = (
    "Vector stores: residue after the store's own delete vs after reclaim",
    "Vector stores: time per saga step",
    "Vector stores: scan throughput on the store's files",
)
BACKENDS = ("chroma", "faiss", "qdrant")


def residue(backend: str, tmp: Path) -> dict:
    """``SUBJECTS`` subjects erased (another ``SUBJECTS`` survive): subjects whose ids / fingerprints the
    physical probe finds after the store's own delete, then after one Tombstone reclaim of all of them."""
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


def files_rate(files: list[Path], patterns: list[bytes], tmp: Path, reps: int = 5) -> dict:
    """MiB/s of ``scan_files`` and of ``grep -F -f`` over the same files, called in turn, median of ``reps``."""
    total = sum(p.stat().st_size for p in files)
    pattern_file = tmp / "patterns.bin"
    pattern_file.write_bytes(b"\n".join(patterns) + b"\n")
    t = side_by_side({
        "scan": lambda: scan_files(files, {str(i): p for i, p in enumerate(patterns)}),
        "grep": lambda: subprocess.run(["grep", "-c", "-a", "-F", "-f", str(pattern_file), *map(str, files)],
                                       stdout=subprocess.DEVNULL, check=False),
    }, reps)
    mib = total / (1 << 20)
    return {"mib": mib, "scan": mib / t["scan"], "grep": mib / t["grep"], "patterns": len(patterns), "reps": reps}


def run(tmp: Path) -> dict:
    out: dict = {"versions": {name: version(name) for name in ("chromadb", "faiss-cpu", "qdrant-client")},
                 "erasures": 20, "backends": {}}
    for backend in BACKENDS:
        res = residue(backend, tmp)
        out["backends"][backend] = {
            "residue": {"after_delete": res["after_delete"], "after_reclaim": res["after_reclaim"]},
            # grep -F -f takes text lines: the id patterns are what both tools can be compared on.
            "rate": files_rate(res["files"], res["patterns"], tmp / f"{backend}-residue"),
            "steps": saga_step_times(backend, tmp / f"{backend}-steps", out["erasures"]),
        }
    return out


def section(result: dict) -> str:
    v = result["versions"]
    backends = result["backends"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"{2 * SUBJECTS} subjects with {DOCS} chunks each ({DIM}-dim offline embedder); {SUBJECTS} subjects erased,"
        f" the other {SUBJECTS} survive. The store's own delete for all of them, a physical probe, one Tombstone"
        " reclaim, the probe again. Fingerprints are searched in every form the store writes (Chroma's"
        " normalised HNSW copy, Qdrant's pickled float64). Chroma "
        f"{v['chromadb']} (cosine, `hnsw:batch_size` 100, `hnsw:sync_threshold` 200); FAISS"
        f" {v['faiss-cpu']} (`remove_ids` is unsupported on HNSW, so its delete drops the id"
        f" mapping); qdrant-client {v['qdrant-client']} local mode with `secure_delete` off"
        " on its connection (upstream SQLite's default).",
        "",
        "| backend | after | subjects with ids found | subjects with fingerprints found |",
        "|---|---|---|---|",
    ]
    for backend, b in backends.items():
        r = b["residue"]
        lines += [
            f"| {backend} | store's own delete | {r['after_delete'][0]} / {SUBJECTS} | {r['after_delete'][1]} / {SUBJECTS} |",
            f"| {backend} | Tombstone reclaim | {r['after_reclaim'][0]} / {SUBJECTS} | {r['after_reclaim'][1]} / {SUBJECTS} |",
        ]
    lines += [
        "",
        f"## {HEADINGS[1]}",
        "",
        f"Median over {result['erasures']} single-subject erasures from a store of {SUBJECTS * DOCS} chunks"
        " (journal stamps).",
        "",
        "| backend | suppress | reclaim | verify (logical + physical) |",
        "|---|---|---|---|",
    ]
    for backend, b in backends.items():
        st = b["steps"]
        lines.append(f"| {backend} | {st.get('suppress', 0) * 1000:.1f} ms | {st.get('reclaim', 0) * 1000:.1f} ms |"
                     f" {st.get('verify', 0) * 1000:.1f} ms |")
    first = next(iter(backends.values()))
    lines += [
        "",
        f"## {HEADINGS[2]}",
        "",
        f"`scan_files` and `grep -c -a -F -f` over the same files (each store after its reclaim),"
        f" {first['rate']['patterns']} id patterns, median of {first['rate']['reps']},"
        " files in page cache.",
        "",
        "| backend | MiB scanned | `scan_files` | `grep -F -f` |",
        "|---|---|---|---|",
    ]
    for backend, b in backends.items():
        rt = b["rate"]
        lines.append(f"| {backend} | {rt['mib']:.1f} | {rt['scan']:.0f} MiB/s | {rt['grep']:.0f} MiB/s |")
    return "\n".join(lines)
