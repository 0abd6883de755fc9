"""Receipts: canonical JSON, SHA-256, Ed25519 signature, chained to the previous receipt."""

from tombstone.receipt.canonical import body_hash, canonical_bytes
from tombstone.receipt.signing import (
    RECEIPT_KIND,
    SCHEMA_VERSION,
    VerifiedReceipt,
    load_receipt,
    receipt_schema,
    sign,
    validate_schema,
    verify,
)

__all__ = [
    "RECEIPT_KIND",
    "SCHEMA_VERSION",
    "VerifiedReceipt",
    "body_hash",
    "canonical_bytes",
    "load_receipt",
    "receipt_schema",
    "sign",
    "validate_schema",
    "verify",
]
