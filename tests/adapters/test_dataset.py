"""Dataset backend against real shard files (JSONL, gzip JSONL, Parquet): conformance, controls, loaders and
their pins, training runs, crash and resume."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pyarrow.parquet as pq
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.contract import open_adapter
from tombstone.errors import PhysicalUnsupportedError
from tombstone.lineage.records import THIRD_PARTY_STORE
from tombstone.testing import AdapterConformance, ConformanceEnv
from tombstone_adapters.dataset import DatasetLoader, DatasetStore, PinMismatchError
from tombstone_adapters.dataset import adapter as adapter_module
from tombstone_adapters.dataset import store as store_module
from tombstone_adapters.dataset import versions as versions_module
from tombstone_adapters.docstore import DocStore

FORMATS = ["jsonl", "jsonl.gz", "parquet"]


# -- independent readers: no Tombstone code ---------------------------------------------------------


def decoded_rows(root: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Every row of every shard file under ``root/shards``, decoded with pyarrow / gzip / json directly."""
    out = {}
    for path in sorted((root / "shards").iterdir()):
        if path.name.endswith(".parquet"):
            table = pq.read_table(path)
            out[path.name] = list(zip(*(table.column(c).to_pylist() for c in ("id", "text", "metadata"))))
        else:
            raw = path.read_bytes()
            lines = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode().splitlines()
            out[path.name] = [(o["id"], o["text"], json.dumps(o["metadata"], sort_keys=True))
                              for o in map(json.loads, lines)]
    return out


def rows_holding(root: Path, needle: str) -> list[str]:
    return sorted(name for name, rows in decoded_rows(root).items() if any(needle in (r[0], r[1]) for r in rows))


def byte_scan(root: Path, needle: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes())


# -- a deployment with a docstore (the chunks' stand-in) and a dataset exported from it -------------


@pytest.fixture(params=FORMATS)
def fmt(request) -> str:
    return request.param


@pytest.fixture
def dtomb(tmp_path, clock):
    config = init_deployment(tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"},
                                                   "train": {"backend": "dataset", "path": "stores/train"}})
    DocStore(config.stores["docs"].options["path"]).close()
    DatasetStore(config.stores["train"].options["path"])  # the app creates its dataset
    with Tombstone(config, clock=clock) as tomb:
        yield tomb


def root_of(tomb) -> Path:
    return Path(tomb.config.stores["train"].options["path"])


