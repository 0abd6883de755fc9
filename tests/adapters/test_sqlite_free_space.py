"""Zeroing the free space of SQLite pages in place (``tombstone.sqlite_pages``): what Chroma's and Qdrant's
own clients leave behind when they delete or rewrite a row with ``secure_delete`` off, cleared without a
VACUUM.

The unit tests use a plain SQLite file, so every byte is known; the end-to-end test uses embedded Chroma."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tombstone import sqlite_pages as inplace

MARK = b"erase-me-%04d-" + b"\xa5" * 20


def marker(i: int) -> bytes:
    return MARK.replace(b"%04d", b"%04d" % i)


def table_file(path: Path, rows: int = 400, *, journal: str = "delete") -> Path:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA secure_delete=OFF")  # as Chroma's own client runs
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, marker(i) + os.urandom(60)) for i in range(rows)])
    conn.close()
    return path


def offsets(path: Path, pattern: bytes) -> list[int]:
    """An independent byte scan: no Tombstone code."""
    data, found, at = path.read_bytes(), [], -1
    while (at := data.find(pattern, at + 1)) >= 0:
        found.append(at)
    return found


def delete_without_secure_delete(path: Path, ids: list[int]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA secure_delete=OFF")
    conn.executemany("DELETE FROM t WHERE id = ?", [(i,) for i in ids])
    conn.close()


def rows(path: Path) -> dict[int, bytes]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return dict(conn.execute("SELECT id, body FROM t"))
    finally:
        conn.close()


def test_a_deleted_rows_bytes_left_in_a_page_still_in_use_are_zeroed_and_nothing_else_changes(tmp_path):
    db = table_file(tmp_path / "t.sqlite3")
    erased = [10, 11, 200]
    delete_without_secure_delete(db, erased)
    before = rows(db)
    # control: the delete left the rows' bytes in their pages, which still hold other rows (and the page
    # splits of the inserts left more copies)
    assert all(offsets(db, marker(i)) for i in erased)
    hits = [(at, len(marker(i))) for i in erased for at in offsets(db, marker(i))]
    result = inplace.zero_freed_space(db, hits)
    assert result is not None and result["pages_written"] >= 1 and result["bytes_zeroed"] > 0
    assert all(offsets(db, marker(i)) == [] for i in erased)
    assert rows(db) == before  # every other row intact, the file still well formed
    assert all(offsets(db, marker(i)) for i in (9, 12, 199, 201))  # a survivor's bytes are still there
    # a fresh process reads and writes the file as before
    script = ("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "c.execute('INSERT INTO t VALUES (5000, x\\'00\\')')\n"
              "print(c.execute('SELECT count(*) FROM t').fetchone()[0], c.execute('PRAGMA integrity_check').fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", script, str(db)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(before) + 1), "ok"]


def test_a_connection_open_before_the_zeroing_drops_the_pages_it_cached(tmp_path):
    """A connection that read a page before keeps it in its cache across transactions (shown first: a byte
    changed under it is not seen) and would write that copy back with its next change to the page. The
    zeroing bumps the file change counter, so the connection reads its pages again."""
    db = table_file(tmp_path / "t.sqlite3")
    delete_without_secure_delete(db, [10])
    other = sqlite3.connect(db, isolation_level=None)
    assert other.execute("SELECT substr(body, 1, 8) FROM t WHERE id = 9").fetchone() == (b"erase-me",)
    live = offsets(db, marker(9))
    with open(db, "r+b") as fh:  # the file changed under the connection, counter untouched
        for at in live:
            fh.seek(at)
            fh.write(b"CHANGED!")
    assert other.execute("SELECT substr(body, 1, 8) FROM t WHERE id = 9").fetchone() == (b"erase-me",)  # cached
    counter = int.from_bytes(db.read_bytes()[24:28], "big")
    assert inplace.zero_freed_space(db, [(at, len(marker(10))) for at in offsets(db, marker(10))])["pages_written"]
    assert int.from_bytes(db.read_bytes()[24:28], "big") == counter + 1
    assert other.execute("SELECT substr(body, 1, 8) FROM t WHERE id = 9").fetchone() == (b"CHANGED!",)
    other.execute("UPDATE t SET body = x'01' WHERE id = 12")
    other.close()
    assert offsets(db, marker(10)) == [] and rows(db)[12] == b"\x01"


def test_a_hit_in_a_live_cell_is_refused_and_nothing_is_written(tmp_path):
    db = table_file(tmp_path / "t.sqlite3")
    delete_without_secure_delete(db, [10])
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    live = [(at, len(marker(11))) for at in offsets(db, marker(11))]
    free = [(at, len(marker(10))) for at in offsets(db, marker(10))]
    assert inplace.zero_freed_space(db, live + free) is None
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_a_database_in_wal_mode_is_refused(tmp_path):
    db = table_file(tmp_path / "t.sqlite3", journal="wal")
    delete_without_secure_delete(db, [10])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    hits = [(at, len(marker(10))) for at in offsets(db, marker(10))]
    assert hits and inplace.zero_freed_space(db, hits) is None
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_a_freelist_page_is_zeroed_past_its_list(tmp_path):
    """Rows deleted by the hundred free whole pages: their bytes are on the freelist, and a leaf page is
    zeroed whole."""
    db = table_file(tmp_path / "t.sqlite3", rows=2000)
    erased = list(range(500, 1500))
    delete_without_secure_delete(db, erased)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] > 0
    conn.close()
    before = rows(db)
    hits = [(at, len(marker(i))) for i in erased for at in offsets(db, marker(i))]
    assert hits
    assert inplace.zero_freed_space(db, hits) is not None
    assert all(offsets(db, marker(i)) == [] for i in erased)
    assert rows(db) == before


@pytest.mark.parametrize("garbage", [b"\x0d\xff\xff", b"\x07"])
def test_a_page_that_is_not_a_well_formed_btree_page_is_refused(tmp_path, garbage):
    db = table_file(tmp_path / "t.sqlite3")
    delete_without_secure_delete(db, [10])
    at = offsets(db, marker(10))[-1]
    page_size = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as fh:  # a page header that lies (cell count past the page) or an unknown page type
        fh.seek(at // page_size * page_size)
        fh.write(garbage)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    assert inplace.zero_freed_space(db, [(at, len(marker(10)))]) is None
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_an_erasure_zeroes_what_chromas_own_client_left_in_free_space_without_a_vacuum(tmp_path):
    """End to end on embedded Chroma. Control: Chroma's own client, rewriting alice's documents, leaves the
    old text in chroma.sqlite3's free space (it runs with ``secure_delete`` off), in pages that hold neither
    her ids nor her vectors, which no scan pattern names. The erasure zeroes the free space of every page,
    without a VACUUM: an independent scan then finds neither the old text nor her ids and vectors, and the
    survivors are intact."""
    import chromadb

    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone.capture.vector import normalised_fingerprint
    from tombstone.lineage.db import fingerprint_bytes
    from tombstone_adapters.chroma import TombstoneCollection

    config = init_deployment(tmp_path / "deploy", {"vectors": {"backend": "chroma", "path": "stores/vectors",
                                                                "collection": "docs"}})
    path = Path(config.stores["vectors"].options["path"])
    chromadb.PersistentClient(path=str(path)).create_collection(
        "docs", metadata={"hnsw:space": "cosine", "hnsw:batch_size": 10, "hnsw:sync_threshold": 20},
        embedding_function=None)
    old = [f"alice's first note {i}: card ending 4242-{i:04d}".encode() for i in range(40)]
    with Tombstone(config) as tomb:
        col = TombstoneCollection(chromadb.PersistentClient(path=str(path)).get_collection("docs"),
                                  lineage=tomb.lineage, store="vectors", embedder=HashingEmbedder(64))
        for subject, n in (("alice", 40), ("bob", 160)):
            ids = [f"{subject}-chunk-{i:04d}" for i in range(n)]
            docs = [t.decode() for t in old] if subject == "alice" else [f"bob note {i} " + "lorem " * 20
                                                                            for i in range(n)]
            col.add(ids=ids, documents=docs, metadatas=[{"n": i} for i in range(n)], subject=subject)
        mine = [f"alice-chunk-{i:04d}" for i in range(40)]
        col.update(ids=mine, documents=[f"alice's note {i}, rewritten" for i in range(40)], subject="alice")
        db = path / "chroma.sqlite3"
        conn = sqlite3.connect(db)
        assert not conn.execute("SELECT count(*) FROM embedding_metadata WHERE string_value LIKE '%4242-%'").fetchone()[0]
        conn.close()
        assert any(offsets(db, t) for t in old), "control: the rewrite left the old text in free space"
        arts = [tomb.lineage.artifact("vectors", i) for i in mine]
        survivors = chromadb.PersistentClient(path=str(path)).get_collection("docs").get(
            ids=[f"bob-chunk-{i:04d}" for i in range(160)], include=["documents", "metadatas"])
        receipt, _ = tomb.erase("alice")
        assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
        evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
        assert evidence["mechanism"] == "in-place" and "vacuum" not in evidence
        assert evidence["free_space_zeroed"]["pages_written"] > 0
    assert not any(offsets(db, t) for t in old)
    for art in arts:
        patterns = [art.artifact_id.encode(), fingerprint_bytes(art.fingerprint),
                    fingerprint_bytes(normalised_fingerprint(art.fingerprint, art.inv_norm))]
        for file in (p for p in path.rglob("*") if p.is_file()):
            assert not any(offsets(file, p) for p in patterns), (art.artifact_id, file)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    again = chromadb.PersistentClient(path=str(path)).get_collection("docs").get(
        ids=[f"bob-chunk-{i:04d}" for i in range(160)], include=["documents", "metadatas"])
    assert again["ids"] == survivors["ids"] and again["documents"] == survivors["documents"]
    assert again["metadatas"] == survivors["metadatas"]


def test_every_pages_free_space_is_zeroed_and_the_file_reads_the_same(tmp_path):
    """``zero_all_free_space`` on a file a client with ``secure_delete`` off deleted and rewrote rows in:
    every deleted row's bytes go (in pages still in use and on the freelist), every live row stays, and a
    second pass finds nothing left to write."""
    db = table_file(tmp_path / "t.sqlite3", rows=2000)
    erased = list(range(300, 1300)) + [5, 1999]
    delete_without_secure_delete(db, erased)
    before = rows(db)
    left = [i for i in erased if offsets(db, marker(i))]
    assert len(left) > 500, len(left)  # control: the deletes left most of the rows' bytes
    first = inplace.zero_all_free_space(db)
    assert first["pages_written"] > 0 and first["free_pages"] > 0
    assert not any(offsets(db, marker(i)) for i in erased)
    assert rows(db) == before
    assert inplace.zero_all_free_space(db)["pages_written"] == 0


def messy_file(path: Path) -> tuple[Path, list[int]]:
    """A file a client with ``secure_delete`` off filled, then deleted and rewrote rows in: freeblocks and
    gaps left in pages still in use, pages on the freelist, rows large enough to spill onto overflow pages,
    an index b-tree beside the table's. Returns the file and the ids whose marked bytes should go."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA secure_delete=OFF")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    conn.execute("CREATE INDEX t_body ON t(substr(body, 1, 24))")
    big = [7, 77, 777]  # past a page: the rest of the row lies on overflow pages
    conn.executemany("INSERT INTO t VALUES (?, ?)",
                     [(i, marker(i) + os.urandom(9000 if i in big else 40 + i % 90)) for i in range(1500)])
    erased = [i for i in range(1500) if i % 7 == 3] + list(range(600, 900)) + [77]
    conn.executemany("DELETE FROM t WHERE id = ?", [(i,) for i in erased])
    rewritten = list(range(1000, 1040))  # rewritten shorter: the old row's bytes are left behind
    conn.executemany("UPDATE t SET body = ? WHERE id = ?", [(b"short-%04d" % i, i) for i in rewritten])
    conn.close()
    return path, erased + rewritten


