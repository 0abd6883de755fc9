"""Receipts: canonical JSON, SHA-256, Ed25519 signature, chained to the previous receipt.

``build`` makes the body from a saga's decided findings, ``signing`` hashes, signs, verifies and reads
files, ``model`` parses a receipt once into the typed :class:`Receipt` everything else reads.
"""

from tombstone.receipt.build import ALWAYS_OUT_OF_SCOPE, pretty, receipt_body
from tombstone.receipt.canonical import body_hash, canonical_bytes
from tombstone.receipt.model import ArtifactEntry, ProbeRecord, Receipt
from tombstone.receipt.signing import (
    RECEIPT_KIND,
    SCHEMA_VERSION,
    SOURCE_RECEIPT_KIND,
    STORE_RECLAIM_KIND,
    VerifiedReceipt,
    load_receipt,
    receipt_schema,
    sign,
    validate_schema,
    verify,
)

__all__ = [
    "ALWAYS_OUT_OF_SCOPE",
    "ArtifactEntry",
    "ProbeRecord",
    "RECEIPT_KIND",
    "Receipt",
    "SCHEMA_VERSION",
    "SOURCE_RECEIPT_KIND",
    "STORE_RECLAIM_KIND",
    "VerifiedReceipt",
    "body_hash",
    "canonical_bytes",
    "load_receipt",
    "pretty",
    "receipt_body",
    "receipt_schema",
    "sign",
    "validate_schema",
    "verify",
]
