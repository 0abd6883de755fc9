"""Copies of a subject's rows anywhere under the dataset directory, in any format the physical probe reads,
told by content and never by name: after the erasure each is RESIDUAL(physical) naming the file; one the
probe cannot decode (truncated, a bomb past the bound, encrypted) is UNVERIFIED naming it, never VERIFIED.
The control in every case: the same store, probed again once the copy is gone, passes — and a subject
whose rows no copy holds is VERIFIED(physical) beside it."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import feather, ipc
from tombstone_adapters.dataset import DatasetStore
from tombstone_adapters.docstore import DocStore

from tombstone import Tombstone, init_deployment

SMALL = 1 << 20
"""The decode bound these deployments configure (1 MiB): a bomb a little past it is cheap to make."""

Rows = list[dict]


# -- a deployment: chunks in a docstore, exported as training examples ---------------------------------


@pytest.fixture
def ctomb(tmp_path, clock):
    config = init_deployment(tmp_path / "deploy", {
        "docs": {"backend": "docstore", "path": "stores/docs/docstore.db"},
        "train": {"backend": "dataset", "path": "stores/train", "max_decoded_bytes": SMALL}})
    DocStore(config.stores["docs"].options["path"]).close()
    DatasetStore(config.stores["train"].options["path"])
    with Tombstone(config, clock=clock) as tomb:
        yield tomb


def root_of(tomb) -> Path:
    return Path(tomb.config.stores["train"].options["path"])


def export(tomb, subject: str, n: int, fmt: str) -> Rows:
    """``n`` documents of ``subject`` exported as examples; the rows as written (id, text, metadata)."""
    docs = DocStore(tomb.config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
    doc_ids = [f"{subject}-doc-{i:03d}" for i in range(n)]
    texts = [f"{subject} wrote note {i} about invoice {4000 + i} and the late refund" for i in range(n)]
    try:
        docs.add_many([(d, t, {}) for d, t in zip(doc_ids, texts)], subject=subject)
    finally:
        docs.close()
    ids = [f"ex-{subject}-{i:03d}-c9" for i in range(n)]
    metas = [{"doc": d, "n": i} for i, d in enumerate(doc_ids)]
    DatasetStore(root_of(tomb), lineage=tomb.lineage, store="train", format=fmt).add(
        ids, texts, subject=subject, sources=[("docs", d) for d in doc_ids], metadatas=metas)
    return [{"id": i, "text": t, "metadata": m} for i, t, m in zip(ids, texts, metas)]


def arts(tomb, rows: Rows):
    return [tomb.lineage.artifact("train", r["id"]) for r in rows]


def train_entries(receipt) -> dict[str, dict]:
    return {a["artifact_id"]: a for a in receipt["artifacts"] if a["store"] == "train"}


def physical_probe(entry: dict) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == "physical")


# -- copies, written with pyarrow and the standard library (no Tombstone code) --------------------------


def jsonl(rows: Rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def table(rows: Rows) -> pa.Table:
    return pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                     "metadata": [json.dumps(r["metadata"]) for r in rows]})


def parquet(rows: Rows, compression: str = "zstd") -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table(rows), sink, compression=compression)
    return sink.getvalue().to_pybytes()


def nested_parquet(rows: Rows) -> bytes:
    """A chat-format copy: the id inside a struct, the text inside a list of messages."""
    t = pa.table({"meta": [{"example_id": r["id"], "source": "export"} for r in rows],
                  "messages": [[{"role": "user", "content": r["text"]}] for r in rows]})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def feather_file(rows: Rows) -> bytes:
    sink = pa.BufferOutputStream()
    feather.write_feather(table(rows), sink)  # Feather v2: an Arrow IPC file, LZ4-compressed by default
    return sink.getvalue().to_pybytes()


def arrow_stream(rows: Rows) -> bytes:
    sink = pa.BufferOutputStream()
    t = table(rows)
    with ipc.new_stream(sink, t.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(t)
    return sink.getvalue().to_pybytes()


def csv_bytes(rows: Rows, columns=("id", "text")) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for r in rows:
        writer.writerow([r[c] for c in columns])
    return out.getvalue().encode()


def arrow_codec(data: bytes, codec: str) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def zstd(data: bytes) -> bytes:
    return arrow_codec(data, "zstd")


def gz(data: bytes) -> bytes:
    return gzip.compress(data)


def zip_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def tar_gz_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def encrypted_zip(members: dict[str, bytes]) -> bytes:
    """A zip whose member says it is encrypted (the flag bit set in its local and central headers)."""
    data = bytearray(zip_of(members))
    data[6] |= 0x1
    central = data.index(b"PK\x01\x02")
    data[central + 8] |= 0x1
    return bytes(data)


def gzip_zeros(size: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    return comp.compress(bytes(size)) + comp.flush()


Copy = Callable[[Rows], bytes]

FOUND: dict[str, tuple[str, Copy]] = {
    # the four reported cases
    "gzip JSONL in shards/archive": ("shards/archive/part-old.jsonl.gz", lambda rows: gz(jsonl(rows))),
    "zstd Parquet in backup": ("backup/train.parquet", lambda rows: parquet(rows, "zstd")),
    "gzip JSON list as shards/extra.json.gz": ("shards/extra.json.gz", lambda rows: gz(json.dumps(rows).encode())),
    "gzip JSONL dump at the root": ("dump.jsonl.gz", lambda rows: gz(jsonl(rows))),
    # names that say nothing, or the wrong thing
    "gzip JSONL named notes.txt": ("notes.txt", lambda rows: gz(jsonl(rows))),
    "snappy Parquet named data.bin": ("data.bin", lambda rows: parquet(rows, "snappy")),
    "Parquet named part-9.dat in shards": ("shards/part-9.dat", lambda rows: parquet(rows, "zstd")),
    # other formats
    "nested Parquet (chat messages)": ("exports/chat.parquet", nested_parquet),
    "Feather v2 (LZ4)": ("backup/rows.feather", feather_file),
    "Arrow IPC stream (zstd)": ("exports/rows.arrows", arrow_stream),
    "gzip CSV": ("exports/rows.csv.gz", lambda rows: gz(csv_bytes(rows))),
    "xz JSONL": ("backup/rows.jsonl.xz", lambda rows: lzma.compress(jsonl(rows))),
    "bz2 JSON object holding the rows": ("backup/rows.json.bz2",
                                         lambda rows: bz2.compress(json.dumps({"rows": rows}).encode())),
    "zstd JSONL": ("backup/rows.jsonl.zst", lambda rows: zstd(jsonl(rows))),
    "LZ4 frame CSV": ("backup/rows.csv.lz4", lambda rows: arrow_codec(csv_bytes(rows), "lz4")),
    "gzip inside xz (nested)": ("backup/twice", lambda rows: lzma.compress(gz(jsonl(rows)))),
    "zip member": ("backup/export.zip", lambda rows: zip_of({"README": b"export", "rows.jsonl": jsonl(rows)})),
    "tar.gz member CSV": ("backup/export.tar.gz", lambda rows: tar_gz_of({"data/rows.csv": csv_bytes(rows)})),
    "gzip log of ids": ("logs/train.log.gz",
                        lambda rows: gz("".join(f"step 3 loaded {r['id']}\n" for r in rows).encode())),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_a_copy_is_residual_naming_the_file_and_gone_it_is_verified(ctomb, case):
    rel, make = FOUND[case]
    mine = export(ctomb, "alice", 2, "parquet")
    other = export(ctomb, "carol", 2, "jsonl.gz")
    root = root_of(ctomb)
    copy = root / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(make(mine))

    control, _ = ctomb.erase("carol")  # no copy holds carol's rows
    assert {(e["status"], e["level"]) for e in train_entries(control).values()} == {("VERIFIED", "physical")}

    receipt, _ = ctomb.erase("alice")
    entries = train_entries(receipt)
    assert sorted(entries) == sorted(r["id"] for r in mine)
    for entry in entries.values():
        assert (entry["status"], entry["level"]) == ("RESIDUAL", "physical"), entry
        assert f" {rel} (listed by no manifest" in entry["measurement"], entry["measurement"]
    assert copy.exists(), "the erasure does not touch what it did not write"

    copy.unlink()  # the control: the same probe, without the copy, finds nothing
    again = ctomb.adapter("train").probe_physical(arts(ctomb, mine))
    assert all(result.ran and result.passed for result in again.values()), again
    assert other  # carol's rows were exported beside alice's


def test_a_copy_of_the_text_alone_is_found_by_its_keyed_content_hash(ctomb):
    """A CSV holding the texts without the ids: found by the keyed content hash (the lineage key)."""
    mine = export(ctomb, "alice", 2, "jsonl")
    root = root_of(ctomb)
    copy = root / "exports" / "texts.csv"
    copy.parent.mkdir()
    copy.write_bytes(csv_bytes([{"text": r["text"], "source": "copy"} for r in mine], columns=("source", "text")))
    assert all(r["id"].encode() not in copy.read_bytes() for r in mine)
    receipt, _ = ctomb.erase("alice")
    for entry in train_entries(receipt).values():
        assert (entry["status"], entry["level"]) == ("RESIDUAL", "physical"), entry
        assert "content decoded in 1 value(s) of exports/texts.csv" in entry["measurement"], entry["measurement"]
    copy.unlink()
    adapter = ctomb.adapter("train")
    assert all(r.passed for r in adapter.probe_physical(arts(ctomb, mine)).values())


def test_a_torn_json_copy_is_searched_by_its_strings(ctomb):
    """Text that starts like JSON but does not parse (a copy cut short) is searched by its JSON string
    literals, each decoded: here the texts alone, found by their keyed content hash."""
    mine = export(ctomb, "alice", 2, "jsonl")
    root = root_of(ctomb)
    (root / "backup").mkdir()
    torn = root / "backup" / "texts.json"
    torn.write_bytes(json.dumps([r["text"] for r in mine], ensure_ascii=True)[:-1].encode())
    receipt, _ = ctomb.erase("alice")
    for entry in train_entries(receipt).values():
        assert (entry["status"], entry["level"]) == ("RESIDUAL", "physical"), entry
        assert "content decoded in 1 value(s) of backup/texts.json" in entry["measurement"], entry["measurement"]
    torn.unlink()
    assert all(r.passed for r in ctomb.adapter("train").probe_physical(arts(ctomb, mine)).values())


def test_a_log_that_starts_like_json_is_no_reason_to_leave_an_artifact_unverified(ctomb):
    """Lines starting with ``[`` are not JSON: the file is searched by its bytes and strings, and an erasure
    whose rows it does not hold is VERIFIED(physical)."""
    mine = export(ctomb, "alice", 1, "jsonl")
    root = root_of(ctomb)
    (root / "logs").mkdir()
    (root / "logs" / "train.log").write_bytes(b"[2024-05-01 10:00] epoch 1 done, loss 0.42\n[2024-05-01 10:05] saved\n")
    (root / "logs" / "train.log.gz").write_bytes(gz(b"[2024-05-01 10:00] loaded \"ex-bob-001\"\n"))
    receipt, _ = ctomb.erase("alice")
    entry = train_entries(receipt)[mine[0]["id"]]
    assert (entry["status"], entry["level"]) == ("VERIFIED", "physical"), entry
    decoded = physical_probe(entry)["detail"]["copies_decoded"]
    assert any(line.startswith("logs/train.log (text, not JSON") for line in decoded), decoded
    (root / "logs" / "train.log").write_bytes(f"[2024-05-01 10:00] loaded {mine[0]['id']}\n".encode())
    found = ctomb.adapter("train").probe_physical(arts(ctomb, mine))[mine[0]["id"]]
    assert not found.passed and "logs/train.log" in found.measurement  # the control: the byte scan sees it


UNREADABLE: dict[str, tuple[str, Callable[[Rows], bytes], str]] = {
    "truncated gzip": ("backup/dump.jsonl.gz", lambda rows: gz(jsonl(rows))[:-9], "not a complete gzip file"),
    "corrupt zstd": ("backup/dump.zst", lambda rows: zstd(jsonl(rows))[:-6], "not a complete zstd file"),
    "corrupt Parquet": ("backup/rows.parquet", lambda rows: parquet(rows)[:40] + parquet(rows)[-40:],
                        "not a readable Parquet file"),
    "encrypted zip member": ("backup/export.zip", lambda rows: encrypted_zip({"rows.jsonl": jsonl(rows)}),
                             "is encrypted"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_copy_that_cannot_be_decoded_is_unverified_naming_it(ctomb, case):
    rel, make, why = UNREADABLE[case]
    mine = export(ctomb, "alice", 2, "parquet")
    root = root_of(ctomb)
    copy = root / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(make(mine))
    receipt, _ = ctomb.erase("alice")
    for entry in train_entries(receipt).values():
        assert entry["status"] == "UNVERIFIED" and entry["reason"].startswith("physical: "), entry
        assert rel in entry["reason"] and why in entry["reason"], entry["reason"]
        physical = physical_probe(entry)
        assert not physical["ran"] and physical["detail"]["copies_not_decoded"], physical
    copy.unlink()
    again = ctomb.adapter("train").probe_physical(arts(ctomb, mine))
    assert all(result.ran and result.passed for result in again.values()), again


def test_a_gzip_bomb_stops_at_the_bound_fast_and_is_unverified_naming_it(ctomb):
    mine = export(ctomb, "alice", 1, "jsonl")
    root = root_of(ctomb)
    bomb = gzip_zeros(256 * SMALL)
    assert len(bomb) < SMALL, "small on disk, 256 MiB decoded"
    (root / "dump.jsonl.gz").write_bytes(bomb)
    receipt, _ = ctomb.erase("alice")
    entry = train_entries(receipt)[mine[0]["id"]]
    assert entry["status"] == "UNVERIFIED", entry
    assert "dump.jsonl.gz" in json.dumps(entry) and f"max_decoded_bytes {SMALL}" in json.dumps(entry)
    adapter = ctomb.adapter("train")
    start = time.perf_counter()
    result = adapter.probe_physical(arts(ctomb, mine))[mine[0]["id"]]
    assert time.perf_counter() - start < 5, "decoding stops at the bound"
    assert not result.ran and "dump.jsonl.gz" in result.why
    (root / "dump.jsonl.gz").unlink()
    assert adapter.probe_physical(arts(ctomb, mine))[mine[0]["id"]].passed


def test_a_row_found_elsewhere_stays_residual_beside_an_undecodable_file(ctomb):
    mine = export(ctomb, "alice", 1, "jsonl")
    root = root_of(ctomb)
    (root / "backup").mkdir()
    (root / "backup" / "rows.jsonl.gz").write_bytes(gz(jsonl(mine)))
    (root / "backup" / "broken.jsonl.gz").write_bytes(gz(jsonl(mine))[:-9])
    receipt, _ = ctomb.erase("alice")
    entry = train_entries(receipt)[mine[0]["id"]]
    assert (entry["status"], entry["level"]) == ("RESIDUAL", "physical"), entry
    assert "backup/rows.jsonl.gz" in entry["measurement"]
    assert any("broken.jsonl.gz" in line for line in physical_probe(entry)["detail"]["copies_not_decoded"])


def test_plain_files_stay_byte_scanned_and_the_stores_own_records_are_not_copies(ctomb):
    """A file of no format read here is left to the byte scan (as before), a plain-text record of the
    store's own (CURRENT, the manifests, the pins) is not listed as a copy, and the evidence names every
    copy decoded."""
    mine = export(ctomb, "alice", 1, "jsonl")
    root = root_of(ctomb)
    DatasetStore(root).record_training_run(DatasetStore(root).current_version(), "ft-1")
    (root / "README").write_bytes(b"training data for the support bot\n")
    (root / "backup").mkdir()
    (root / "backup" / "rows.jsonl.gz").write_bytes(gz(jsonl(mine)))
    result = ctomb.adapter("train").probe_physical(arts(ctomb, mine))[mine[0]["id"]]
    decoded = result.evidence["copies_decoded"]
    assert decoded == ["backup/rows.jsonl.gz (gzip > json; 1 row(s))"], decoded  # one row: one JSON document
    assert "README" in result.evidence["files_scanned"]


def test_the_auditor_decodes_the_copies_too(ctomb):
    """The independent verifier runs the same physical stage (ids only, no lineage): it agrees with a
    VERIFIED receipt, then contradicts it once a compressed copy is restored, and cannot confirm it while
    an undecodable one lies there."""
    from tombstone.audit import AGREE, CONTRADICTED, UNCHECKED, audit

    mine = export(ctomb, "alice", 2, "parquet")
    export(ctomb, "carol", 1, "parquet")
    root = root_of(ctomb)
    receipt, path = ctomb.erase("alice")
    assert {e["status"] for e in train_entries(receipt).values()} == {"VERIFIED"}

    def verdicts() -> set[str]:
        rows = [r for r in audit(path, config_path=str(ctomb.config.path)).rows if r.store == "train"]
        assert sorted(r.artifact_id for r in rows) == sorted(r["id"] for r in mine)
        return {r.verdict for r in rows}

    assert verdicts() == {AGREE}
    (root / "backup").mkdir()
    (root / "backup" / "train.parquet").write_bytes(parquet(mine, "zstd"))
    assert verdicts() == {CONTRADICTED}
    (root / "backup" / "train.parquet").unlink()
    (root / "backup" / "dump.jsonl.gz").write_bytes(gz(jsonl(mine))[:-9])
    assert verdicts() == {UNCHECKED}
    (root / "backup" / "dump.jsonl.gz").unlink()
    assert verdicts() == {AGREE}


# -- the decoders' bounds, directly -------------------------------------------------------------------


def test_every_decoder_stops_at_the_bound():
    """Bombs in each container the probe opens stop at max_decoded_bytes (DatasetBoundError naming the
    file), before the values are built: a zstd stream, an Arrow IPC file whose compressed body declares
    64 MiB, an Arrow file with one 1 MiB value repeated (dictionary-encoded), a zip member, layers nested
    deeper than the probe unwraps."""
    from tombstone_adapters.dataset.files import (
        DatasetBoundError,
        DatasetFileError,
        DecodeLimits,
    )
    from tombstone_adapters.dataset.sniff import MAX_DEPTH, decode

    limits = DecodeLimits(max_decoded_bytes=SMALL)
    big = pa.table({"id": ["bomb"], "text": ["a" * (64 << 20)]})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, big.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(big)
    arrow_bomb = sink.getvalue().to_pybytes()
    indices = pa.array([0] * 64, pa.int32())
    repeated = pa.table({"text": pa.DictionaryArray.from_arrays(indices, pa.array(["a" * SMALL]))})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, repeated.schema) as writer:
        writer.write_table(repeated)
    dictionary_bomb = sink.getvalue().to_pybytes()
    bombs = {
        "zstd": zstd(bytes(64 * SMALL)),
        "arrow": arrow_bomb,
        "arrow dictionary": dictionary_bomb,
        "zip member": zip_of({"rows.jsonl": bytes(64 * SMALL)}),
    }
    for name, data in bombs.items():
        assert len(data) < 4 * SMALL, name
        with pytest.raises(DatasetBoundError, match=f"{name}.*max_decoded_bytes {SMALL}"):
            list(decode(data, name, limits))
    nested = jsonl([{"id": "x", "text": "t"}])
    for _ in range(MAX_DEPTH + 1):
        nested = gz(nested)
    with pytest.raises(DatasetFileError, match="more than 3 levels deep"):
        list(decode(nested, "deep", limits))
    assert [p.chain for p in decode(gz(gz(gz(b'{"id": "x"}'))), "three", limits)] == ["gzip > gzip > gzip > json"]
