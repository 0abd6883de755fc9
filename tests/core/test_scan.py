"""``tombstone scan``: deleted data a store still holds, found read-only and without the lineage db.

Per backend: records deleted by the store's own client are found (the control); after Tombstone's erasure
nothing is, and an independent byte scan agrees; a store with no deletions is clean; the scan changes no
byte of the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from tombstone.cli import EXIT_ACTION_NEEDED, EXIT_BAD_INPUT, EXIT_OK, main
from tombstone_adapters.docstore import DocStore

from support import write_docs


def hashes(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def independent_scan(directory: Path, needle: str) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(p.name for p in directory.rglob("*") if p.is_file() and needle.encode() in p.read_bytes())


def scan(*args: str):
    result = CliRunner().invoke(main, ["scan", *args])
    return result


def scan_json(config: Path, store: str):
    result = scan("--config", str(config), "--store", store, "--json", "--show-ids")
    assert result.exit_code in (EXIT_OK, EXIT_ACTION_NEEDED), result.output
    return result.exit_code, json.loads(result.output)


def plain_delete(path: str, ids: list[str]) -> None:
    """The store's own DELETE, as an app would run it, with upstream SQLite's default (secure_delete off)."""
    store = DocStore(path, secure_delete=False)
    try:
        store.delete(ids)
    finally:
        store.close()


def test_docstore_with_no_deletions_is_clean_and_unchanged(tomb):
    write_docs(tomb, "alice", 5)
    path = Path(tomb.config.stores["docs"].options["path"])
    before = hashes(path.parent)
    code, report = scan_json(tomb.config.path, "docs")
    assert code == EXIT_OK
    assert report["recoverable"] is False and report["count"] == 0 and report["bytes"] == 0
    assert hashes(path.parent) == before


def test_docstore_own_delete_is_found_read_only(tomb):
    mine = write_docs(tomb, "alice", 4)
    theirs = write_docs(tomb, "bob", 3)
    path = tomb.config.stores["docs"].options["path"]
    plain_delete(path, mine)
    store_dir = Path(path).parent
    assert independent_scan(store_dir, mine[0]), "control: the plain DELETE left the bytes"
    before = hashes(store_dir)
    code, report = scan_json(tomb.config.path, "docs")
    assert hashes(store_dir) == before, "the scan changed a byte of the store"
    assert code == EXIT_ACTION_NEEDED
    assert report["recoverable"] and report["bytes"] > 0
    assert set(report["ids"]) <= set(mine), "only deleted ids are reported, never live ones"
    assert len(report["ids"]) >= len(mine) - 1
    assert not set(report["ids"]) & set(theirs)
    # without --show-ids: counts only; and never content
    plain = scan("--config", str(tomb.config.path), "--store", "docs", "--json")
    assert plain.exit_code == EXIT_ACTION_NEEDED
    assert "ids" not in json.loads(plain.output)
    assert "text of alice" not in plain.output


def test_docstore_free_pages_are_counted(tomb):
    mine = write_docs(tomb, "alice", 60, texts=[f"long text {i} " + "words " * 200 for i in range(60)])
    path = tomb.config.stores["docs"].options["path"]
    plain_delete(path, mine)
    code, report = scan_json(tomb.config.path, "docs")
    assert code == EXIT_ACTION_NEEDED
    free = next(p for p in report["places"] if p["kind"] == "sqlite free pages")
    assert free["bytes"] > 0 and free["count"] > 0
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA freelist_count").fetchone()[0] > 0
    finally:
        con.close()


def test_after_erasure_the_scan_and_a_byte_scan_agree_nothing_is_left(tomb):
    mine = write_docs(tomb, "alice", 4)
    write_docs(tomb, "bob", 3)
    path = tomb.config.stores["docs"].options["path"]
    plain_delete(path, mine[:2])  # the app deleted some already (the store still holds them)
    assert scan_json(tomb.config.path, "docs")[0] == EXIT_ACTION_NEEDED
    receipt, _ = tomb.erase("alice")
    assert all(a["status"] == "VERIFIED" for a in receipt["artifacts"])
    tomb.close()
    code, report = scan_json(tomb.config.path, "docs")
    assert code == EXIT_OK and report["count"] == 0 and report["bytes"] == 0
    for doc_id in mine:
        assert independent_scan(Path(path).parent, doc_id) == []


def test_scan_by_backend_and_options_without_a_deployment(tmp_path):
    path = tmp_path / "docs.db"
    store = DocStore(path, secure_delete=False)
    store.add_many([(f"doc-{i}", f"text {i} of a document", {}) for i in range(5)], subject="s")
    store.delete(["doc-1", "doc-3"])
    store.close()
    before = hashes(tmp_path)
    result = scan("--backend", "docstore", "--option", f"path={path}", "--show-ids")
    assert result.exit_code == EXIT_ACTION_NEEDED, result.output
    assert "id: doc-1" in result.output and "id: doc-3" in result.output
    assert "doc-0" not in result.output.replace("doc-1", "").replace("doc-3", "")
    assert hashes(tmp_path) == before


def test_exact_cache_own_delete_is_found_and_reclaim_clears_it(tmp_path):
    from langchain_core.outputs import Generation

    from tombstone import Tombstone, init_deployment
    from tombstone.lineage.db import ArtifactRecord
    from tombstone_adapters.caches import TombstoneSQLiteCache, attribution
    from tombstone_adapters.caches.exact import ExactCacheAdapter, entry_id

    config = init_deployment(tmp_path / "c", {"cache": {"backend": "exact_cache", "path": "stores/cache.db"}})
    path = config.stores["cache"].options["path"]
    with Tombstone(config) as tomb:
        cache = TombstoneSQLiteCache(path, lineage=tomb.lineage, store="cache")
        ids = []
        for i in range(6):
            prompt = f"question {i} from alice"
            tomb.lineage.record_artifacts("alice", [ArtifactRecord("src", f"src-{i}", "docstore", "document")])
            with attribution("alice", [("src", f"src-{i}")]):
                cache.update(prompt, "llm", [Generation(text=f"answer {i}")])
            ids.append(entry_id(prompt, "llm"))
        assert scan_json(config.path, "cache")[0] == EXIT_OK
        arts = [tomb.lineage.artifact("cache", i) for i in ids[:3]]
        adapter = ExactCacheAdapter("cache", {**config.stores["cache"].options, "secure_delete": False})
        try:
            adapter.native_delete(arts)
            before = hashes(Path(path).parent)
            code, report = scan_json(config.path, "cache")
            assert hashes(Path(path).parent) == before
            assert code == EXIT_ACTION_NEEDED and report["bytes"] > 0
            assert set(report["ids"]) <= set(ids[:3]) and report["ids"]
            adapter.reclaim(arts)
        finally:
            adapter.close()
        code, report = scan_json(config.path, "cache")
        assert code == EXIT_OK and report["bytes"] == 0
        for ident in ids[:3]:
            assert independent_scan(Path(path).parent, ident) == []


@pytest.mark.parametrize("args, says", [
    (["--store", "nope"], "no store 'nope'"),
    ([], "say which store"),
    (["--backend", "docstore", "--option", "path"], "KEY=VALUE"),
    (["--backend", "docstore"], "needs path"),
])
def test_bad_input_is_one_line_and_exit_2(tomb, args, says):
    if "--backend" not in args:
        args = ["--config", str(tomb.config.path), *args]
    result = scan(*args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert says in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_backend_with_no_scan_says_so_in_one_line():
    result = scan("--backend", "pinecone", "--option", "index=x")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "the pinecone adapter cannot scan for deleted data" in result.output
    assert len(result.output.strip().splitlines()) == 1


def chroma_deployment(tmp_path):
    """A deployment with one embedded-Chroma store ``vectors`` (collection ``docs``, cosine, flushed every 20
    records so the HNSW files are written): config, path."""
    import chromadb

    from tombstone import init_deployment

    config = init_deployment(tmp_path / "deploy", {"vectors": {"backend": "chroma", "path": "stores/vectors",
                                                                "collection": "docs"}})
    path = Path(config.stores["vectors"].options["path"])
    chromadb.PersistentClient(path=str(path)).create_collection(
        "docs", metadata={"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20},
        embedding_function=None)
    return config, path


def test_chroma_own_delete_is_found_and_erasure_leaves_nothing(tmp_path):
    chromadb = pytest.importorskip("chromadb")
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.chroma.wrapper import TombstoneCollection

    config, path = chroma_deployment(tmp_path)
    with Tombstone(config) as tomb:
        col = TombstoneCollection(chromadb.PersistentClient(path=str(path)).get_collection("docs"),
                                  lineage=tomb.lineage, store="vectors", embedder=HashingEmbedder(32))

        def write(subject, n):
            ids = [f"{subject}-chunk-{i:05d}" for i in range(n)]
            col.add(ids=ids, documents=[f"{subject} text number {i} " * 5 for i in range(n)],
                    metadatas=[{"n": i} for i in range(n)], subject=subject)
            return ids

        mine = write("alice", 5)
        write("bob", 40)
        code, report = scan_json(config.path, "vectors")
        assert code == EXIT_OK, report
        adapter = tomb.adapter("vectors")
        adapter.native_delete([tomb.lineage.artifact("vectors", i) for i in mine])
        before = hashes(path)
        code, report = scan_json(config.path, "vectors")
        assert hashes(path) == before, "the scan changed a byte of the store"
        assert code == EXIT_ACTION_NEEDED
        # Chroma purges its queue once persisted; the HNSW file still holds the deleted ids' vectors
        slots = next(p for p in report["places"] if p["place"] == "HNSW segments")
        assert set(slots["ids"]) == set(mine) and slots["bytes"] > 0
        assert set(report["ids"]) == set(mine)
        # the deleted embedding rows, carved from chroma.sqlite3's freed cells (an INTEGER PRIMARY KEY row
        # starts with a NULL type, which a freed cell loses to the freeblock header)
        carved = {i for p in report["places"] if p["kind"].startswith("sqlite") for i in p["ids"]}
        assert carved == set(mine), report
        receipt, _ = tomb.erase("alice")
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    code, report = scan_json(config.path, "vectors")
    assert code == EXIT_OK, report
    for ident in mine:
        assert independent_scan(path, ident) == []


def test_faiss_own_delete_is_found_and_erasure_leaves_nothing(tmp_path):
    pytest.importorskip("faiss")
    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.faiss.store import FaissStore

    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "faiss", "path": "stores/vec"}})
    path = Path(config.stores["vec"].options["path"])
    FaissStore(path, dim=32)
    with Tombstone(config) as tomb:
        def write(subject, n):
            ids = [f"{subject}-vec-{i:05d}" for i in range(n)]
            FaissStore(path, lineage=tomb.lineage, store="vec", embedder=HashingEmbedder(32)).add(
                ids, documents=[f"{subject} words number {i} " * 4 for i in range(n)], subject=subject)
            return ids

        mine = write("alice", 4)
        theirs = write("bob", 6)
        assert scan_json(config.path, "vec")[0] == EXIT_OK
        adapter = tomb.adapter("vec")
        adapter.native_delete([tomb.lineage.artifact("vec", i) for i in mine])  # HNSW: the mapping goes
        adapter.faiss.exclude(theirs[:2])  # suppressed, not reclaimed: hidden, still stored
        before = hashes(path.parent)
        code, report = scan_json(config.path, "vec")
        assert hashes(path.parent) == before, "the scan changed a byte of the store"
        assert code == EXIT_ACTION_NEEDED
        orphans = next(p for p in report["places"] if p["kind"] == "vectors without a live id")
        assert orphans["count"] == len(mine) and 0 < orphans["bytes"] <= 4 * 32 * len(mine)
        hidden = next(p for p in report["places"] if p["kind"] == "vectors excluded from search (suppressed)")
        assert hidden["count"] == 2 and sorted(hidden["ids"]) == theirs[:2] and 0 < hidden["bytes"] <= 4 * 32 * 2
        adapter.faiss.side["excluded"] = []  # bob is not being erased: the store as it was
        adapter.faiss.commit(index_changed=False)
        receipt, _ = tomb.erase("alice")
    code, report = scan_json(config.path, "vec")
    assert code == EXIT_OK, report
    for ident in mine:
        assert independent_scan(path, ident) == []


def qdrant_deployment(tmp_path):
    """A deployment with one Qdrant local-mode store ``qd`` (collection ``chunks``, dim 32): config, path."""
    from qdrant_client import models

    from tombstone import init_deployment
    from tombstone_adapters.qdrant.adapter import local_client

    config = init_deployment(tmp_path / "deploy", {"qd": {"backend": "qdrant", "path": "stores/qd",
                                                          "collection": "chunks"}})
    path = config.stores["qd"].options["path"]
    local_client(path).create_collection("chunks", vectors_config=models.VectorParams(
        size=32, distance=models.Distance.COSINE))
    return config, path


def delete_points_plainly(path: str, ids: list[str]) -> None:
    """The DELETE Qdrant local mode runs for these points, with upstream SQLite's default (secure_delete off)."""
    from qdrant_client.local.persistence import CollectionPersistence
    from qdrant_client.local.utils import normalize_point_id

    from tombstone_adapters.qdrant import point_id

    con = sqlite3.connect(Path(path) / "collection" / "chunks" / "storage.sqlite")
    con.execute("PRAGMA secure_delete=OFF")
    with con:
        con.executemany("DELETE FROM points WHERE id = ?", [
            (CollectionPersistence.encode_key(normalize_point_id(point_id(i))),) for i in ids])
    con.close()


