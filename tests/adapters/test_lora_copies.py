"""Copies of retired weights in the model store, found by what they hold rather than by their bytes: a gzip,
zstd, xz or bz2 copy, the tensors re-saved in another order with metadata, renamed, half of them, one of them
compressed under a misleading name. Files that look like weights and cannot be decoded (truncated, corrupt, a
header that declares 2^62 bytes) leave the artifacts UNVERIFIED naming the file, fast and without a large
allocation. The controls: a byte-identical copy is found, the erasure without copies is clean, and weights
that differ by one ulp per tensor are not taken for a copy.

A small deployment (the model of ``test_lora_hostile``, a few training steps) is trained and erased once per
module; each case plants its file in a copy of the erased model store and runs the physical probe."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
from tombstone_adapters.lora import ModelConfig
from tombstone_adapters.lora import copies as C
from tombstone_adapters.lora import synthetic as S
from tombstone_adapters.lora.adapter import LoraAdapter
from tombstone_adapters.lora.tensors import Undecodable, read_contents, tensors_of

from tombstone import Tombstone
from tombstone.config import load_config
from tombstone.errors import PhysicalUnsupportedError
from tombstone.testing import crash

SUBJECT = crash.SUBJECT  # user-0001: trained into a shard with one other subject
COPIES = ["byte-identical copy",  # the control: found before this change too
          "gzip copy", "zstd copy", "xz copy", "bz2 copy", "re-saved: tensors reordered, metadata added",
          "re-saved: every tensor renamed", "re-saved: half of the tensors",
          "re-saved: one tensor, renamed, gzip, named notes.txt"]


def tiny() -> ModelConfig:
    return ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "n_embd": 16, "n_head": 2, "n_layer": 1,
                                  "lora_r": 2, "base_steps": 2, "steps": 4, "unlearn_steps": 1, "batch_size": 4})


def registry(store: Path) -> dict:
    return json.loads((store / "registry.json").read_text())


def subject_shard(reg: dict) -> str:
    return next(name for name, e in reg["shards"].items() if f"ex-{SUBJECT}-00" in e["examples"])


def model_artifacts(receipt: dict) -> list[dict]:
    return [a for a in receipt["artifacts"] if a["store"] == "model"]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora-copies") / "template"
    S.build_deployment(root, subjects=5, examples=2, shards=2, holdout_subjects=1, config=tiny(), base_texts=8)
    # the levels this module is about: a model this small gives the model probe nothing to separate (noise);
    # test_lora.py runs the model level on a model that trains
    config = root / "tombstone.toml"
    config.write_text(config.read_text().replace("[tombstone]\n", '[tombstone]\nlevels = ["logical", "physical"]\n', 1))
    return root


@pytest.fixture(scope="module")
def erased(template: Path, tmp_path_factory) -> dict:
    """The subject erased on a copy: her shard's weights before, the receipt, her model artifacts."""
    root = tmp_path_factory.mktemp("lora-copies-erased") / "deploy"
    crash.copy_deployment(template, root)
    store = root / "stores/model"
    shard = subject_shard(registry(store))
    old = (store / registry(store)["shards"][shard]["file"]).read_bytes()
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(SUBJECT)) if a.store == "model"]
    return {"root": root, "store": store, "shard": shard, "old": old, "receipt": receipt, "arts": arts}


def planted(erased: dict, tmp_path: Path, files: dict[str, bytes]) -> LoraAdapter:
    """An adapter over a copy of the erased model store with ``files`` (name -> bytes) added."""
    store = tmp_path / "model"
    shutil.copytree(erased["store"], store)
    for name, data in files.items():
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        (store / name).write_bytes(data)
    return LoraAdapter("model", {"path": str(store)})


@pytest.mark.slow
def test_the_erasure_records_tensor_tags_and_without_copies_is_clean(erased: dict, tmp_path: Path) -> None:
    statuses = {(a["status"], a["level"]) for a in erased["receipt"]["artifacts"]}
    assert statuses == {("VERIFIED", "physical")}, statuses
    reg = registry(erased["store"])
    tensors = tensors_of(erased["old"])
    assert len(reg["retired_tensors"][erased["shard"]]) == sum(not t.constant for t in tensors) > 0
    text = (erased["store"] / "registry.json").read_text()
    assert not any(t.digest in text for t in tensors)  # tags, never the digests an outsider could match
    results = planted(erased, tmp_path, {}).probe_physical(erased["arts"])
    assert results and all(r.passed for r in results.values())
    evidence = next(iter(results.values())).evidence
    assert evidence["retired_tensors_known"] == len(reg["retired_tensors"][erased["shard"]])
    assert evidence["files_decoded"] >= 2  # the base and the other shard's weights were read as tensors


