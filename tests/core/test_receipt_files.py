"""Receipt files are never lost: subjects never share a file, a second erasure never overwrites the first
receipt, a resumed saga rewrites its own file, and --out never overwrites a sealed receipt."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest

from tombstone.keys import LineageSecret, PUBLIC_KEY, load_public_key
from tombstone.receipt import load_receipt, verify
from tombstone.testing.crash import cli

from support import write_docs


def receipt_files(tomb) -> list[Path]:
    return sorted(tomb.config.receipts_dir.glob("*.json"))


def verified(tomb, path: Path) -> dict:
    data = load_receipt(path)
    verify(data, load_public_key(tomb.config.keys_dir / PUBLIC_KEY))
    return data


def test_subjects_whose_readable_names_collide_get_two_files(tomb):
    write_docs(tomb, "Zoë/ü", 1, prefix="zoe-u")
    write_docs(tomb, "Zoé:ä", 1, prefix="zoe-a")
    first, first_path = tomb.erase("Zoë/ü")
    second, second_path = tomb.erase("Zoé:ä")
    assert first_path != second_path
    assert receipt_files(tomb) == sorted([first_path, second_path])
    assert verified(tomb, first_path)["subject"] == "Zoë/ü"
    assert verified(tomb, second_path)["subject"] == "Zoé:ä"
    assert first_path.name.startswith("Zoe_u+") and second_path.name.startswith("Zoe_a+")


def test_the_hash_in_a_file_name_is_keyed():
    from tombstone.receipt.files import receipt_file_name

    subject = "Zoë/ü"
    one = receipt_file_name(subject, LineageSecret(b"a" * 32).file_tag)
    other = receipt_file_name(subject, LineageSecret(b"b" * 32).file_tag)
    assert one != other  # without the secret, nobody can check a guessed subject against a file name
    tag = one.removesuffix(".json").rsplit("+", 1)[1]
    for digest in (hashlib.sha256, hashlib.sha1, hashlib.md5):
        assert tag not in digest(subject.encode()).hexdigest()


def test_a_subject_of_safe_characters_keeps_its_name():
    from tombstone.receipt.files import receipt_file_name

    secret = LineageSecret(b"a" * 32)
    assert receipt_file_name("user-0001", secret.file_tag) == "user-0001.json"
    assert receipt_file_name("alice@example.com", secret.file_tag) == "alice@example.com.json"
    assert "+" in receipt_file_name("a b", secret.file_tag)
    assert "+" in receipt_file_name("x" * 121, secret.file_tag)  # too long to be a file name as it is


def test_erasing_a_subject_twice_keeps_both_receipts(tomb):
    write_docs(tomb, "alice", 2)
    first, first_path = tomb.erase("alice")
    kept = first_path.read_bytes()
    second, second_path = tomb.erase("alice")
    assert first_path.name == "alice.json" and second_path.name == "alice.2.json"
    assert first_path.read_bytes() == kept
    assert verified(tomb, first_path)["saga_id"] == first["saga_id"]
    assert verified(tomb, second_path)["saga_id"] == second["saga_id"]
    assert (first["sequence"], second["sequence"]) == (1, 2)
    assert receipt_files(tomb) == sorted([first_path, second_path])


def test_a_file_already_at_the_default_name_is_not_overwritten(tomb):
    write_docs(tomb, "alice", 1)
    tomb.config.receipts_dir.mkdir(parents=True, exist_ok=True)
    notes = tomb.config.receipts_dir / "alice.json"
    notes.write_text("the operator's own notes\n")
    _, path = tomb.erase("alice")
    assert path.name == "alice.2.json"
    assert notes.read_text() == "the operator's own notes\n"


def test_the_file_is_chosen_when_the_saga_is_created(tomb):
    write_docs(tomb, "alice", 1)
    write_docs(tomb, "bob", 1)
    from tombstone.saga import Saga

    saga = Saga.start(tomb, "alice")
    try:
        assert tomb.lineage.saga(saga.saga_id)["out_path"] == "alice.json"
    finally:
        saga.lock.release()
    # Another saga that wants the same name while the first is unfinished gets the next one.
    from tombstone.saga.engine import free_receipt_path

    assert free_receipt_path(tomb.context, tomb.config.receipts_dir / "alice.json", "another").name == "alice.2.json"
    # names are compared as a case-insensitive file system would (only names that could collide are read)
    assert free_receipt_path(tomb.context, tomb.config.receipts_dir / "ALICE.json", "another").name == "ALICE.2.json"
    assert free_receipt_path(tomb.context, tomb.config.receipts_dir / "bob.json", "another").name == "bob.json"


def test_a_batch_reads_the_files_unfinished_sagas_chose_once_and_gives_each_saga_its_own(tomb, monkeypatch):
    """A batch's new sagas choose their files against those of every unfinished saga (one left running by an
    earlier erasure, and each chosen earlier in the same batch), reading the unfinished sagas' files once for
    the batch rather than once per saga (a batch of n subjects read n times n rows)."""
    from tombstone.lineage.db import LineageDB
    from tombstone.saga import Saga

    for subject, prefix in (("alice", "a-low"), ("Alice", "a-up"), ("bob", "b"), ("carol", "c-low"), ("Carol", "c-up")):
        write_docs(tomb, subject, 1, prefix=prefix)
    waiting = Saga.start(tomb, "carol")  # unfinished: carol.json stays chosen
    reads = []
    real = LineageDB.running_out_paths
    monkeypatch.setattr(LineageDB, "running_out_paths", lambda self: reads.append(1) or real(self))
    try:
        done = tomb.erase_many(["alice", "Alice", "bob", "Carol"])
    finally:
        waiting.lock.release()
    assert len(reads) == 1
    names = [path.name for _, path in done]
    # alice and Alice share a name on a case-insensitive file system; Carol's is the unfinished carol saga's
    assert sorted(name.casefold() for name in names) == ["alice.2.json", "alice.json", "bob.json", "carol.2.json"]
    assert len({path for _, path in done}) == 4 and all(path.is_file() for _, path in done)
    assert [verified(tomb, path)["subject"] for _, path in done] == ["alice", "Alice", "bob", "Carol"]
    assert tomb.lineage.saga(waiting.saga_id)["out_path"] == "carol.json"


def test_an_unfinished_saga_recorded_with_a_file_outside_the_receipts_directory_stops_no_other_saga(tomb, tmp_path):
    """A lineage db whose unfinished saga records a receipt file that leaves the receipts directory (``../``,
    written into the db by hand): that saga refuses to write there, and other sagas still choose their files,
    the default one and one named with --out, without that one's error."""
    from tombstone.errors import SagaError
    from tombstone.saga import Saga
    from tombstone.saga.files import out_path_of

    write_docs(tomb, "carol", 1)
    write_docs(tomb, "bob", 1)
    write_docs(tomb, "dave", 1)
    waiting = Saga.start(tomb, "carol")
    try:
        with tomb.lineage.atomic() as conn:
            conn.execute("UPDATE sagas SET out_path = '../outside.json' WHERE saga_id = ?", (waiting.saga_id,))
        with pytest.raises(SagaError, match="not inside the receipts directory"):
            out_path_of(tomb.context, "../outside.json")
        _, default = tomb.erase("bob")
        _, named = tomb.erase("dave", out=tmp_path / "dave-receipt.json")
    finally:
        waiting.lock.release()
    assert default.name == "bob.json" and named == tmp_path / "dave-receipt.json"
    assert verified(tomb, default)["subject"] == "bob" and verified(tomb, named)["subject"] == "dave"
    assert not (tomb.config.receipts_dir.parent / "outside.json").exists()


