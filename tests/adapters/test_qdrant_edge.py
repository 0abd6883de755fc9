"""Qdrant Edge (experimental) against a real in-process shard: conformance, the control (its own delete and
optimize leave the point), the reclaim, bad input, the demo end to end."""

from __future__ import annotations

import contextlib
import errno
import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

qe = pytest.importorskip("qdrant_edge")

from tombstone import Tombstone, init_deployment  # noqa: E402
from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.errors import StoreUnavailableError  # noqa: E402
from tombstone.testing import AdapterConformance, ConformanceEnv  # noqa: E402
from tombstone_adapters.qdrant_edge import TombstoneEdgeShard, close_all  # noqa: E402
from tombstone_adapters.qdrant_edge.adapter import QdrantEdgeAdapter  # noqa: E402
from tombstone_adapters.qdrant_edge.store import point_id, shard_at  # noqa: E402

from support import FrozenClock  # noqa: E402

DIM = 32


def independent_scan(directory: Path, needle: bytes) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.fixture
def etomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"vec": {"backend": "qdrant_edge", "path": "stores/edge"}})
    TombstoneEdgeShard(config.stores["vec"].options["path"], dim=DIM, store="vec")  # the app created the shard
    try:
        with Tombstone(config, clock=FrozenClock()) as tomb:
            yield tomb
    finally:
        close_all()


def folder_of(tomb) -> Path:
    return Path(tomb.config.stores["vec"].options["path"])


def wrapper(tomb) -> TombstoneEdgeShard:
    return TombstoneEdgeShard(folder_of(tomb), lineage=tomb.lineage, embedder=HashingEmbedder(DIM), store="vec")


def write(tomb, subject: str, n: int, start: int = 0) -> list[str]:
    ids = [f"{subject}-chunk-{start + i:04d}" for i in range(n)]
    wrapper(tomb).upsert(ids, [f"the {subject} note number {start + i} with private words" for i in range(n)],
                         subject=subject, payloads=[{"n": start + i} for i in range(n)])
    return ids


def stored_vector(tomb, aid: str) -> bytes:
    """The artifact's vector as the shard stores it (cosine: normalised), read back whole, float32."""
    record = shard_at(folder_of(tomb), "vec").retrieve([point_id(aid)], False, True)[0]
    return np.asarray(record.vector, dtype="<f4").tobytes()


def survivors_of(tomb) -> dict:
    records, _ = shard_at(folder_of(tomb), "vec").scroll(qe.ScrollRequest(limit=100_000, with_payload=True,
                                                                          with_vector=True))
    return {r.payload["tombstone_id"]: (sorted(r.payload.items()), tuple(r.vector)) for r in records
            if not r.payload.get("tombstone_suppressed")}


class TestQdrantEdgeConformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, etomb):
        adapter = QdrantEdgeAdapter("vec", etomb.config.stores["vec"].options)
        counter = iter(range(10_000))

        def write_arts(subject: str, n: int):
            return [etomb.lineage.artifact("vec", i) for i in write(etomb, subject, n, start=100 * next(counter))]

        def visible(ids):
            shard = wrapper(etomb)
            return {r.payload["tombstone_id"] for r in shard.retrieve(ids)} | {
                p.payload["tombstone_id"] for p in shard.search(np.ones(DIM), k=1000) if p.payload["tombstone_id"] in ids}

        @contextlib.contextmanager
        def vendor_failure():
            boom = OSError(errno.EIO, "injected: Service internal error: Input/output error")
            shard = mock.MagicMock()
            for name in ("update", "retrieve", "search", "flush", "scroll", "optimize"):
                getattr(shard, name).side_effect = boom
            with mock.patch("tombstone_adapters.qdrant_edge.adapter.shard_at", return_value=shard), \
                    mock.patch("tombstone_adapters.qdrant_edge.store.shard_at", return_value=shard), \
                    mock.patch.object(adapter, "physical_files", side_effect=boom):
                yield

        return ConformanceEnv(adapter=adapter, write=write_arts, survivors=lambda: survivors_of(etomb), visible=visible,
                              vendor_failure=vendor_failure)


