"""A hostile pgvector data directory handed to the auditor (or named in a config): the embedded PostgreSQL
Tombstone starts on it must run nothing the directory asks for, connect nowhere it names, write nothing into
it, and be stopped afterwards.

Real servers throughout: a deployment is built and erased on the embedded server, the server is stopped,
and the data directory is cloned and planted with the attack (configuration files, recovery signals, a
``postmaster.pid``, a shell-active folder name)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import psycopg
import pytest
import tomli_w

from tombstone import Tombstone, init_deployment
from tombstone.audit import audit
from tombstone.capture import HashingEmbedder
from tombstone.errors import StoreUnavailableError
from tombstone_adapters.pgvector.adapter import PgVectorAdapter
from tombstone_adapters.pgvector.server import embedded_dsn, stop_embedded
from tombstone_adapters.pgvector.store import PgVectorStore

DIM = 32
TABLE = "chunks"
REPO = Path(__file__).resolve().parents[2]


def postgres_on(path: Path) -> list[int]:
    """Pids of postgres processes whose command line names ``path`` (or a folder under it)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and any(str(path) in arg for arg in cmdline):
            found.append(proc.pid)
    return found


def copies_running() -> list[int]:
    return postgres_on(Path(tempfile.gettempdir()) / "tombstone-pgcopy-")


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (itself included): sha256 of files, owner, group and mode of everything."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = Path(folder) / name if name != "." else Path(folder)
            info = os.lstat(path)
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
            out[str(path.relative_to(root))] = (digest, info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode))
    return out


def clone(source: Path, target: Path) -> Path:
    """A copy of a data directory as an auditor receives it: same content, owner and modes."""
    shutil.copytree(source, target, symlinks=True)
    for folder, dirs, files in os.walk(target):
        for name in [*dirs, *files]:
            original = source / Path(folder).relative_to(target) / name
            info = os.lstat(original)
            os.chown(Path(folder) / name, info.st_uid, info.st_gid, follow_symlinks=False)
    info = os.stat(source)
    os.chown(target, info.st_uid, info.st_gid)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    return target


class Overran(Exception):
    pass