def free_bytes_left(path: Path) -> int:
    """Bytes other than zero in the free space of the file's pages, each page parsed on its own with the
    page parser ``zero_freed_space`` uses (b-tree pages: the gap and the freeblocks; freelist pages: past
    their list): what the whole-file pass, which sorts pages out in bulk, must leave at zero."""
    data = path.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    pages = len(data) // page_size
    free, trunk = {}, int.from_bytes(data[32:36], "big")
    while trunk:
        page = data[(trunk - 1) * page_size:trunk * page_size]
        leaves = int.from_bytes(page[4:8], "big")
        free[trunk] = 8 + 4 * leaves
        for k in range(leaves):
            free[int.from_bytes(page[8 + 4 * k:12 + 4 * k], "big")] = 0
        trunk = int.from_bytes(page[:4], "big")
    left = 0
    for number in range(1, pages + 1):
        page = data[(number - 1) * page_size:number * page_size]
        if number in free:
            regions = [(free[number], page_size)]
        elif page[100 if number == 1 else 0] in (0x02, 0x05, 0x0A, 0x0D):
            regions = inplace._free_regions(page, number, page_size)
            assert regions is not None, number
        else:
            continue
        left += sum(b - a - page.count(0, a, b) for a, b in regions)
    return left


@pytest.mark.parametrize("batch", [1, 3, 64, 4096])
def test_the_whole_file_pass_leaves_no_free_byte_and_no_row_changed_whatever_its_batch(tmp_path, batch):
    """The pass reads ``batch`` pages at a time and sorts them out in bulk; each page parsed on its own
    afterwards holds nothing in its free space, every live row (overflow pages included) reads the same,
    and the bytes written are the same whatever the batch."""
    db, erased = messy_file(tmp_path / "t.sqlite3")
    other = tmp_path / "copy.sqlite3"
    other.write_bytes(db.read_bytes())
    before = rows(db)
    assert free_bytes_left(db) > 0  # control: the deletes and rewrites left bytes in free space
    assert sum(1 for i in erased if offsets(db, marker(i))) > 100
    counts = inplace.zero_all_free_space(db, batch=batch)
    assert counts is not None and counts["pages_written"] > 0 and counts["free_pages"] > 0
    assert counts["overflow_pages"] > 0 and counts["btree_pages"] + counts["free_pages"] + counts["overflow_pages"] == counts["pages"]
    assert free_bytes_left(db) == 0
    assert not any(offsets(db, marker(i)) for i in erased)
    assert all(offsets(db, marker(i)) for i in (0, 1, 7, 1499))  # survivors, one (7) with overflow pages
    assert rows(db) == before
    # the same file before the pass, in one batch: the same bytes written
    assert inplace.zero_all_free_space(other, batch=1 << 20)["pages_written"] == counts["pages_written"]
    assert other.read_bytes() == db.read_bytes()
    # single rows deleted from the middle of pages, now that every gap is zero: freeblocks that hold the
    # rows' bytes, in pages whose gap holds nothing
    scattered = [i for i in range(0, 600, 5) if i % 7 != 3 and i not in (0, 1)]
    delete_without_secure_delete(db, scattered)
    assert sum(1 for i in scattered if offsets(db, marker(i))) > 50  # control
    assert inplace.zero_all_free_space(db, batch=batch)["pages_written"] > 0
    assert free_bytes_left(db) == 0 and not any(offsets(db, marker(i)) for i in scattered)
    assert rows(db) == {i: body for i, body in before.items() if i not in scattered}


