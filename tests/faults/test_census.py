"""The survivor census (``tombstone.testing.census``) is able to fail: a row deleted or changed behind its
back, a vector moved, a record its own vector no longer finds are each reported; an erased record and a
survivor that shared an erased record's content are not. The disk-fault harness's count of VERIFIED claims
``tombstone audit`` does not confirm is able to fail too."""

from __future__ import annotations

import sqlite3

import numpy as np

from tombstone import init_deployment
from tombstone.testing.census import Entry, census, compare, count, unsearchable
from tombstone.testing.diskfaults import audit_disagreements

from support import write_docs


def test_docstore_row_lost_or_changed_is_reported(tomb):
    alice = write_docs(tomb, "alice", 2)
    bob = write_docs(tomb, "bob", 3)
    path = tomb.config.path
    before = census(path)
    assert count(before) == 5
    assert compare(before, census(path), set()) == []
    db = sqlite3.connect(tomb.config.stores["docs"].options["path"])
    with db:
        db.execute("DELETE FROM documents WHERE id IN (?, ?)", (alice[0], bob[0]))
        db.execute("UPDATE documents SET text = 'changed' WHERE id = ?", (bob[1],))
    db.close()
    problems = compare(before, census(path), {("docs", alice[0])})
    assert problems == sorted([f"docs/{bob[0]}: lost", f"docs/{bob[1]}: content changed"])


def test_vectors_and_content_shared_with_an_erased_record():
    before = {"s": {"a": Entry("d1", (1.0, 0.0)), "b": Entry("d2", (0.0, 1.0)),
                    "shard:x": Entry("w1"), "shard:y": Entry("w1"), "other:z": Entry("w2")}}
    after = {"s": {"a": Entry("d1", (1.0, 1e-7)), "b": Entry("d2", (0.0, 0.9)),
                   "shard:y": Entry("w3"), "other:z": Entry("w4")}}
    assert compare(before, after, {("s", "shard:x")}) == ["s/b: vector changed", "s/other:z: content changed"]


def test_a_record_its_own_vector_does_not_find_is_reported(tmp_path):
    import chromadb

    config = init_deployment(tmp_path / "d", {"vec": {"backend": "chroma", "path": "stores/vec", "collection": "chunks"}})
    path = config.stores["vec"].options["path"]
    client = chromadb.PersistentClient(path=path)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    client.create_collection("chunks", metadata={"hnsw:space": "l2"}, embedding_function=None).add(
        ids=[f"r{i}" for i in range(6)], embeddings=vectors.tolist(), documents=[f"doc {i}" for i in range(6)])
    chromadb.api.client.SharedSystemClient.clear_system_cache()
    now = census(config.path)
    assert count(now) == 6 and unsearchable(config.path, now) == []
    moved = dict(now["vec"])
    moved["r0"] = Entry(moved["r0"].digest, tuple(-10.0 * vectors[0]))  # a vector the store does not hold
    assert unsearchable(config.path, {"vec": moved}, k=1) == ["vec/r0: not found by a search with its own vector"]


def test_a_verified_claim_the_final_files_contradict_is_counted(tomb):
    alice = write_docs(tomb, "alice", 2)
    write_docs(tomb, "bob", 1)
    receipt, path = tomb.erase("alice")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert audit_disagreements(tomb.config.path, path) == 0
    db = sqlite3.connect(tomb.config.stores["docs"].options["path"])
    with db:  # the erased document back in the final files
        db.execute("INSERT INTO documents (id, text, metadata) VALUES (?, 'back again', '{}')", (alice[0],))
    db.close()
    assert audit_disagreements(tomb.config.path, path) >= 1
