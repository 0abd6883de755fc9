"""Only `tombstone init` creates a lineage db, and it never creates a lineage secret next to an existing one:
advice that cannot make things worse."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tombstone import init_deployment
from tombstone.config import write_config
from tombstone.errors import LineageError
from tombstone.keys import LineageSecret
from tombstone.lineage.db import LineageDB
from tombstone.testing.crash import cli


def one_line_error(result, code: int = 2) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def deployed(tmp_path):
    root = tmp_path / "d"
    built = cli("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none")
    assert built.returncode == 0, built.stderr
    return root


@pytest.mark.parametrize("lost", ["keys", "keys/lineage.secret"])
def test_init_refuses_a_new_secret_next_to_an_existing_lineage_db(deployed, lost):
    target = deployed / lost
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    before = snapshot(deployed)
    err = one_line_error(cli("init", "--home", str(deployed)))
    assert "orphan" in err and "restore" in err and "backup" in err
    assert snapshot(deployed) == before  # nothing written: no key, no secret, no config change
    # and the other commands say the same, instead of "run tombstone init"
    err = one_line_error(cli("erase", "user-0001", "--config", str(deployed / "tombstone.toml")))
    assert "orphan" in err and "backup" in err and "run 'tombstone init'" not in err
    assert snapshot(deployed) == before


def test_init_refuses_even_when_the_config_is_gone_too(deployed):
    shutil.rmtree(deployed / "keys")
    (deployed / "tombstone.toml").unlink()
    before = snapshot(deployed)
    assert "orphan" in one_line_error(cli("init", "--home", str(deployed)))
    assert snapshot(deployed) == before


def test_init_still_creates_what_is_missing(tmp_path):
    fresh = cli("init", "--home", str(tmp_path / "new"))
    assert fresh.returncode == 0, fresh.stderr
    assert (tmp_path / "new" / "lineage.db").is_file() and (tmp_path / "new" / "keys" / "lineage.secret").is_file()
    (tmp_path / "new" / "lineage.db").unlink()  # a lost lineage db with the secret kept: init makes a new one
    again = cli("init", "--home", str(tmp_path / "new"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "new" / "lineage.db").is_file()


def test_no_command_but_init_creates_a_lineage_db(tmp_path):
    root = tmp_path / "empty"
    write_config(root / "tombstone.toml", {"docs": {"backend": "docstore", "path": "stores/docs.db"}})
    before = snapshot(root)
    config = str(root / "tombstone.toml")
    for args in (["erase", "x"], ["status"], ["resume"], ["receipt", "list"], ["receipt", "head"], ["dlq", "list"],
                 ["where", "x"], ["erase", "--subjects-file", config]):
        err = one_line_error(cli(*args, "--config", config))
        assert "does not exist" in err and "tombstone init" in err, (args, err)
    assert snapshot(root) == before  # no lineage.db, no locks/, no keys/


def test_with_keys_but_no_lineage_db_nothing_is_created(deployed):
    (deployed / "lineage.db").unlink()
    for extra in deployed.glob("lineage.db-*"):
        extra.unlink()
    before = snapshot(deployed)
    err = one_line_error(cli("erase", "user-0001", "--config", str(deployed / "tombstone.toml")))
    assert f"lineage db {deployed / 'lineage.db'} does not exist" in err and "tombstone init" in err
    assert snapshot(deployed) == before


def test_lineage_db_opens_existing_files_only(tmp_path):
    secret = LineageSecret(b"k" * 32)
    with pytest.raises(LineageError, match="does not exist"):
        LineageDB(tmp_path / "sub" / "l.db", secret)
    assert not (tmp_path / "sub").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(LineageError, match="not a lineage db"):
        LineageDB(tmp_path / "empty.db", secret)
    assert (tmp_path / "empty.db").read_bytes() == b""
    assert not LineageDB.exists(tmp_path / "l.db")
    LineageDB(tmp_path / "l.db", secret, create=True).close()
    assert LineageDB.exists(tmp_path / "l.db")
    LineageDB(tmp_path / "l.db", secret).close()


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory):
    from tombstone_adapters.pgvector.server import embedded_dsn

    return os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path_factory.mktemp("pgl") / "data")


def test_postgres_lineage_db_exists_only_once_its_schema_does(pg_server, tmp_path):
    import psycopg

    name = f"lineage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    dsn = urlunsplit(urlsplit(pg_server)._replace(path=f"/{name}"))
    secret = LineageSecret(b"k" * 32)
    assert not LineageDB.exists(dsn)
    with pytest.raises(LineageError, match="no Tombstone schema"):
        LineageDB(dsn, secret)
    with psycopg.connect(dsn) as conn:  # the refused open created nothing
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
    root = tmp_path / "pgdeploy"
    write_config(root / "tombstone.toml", lineage_dsn=dsn)
    err = one_line_error(cli("status", "--config", str(root / "tombstone.toml")))
    assert "does not exist" in err and "tombstone init" in err
    init_deployment(root, lineage_dsn=dsn)
    assert LineageDB.exists(dsn)
    LineageDB(dsn, LineageSecret.load(root / "keys")).close()
    shutil.rmtree(root / "keys")
    assert "orphan" in one_line_error(cli("init", "--home", str(root)))
    assert not (root / "keys").exists()
