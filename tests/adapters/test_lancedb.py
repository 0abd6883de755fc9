"""LanceDB (local) against real tables: conformance, the control (its own delete and default optimize leave
the rows), the reclaim, tags, bad input, the demo end to end."""

from __future__ import annotations

import contextlib
import errno
import struct
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

lancedb = pytest.importorskip("lancedb")
pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

from tombstone import Tombstone, init_deployment  # noqa: E402
from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.errors import StoreUnavailableError  # noqa: E402
from tombstone.testing import AdapterConformance, ConformanceEnv  # noqa: E402
from tombstone_adapters.lancedb import TombstoneLanceTable  # noqa: E402
from tombstone_adapters.lancedb.adapter import LanceDBAdapter  # noqa: E402
from tombstone_adapters.lancedb.forensics import scan_lancedb  # noqa: E402

from support import FrozenClock  # noqa: E402

DIM = 32


def independent_scan(directory: Path, needle: bytes) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.fixture
def ltomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "lancedb", "path": "stores/lance",
                                                           "table": "chunks"}})
    folder = Path(config.stores["vec"].options["path"])
    lancedb.connect(str(folder)).create_table("chunks", schema=pa.schema(
        [("id", pa.string()), ("text", pa.string()), ("vector", pa.list_(pa.float32(), DIM))]))
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb


def folder_of(tomb) -> Path:
    return Path(tomb.config.stores["vec"].options["path"])


def wrapper(tomb) -> TombstoneLanceTable:
    return TombstoneLanceTable(lancedb.connect(str(folder_of(tomb))), "chunks", lineage=tomb.lineage,
                               embedder=HashingEmbedder(DIM), store="vec")


def write(tomb, subject: str, n: int, start: int = 0) -> list[str]:
    ids = [f"{subject}-chunk-{start + i:04d}" for i in range(n)]
    wrapper(tomb).add(ids, [f"the {subject} note number {start + i} with private words" for i in range(n)],
                      subject=subject)
    return ids


def needle(tomb, aid: str) -> bytes:
    art = tomb.lineage.artifact("vec", aid)
    return struct.pack(f"<{len(art.fingerprint)}f", *art.fingerprint)


class TestLanceDBConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, ltomb):
        adapter = LanceDBAdapter("vec", ltomb.config.stores["vec"].options)
        counter = iter(range(10_000))

        def write_arts(subject: str, n: int):
            return [ltomb.lineage.artifact("vec", i) for i in write(ltomb, subject, n, start=100 * next(counter))]

        def survivors():
            rows = lancedb.connect(str(folder_of(ltomb))).open_table("chunks").to_arrow().to_pylist()
            return {r["id"]: (r["text"], tuple(r["vector"])) for r in rows}

        def visible(ids):
            table = wrapper(ltomb)
            return {r["id"] for r in table.get(ids)} | {r["id"] for r in table.search(np.ones(DIM), k=1000)
                                                        if r["id"] in ids}

        @contextlib.contextmanager
        def vendor_failure():
            boom = OSError(errno.EIO, "injected: LanceError(IO): Input/output error")
            db = mock.MagicMock()
            for name in ("open_table", "list_tables", "table_names", "create_table", "drop_table"):
                getattr(db, name).side_effect = boom
            with mock.patch("lance.dataset", side_effect=boom), mock.patch.object(adapter, "db", db), \
                    mock.patch.object(adapter, "physical_files", side_effect=boom):
                yield

        return ConformanceEnv(adapter=adapter, write=write_arts, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


def test_own_delete_and_optimize_leave_the_rows_and_the_erasure_removes_them(ltomb):
    """Control: LanceDB's own delete and its default ``optimize`` leave the subject's rows in the data files
    (the share deleted is under its threshold, older versions are kept for 7 days), where an independent byte
    scan, the probe and ``tombstone scan`` find them; the erasure leaves none, in any file, and the survivors
    as they were, each found by its own vector."""
    mine, theirs = write(ltomb, "alice", 3), write(ltomb, "bob", 40)
    folder = folder_of(ltomb)
    needles = {aid: needle(ltomb, aid) for aid in mine}
    assert all(independent_scan(folder, n) for n in needles.values())
    table = lancedb.connect(str(folder)).open_table("chunks")
    table.delete(f"id = '{mine[0]}'")
    table.optimize()
    assert independent_scan(folder, needles[mine[0]]) and independent_scan(folder, mine[0].encode())
    report = scan_lancedb("vec", ltomb.config.stores["vec"].options)
    assert report.recoverable and mine[0] in report.ids(), report.as_json(True)
    art = ltomb.lineage.artifact("vec", mine[0])
    assert not ltomb.adapter("vec").probe_physical([art])[mine[0]].passed
    before = {r["id"]: (r["text"], tuple(r["vector"])) for r in table.to_arrow().to_pylist() if r["id"] in theirs}
    receipt, _ = ltomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}, receipt["summary"]
    for aid, n in needles.items():
        assert not independent_scan(folder, n), aid
        assert not independent_scan(folder, aid.encode()), (aid, independent_scan(folder, aid.encode()))
    after = lancedb.connect(str(folder)).open_table("chunks")
    rows = {r["id"]: (r["text"], tuple(r["vector"])) for r in after.to_arrow().to_pylist()}
    assert rows == before
    hit = after.search(np.asarray(before[theirs[0]][1], dtype=np.float32)).limit(1).to_list()[0]
    assert hit["id"] == theirs[0]
    assert not scan_lancedb("vec", ltomb.config.stores["vec"].options).recoverable