@pytest.fixture
def deployed(tmp_path):
    root = tmp_path / "d"
    built = cli("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none")
    assert built.returncode == 0, built.stderr
    return root


def test_crash_between_file_and_chain_then_resume_leaves_one_file_per_saga(deployed):
    config = str(deployed / "tombstone.toml")
    first = cli("erase", "user-0001", "--config", config)
    assert first.returncode == 0, first.stderr
    first_bytes = (deployed / "receipts" / "user-0001.json").read_bytes()
    killed = cli("erase", "user-0001", "--config", config, env={"TOMBSTONE_KILL_AT": "saga:receipt:before-chain"})
    assert killed.returncode == -signal.SIGKILL
    unsealed = deployed / "receipts" / "user-0001.2.json"
    assert unsealed.is_file()  # written, not yet in the chain
    resumed = cli("resume", "--config", config)
    assert resumed.returncode == 0, resumed.stderr
    files = sorted((deployed / "receipts").iterdir())
    assert [f.name for f in files] == ["user-0001.2.json", "user-0001.json"]
    assert (deployed / "receipts" / "user-0001.json").read_bytes() == first_bytes
    sagas = [json.loads(f.read_bytes())["saga_id"] for f in files]
    assert len(set(sagas)) == 2  # one file for each saga, the resumed one rewritten in place
    checked = cli("receipt", "verify", str(unsealed), "--config", config)
    assert checked.returncode == 0, checked.stderr
    head = cli("receipt", "head", "--config", config).stdout.strip()
    assert head == f"2:{json.loads(unsealed.read_bytes())['receipt_hash']}"


def test_out_refuses_a_file_holding_a_sealed_receipt(deployed):
    config = str(deployed / "tombstone.toml")
    out = deployed / "kept.json"
    assert cli("erase", "user-0001", "--config", config, "--out", str(out)).returncode == 0
    kept = out.read_bytes()
    again = cli("erase", "user-0001", "--config", config, "--out", str(out))
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and again.stderr.startswith("error: ")
    assert "sealed receipt #1" in again.stderr and "Traceback" not in again.stderr
    assert out.read_bytes() == kept
    status = cli("status", "--config", config).stdout
    assert "running" not in status  # no saga was started
    fresh = cli("erase", "user-0001", "--config", config, "--out", str(deployed / "new.json"))
    assert fresh.returncode == 0, fresh.stderr


def test_a_saga_recorded_without_a_file_chooses_one_when_it_resumes(tomb):
    write_docs(tomb, "alice", 1)
    from tombstone.saga import Saga

    saga = Saga.start(tomb, "alice")
    saga.lock.release()
    with tomb.lineage.atomic() as conn:  # as a saga created by an earlier version left it
        conn.execute("UPDATE sagas SET out_path = NULL WHERE saga_id = ?", (saga.saga_id,))
    [(receipt, path)] = tomb.resume()
    assert path == tomb.config.receipts_dir / "alice.json" and receipt["saga_id"] == saga.saga_id
    assert receipt_files(tomb) == [path]


def test_continuing_a_crashed_saga_with_another_out_moves_its_receipt(deployed):
    config = str(deployed / "tombstone.toml")
    killed = cli("erase", "user-0001", "--config", config, env={"TOMBSTONE_KILL_AT": "saga:receipt:before-chain"})
    assert killed.returncode == -signal.SIGKILL
    assert (deployed / "receipts" / "user-0001.json").is_file()
    moved = cli("erase", "user-0001", "--config", config, "--out", str(deployed / "elsewhere.json"))
    assert moved.returncode == 0, moved.stderr
    assert list((deployed / "receipts").iterdir()) == []  # the unsealed copy of the same saga is gone
    assert cli("receipt", "verify", str(deployed / "elsewhere.json"), "--config", config).returncode == 0
