"""The dataset backend against shard files an attacker wrote: gzip and Parquet bombs (bounded decoders, the
artifacts UNVERIFIED naming the file), shards no manifest lists (byte-scanned, never decoded), links and
manifest paths that leave the store (refused, nothing outside touched), and the modes of what the store
creates."""

from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tombstone_adapters.dataset import DatasetLoader, DatasetStore
from tombstone_adapters.dataset.files import (
    MAX_DECODED_BYTES,
    MAX_ROWS,
    DatasetBoundError,
    DatasetFileError,
    DecodeLimits,
    ShardEntry,
    sha256,
)
from tombstone_adapters.dataset.shards import decode_columns
from tombstone_adapters.docstore import DocStore

from tombstone import Tombstone, init_deployment
from tombstone.cli import main
from tombstone.contract import open_adapter
from tombstone.errors import ConfigError, PhysicalUnsupportedError

SMALL = 1 << 20
"""The decode bound these tests configure (1 MiB), so a bomb a little past it is cheap to make."""


def gzip_zeros(size: int) -> bytes:
    """A real gzip file of ``size`` zero bytes, compressed as it streams (1 GiB gives about 1 MiB)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 24)
    out = []
    left = size
    while left:
        n = min(left, len(chunk))
        out.append(comp.compress(chunk[:n]))
        left -= n
    out.append(comp.flush())
    return b"".join(out)


def parquet_bomb(rows: int = 4096, value: int = 1 << 20) -> bytes:
    """A real Parquet file of a few KiB whose text column is one ``value``-byte string repeated ``rows``
    times (dictionary-encoded and compressed): it decodes to rows * value bytes."""
    indices = pa.array([0] * rows, pa.int32())
    table = pa.table({"id": pa.DictionaryArray.from_arrays(indices, pa.array(["bomb-row"])),
                      "text": pa.DictionaryArray.from_arrays(indices, pa.array(["a" * value])),
                      "metadata": pa.DictionaryArray.from_arrays(indices, pa.array(["{}"]))})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", dictionary_pagesize_limit=2 * value + (1 << 16))
    return sink.getvalue().to_pybytes()


@pytest.fixture
def htomb(tmp_path, clock):
    config = init_deployment(tmp_path / "deploy", {
        "docs": {"backend": "docstore", "path": "stores/docs/docstore.db"},
        "train": {"backend": "dataset", "path": "stores/train", "max_decoded_bytes": SMALL, "max_rows": 10_000}})
    DocStore(config.stores["docs"].options["path"]).close()
    DatasetStore(config.stores["train"].options["path"])
    with Tombstone(config, clock=clock) as tomb:
        yield tomb


def root_of(tomb) -> Path:
    return Path(tomb.config.stores["train"].options["path"])


def export(tomb, subject: str, n: int, fmt: str = "jsonl") -> list[str]:
    docs = DocStore(tomb.config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
    doc_ids = [f"{subject}-doc-{i:03d}" for i in range(n)]
    try:
        docs.add_many([(d, f"note {i} of {subject}", {}) for i, d in enumerate(doc_ids)], subject=subject)
    finally:
        docs.close()
    ids = [f"ex-{subject}-{i:03d}-h5" for i in range(n)]
    DatasetStore(root_of(tomb), lineage=tomb.lineage, store="train", format=fmt).add(
        ids, [f"note {i} of {subject}" for i in range(n)], subject=subject, sources=[("docs", d) for d in doc_ids])
    return ids


def arts(tomb, ids):
    return [tomb.lineage.artifact("train", i) for i in ids]


def list_in_manifest(root: Path, name: str, data: bytes, fmt: str, rows: int = 1) -> str:
    """Put ``data`` in the shards folder and list it in a new manifest version (as another tool would)."""
    rel = f"shards/{name}"
    (root / rel).write_bytes(data)
    store = DatasetStore(root)
    with store.lock:
        _, manifest = store._next_from_current()
        manifest.shards.append(ShardEntry(rel, fmt, rows, sha256(data)))
        store._commit(manifest)
    return rel


def statuses(receipt, store: str = "train") -> dict[str, tuple[str, str | None]]:
    return {a["artifact_id"]: (a["status"], a.get("level")) for a in receipt["artifacts"] if a["store"] == store}


def probe_reasons(receipt, artifact_id: str) -> str:
    entry = next(a for a in receipt["artifacts"] if a["artifact_id"] == artifact_id)
    return json.dumps(entry)


# -- bombs --------------------------------------------------------------------------------------------


def test_a_listed_gzip_bomb_is_unverified_naming_the_file(htomb):
    mine = export(htomb, "alice", 2)
    root = root_of(htomb)
    bomb = gzip_zeros(64 * SMALL)
    assert len(bomb) < SMALL // 4, "the bomb is small on disk"
    rel = list_in_manifest(root, "part-bomb.jsonl.gz", bomb, "jsonl.gz")
    with pytest.raises(PhysicalUnsupportedError, match=r"part-bomb\.jsonl\.gz.*max_decoded_bytes"):
        htomb.adapter("train").probe_physical(arts(htomb, mine))
    receipt, _ = htomb.erase("alice")
    found = statuses(receipt)
    assert found and all(status != "VERIFIED" for status, _ in found.values()), found
    assert any(status == "UNVERIFIED" for status, _ in found.values())
    assert "part-bomb.jsonl.gz" in probe_reasons(receipt, mine[0])
    assert (root / rel).read_bytes() == bomb, "a shard past the bounds is left as it is"


@pytest.mark.slow
def test_the_default_bound_refuses_a_gzip_bomb_past_it():
    bomb = gzip_zeros(MAX_DECODED_BYTES + (1 << 20))
    assert len(bomb) < 4 << 20
    with pytest.raises(DatasetBoundError, match="max_decoded_bytes"):
        decode_columns(bomb, "jsonl.gz", "shards/part-bomb.jsonl.gz")


def test_a_listed_parquet_bomb_is_unverified_and_the_default_bound_refuses_it(htomb):
    mine = export(htomb, "alice", 1, "parquet")
    bomb = parquet_bomb()
    assert len(bomb) < 64 * 1024 and pq.read_metadata(pa.BufferReader(bomb)).num_rows == 4096
    with pytest.raises(DatasetBoundError, match="max_decoded_bytes 1073741824"):
        decode_columns(bomb, "parquet", "shards/part-bomb.parquet")  # 4 GiB decoded, past the default
    list_in_manifest(root_of(htomb), "part-bomb.parquet", bomb, "parquet", rows=4096)
    with pytest.raises(PhysicalUnsupportedError, match=r"part-bomb\.parquet.*max_decoded_bytes"):
        htomb.adapter("train").probe_physical(arts(htomb, mine))
    receipt, _ = htomb.erase("alice")
    assert all(status != "VERIFIED" for status, _ in statuses(receipt).values())
    assert "part-bomb.parquet" in probe_reasons(receipt, mine[0])


def test_too_many_rows_is_refused():
    rows = MAX_ROWS + 1
    table = pa.table({"id": pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["r"])),
                      "text": pa.nulls(rows, pa.string()), "metadata": pa.nulls(rows, pa.string())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    with pytest.raises(DatasetBoundError, match="max_rows"):
        decode_columns(sink.getvalue().to_pybytes(), "parquet", "shards/part-rows.parquet")
    lines = b'{"id":"r","text":"","metadata":{}}\n' * 50
    with pytest.raises(DatasetBoundError, match="max_rows 10"):
        decode_columns(gzip.compress(lines), "jsonl.gz", "shards/x.jsonl.gz", limits=DecodeLimits(max_rows=10))


def test_the_loader_refuses_a_bomb_with_one_line(htomb):
    export(htomb, "alice", 1)
    root = root_of(htomb)
    list_in_manifest(root, "part-bomb.jsonl.gz", gzip_zeros(64 * SMALL), "jsonl.gz")
    with pytest.raises(DatasetBoundError, match="part-bomb"):
        list(DatasetLoader(root, limits=DecodeLimits(max_decoded_bytes=SMALL)))


@pytest.mark.parametrize("bad", ["0", "-1", "lots"])
def test_a_bad_bound_option_is_a_config_error(htomb, bad):
    options = {**htomb.config.stores["train"].options, "max_rows": bad}
    with pytest.raises(ConfigError, match="max_rows"):
        open_adapter("train", "dataset", options)


# -- shards no manifest lists ---------------------------------------------------------------------------


def test_an_unlisted_gzip_bomb_stops_at_the_bound_and_is_named(htomb):
    """A compressed shard no manifest lists is decoded by its content, within the bound: a bomb past it
    leaves the artifacts found nowhere unprobed (UNVERIFIED), naming the file and the bound."""
    mine = export(htomb, "alice", 1)
    root = root_of(htomb)
    (root / "shards" / "part-planted.jsonl.gz").write_bytes(gzip_zeros(64 * SMALL))
    before = htomb.adapter("train").probe_physical(arts(htomb, mine))[mine[0]]
    assert not before.passed, "a row found elsewhere stays RESIDUAL, whatever else cannot be read"
    receipt, _ = htomb.erase("alice")
    assert statuses(receipt)[mine[0]][0] == "UNVERIFIED", statuses(receipt)
    assert "part-planted.jsonl.gz" in probe_reasons(receipt, mine[0])
    after = htomb.adapter("train").probe_physical(arts(htomb, mine))[mine[0]]
    assert not after.ran, after
    assert "part-planted.jsonl.gz" in after.why and "max_decoded_bytes 1048576" in after.why


def test_an_unlisted_shard_is_decoded_named_and_a_hit_is_never_verified(htomb):
    mine = export(htomb, "alice", 2)
    root = root_of(htomb)
    planted = root / "shards" / "part-unlisted.jsonl"
    planted.write_bytes(b'{"id": "other-1", "text": "mentions ' + mine[0].encode() + b'", "metadata": {}}\n')
    clean = root / "shards" / "part-unlisted-clean.jsonl"
    clean.write_bytes(b'{"id": "other-2", "text": "nothing of hers", "metadata": {}}\n')
    result = htomb.adapter("train").probe_physical(arts(htomb, mine))
    assert not result[mine[0]].passed
    assert "row decoded 1x in shards/part-unlisted.jsonl (listed by no manifest; json)" in result[mine[0]].measurement
    listed = result[mine[1]].evidence["copies_decoded"]
    assert any("part-unlisted.jsonl" in line for line in listed) and any("part-unlisted-clean" in line for line in listed)
    receipt, _ = htomb.erase("alice")
    found = statuses(receipt)
    assert found[mine[0]][0] != "VERIFIED", found
    assert "part-unlisted.jsonl" in probe_reasons(receipt, mine[0])


# -- nothing outside the store ----------------------------------------------------------------------------


def test_a_manifest_path_out_of_the_store_is_one_line_and_touches_nothing(htomb, tmp_path):
    mine = export(htomb, "alice", 1)
    root = root_of(htomb)
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"id": "' + mine[0].encode() + b'", "text": "t", "metadata": {}}\n')
    before = outside.read_bytes()
    current = DatasetStore(root).current_version()
    path = root / "manifests" / f"v{current:06d}.json"
    body = json.loads(path.read_text())
    for bad in ("../../outside.jsonl", str(outside)):
        body["shards"].append({"path": bad, "format": "jsonl", "rows": 1, "sha256": sha256(before)})
    path.write_text(json.dumps(body))
    result = CliRunner().invoke(main, ["erase", "alice", "--config", str(htomb.config.path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "is not a file under shards/" in lines[0], result.output
    assert outside.read_bytes() == before


def test_an_old_manifest_path_out_of_the_store_is_never_verified(htomb, tmp_path):
    mine = export(htomb, "alice", 1, "parquet")
    root = root_of(htomb)
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"id": "' + mine[0].encode() + b'", "text": "t", "metadata": {}}\n')
    before = outside.read_bytes()
    old = root / "manifests" / "v000001.json"
    body = json.loads(old.read_text())
    body["shards"].append({"path": "shards/../../../outside.jsonl", "format": "jsonl", "rows": 1, "sha256": "0" * 64})
    old.write_text(json.dumps(body))
    try:
        receipt, _ = htomb.erase("alice")
    except DatasetFileError as exc:
        assert "is not a file under shards/" in str(exc)
    else:
        assert all(status != "VERIFIED" for status, _ in statuses(receipt).values())
        assert "is not a file under shards/" in probe_reasons(receipt, mine[0])
    assert outside.read_bytes() == before


def test_a_shards_folder_that_is_a_link_out_of_the_store_is_refused(htomb, tmp_path):
    mine = export(htomb, "alice", 1)
    root = root_of(htomb)
    elsewhere = tmp_path / "elsewhere"
    (root / "shards").rename(elsewhere)
    (root / "shards").symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    adapter = htomb.adapter("train")
    with pytest.raises(PhysicalUnsupportedError, match="shards"):
        adapter.probe_physical(arts(htomb, mine))
    with pytest.raises(DatasetFileError, match="is a link or not a folder"):
        adapter.reclaim(arts(htomb, mine))
    with pytest.raises(DatasetFileError, match="is a link or not a folder"):
        list(DatasetLoader(root))
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def test_a_shard_that_is_a_link_is_not_followed(htomb, tmp_path):
    mine = export(htomb, "alice", 1)
    root = root_of(htomb)
    secret = tmp_path / "secret.jsonl"
    secret.write_bytes(b'{"id": "s", "text": "secret", "metadata": {}}\n')
    link = root / "shards" / "part-link.jsonl"
    link.symlink_to(secret)
    with pytest.raises(PhysicalUnsupportedError, match="part-link.jsonl"):
        htomb.adapter("train").probe_physical(arts(htomb, mine))
    assert secret.read_bytes() == b'{"id": "s", "text": "secret", "metadata": {}}\n'


def test_what_the_store_creates_is_private(tmp_path):
    root = tmp_path / "fresh" / "dataset"
    store = DatasetStore(root, format="jsonl.gz")
    store.add(["a-1", "a-2"], ["one", "two"], subject="s")
    store.record_training_run(store.current_version(), "run-1")
    store.reclaim({"a-1"})
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
