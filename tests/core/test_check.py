"""The CI gate: canaries must end at each backend's highest level; a broken delete path fails it."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tombstone.testing.plugin import tombstone_check  # noqa: F401  (the plugin's fixture)

from test_cli import run


@pytest.mark.parametrize(("backend", "per_canary"), [
    ("docstore", 3), ("chroma", 3), ("faiss", 3), ("qdrant", 3), ("pgvector", 3), ("pinecone", 3),
    ("exact_cache", 1), ("semantic_cache", 1),
])
def test_check_passes_on_every_backend(backend, per_canary, tmp_path):
    junit = tmp_path / "junit.xml"
    result = run("check", "--backend", backend, "--canaries", "2", "--junit", str(junit))
    assert result.exit_code == 0, result.output
    assert f"{backend}: PASS" in result.output
    suite = ET.parse(junit).getroot()
    # control + 2 canaries × their artifacts (3 documents or chunks, or 1 cached answer)
    assert suite.get("failures") == "0" and int(suite.get("tests")) == 1 + 2 * per_canary


def test_check_fails_when_the_delete_path_leaves_bytes(monkeypatch, tmp_path):
    """A reclaim that only DELETEs (no VACUUM) with secure_delete off leaves the ids: the gate must fail."""
    from tombstone_adapters.docstore import adapter as docstore_adapter

    def delete_only(self, artifacts):
        self.docs._conn.execute("PRAGMA secure_delete=OFF")
        self.docs._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.docs.delete([a.artifact_id for a in artifacts])
        self.docs._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": ["DELETE"]}

    monkeypatch.setattr(docstore_adapter.DocstoreAdapter, "reclaim", delete_only)
    junit = tmp_path / "junit.xml"
    result = run("check", "--backend", "docstore", "--canaries", "1", "--junit", str(junit))
    assert result.exit_code == 1, result.output
    assert "RESIDUAL(physical" in result.output and "docstore: FAIL" in result.output
    assert ET.parse(junit).getroot().get("failures") != "0"


def test_check_against_a_configured_store(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "chroma", "--erase", "none").exit_code == 0
    result = run("check", "--backend", "chroma", "--config", str(root / "tombstone.toml"), "--canaries", "1")
    assert result.exit_code == 0, result.output
    assert "rag-chunks-tombstone-canary" in result.output
    import chromadb

    names = {c.name for c in chromadb.PersistentClient(path=str(root / "stores" / "chroma")).list_collections()}
    assert names == {"rag-chunks"}, "the canaries' collection is dropped after the check"


def test_check_unknown_backend_and_missing_store(tmp_path):
    from test_cli import one_line_error

    one_line_error(run("check", "--backend", "nosuch"), 2)
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    assert "configures no chroma store" in one_line_error(
        run("check", "--backend", "chroma", "--config", str(root / "tombstone.toml")), 2)


def test_pytest_fixture(tombstone_check):  # noqa: F811
    result = tombstone_check("faiss", canaries=1)
    assert result.passed, result.junit()


def test_check_shows_each_canary_erasures_progress(tmp_path):
    from click.testing import CliRunner

    from tombstone.cli import main

    result = CliRunner().invoke(main, ["check", "--backend", "docstore", "--canaries", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    receipts = [line for line in result.stderr.splitlines() if line.endswith("] receipt")]
    assert len(receipts) == 2, result.stderr  # one saga per canary, each counted from its first step
    assert result.stderr.splitlines()[0].startswith("[1/")
