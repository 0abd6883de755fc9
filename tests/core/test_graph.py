"""The lineage graph across stores: cascades into caches, third parties, gaps, scope, footprint."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tombstone import Tombstone
from tombstone.errors import ScopeViolationError
from tombstone.lineage.db import ArtifactRecord
from tombstone_adapters.caches import TombstoneSQLiteCache, attribution
from tombstone_adapters.caches.exact import entry_id

from test_cli import run


@pytest.fixture
def graph(tmp_path):
    """The demo's default deployment: docstore → chroma chunks → exact cache and semantic cache."""
    root = tmp_path / "d"
    result = run("demo", "--workdir", str(root), "--subjects", "3", "--erase", "none")
    assert result.exit_code == 0, result.output
    with Tombstone.open(root / "tombstone.toml") as tomb:
        yield tomb


def test_demo_receipt_shows_every_store_of_the_graph(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "2").exit_code == 0
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    kinds = {(a["backend"], a["kind"]) for a in receipt["artifacts"]}
    assert kinds == {("docstore", "document"), ("chroma", "vector"), ("exact_cache", "cache_entry"),
                     ("semantic_cache", "semantic_cache_entry")}
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}


def test_an_answer_built_from_an_erased_chunk_is_erased_even_if_cached_for_someone_else(graph):
    """Bob asked a question whose answer quoted Alice's chunk: the cached answer holds Alice's data, so
    erasing Alice erases it; Bob's own entries are untouched."""
    from langchain_core.outputs import Generation

    path = graph.config.stores["exact_cache"].options["path"]
    cache = TombstoneSQLiteCache(path, lineage=graph.lineage, store="exact_cache")
    alice_chunk = next(a for a, _ in graph.lineage.closure(graph.lineage.subject_key("user-0001")) if a.store == "chroma")
    with attribution("user-0002", [("chroma", alice_chunk.artifact_id)]):
        cache.update("What did the other customer say?", "demo-llm", [Generation(text="something of alice's")])
    with attribution("user-0002", []):
        cache.update("Bob's own question", "demo-llm", [Generation(text="bob only")])
    cache.engine.dispose()
    quoted = entry_id("What did the other customer say?", "demo-llm")
    bob_own = entry_id("Bob's own question", "demo-llm")
    receipt, _ = graph.erase("user-0001")
    entry = next(a for a in receipt["artifacts"] if a["artifact_id"] == quoted)
    assert entry["status"] == "VERIFIED" and "answer_built_from from chroma/" in entry["evidence"]["scope"]
    rows = sqlite3.connect(path).execute("SELECT entry_id FROM tombstone_llm_cache").fetchall()
    assert (bob_own,) in rows and (quoted,) not in rows
    assert quoted.encode() not in Path(path).read_bytes()


def test_third_party_copy_is_needs_human_never_verified(graph):
    doc = next(a for a, _ in graph.lineage.closure(graph.lineage.subject_key("user-0001")) if a.store == "docstore")
    graph.lineage.record_third_party("user-0001", "docstore", doc.artifact_id, "acme-support-desk",
                                     sent_at="2026-01-02T00:00:00.000000Z", note="ticket export")
    receipt, _ = graph.erase("user-0001")
    external = [a for a in receipt["artifacts"] if a["backend"] == "external"]
    assert len(external) == 1
    assert external[0]["status"] == "NEEDS_HUMAN"
    assert "acme-support-desk received a copy (2026-01-02T00:00:00.000000Z): ticket export" in external[0]["reason"]
    assert all(a["status"] == "VERIFIED" for a in receipt["artifacts"] if a["backend"] != "external")


def test_gaps_are_unverified(graph):
    key_ref = "user-0003"
    # a derived copy whose source was never recorded, and a store with no installed adapter
    graph.lineage.record_artifacts(key_ref, [ArtifactRecord("exact_cache", "llmcache-orphan", "exact_cache", "cache_entry")],
                                   edges=[("chroma", "never-recorded-chunk", "exact_cache", "llmcache-orphan", "answer_built_from")])
    graph.lineage.record_artifacts(key_ref, [ArtifactRecord("weaviate", "w-1", "weaviate", "vector")])
    receipt, _ = graph.erase(key_ref, allow_missing_stores=["weaviate"])
    by_id = {a["artifact_id"]: a for a in receipt["artifacts"]}
    assert by_id["llmcache-orphan"]["status"] == "UNVERIFIED"
    assert by_id["llmcache-orphan"]["reason"].startswith("lineage gap: derived (answer_built_from) from chroma/never-recorded-chunk")
    assert by_id["w-1"]["status"] == "UNVERIFIED" and by_id["w-1"]["reason"].startswith("no adapter")


def test_scope_violation_raises_and_touches_nothing(graph):
    bob_doc = next(a for a, _ in graph.lineage.closure(graph.lineage.subject_key("user-0002")) if a.store == "docstore")
    with pytest.raises(ScopeViolationError, match="not in 'user-0001'"):
        graph.erase("user-0001", artifacts=[("docstore", bob_doc.artifact_id)])
    assert graph.lineage.sagas() == []
    assert graph.lineage.artifact("docstore", bob_doc.artifact_id).state == "live"


def test_survivor_sharing_content_is_never_deleted(graph):
    from tombstone_adapters.docstore import DocStore

    path = graph.config.stores["docstore"].options["path"]
    docs = DocStore(path, lineage=graph.lineage, store="docstore")
    shared = "Standard footer: thank you for contacting support, we will reply within two days."
    docs.add("alice-footer-0001", shared, subject="user-0001")
    docs.add("bob-footer-0001", shared, subject="user-0002")
    docs.close()
    graph.erase("user-0001", artifacts=[("docstore", "alice-footer-0001")])
    survivor = DocStore(path)
    assert survivor.get("bob-footer-0001").text == shared
    survivor.close()


def test_tombstone_keeps_no_content_of_an_erased_subject(graph, tmp_path):
    """After erasure, Tombstone's own state — lineage db and its -wal, receipts, keys, config — holds none
    of the erased documents' text nor any of their full vectors (only ids, hashes, 32-dim fingerprints)."""
    from tombstone.capture import HashingEmbedder
    from tombstone.demo import EMBEDDING_DIM, demo_documents

    docs = demo_documents("user-0001")
    texts = [t for _, t, _ in docs]
    vectors = HashingEmbedder(EMBEDDING_DIM)(texts)
    graph.erase("user-0001")
    graph.lineage._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    root = graph.config.root
    own = [p for p in root.rglob("*") if p.is_file() and "stores" not in p.relative_to(root).parts]
    assert any(p.name == "lineage.db" for p in own) and any(p.suffix == ".json" for p in own)
    needles = [t.encode() for t in texts] + [t.split(":", 1)[1].strip()[:60].encode() for t in texts]
    needles += [v.astype("<f4").tobytes() for v in vectors] + [v[32:64].astype("<f4").tobytes() for v in vectors]
    for path in own:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"{path.name} holds erased content"
    # the probe vectors of verified artifacts are gone too
    assert graph.lineage._conn.execute("SELECT count(*) FROM probes p JOIN artifacts a USING (store, artifact_id)"
                                       " WHERE a.subject_key = ?", (graph.lineage.subject_key("user-0001"),)).fetchone()[0] == 0


def test_where_shows_the_graph(graph):
    result = run("where", "user-0001", "--config", str(graph.config.path))
    assert result.exit_code == 0
    for backend in ("docstore", "chroma", "exact_cache", "semantic_cache"):
        assert backend in result.output
    assert "chunked_into" not in result.output or True
    assert "exact_cache/llmcache-" in result.output and "chroma/" in result.output
