"""``tombstone check --config`` writes canaries into a place of their own beside the configured store
(``canary_options``) and removes that place afterwards (``discard_canary_place``), passed or failed:
nothing named after the canaries stays in the user's store, and the store's own records are untouched."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from tombstone import init_deployment
from tombstone.config import load_config
from tombstone.contract import adapter_class
from tombstone.demo import EMBEDDING_DIM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from test_cli import run  # noqa: E402

FILE_BACKENDS = ["docstore", "chroma", "faiss", "qdrant", "exact_cache", "semantic_cache"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Path:
    """One configured store of every file-based backend, filled through the wrappers."""
    root = tmp_path_factory.mktemp("canary") / "d"
    result = run("demo", "--workdir", str(root), "--backends", ",".join(FILE_BACKENDS), "--subjects", "2",
                 "--erase", "none")
    assert result.exit_code == 0, result.output
    return root / "tombstone.toml"


def canary_names(config: Path, backend: str) -> list[str]:
    """Everything in the configured store's place that is named after the canaries: files and folders beside
    or inside the store, and the collections of a collection store."""
    options = load_config(config).stores[backend].options
    store = Path(options["path"])
    found = [str(p) for p in store.parent.rglob("*") if "tombstone-canary" in p.name]
    if backend in ("chroma", "semantic_cache"):
        import chromadb

        client = chromadb.PersistentClient(path=str(store))
        found += [c.name for c in client.list_collections() if "tombstone-canary" in c.name]
        chromadb.api.client.SharedSystemClient.clear_system_cache()
    if backend == "qdrant":
        from tombstone_adapters.qdrant import close_local_clients, local_client

        found += [c.name for c in local_client(store).get_collections().collections if "tombstone-canary" in c.name]
        close_local_clients()
    return found


def survivors(config: Path, backend: str):
    options = load_config(config).stores[backend].options
    got = adapter_class(backend).read_survivors(options)
    if "chromadb" in sys.modules:
        sys.modules["chromadb"].api.client.SharedSystemClient.clear_system_cache()
    return got


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_check_with_a_config_leaves_no_canary_place_in_a_file_store(backend, deployment):
    before = survivors(deployment, backend)
    result = run("check", "--backend", backend, "--config", str(deployment), "--canaries", "1")
    assert result.exit_code == 0, result.output
    assert "tombstone-canary" in result.output  # the canaries did go beside the configured store
    assert canary_names(deployment, backend) == []
    assert adapter_class(backend).survivors_equal(survivors(deployment, backend), before)


def test_a_failed_check_removes_the_canary_place_too(monkeypatch, tmp_path):
    """A reclaim that only DELETEs (no VACUUM) with secure_delete off leaves the ids: the gate fails, and the
    canaries' file goes all the same."""
    from tombstone_adapters.docstore import adapter as docstore_adapter

    def delete_only(self, artifacts):
        self.docs._conn.execute("PRAGMA secure_delete=OFF")
        self.docs.delete([a.artifact_id for a in artifacts])
        self.docs._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": ["DELETE"]}

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    monkeypatch.setattr(docstore_adapter.DocstoreAdapter, "reclaim", delete_only)
    result = run("check", "--backend", "docstore", "--config", str(root / "tombstone.toml"), "--canaries", "1")
    assert result.exit_code == 1, result.output
    assert "docstore: FAIL" in result.output
    assert canary_names(root / "tombstone.toml", "docstore") == []


def test_check_with_a_config_leaves_no_canary_table_in_postgres(tmp_path):
    import psycopg

    from tombstone_adapters.pgvector import PgVectorStore
    from tombstone_adapters.pgvector.server import embedded_dsn

    dsn = os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path / "pg" / "data")
    table = f"rag_chunks_{uuid.uuid4().hex[:8]}"
    init_deployment(tmp_path / "d", {"pg": {"backend": "pgvector", "dsn": dsn, "table": table}})
    with psycopg.connect(dsn, autocommit=True) as conn:
        PgVectorStore(conn, table, dim=EMBEDDING_DIM)
        result = run("check", "--backend", "pgvector", "--config", str(tmp_path / "d" / "tombstone.toml"),
                     "--canaries", "1")
        assert result.exit_code == 0, result.output
        assert f"{table}_tombstone_canary" in result.output
        left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE %s",
                            (f"{table}%tombstone_canary%",)).fetchall()
        assert left == []
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]


@pytest.mark.parametrize("reclaim", ["works", "refused"])
def test_check_with_a_config_leaves_no_canary_namespace_in_pinecone(reclaim, tmp_path, monkeypatch):
    """Erasing every canary empties the namespace (Pinecone drops an empty one); when the delete path fails,
    the canaries stay behind — until the check removes their namespace."""
    from pinecone import Pinecone

    from tombstone.errors import ReclaimUnavailableError
    from tombstone_adapters.pinecone import PineconeEmulator
    from tombstone_adapters.pinecone.adapter import PineconeAdapter

    def refused(self, artifacts):
        raise ReclaimUnavailableError("injected: deletes refused", store=self.store)

    if reclaim == "refused":
        monkeypatch.setattr(PineconeAdapter, "reclaim", refused)
    monkeypatch.setenv("PINECONE_API_KEY", "emulator-key")
    with PineconeEmulator(EMBEDDING_DIM) as emulator:
        index = Pinecone(api_key="emulator-key").Index(host=emulator.host)
        index.upsert(vectors=[("the-apps-own-record", [0.5] * EMBEDDING_DIM)], namespace="kb")
        init_deployment(tmp_path / "d", {"pc": {"backend": "pinecone", "host": emulator.host, "namespace": "kb",
                                                "wait_seconds": 5.0, "allow_insecure_host": True}})
        result = run("check", "--backend", "pinecone", "--config", str(tmp_path / "d" / "tombstone.toml"),
                     "--canaries", "1")
        assert result.exit_code == (0 if reclaim == "works" else 1), result.output
        assert "tombstone-canary" in result.output
        stats = index.describe_index_stats()
        assert "tombstone-canary" not in (stats.namespaces or {})
        assert stats.namespaces["kb"].vector_count == 1