def test_qdrant_own_delete_is_found_and_erasure_leaves_nothing(tmp_path):
    pytest.importorskip("qdrant_client")
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.qdrant.adapter import close_local_clients, local_client
    from tombstone_adapters.qdrant.wrapper import TombstoneQdrant

    config, path = qdrant_deployment(tmp_path)
    with Tombstone(config) as tomb:
        def write(subject, n):
            ids = [f"{subject}-pt-{i:05d}" for i in range(n)]
            TombstoneQdrant(local_client(path), "chunks", lineage=tomb.lineage, store="qd",
                            embedder=HashingEmbedder(32)).upsert(
                ids, documents=[f"{subject} words number {i} " * 4 for i in range(n)],
                payloads=[{"n": i} for i in range(n)], subject=subject)
            return ids

        mine = write("alice", 4)
        write("bob", 6)
        assert scan_json(config.path, "qd")[0] == EXIT_OK
        # the client's own delete: with this build's secure_delete on, SQLite zeroes the freed cells, and
        # the scan agrees with an independent byte scan that nothing is left
        adapter = tomb.adapter("qd")
        adapter.native_delete([tomb.lineage.artifact("qd", i) for i in mine[:1]])
        close_local_clients()
        code, report = scan_json(config.path, "qd")
        assert bool(report["ids"]) == bool(independent_scan(Path(path), mine[0]))
        # the control: the same DELETE the client runs, with upstream SQLite's default (secure_delete off)
        delete_points_plainly(path, mine[1:])
        before = hashes(Path(path))
        code, report = scan_json(config.path, "qd")
        assert hashes(Path(path)) == before, "the scan changed a byte of the store"
        assert code == EXIT_ACTION_NEEDED
        on_disk = {i for i in mine if independent_scan(Path(path), i)}
        assert on_disk and set(report["ids"]) == on_disk
        receipt, _ = tomb.erase("alice")
        assert receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["mechanism"] == "in-place"
    code, report = scan_json(config.path, "qd")
    # the erasure found what the plain delete left and zeroed the free space of every page in place
    assert code == EXIT_OK, report
    for ident in mine:
        assert independent_scan(Path(path), ident) == []


