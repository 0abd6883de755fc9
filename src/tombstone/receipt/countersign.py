"""An auditor's counter-signature over a receipt (``tombstone audit --sign-with``), separate from the operator's.

The operator signs a receipt with the deployment's key; whoever verified it independently (``tombstone audit``,
re-probing the stores without the lineage db) signs what the audit found, over the receipt's hash, with a key of
their own. The signing key is derived from the auditor's private key (``tombstone auditor-key``: the same file
that opens the content patterns sealed to them) by HKDF-SHA256 under a label of its own, so the one secret serves
both and neither use can stand in for the other; its public half is ``auditor-signing.pub`` (PEM), which the
auditor publishes. Anyone can then check, with that public key, that this auditor re-probed this receipt and
what they found: agree, contradicted or unchecked, per artifact. A counter-signature adds the audit's findings;
it does not repeat or extend the receipt's claims.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tombstone.errors import ReceiptError
from tombstone.keys import key_id, public_pem
from tombstone.receipt.canonical import canonical_bytes

KIND = "tombstone.countersignature"
SIGNING_PUBLIC = "auditor-signing.pub"
_LABEL = b"tombstone auditor counter-signature v1"


def signing_key(auditor_private_path: str | Path) -> Ed25519PrivateKey:
    """The auditor's Ed25519 signing key, derived from their auditor private key file."""
    from tombstone.receipt.sealing import load_private

    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(
        bytes(load_private(auditor_private_path)))
    return Ed25519PrivateKey.from_private_bytes(seed)


def write_signing_public(auditor_private_path: str | Path, out: str | Path) -> Path:
    """Write the public half of the auditor's signing key (PEM), for the auditor to publish."""
    from tombstone.fsutil import write_atomic

    out = Path(out)
    write_atomic(out, public_pem(signing_key(auditor_private_path).public_key()))
    out.chmod(0o644)
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def countersign(report: Any, receipt: dict[str, Any], key: Ed25519PrivateKey, *,
                at: dt.datetime | None = None) -> dict[str, Any]:
    """The counter-signature of an ``AuditReport`` over ``receipt`` (whose hash it names)."""
    body = {
        "kind": KIND,
        "version": 1,
        "receipt_hash": receipt.get("receipt_hash"),
        "receipt_sequence": receipt.get("sequence"),
        "saga_id": receipt.get("saga_id"),
        "operator_key": report.key,
        "audited_at": (at or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "verdict": report.verdict,
        "integrity": report.integrity,
        "chain": report.chain,
        "artifacts": [{"store": r.store, "artifact_id": r.artifact_id, "receipt_says": r.receipt_says,
                       "audit_found": r.audit_found, "verdict": r.verdict} for r in report.rows],
    }
    public = key.public_key()
    body["signature"] = {"algorithm": "ed25519", "key_id": key_id(public),
                         "value": _b64(key.sign(canonical_bytes(body)))}
    return body


def verify_countersignature(cs: Any, receipt: dict[str, Any], trusted: Ed25519PublicKey) -> dict[str, Any]:
    """Check that ``cs`` is a counter-signature of ``receipt`` made with ``trusted`` (the auditor's published
    signing key); return it. ReceiptError naming what does not hold."""
    if not isinstance(cs, dict) or cs.get("kind") != KIND or not isinstance(cs.get("signature"), dict):
        raise ReceiptError("not a Tombstone counter-signature (kind tombstone.countersignature)")
    if cs.get("receipt_hash") != receipt.get("receipt_hash"):
        raise ReceiptError(f"the counter-signature is over receipt {cs.get('receipt_hash')}, not this one"
                           f" ({receipt.get('receipt_hash')})")
    sig = cs["signature"]
    if sig.get("key_id") != key_id(trusted):
        raise ReceiptError(f"signed by {sig.get('key_id')}, not by the auditor key you trust ({key_id(trusted)})")
    body = {k: v for k, v in cs.items() if k != "signature"}
    try:
        trusted.verify(base64.b64decode(str(sig.get("value")), validate=True), canonical_bytes(body))
    except (InvalidSignature, binascii.Error, ValueError) as exc:
        raise ReceiptError("the counter-signature does not verify: it was altered, or not made with that key") from exc
    return cs


__all__ = ["KIND", "SIGNING_PUBLIC", "countersign", "signing_key", "verify_countersignature", "write_signing_public"]
