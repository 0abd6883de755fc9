"""Chroma's full-text index in the in-place reclaim: FTS5 secure-delete turned on with one merge of the whole
index, then deletes in place. Checked against an index built afresh, outside Tombstone, from the surviving
documents alone: after a merge the store's index pages equal that index's, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from test_chroma import chroma_deploy, ctomb, store_dir, wrapper, write  # noqa: F401 - fixtures

apsw = pytest.importorskip("apsw")

from tombstone_adapters.chroma import fulltext  # noqa: E402

ALPHABET = [chr(c) for c in range(0x4E00, 0x4E00 + 400)]  # every document's trigrams its own
T = fulltext.TABLE


def unique_text(seed: int) -> str:
    return "".join(np.random.default_rng(seed).choice(ALPHABET, 48))


def db(tomb):
    return apsw.Connection(str(store_dir(tomb) / "chroma.sqlite3"))


def leaves(conn, table: str = T) -> list[bytes]:
    return [blk for (blk,) in conn.execute(f"SELECT block FROM {table}_data WHERE id > 10 ORDER BY id")]


def survivors_index(tomb) -> list[bytes]:
    """The leaf pages of a trigram FTS5 index built in memory from the documents the store still holds (its
    content table), under the same rowids, then merged: what the index holds when nothing erased is left."""
    conn = db(tomb)
    try:
        rows = list(conn.execute(f"SELECT id, c0 FROM {T}_content ORDER BY id"))
    finally:
        conn.close()
    fresh = apsw.Connection(":memory:")
    fresh.execute("CREATE VIRTUAL TABLE f USING fts5(string_value, tokenize='trigram')")
    for rowid, doc in rows:
        fresh.execute("INSERT INTO f(rowid, string_value) VALUES (?, ?)", (rowid, doc))
    fresh.execute("INSERT INTO f(f) VALUES ('optimize')")
    return leaves(fresh, "f")


def index_size(tomb) -> tuple[int, int]:
    conn = db(tomb)
    try:
        return tuple(conn.execute(f"SELECT count(*), sum(length(block)) FROM {T}_data").fetchone())
    finally:
        conn.close()


def config(tomb) -> dict:
    conn = db(tomb)
    try:
        return dict(conn.execute(f"SELECT k, v FROM {T}_config"))
    finally:
        conn.close()


def reclaim_evidence(receipt) -> dict:
    assert receipt["summary"]["VERIFIED"] == len(receipt["artifacts"]) and not receipt["summary"]["RESIDUAL"]
    return receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]


def filler(tomb, n: int = 200) -> None:
    """Documents of a subject no test erases: enough that one small subject is under a fortieth of the index
    (a reclaim that deletes more merges the index instead: fulltext.MERGE_AT)."""
    write(tomb, "filler", n, texts=[unique_text(10_000 + i) for i in range(n)])


def test_the_reclaim_turns_secure_delete_on_once_and_then_deletes_in_place(ctomb):
    docs = {s: [unique_text(100 * n + i) for i in range(3)] for n, s in enumerate(("alice", "bob", "carol", "dave"))}
    for subject, texts in docs.items():
        write(ctomb, subject, 3, texts=texts)
    filler(ctomb)
    # control: Chroma's own delete records the deletes as new entries; the old ones stay, and the index grows
    before = index_size(ctomb)
    wrapper(ctomb).collection.delete(ids=[f"carol-chunk-{i:05d}" for i in range(3)])
    after = index_size(ctomb)
    assert after[1] > before[1]
    conn = db(ctomb)
    assert leaves(conn) != survivors_index(ctomb), "control: the index is not one of the survivors alone"
    conn.close()

    first = reclaim_evidence(ctomb.erase("alice")[0])
    assert first["mechanism"] == "in-place" and first["fulltext_merged"] and not first["fulltext_secure_delete"]
    assert config(ctomb).get("secure-delete") == 1 and (store_dir(ctomb) / fulltext.MARKER).is_file()
    conn = db(ctomb)
    assert leaves(conn) == survivors_index(ctomb), "merged: exactly the index of the survivors (carol's gone too)"
    conn.close()

    before = index_size(ctomb)
    second = reclaim_evidence(ctomb.erase("bob")[0])
    assert second["fulltext_secure_delete"] and not second["fulltext_merged"], "deleted in place, not merged"
    after = index_size(ctomb)
    assert after[0] <= before[0] and after[1] < before[1], "entries taken out where they lay, none added"
    # Chroma's own client still reads, searches and deletes (its SQLite honours secure-delete)
    col = wrapper(ctomb).collection
    assert col.get(where_document={"$contains": docs["dave"][1][10:20]})["ids"] == ["dave-chunk-00001"]
    assert col.get(where_document={"$contains": docs["bob"][0][10:20]})["ids"] == []
    size = index_size(ctomb)
    col.delete(ids=["dave-chunk-00002"])
    assert index_size(ctomb)[1] < size[1], "Chroma's own delete now takes its entries out too"
    assert col.count() == 2 + 200  # dave's two left, and the filler


def test_a_table_with_secure_delete_but_no_marker_is_merged(ctomb):
    """secure-delete turned on by someone else after deletes that left entries behind: without the marker the
    reclaim does not trust it and merges the whole index."""
    docs = {s: [unique_text(500 + 10 * n + i) for i in range(2)] for n, s in enumerate(("erin", "frank", "gus"))}
    for subject, texts in docs.items():
        write(ctomb, subject, 2, texts=texts)
    wrapper(ctomb).collection.delete(ids=["frank-chunk-00000", "frank-chunk-00001"])
    conn = db(ctomb)
    conn.execute(f"INSERT INTO {T}({T}, rank) VALUES ('secure-delete', 1)")
    conn.close()
    evidence = reclaim_evidence(ctomb.erase("erin")[0])
    assert evidence["fulltext_merged"] and not evidence["fulltext_secure_delete"]
    conn = db(ctomb)
    assert leaves(conn) == survivors_index(ctomb)
    conn.close()


def test_a_folder_at_the_marker_path_costs_a_merge_next_time_not_the_erasure(ctomb):
    """The marker cannot be written (a folder holds its name): the merge stands, the erasure is VERIFIED and its
    evidence says why the marker is missing; the next reclaim, finding no marker, merges again."""
    docs = {s: [unique_text(900 + 10 * n + i) for i in range(2)] for n, s in enumerate(("hal", "ivy", "jo"))}
    for subject, texts in docs.items():
        write(ctomb, subject, 2, texts=texts)
    (store_dir(ctomb) / fulltext.MARKER).mkdir()
    first = reclaim_evidence(ctomb.erase("hal")[0])
    assert first["fulltext_merged"] and "not written" in first["fulltext_marker"]
    assert config(ctomb).get("secure-delete") == 1
    conn = db(ctomb)
    assert leaves(conn) == survivors_index(ctomb)
    conn.close()
    second = reclaim_evidence(ctomb.erase("ivy")[0])
    assert second["fulltext_merged"] and not second["fulltext_secure_delete"], "no marker: merged again"
    (store_dir(ctomb) / fulltext.MARKER).rmdir()
    third = reclaim_evidence(ctomb.erase("jo")[0])
    assert third["fulltext_merged"] and "fulltext_marker" not in third, "the marker written once the path is free"
    assert (store_dir(ctomb) / fulltext.MARKER).is_file()


def test_a_reclaim_of_a_fortieth_of_the_index_or_more_merges_it_instead(ctomb, monkeypatch):
    """Deleting many documents in place costs more than one merge of the index: such a reclaim turns
    secure-delete off in its delete's transaction, merges, and turns it on again. Killed between the two, the
    table is not 'settled', so the resumed reclaim merges; the index is the survivors' either way."""
    from tombstone_adapters.chroma import inplace

    write(ctomb, "kim", 2, texts=[unique_text(7000 + i) for i in range(2)])
    write(ctomb, "lou", 2, texts=[unique_text(7100 + i) for i in range(2)])
    write(ctomb, "big", 12, texts=[unique_text(7200 + i) for i in range(12)])
    write(ctomb, "max", 12, texts=[unique_text(7300 + i) for i in range(12)])
    filler(ctomb)
    first = reclaim_evidence(ctomb.erase("kim")[0])
    assert first["fulltext_merged"] and config(ctomb).get("secure-delete") == 1  # settled from here on
    small = reclaim_evidence(ctomb.erase("lou")[0])
    assert small["fulltext_secure_delete"] and not small["fulltext_merged"], "2 of 226: deleted in place"
    assert 12 * fulltext.MERGE_AT >= fulltext.documents(db(ctomb))
    big = reclaim_evidence(ctomb.erase("big")[0])
    assert big["fulltext_merged"] and not big["fulltext_secure_delete"], "12 of 224: merged instead"
    assert "merge cost less" in " ".join(big["steps"])
    assert config(ctomb).get("secure-delete") == 1
    conn = db(ctomb)
    assert leaves(conn) == survivors_index(ctomb)
    conn.close()

    real = inplace.erase_slots
    monkeypatch.setattr(inplace, "erase_slots", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        ctomb.erase("max")
    assert config(ctomb).get("secure-delete") == 0, "the deletes committed with the option off, not yet merged"
    monkeypatch.setattr(inplace, "erase_slots", real)
    (receipt, _), = ctomb.resume()
    resumed = reclaim_evidence(receipt)
    assert resumed["fulltext_merged"] and not resumed["fulltext_secure_delete"]
    assert config(ctomb).get("secure-delete") == 1
    conn = db(ctomb)
    assert leaves(conn) == survivors_index(ctomb), "nothing of the deleted documents left in the index"
    conn.close()