def test_pgvector_own_delete_is_found_and_erasure_leaves_nothing(tmp_path):
    psycopg = pytest.importorskip("psycopg")
    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

    dsn = embedded_dsn(tmp_path / "pg" / "data")
    table = "chunks_scan"
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table}})
    with psycopg.connect(dsn, autocommit=True) as admin, Tombstone(config) as tomb:
        PgVectorStore(admin, table, dim=32)

        def write(subject, n):
            ids = [f"{subject}-row-{i:05d}" for i in range(n)]
            PgVectorStore(admin, table, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(32)).add(
                ids, documents=[f"{subject} words number {i} " * 4 for i in range(n)], subject=subject)
            return ids

        mine = write("alice", 5)
        write("bob", 20)
        admin.execute(f"ANALYZE {table}")
        with contextlib.suppress(psycopg.Error):
            admin.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        code, report = scan_json(config.path, "pg")
        assert code == EXIT_OK, report
        admin.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", (mine,))  # the app's own delete
        admin.execute("SELECT pg_stat_force_next_flush()")
        code, report = scan_json(config.path, "pg")
        assert code == EXIT_ACTION_NEEDED, report
        stats = next(p for p in report["places"] if p["kind"].startswith("planner statistics"))
        assert stats["ids"] and set(stats["ids"]) <= set(mine)
        receipt, _ = tomb.erase("alice")
        admin.execute("SELECT pg_stat_force_next_flush()")
        code, report = scan_json(config.path, "pg")
        assert code == EXIT_OK, report


