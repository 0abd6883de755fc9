"""Mem0 on Qdrant local mode and its SQLite history db, for real (no hosted LLM: memories are added with
``infer=False``, or inferred by an offline stand-in): the conformance suite, the control (Mem0's own
``delete_all`` leaves the user's text in the history db, where the probes and an independent byte scan find it),
erasures through ``TombstoneMemory`` and ``tombstone erase`` that end VERIFIED(physical), bad input."""

from __future__ import annotations

import contextlib
import errno
import json
import sqlite3
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("mem0")

from tombstone import Tombstone, init_deployment  # noqa: E402
from tombstone.capture import HashingEmbedder  # noqa: E402
from tombstone.errors import StoreUnavailableError  # noqa: E402
from tombstone.testing import AdapterConformance, ConformanceEnv  # noqa: E402
from tombstone_adapters.mem0 import Mem0Adapter, TombstoneMemory  # noqa: E402
from tombstone_adapters.qdrant.local import close_local_clients  # noqa: E402

from support import FrozenClock, raising_stub  # noqa: E402

DIM = 32


def independent_scan(directory: Path, needle: bytes) -> list[str]:
    """A byte scan written without any Tombstone code: which files under ``directory`` hold ``needle``."""
    return sorted(p.name for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.fixture
def mtomb(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"memories": {
        "backend": "mem0", "path": "stores/mem0/qdrant", "collection": "memories",
        "history_path": "stores/mem0/history.db"}})
    with Tombstone(config, clock=FrozenClock()) as tomb:
        yield tomb
    close_local_clients()


@pytest.fixture
def memory(mtomb):
    with TombstoneMemory(mtomb, "memories", embedder=HashingEmbedder(DIM)) as m:
        yield m


def history_rows(tomb) -> list[tuple]:
    path = tomb.config.stores["memories"].options["history_path"]
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT memory_id, old_memory, new_memory, event FROM history").fetchall()
    finally:
        conn.close()


def verified(receipt: dict) -> int:
    """How many artifacts the receipt lists, all VERIFIED (physical) — or -1 where any is not."""
    arts = receipt["artifacts"]
    return len(arts) if all(a["status"] == "VERIFIED" and a["level"] == "physical" for a in arts) else -1


def folder(tomb) -> Path:
    return Path(tomb.config.stores["memories"].options["history_path"]).parent


def remember(memory, user: str, n: int, start: int = 0) -> list[str]:
    added = memory.add([{"role": "user", "content": f"{user} private fact number {start + i}: lives at {start + i}"
                                                     f" Rose Lane, account {user}-{start + i:04d}"}
                        for i in range(n)], user_id=user)
    return [r["id"] for r in added["results"]]


class TestMem0Conformance(AdapterConformance):
    @pytest.fixture
    def conformance_env(self, mtomb, memory):
        counter = iter(range(10_000))

        def write_arts(subject: str, n: int):
            ids = remember(memory, subject, n, start=100 * next(counter))
            return [mtomb.lineage.artifact("memories", i) for i in ids]

        adapter = Mem0Adapter("memories", mtomb.config.stores["memories"].options)
        adapter.content_key = mtomb.secret.content_key  # as the deployment opens it

        def survivors():
            found = []
            for user in ("alice", "bob", "carol", "dave", "erin", "s1", "s2", "survivor", "victim"):
                found += [(m["id"], m["memory"]) for m in memory.get_all(filters={"user_id": user})["results"]]
            return sorted(found)

        def visible(ids):
            return {i for i in ids if memory.get(i) is not None}

        @contextlib.contextmanager
        def vendor_failure():
            """Local mode's storage and the history db fail (sqlite3.OperationalError) on every call; the
            physical probe's listing of the files fails too (EIO)."""
            local = adapter.client._client
            unreadable = OSError(errno.EIO, "injected: Input/output error", str(adapter.path))
            broken = sqlite3.OperationalError("injected: disk I/O error")
            with mock.patch.object(adapter.client, "_client", raising_stub(local, broken)), \
                    mock.patch("tombstone_adapters.mem0.history.sqlite3.connect", side_effect=broken), \
                    mock.patch.object(adapter, "physical_files", side_effect=unreadable):
                yield

        # Mem0's own delete leaves the memory's history rows, which its history() returns
        return ConformanceEnv(adapter=adapter, write=write_arts, survivors=survivors, visible=visible,
                              vendor_failure=vendor_failure, native_delete_hides=False)


