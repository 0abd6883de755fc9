"""``tombstone scan`` on SQLite files an attacker shaped: the page carver's work is bounded per page and per
file, a page it could not carve whole is reported (never called clean), and a file that is not a SQLite
database, or not the store's, is one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tombstone.cli import EXIT_ACTION_NEEDED, EXIT_BAD_INPUT, EXIT_OK, main
from tombstone.errors import TombstoneError
from tombstone_adapters.docstore import DocStore
from tombstone_adapters.docstore.forensics import CarveBudget, scan_docstore

UNCHECKED = "sqlite pages not fully carved"
CLI_TIMEOUT = 60


def deleted_store(path: Path, n: int = 40) -> Path:
    """A docstore whose own client deleted every row with secure_delete off: a freelist of pages."""
    store = DocStore(path, secure_delete=False)
    try:
        store.add_many([(f"doc-{i}", "words " * 400, {}) for i in range(n)], subject="s")
        store.delete([f"doc-{i}" for i in range(n)])
    finally:
        store.close()
    return path


def page_size(data: bytes) -> int:
    return struct.unpack(">H", data[16:18])[0]


def first_trunk(data: bytes) -> int:
    return struct.unpack(">I", data[32:36])[0]


def craft_free_page(path: Path, *, repeat: int = 1000) -> int:
    """Fill one freelist leaf page with 0x01 bytes (every offset then parses as a record of one-byte
    integers and every freed-cell length up to 512 is tried: tens of seconds of carving for one 4 KiB
    page), and make the freelist trunk name that page ``repeat`` times. Returns the page number."""
    data = bytearray(path.read_bytes())
    size = page_size(data)
    base = (first_trunk(data) - 1) * size
    leaf = struct.unpack(">I", data[base + 8:base + 12])[0]
    data[(leaf - 1) * size:leaf * size] = b"\x01" * size
    repeat = min(repeat, size // 4 - 2)
    data[base + 4:base + 8] = struct.pack(">I", repeat)
    data[base + 8:base + 8 + 4 * repeat] = struct.pack(">I", leaf) * repeat
    path.write_bytes(bytes(data))
    return leaf


def cli_scan(path: Path, *options: str) -> subprocess.CompletedProcess:
    """``tombstone scan`` in a subprocess, bounded: a carver that does not stop fails the test."""
    args = [sys.executable, "-m", "tombstone", "scan", "--backend", "docstore", "--option", f"path={path}",
            *(x for o in options for x in ("--option", o)), "--json", "--show-ids"]
    return subprocess.run(args, capture_output=True, text=True, timeout=CLI_TIMEOUT)


def one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.slow
def test_a_crafted_free_page_ends_within_the_bound_and_is_reported_unchecked(tmp_path):
    path = deleted_store(tmp_path / "docstore.db")
    assert sqlite3.connect(path).execute("PRAGMA freelist_count").fetchone()[0] > 1
    leaf = craft_free_page(path)
    result = cli_scan(path)
    assert result.returncode == EXIT_ACTION_NEEDED, result.stdout + result.stderr
    report = json.loads(result.stdout)
    place = next(p for p in report["places"] if p["kind"] == UNCHECKED)
    assert place["count"] >= 1 and place["recoverable"] and str(leaf) in place["note"]
    assert report["recoverable"] is True
    assert any("not fully carved" in note for note in report["notes"])


def test_the_page_bound_is_an_option_and_a_page_past_it_is_never_clean(tmp_path):
    path = deleted_store(tmp_path / "docstore.db", n=4)
    loose = scan_docstore("d", {"path": str(path)})
    assert not [p for p in loose.places if p.kind == UNCHECKED]
    tight = scan_docstore("d", {"path": str(path), "max_carve_steps": "1"})
    unchecked = next(p for p in tight.places if p.kind == UNCHECKED)
    assert unchecked.count >= 1 and unchecked.recoverable and tight.recoverable
    total = scan_docstore("d", {"path": str(path), "max_carve_steps_total": 1})
    assert next(p for p in total.places if p.kind == UNCHECKED).count >= 1


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_bound_is_one_line_exit_2(tmp_path, value):
    path = deleted_store(tmp_path / "docstore.db", n=2)
    result = CliRunner().invoke(main, ["scan", "--backend", "docstore", "--option", f"path={path}",
                                       "--option", f"max_carve_steps={value}"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "max_carve_steps" in one_line(result)


def test_a_clean_store_stays_clean_under_the_bound(tmp_path):
    path = tmp_path / "docstore.db"
    store = DocStore(path, secure_delete=False)
    store.add_many([(f"doc-{i}", f"text {i}", {}) for i in range(5)], subject="s")
    store.close()
    report = scan_docstore("d", {"path": str(path)})
    assert not report.recoverable and not [p for p in report.places if p.kind == UNCHECKED]


def test_overlapping_freeblocks_are_not_followed_and_the_page_is_reported(tmp_path):
    """A b-tree page whose freeblock list overlaps itself (each block a few bytes past the last, each as
    long as the page) would have the whole page carved once per block: it is not followed."""
    path = tmp_path / "docstore.db"
    store = DocStore(path, secure_delete=False)
    store.add_many([(f"doc-{i}", f"text {i}", {}) for i in range(3)], subject="s")
    store.close()
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'documents'").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    size = page_size(data)
    base = (root - 1) * size
    content = struct.unpack(">H", data[base + 5:base + 7])[0]
    first = 200
    assert first + 4 * 200 < content, "the crafted list must lie in the unallocated gap"
    data[base + 1:base + 3] = struct.pack(">H", first)
    for k in range(200):
        at = base + first + 4 * k
        data[at:at + 4] = struct.pack(">HH", first + 4 * (k + 1), size - first - 4 * k)
    path.write_bytes(bytes(data))
    report = scan_docstore("d", {"path": str(path)})
    unchecked = next(p for p in report.places if p.kind == UNCHECKED)
    assert unchecked.count == 1 and str(root) in unchecked.note and report.recoverable


def test_duplicate_freelist_entries_carve_a_page_once(tmp_path):
    """A trunk that names one leaf a thousand times costs one page's carving, not a thousand."""
    path = deleted_store(tmp_path / "docstore.db")
    data = bytearray(path.read_bytes())
    size = page_size(data)
    base = (first_trunk(data) - 1) * size
    leaf = data[base + 8:base + 12]
    count = size // 4 - 2
    data[base + 4:base + 8] = struct.pack(">I", count)
    data[base + 8:base + 8 + 4 * count] = leaf * count
    path.write_bytes(bytes(data))

    class Counting(CarveBudget):
        pages = 0

        def page(self) -> None:
            Counting.pages += 1
            super().page()

    from tombstone_adapters.docstore import forensics

    forensics.scan_sqlite("d", "docstore", path, lambda c: set(), (4, 2), forensics._docstore_record,
                          budget=Counting())
    assert Counting.pages < 50