def export(tomb, subject: str, n: int, fmt: str, *, tag: str = "", texts=None) -> list[str]:
    """Write ``n`` documents for ``subject`` and export each as a training example (edge doc → example)."""
    docs = DocStore(tomb.config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
    doc_ids = [f"{subject}-doc{tag}-{i:03d}" for i in range(n)]
    texts = texts or [f"{subject} wrote note {tag}{i} about invoice {1000 + i} and the refund" for i in range(n)]
    try:
        docs.add_many([(d, t, {}) for d, t in zip(doc_ids, texts)], subject=subject)
    finally:
        docs.close()
    ids = [f"ex-{subject}{tag}-{i:03d}-q7" for i in range(n)]
    DatasetStore(root_of(tomb), lineage=tomb.lineage, store="train", format=fmt).add(
        ids, texts, subject=subject, sources=[("docs", d) for d in doc_ids],
        metadatas=[{"doc": d, "n": i} for i, d in enumerate(doc_ids)])
    return ids


def arts(tomb, ids):
    return [tomb.lineage.artifact("train", i) for i in ids]


# -- conformance ---------------------------------------------------------------------------------


class TestDatasetConformance(AdapterConformance):
    @pytest.fixture(params=FORMATS)
    def conformance_env(self, request, dtomb):
        fmt = request.param
        adapter = open_adapter("train", "dataset", dtomb.config.stores["train"].options)
        adapter.content_key = dtomb.secret.content_key
        counter = iter(range(10_000))

        def write(subject: str, n: int):
            return arts(dtomb, export(dtomb, subject, n, fmt, tag=f"c{next(counter)}"))

        def survivors():
            return {ex.id: (ex.text, ex.metadata) for ex in DatasetLoader(root_of(dtomb))}

        def visible(ids):
            return {ex.id for ex in DatasetLoader(root_of(dtomb)) if ex.id in ids}

        @contextlib.contextmanager
        def vendor_failure():
            # the store's "client" is the file system: every read fails, and so does listing the files
            failing = mock.Mock(side_effect=OSError(errno.EIO, "injected: Input/output error"))
            with mock.patch.object(versions_module, "read_file", failing), \
                    mock.patch.object(adapter_module, "read_file", failing), \
                    mock.patch.object(adapter_module, "iter_files", failing):
                yield

        return ConformanceEnv(adapter=adapter, write=write, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure)


# -- the control, the reclaim, the survivors -------------------------------------------------------


def test_control_plain_delete_leaves_rows_and_reclaim_removes_them(dtomb, fmt):
    """Before erasure the probe finds every row; the dataset's own delete (from the manifest) hides the
    rows from loaders but leaves them in the shard, where the probe and an independent decode find them;
    suppress + reclaim remove them, and survivors decode to identical rows."""
    mine = export(dtomb, "alice", 3, fmt)
    theirs = export(dtomb, "bob", 4, fmt, tag="b")
    root = root_of(dtomb)
    before = {name: [r for r in rows if r[0] in theirs] for name, rows in decoded_rows(root).items()}
    raw_before = {p.name: p.read_bytes() for p in (root / "shards").iterdir()}
    adapter = dtomb.adapter("train")
    assert all(not r.passed and r.id_found for r in adapter.probe_physical(arts(dtomb, mine)).values())
    assert all(rows_holding(root, i) for i in mine)

    adapter.native_delete(arts(dtomb, mine))
    assert all(r.passed for r in adapter.probe_logical(arts(dtomb, mine)).values())
    assert not {ex.id for ex in DatasetLoader(root)} & set(mine)
    after_delete = adapter.probe_physical(arts(dtomb, mine))
    assert all(not r.passed and r.id_found for r in after_delete.values()), "control: the plain delete left nothing"
    assert "pinned by CURRENT" in after_delete[mine[0]].measurement
    assert all(rows_holding(root, i) for i in mine), "control: the rows left the shard"

    adapter.suppress(arts(dtomb, mine))
    evidence = adapter.reclaim(arts(dtomb, mine))
    assert evidence["rows_dropped"] == 3 and evidence["new_version"] == DatasetStore(root).current_version()
    results = adapter.probe_physical(arts(dtomb, mine))
    assert all(r.passed for r in results.values()), results
    for i in mine:
        assert rows_holding(root, i) == [] and byte_scan(root, i) == []
    assert {name: [r for r in rows if r[0] in theirs] for name, rows in decoded_rows(root).items()} == before
    if fmt == "jsonl":  # surviving lines are copied byte for byte
        for name, data in raw_before.items():
            kept = [line for line in data.splitlines(keepends=True) if not any(i.encode() in line for i in mine)]
            assert (root / "shards" / name).read_bytes() == b"".join(kept)
    assert {ex.id for ex in DatasetLoader(root)} == set(theirs)


def test_erase_end_to_end_follows_chunks_into_the_dataset(dtomb, fmt):
    """Erasing the subject follows the lineage edge source → example: both end VERIFIED(physical); the
    other subject's rows survive identical; every manifest version is free of the ids."""
    mine = export(dtomb, "alice", 2, fmt)
    theirs = export(dtomb, "bob", 2, fmt, tag="b")
    root = root_of(dtomb)
    survivors = sorted(r for rows in decoded_rows(root).values() for r in rows if r[0] in theirs)
    receipt, _ = dtomb.erase("alice")
    statuses = {(a["store"], a["artifact_id"]): (a["status"], a["level"]) for a in receipt["artifacts"]}
    assert {k for k in statuses if k[0] == "train"} == {("train", i) for i in mine}
    assert set(statuses.values()) == {("VERIFIED", "physical")}
    assert sorted(r for rows in decoded_rows(root).values() for r in rows) == survivors
    for i in mine:
        assert byte_scan(root, i) == []
    chain = DatasetStore(root)
    for version in chain.versions()[1:]:  # the hash chain still links every version to its parent
        manifest = chain.manifest(version)
        assert manifest.previous_sha256 == store_module.sha256(chain.manifest_bytes(manifest.parent))
    assert any(chain.manifest(v).rewritten_by_erasure for v in chain.versions()), "the suppressed list was scrubbed"


def test_a_parquet_byte_scan_alone_proves_nothing(dtomb):
    """Parquet pages are compressed: an independent byte scan misses ids the shard holds (only the column
    statistics' min and max show), so the probe decodes every row and finds every one."""
    ids = export(dtomb, "alice", 40, "parquet")
    root = root_of(dtomb)
    missed = [i for i in ids if not byte_scan(root / "shards", i)]
    assert len(missed) >= 30, "the control needs ids a byte scan misses"
    results = dtomb.adapter("train").probe_physical(arts(dtomb, missed))
    assert all(not r.passed and r.id_found and "row decoded" in r.measurement for r in results.values())


def test_content_is_checked_by_keyed_hash_or_ids_only(dtomb):
    """With the lineage key the probe finds an erased example's text in another row; an independent
    verifier (no key) checks ids only, and says so."""
    mine = export(dtomb, "alice", 1, "parquet", texts=["the same sentence twice"])
    DatasetStore(root_of(dtomb), format="parquet").add(["unrecorded-copy-x9"], ["the same sentence twice"],
                                                       subject="nobody")
    adapter = dtomb.adapter("train")
    adapter.suppress(arts(dtomb, mine))
    adapter.reclaim(arts(dtomb, mine))
    keyed = adapter.probe_physical(arts(dtomb, mine))[mine[0]]
    assert not keyed.passed and keyed.content_found and not keyed.id_found
    assert keyed.evidence["content_check"].startswith("keyed content hash")
    auditor = open_adapter("train", "dataset", dtomb.config.stores["train"].options)
    plain = auditor.probe_physical(arts(dtomb, mine))[mine[0]]
    assert plain.passed and plain.evidence["content_check"].startswith("ids only")


def test_reclaim_drops_rows_however_json_spells_the_id(dtomb):
    """A shard another tool wrote (ASCII escapes, escaped slashes, listed by no manifest) is rewritten too."""
    root = root_of(dtomb)
    foreign = root / "shards" / "part-foreign.jsonl"
    foreign.write_bytes(b'{"id": "ex\\/7", "text": "a", "metadata": {}}\n'
                        b'{"id": "caf\\u00e9-7", "text": "b", "metadata": {}}\n'
                        b'{"id": "keep-7", "text": "c", "metadata": {}}\n'
                        b'{"id": "keep-8", "text": "quotes ex/7 in its text", "metadata": {}}\n')
    data = DatasetStore(root)
    evidence = data.reclaim({"ex/7", "café-7"})
    assert evidence["rows_dropped"] == 2 and evidence["shards_rewritten"] == ["shards/part-foreign.jsonl"]
    assert foreign.read_bytes() == (b'{"id": "keep-7", "text": "c", "metadata": {}}\n'
                                    b'{"id": "keep-8", "text": "quotes ex/7 in its text", "metadata": {}}\n')


# -- loaders: the skip and the pins ------------------------------------------------------------------


def test_loader_skips_suppressed_in_every_version(dtomb, fmt):
    mine = export(dtomb, "alice", 2, fmt)
    theirs = export(dtomb, "bob", 2, fmt, tag="b")
    root = root_of(dtomb)
    data = DatasetStore(root)
    old = data.current_version()
    data.record_training_run(old, "ft-early")
    dtomb.adapter("train").suppress(arts(dtomb, mine))
    assert data.current_version() == old + 1 and set(data.manifest().suppressed) == set(mine)
    for loader in (DatasetLoader(root), DatasetLoader(root, version=old), data.loader(pin="ft-early")):
        assert [ex.id for ex in loader] == theirs


def test_loader_refuses_a_shard_that_does_not_match_its_pin(dtomb, fmt):
    export(dtomb, "alice", 2, fmt)
    root = root_of(dtomb)
    data = DatasetStore(root)
    shard = root / data.manifest().shards[0].path
    raw = shard.read_bytes()
    # the same rows, re-encoded with one changed: a valid shard, but not the pinned bytes
    rows = decoded_rows(root)[shard.name]
    from tombstone_adapters.dataset.shards import Row, encode_rows

    shard.write_bytes(encode_rows([Row(i, t + " (edited)", m) for i, t, m in rows], fmt))
    with pytest.raises(PinMismatchError, match=f"shard shards/{shard.name} no longer matches manifest"):
        list(DatasetLoader(root))
    shard.write_bytes(raw)
    assert len(list(DatasetLoader(root))) == 2
    manifest = root / "manifests" / f"v{data.current_version():06d}.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"deleted": []', b'"deleted": ["x"]'))
    with pytest.raises(PinMismatchError, match="no longer matches CURRENT"):
        list(DatasetLoader(root))


@pytest.mark.slow
def test_torch_iterable_dataset(dtomb):
    """The PyTorch view yields the loader's examples; with two DataLoader workers each example comes once."""
    from torch.utils.data import DataLoader

    from tombstone_adapters.dataset import torch_dataset

    ids = export(dtomb, "alice", 3, "parquet") + export(dtomb, "bob", 3, "jsonl", tag="b")
    dtomb.adapter("train").suppress(arts(dtomb, ids[:1]))
    dataset = torch_dataset(root_of(dtomb))
    batches = list(DataLoader(dataset, batch_size=2))
    assert sorted(i for b in batches for i in b["id"]) == sorted(ids[1:])
    parallel = DataLoader(dataset, batch_size=None, num_workers=2)
    assert sorted(item["id"] for item in parallel) == sorted(ids[1:])


# -- training runs: honest about models ----------------------------------------------------------------


def test_a_training_run_on_the_example_needs_a_human(dtomb):
    mine = export(dtomb, "alice", 2, "parquet")
    theirs = export(dtomb, "bob", 1, "parquet", tag="b")
    root = root_of(dtomb)
    data = DatasetStore(root, lineage=dtomb.lineage, store="train")
    dtomb.adapter("train").suppress(arts(dtomb, mine[1:]))  # a suppressed example is never trained on
    version = data.current_version()
    assert data.record_training_run(version, "ft-2026-01") == 2
    assert [ex.id for ex in data.loader(pin="ft-2026-01")] == [mine[0], theirs[0]]
    graph = {a.artifact_id: a for a, _ in dtomb.lineage.closure(dtomb.lineage.subject_key("alice"))}
    copy = f"training run ft-2026-01:train/{mine[0]}"
    assert dtomb.lineage.edges_of(graph[copy])["sources"] == [("train", mine[0], "trained_on_by")]

    receipt, _ = dtomb.erase("alice")
    entries = {a["artifact_id"]: a for a in receipt["artifacts"]}
    assert entries[copy]["store"] == THIRD_PARTY_STORE and entries[copy]["status"] == "NEEDS_HUMAN"
    assert "a model was trained on this example" in entries[copy]["reason"]
    assert f"manifest v{version}" in entries[copy]["reason"]
    assert all(entries[i]["status"] == "VERIFIED" for i in mine)
    assert not any(a["artifact_id"].endswith(mine[1]) and a["store"] == THIRD_PARTY_STORE
                   for a in receipt["artifacts"])
    # the erasure rewrote the shards the run pinned: its loader refuses them rather than serve other bytes
    with pytest.raises(PinMismatchError):
        list(data.loader(pin="ft-2026-01"))
    assert [ex.id for ex in data.loader()] == theirs


def test_a_shard_only_an_old_pin_lists_is_scanned_and_named(dtomb):
    """A shard the current version no longer lists (dropped from the manifest) but an old pin still does
    is decoded too; the finding names that pin; the reclaim rewrites it anyway."""
    mine = export(dtomb, "alice", 2, "parquet")
    export(dtomb, "bob", 2, "parquet", tag="b")
    root = root_of(dtomb)
    data = DatasetStore(root, lineage=dtomb.lineage, store="train")
    pinned = data.current_version()
    data.record_training_run(pinned, "ft-7")
    with data.lock:  # a tool that compacts the dataset drops alice's shard from the next version
        _, manifest = data._next_from_current()
        dropped = rows_holding(root, mine[0])
        manifest.shards = [s for s in manifest.shards if Path(s.path).name not in dropped]
        data._commit(manifest)
    assert not {ex.id for ex in data.loader()} & set(mine)
    found = dtomb.adapter("train").probe_physical(arts(dtomb, mine))[mine[0]]
    assert not found.passed and f"v{pinned} (pinned by training run ft-7)" in found.measurement
    assert "CURRENT" not in found.measurement
    assert any(line.startswith(f"v{pinned}:") for line in found.evidence["manifest_versions"])
    receipt, _ = dtomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"] if a["store"] == "train"} == {"VERIFIED"}
    assert rows_holding(root, mine[0]) == []


def test_the_auditor_agrees_and_then_finds_a_restored_shard(dtomb):
    """The independent verifier (no lineage db, no key: ids only) re-probes the dataset and agrees; a shard
    restored from a backup afterwards contradicts the receipt."""
    from tombstone.audit import AGREE, CONTRADICTED, audit

    mine = export(dtomb, "alice", 2, "parquet")
    export(dtomb, "bob", 1, "parquet", tag="b")
    root = root_of(dtomb)
    backup = {p.name: p.read_bytes() for p in (root / "shards").iterdir()}
    _, path = dtomb.erase("alice")
    rows = [r for r in audit(path, config_path=str(dtomb.config.path)).rows if r.store == "train"]
    assert sorted(r.artifact_id for r in rows) == sorted(mine) and {r.verdict for r in rows} == {AGREE}
    for name, data in backup.items():
        (root / "shards" / name).write_bytes(data)
    rows = [r for r in audit(path, config_path=str(dtomb.config.path)).rows if r.store == "train"]
    assert {r.verdict for r in rows} == {CONTRADICTED}


def test_rows_left_in_a_pinned_shard_are_residual_naming_the_pin(dtomb, monkeypatch):
    """When the rows stay (here: a reclaim that only deletes from the manifest), the receipt says
    RESIDUAL(physical) and names the shard, the versions listing it and the pins on those versions."""
    mine = export(dtomb, "alice", 1, "parquet")
    data = DatasetStore(root_of(dtomb), lineage=dtomb.lineage, store="train")
    pinned = data.current_version()
    data.record_training_run(pinned, "ft-7")
    monkeypatch.setattr(DatasetStore, "reclaim", lambda self, ids: {"plain delete": self.delete(ids)})
    receipt, _ = dtomb.erase("alice")
    entry = next(a for a in receipt["artifacts"] if a["artifact_id"] == mine[0])
    assert (entry["status"], entry["level"]) == ("RESIDUAL", "physical")
    assert f"v{pinned} (pinned by training run ft-7)" in entry["measurement"]
    assert "row decoded 1x in shards/part-" in entry["measurement"]


# -- what the probe refuses to call clean -------------------------------------------------------------


def test_an_undecodable_shard_is_unverified_never_clean(dtomb):
    mine = export(dtomb, "alice", 2, "jsonl.gz")
    root = root_of(dtomb)
    shard = next((root / "shards").iterdir())
    shard.write_bytes(shard.read_bytes()[:-9])  # a truncated gzip stream
    with pytest.raises(PhysicalUnsupportedError, match="not a complete gzip file"):
        dtomb.adapter("train").probe_physical(arts(dtomb, mine))


def test_a_fifo_in_the_shards_is_named_and_never_hangs(dtomb):
    mine = export(dtomb, "alice", 1, "jsonl")
    fifo = root_of(dtomb) / "shards" / "part-planted.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(PhysicalUnsupportedError, match="part-planted.jsonl"):
        dtomb.adapter("train").probe_physical(arts(dtomb, mine))
    with pytest.raises(Exception, match="not a regular file"):
        dtomb.adapter("train").reclaim(arts(dtomb, mine))


@pytest.mark.parametrize("damage", ["missing", "current", "manifest"])
def test_an_unreadable_dataset_is_one_line_exit_2(dtomb, damage):
    """A dataset that is gone, or whose current pointer or manifest is not readable, stops the erasure
    before anything changes: one line, exit 2."""
    export(dtomb, "alice", 1, "jsonl")
    root = root_of(dtomb)
    if damage == "missing":
        shutil.rmtree(root)
    elif damage == "current":
        (root / "CURRENT").write_text("{not json")
    else:
        (root / "manifests" / f"v{DatasetStore(root).current_version():06d}.json").write_text("[]")
    result = cli_run("erase", "alice", "--config", str(dtomb.config.path))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and ("no dataset at" in lines[0] or "is not readable" in lines[0]
                                or "not a readable dataset manifest" in lines[0]), result.output
    assert not dtomb.lineage.sagas()


# -- demo and the CI gate ------------------------------------------------------------------------------


def cli_run(*args: str):
    from click.testing import CliRunner

    from tombstone.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_demo_exports_the_chunks_into_a_dataset(tmp_path):
    result = cli_run("demo", "--workdir", str(tmp_path / "demo"), "--backends", "docstore,dataset", "--subjects", "3")
    assert result.exit_code == 0, result.output
    receipt = json.loads((tmp_path / "demo" / "receipts" / "user-0001.json").read_text())
    examples = [a for a in receipt["artifacts"] if a["store"] == "dataset"]
    assert len(examples) == 3 and {(a["status"], a["level"]) for a in examples} == {("VERIFIED", "physical")}
    where = cli_run("where", "user-0002", "--config", str(tmp_path / "demo" / "tombstone.toml")).output
    assert where.count("derived into: dataset/ex-") == 3  # each document → the example exported from it
    root = tmp_path / "demo" / "stores" / "dataset"
    assert len(list((root / "shards").glob("*.parquet"))) == 3  # one shard per chunk position
    assert len(list(DatasetLoader(root))) == 6


def test_check_passes_and_fails_when_the_rows_stay(tmp_path, monkeypatch):
    from tombstone.check import run_check

    passed = run_check("dataset", canaries=2)
    assert passed.passed and len(passed.rows) == 6, passed.failures
    # a reclaim that only deletes from the manifest leaves the rows in the shards: the gate must fail
    monkeypatch.setattr(DatasetStore, "reclaim", lambda self, ids: {"plain delete": self.delete(ids)})
    failed = run_check("dataset", canaries=1)
    assert not failed.passed and all(r.status.startswith("RESIDUAL(physical") for r in failed.rows)


def test_check_with_a_config_places_canaries_beside_the_dataset(dtomb):
    export(dtomb, "alice", 1, "jsonl")
    before = decoded_rows(root_of(dtomb))
    result = cli_run("check", "--backend", "dataset", "--config", str(dtomb.config.path), "--canaries", "1")
    assert result.exit_code == 0, result.output
    assert "train-tombstone-canary" in result.output
    assert decoded_rows(root_of(dtomb)) == before


# -- crash and resume ------------------------------------------------------------------------------------


def _intact(root: Path) -> list[str]:
    """What a kill must never leave: a shard that does not decode, a manifest naming a missing shard, a
    current pointer naming a missing manifest."""
    problems = []
    for path in (root / "shards").iterdir():
        if path.name.startswith("."):
            continue  # a temporary file: never listed by a manifest, removed by the next reclaim
        try:
            if path.name.endswith(".parquet"):
                pq.read_table(path)
            else:
                raw = path.read_bytes()
                for line in (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode().splitlines():
                    json.loads(line)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            problems.append(f"{path.name} does not decode: {exc}")
    for path in (root / "manifests").glob("v*.json"):
        for shard in json.loads(path.read_text())["shards"]:
            if not (root / shard["path"]).is_file():
                problems.append(f"{path.name} names missing {shard['path']}")
    current = json.loads((root / "CURRENT").read_text())
    if not (root / current["manifest"]).is_file():
        problems.append(f"CURRENT names missing {current['manifest']}")
    return problems


class Crash(BaseException):
    """Stands in for SIGKILL inside this process: nothing after the kill point runs."""


@pytest.mark.parametrize("point", ["reclaim:dataset:shard-temp-written#2", "reclaim:dataset:after-shard-write#1",
                                   "reclaim:dataset:after-manifest-scrub#1", "reclaim:dataset:after-manifest-scrub#2",
                                   "reclaim:dataset:after-manifest-write#1", "reclaim:dataset:after-repin#1"])
def test_a_reclaim_stopped_anywhere_finishes_on_the_next_run(dtomb, point, monkeypatch):
    """Versions written after the suppression (so the scrub re-links the hash chain of later manifests):
    the reclaim stops at a point, runs again, and ends with no id anywhere, an unbroken hash chain, and the
    survivors a clean reclaim keeps."""
    from tombstone_adapters.dataset import files as files_module

    mine = export(dtomb, "alice", 2, "jsonl.gz") + export(dtomb, "alice", 2, "parquet", tag="p")
    theirs = export(dtomb, "bob", 2, "jsonl", tag="b")
    adapter = dtomb.adapter("train")
    adapter.suppress(arts(dtomb, mine))
    later = export(dtomb, "carol", 1, "parquet", tag="c") + export(dtomb, "carol", 1, "jsonl", tag="d")
    root = root_of(dtomb)
    seen: dict[str, int] = {}

    def stop_at(name):
        seen[name] = seen.get(name, 0) + 1
        if f"{name}#{seen[name]}" == point:
            raise Crash(point)

    with monkeypatch.context() as patch:
        patch.setattr(store_module, "kill_point", stop_at)
        patch.setattr(files_module, "kill_point", stop_at)
        with pytest.raises(Crash):
            adapter.reclaim(arts(dtomb, mine))
    assert not _intact(root)
    adapter.reclaim(arts(dtomb, mine))
    assert all(r.passed for r in adapter.probe_physical(arts(dtomb, mine)).values())
    assert not list((root / "shards").glob(".*")) and not (root / "ERASURE").exists()
    assert sorted(ex.id for ex in DatasetLoader(root)) == sorted(theirs + later)
    data = DatasetStore(root)
    for version in data.versions()[1:]:
        manifest = data.manifest(version)
        assert manifest.previous_sha256 == store_module.sha256(data.manifest_bytes(manifest.parent)), version


@pytest.mark.slow
def test_kill_inside_the_shard_rewrite_and_resume_equals_a_clean_run(tmp_path):
    """SIGKILL at every dataset kill point of `tombstone erase` (and the saga's steps on the dataset store):
    no half-written shard, no manifest naming a missing one; `tombstone resume` then gives the clean run's
    statuses and survivors."""
    from tombstone.testing.crash import SUBJECT, cli, copy_deployment, prepare, release_stores, same_survivors, \
        statuses, survivors

    prepared = prepare("docstore,dataset", tmp_path / "prepared")
    points = [p for p in prepared["points"] if "dataset" in p]
    for needed in ("reclaim:dataset:shard-temp-written#1", "reclaim:dataset:after-shard-write#3",
                   "reclaim:dataset:after-manifest-scrub#1", "reclaim:dataset:after-manifest-write#1",
                   "reclaim:dataset:after-repin#1", "suppress:dataset:after-manifest-write#1"):
        assert needed in points, (needed, points)
    failures = []
    for n, point in enumerate(points):
        root = tmp_path / f"trial-{n}"
        copy_deployment(prepared["template"], root)
        try:
            config = str(root / "tombstone.toml")
            killed = cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": point})
            if killed.returncode != -9:
                failures.append(f"{point}: not killed ({killed.returncode}) {killed.stderr[-300:]}")
                continue
            failures += [f"{point}: {p}" for p in _intact(root / "stores" / "dataset")]
            resumed = cli("resume", "--config", config)
            if resumed.returncode != 0:
                failures.append(f"{point}: resume failed: {resumed.stderr[-300:]}")
            elif statuses(root) != prepared["statuses"]:
                failures.append(f"{point}: statuses differ: {statuses(root)}")
            elif not same_survivors(survivors(root), prepared["survivors"]):
                failures.append(f"{point}: survivors differ")
            else:
                failures += [f"{point} (resumed): {p}" for p in _intact(root / "stores" / "dataset")]
                if list((root / "stores" / "dataset" / "shards").glob(".*")):
                    failures.append(f"{point}: a temporary file outlived the resume")
        finally:
            release_stores(root)
            shutil.rmtree(root, ignore_errors=True)
    assert not failures, "\n".join(failures)