@pytest.mark.slow
@pytest.mark.parametrize("case", COPIES)
def test_a_copy_of_the_retired_weights_is_found(erased: dict, tmp_path: Path, case: str) -> None:
    name, data = C.copies(erased["old"])[case]
    assert data != erased["old"] or case == "byte-identical copy"
    results = planted(erased, tmp_path, {name: data}).probe_physical(erased["arts"])
    prefix = f"a copy of {erased['shard']}'s retired weights: {name} ("
    assert results and all(not r.passed and prefix in r.measurement and r.content_found for r in results.values()), \
        [r.measurement for r in results.values()]


@pytest.mark.slow
def test_weights_one_ulp_away_are_not_a_copy(erased: dict, tmp_path: Path) -> None:
    files = {name: data for name, data in C.unrelated(erased["old"]).values()}
    results = planted(erased, tmp_path, files).probe_physical(erased["arts"])
    assert all(r.passed for r in results.values()), [r.measurement for r in results.values()]
    assert next(iter(results.values())).evidence["files_decoded"] >= 3  # it was decoded, and held none of them


@pytest.mark.slow
@pytest.mark.parametrize("case", ["truncated safetensors", "corrupt gzip", "header bomb (2^62-byte header declared)",
                                  "header bomb inside xz"])
def test_weights_that_cannot_be_decoded_leave_the_artifacts_unverified(erased: dict, tmp_path: Path, case: str) -> None:
    name, data = C.broken(erased["old"])[case]
    adapter = planted(erased, tmp_path, {name: data})
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(PhysicalUnsupportedError) as raised:
            adapter.probe_physical(erased["arts"])
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert f"{name} (" in message and "cannot be decoded" in message and "\n" not in message, message
    assert seconds < 10 and peak < 64 << 20, (seconds, peak)


@pytest.mark.slow
def test_a_copy_found_is_reported_even_beside_a_file_that_cannot_be_decoded(erased: dict, tmp_path: Path) -> None:
    copy_name, copy_data = C.copies(erased["old"])["gzip copy"]
    bomb_name, bomb_data = C.broken(erased["old"])["header bomb (2^62-byte header declared)"]
    results = planted(erased, tmp_path, {copy_name: copy_data, bomb_name: bomb_data}).probe_physical(erased["arts"])
    assert all(not r.passed and copy_name in r.measurement for r in results.values())
    assert bomb_name in next(iter(results.values())).evidence["not_decoded"]


@pytest.mark.slow
def test_a_registry_without_tensor_tags_still_finds_byte_copies_even_compressed(erased: dict, tmp_path: Path) -> None:
    adapter = planted(erased, tmp_path, {})
    store = adapter.model.root
    reg = registry(store)
    del reg["retired_tensors"]
    (store / "registry.json").write_text(json.dumps(reg))
    cases = C.copies(erased["old"])
    for case, found in (("byte-identical copy", True), ("gzip copy", True), ("re-saved: every tensor renamed", False)):
        name, data = cases[case]
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        (store / name).write_bytes(data)
        results = adapter.probe_physical(erased["arts"])
        assert all((not r.passed) == found for r in results.values()), (case, [r.measurement for r in results.values()])
        assert next(iter(results.values())).evidence["retired_without_tensor_digests"] == [erased["shard"]]
        (store / name).unlink()


