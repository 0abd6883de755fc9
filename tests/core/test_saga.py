"""The saga skeleton: journaled steps, resume after a crash, one status per artifact."""

from __future__ import annotations

import shutil

import pytest

from tombstone import Tombstone
from tombstone.config import load_config
from tombstone.errors import ConfigError
from tombstone.saga import STEPS

from support import FrozenClock, write_docs


class Crash(BaseException):
    """Stands in for the process dying: not an error the saga may catch."""


def statuses(receipt):
    return {a["artifact_id"]: (a["status"], a["level"], a["reason"]) for a in receipt["artifacts"]}


@pytest.mark.parametrize("crash_in", ["suppress", "reclaim", "probe_logical", "probe_physical"])
def test_crash_then_resume_equals_clean_run(tomb, tmp_path, crash_in):
    write_docs(tomb, "alice", 3)
    write_docs(tomb, "bob", 2)
    tomb.close()
    clean_root = tmp_path / "clean"
    shutil.copytree(tomb.config.root, clean_root)

    crashed = Tombstone(tomb.config, clock=FrozenClock())
    adapter = crashed.adapter("docs")
    real = getattr(adapter, crash_in)

    def dies_after(*args):
        real(*args)  # the action happened; the process dies before the journal says so
        raise Crash()

    setattr(adapter, crash_in, dies_after)
    with pytest.raises(Crash):
        crashed.erase("alice")
    saga = crashed.lineage.sagas("running")
    assert len(saga) == 1
    crashed.close()

    with Tombstone.open(tomb.config.path) as resumed:
        [(receipt, path)] = resumed.resume()
        assert resumed.lineage.sagas("running") == []
        assert receipt["saga_id"] == saga[0]["saga_id"]
    with Tombstone(load_config(clean_root / "tombstone.toml"), clock=FrozenClock()) as clean:
        clean_receipt, _ = clean.erase("alice")
    assert statuses(receipt) == statuses(clean_receipt)
    assert {s for s, _, _ in statuses(receipt).values()} == {"VERIFIED"}


def test_journal_records_every_step_once(tomb):
    write_docs(tomb, "alice", 2)
    receipt, _ = tomb.erase("alice")
    entries = tomb.lineage.journal_entries(receipt["saga_id"])
    steps = [(e["step"], e["target"], e["phase"]) for e in entries]
    for step in STEPS[:-1]:
        assert steps.count((step, "docs", "begin")) == 1
        assert steps.count((step, "docs", "end")) == 1
        assert steps.index((step, "docs", "begin")) < steps.index((step, "docs", "end"))


def test_a_long_step_detail_is_kept_deflated_and_reads_back_as_it_was_journaled(tomb):
    """A step's detail past a few KB (a batch's verify results) is kept deflated in its journal row, as text:
    ``step_result`` and ``journal_entries`` give back exactly what was journaled; a short one stays plain JSON,
    and a long row written before details were deflated still reads back."""
    import json

    from tombstone.lineage.sql import PACK_OVER, PACKED

    write_docs(tomb, "alice", 2)
    receipt, _ = tomb.erase("alice")
    saga = receipt["saga_id"]
    long = {"artifacts": {f"a-{n:04d}": {"status": {"status": "VERIFIED", "level": "physical"},
                                         "probes": [{"level": "physical", "detail": {"files": ["x.bin"], "n": n,
                                                                                     "text": "ünï \u2028 \"q\""}}]}
                          for n in range(300)}}
    tomb.lineage.journal(saga, "probe-test", "docs", "end", long)
    tomb.lineage.journal(saga, "short-test", "docs", "end", {"ok": True})
    assert tomb.lineage.step_result(saga, "probe-test", "docs") == long
    assert tomb.lineage.step_result(saga, "short-test", "docs") == {"ok": True}
    stored = dict(tomb.lineage._conn.execute("SELECT step, detail FROM journal WHERE saga_id = ? AND step LIKE"
                                             " '%-test'", (saga,)).fetchall())
    text = json.dumps(long, sort_keys=True, ensure_ascii=False)
    assert len(text) > PACK_OVER and stored["probe-test"].startswith(PACKED)
    assert len(stored["probe-test"]) < len(text) / 5
    assert stored["short-test"] == '{"ok":true}'
    entries = {e["step"]: e for e in tomb.lineage.journal_entries(saga)}
    assert json.loads(entries["probe-test"]["detail"]) == long and entries["short-test"]["detail"] == '{"ok":true}'
    with tomb.lineage.atomic() as conn:  # a row from before: the JSON itself, however long
        conn.execute("UPDATE journal SET detail = ? WHERE saga_id = ? AND step = 'probe-test'", (text, saga))
    assert tomb.lineage.step_result(saga, "probe-test", "docs") == long


def test_erase_while_running_continues_the_same_saga(tomb):
    write_docs(tomb, "alice", 1)
    adapter = tomb.adapter("docs")
    real = adapter.reclaim

    def dies(arts):
        raise Crash()

    adapter.reclaim = dies
    with pytest.raises(Crash):
        tomb.erase("alice")
    [running] = tomb.lineage.sagas("running")
    adapter.reclaim = real
    receipt, _ = tomb.erase("alice")
    assert receipt["saga_id"] == running["saga_id"]
    assert len(tomb.lineage.sagas()) == 1


def test_suppression_recorded_before_anything_else(tomb):
    """Nothing gets a status without a durable suppression record (written before the store is touched)."""
    ids = write_docs(tomb, "alice", 2)
    adapter = tomb.adapter("docs")

    def check_then_fail(arts):
        assert all(tomb.lineage.is_suppressed("docs", a.artifact_id) for a in arts)
        raise Crash()

    adapter.suppress = check_then_fail
    with pytest.raises(Crash):
        tomb.erase("alice")
    assert all(tomb.lineage.is_suppressed("docs", i) for i in ids)


def test_unconfigured_store_is_unverified_no_adapter(tomb):
    from tombstone.lineage.db import ArtifactRecord

    tomb.lineage.record_artifacts("alice", [ArtifactRecord("ghost", "g1", "chroma", "vector")])
    [doc] = write_docs(tomb, "alice", 1)
    with pytest.raises(ConfigError, match="--allow-missing-store ghost"):
        tomb.erase("alice")  # a store the config no longer lists stops the erasure before anything changes
    assert tomb.lineage.sagas() == [] and not tomb.lineage.is_suppressed("docs", doc)
    receipt, _ = tomb.erase("alice", allow_missing_stores=["ghost"])
    by_store = {a["store"]: a for a in receipt["artifacts"]}
    assert by_store["ghost"]["status"] == "UNVERIFIED"
    assert by_store["ghost"]["reason"].startswith("no adapter")
    assert by_store["docs"]["status"] == "VERIFIED"


def test_probes_purged_for_verified(tomb):
    import numpy as np

    ids = write_docs(tomb, "alice", 1)
    tomb.lineage.record_artifacts("alice", [], probes=[("docs", ids[0], "a" * 64, np.ones(4))])
    tomb.erase("alice")
    assert tomb.lineage.probes_for("docs", ids[0]) == []
