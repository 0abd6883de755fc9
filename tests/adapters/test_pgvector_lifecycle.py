"""The embedded PostgreSQL's lifecycle: whoever starts it stops it (an adapter still open in the process
holds it until it closes), ``tombstone demo`` leaves no postgres behind, and a start after a crash clears
what the crashed server left without trusting a ``postmaster.pid`` it did not write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

from tombstone_adapters.pgvector import server
from tombstone_adapters.pgvector.embedded import clear_crashed, postgres_on


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=600)


@pytest.mark.slow
def test_the_demo_leaves_no_postgres_on_its_data_directory(tmp_path):
    work = tmp_path / "demo"
    ran = cli("demo", "--workdir", str(work), "--backends", "pgvector", "--subjects", "3")
    assert ran.returncode == 0, ran.stderr[-2000:]
    data = work / "stores" / "pgvector" / "pgdata"
    # Control: a server really ran there (a cluster was made, and the receipt was verified through it).
    assert (data / "PG_VERSION").is_file() and "VERIFIED" in ran.stdout
    assert postgres_on(data) == []
    assert not (data / "postmaster.pid").exists()  # stopped cleanly, not killed


def test_release_waits_for_an_adapter_still_open_in_the_process(tmp_path):
    from tombstone_adapters.pgvector.adapter import PgVectorAdapter

    data = tmp_path / "data"
    with psycopg.connect(server.embedded_dsn(data), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE t (id text PRIMARY KEY, document text, metadata jsonb, embedding vector(3))")
    adapter = PgVectorAdapter("pg", {"data_dir": str(data), "table": "t"})
    try:
        server.stop_embedded(data)  # the starter is done, the adapter is not
        assert postgres_on(data), "stopped under an open adapter"
        assert adapter.conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    finally:
        adapter.close()
    assert postgres_on(data) == []  # the last holder let go: stopped


def test_a_stale_postmaster_pid_naming_an_unrelated_live_process_is_not_signalled(tmp_path):
    data = tmp_path / "data"
    server.embedded_dsn(data)
    server.stop_embedded(data)
    assert postgres_on(data) == []
    # As the server's own user (PostgreSQL takes a pid it may not signal for stale, so only a process it
    # could signal makes it refuse to start).
    sleeper = subprocess.Popen(["sleep", "300"], **({"user": "pgserver"} if os.geteuid() == 0 else {}))
    try:
        # What a crash leaves, with its pid reused by an unrelated process (or the file planted).
        (data / "postmaster.pid").write_text(f"{sleeper.pid}\n{data}\n1700000000\n5432\n\n\n  5432001 0\n")
        if os.geteuid() == 0:
            import pwd

            owner = pwd.getpwnam("pgserver")
            os.chown(data / "postmaster.pid", owner.pw_uid, owner.pw_gid)
        dsn = server.embedded_dsn(data)  # PostgreSQL itself refuses to start beside a live pid in the file
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert sleeper.poll() is None, "the unrelated process was signalled"
        assert "removed a postmaster.pid naming pid" in (server._servers[str(data.resolve())].state / "server.log").read_text()
        new_pid = int((data / "postmaster.pid").read_text().split()[0])
        assert new_pid != sleeper.pid and new_pid in [p.pid for p in postgres_on(data)]
    finally:
        sleeper.kill()
        sleeper.wait()
        server.stop_embedded(data)
    assert postgres_on(data) == []


def test_a_server_whose_starter_was_killed_is_cleared_before_the_next_start(tmp_path):
    """A process starts the server and dies with SIGKILL (no atexit), and the record of that server is lost:
    the next start finds the postmaster by its data directory and socket folder, stops it, and starts anew."""
    data = tmp_path / "data"
    script = textwrap.dedent(f"""
        import os, signal
        from tombstone_adapters.pgvector.server import embedded_dsn
        embedded_dsn({str(data)!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert died.returncode == -signal.SIGKILL
    left = [p.pid for p in postgres_on(data)]
    assert left, "control: the killed starter left its server running"
    state = server._in_place(data).state
    (state / "server.json").unlink()
    try:
        server.embedded_dsn(data)
        now = [p.pid for p in postgres_on(data)]
        assert now and not set(now) & set(left)
        assert "stopped an earlier server of ours" in (state / "server.log").read_text()
    finally:
        server.stop_embedded(data)
    assert postgres_on(data) == []


def test_a_postgres_someone_else_started_on_the_directory_is_left_alone(tmp_path):
    """Only a postmaster started by Tombstone (its command line names Tombstone's socket folder) is stopped."""
    data = tmp_path / "data"
    server.embedded_dsn(data)
    inplace = server._servers[str(data.resolve())]
    other = tmp_path / "other-sockets"
    other.mkdir()
    server.stop_embedded(data)
    if os.geteuid() == 0:
        import pwd

        owner = pwd.getpwnam("pgserver")
        os.chown(other, owner.pw_uid, owner.pw_gid)
    from tombstone_adapters.pgvector.embedded import HARDENING, _Process, socket_dsn

    foreign = _Process.launch(inplace.bins, data, other, HARDENING, tmp_path / "other.log", inplace.ids)
    try:
        foreign.wait_ready(socket_dsn(other), data, tmp_path / "other.log")
        from tombstone.errors import StoreUnavailableError

        with pytest.raises(StoreUnavailableError, match="did not start"):
            clear_crashed(data, inplace.sockets)
        assert foreign.alive()
    finally:
        foreign.stop()
    assert postgres_on(data) == []


def test_a_pytest_session_started_meanwhile_does_not_lock_the_server_out_of_its_data_directory(tmp_path):
    """The cause of an intermittent setup error ("initdb: could not access directory ...: Permission denied"):
    every pytest session that starts takes group and other permissions off the shared
    ``/tmp/pytest-of-<user>``, and as root the server runs as ``pgserver``, which must traverse every folder
    above its data directory. The suite's temporary folders are its own (tests/conftest.py), so a session
    started meanwhile (here a nested one, without --basetemp) no longer reaches them."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "test_x.py").write_text("def test_x(tmp_path):\n    assert tmp_path.is_dir()\n")
    nested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner / "test_x.py")],
                            capture_output=True, text=True, cwd=inner, timeout=300)
    assert nested.returncode == 0, nested.stdout[-1000:]
    import getpass
    import tempfile

    shared = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"
    # Control: the nested session did what any new session does to the shared folder.
    assert shared.is_dir() and shared.stat().st_mode & 0o077 == 0
    assert shared not in tmp_path.parents
    data = tmp_path / "data"
    try:
        with psycopg.connect(server.embedded_dsn(data)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop_embedded(data)
    assert postgres_on(data) == []


def test_backends_left_by_a_killed_postmaster_are_killed_before_the_next_start(tmp_path):
    """A backend busy computing does not notice its postmaster's death and keeps the old shared memory
    attached, so PostgreSQL would refuse to start again ("pre-existing shared memory block is still in
    use"). The next start kills it (a postgres in this data directory with no postmaster) and comes up."""
    import psutil

    data = tmp_path / "data"
    dsn = server.embedded_dsn(data)
    busy = psycopg.connect(dsn, autocommit=True)
    try:
        busy.pgconn.send_query(b"SELECT count(*) FROM generate_series(1, 100000000000)")
        with psycopg.connect(dsn, autocommit=True) as watch:
            for _ in range(3000):
                rows = watch.execute("SELECT pid FROM pg_stat_activity WHERE state = 'active'"
                                     " AND query LIKE 'SELECT count(*) FROM generate_series%'").fetchall()
                if rows:
                    break
                watch.execute("SELECT pg_sleep(0.01)")
        assert rows, "the busy statement never showed in pg_stat_activity"
        backend = rows[0][0]
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        assert psutil.Process(backend).ppid() == postmaster
        os.kill(postmaster, signal.SIGKILL)
        psutil.Process(postmaster).wait(60) if psutil.pid_exists(postmaster) else None
        # Control: the backend outlived its postmaster.
        assert backend in [p.pid for p in postgres_on(data)]
        with psycopg.connect(server.embedded_dsn(data)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert not psutil.pid_exists(backend) or psutil.Process(backend).status() == psutil.STATUS_ZOMBIE
        log = (server._servers[str(data.resolve())].state / "server.log").read_text()
        assert f"killed process {backend} of a crashed server" in log
    finally:
        busy.close()
        server.stop_embedded(data)
    assert postgres_on(data) == []
