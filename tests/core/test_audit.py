"""The independent verifier: agreement, contradiction after restoring old store files, tampering, chains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tombstone.audit import audit
from tombstone.errors import LineageError
from tombstone.lineage.db import LineageDB

from test_cli import one_line_error, run


@pytest.fixture
def deployed(tmp_path):
    root = tmp_path / "d"
    result = run("demo", "--workdir", str(root), "--backends", "chroma,docstore,faiss,qdrant", "--subjects", "3",
                 "--erase", "none")
    assert result.exit_code == 0, result.output
    return root


def erase(root: Path, subject: str) -> Path:
    result = run("erase", subject, "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    return root / "receipts" / f"{subject}.json"


def test_fresh_receipt_agrees_without_the_lineage_db(deployed):
    receipt = erase(deployed, "user-0001")
    (deployed / "lineage.db").rename(deployed / "lineage.db.away")
    (deployed / "keys" / "lineage.secret").unlink()
    result = run("audit", str(receipt))
    assert result.exit_code == 0, result.output
    assert "integrity: ok" in result.output and " NO" not in result.output
    assert "fragment probes not re-run" in result.output
    assert not (deployed / "lineage.db").exists(), "the verifier must not create or open a lineage db"


def test_the_verifier_refuses_to_open_a_lineage_db(deployed, monkeypatch):
    receipt = erase(deployed, "user-0001")
    opened = []
    real = LineageDB.__init__

    def spy(self, *args, **kwargs):
        opened.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LineageDB, "__init__", spy)
    report = audit(receipt)
    assert report.agree and len(opened) == 0
    from tombstone.lineage.db import forbid_lineage
    from tombstone.keys import LineageSecret

    with forbid_lineage("the independent verifier"), pytest.raises(LineageError, match="does not open"):
        LineageDB(deployed / "lineage.db", LineageSecret(b"x" * 32))


def test_restored_store_files_contradict_the_receipt(deployed):
    before = deployed.parent / "stores-before"
    shutil.copytree(deployed / "stores", before)
    receipt = erase(deployed, "user-0002")
    shutil.rmtree(deployed / "stores")
    shutil.copytree(before, deployed / "stores")  # the operator (or a backup restore) brings the data back
    from tombstone_adapters.qdrant.adapter import close_local_clients

    close_local_clients()
    result = run("audit", str(receipt), "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    erased_ids = [a["artifact_id"] for a in json.loads(receipt.read_text())["artifacts"]]
    contradicted = {r["artifact_id"] for r in report["artifacts"] if not r["agree"]}
    assert contradicted == set(erased_ids), report
    assert all(r["audit_found"].startswith("present") for r in report["artifacts"] if not r["agree"])
    text = run("audit", str(receipt))
    assert text.exit_code == 1 and "CONTRADICTED:" in text.output


def test_tampered_receipt_is_named(deployed):
    receipt = erase(deployed, "user-0001")
    data = json.loads(receipt.read_text())
    data["artifacts"][0]["status"] = "UNVERIFIED"
    data["artifacts"][0]["level"] = None
    data["artifacts"][0]["reason"] = "changed"
    receipt.write_text(json.dumps(data))
    result = run("audit", str(receipt))
    assert result.exit_code == 1 and "integrity: failed: receipt hash mismatch" in result.output


def test_chain_links_truncation_and_rewrite(deployed):
    first, second, third = (erase(deployed, s) for s in ("user-0001", "user-0002", "user-0003"))
    head = run("receipt", "head", "--config", str(deployed / "tombstone.toml"))
    assert head.exit_code == 0
    anchor = head.output.strip()
    assert anchor.startswith("3:sha256:")
    ok = run("audit", str(third), "--previous", str(first), "--previous", str(second), "--anchor", anchor)
    assert ok.exit_code == 0 and "chain:     ok (3 receipts, #1..#3, anchored)" in ok.output
    missing = run("audit", str(third), "--previous", str(first))
    assert missing.exit_code == 1 and "receipt #2 is missing" in missing.output
    truncated = run("audit", str(second), "--previous", str(first), "--anchor", anchor)
    assert truncated.exit_code == 1 and "truncated" in truncated.output
    other = json.loads(second.read_text())
    forged_anchor = f"2:sha256:{'0' * 64}"
    rewritten = run("audit", str(second), "--previous", str(first), "--anchor", forged_anchor)
    assert rewritten.exit_code == 1 and "rewritten" in rewritten.output
    assert other["previous_receipt_hash"] == json.loads(first.read_text())["receipt_hash"]


def test_audit_bad_input(tmp_path, deployed):
    one_line_error(run("audit", str(tmp_path / "missing.json")), 2)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    one_line_error(run("audit", str(bad), "--config", str(deployed / "tombstone.toml")), 2)
    receipt = erase(deployed, "user-0001")
    one_line_error(run("audit", str(receipt), "--anchor", "nonsense"), 2)  # bad input, as the README says
