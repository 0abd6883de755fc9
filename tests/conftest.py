from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tombstone import Tombstone, init_deployment
from tombstone.config import Config

from support import FrozenClock, raising_stub, write_docs

os.environ.setdefault("MEM0_TELEMETRY", "false")  # Mem0 never reports usage from the tests


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def deployment(tmp_path: Path) -> Config:
    """A fresh deployment with one docstore store named 'docs'."""
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(
        tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}}
    )
    DocStore(config.stores["docs"].options["path"]).close()  # the app creates its store
    return config


@pytest.fixture
def tomb(deployment: Config, clock: FrozenClock):
    with Tombstone(deployment, clock=clock) as t:
        yield t


# -- temporary folders, and no PostgreSQL left behind ---------------------------------------------------

_OWN_BASETEMP: list[Path] = []


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A base temporary folder of this session's own, unless --basetemp names one. Under pytest's shared
    ``/tmp/pytest-of-<user>`` every pytest session that starts on the machine (another suite run meanwhile)
    takes group and other permissions off that folder again; as root the embedded PostgreSQL runs as the
    ``pgserver`` user, which then could no longer reach a data directory below it, and initdb or the server
    failed with "Permission denied" in whichever test started one."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        base = Path(tempfile.mkdtemp(prefix="tombstone-pytest-"))
        _OWN_BASETEMP.append(base)
        config.option.basetemp = str(base / "t")


def pytest_unconfigure(config):
    for base in _OWN_BASETEMP:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_postgres_left(tmp_path_factory):
    """After the suite: every embedded PostgreSQL the tests started (in this process or in the CLI
    subprocesses they ran) is stopped. Servers still held by this process are stopped here as its exit
    would; any postgres left on a data directory below the session's temporary folder is then a leak: it is
    stopped, and the session fails naming it."""
    yield
    import os

    import psutil

    try:
        from tombstone_adapters.pgvector import server
    except ImportError:
        return
    for key in list(server._servers):
        server._servers.pop(key).leave()
    base = os.path.realpath(tmp_path_factory.getbasetemp())
    left = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "postgres" and os.path.realpath(proc.cwd()).startswith(base + os.sep):
                left.append((proc, proc.cwd()))
        except psutil.Error:
            continue
    for proc, _ in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs([p for p, _ in left], timeout=30)
    assert not left, "postgres left running after the suite: " + "; ".join(f"pid {p.pid} in {d}" for p, d in left)
