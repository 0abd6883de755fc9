"""Canonical JSON: the exact bytes a receipt's hash and signature cover.

Keys sorted, no insignificant whitespace, UTF-8, no NaN or infinity. Numbers are written by
Python's shortest round-trip repr, so a float read back and written again gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

UNSIGNED_FIELDS = ("receipt_hash", "signature")


def canonical_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def signed_body(receipt: dict[str, Any]) -> bytes:
    """Canonical bytes of the receipt without its hash and signature: what both of them cover."""
    return canonical_bytes({k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS})


def hash_of(covered: bytes) -> str:
    """The receipt hash of the bytes ``signed_body`` gives."""
    return "sha256:" + hashlib.sha256(covered).hexdigest()


def body_hash(receipt: dict[str, Any]) -> str:
    return hash_of(signed_body(receipt))