def test_mem0s_own_delete_all_leaves_the_text_in_its_history_and_the_erasure_removes_it(mtomb, memory):
    """The control: Mem0's ``delete_all`` removes the points but its history db keeps every deleted memory's
    text and id, where the logical probe (the history rows), the physical probe and an independent byte scan
    all find them. ``tombstone erase`` afterwards purges them: VERIFIED(physical), and the scan finds nothing,
    while another user's memory and history stay."""
    alice = remember(memory, "alice", 3)
    [bob] = remember(memory, "bob", 1)
    memory.mem0.delete_all(user_id="alice")  # Mem0's own delete, not Tombstone's
    assert memory.get_all(filters={"user_id": "alice"})["results"] == []
    texts = {r[1] for r in history_rows(mtomb) if r[3] == "DELETE"}
    assert len(texts) == 3 and all("alice private fact" in t for t in texts)
    assert independent_scan(folder(mtomb), b"alice private fact number 1") == ["history.db"]
    adapter = Mem0Adapter("memories", mtomb.config.stores["memories"].options)
    adapter.content_key = mtomb.secret.content_key
    arts = [mtomb.lineage.artifact("memories", i) for i in alice]
    logical = adapter.probe_logical(arts)
    assert all(not r.passed and "history(memory_id)" in r.evidence["returned_by"]
               and "history(text)" in r.evidence["returned_by"] for r in logical.values())
    assert not any(r.passed for r in adapter.probe_physical(arts).values())
    adapter.close()

    receipt, _ = mtomb.erase("alice")
    assert {(a["artifact_id"], a["status"], a["level"]) for a in receipt["artifacts"]} == \
        {(i, "VERIFIED", "physical") for i in alice}
    for aid in alice:
        assert independent_scan(folder(mtomb), aid.encode()) == []
    assert independent_scan(folder(mtomb), b"alice private fact") == []
    assert independent_scan(folder(mtomb), b"Rose Lane, account alice") == []
    assert [r[0] for r in history_rows(mtomb)] == [bob]
    assert [m["id"] for m in memory.get_all(filters={"user_id": "bob"})["results"]] == [bob]


def test_delete_all_through_tombstone_memory_erases_with_a_receipt(mtomb, memory):
    alice = remember(memory, "alice", 4)
    remember(memory, "bob", 2)
    hits = memory.search("private fact Rose Lane", filters={"user_id": "alice"})["results"]
    assert {h["id"] for h in hits} <= set(alice) and hits
    assert "tombstone_id" not in json.dumps(hits)  # the lineage key in the payload is Tombstone's, not the app's
    memory.delete_all(user_id="alice")
    [(receipt, path)] = memory.receipts
    assert path.is_file() and verified(receipt) == 4
    assert memory.search("private fact Rose Lane", filters={"user_id": "alice"})["results"] == []
    assert not [r for r in history_rows(mtomb) if r[0] in alice]
    assert independent_scan(folder(mtomb), b"alice private fact") == []
    assert len(memory.get_all(filters={"user_id": "bob"})["results"]) == 2
    # one memory, by id, with a receipt of its own
    [bob1, _] = [m["id"] for m in memory.get_all(filters={"user_id": "bob"})["results"]]
    memory.delete(bob1)
    assert verified(memory.receipts[-1][0]) == 1
    with pytest.raises(ValueError, match="not found"):
        memory.delete(bob1)