def reclaim_store(config: Path, store: str):
    return CliRunner().invoke(main, ["reclaim", "--config", str(config), "--store", store, "--json"])


def test_reclaim_store_clears_what_the_docstores_own_delete_left_and_keeps_the_rest(tomb):
    mine = write_docs(tomb, "alice", 4)
    theirs = write_docs(tomb, "bob", 3)
    path = tomb.config.stores["docs"].options["path"]
    plain_delete(path, mine)
    store_dir = Path(path).parent
    assert independent_scan(store_dir, mine[0]), "control: the plain DELETE left the bytes"
    result = reclaim_store(tomb.config.path, "docs")
    assert result.exit_code == EXIT_OK, result.output
    out = json.loads(result.output)
    assert out["before"]["recoverable"] and out["before"]["count"] > 0
    assert not out["after"]["recoverable"] and out["after"]["count"] == 0
    assert "VACUUM" in out["evidence"]["steps"]
    assert all(independent_scan(store_dir, i) == [] for i in mine)
    store = DocStore(path)
    try:
        assert {d.id for d in store.all()} == set(theirs)
    finally:
        store.close()
    # the signed receipt: its own kind, the counts before and after, and not one id of what went
    receipt_file = Path(out["receipt"])
    receipt = json.loads(receipt_file.read_text())
    assert (receipt["kind"], receipt["subject"], receipt["artifacts"]) == (
        "tombstone.store-reclaim-receipt", "store:docs", [])
    assert receipt["store_reclaim"]["before"]["count"] == out["before"]["count"] > 0
    assert receipt["store_reclaim"]["after"]["count"] == 0
    assert not any(i.encode() in receipt_file.read_bytes() for i in mine)
    assert tomb.lineage.chain_head()[1] == receipt["receipt_hash"]


