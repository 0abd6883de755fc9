"""Retries and dead letters, with faults injected by the faulty-store wrapper (not by patching)."""

from __future__ import annotations

import pytest

from tombstone import Tombstone, init_deployment
from tombstone.saga.engine import RetryPolicy

from support import FrozenClock, write_docs
from test_cli import one_line_error, run


def faulty_deployment(tmp_path, **faults):
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(tmp_path / "d", {"docs": {"backend": "faulty", "wraps": "docstore",
                                                       "path": "stores/docs/docstore.db", **faults}})
    DocStore(config.stores["docs"].options["path"]).close()
    return config


def test_retryable_errors_back_off_then_succeed(tmp_path):
    config = faulty_deployment(tmp_path, fail_reclaim=2)
    waits = []
    with Tombstone(config, clock=FrozenClock(), sleep=waits.append, retry=RetryPolicy(attempts=4, base_seconds=0.5)) as tomb:
        write_docs(tomb, "alice", 2)
        first = tomb.adapter("docs")
        receipt, _ = tomb.erase("alice")
        assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
        assert waits == [0.5, 1.0], "bounded exponential backoff, from the injected clock"
        assert tomb.adapter("docs") is not first, "each retry opens the store afresh"
        assert tomb.lineage.dead_letters() == []


def test_past_the_budget_the_artifacts_are_dead_letters(tmp_path):
    config = faulty_deployment(tmp_path, fail_reclaim=10)
    waits = []
    with Tombstone(config, clock=FrozenClock(), sleep=waits.append, retry=RetryPolicy(attempts=3, base_seconds=1, cap_seconds=1.5)) as tomb:
        write_docs(tomb, "alice", 2)
        receipt, _ = tomb.erase("alice")
        assert waits == [1, 1.5]
        for art in receipt["artifacts"]:
            assert art["status"] == "UNVERIFIED"
            assert art["reason"] == "dlq: injected fault: reclaim failed (3 of 10)"
        [letter] = tomb.lineage.dead_letters()
        assert (letter["subject"], letter["store"], letter["step"], letter["attempts"]) == ("alice", "docs", "reclaim", 3)
    listed = run("dlq", "list", "--config", str(config.path))
    assert "alice" in listed.output and "injected fault: reclaim failed" in listed.output


def test_non_retryable_errors_are_not_retried(tmp_path):
    config = faulty_deployment(tmp_path, fail_suppress=1, retryable=False)
    waits = []
    with Tombstone(config, clock=FrozenClock(), sleep=waits.append) as tomb:
        write_docs(tomb, "alice", 1)
        receipt, _ = tomb.erase("alice")
        assert waits == [] and receipt["artifacts"][0]["reason"].startswith("dlq: injected fault: suppress failed")


def test_dlq_retry_erases_again_once_the_store_is_back(tmp_path):
    config = faulty_deployment(tmp_path, fail_reclaim=4)
    with Tombstone(config, sleep=lambda s: None) as tomb:
        write_docs(tomb, "alice", 2)
        first, _ = tomb.erase("alice")
        assert {a["status"] for a in first["artifacts"]} == {"UNVERIFIED"}
    # the fault budget (4) is spent: the store works again
    result = run("dlq", "retry", "--config", str(config.path))
    assert result.exit_code == 0 and "VERIFIED(physical)" in result.output
    assert "no dead letters" in run("dlq", "list", "--config", str(config.path)).output


def test_a_store_down_at_the_start_never_yields_verified(tmp_path):
    config = faulty_deployment(tmp_path, fail_open=100)
    from tombstone_adapters.docstore import DocStore
    from tombstone.keys import LineageSecret
    from tombstone.lineage.db import LineageDB

    with LineageDB(config.lineage_db, LineageSecret.load(config.keys_dir)) as lineage:
        docs = DocStore(config.stores["docs"].options["path"], lineage=lineage, store="docs")
        docs.add("alice-doc-0001", "hello there alice", subject="alice")
        docs.close()
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert "injected fault: open failed" in err
    assert "no erasure has been run" in run("status", "--config", str(config.path)).output
