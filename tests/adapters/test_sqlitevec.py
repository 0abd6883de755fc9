"""sqlite-vec against real SQLite files (apsw with the sqlite_vec extension): conformance, controls, the
reclaim, bad input, the demo end to end."""

from __future__ import annotations

import contextlib
import errno
import struct
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

apsw = pytest.importorskip("apsw")
pytest.importorskip("sqlite_vec")

from tombstone import Tombstone, init_deployment  # noqa: E402
from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.errors import StoreUnavailableError  # noqa: E402
from tombstone.testing import AdapterConformance, ConformanceEnv  # noqa: E402
from tombstone_adapters.sqlitevec import VecStore  # noqa: E402
from tombstone_adapters.sqlitevec import store as store_module  # noqa: E402
from tombstone_adapters.sqlitevec.adapter import SqliteVecAdapter  # noqa: E402
from tombstone_adapters.sqlitevec.forensics import scan_sqlitevec  # noqa: E402

from support import FrozenClock  # noqa: E402

DIM = 32


def independent_scan(directory: Path, needle: bytes) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(p.name for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.fixture
def vtomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "sqlitevec", "path": "stores/vec/vectors.db",
                                                           "table": "chunks"}})
    path = Path(config.stores["vec"].options["path"])
    with Tombstone(config, clock=FrozenClock()) as tomb:
        VecStore(path, dim=DIM, store="vec").close()  # the app created the table
        yield tomb


def wrapper(tomb) -> VecStore:
    return VecStore(tomb.config.stores["vec"].options["path"], lineage=tomb.lineage, embedder=HashingEmbedder(DIM),
                    store="vec")


def write(tomb, subject: str, n: int, start: int = 0) -> list[str]:
    ids = [f"{subject}-chunk-{start + i:04d}" for i in range(n)]
    vec = wrapper(tomb)
    try:
        vec.add(ids, [f"the {subject} note number {start + i} with private words" for i in range(n)], subject=subject,
                metadatas=[{"n": start + i} for i in range(n)])
    finally:
        vec.close()
    return ids


def vector_bytes(tomb, aid: str) -> bytes:
    """The artifact's stored vector as vec0 writes it (float32, little-endian), from its lineage fingerprint's
    first floats: what an independent scan looks for."""
    art = tomb.lineage.artifact("vec", aid)
    return struct.pack(f"<{len(art.fingerprint)}f", *art.fingerprint)


class TestSqliteVecConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, vtomb):
        adapter = SqliteVecAdapter("vec", vtomb.config.stores["vec"].options)
        counter = iter(range(10_000))

        def write_arts(subject: str, n: int):
            ids = write(vtomb, subject, n, start=100 * next(counter))
            return [vtomb.lineage.artifact("vec", i) for i in ids]

        def survivors():
            vec = VecStore(vtomb.config.stores["vec"].options["path"], store="vec", create=False)
            try:
                return {h.id: (h.text, h.metadata) for h in vec.get(vec.all_ids())}
            finally:
                vec.close()

        def visible(ids):
            vec = wrapper(vtomb)
            try:
                return {h.id for h in vec.get(ids)} | {i for i in vec.all_ids() if i in ids}
            finally:
                vec.close()

        @contextlib.contextmanager
        def vendor_failure():
            conn = mock.MagicMock()
            conn.execute.side_effect = conn.executemany.side_effect = apsw.IOError("injected: disk I/O error")
            unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.vec.path))
            with mock.patch.object(adapter.vec, "connection", conn), \
                    mock.patch.object(adapter.vec, "files", side_effect=unreadable):
                yield

        return ConformanceEnv(adapter=adapter, write=write_arts, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


def test_own_delete_leaves_the_vector_and_reclaim_removes_it(vtomb):
    """Control: vec0's own DELETE (the app's, secure_delete off as upstream SQLite ships) leaves the id and text
    in free space and the vector in its chunk, where an independent byte scan, the probe and ``tombstone scan``
    all find them; the erasure's reclaim leaves none of it and every survivor as it was."""
    mine, theirs = write(vtomb, "alice", 3), write(vtomb, "bob", 4)
    folder = Path(vtomb.config.stores["vec"].options["path"]).parent
    needles = {aid: vector_bytes(vtomb, aid) for aid in mine}
    assert all(independent_scan(folder, v) for v in needles.values())  # the scan can fail: the bytes are there
    vec = wrapper(vtomb)
    vec.delete(mine[:1])  # the app's own delete
    vec.close()
    assert independent_scan(folder, needles[mine[0]]), "vec0's delete left the vector in its chunk"
    report = scan_sqlitevec("vec", vtomb.config.stores["vec"].options)
    slots = next(p for p in report.places if p.kind == "vec0 slots marked deleted")
    assert slots.count == 1 and report.recoverable
    art = vtomb.lineage.artifact("vec", mine[0])
    assert not vtomb.adapter("vec").probe_physical([art])[mine[0]].passed  # the probe finds it too
    before = {h.id: (h.text, h.metadata) for h in VecStore(folder / "vectors.db", store="vec").get(theirs)}
    receipt, _ = vtomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}, receipt["summary"]
    assert {a["level"] for a in receipt["artifacts"]} == {"physical"}
    for aid, needle in needles.items():
        assert not independent_scan(folder, needle), aid
        assert not independent_scan(folder, aid.encode()), aid
    assert not independent_scan(folder, b"the alice note")
    after = VecStore(folder / "vectors.db", store="vec")
    assert {h.id: (h.text, h.metadata) for h in after.get(theirs)} == before
    assert after.search(vector_bytes_vector(vtomb, theirs[0]), k=1)[0].id == theirs[0]  # found by its own vector
    after.close()
    clean = scan_sqlitevec("vec", vtomb.config.stores["vec"].options)
    assert not clean.recoverable, clean.as_json()