@pytest.mark.parametrize("lie", ["cell count past the page", "freeblock past the page", "freeblock loop",
                                 "cell pointer into the gap"])
def test_the_whole_file_pass_refuses_a_page_that_does_not_hold_together_and_writes_nothing(tmp_path, lie):
    db, _ = messy_file(tmp_path / "t.sqlite3")
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    # a leaf page of the table with a freeblock and bytes in its gap (the deletes left both)
    number = next(n for n in range(2, len(data) // page_size + 1)
                  if data[(n - 1) * page_size] == 0x0D and int.from_bytes(data[(n - 1) * page_size + 1:(n - 1) * page_size + 3], "big")
                  and int.from_bytes(data[(n - 1) * page_size + 3:(n - 1) * page_size + 5], "big") >= 2)
    at = (number - 1) * page_size
    first_block = int.from_bytes(data[at + 1:at + 3], "big")
    if lie == "cell count past the page":
        data[at + 3:at + 5] = (page_size // 2).to_bytes(2, "big")
    elif lie == "freeblock past the page":
        data[at + 1:at + 3] = (page_size - 2).to_bytes(2, "big")
    elif lie == "freeblock loop":
        data[at + first_block:at + first_block + 2] = first_block.to_bytes(2, "big")
    else:
        cells = int.from_bytes(data[at + 3:at + 5], "big")
        gap = 8 + 2 * cells
        data[at + gap:at + gap + 4] = b"\xffGAP"  # something in the gap, so the page would be written
        data[at + 8:at + 10] = (gap + 1).to_bytes(2, "big")
    db.write_bytes(bytes(data))
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    assert inplace.zero_all_free_space(db) is None
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