def test_reclaim_store_rebuilds_faiss_without_the_vectors_its_own_delete_orphaned(tmp_path):
    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone.lineage.db import fingerprint_bytes
    from tombstone_adapters.faiss.store import FaissStore

    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "faiss", "path": "stores/vec"}})
    path = Path(config.stores["vec"].options["path"])
    FaissStore(path, dim=32)
    with Tombstone(config) as tomb:
        store = FaissStore(path, lineage=tomb.lineage, store="vec", embedder=HashingEmbedder(32))
        store.add([f"a-{i}" for i in range(4)], documents=[f"alice words {i} " * 4 for i in range(4)], subject="alice")
        store.add([f"b-{i}" for i in range(6)], documents=[f"bob words {i} " * 4 for i in range(6)], subject="bob")
        arts = [tomb.lineage.artifact("vec", f"a-{i}") for i in range(4)]
        tomb.adapter("vec").native_delete(arts)
    # the control: dropping the mapping left every vector's bytes in the index file
    assert all(any(fingerprint_bytes(a.fingerprint) in p.read_bytes() for p in path.iterdir() if p.is_file())
               for a in arts)
    result = reclaim_store(config.path, "vec")
    assert result.exit_code == EXIT_OK, result.output
    out = json.loads(result.output)
    orphans = lambda report: next(p for p in report["places"] if p["kind"] == "vectors without a live id")["count"]
    assert orphans(out["before"]) == 4 and orphans(out["after"]) == 0
    assert not any(fingerprint_bytes(a.fingerprint) in p.read_bytes() for a in arts for p in path.iterdir() if p.is_file())
    reopened = FaissStore(path, create=False)
    assert reopened.index.ntotal == 6 and sorted(reopened.get()) == [f"b-{i}" for i in range(6)]


