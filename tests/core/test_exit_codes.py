"""Exit codes say whether work remains: 0 only when nothing is left to act on, 3 when the receipt was
written but a person must act, with one line per store saying what to do next."""

from __future__ import annotations

import json

from tombstone import Tombstone, init_deployment

from support import write_docs
from test_cli import run


def deployment(tmp_path, **faults):
    from tombstone_adapters.docstore import DocStore

    store = {"backend": "faulty", "wraps": "docstore", "path": "stores/docs/docstore.db", **faults} if faults \
        else {"backend": "docstore", "path": "stores/docs/docstore.db"}
    config = init_deployment(tmp_path / "d", {"docs": store})
    DocStore(config.stores["docs"].options["path"]).close()
    return config


def test_a_clean_erasure_exits_0(tmp_path):
    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 2)
    result = run("erase", "alice", "--config", str(config.path))
    assert result.exit_code == 0, result.output
    assert "docs: 2 VERIFIED(physical)" in result.output and "ACTION NEEDED" not in result.output


def test_dead_letters_exit_3_with_the_next_command_and_retry_exits_0_once_fixed(tmp_path):
    config = deployment(tmp_path, fail_reclaim=1, retryable=False)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 2)
    result = run("erase", "alice", "--config", str(config.path))
    assert result.exit_code == 3, result.output
    assert "ACTION NEEDED for alice" in result.output
    assert "docs: 2 UNVERIFIED" in result.output and "tombstone dlq retry" in result.output
    receipt = json.loads((config.receipts_dir / "alice.json").read_text())
    assert all(a["action"] for a in receipt["artifacts"])  # the receipt itself says what is left
    retried = run("dlq", "retry", "--config", str(config.path))
    assert retried.exit_code == 0, retried.output


def test_dlq_retry_that_fails_again_exits_3(tmp_path):
    config = deployment(tmp_path, fail_reclaim=5, retryable=False)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
    assert run("erase", "alice", "--config", str(config.path)).exit_code == 3
    again = run("dlq", "retry", "--config", str(config.path))
    assert again.exit_code == 3 and "ACTION NEEDED" in again.output


def test_a_copy_sent_to_a_third_party_exits_3(tmp_path):
    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        [doc] = write_docs(tomb, "alice", 1)
        tomb.lineage.record_third_party("alice", "docs", doc, "acme-analytics")
    result = run("erase", "alice", "--config", str(config.path))
    assert result.exit_code == 3, result.output
    assert "NEEDS_HUMAN" in result.output and "ask the recipient" in result.output


def test_content_a_survivor_holds_is_the_backends_ceiling_and_exits_0(tmp_path):
    """UNVERIFIED(duplicate content) is nothing a person can fix: the survivor must not be deleted."""
    config = deployment(tmp_path)
    same = ["the same boilerplate notice text for everyone"]
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1, texts=same)
        write_docs(tomb, "bob", 1, texts=same)
    result = run("erase", "alice", "--config", str(config.path))
    assert result.exit_code == 0, result.output
    assert "UNVERIFIED(duplicate content" in result.output


def test_a_batch_with_one_subject_left_to_act_on_exits_3(tmp_path):
    config = deployment(tmp_path, fail_reclaim=1, retryable=False)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
        write_docs(tomb, "bob", 1)
    subjects = tmp_path / "subjects.txt"
    subjects.write_text("alice\nbob\n")
    result = run("erase", "--subjects-file", str(subjects), "--config", str(config.path))
    assert result.exit_code == 3, result.output
    assert "2 subjects erased in one batch" in result.output and "ACTION NEEDED" in result.output


def test_one_subject_is_singular(tmp_path):
    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
    subjects = tmp_path / "subjects.txt"
    subjects.write_text("alice\n")
    result = run("erase", "--subjects-file", str(subjects), "--config", str(config.path))
    assert result.exit_code == 0 and "1 subject erased in one batch" in result.output


def _config_with(config, store: str, body: str) -> None:
    config.path.write_text(config.path.read_text() + f"\n[stores.{store}]\n{body}\n")