def vector_bytes_vector(tomb, aid: str) -> np.ndarray:
    vec = VecStore(tomb.config.stores["vec"].options["path"], store="vec")
    try:
        blob = vec.connection.execute(f"SELECT embedding FROM {vec.table} WHERE id = ?", (aid,)).fetchone()[0]
    finally:
        vec.close()
    return np.frombuffer(blob, dtype="<f4")


def test_suppressed_ids_are_hidden_from_every_read_and_stay_hidden_when_written_again(vtomb):
    mine, theirs = write(vtomb, "alice", 2), write(vtomb, "bob", 2)
    vtomb.adapter("vec").suppress([vtomb.lineage.artifact("vec", i) for i in mine])
    vec = wrapper(vtomb)
    try:
        query = vector_bytes_vector(vtomb, mine[0])
        assert not {h.id for h in vec.search(query, k=4)} & set(mine)
        assert {h.id for h in vec.search(query, k=4)} == set(theirs)  # the path is exercised: the survivors
        assert not {h.id for h in vec.get(mine + theirs)} & set(mine)
        assert set(vec.all_ids()) == set(theirs)
    finally:
        vec.close()


def test_bad_input_is_one_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "v.db"
    VecStore(path, dim=4).close()
    data = path.read_bytes()
    with pytest.raises(StoreUnavailableError, match="not a plain SQL name"):
        VecStore(path, table="chunks; DROP TABLE x")
    with pytest.raises(StoreUnavailableError, match="has no vec0 table 'other'"):
        VecStore(path, table="other", create=False)
    with pytest.raises(StoreUnavailableError, match="no sqlite-vec database"):
        VecStore(tmp_path / "missing.db", create=False)
    monkeypatch.setattr(store_module, "TESTED_VERSIONS", ("v9.9.9",))
    with pytest.raises(StoreUnavailableError, match=r"outside the tested range .*sqlite-vec==9\.9\.9"):
        VecStore(path, create=False)
    assert path.read_bytes() == data
    assert not (tmp_path / "missing.db").exists()


def test_a_file_in_wal_mode_is_written_anew_and_ends_verified(vtomb):
    """An app that runs the file in WAL mode: the free-space pass does not edit such a file in place, so the
    reclaim VACUUMs it. Control: the app's own delete, with the WAL, leaves the text and the vector; after the
    erasure neither the file nor its WAL holds them, and the survivors are as they were."""
    path = Path(vtomb.config.stores["vec"].options["path"])
    conn = store_module.connect(path, "vec")
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.close()
    mine, theirs = write(vtomb, "alice", 3), write(vtomb, "bob", 2)
    vec = wrapper(vtomb)
    vec.delete(mine[:1])
    vec.close()
    assert independent_scan(path.parent, b"the alice note number 0")  # the control: the app's delete left it
    before = {h.id: (h.text, h.metadata) for h in VecStore(path, store="vec").get(theirs)}
    needles = [vector_bytes(vtomb, aid) for aid in mine]
    assert independent_scan(path.parent, needles[0])
    receipt, _ = vtomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    steps = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]["steps"]
    assert any(step.startswith("VACUUM (wal journal") for step in steps), steps
    assert not independent_scan(path.parent, b"the alice note")
    assert not any(independent_scan(path.parent, needle) for needle in needles)
    assert {h.id: (h.text, h.metadata) for h in VecStore(path, store="vec").get(theirs)} == before


def test_the_demo_erases_a_subject_verified_and_an_independent_scan_agrees(tmp_path):
    from tombstone.demo import build_demo, demo_chunks

    from tombstone.config import load_config

    refs = build_demo(tmp_path / "demo", ["docstore", "sqlitevec"], 4)
    with Tombstone(load_config(tmp_path / "demo" / "tombstone.toml")) as tomb:
        chunk_ids, _, _ = demo_chunks(refs[0])
        arts = [tomb.lineage.artifact("sqlitevec", i) for i in chunk_ids]
        needles = [struct.pack(f"<{len(a.fingerprint)}f", *a.fingerprint) for a in arts]
        folder = tmp_path / "demo" / "stores" / "sqlitevec"
        assert all(independent_scan(folder, n) for n in needles)
        receipt, _ = tomb.erase(refs[0])
    vec_entries = [a for a in receipt["artifacts"] if a["store"] == "sqlitevec"]
    assert vec_entries and {(a["status"], a["level"]) for a in vec_entries} == {("VERIFIED", "physical")}
    for aid, needle in zip(chunk_ids, needles):
        assert not independent_scan(folder, needle) and not independent_scan(folder, aid.encode())


def test_a_missing_extension_and_a_missing_file_are_one_line_at_the_command_line(tmp_path, monkeypatch):
    """Without sqlite-vec installed the store says which extra to install; ``tombstone scan`` of a file that
    is not there is one line and exit 2, with no traceback and no file created."""
    import builtins

    from click.testing import CliRunner

    from tombstone.cli import main

    result = CliRunner().invoke(main, ["scan", "--backend", "sqlitevec", "--option", f"path={tmp_path / 'none.db'}"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "none.db").exists()
    real_import = builtins.__import__

    def no_sqlite_vec(name, *args, **kwargs):
        if name == "sqlite_vec":
            raise ImportError("No module named 'sqlite_vec'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sqlite_vec)
    with pytest.raises(StoreUnavailableError, match=r"pip install 'tombstone-rag\[sqlitevec\]'"):
        VecStore(tmp_path / "v.db", dim=4)
    assert not (tmp_path / "v.db").exists()
