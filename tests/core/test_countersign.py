"""An auditor's counter-signature (``tombstone audit --sign-with``): made with a key derived from the auditor's
own, checked by anyone with its published half (``tombstone receipt verify --countersignature --auditor``);
an altered one, one over another receipt or one checked against another auditor's key is refused."""

from __future__ import annotations

import json

from tombstone.cli import main  # noqa: F401  (the commands)

from test_audit import audit_args, erase
from test_cli import one_line_error, run
import pytest


@pytest.fixture
def deployed(tmp_path):
    root = tmp_path / "d"
    result = run("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none")
    assert result.exit_code == 0, result.output
    return root


def test_an_audit_counter_signed_by_the_auditor_verifies_with_their_published_key(tmp_path, deployed):
    receipt = erase(deployed, "user-0001")
    keys = tmp_path / "auditor-keys"
    made = run("auditor-key", str(keys))
    assert made.exit_code == 0 and "auditor-signing.pub" in made.output
    cs = tmp_path / "cs.json"
    audited = run("audit", str(receipt), *audit_args(deployed), "--sign-with", str(keys / "auditor.key"),
                  "--countersignature", str(cs))
    assert audited.exit_code == 0, audited.output
    assert f"counter-signature: {cs} (verdict agree)" in audited.output
    body = json.loads(cs.read_text())
    assert body["receipt_hash"] == json.loads(receipt.read_text())["receipt_hash"] and body["verdict"] == "agree"
    assert body["artifacts"] and all(a["verdict"] == "agree" for a in body["artifacts"])
    key = str(deployed / "keys" / "signing.pub")
    ok = run("receipt", "verify", str(receipt), "--key", key, "--countersignature", str(cs), "--auditor",
             str(keys / "auditor-signing.pub"))
    assert ok.exit_code == 0, ok.output
    assert f"OK {cs}" in ok.output and "verdict:   agree" in ok.output

    # another auditor's key is not this auditor's
    other = tmp_path / "other-keys"
    run("auditor-key", str(other))
    wrong = run("receipt", "verify", str(receipt), "--key", key, "--countersignature", str(cs), "--auditor",
                str(other / "auditor-signing.pub"))
    assert "not by the auditor key you trust" in one_line_error(wrong, 1)
    # an altered verdict is refused
    body["verdict"] = "agree"
    body["artifacts"][0]["audit_found"] = "absent (edited)"
    cs.write_text(json.dumps(body))
    altered = run("receipt", "verify", str(receipt), "--key", key, "--countersignature", str(cs), "--auditor",
                  str(keys / "auditor-signing.pub"))
    assert "does not verify" in one_line_error(altered, 1)
    # a counter-signature is of one receipt: not of another subject's
    other_receipt = erase(deployed, "user-0002")
    run("audit", str(receipt), *audit_args(deployed), "--sign-with", str(keys / "auditor.key"), "--countersignature",
        str(cs))
    elsewhere = run("receipt", "verify", str(other_receipt), "--key", key, "--countersignature", str(cs),
                    "--auditor", str(keys / "auditor-signing.pub"))
    assert "not this one" in one_line_error(elsewhere, 1)


def test_a_counter_signature_needs_the_auditor_key_to_check_it(deployed, tmp_path):
    receipt = erase(deployed, "user-0001")
    result = run("receipt", "verify", str(receipt), "--key", str(deployed / "keys" / "signing.pub"),
                 "--countersignature", str(tmp_path / "cs.json"))
    assert "go together" in one_line_error(result, 2)
    bad_key = run("audit", str(receipt), *audit_args(deployed), "--sign-with", str(deployed / "keys" / "signing.pub"))
    assert "auditor private key" in one_line_error(bad_key, 2)