def test_reclaim_store_rewrites_qdrant_when_free_pages_hold_deleted_points(tmp_path):
    pytest.importorskip("qdrant_client")
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.qdrant.adapter import close_local_clients, local_client
    from tombstone_adapters.qdrant.wrapper import TombstoneQdrant

    config, path = qdrant_deployment(tmp_path)
    with Tombstone(config) as tomb:
        view = TombstoneQdrant(local_client(path), "chunks", lineage=tomb.lineage, store="qd",
                               embedder=HashingEmbedder(32))
        mine = [f"alice-pt-{i}" for i in range(3)]
        view.upsert(mine, documents=[f"alice words {i} " * 4 for i in range(3)], subject="alice")
        view.upsert([f"bob-pt-{i}" for i in range(5)], documents=[f"bob words {i} " * 4 for i in range(5)],
                    subject="bob")
    close_local_clients()
    delete_points_plainly(path, mine)  # the client's own DELETE with upstream SQLite's default
    assert any(independent_scan(Path(path), i) for i in mine), "control: the bytes are in free pages"
    result = reclaim_store(config.path, "qd")
    assert result.exit_code == EXIT_OK, result.output
    out = json.loads(result.output)
    assert out["before"]["recoverable"] and not out["after"]["recoverable"]
    assert out["evidence"]["mechanism"] == "rewrite"
    assert all(independent_scan(Path(path), i) == [] for i in mine)
    close_local_clients()
    assert local_client(path).count("chunks", exact=True).count == 5
    close_local_clients()


@pytest.mark.parametrize("args, says", [
    (["--store", "nope"], "no store 'nope'"),
    ([], "Missing option '--store'"),
])
def test_reclaim_store_bad_input_is_one_line_and_exit_2(tomb, args, says):
    result = CliRunner().invoke(main, ["reclaim", "--config", str(tomb.config.path), *args])
    assert result.exit_code == EXIT_BAD_INPUT and says in result.output, result.output


def test_scan_writes_a_self_contained_html_page_with_ids_and_no_content(tomb, tmp_path):
    pytest.importorskip("jinja2")
    texts = [f"alice private words number {i} about her parcel" for i in range(4)]
    mine = write_docs(tomb, "alice", 4, texts=texts)
    write_docs(tomb, "bob", 2)
    plain_delete(tomb.config.stores["docs"].options["path"], mine)
    page = tmp_path / "scan.html"
    result = scan("--config", str(tomb.config.path), "--store", "docs", "--show-ids", "--html", str(page))
    assert result.exit_code == EXIT_ACTION_NEEDED, result.output
    html = page.read_text(encoding="utf-8")
    assert "Deleted data is recoverable" in html and "tombstone reclaim --store docs" in html
    assert "<style>" in html and "http" not in html.split("<body", 1)[1]  # nothing fetched
    assert any(ident in html for ident in mine)
    assert not any(t in html for t in texts), "the page shows ids and counts, never content"
    # after a whole-store reclaim the same page says so
    assert reclaim_store(tomb.config.path, "docs").exit_code == EXIT_OK
    result = scan("--config", str(tomb.config.path), "--store", "docs", "--html", str(page))
    assert result.exit_code == EXIT_OK and "Nothing deleted is recoverable" in page.read_text(encoding="utf-8")


def test_scan_html_never_writes_over_a_json_file(tomb, tmp_path):
    receipt_like = tmp_path / "r.json"
    receipt_like.write_text("{}")
    result = scan("--config", str(tomb.config.path), "--store", "docs", "--html", str(receipt_like))
    assert result.exit_code == EXIT_BAD_INPUT and receipt_like.read_text() == "{}"


def test_a_qdrant_store_that_never_deleted_scans_clean_though_its_index_pages_hold_key_fragments(tmp_path):
    """Loading a few thousand points rebalances the id index, which leaves fragments of live keys in the
    index pages' free space: reported, but not as recoverable data (no deleted record is named there)."""
    pytest.importorskip("qdrant_client")
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.qdrant.adapter import close_local_clients, local_client
    from tombstone_adapters.qdrant.wrapper import TombstoneQdrant

    config, path = qdrant_deployment(tmp_path)
    with Tombstone(config) as tomb:
        wrapper = TombstoneQdrant(local_client(path), "chunks", lineage=tomb.lineage, store="qd",
                                  embedder=HashingEmbedder(32))
        for start in range(0, 3000, 500):
            ids = [f"s{i // 100:02d}-pt-{i:05d}" for i in range(start, start + 500)]
            wrapper.upsert(ids, documents=[f"words number {i} " * 4 for i in range(start, start + 500)],
                           subject=f"batch-{start}")
    close_local_clients()
    code, report = scan_json(config.path, "qd")
    places = {p["kind"]: p for p in report["places"]}
    assert places["sqlite index freeblocks"]["bytes"] > 0, "the load left no key fragments: nothing tested"
    assert not places["sqlite index freeblocks"]["recoverable"] and code == EXIT_OK, report
    # the control: one point deleted the plain way is found, in the table pages
    delete_points_plainly(path, ["s07-pt-00700"])
    code, report = scan_json(config.path, "qd")
    assert code == EXIT_ACTION_NEEDED and "s07-pt-00700" in report["ids"]
    assert {p["kind"]: p for p in report["places"]}["sqlite freeblocks"]["recoverable"]


