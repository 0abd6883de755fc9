"""Files Tombstone creates: private (0600), written without following a link someone planted, and receipts
only inside receipts_dir unless the caller names a file."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from tombstone.fsutil import write_atomic
from tombstone.testing.crash import cli

from support import write_docs

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_the_files_tombstone_creates_are_private(tmp_path, open_umask):
    from tombstone import Tombstone, init_deployment
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    assert mode(config.path) == 0o600
    assert mode(config.lineage_db) == 0o600
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 2)
        for suffix in ("-wal", "-shm"):  # open now: SQLite made them with the database file's mode
            sidecar = Path(f"{config.lineage_db}{suffix}")
            assert sidecar.exists() and mode(sidecar) == 0o600, suffix
        receipt, path = tomb.erase("alice")
    assert mode(path) == 0o600
    locks = list((config.lineage_db.parent / "locks").glob("*.lock"))
    assert locks and all(mode(lock) == 0o600 for lock in locks)
    store_locks = list(Path(config.stores["docs"].options["path"]).parent.glob("*.tombstone.lock"))
    assert store_locks and all(mode(lock) == 0o600 for lock in store_locks)
    assert mode(config.keys_dir / "signing.key") == 0o600


def test_a_link_at_a_temporary_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "receipts" / "user-0001.json"
    target.parent.mkdir()
    # the name the previous implementation wrote to first, predictable from the pid
    (target.parent / f".{target.name}.{os.getpid()}.tmp").symlink_to(victim)
    write_atomic(target, b"{}")
    assert victim.read_text() == "precious"
    assert target.read_bytes() == b"{}" and not target.is_symlink() and mode(target) == 0o600


def test_write_atomic_replaces_a_link_at_the_target_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "out.json"
    target.symlink_to(victim)
    write_atomic(target, b"{}")
    assert victim.read_text() == "precious" and not target.is_symlink()


def test_a_recorded_receipt_file_outside_receipts_dir_is_refused(tmp_path):
    root = tmp_path / "d"
    assert cli("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none").returncode == 0
    config = str(root / "tombstone.toml")
    killed = cli("erase", "user-0001", "--config", config, env={"TOMBSTONE_KILL_AT": "saga:receipt:before-file"})
    assert killed.returncode != 0
    conn = sqlite3.connect(root / "lineage.db")
    with conn:
        conn.execute("UPDATE sagas SET out_path = '../../escaped.json' WHERE state = 'running'")
    conn.close()
    resumed = cli("resume", "--config", config)
    assert resumed.returncode != 0
    assert "not inside the receipts directory" in resumed.stderr, resumed.stderr
    assert not (tmp_path / "escaped.json").exists() and not (root / "escaped.json").exists()


def test_compose_publishes_ports_on_this_machine_only():
    text = (ROOT / "docker" / "compose.yaml").read_text()
    ports = [line.split("ports:", 1)[1].strip() for line in text.splitlines() if "ports:" in line]
    assert ports and all(p.startswith('["127.0.0.1:') for p in ports), ports


def test_overwrite_ranges_fills_only_the_places_and_keeps_the_bytes_between(tmp_path):
    """Adjacent places go in one write (the span read, filled, written back); the bytes between them, and
    a place alone, are as a write of each place would leave them."""
    import random

    from tombstone.fsutil import overwrite_ranges

    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(50_000))
    places = [(at, rng.randrange(0, 40)) for at in sorted(rng.sample(range(49_900), 600))]
    places += [(10, 5), (12, 6), (49_990, 10)]  # overlapping, and one at the very end
    expected = bytearray(data)
    for at, length in places:
        expected[at : at + length] = b"#" * length
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        writes = overwrite_ranges(fd, places, ord("#"), gap=64)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(expected)
    assert writes < len(places) / 2  # runs, not one write a place
