"""Receipts written by release 0.1.0 (before the verification pipeline) still parse, verify and audit.

The fixture is a whole demo deployment of that release as an auditor would receive it: the config, the
operator's public key, the stores and the receipt (no lineage db, no private key).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tombstone.audit import audit
from tombstone.receipt import Receipt, load_receipt, verify
from tombstone.keys import load_public_key
from tombstone.verify.levels import Level, StatusKind

from test_cli import run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "receipt-0.1.0"


@pytest.fixture
def bundle(tmp_path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(FIXTURE, root)
    return root


def test_an_old_receipt_parses_into_the_typed_receipt(bundle):
    receipt = Receipt.load(bundle / "receipts" / "user-0001.json")
    assert receipt.tool_version == "0.1.0" and receipt.subject == "user-0001"
    assert len(receipt.artifacts) == 4 and all(a.status is StatusKind.VERIFIED for a in receipt.artifacts)
    entry = receipt.artifacts[0]
    assert set(entry.probes) == {Level.LOGICAL, Level.PHYSICAL}  # the levels 0.1.0 recorded
    assert entry.probe(Level.SEMANTIC) is None and entry.probe(Level.PHYSICAL).passed is True


def test_an_old_receipt_still_verifies_and_a_change_is_caught(bundle):
    path = bundle / "receipts" / "user-0001.json"
    key = load_public_key(bundle / "keys" / "signing.pub")
    verify(load_receipt(path), key)
    ok = run("receipt", "verify", str(path), "--key", str(bundle / "keys" / "signing.pub"))
    assert ok.exit_code == 0 and "OK" in ok.output
    data = json.loads(path.read_text())
    data["artifacts"][0]["status"], data["artifacts"][0]["level"] = "UNVERIFIED", None
    data["artifacts"][0]["reason"] = "edited"
    path.write_text(json.dumps(data))
    bad = run("receipt", "verify", str(path), "--key", str(bundle / "keys" / "signing.pub"))
    assert bad.exit_code == 1


def test_an_old_receipt_audits_against_its_stores(bundle):
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    report = audit(bundle / "receipts" / "user-0001.json", config_path=str(bundle / "tombstone.toml"),
                   key_path=str(bundle / "keys" / "signing.pub"))
    assert report.integrity == "ok" and report.agree
    assert [r.audit_found for r in report.rows] == ["absent (logical, physical)"] * 4
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(bundle.rglob("*")) if p.is_file()}
    assert after == before  # the auditor changed, added and removed nothing