@pytest.mark.slow
def test_an_erasure_with_a_compressed_backup_of_the_shard_is_residual(template: Path, tmp_path: Path) -> None:
    """End to end: a backup of the shard's weights taken before the erasure (gzip, under another name) is
    found once the erasure retires them."""
    root = tmp_path / "deploy"
    crash.copy_deployment(template, root)
    store = root / "stores/model"
    entry = registry(store)["shards"][subject_shard(registry(store))]
    (store / "snapshots").mkdir()
    (store / "snapshots/nightly.bin").write_bytes(gzip.compress((store / entry["file"]).read_bytes(), mtime=0))
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    entries = model_artifacts(receipt)
    assert entries and all((e["status"], e["level"]) == ("RESIDUAL", "physical") for e in entries), \
        [(e["status"], e["level"]) for e in entries]
    physical = [next(p for p in e["evidence"]["probes"] if p["level"] == "physical") for e in entries]
    assert all(not p["passed"] and "snapshots/nightly.bin (" in p["measurement"] for p in physical)
    assert {a["status"] for a in receipt["artifacts"] if a["store"] != "model"} == {"VERIFIED"}  # control


@pytest.mark.slow
def test_an_erasure_with_a_header_bomb_in_the_store_is_unverified_naming_it(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "deploy"
    crash.copy_deployment(template, root)
    store = root / "stores/model"
    name, data = C.broken(b"\0" * 64)["header bomb (2^62-byte header declared)"]
    (store / name).parent.mkdir(parents=True, exist_ok=True)
    (store / name).write_bytes(data)
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    entries = model_artifacts(receipt)
    assert entries and all(e["status"] == "UNVERIFIED" and name in e["reason"] for e in entries), \
        [(e["status"], e["reason"]) for e in entries]
    assert {a["status"] for a in receipt["artifacts"] if a["store"] != "model"} == {"VERIFIED"}  # control


# -- the reader on hostile content, without a model ------------------------------------------------------


def _header(header: object, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + data


@pytest.mark.parametrize("content, why", [
    (_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2],
                                                                             "data_offsets": [4, 12]}}, b"\0" * 12),
     "overlap"),
    (_header({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, b"\0"), "unknown dtype"),
    (_header({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), "does not match"),
    (_header({"a": {"dtype": "F32", "shape": [1 << 38], "data_offsets": [0, 1 << 40]}}, b"\0" * 8), "past the end"),
    (_header({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}), "no valid shape"),
    (_header({"a": 5}), "not described by an object"),
    ((4).to_bytes(8, "little") + b"{,,}", "not JSON"),
    (len(b"[" * 100_000).to_bytes(8, "little") + b"{" + b"[" * 99_999, "not JSON"),
    (gzip.compress(_header({"a": {"dtype": "F32", "shape": [1 << 22], "data_offsets": [0, 1 << 24]}}) + b"\0" * 100,
                   mtime=0), "truncated inside tensor"),
    (gzip.compress(b"\0" * (2 << 20), mtime=0)[:-8] + b"\0" * 8, "cannot be decompressed"),
    (gzip.compress(gzip.compress(gzip.compress(gzip.compress(b"x")))), "more than 3 times"),
], ids=["overlap", "dtype", "size", "offsets", "shape", "entry", "json", "nesting", "truncated", "crc", "layers"])
def test_the_reader_refuses_hostile_content_in_one_line(content: bytes, why: str) -> None:
    with pytest.raises(Undecodable, match=why) as raised:
        read_contents(io.BytesIO(content), len(content), 1 << 30)
    assert "\n" not in str(raised.value)


def test_the_reader_stops_decompressing_at_the_weights_limit() -> None:
    bomb = gzip.compress(_header({"a": {"dtype": "U8", "shape": [64 << 20], "data_offsets": [0, 64 << 20]}})
                         + b"\0" * (64 << 20), mtime=0)
    with pytest.raises(Undecodable, match="larger than 1048576 bytes"):
        read_contents(io.BytesIO(bomb), len(bomb), 1 << 20)
    whole = read_contents(io.BytesIO(bomb), len(bomb), 1 << 30)  # the control: within the limit it is read
    assert whole.kinds == ["gzip", "safetensors"] and whole.tensors[0].constant and whole.tensors[0].shape == (64 << 20,)


def test_text_and_other_compressed_files_are_neither_copies_nor_undecodable() -> None:
    for content in (b"plain notes, nothing more\n", gzip.compress(b"a compressed log line\n" * 100, mtime=0)):
        found = read_contents(io.BytesIO(content), len(content), 1 << 30)
        assert found.tensors == [] and len(found.sha256s) == len(found.kinds) + 1
