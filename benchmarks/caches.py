"""Caches: residue after the cache's own delete vs after reclaim.

``2 * SUBJECTS`` subjects with one cached answer each in the exact cache (LangChain's SQLite cache,
``secure_delete`` off) and the semantic cache (a Chroma collection), each answer attributed to a recorded
source; ``SUBJECTS`` erased. Entry ids (and, for the semantic cache, prompt fingerprints) the physical probe
finds after the cache's own delete, then after Tombstone's reclaim; also how many erased fingerprints are
byte-identical to a survivor's.
"""

from __future__ import annotations

from pathlib import Path

from common import CHROMA_META, DIM, SUBJECTS, chunk_text
from tombstone import ArtifactRecord, Tombstone, init_deployment

HEADINGS = ("Caches: residue after the cache's own delete vs after reclaim",)


def run(tmp: Path) -> dict:
    import chromadb
    from langchain_core.outputs import Generation

    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.caches import TombstoneSQLiteCache, TombstoneSemanticCache, attribution

    config = init_deployment(tmp / "caches", {
        "exact_cache": {"backend": "exact_cache", "path": "stores/exact/cache.db", "secure_delete": False},
        "semantic_cache": {"backend": "semantic_cache", "path": "stores/semantic", "collection": "answers"}})
    refs = [f"bench-{i:04d}" for i in range(2 * SUBJECTS)]
    out: dict = {"stores": {}}
    with Tombstone(config) as tomb:
        exact = TombstoneSQLiteCache(config.stores["exact_cache"].options["path"], lineage=tomb.lineage,
                                     store="exact_cache")
        col = chromadb.PersistentClient(path=config.stores["semantic_cache"].options["path"]).create_collection(
            "answers", metadata=CHROMA_META, embedding_function=None)
        semantic = TombstoneSemanticCache(col, lineage=tomb.lineage, store="semantic_cache", embedder=HashingEmbedder(DIM))
        for i, ref in enumerate(refs):
            tomb.lineage.record_artifacts(ref, [ArtifactRecord("docs", f"{ref}-doc", "docstore", "document")])
            prompt = f"question {i}: " + chunk_text(i, 0)[:200]
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
            out["stores"][store] = {"own delete": found(adapter.probe_physical(arts))}
            adapter.reclaim(arts)
            out["stores"][store]["Tombstone reclaim"] = found(adapter.probe_physical(arts))
            if store == "semantic_cache":
                survivors = {tuple(a.fingerprint) for r in refs[SUBJECTS:]
                             for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(r)) if a.store == store}
                out["shared_fingerprints"] = sum(tuple(a.fingerprint) in survivors for a in arts)
    return out


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"{2 * SUBJECTS} subjects with one cached answer each, in the exact cache (LangChain's SQLite cache, with"
        " `secure_delete` off on the adapter's connection, upstream SQLite's default) and the semantic cache (a"
        f" Chroma collection); {SUBJECTS} erased. The exact cache is probed for the entry id (the prompt is never"
        " kept); the semantic cache for the entry id and the prompt embedding's fingerprint.",
        "",
        "| cache | after | entries with ids found | entries with fingerprints found |",
        "|---|---|---|---|",
    ]
    for store, res in result["stores"].items():
        for label, (ids_found, fps_found) in res.items():
            fps = f"{fps_found} / {SUBJECTS}" if store == "semantic_cache" else "n/a"
            lines.append(f"| {store} | {label} | {ids_found} / {SUBJECTS} | {fps} |")
    lines += [
        "",
        f"The offline embedder is sparse: {result['shared_fingerprints']} of the erased prompts' 32-dim fingerprints"
        " are byte-identical to a surviving entry's (counted from the lineage db in the same run), so fingerprint"
        " bytes found after the reclaim can be a survivor's. The entry id decides; no erased entry id remains.",
    ]
    return "\n".join(lines)