def test_own_delete_and_optimize_leave_the_point_and_the_erasure_removes_it(etomb):
    """Control: the shard's own delete, even with its ``optimize`` (a segment under the 20% deleted threshold is
    not vacuumed), leaves the point's vector, its payload and the write-ahead log's copy, where an independent
    byte scan and the probe find them; the erasure leaves none, the survivors as they were, the shard's own
    optimiser settings as they were."""
    mine, theirs = write(etomb, "alice", 3), write(etomb, "bob", 30)
    folder = folder_of(etomb)
    config_before = (folder / "edge_config.json").read_text()
    vectors = {aid: stored_vector(etomb, aid) for aid in mine}
    assert all(independent_scan(folder, v) for v in vectors.values())
    wrapper(etomb).delete(mine[:1])
    shard_at(folder, "vec").optimize()
    assert independent_scan(folder, vectors[mine[0]]) and independent_scan(folder, mine[0].encode())
    art = etomb.lineage.artifact("vec", mine[0])
    assert not etomb.adapter("vec").probe_physical([art])[mine[0]].passed
    before = {k: v for k, v in survivors_of(etomb).items() if k in theirs}
    receipt, _ = etomb.erase("alice")
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}, receipt["summary"]
    for aid, vec in vectors.items():
        assert not independent_scan(folder, vec), aid
        assert not independent_scan(folder, aid.encode()), aid
    assert {k: v for k, v in survivors_of(etomb).items() if k in theirs} == before
    # the shard's own optimiser settings as they were (a plain load of the shard writes its resolved defaults)
    assert json.loads((folder / "edge_config.json").read_text()).get("optimizers") == json.loads(config_before).get(
        "optimizers")
    query = np.asarray(before[theirs[0]][1], dtype=np.float32)
    assert wrapper(etomb).search(query, k=1)[0].payload["tombstone_id"] == theirs[0]


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(StoreUnavailableError, match="no Qdrant Edge shard at"):
        QdrantEdgeAdapter("vec", {"path": str(tmp_path / "none")})
    assert not (tmp_path / "none").exists()


def test_the_demo_erases_a_subject_verified_and_an_independent_scan_agrees(tmp_path):
    from tombstone.config import load_config
    from tombstone.demo import build_demo, demo_chunks

    try:
        refs = build_demo(tmp_path / "demo", ["docstore", "qdrant_edge"], 4)
        with Tombstone(load_config(tmp_path / "demo" / "tombstone.toml")) as tomb:
            chunk_ids, _, _ = demo_chunks(refs[0])
            folder = tmp_path / "demo" / "stores" / "qdrant_edge"
            records = shard_at(folder, "qdrant_edge").retrieve([point_id(i) for i in chunk_ids], False, True)
            needles = [np.asarray(r.vector, dtype="<f4").tobytes() for r in records]
            assert len(needles) == len(chunk_ids)
            assert all(independent_scan(folder, n) for n in needles)
            receipt, _ = tomb.erase(refs[0])
    finally:
        close_all()
    entries = [a for a in receipt["artifacts"] if a["store"] == "qdrant_edge"]
    assert entries and {(a["status"], a["level"]) for a in entries} == {("VERIFIED", "physical")}
    for aid, n in zip(chunk_ids, needles):
        assert not independent_scan(folder, n) and not independent_scan(folder, aid.encode())


def test_tombstone_backends_marks_it_experimental_and_scan_says_it_cannot_yet(tmp_path):
    from click.testing import CliRunner

    from tombstone.cli import main

    listed = CliRunner().invoke(main, ["backends"])
    assert listed.exit_code == 0 and "qdrant_edge (experimental)" in listed.output
    assert "docstore (experimental)" not in listed.output  # the control: only the new engines carry the mark
    scanned = CliRunner().invoke(main, ["scan", "--backend", "qdrant_edge", "--option", f"path={tmp_path}"])
    assert scanned.exit_code == 2 and "cannot scan for deleted data yet" in scanned.output
    assert "Traceback" not in scanned.output