def test_a_tag_that_keeps_the_subject_is_named_and_kept_unless_removing_tags_is_allowed(ltomb, tmp_path):
    mine, _theirs = write(ltomb, "alice", 2), write(ltomb, "bob", 5)
    import lance

    path = folder_of(ltomb) / "chunks.lance"
    ds = lance.dataset(str(path))
    ds.tags.create("release-1", ds.version)
    receipt, _ = ltomb.erase("alice")
    statuses = {(a["status"], a["level"]) for a in receipt["artifacts"]}
    assert statuses == {("RESIDUAL", "physical")}, [a["reason"] for a in receipt["artifacts"]]
    assert all("release-1" in (a["reason"] or "") + str(a["evidence"]) for a in receipt["artifacts"])
    assert "release-1" in lance.dataset(str(path)).tags.list()  # never deleted silently
    # allowed: the tag goes, and the erasure, run again, ends VERIFIED
    config = ltomb.config
    options = {**config.stores["vec"].options, "remove_tags": True}
    adapter = LanceDBAdapter("vec", options)
    arts = [ltomb.lineage.artifact("vec", i) for i in mine]
    evidence = adapter.reclaim(arts)
    assert evidence["tags_removed"] == ["release-1"]
    assert all(r.passed for r in adapter.probe_physical(arts).values())
    assert not any(independent_scan(folder_of(ltomb), aid.encode()) for aid in mine)


def test_bad_input_is_one_clear_error(ltomb, tmp_path):
    options = ltomb.config.stores["vec"].options
    with pytest.raises(StoreUnavailableError, match="no LanceDB table 'other'"):
        LanceDBAdapter("vec", {**options, "table": "other"})
    with pytest.raises(StoreUnavailableError, match="not a plain name"):
        LanceDBAdapter("vec", {**options, "table": "../chunks"})
    with pytest.raises(StoreUnavailableError, match="no LanceDB database folder"):
        LanceDBAdapter("vec", {**options, "path": str(tmp_path / "none")})
    assert not (tmp_path / "none").exists()


def test_a_release_outside_the_tested_range_is_refused_in_one_line(ltomb, monkeypatch):
    from tombstone_adapters.lancedb import store as store_module

    monkeypatch.setitem(store_module.TESTED, "pylance", ("99.",))
    with pytest.raises(StoreUnavailableError, match=r"pylance 14\.\S+ is outside the tested range \(99\.x\)"):
        LanceDBAdapter("vec", ltomb.config.stores["vec"].options)


def test_the_demo_erases_a_subject_verified_and_an_independent_scan_agrees(tmp_path):
    from tombstone.config import load_config
    from tombstone.demo import build_demo, demo_chunks

    refs = build_demo(tmp_path / "demo", ["docstore", "lancedb"], 4)
    with Tombstone(load_config(tmp_path / "demo" / "tombstone.toml")) as tomb:
        chunk_ids, _, _ = demo_chunks(refs[0])
        needles = [struct.pack(f"<{len(a.fingerprint)}f", *a.fingerprint)
                   for a in (tomb.lineage.artifact("lancedb", i) for i in chunk_ids)]
        folder = tmp_path / "demo" / "stores" / "lancedb"
        assert all(independent_scan(folder, n) for n in needles)
        receipt, _ = tomb.erase(refs[0])
    entries = [a for a in receipt["artifacts"] if a["store"] == "lancedb"]
    assert entries and {(a["status"], a["level"]) for a in entries} == {("VERIFIED", "physical")}
    for aid, n in zip(chunk_ids, needles):
        assert not independent_scan(folder, n) and not independent_scan(folder, aid.encode())
