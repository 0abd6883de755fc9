"""A FAISS store whose files were written by someone else: FIFOs, links and devices where the store's files
should be, an index file or a state whose counts claim more than the files hold, a records file that is a
link out of the store. Each is refused in one line (or named in a scan's notes), never waited on, never
written through, never allocated for; and the files the store creates are private (0600, the folder 0700).

Every command that could hang or exhaust memory on a regression runs in a subprocess with a timeout (and,
for the allocations, an address-space limit), so a regression fails instead of hanging or swapping."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tombstone.errors import StoreUnavailableError
from tombstone_adapters.faiss import FaissStore

DIM = 8
TIMEOUT = 60
ADDRESS_SPACE = 2 << 30
"""The address-space limit of a subprocess that opens a crafted store: far below what the crafted counts
would allocate (3.2 GB and more), well above what opening a small store takes."""


def make_store(path: Path, n: int = 5) -> Path:
    store = FaissStore(path, dim=DIM)
    rng = np.random.default_rng(3)
    store.add([f"doc-{i}" for i in range(n)], documents=[f"text {i}" for i in range(n)],
              metadatas=[{"n": i} for i in range(n)], embeddings=rng.random((n, DIM), dtype=np.float32))
    return path


def generation(path: Path) -> int:
    return json.loads((path / "CURRENT").read_text())["generation"]


OPEN = """
import resource, sys
limit = int(sys.argv[2])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from tombstone.errors import TombstoneError
from tombstone.errors import StoreUnavailableError
from tombstone_adapters.faiss import FaissStore
try:
    FaissStore(sys.argv[1], create=False)
except TombstoneError as exc:
    print("REFUSED", type(exc).__name__, exc)
    sys.exit(0)
print("OPENED")
"""


def open_in_subprocess(path: Path, address_space: int = 0) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", OPEN, str(path), str(address_space)], capture_output=True,
                            text=True, timeout=TIMEOUT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout.strip()


@pytest.mark.parametrize("name", ["CURRENT", "state", "heads.bin", "heads.ids"])
@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
def test_a_fifo_or_a_link_to_dev_zero_for_a_metadata_file_is_refused_in_one_line(tmp_path, name, plant):
    root = make_store(tmp_path / "vec")
    target = root / (f"state-{generation(root):06d}.json" if name == "state" else name)
    target.unlink()
    if plant == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    out = open_in_subprocess(root, ADDRESS_SPACE)
    assert out.startswith("REFUSED StoreUnavailableError") and "\n" not in out, out
    assert str(target) in out and ("a FIFO" in out if plant == "fifo" else "a symbolic link" in out), out


def test_a_state_file_over_the_metadata_limit_is_refused_before_it_is_read(tmp_path):
    root = make_store(tmp_path / "vec")
    state = root / f"state-{generation(root):06d}.json"
    with pytest.raises(StoreUnavailableError) as caught:
        FaissStore(root, create=False, max_metadata_bytes=state.stat().st_size - 1)
    assert "over the limit" in str(caught.value) and "max_metadata_bytes" in str(caught.value)
    assert FaissStore(root, create=False, max_metadata_bytes=state.stat().st_size).count() == 5  # control


def test_an_id_map_claiming_400_million_entries_is_refused_before_faiss_allocates_it(tmp_path):
    root = make_store(tmp_path / "vec")
    index = root / f"index-{generation(root):06d}.faiss"
    size = index.stat().st_size
    with open(index, "r+b") as fh:  # the id map is the file's tail: a u64 count, then one int64 per vector
        fh.seek(size - 8 - 8 * 5)
        assert int.from_bytes(fh.read(8), "little") == 5
        fh.seek(size - 8 - 8 * 5)
        fh.write((400_000_000).to_bytes(8, "little"))
    out = open_in_subprocess(root, ADDRESS_SPACE)
    assert out.startswith("REFUSED StoreUnavailableError") and "\n" not in out, out
    assert str(index) in out and "id map claims 400000000 entries" in out, out


def test_an_index_file_of_another_kind_is_refused(tmp_path):
    import faiss

    root = make_store(tmp_path / "vec")
    index = root / f"index-{generation(root):06d}.faiss"
    faiss.write_index(faiss.IndexFlatL2(DIM), str(index))
    out = open_in_subprocess(root)
    assert out.startswith("REFUSED StoreUnavailableError") and "not an index file this store writes" in out, out


def test_a_state_claiming_more_heads_and_records_than_the_files_hold_allocates_nothing(tmp_path):
    root = make_store(tmp_path / "vec")
    state_path = root / f"state-{generation(root):06d}.json"
    state = json.loads(state_path.read_text())
    token, rows, size = state["heads"]
    # heads claiming a billion rows: not believed; the store reads its records file instead
    state_path.write_text(json.dumps({**state, "heads": [token, 1_000_000_000, 50_000_000_000]}))
    assert open_in_subprocess(root, ADDRESS_SPACE) == "OPENED"
    assert sorted(FaissStore(root, create=False).ids()) == [f"doc-{i}" for i in range(5)]
    # a committed records length of 40 GB: refused in one line, nothing allocated for it
    state_path.write_text(json.dumps({**state, "heads": None, "records_length": 40_000_000_000}))
    out = open_in_subprocess(root, ADDRESS_SPACE)
    assert out.startswith("REFUSED StoreUnavailableError") and "records.jsonl is shorter than generation" in out, out


def test_a_records_file_linked_out_of_the_store_is_never_written_through(tmp_path):
    root = make_store(tmp_path / "vec")
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"not the store's\n" * 4)
    before = outside.read_bytes()
    (root / "records.jsonl").unlink()
    (root / "records.jsonl").symlink_to(outside)
    with pytest.raises(StoreUnavailableError) as caught:  # opening reads the heads files, not the records
        store = FaissStore(root, create=False)
        store.add(["doc-new"], documents=["new"], embeddings=np.ones((1, DIM), dtype=np.float32))
    assert "records.jsonl is a symbolic link" in str(caught.value)
    assert outside.read_bytes() == before


@pytest.mark.parametrize("name", ["records.jsonl", "heads.ids", "index-000001.faiss", "planted"])
def test_scan_of_a_store_holding_a_fifo_never_hangs_and_names_it(tmp_path, name):
    root = make_store(tmp_path / "vec")
    fifo = root / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    result = subprocess.run([sys.executable, "-m", "tombstone", "scan", "--backend", "faiss", "--option",
                             f"path={root}"], capture_output=True, text=True, timeout=TIMEOUT)
    if name in ("records.jsonl", "heads.ids"):  # files the store cannot be read without: the scan stops
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1 and f"{fifo} is a FIFO" in result.stderr, result.stderr
    else:  # anything else is named in the notes, not read
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{name} is a FIFO: not read" in result.stdout, result.stdout


def test_the_store_directory_is_0700_and_every_file_it_writes_0600(tmp_path):
    root = make_store(tmp_path / "vec")
    FaissStore(root, create=False).exclude(["doc-1"])
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    files = sorted(p.name for p in root.iterdir())
    assert {"CURRENT", "records.jsonl", "heads.bin", "heads.ids"} <= set(files), files
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in root.iterdir()} == {f: "0o600" for f in files}
