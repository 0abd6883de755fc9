"""Files beside a store's own files: a ``chroma.sqlite3.bak`` or ``docstore.db.bak`` in the store's directory, or
a copy in a sub-folder of it, still holds the erased ids after the erasure. The physical probe reads every
regular file under the store's directory, so such a copy makes the artifact RESIDUAL(physical) naming the
file, never VERIFIED(physical); an unrelated extra file leaves a clean erasure VERIFIED and is named as read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tombstone import Tombstone, init_deployment

pytestmark = pytest.mark.slow

SUBJECT = "user-0001"
OWN_FILE = {"docstore": "docstore.db", "chroma": "chroma.sqlite3", "faiss": "records.jsonl",
            "exact_cache": "llm_cache.db"}
"""The store's main file, in its directory: the one an operator copies aside."""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    from tombstone.demo import build_demo

    root = tmp_path_factory.mktemp("stray") / "demo"
    build_demo(root, ["docstore", "chroma", "faiss", "exact_cache"], 2)
    return root


@pytest.fixture
def demo(built, tmp_path) -> Path:
    target = tmp_path / "demo"
    shutil.copytree(built, target)
    return target


def store_dir(demo: Path, backend: str) -> Path:
    return demo / "stores" / backend


def artifact_ids(demo: Path, backend: str) -> list[str]:
    with Tombstone.open(demo / "tombstone.toml") as tomb:
        ids = [a.artifact_id for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(SUBJECT))
               if a.store == backend]
    assert ids
    return ids


def erase(demo: Path) -> dict:
    with Tombstone.open(demo / "tombstone.toml") as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    return receipt


def physical_detail(entry: dict) -> dict:
    [probe] = [p for p in entry["evidence"]["probes"] if p["level"] == "physical"]
    assert probe["ran"]
    return probe["detail"]


def holds(path: Path, ids: list[str]) -> list[str]:
    data = path.read_bytes()
    return [i for i in ids if i.encode() in data]


@pytest.mark.parametrize(("backend", "where"), [
    ("docstore", "beside"), ("docstore", "sub-folder"), ("chroma", "beside"), ("chroma", "sub-folder"),
    ("exact_cache", "beside"), ("faiss", "sub-folder"),  # a FAISS commit removes what lies beside its files
])
def test_a_copy_of_the_store_file_is_read_and_keeps_the_erasure_from_verifying(demo, backend, where):
    folder = store_dir(demo, backend)
    own = folder / OWN_FILE[backend]
    if where == "beside":
        copy = folder / f"{OWN_FILE[backend]}.bak"
    else:
        (folder / "backup").mkdir()
        copy = folder / "backup" / OWN_FILE[backend]
    shutil.copyfile(own, copy)
    label = str(copy.relative_to(folder))
    ids = artifact_ids(demo, backend)
    assert holds(copy, ids)  # the control: the copy holds the subject's ids before the erasure...

    receipt = erase(demo)

    assert holds(copy, ids)  # ...and after it: nothing erases a file the store does not use
    entries = [e for e in receipt["artifacts"] if e["store"] == backend]
    assert {e["artifact_id"] for e in entries} == set(ids)
    for entry in entries:
        status = (entry["status"], entry["level"])
        assert status != ("VERIFIED", "physical"), entry
        if entry["artifact_id"] in holds(copy, ids):
            assert entry["status"] == "RESIDUAL" and entry["level"] == "physical"
            assert label in entry["measurement"] and "not one of the store's files" in entry["measurement"]
            detail = physical_detail(entry)
            assert label in detail["other_files_scanned"] and detail["found_in_other_files"] == [label]
            assert detail["store_file_hits"] == 0  # the store's own files are clean: only the copy holds it


@pytest.mark.parametrize("backend", ["docstore", "chroma", "faiss", "exact_cache"])
def test_an_unrelated_extra_file_leaves_a_clean_store_verified(demo, backend):
    folder = store_dir(demo, backend)
    (folder / "README.txt").write_text("notes about this store, nothing of any subject\n")
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.md").write_text("rotate the logs\n")

    receipt = erase(demo)

    entries = [e for e in receipt["artifacts"] if e["store"] == backend]
    assert entries
    for entry in entries:
        assert (entry["status"], entry["level"]) == ("VERIFIED", "physical"), entry
        # (a FAISS commit removes what lies beside its own files: only the sub-folder's file is left there)
        named = {"notes/todo.md"} if backend == "faiss" else {"README.txt", "notes/todo.md"}
        assert named <= set(physical_detail(entry)["other_files_scanned"])


def docstore_in_the_deployment_root(tmp_path: Path):
    from support import write_docs
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "docs.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    with Tombstone(config) as tomb:
        ids = write_docs(tomb, SUBJECT, 3)
        write_docs(tomb, "user-0002", 2)
    return config, ids


def test_a_docstore_in_the_deployment_root_leaves_the_deployments_own_files_out(tmp_path):
    from support import write_docs

    config, ids = docstore_in_the_deployment_root(tmp_path)
    root = config.root
    with Tombstone(config) as tomb:
        receipt, path = tomb.erase(SUBJECT)
    assert path.parent == config.receipts_dir
    assert holds(config.lineage_db, ids)  # the lineage db keeps the ids, and is not the store's
    for entry in receipt["artifacts"]:
        assert (entry["status"], entry["level"]) == ("VERIFIED", "physical"), entry
        detail = physical_detail(entry)
        skipped = "\n".join(detail["not_scanned"])
        assert "lineage.db: the lineage db of tombstone.toml" in skipped
        assert "keys/: the keys of tombstone.toml" in skipped
        assert "locks/: the lineage locks of tombstone.toml" in skipped
        assert "tombstone.toml" in detail["other_files_scanned"]
    # a copy of the docstore beside it is still read, there as anywhere
    with Tombstone(config) as tomb:
        more = write_docs(tomb, SUBJECT, 2, prefix="again")
    shutil.copyfile(root / "docs.db", root / "docs.db.bak")
    assert holds(root / "docs.db.bak", more)
    with Tombstone(config) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    entries = {e["artifact_id"]: e for e in receipt["artifacts"]}
    detail = physical_detail(entries[more[0]])
    assert "receipts/: the receipts of tombstone.toml" in detail["not_scanned"]  # they name the erased ids
    assert not [label for label in detail["other_files_scanned"] if label.startswith(("receipts", "keys", "lineage"))]
    for aid in more:
        assert entries[aid]["status"] == "RESIDUAL" and "docs.db.bak" in entries[aid]["measurement"]
