"""``tombstone report`` verifies every receipt file it reads: a tampered copy of a genuine receipt (the same
claimed hash and signature, an altered body) is listed as failing whichever order the files are read in, and
the report exits 1. Only byte-identical files that both verify are read as one receipt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tombstone.cli import main
from tombstone.receipt import pretty, receipt_body, sign


def entry(status: str, *, physical_passed: bool, action: str | None = None) -> dict:
    probes = [{"level": "logical", "ran": True, "passed": True, "measurement": None, "detail": {}},
              {"level": "physical", "ran": True, "passed": physical_passed,
               "measurement": None if physical_passed else "id found in 1 file", "detail": {}}]
    return {"artifact_id": "bob-doc-0001", "store": "docs", "backend": "docstore", "kind": "document",
            "status": status, "level": "physical", "reason": None,
            "measurement": None if physical_passed else "id found in 1 file", "action": action,
            "fingerprint": None, "inv_norm": None,
            "evidence": {"scope": "owned", "suppression": {"recorded": True}, "reclaim": None, "probes": probes}}


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def key_file(tmp_path, signer) -> Path:
    path = tmp_path / "trusted.pub"
    path.write_bytes(signer.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def genuine(signer: Ed25519PrivateKey) -> dict:
    body = receipt_body(subject="bob", saga_id="0f0f0f0f-0000-4000-8000-000000000001", sequence=1,
                        started_at="2026-01-01T10:00:00.000000Z", finished_at="2026-01-01T10:00:01.000000Z",
                        entries=[entry("RESIDUAL", physical_passed=False,
                                      action="the bytes are still stored: run 'tombstone erase' again")], previous_receipt_hash=None)
    return sign(body, signer)


def tampered_copy(receipt: dict) -> dict:
    """The genuine receipt with its residual turned into a verified erasure; the claimed hash and signature
    are left as they were."""
    data = json.loads(json.dumps(receipt))
    data["artifacts"][0] = {**data["artifacts"][0], "status": "VERIFIED", "measurement": None, "action": None}
    assert data["receipt_hash"] == receipt["receipt_hash"]
    return data


def report(*args: str):
    result = CliRunner().invoke(main, ["report", *args], catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("tampered_name", ["a-receipt.json", "z-receipt.json"],
                         ids=["tampered-read-first", "tampered-read-second"])
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_a_tampered_copy_beside_the_genuine_receipt_fails_in_either_order(tmp_path, signer, key_file,
                                                                         tampered_name, with_key):
    folder = tmp_path / "receipts"
    folder.mkdir()
    receipt = genuine(signer)
    genuine_name = "z-receipt.json" if tampered_name == "a-receipt.json" else "a-receipt.json"
    (folder / genuine_name).write_bytes(pretty(receipt))
    (folder / tampered_name).write_bytes(pretty(tampered_copy(receipt)))
    key = ["--key", str(key_file)] if with_key else []

    result = report(str(folder), *key, "--format", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    failures = data["failures"]
    assert [Path(f["source"]).name for f in failures] == [tampered_name]
    assert failures[0]["reason"]
    # the genuine receipt is still read, and its residual still needs action
    wheres = [Path(v["source"]).name for s in data["subjects"] for v in [s["latest"], *s["earlier"]]]
    assert sorted(wheres) == sorted([genuine_name, tampered_name])
    [bob] = data["subjects"]
    assert Path(bob["latest"]["source"]).name == genuine_name
    assert bob["latest"]["integrity"]["state"] != "failed" and "1 RESIDUAL" in bob["outcome"]

    md = report(str(folder), *key, "--format", "md")
    assert md.exit_code == 1 and tampered_name in md.stdout and "fail" in md.stdout
    html = report(str(folder), *key, "--out", str(tmp_path / "r.html"))
    assert html.exit_code == 1
    assert tampered_name in (tmp_path / "r.html").read_text()
    assert "1 receipt file(s) fail their check" in html.stderr and tampered_name in html.stderr


def test_byte_identical_copies_that_verify_are_one_receipt(tmp_path, signer, key_file):
    folder = tmp_path / "receipts"
    folder.mkdir()
    raw = pretty(genuine(signer))
    (folder / "a.json").write_bytes(raw)
    (folder / "b.json").write_bytes(raw)
    result = report(str(folder), "--key", str(key_file), "--format", "json")
    assert result.exit_code == 3  # the residual needs action; nothing fails
    data = json.loads(result.stdout)
    assert data["failures"] == []
    [bob] = data["subjects"]
    assert bob["earlier"] == []


def test_byte_identical_copies_that_fail_are_each_listed(tmp_path, signer, key_file):
    folder = tmp_path / "receipts"
    folder.mkdir()
    raw = pretty(tampered_copy(genuine(signer)))
    (folder / "a.json").write_bytes(raw)
    (folder / "b.json").write_bytes(raw)
    result = report(str(folder), "--key", str(key_file), "--format", "json")
    assert result.exit_code == 1
    assert sorted(Path(f["source"]).name for f in json.loads(result.stdout)["failures"]) == ["a.json", "b.json"]