# -- files that are not the store's SQLite database -----------------------------------------------------


@pytest.mark.parametrize("content", [
    b"",
    b"just some text, not a database\n" * 40,
    b"SQLite format 3\x00" + os.urandom(8000),
    b"\x00" * 8192,
])
def test_a_file_that_is_not_sqlite_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "docstore.db"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["scan", "--backend", "docstore", "--option", f"path={path}"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    line = one_line(result)
    assert str(path) in line and "not scanned" in line


def test_another_apps_database_is_one_line_exit_2(tmp_path):
    path = tmp_path / "docstore.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    result = CliRunner().invoke(main, ["scan", "--backend", "docstore", "--option", f"path={path}"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "not a readable SQLite database of this store" in one_line(result)


def test_a_fifo_at_the_path_is_one_line_and_never_waits(tmp_path):
    path = tmp_path / "docstore.db"
    os.mkfifo(path)
    result = CliRunner().invoke(main, ["scan", "--backend", "docstore", "--option", f"path={path}"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert str(path) in one_line(result)


def test_damaged_pages_give_a_report_or_one_line_never_a_traceback(tmp_path):
    """Random bytes written over random pages of a store with deletions: each scan ends with a report
    or a TombstoneError, nothing else."""
    original = deleted_store(tmp_path / "original.db", n=12)
    rng = random.Random(7)
    size = page_size(original.read_bytes())
    for n in range(30):
        path = tmp_path / f"damaged-{n}.db"
        shutil.copyfile(original, path)
        data = bytearray(path.read_bytes())
        pages = len(data) // size
        for _ in range(3):
            page = rng.randrange(1, pages)
            at = page * size + rng.randrange(0, size - 64)
            data[at:at + 64] = bytes(rng.randrange(256) for _ in range(64))
        path.write_bytes(bytes(data))
        try:
            report = scan_docstore("d", {"path": str(path), "max_carve_steps": 20_000})
        except TombstoneError:
            continue
        assert report.as_json() is not None


def test_the_scan_exit_codes_are_unchanged_for_plain_stores(tmp_path):
    path = tmp_path / "docstore.db"
    DocStore(path).close()
    result = CliRunner().invoke(main, ["scan", "--backend", "docstore", "--option", f"path={path}"])
    assert result.exit_code == EXIT_OK, result.output
