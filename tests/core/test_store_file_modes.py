"""Stores that hold document text are private when Tombstone creates them: the docstore's and the exact
cache's SQLite files 0600 (their -wal/-shm take that mode), Qdrant local mode's and Chroma's directories 0700,
every folder Tombstone makes on the way 0700. A store the user made keeps its mode. ``tombstone demo`` and
``tombstone init`` leave nothing under their directory that another user could read. Run with umask 022, so
the default umask of a test machine does not hide a world-readable file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tombstone.fsutil import make_private_dirs

OTHERS = 0o077


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def user_dir(tmp_path, open_umask) -> Path:
    """A folder the user made, readable by everyone (as umask 022 makes it)."""
    path = tmp_path / "user"
    path.mkdir()
    assert mode(path) == 0o755
    return path


def test_make_private_dirs_makes_each_new_folder_0700_and_leaves_the_others(user_dir):
    target = user_dir / "a" / "b" / "c"
    assert make_private_dirs(target) == target
    assert [mode(p) for p in (user_dir / "a", user_dir / "a" / "b", target)] == [0o700] * 3
    assert mode(user_dir) == 0o755
    make_private_dirs(target)  # already there: nothing changes
    (user_dir / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        make_private_dirs(user_dir / "file")


def test_a_new_docstore_is_private_with_its_wal_and_shm(user_dir):
    from tombstone_adapters.docstore import DocStore

    path = user_dir / "stores" / "docs" / "docstore.db"
    store = DocStore(path)
    try:
        store.add("doc-1", "Jane Doe's medical history", subject="jane")
        assert mode(path) == 0o600
        for side in ("-wal", "-shm"):
            assert Path(f"{path}{side}").exists() and mode(Path(f"{path}{side}")) == 0o600, side
    finally:
        store.close()
    assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
    assert mode(user_dir) == 0o755


def test_a_docstore_the_user_made_keeps_its_mode(user_dir):
    import sqlite3

    from tombstone_adapters.docstore import DocStore

    path = user_dir / "mine.db"
    sqlite3.connect(path).close()
    path.touch()
    os.chmod(path, 0o640)
    DocStore(path).close()
    assert mode(path) == 0o640 and mode(user_dir) == 0o755


def test_a_new_exact_cache_is_private(user_dir):
    pytest.importorskip("langchain_community")
    from langchain_core.outputs import Generation

    from tombstone_adapters.caches import TombstoneSQLiteCache

    path = user_dir / "stores" / "cache" / "llm_cache.db"
    cache = TombstoneSQLiteCache(path)
    try:
        cache.update("What is Jane's diagnosis?", "llm", [Generation(text="Jane has ...")])
        assert cache.lookup("What is Jane's diagnosis?", "llm")
    finally:
        cache.engine.dispose()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
    mine = user_dir / "mine-cache.db"
    mine.touch()
    os.chmod(mine, 0o644)
    TombstoneSQLiteCache(mine).engine.dispose()
    assert mode(mine) == 0o644


def test_a_new_qdrant_directory_is_private(user_dir):
    pytest.importorskip("qdrant_client")
    from qdrant_client import models

    from tombstone_adapters.qdrant.local import local_client

    path = user_dir / "stores" / "qdrant"
    client = local_client(path)
    try:
        client.create_collection("chunks", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
        client.upsert("chunks", points=[models.PointStruct(id=1, vector=[1, 0, 0, 0], payload={"document": "Jane"})])
    finally:
        client.close()
    assert mode(path) == 0o700 and mode(path.parent) == 0o700
    assert (path / "collection" / "chunks" / "storage.sqlite").is_file()  # the client's own files, inside
    # a directory the user made is theirs
    mine = user_dir / "mine-qdrant"
    mine.mkdir()
    client = local_client(mine)
    client.close()
    assert mode(mine) == 0o755


def test_a_new_chroma_persist_directory_is_private(user_dir):
    pytest.importorskip("chromadb")
    import chromadb

    from tombstone_adapters.chroma.wrapper import persistent_client

    path = user_dir / "stores" / "chroma"
    try:
        client = persistent_client(path)
        collection = client.get_or_create_collection("chunks", embedding_function=None)
        collection.add(ids=["c-1"], embeddings=[[1.0, 0.0, 0.0]], documents=["Jane Doe's medical history"])
        assert collection.get(ids=["c-1"])["documents"] == ["Jane Doe's medical history"]
        assert mode(path) == 0o700 and mode(path.parent) == 0o700
        assert mode(path / "chroma.sqlite3") == 0o600
        mine = user_dir / "mine-chroma"
        mine.mkdir()
        persistent_client(mine).heartbeat()
        assert mode(mine) == 0o755
    finally:
        chromadb.api.client.SharedSystemClient.clear_system_cache()


def _exposed(root: Path) -> list[str]:
    """Everything under ``root`` (``root`` included) with a group or other permission bit."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = Path(folder) / name if name != "." else Path(folder)
            if mode(path) & OTHERS:
                found.append(f"{oct(mode(path))} {path.relative_to(root.parent)}")
    return found


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "tombstone", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, preexec_fn=lambda: os.umask(0o022))


LIBRARY_STORES = ("stores/chroma", "stores/qdrant")
"""The folders whose contents Chroma and Qdrant create with their own modes (behind the 0700 folder)."""


@pytest.mark.slow
def test_the_demo_leaves_nothing_readable_by_others(tmp_path):
    workdir = tmp_path / "new" / "demo"
    result = _run(["demo", "--workdir", str(workdir), "--backends", "chroma,docstore,qdrant"], tmp_path)
    assert result.returncode == 0, result.stderr
    for folder in (workdir.parent, workdir, workdir / "stores", *(workdir / s for s in LIBRARY_STORES)):
        assert mode(folder) == 0o700, folder
    assert mode(workdir / "stores" / "chroma" / "chroma.sqlite3") == 0o600
    assert mode(workdir / "stores" / "docstore" / "docstore.db") == 0o600
    # what remains readable by others was written by the store's library, inside its 0700 folder
    inside = [f"demo/{s}/" for s in LIBRARY_STORES]
    tombstone_made = [line for line in _exposed(workdir.parent)
                      if not any(line.split(" ", 1)[1].startswith(f"new/{prefix}") for prefix in inside)]
    assert tombstone_made == [], "\n".join(tombstone_made)


@pytest.mark.slow
def test_init_leaves_nothing_readable_by_others(tmp_path):
    home = tmp_path / "new" / "home"
    result = _run(["init", "--home", str(home)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (home / "keys" / "signing.pub").is_file()
    assert _exposed(tmp_path / "new") == []