def audit_store_reclaim(config: Path, receipt: Path):
    result = CliRunner().invoke(main, ["audit", str(receipt), "--config", str(config), "--json",
                                       "--key", str(config.parent / "keys" / "signing.pub")])
    return result.exit_code, json.loads(result.output)


def test_a_store_reclaim_receipt_is_audited_by_scanning_the_store_again(tomb):
    mine = write_docs(tomb, "alice", 3)
    write_docs(tomb, "bob", 2)
    path = tomb.config.stores["docs"].options["path"]
    plain_delete(path, mine)
    result = reclaim_store(tomb.config.path, "docs")
    assert result.exit_code == EXIT_OK, result.output
    receipt = Path(json.loads(result.output)["receipt"])
    code, report = audit_store_reclaim(tomb.config.path, receipt)
    [row] = report["artifacts"]
    assert code == 0 and row["verdict"] == "agree" and row["audit_found"] == "nothing deleted recoverable now"
    # the store's own client deletes again, the plain way: the receipt's "nothing recoverable" is contradicted
    bob = [d.id for d in DocStore(path).all()]
    plain_delete(path, bob[:1])
    code, report = audit_store_reclaim(tomb.config.path, receipt)
    assert code != 0 and report["verdict"] == "contradicted", report


def test_reclaim_store_exits_3_when_the_recipe_leaves_deleted_data(tomb, monkeypatch):
    from tombstone_adapters.docstore.adapter import DocstoreAdapter

    mine = write_docs(tomb, "alice", 3)
    plain_delete(tomb.config.stores["docs"].options["path"], mine)
    monkeypatch.setattr(DocstoreAdapter, "reclaim_store", lambda self: {"mechanism": "nothing (a recipe that failed)"})
    result = CliRunner().invoke(main, ["reclaim", "--config", str(tomb.config.path), "--store", "docs"])
    assert result.exit_code == EXIT_ACTION_NEEDED, result.output
    assert "deleted data is still recoverable" in result.output and "receipt:" in result.output


def test_a_store_reclaim_killed_midway_is_finished_by_resume_with_the_first_count(deployment):
    import os
    import subprocess
    import sys

    from tombstone import Tombstone

    with Tombstone(deployment) as t:
        mine = write_docs(t, "alice", 4)
    plain_delete(deployment.stores["docs"].options["path"], mine)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = lambda *args, **more: subprocess.run([sys.executable, "-m", "tombstone", *args, "--config",  # noqa: E731
                                                str(deployment.path)], capture_output=True, text=True, timeout=300,
                                               env={**env, **more})
    killed = run("reclaim", "--store", "docs", TOMBSTONE_KILL_AT="saga:reclaim-store:docs:acted")
    assert killed.returncode == -9, killed.stderr
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [receipt_file] = [p for p in deployment.receipts_dir.glob("*.json")]
    receipt = json.loads(receipt_file.read_text())
    assert receipt["kind"] == "tombstone.store-reclaim-receipt"
    assert receipt["store_reclaim"]["before"]["count"] > 0 and not receipt["store_reclaim"]["after"]["recoverable"]
    assert all(independent_scan(Path(deployment.stores["docs"].options["path"]).parent, i) == [] for i in mine)


def test_reclaim_store_clears_what_chromas_own_delete_left(tmp_path):
    chromadb = pytest.importorskip("chromadb")
    from tombstone import Tombstone
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.chroma.wrapper import TombstoneCollection

    config, path = chroma_deployment(tmp_path)
    with Tombstone(config) as tomb:
        col = TombstoneCollection(chromadb.PersistentClient(path=str(path)).get_collection("docs"),
                                  lineage=tomb.lineage, store="vectors", embedder=HashingEmbedder(32))
        mine = [f"alice-chunk-{i:05d}" for i in range(5)]
        col.add(ids=mine, documents=[f"alice text number {i} " * 5 for i in range(5)], subject="alice")
        col.add(ids=[f"bob-chunk-{i:05d}" for i in range(40)],
                documents=[f"bob text number {i} " * 5 for i in range(40)], subject="bob")
        tomb.adapter("vectors").native_delete([tomb.lineage.artifact("vectors", i) for i in mine])
    assert any(independent_scan(path, i) for i in mine), "control: Chroma's own delete left the ids on disk"
    result = reclaim_store(config.path, "vectors")
    assert result.exit_code == EXIT_OK, result.output
    out = json.loads(result.output)
    assert out["before"]["recoverable"] and not out["after"]["recoverable"], out
    assert all(independent_scan(path, i) == [] for i in mine)
    assert chromadb.PersistentClient(path=str(path)).get_collection("docs").count() == 40


