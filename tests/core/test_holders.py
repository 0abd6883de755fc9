"""``tombstone.holders``: the other processes that hold a store's files open, told apart by whether they
registered through Tombstone. Real child processes, each holding a real file open until told to stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tombstone import holders

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists open files through /proc")

HOLD = """
import sys
from tombstone import holders
path, register, modes = sys.argv[1], sys.argv[2] == "1", sys.argv[4].split(",")
fhs = [open(path, mode) for mode in modes]
if register:
    holders.register(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
for fh in fhs:
    fh.close()  # a client closed before the process exits
"""

EXITING = """
import atexit, sys
def last():  # registered first, so it runs after tombstone.holders' own exit handler, the file still open
    print("exiting", flush=True)
    sys.stdin.readline()
atexit.register(last)
from tombstone import holders
fh = open(sys.argv[1], "rb")
holders.register(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
"""


def _holder(file: Path, store: Path, register: bool, modes: str = "r+b") -> subprocess.Popen[str]:
    """A process holding ``file`` open, once per mode in ``modes`` (``r+b``: for writing, as a store's client
    holds its database; ``rb``: only for reading)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(file), "1" if register else "0", str(store), modes],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"  # waits on the child, not on a sleep
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.communicate("\n", timeout=60)


@pytest.fixture
def store(tmp_path) -> Path:
    folder = tmp_path / "store"
    (folder / "seg").mkdir(parents=True)
    (folder / "seg" / "data.bin").write_bytes(b"x" * 100)
    return folder


def test_nothing_holds_a_store_nobody_opened(store):
    seen = holders.holders(store)
    assert seen.listed and seen.foreign == [] and seen.registered == []


def test_a_process_holding_a_file_inside_is_foreign_until_it_registers(store):
    foreign = _holder(store / "seg" / "data.bin", store, register=False)
    known = _holder(store / "seg" / "data.bin", store, register=True)
    try:
        seen = holders.holders(store)
        assert [pid for pid, _ in seen.foreign] == [foreign.pid]
        named = dict(seen.foreign)[foreign.pid]  # its command line, on one line, to name it
        assert named.startswith(sys.executable) and "\n" not in named
        assert seen.registered == [known.pid]
        assert os.getpid() not in [pid for pid, _ in seen.foreign] + seen.registered
        assert (holders.registry_for(store)).is_dir()
        evidence = seen.evidence()["other_holders"]
        assert evidence["through_tombstone"] == 1 and str(foreign.pid) in evidence["outside_tombstone"][0]
    finally:
        _stop(foreign)
        _stop(known)
    # once they stop, nothing holds it; the registered one's entry, and the emptied folder, went with it
    after = holders.holders(store)
    assert after.foreign == [] and after.registered == []
    assert not holders.registry_for(store).exists()


def test_a_process_that_only_reads_the_files_is_named_apart_and_not_foreign(store):
    """A copy, a backup or a read-only scan holds the files only for reading: it can write nothing back, so it
    is listed as reading only, not as a foreign client; one descriptor open for writing among its reads makes
    a process foreign."""
    reader = _holder(store / "seg" / "data.bin", store, register=False, modes="rb,rb")
    mixed = _holder(store / "seg" / "data.bin", store, register=False, modes="rb,r+b")
    try:
        seen = holders.holders(store)
        assert [pid for pid, _ in seen.readers] == [reader.pid]
        assert [pid for pid, _ in seen.foreign] == [mixed.pid]
        evidence = seen.evidence()["other_holders"]
        assert str(reader.pid) in evidence["reading_only"][0] and str(mixed.pid) in evidence["outside_tombstone"][0]
    finally:
        _stop(reader)
        _stop(mixed)


def test_a_holder_whose_open_modes_cannot_be_read_counts_as_foreign(store, monkeypatch):
    """Where /proc/<pid>/fdinfo cannot be read, a holder is not assumed to be only reading."""
    reader = _holder(store / "seg" / "data.bin", store, register=False, modes="rb")
    try:
        assert [pid for pid, _ in holders.holders(store).readers] == [reader.pid]
        real = Path.read_text

        def unreadable(self, *args, **kwargs):
            if self.parent.name == "fdinfo":
                raise PermissionError(13, "Permission denied")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", unreadable)
        seen = holders.holders(store)
        assert [pid for pid, _ in seen.foreign] == [reader.pid] and seen.readers == []
    finally:
        _stop(reader)


def test_a_file_outside_the_store_is_not_counted(store, tmp_path):
    beside = tmp_path / "store-other.bin"  # shares the store's name as a prefix, is not inside it
    beside.write_bytes(b"y")
    proc = _holder(beside, store, register=False)
    try:
        assert holders.holders(store).foreign == []
    finally:
        _stop(proc)


def test_an_entry_left_by_a_process_that_died_does_not_register_a_new_one(store):
    """A registry entry names the pid and the process's start time: a stale entry (its process gone, or its
    pid reused by another process) does not make a foreign holder look registered, and is removed."""
    foreign = _holder(store / "seg" / "data.bin", store, register=False)
    try:
        stale = holders.registry_for(store) / f"{foreign.pid}-1"  # the pid, another start time
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.touch()
        assert [pid for pid, _ in holders.holders(store).foreign] == [foreign.pid]
        assert holders.register(store)
        assert not stale.exists()
    finally:
        _stop(foreign)


def test_without_proc_the_listing_says_it_did_not_look(store, monkeypatch, tmp_path):
    monkeypatch.setattr(holders, "_PROC", tmp_path / "no-proc")
    seen = holders.holders(store)
    assert not seen.listed and seen.foreign == []
    assert "not listed" in seen.evidence()["other_holders"]


def test_a_registered_process_exiting_with_the_store_still_open_stays_registered(store):
    """A client's files close only after the exit handlers have run: a process that took its entry back first
    would be seen, while it exits, as a foreign holder by an erasure verifying meanwhile. It keeps its entry
    while it holds the files; the entry then names no running process, and the next registration removes it."""
    proc = subprocess.Popen([sys.executable, "-c", EXITING, str(store / "seg" / "data.bin"), str(store)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "exiting"  # past tombstone.holders' exit handler, file open
        seen = holders.holders(store)
        assert seen.registered == [proc.pid] and seen.foreign == []
    finally:
        proc.communicate("\n", timeout=60)
    left = list(holders.registry_for(store).iterdir())
    assert [p.name.split("-")[0] for p in left] == [str(proc.pid)]  # its entry, naming a process gone
    other = _holder(store / "seg" / "data.bin", store, register=True)
    try:
        assert [p.name.split("-")[0] for p in holders.registry_for(store).iterdir()] == [str(other.pid)]
    finally:
        _stop(other)