def test_a_backend_typo_stops_before_anything_changes_and_suggests_the_name(tmp_path):
    from tombstone.lineage.records import ArtifactRecord
    from test_cli import one_line_error

    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        [doc] = write_docs(tomb, "alice", 1)
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("vectors", "v-1", "chroma", "vector")])
    _config_with(config, "vectors", 'backend = "chromaa"\npath = "stores/vectors"')
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert "did you mean 'chroma'" in err
    with Tombstone.open(config.path) as tomb:
        assert tomb.lineage.sagas() == [] and not tomb.lineage.is_suppressed("docs", doc)


def test_a_store_missing_a_required_option_stops_before_anything_changes(tmp_path):
    from tombstone.lineage.records import ArtifactRecord
    from test_cli import one_line_error

    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("pg", "p-1", "pgvector", "vector")])
    _config_with(config, "pg", 'backend = "pgvector"\ndata_dir = "stores/pg"')
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert 'needs table = "..."' in err
    with Tombstone.open(config.path) as tomb:
        assert tomb.lineage.sagas() == []


def test_a_misspelt_reclaim_recipe_stops_before_anything_changes(tmp_path):
    """``reclaim = "inplace"`` names no recipe: one line, exit 2, no saga, nothing suppressed (it never
    falls back to one of the two recipes silently)."""
    from tombstone.lineage.records import ArtifactRecord
    from tombstone_adapters.faiss import FaissStore
    from test_cli import one_line_error

    config = deployment(tmp_path)
    FaissStore(config.path.parent / "stores" / "vec", dim=8)  # a real store: only the option is wrong
    with Tombstone(config) as tomb:
        [doc] = write_docs(tomb, "alice", 1)
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("vec", "v-1", "faiss", "vector")])
    _config_with(config, "vec", 'backend = "faiss"\npath = "stores/vec"\nreclaim = "inplace"')
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert "reclaim = 'inplace' is not one of \"in-place\", \"rewrite\"" in err
    with Tombstone.open(config.path) as tomb:
        assert tomb.lineage.sagas() == [] and not tomb.lineage.is_suppressed("docs", doc)


def test_a_store_removed_from_the_config_stops_unless_allowed_then_exits_3(tmp_path):
    from tombstone.lineage.records import ArtifactRecord
    from test_cli import one_line_error

    config = deployment(tmp_path)
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("old-vectors", "v-1", "chroma", "vector")])
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert "'old-vectors'" in err and "--allow-missing-store old-vectors" in err
    result = run("erase", "alice", "--config", str(config.path), "--allow-missing-store", "old-vectors")
    assert result.exit_code == 3, result.output
    assert "old-vectors: 1 UNVERIFIED -- next: install the store's adapter" in result.output


def test_where_fits_100_columns_and_explains_its_states(tmp_path):
    root = tmp_path / "demo"
    assert run("demo", "--workdir", str(root), "--subjects", "2").exit_code == 0
    result = run("where", "user-0001", "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 100
    assert "decided = checked; its receipt gives the status" in result.output
    assert "exact_cache/llmcache-" in result.output


def test_receipt_show_takes_several_files_and_reads_them_all_first(tmp_path):
    from test_cli import one_line_error

    root = tmp_path / "demo"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2").exit_code == 0
    config = str(root / "tombstone.toml")
    assert run("erase", "user-0002", "--config", config).exit_code == 0
    files = [str(root / "receipts" / f"user-000{n}.json") for n in (1, 2)]
    result = run("receipt", "show", *files)
    assert result.exit_code == 0 and "subject user-0001" in result.output and "subject user-0002" in result.output
    bad = one_line_error(run("receipt", "show", files[0], str(tmp_path / "missing.json")), 2)
    assert "missing.json" in bad


def test_junit_starts_with_an_xml_declaration(tmp_path):
    junit = tmp_path / "junit.xml"
    assert run("check", "--backend", "docstore", "--canaries", "1", "--junit", str(junit)).exit_code == 0
    assert junit.read_text().startswith('<?xml version="1.0" encoding="utf-8"?>')
