"""The certificate of sanitization (``tombstone receipt certificate``): derived from a receipt that verifies,
every field from the receipt (or a verified counter-signature), the method category honest (Clear for a record
erased inside a live file, never Purge; not sanitized for a record kept or still found), the out-of-scope copies
listed, and a PDF printed by the installed Chromium."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tombstone.receipt.certificate import CLAIMED, CLEAR, NONE, method_of

from test_audit import audit_args, erase
from test_cli import one_line_error, run
from test_countersign import deployed  # noqa: F401  (the fixture: a docstore demo of two subjects)


def text_of(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_a_certificate_from_a_verified_receipt_with_its_counter_signature(tmp_path, deployed):
    receipt = erase(deployed, "user-0001")
    keys = tmp_path / "auditor"
    run("auditor-key", str(keys))
    cs = tmp_path / "cs.json"
    assert run("audit", str(receipt), *audit_args(deployed), "--sign-with", str(keys / "auditor.key"),
               "--countersignature", str(cs)).exit_code == 0
    out, pdf = tmp_path / "cert.html", tmp_path / "cert.pdf"
    made = run("receipt", "certificate", str(receipt), "--key", str(deployed / "keys" / "signing.pub"), "--out",
               str(out), "--pdf", str(pdf), "--operator", "Dana Ops, privacy office", "--countersignature", str(cs),
               "--auditor", str(keys / "auditor-signing.pub"))
    assert made.exit_code == 0, made.output
    data = json.loads(receipt.read_text())
    page = text_of(out.read_text())
    assert data["receipt_hash"] in page and data["signature"]["key_id"] in page and "Dana Ops, privacy office" in page
    assert "Clear (3)" in page and "Purge" in page and "not Purge" in page  # Clear, and why not Purge
    assert json.loads(cs.read_text())["signature"]["key_id"] in page and "verdict agree" in page
    for item in data["out_of_scope"]:
        assert item["what"] in page  # what no probe reaches is listed, not left out
    assert "the stores remain in service" in page
    assert pdf.read_bytes().startswith(b"%PDF") and shutil.which("chromium")


def test_no_certificate_from_a_receipt_that_does_not_verify(tmp_path, deployed):
    receipt = erase(deployed, "user-0001")
    data = json.loads(receipt.read_text())
    data["artifacts"][0]["status"] = "VERIFIED" if data["artifacts"][0]["status"] != "VERIFIED" else "RESIDUAL"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    out = tmp_path / "cert.html"
    result = run("receipt", "certificate", str(forged), "--key", str(deployed / "keys" / "signing.pub"), "--out",
                 str(out))
    assert "no certificate written" in one_line_error(result, 1) and not out.exists()


@pytest.mark.parametrize("entry, category", [
    ({"status": "VERIFIED", "level": "physical"}, CLEAR),
    ({"status": "VERIFIED", "level": "semantic"}, CLEAR),
    ({"status": "UNVERIFIED", "reason": "managed: the provider's storage cannot be read"}, CLAIMED),
    ({"status": "UNVERIFIED", "reason": "physical: the store's files are not readable"}, f"{CLEAR} (not verified)"),
    ({"status": "RESIDUAL", "level": "physical", "measurement": "id found in x.db"}, NONE),
    ({"status": "OUT_OF_SCOPE", "reason": "retained by exception: tax law"}, NONE),
    ({"status": "NEEDS_HUMAN", "reason": "third party: acme"}, NONE),
])
def test_the_method_category_never_claims_more_than_the_status(entry, category):
    got, why = method_of(entry)
    assert got == category and "Purge" not in got and why
