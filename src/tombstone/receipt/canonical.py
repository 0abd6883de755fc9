"""Canonical JSON: the exact bytes a receipt's hash and signature cover.

Keys sorted, no insignificant whitespace, UTF-8, no NaN or infinity. Numbers are written by
Python's shortest round-trip repr, so a float read back and written again gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

UNSIGNED_FIELDS = ("receipt_hash", "signature")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            check_circular=False)
"""No circular-reference bookkeeping (a receipt is a tree built from JSON): about a fifth of the encoder's time
on a batch's receipts. A value that does refer to itself still fails, with RecursionError."""


def canonical_bytes(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode("utf-8")


def canonical_members(obj: dict[str, Any]) -> dict[str, bytes]:
    """Each top-level member's canonical bytes, for :func:`joined`: a receipt's signed body and the whole
    receipt share every member but two, so each is encoded once."""
    return {key: canonical_bytes(value) for key, value in obj.items()}


def joined(members: dict[str, bytes]) -> bytes:
    """The canonical bytes of the object whose members ``canonical_members`` encoded: the same bytes as
    ``canonical_bytes`` of the object (keys sorted, each ``"key":value``, comma-separated, in braces)."""
    return b"{" + b",".join(canonical_bytes(key) + b":" + members[key] for key in sorted(members)) + b"}"


def signed_body(receipt: dict[str, Any]) -> bytes:
    """Canonical bytes of the receipt without its hash and signature: what both of them cover."""
    return canonical_bytes({k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS})


def hash_of(covered: bytes) -> str:
    """The receipt hash of the bytes ``signed_body`` gives."""
    return "sha256:" + hashlib.sha256(covered).hexdigest()


def body_hash(receipt: dict[str, Any]) -> str:
    return hash_of(signed_body(receipt))
