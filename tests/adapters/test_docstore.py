"""SQLite docstore backend against real SQLite files: conformance, controls, end to end."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from pathlib import Path
from unittest import mock

import pytest

from tombstone.contract import open_adapter
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.docstore import DocStore, DocstoreAdapter

from support import write_docs


def independent_scan(directory: Path, needle: str) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(p.name for p in directory.rglob("*") if p.is_file() and needle.encode() in p.read_bytes())


class TestDocstoreConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, tomb):
        # The control needs a plain DELETE that leaves the freed cell in place: this machine's
        # SQLite has secure_delete on by default, so turn it off explicitly.
        adapter = open_adapter("docs", "docstore", {**tomb.config.stores["docs"].options, "secure_delete": False})
        counter = iter(range(10_000))

        def write(subject: str, n: int):
            ids = write_docs(tomb, subject, n, prefix=f"{subject}-{next(counter)}")
            return [tomb.lineage.artifact("docs", i) for i in ids]

        def survivors():
            return {d.id: (d.text, d.metadata) for d in adapter.docs.all()}

        def visible(ids):
            return {d.id for d in adapter.docs.get_many(ids)} | {d.id for d in adapter.docs.all() if d.id in ids}

        @contextlib.contextmanager
        def vendor_failure():
            # SQLite fails every statement; the physical probe reads the files instead, so listing them fails too.
            conn = mock.Mock(spec=sqlite3.Connection, in_transaction=False)
            conn.execute.side_effect = conn.executemany.side_effect = sqlite3.OperationalError("injected: disk I/O error")
            unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.docs.path))
            with mock.patch.object(adapter.docs, "_conn", conn), \
                    mock.patch.object(adapter.docs, "files", side_effect=unreadable):
                yield

        return ConformanceEnv(adapter=adapter, write=write, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


def assert_every_read_path_hides(docs: DocStore, mine: list[str], theirs: list[str]) -> None:
    """No read path returns ``mine``; each returns some of ``theirs`` (so each is exercised); one survivor."""
    paths = {
        "get": [d.id for i in mine + theirs if (d := docs.get(i))],
        "get_many": [d.id for d in docs.get_many(mine + theirs)],
        "find": [d.id for d in docs.find(n=0)],
        "search": [d.id for d in docs.search("shared")],
        "all": [d.id for d in docs.all()],
    }
    for name, returned in paths.items():
        assert not set(returned) & set(mine), f"{name} returned a suppressed document"
        assert set(returned) & set(theirs), f"{name} lost the survivor (the path is not exercised)"
    assert docs.count() == 1


def test_every_read_path_hides_suppressed(tomb):
    mine = write_docs(tomb, "alice", 2, texts=["alpha shared words", "beta words"])
    theirs = write_docs(tomb, "bob", 1, texts=["gamma shared words"])
    adapter = tomb.adapter("docs")
    adapter.suppress([tomb.lineage.artifact("docs", i) for i in mine])
    docs = DocStore(tomb.config.stores["docs"].options["path"])
    try:
        assert_every_read_path_hides(docs, mine, theirs)
    finally:
        docs.close()


def test_every_read_path_hides_ids_suppressed_in_the_lineage_db_before_the_flag_is_set(tomb):
    """An erasure records its suppression in the lineage db before it touches the store: a wrapper with the
    lineage db hides those rows from then on, although their flag is still 0. Control: a bare store (no
    lineage db) still returns them."""
    mine = write_docs(tomb, "alice", 2, texts=["alpha shared words", "beta words"])
    theirs = write_docs(tomb, "bob", 1, texts=["gamma shared words"])
    tomb.lineage.record_suppressions("e1", [tomb.lineage.artifact("docs", i) for i in mine])
    path = tomb.config.stores["docs"].options["path"]
    docs, bare = DocStore(path, lineage=tomb.lineage, store="docs"), DocStore(path)
    try:
        assert_every_read_path_hides(docs, mine, theirs)
        assert {d.id for d in bare.get_many(mine)} == set(mine) and bare.count() == 3  # control
    finally:
        docs.close()
        bare.close()


def test_find_rejects_hostile_metadata_key(tomb):
    docs = DocStore(tomb.config.stores["docs"].options["path"])
    with pytest.raises(Exception, match="invalid metadata key"):
        docs.find(**{"x') OR 1=1 --": 1})
    docs.close()


@pytest.mark.parametrize("secure_delete", [False, True])
def test_plain_delete_control_and_reclaim(tomb, secure_delete):
    """Before erasure the scan finds the id; after a plain DELETE it is still on disk when
    secure_delete is off (the control); after the reclaim recipe nothing is found, independently."""
    mine = write_docs(tomb, "alice", 3)
    write_docs(tomb, "bob", 2)
    arts = [tomb.lineage.artifact("docs", i) for i in mine]
    adapter = DocstoreAdapter("docs", {**tomb.config.stores["docs"].options, "secure_delete": secure_delete})
    store_dir = Path(adapter.docs.path).parent
    try:
        assert all(not r.passed and r.id_found for r in adapter.probe_physical(arts).values())
        assert independent_scan(store_dir, mine[0])
        adapter.native_delete(arts)
        assert all(r.passed for r in adapter.probe_logical(arts).values())
        after_delete = adapter.probe_physical(arts)
        if not secure_delete:
            assert all(not r.passed for r in after_delete.values()), "control: plain DELETE left nothing"
            assert independent_scan(store_dir, mine[0])
        evidence = adapter.reclaim(arts)
        assert evidence["secure_delete"] is secure_delete
        assert all(r.passed for r in adapter.probe_physical(arts).values())
    finally:
        adapter.close()
    for doc_id in mine:
        assert independent_scan(store_dir, doc_id) == []


def test_erase_end_to_end_verified_physical(tomb):
    mine = write_docs(tomb, "alice", 3)
    theirs = write_docs(tomb, "bob", 2)
    path = Path(tomb.config.stores["docs"].options["path"])
    before = {d.id: d for d in DocStore(path).all() if d.id in theirs}
    receipt, receipt_path = tomb.erase("alice")
    assert receipt_path.exists()
    assert {a["artifact_id"] for a in receipt["artifacts"]} == set(mine)
    assert all(a["status"] == "VERIFIED" and a["level"] == "physical" for a in receipt["artifacts"])
    tomb.close()
    for doc_id in mine:
        assert independent_scan(path.parent, doc_id) == []
    survivors = DocStore(path)
    assert {d.id: d for d in survivors.all()} == before
    survivors.close()


def test_store_own_delete_then_erase_is_honest(tomb):
    """If the app already deleted the rows, erasure still reclaims and verifies from the bytes."""
    mine = write_docs(tomb, "alice", 2)
    adapter = DocstoreAdapter("docs", {**tomb.config.stores["docs"].options, "secure_delete": False})
    adapter.native_delete([tomb.lineage.artifact("docs", i) for i in mine])
    adapter.close()
    receipt, _ = tomb.erase("alice")
    assert [a["status"] for a in receipt["artifacts"]] == ["VERIFIED", "VERIFIED"]


def test_unreadable_store_never_verifies(tomb, tmp_path):
    write_docs(tomb, "alice", 1)
    path = Path(tomb.config.stores["docs"].options["path"])
    adapter = tomb.adapter("docs")
    adapter.close()
    tomb._adapters.clear()
    path.unlink()
    Path(f"{path}-wal").unlink(missing_ok=True)
    with pytest.raises(Exception, match="docstore file not found"):
        tomb.erase("alice")


def test_store_lost_mid_saga_is_unverified(tomb, monkeypatch):
    write_docs(tomb, "alice", 2)
    adapter = tomb.adapter("docs")

    from tombstone.errors import StoreUnavailableError

    def failing_reclaim(self, arts):
        raise StoreUnavailableError("docstore write failed: disk I/O error", store="docs")

    # the store stays lost: every retry opens the store afresh, and fails the same way
    monkeypatch.setattr(type(adapter), "reclaim", failing_reclaim)
    receipt, _ = tomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"UNVERIFIED"}
    assert all(a["reason"].startswith("dlq: ") for a in receipt["artifacts"])



@pytest.mark.parametrize("sidecar,plant", [("-journal", "fifo"), ("-shm", "dev-zero")])
def test_a_special_file_at_a_sidecar_path_is_named_and_never_hangs(tomb, sidecar, plant):
    import os
    import subprocess
    import sys

    write_docs(tomb, "alice", 1)
    planted = Path(tomb.config.stores["docs"].options["path"] + sidecar)
    planted.unlink(missing_ok=True)
    if plant == "fifo":
        os.mkfifo(planted)
    else:
        planted.symlink_to("/dev/zero")
    # SQLite itself blocks forever on a FIFO at -journal: the store is refused before it is opened
    result = subprocess.run([sys.executable, "-m", "tombstone", "erase", "alice", "--config", str(tomb.config.path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"docstore.db{sidecar} is a" in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


def test_writing_a_suppressed_id_again_keeps_it_hidden_until_the_erasure_ends(tomb):
    ids = write_docs(tomb, "alice", 2)
    arts = [tomb.lineage.artifact("docs", i) for i in ids]
    tomb.lineage.record_suppressions("erasure-under-way", arts)  # what the saga records before touching the store
    tomb.adapter("docs").suppress(arts)
    assert write_docs(tomb, "alice", 2) == ids  # the app writes the same ids again mid-erasure
    store = DocStore(tomb.config.stores["docs"].options["path"])
    try:
        assert store.get_many(ids) == [] and not {d.id for d in store.all()} & set(ids)
    finally:
        store.close()
    receipt, _ = tomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    write_docs(tomb, "alice", 1)  # after the erasure a write is a new record, and visible
    store = DocStore(tomb.config.stores["docs"].options["path"])
    try:
        assert store.get(ids[0]) is not None
    finally:
        store.close()