@pytest.mark.slow
def test_a_large_docstore_that_never_deleted_scans_clean_though_a_rebalanced_page_keeps_stale_pointers(tmp_path):
    """100,000 rows: rebalancing leaves a few bytes of stale pointers in an interior page's unallocated gap
    (7 here); they are structure, not a deleted row. The control: one plain DELETE is found by name."""
    path = tmp_path / "docs.db"
    store = DocStore(path)
    try:
        for start in range(0, 100_000, 10_000):
            store.add_many([(f"doc-{i:06d}", f"document {i}: a support ticket about an order, a refund and a parcel",
                             {}) for i in range(start, start + 10_000)], subject="bulk")
    finally:
        store.close()
    from tombstone.scan import scan_options

    from tombstone_adapters.docstore.forensics import _nonzero_content

    data = path.read_bytes()
    report = scan_options("docs", "docstore", {"path": str(path)})
    assert not report.recoverable, [(p.kind, p.count, p.bytes) for p in report.places]
    # what made it a false alarm is there: short non-zero runs in some page's gap (counted with the old rule)
    page_size = int.from_bytes(data[16:18], "big")
    stale = 0
    for page in range(2, len(data) // page_size + 1):
        base = (page - 1) * page_size
        if data[base] == 5:  # an interior table page
            cells = int.from_bytes(data[base + 3:base + 5], "big")
            content = int.from_bytes(data[base + 5:base + 7], "big")
            stale += _nonzero_content(data, base + 12 + 2 * cells, base + content)
    assert stale > 0
    store = DocStore(path, secure_delete=False)
    try:
        store.delete(["doc-050000"])
    finally:
        store.close()
    report = scan_options("docs", "docstore", {"path": str(path)})
    assert report.recoverable and report.ids() == ["doc-050000"]


def test_reclaim_store_clears_what_a_plain_delete_left_in_pgvector(tmp_path):
    psycopg = pytest.importorskip("psycopg")
    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.pgvector import PgVectorStore, embedded_dsn

    data_dir = tmp_path / "pg" / "data"
    dsn = embedded_dsn(data_dir)
    table = "chunks_reclaim"
    config = init_deployment(tmp_path / "deploy", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table}})
    with psycopg.connect(dsn, autocommit=True) as admin:
        with Tombstone(config) as tomb:
            PgVectorStore(admin, table, dim=32)
            mine = [f"alice-row-{i:05d}" for i in range(5)]
            view = PgVectorStore(admin, table, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(32))
            view.add(mine, documents=[f"alice words number {i} " * 4 for i in range(5)], subject="alice")
            view.add([f"bob-row-{i:05d}" for i in range(20)],
                     documents=[f"bob words number {i} " * 4 for i in range(20)], subject="bob")
        admin.execute(f"ANALYZE {table}")
        admin.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", (mine,))  # the app's own delete
        admin.execute("CHECKPOINT")
        admin.execute("SELECT pg_stat_force_next_flush()")
        relation = Path(data_dir) / admin.execute("SELECT pg_relation_filepath(%s)", (table,)).fetchone()[0]
        assert any(i.encode() in relation.read_bytes() for i in mine), "control: the dead tuples are on disk"
        result = reclaim_store(config.path, "pg")
        assert result.exit_code == EXIT_OK, result.output
        out = json.loads(result.output)
        assert out["before"]["recoverable"] and not out["after"]["recoverable"], out
        admin.execute("CHECKPOINT")
        relation = Path(data_dir) / admin.execute("SELECT pg_relation_filepath(%s)", (table,)).fetchone()[0]
        assert not any(i.encode() in relation.read_bytes() for i in mine)
        assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 20