@pytest.fixture(autouse=True)
def bounded():
    """A test that would hang (a server waiting forever for a standby's WAL) fails instead."""
    def overran(signum, frame):
        raise Overran("the test ran past 300 s")

    previous = signal.signal(signal.SIGALRM, overran)
    signal.alarm(300)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def workdir():
    """Outside pytest's own temporary root: as root the server runs as another user, who must reach it."""
    root = Path(tempfile.mkdtemp(prefix="tombstone-hostile-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def erased(workdir):
    """A deployment on an embedded data directory, alice erased (receipt VERIFIED), the server stopped."""
    data = workdir / "operator" / "pgdata"
    config = init_deployment(workdir / "operator", {"pg": {"backend": "pgvector", "data_dir": str(data), "table": TABLE}})
    with psycopg.connect(embedded_dsn(data), autocommit=True) as admin, Tombstone(config) as tomb:
        PgVectorStore(admin, TABLE, dim=DIM)
        store = PgVectorStore(admin, TABLE, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM))
        for subject, n in (("alice", 3), ("bob", 12)):
            store.add([f"{subject}-row-{i:03d}" for i in range(n)],
                      documents=[f"{subject} wrote line {i} " * 3 for i in range(n)], subject=subject)
        receipt, path = tomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    stop_embedded(data)
    assert postgres_on(data) == [], "the operator's server was not stopped"
    return {"data": data, "receipt": path, "key": config.keys_dir / "signing.pub"}


def auditor_config(folder: Path, data: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "stores.toml"
    path.write_text(tomli_w.dumps({"stores": {"pg": {"backend": "pgvector", "data_dir": str(data), "table": TABLE}}}))
    return path


def run_audit(erased, handed: Path, folder: Path):
    return audit(erased["receipt"], config_path=str(auditor_config(folder, handed)), key_path=str(erased["key"]))


# -- 1. configuration and recovery files that run commands ------------------------------------------

def plant_auto_conf(data: Path, marker: Path) -> None:
    (data / "postgresql.auto.conf").write_text(
        f"restore_command = 'touch {marker}'\narchive_mode = on\narchive_command = 'touch {marker}'\n")
    (data / "recovery.signal").write_text("")


def plant_standby(data: Path, marker: Path) -> None:
    (data / "postgresql.auto.conf").write_text(f"restore_command = 'touch {marker}'\n")
    (data / "standby.signal").write_text("")


def plant_include(data: Path, marker: Path) -> None:
    extra = data.parent / "extra.d"
    extra.mkdir()
    (extra / "evil.conf").write_text(f"restore_command = 'touch {marker}'\n")
    with open(data / "postgresql.conf", "a") as fh:
        fh.write(f"\ninclude_dir = '{extra}'\n")
    (data / "recovery.signal").write_text("")


@pytest.mark.slow
@pytest.mark.parametrize("plant", [plant_auto_conf, plant_standby, plant_include], ids=["auto.conf", "standby", "include"])
def test_the_audit_runs_no_command_the_data_directory_configures(erased, workdir, plant):
    case = workdir / f"case-{plant.__name__}"
    handed = clone(erased["data"], case / "handed")
    marks = case / "marks"
    marks.mkdir()
    marks.chmod(0o777)  # writable by whichever user a command would run as
    marker = marks / "pwned"
    plant(handed, marker)
    before = tree_state(handed)
    report = run_audit(erased, handed, case / "auditor")
    assert not marker.exists(), "a command from the handed data directory ran"
    assert tree_state(handed) == before, "the audit changed the handed data directory"
    assert postgres_on(handed) == [] and copies_running() == []
    # Honest: the probes ran (on the private copy) and agree with the receipt.
    assert report.rows and {row.verdict for row in report.rows} == {"agree"}, [r.__dict__ for r in report.rows]
    assert not any("all probes" in note for row in report.rows for note in row.not_run)


# -- 2. a folder name a shell would run ------------------------------------------------------------

SHELL_NAME = "x$(touch pwned)y"

SCRIPT = """
import sys
import psycopg
from tombstone_adapters.pgvector.adapter import PgVectorAdapter
from tombstone_adapters.pgvector.server import embedded_dsn, stop_embedded
data = sys.argv[1]
with psycopg.connect(embedded_dsn(data), autocommit=True) as conn:
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    conn.execute("CREATE TABLE IF NOT EXISTS chunks (id text PRIMARY KEY, document text, metadata jsonb,"
                 " embedding vector(3), tombstoned boolean NOT NULL DEFAULT false)")
    conn.execute("INSERT INTO chunks VALUES ('a', 'doc', '{}', '[1,2,3]') ON CONFLICT DO NOTHING")
stop_embedded(data)
adapter = PgVectorAdapter.open_read_only("pg", {"data_dir": data, "table": "chunks"})
print("rows", adapter.pg.count())
adapter.close()
"""


@pytest.mark.slow
def test_a_data_directory_named_like_a_shell_command_runs_nothing(workdir):
    """pg_ctl starts the server through /bin/sh: a folder named ``x$(touch pwned)y`` ran ``touch`` in the
    caller's working directory. Tombstone starts the server without a shell, on the folder as named."""
    cwd = workdir / "shell"
    cwd.mkdir()
    cwd.chmod(0o777)  # writable by whichever user a command would run as
    data = cwd / SHELL_NAME
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(data)], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert not (cwd / "pwned").exists(), "the folder's name ran as a shell command"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rows 1" in done.stdout
    assert (data / "PG_VERSION").is_file(), "the cluster lives in the folder as named"
    assert postgres_on(data) == [] and postgres_on(cwd) == []


# -- 3. a planted postmaster.pid ------------------------------------------------------------------

class Listener:
    """A TCP server that records every connection it gets (and closes it at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> int:
        if self.sock.fileno() != -1:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        self.thread.join(10)
        return self.connections


def plant_pid_file(data: Path, port: int) -> None:
    """A postmaster.pid naming a live process (pid 1) and a server on 127.0.0.1:port, not a socket."""
    lines = ["1", str(data), "1700000000", str(port), "", "127.0.0.1", "0 0", "ready"]
    (data / "postmaster.pid").write_text("\n".join(lines) + "\n")


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.mark.slow
def test_a_planted_postmaster_pid_sends_the_auditor_nowhere(erased, workdir, listener, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "the-auditors-password")
    case = workdir / "pidfile-audit"
    handed = clone(erased["data"], case / "handed")
    plant_pid_file(handed, listener.port)
    before = tree_state(handed)
    report = run_audit(erased, handed, case / "auditor")
    assert listener.close() == 0, "the audit connected to the host the planted postmaster.pid names"
    assert {row.verdict for row in report.rows} == {"agree"}, [r.__dict__ for r in report.rows]
    assert tree_state(handed) == before
    assert copies_running() == []


@pytest.mark.slow
def test_a_planted_postmaster_pid_is_not_trusted_by_the_operator_either(erased, workdir, listener, monkeypatch):
    """In place (the operator's own directory) Tombstone starts its own server on its own socket and never
    reads the pid file for where to connect (a pid file of another user's live process is stale to
    PostgreSQL, which replaces it)."""
    monkeypatch.setenv("PGPASSWORD", "the-operators-password")
    data = clone(erased["data"], workdir / "pidfile-operator" / "pgdata")
    plant_pid_file(data, listener.port)
    try:
        with psycopg.connect(embedded_dsn(data), autocommit=True) as conn:
            assert conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0] == 12
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
    finally:
        stop_embedded(data)
    assert listener.close() == 0, "the operator connected to the host the planted postmaster.pid names"
    assert postgres_on(data) == []


def test_the_operators_server_listens_on_its_own_private_socket_only(erased, workdir):
    data = clone(erased["data"], workdir / "socket-operator" / "pgdata")
    try:
        dsn = embedded_dsn(data)
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
            sockets = Path(conn.execute("SHOW unix_socket_directories").fetchone()[0])
        assert str(sockets) not in str(data) and stat.S_IMODE(os.lstat(sockets).st_mode) == 0o700
        assert os.lstat(sockets).st_uid in (os.geteuid(), os.stat(data).st_uid)
    finally:
        stop_embedded(data)
    assert postgres_on(data) == [], "the server Tombstone started was not stopped"


# -- 4. read-only never writes to the handed directory -----------------------------------------------

@pytest.mark.slow
def test_read_only_opening_and_scan_leave_every_byte_owner_and_mode_alone(erased, workdir):
    handed = clone(erased["data"], workdir / "readonly" / "handed")
    # A directory left by a crash: a stale pid file, options, a signal; and a handed auto.conf.
    (handed / "postmaster.opts").write_text(f"{handed}/postgres \"-D\" \"{handed}\"\n")
    before = tree_state(handed)
    options = {"data_dir": str(handed), "table": TABLE}
    adapter = PgVectorAdapter.open_read_only("pg", options)
    try:
        conn = adapter.conn
        assert adapter.pg.count() == 12
        settings = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                                     (["listen_addresses", "archive_mode", "restore_command", "shared_preload_libraries",
                                       "data_directory", "session_preload_libraries"],)).fetchall())
        assert settings["listen_addresses"] == "" and settings["archive_mode"] == "off"
        assert settings["restore_command"] == "" and settings["shared_preload_libraries"] == ""
        assert settings["session_preload_libraries"] == ""
        copy = Path(settings["data_directory"])
        assert copy != handed and not str(copy).startswith(str(handed))
        assert stat.S_IMODE(os.stat(copy.parent).st_mode) == 0o700
        assert postgres_on(handed) == []
    finally:
        adapter.close()
    assert not copy.exists(), "the private copy was not deleted"
    report = PgVectorAdapter.scan_deleted("pg", options)
    assert report.places
    assert tree_state(handed) == before, "opening read-only changed the handed data directory"
    assert copies_running() == [], "a server on a private copy was left running"


def test_read_only_on_a_folder_that_is_no_data_directory_creates_nothing(workdir):
    empty = workdir / "not-a-cluster"
    with pytest.raises(StoreUnavailableError) as caught:
        PgVectorAdapter.open_read_only("pg", {"data_dir": str(empty / "data"), "table": TABLE})
    assert "\n" not in str(caught.value) and "PG_VERSION" in str(caught.value)
    assert not empty.exists(), "read-only must not create (initdb) a data directory"
