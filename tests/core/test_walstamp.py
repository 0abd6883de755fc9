"""A wrapper keeps its hidden set without a read while the lineage db's wal-index header is unchanged, and
reads again on any commit, by any process: a suppression committed elsewhere hides the record on the very
next query. The header is trusted only where it can be (a SQLite db in WAL mode, the two copies equal, no
transaction of the connection's own open)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

from tombstone import Tombstone
from tombstone.capture import deferred
from tombstone.capture.hidden import HiddenIds
from tombstone.lineage.walstamp import WalStamp

from test_read_path import deployment, returned, wrapper, write

TOPIC = "refund for order 1182 delayed parcel"


def suppress_elsewhere(config, store, ids):
    """Records the suppression from a process of its own, as an erasure run by ``tombstone erase`` would."""
    code = textwrap.dedent(f"""
        from tombstone import Tombstone
        from tombstone.config import load_config
        with Tombstone(load_config({str(config.path)!r})) as tomb:
            tomb.lineage.record_suppressions("elsewhere", [tomb.lineage.artifact({store!r}, i) for i in {ids!r}])
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)


def test_a_suppression_committed_by_another_process_hides_the_record_on_the_next_query(tmp_path):
    config = deployment(tmp_path / "d")
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", [f"{TOPIC} note {n}" for n in range(3)])
        theirs = write(tomb, "bob", [f"{TOPIC} reply {n}" for n in range(3)])
        view = wrapper(tomb)
        assert set(mine) <= returned(view, TOPIC)  # control: visible, and the header read with the set
        stamp = tomb.lineage.commit_stamp()
        assert stamp is not None and returned(view, TOPIC) and tomb.lineage.commit_stamp() == stamp  # reads change nothing
        suppress_elsewhere(config, "vectors", mine)
        assert tomb.lineage.commit_stamp() != stamp
        seen = returned(view, TOPIC)
        assert not seen & set(mine), "a record suppressed by another process came back"
        assert set(theirs) <= seen


def test_with_a_header_that_never_changes_the_stale_set_would_come_back(tmp_path, monkeypatch):
    """The control for the test above: the header alone decides whether the set is read again, so a stamp
    blind to the other process's commit returns what it suppressed."""
    config = deployment(tmp_path / "d")
    monkeypatch.setattr(WalStamp, "read", lambda self: b"never changes")
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", [f"{TOPIC} note {n}" for n in range(3)])
        view = wrapper(tomb)
        assert set(mine) <= returned(view, TOPIC)
        suppress_elsewhere(config, "vectors", mine)
        assert set(mine) <= returned(view, TOPIC)


def test_a_suppression_inside_this_connections_own_open_transaction_hides_at_once(tmp_path):
    """Its rows are visible to this connection before any header changes: no stamp is trusted meanwhile."""
    config = deployment(tmp_path / "d")
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", [f"{TOPIC} note {n}" for n in range(3)])
        view = wrapper(tomb)
        assert set(mine) <= returned(view, TOPIC)
        with tomb.lineage.atomic():
            tomb.lineage.record_suppressions("here", [tomb.lineage.artifact("vectors", i) for i in mine])
            assert tomb.lineage.commit_stamp() is None
            assert not returned(view, TOPIC) & set(mine)


def test_hidden_ids_read_again_only_when_the_header_changed(tmp_path, monkeypatch):
    config = deployment(tmp_path / "d")
    with Tombstone(config) as tomb:
        mine = write(tomb, "alice", ["one", "two"])
        # the write's probe vectors are recorded by the background queue: its commit, landing between the two
        # reads below, would change the header (rightly read again); it is waited for first
        assert deferred.flush(60) == []
        tomb.lineage.record_suppressions("s-1", [tomb.lineage.artifact("vectors", mine[0])])
        hidden = HiddenIds(tomb.lineage, "vectors")
        reads = []
        real = tomb.lineage.suppression_generation
        monkeypatch.setattr(tomb.lineage, "suppression_generation", lambda store: reads.append(store) or real(store))
        assert hidden.current() == {mine[0]} and hidden.current() == {mine[0]}
        assert len(reads) == 1
        tomb.lineage.record_suppressions("s-2", [tomb.lineage.artifact("vectors", mine[1])])
        assert hidden.current() == set(mine) and len(reads) == 2


def test_the_header_changes_with_every_commit_and_after_the_log_starts_over(tmp_path):
    db = tmp_path / "x.db"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (n INTEGER)")
    stamp = WalStamp(db)
    seen = [stamp.read()]
    for statement in ("INSERT INTO t VALUES (1)", "PRAGMA wal_checkpoint(TRUNCATE)", "INSERT INTO t VALUES (2)",
                      "UPDATE t SET n = n + 1", "DELETE FROM t"):
        writer.execute(statement)
        seen.append(stamp.read())
    assert None not in seen
    commits = [seen[0], seen[1], seen[3], seen[4], seen[5]]  # the checkpoint commits nothing
    assert len(set(commits)) == len(commits)
    writer.execute("SELECT * FROM t").fetchall()
    assert stamp.read() == seen[-1]
    stamp.close()
    assert stamp.read() is None
    writer.close()


def test_a_header_that_cannot_be_trusted_is_never_used(tmp_path):
    missing = WalStamp(tmp_path / "none.db")
    assert missing.read() is None
    fake = tmp_path / "fake.db"
    header = (3007000).to_bytes(4, sys.byteorder) + bytes(8) + b"\x01" + bytes(35)
    for shm, why in ((header + header + bytes(40), None),
                     (header + header[:-1] + b"\x07" + bytes(40), "copies differ: a commit half written"),
                     (bytes(4) + header[4:] + bytes(4) + header[4:] + bytes(40), "another version"),
                     (header[:12] + b"\x00" + header[13:] + header[:12] + b"\x00" + header[13:] + bytes(40),
                      "not initialised"),
                     (header, "shorter than the mapped header")):
        (tmp_path / "fake.db-shm").write_bytes(shm)
        with open(tmp_path / "fake.db-shm", "rb"):  # held open, as a SQLite connection holds the one it uses
            got = WalStamp(fake).read()
        assert (got is None) == (why is not None), why
    # the control of the rule below: the same well-formed header, held open by nothing in this process
    (tmp_path / "fake.db-shm").write_bytes(header + header + bytes(40))
    assert WalStamp(fake).read() is None


def test_a_stale_shm_file_beside_a_link_to_the_db_is_never_taken_for_the_live_one(tmp_path):
    """SQLite follows a link to the database file and keeps its -shm beside the file it reaches; a -shm left
    beside the link (from when a database lay there) never changes, and would hide nothing new."""
    import os

    real = tmp_path / "real" / "lineage.db"
    real.parent.mkdir()
    writer = sqlite3.connect(real, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (n INTEGER)")
    link = tmp_path / "link.db"
    os.symlink(real, link)
    (tmp_path / "link.db-shm").write_bytes((real.parent / "lineage.db-shm").read_bytes()[:136])  # a stale copy
    stamp = WalStamp(link)
    before = stamp.read()
    assert before is not None
    writer.execute("INSERT INTO t VALUES (1)")
    assert stamp.read() != before  # the live one: it sees the commit
    stamp.close()
    writer.close()
