"""Declared backups until they expire: the receipt lists each copy of a store with erased records and its
expiry; ``backups due`` lists expired copies not re-checked (exit 1); ``backups recheck`` probes a restored copy
read-only and seals a follow-up receipt — "found" for a copy taken before the erasure (the control: the probe
finds the bytes), "absent" for one taken after. Real SQLite docstore files."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest
import tomli_w
from click.testing import CliRunner

from tombstone import Tombstone, init_deployment
from tombstone.cli import main
from tombstone.config import load_config
from tombstone.receipt import load_receipt, verify
from tombstone.keys import load_public_key
from tombstone_adapters.docstore import DocStore

from support import write_docs


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def deployment(tmp_path):
    config = init_deployment(tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs.db"},
                                                    "notes": {"backend": "docstore", "path": "stores/notes.db"}})
    raw = tomllib_load(config.path)
    raw["backups"] = {"nightly": {"stores": ["docs"], "retention_days": 30, "where": "s3://acme-backups/docs"},
                      "weekly": {"stores": ["notes"], "retention_days": 90, "where": "tape", "kind": "archive"}}
    config.path.write_text(tomli_w.dumps(raw))
    config = load_config(config.path)
    DocStore(config.stores["docs"].options["path"]).close()
    DocStore(config.stores["notes"].options["path"]).close()
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 3)
        write_docs(tomb, "bob", 2)
    return config


def tomllib_load(path):
    import tomllib

    return tomllib.loads(path.read_text())


def test_a_declared_backup_is_on_the_receipt_due_after_it_expires_and_a_restored_copy_is_rechecked(tmp_path, deployment):
    config = deployment
    # each copy restored into a folder of its own: the probe also reads what lies beside a store's files
    before = tmp_path / "restore-1" / "docs.db"
    before.parent.mkdir()
    shutil.copy(config.stores["docs"].options["path"], before)  # last night's copy: it holds Alice
    with Tombstone(config) as tomb:
        receipt, _ = tomb.erase("alice")
    after = tmp_path / "restore-2" / "docs.db"
    after.parent.mkdir()
    shutil.copy(config.stores["docs"].options["path"], after)  # a copy taken after the erasure
    [copy] = receipt["backups"]  # notes holds nothing of Alice: its archive is not listed
    expires = (dt.date.fromisoformat(receipt["finished_at"][:10]) + dt.timedelta(days=30)).isoformat()
    assert copy == {"name": "nightly", "kind": "backup", "where": "s3://acme-backups/docs", "stores": ["docs"],
                    "records": 3, "retention_days": 30, "expires_on": expires, "status": "beyond use until overwritten"}
    verify(receipt, load_public_key(config.keys_dir / "signing.pub"))

    path = str(config.path)
    early = cli("backups", "due", "--today", receipt["finished_at"][:10], "--config", path)
    assert early.exit_code == 0 and "not expired yet" in early.output
    late = cli("backups", "due", "--today", "2099-01-01", "--config", path)
    assert late.exit_code == 1 and "DUE" in late.output

    found = cli("backups", "recheck", "alice", "--backup", "nightly", "--restored", str(before), "--config", path)
    assert found.exit_code == 1, found.output
    assert "found — 3 of 3 erased record(s) found" in found.output
    gone = cli("backups", "recheck", "alice", "--backup", "nightly", "--restored", str(after), "--config", path)
    assert gone.exit_code == 0, gone.output
    assert "absent — 0 of 3" in gone.output
    followups = sorted(config.receipts_dir.glob("alice*.json"))
    assert len(followups) == 3
    last = load_receipt(config.receipts_dir / "alice.3.json")
    verify(last, load_public_key(config.keys_dir / "signing.pub"))
    assert last["kind"] == "tombstone.backup-recheck-receipt" and last["artifacts"] == []
    assert last["backup_recheck"]["of_receipt"] == receipt["receipt_hash"] and last["backup_recheck"]["result"] == "absent"
    assert last["sequence"] == receipt["sequence"] + 2  # in the chain, after the erasure and the first re-check
    assert cli("backups", "due", "--today", "2099-01-01", "--config", path).exit_code == 0  # re-checked now
    # the report takes the re-check as a follow-up of the erasure, not as the subject's outcome
    report = cli("report", "--config", path, "--format", "json")
    [subject] = json.loads(report.output)["subjects"]
    assert subject["latest"]["sequence"] == receipt["sequence"] and subject["state"] == "done"
    assert "Re-check of nightly (docs) restored: absent." in subject["outcome"]


@pytest.mark.parametrize("body, message", [
    ({"stores": ["nowhere"], "retention_days": 30, "where": "x"}, "not configured"),
    ({"stores": ["docs"], "retention_days": 0, "where": "x"}, "retention_days"),
    ({"stores": ["docs"], "retention_days": 30}, "needs where"),
    ({"stores": ["docs"], "retention_days": 30, "where": "x", "every": "day"}, "unknown key"),
])
def test_a_bad_backup_declaration_is_one_line(deployment, body, message):
    raw = tomllib_load(deployment.path)
    raw["backups"] = {"bad": body}
    deployment.path.write_text(tomli_w.dumps(raw))
    result = cli("status", "--config", str(deployment.path))
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_a_restored_copy_that_is_not_there_is_refused(tmp_path, deployment):
    with Tombstone(deployment) as tomb:
        tomb.erase("alice")
    result = cli("backups", "recheck", "alice", "--backup", "nightly", "--restored", str(tmp_path / "nothing.db"),
                 "--config", str(deployment.path))
    assert result.exit_code == 2 and "nothing there" in result.output
    other = cli("backups", "recheck", "alice", "--backup", "weekly", "--restored", str(tmp_path),
                "--config", str(deployment.path))
    assert other.exit_code == 2 and "lists backup 'weekly'" in other.output