def test_an_updated_memory_is_erased_with_every_text_it_had(mtomb, memory):
    [aid] = remember(memory, "alice", 1)
    memory.update(aid, "alice moved to 99 Elm Street")
    assert memory.get(aid)["memory"] == "alice moved to 99 Elm Street"
    assert {r[3] for r in history_rows(mtomb)} == {"ADD", "UPDATE"}
    receipt, _ = mtomb.erase("alice")
    assert verified(receipt) == 1
    assert history_rows(mtomb) == []
    assert independent_scan(folder(mtomb), b"Elm Street") == []
    assert independent_scan(folder(mtomb), b"alice private fact") == []


def test_inferred_memories_and_the_session_messages_mem0_keeps_are_erased(mtomb):
    """An offline stand-in for the LLM: Mem0 infers memories and keeps the session's messages (their content)
    in its history db; both are recorded and erased."""

    class StandIn:
        def generate_response(self, messages, **kwargs):
            return json.dumps({"memory": [{"text": "alice is allergic to penicillin"}]})

    with TombstoneMemory(mtomb, "memories", embedder=HashingEmbedder(DIM), llm=StandIn()) as memory:
        memory.add([{"role": "user", "content": "note for the doctor: alice reacts badly to penicillin"}],
                   user_id="alice", infer=True)
        memory.add([{"role": "user", "content": "bob has no allergies"}], user_id="bob", infer=False)
        assert independent_scan(folder(mtomb), b"reacts badly to penicillin") == ["history.db"]
        kinds = sorted(a.kind for a in mtomb.lineage.artifacts_for(mtomb.lineage.subject_key("alice")))
        assert kinds == ["message", "vector"]
        receipt, _ = mtomb.erase("alice")
        assert verified(receipt) == 2
        assert independent_scan(folder(mtomb), b"penicillin") == []
        assert memory.get_all(filters={"user_id": "bob"})["results"]


def test_a_memory_without_a_user_is_refused_and_nothing_is_written(mtomb, memory):
    with pytest.raises(ValueError, match="needs user_id"):
        memory.add("an unowned fact", user_id="")
    with pytest.raises(ValueError, match="needs a user_id"):
        memory.mem0.add("an agent's fact", agent_id="helper", infer=False)
    assert history_rows(mtomb) == []


def test_a_history_db_that_is_not_sqlite_is_refused_before_anything_changes(tmp_path):
    from click.testing import CliRunner

    from tombstone.cli import main

    root = tmp_path / "deploy"
    config = init_deployment(root, {"memories": {"backend": "mem0", "path": "stores/mem0/qdrant",
                                                 "collection": "memories", "history_path": "stores/mem0/history.db"}})
    with Tombstone(config, clock=FrozenClock()) as tomb:
        with TombstoneMemory(tomb, "memories", embedder=HashingEmbedder(DIM)) as memory:
            [aid] = remember(memory, "alice", 1)
    close_local_clients()
    history = Path(config.stores["memories"].options["history_path"])
    history.rename(history.with_suffix(".real"))
    history.write_text("not a database")
    before = {p: p.read_bytes() for p in (root / "stores").rglob("*") if p.is_file()}
    result = CliRunner().invoke(main, ["erase", "alice", "--config", str(root / "tombstone.toml")])
    err = result.stderr.strip()
    assert result.exit_code == 2 and "is not a SQLite file" in err and len(err.splitlines()) == 1
    assert {p: p.read_bytes() for p in (root / "stores").rglob("*") if p.is_file()} == before
    with pytest.raises(StoreUnavailableError, match="not a SQLite file"):
        Mem0Adapter("memories", config.stores["memories"].options)
    assert aid


def test_the_readme_example_runs_as_written(tmp_path):
    from support import run_readme_example

    namespace = run_readme_example("TombstoneMemory", tmp_path, close_local_clients)
    assert verified(namespace["receipt"]) == 1 and namespace["path"].is_file()
    assert independent_scan(tmp_path / "agent" / "stores", b"Mill Road") == []
