"""Hashing, signing and verifying receipts, and reading them from disk."""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tombstone.errors import ReceiptError, ReceiptFormatError
from tombstone.fsutil import NotARegularFile, read_regular_file
from tombstone.keys import b64, key_id
from tombstone.receipt.canonical import UNSIGNED_FIELDS, body_hash, canonical_members, hash_of, joined, signed_body

SCHEMA_VERSION = "1.1"
SCHEMA_VERSIONS = ("1.0", "1.1")
"""Receipt versions this release reads and verifies; it writes the last."""
RECEIPT_KIND = "tombstone.erasure-receipt"
"""A subject's erasure: ``subject`` is the data subject's reference."""
SOURCE_RECEIPT_KIND = "tombstone.source-erasure-receipt"
"""An erasure of named records of a source (a document an index loaded, or records deleted by id), not of a
data subject: ``subject`` is the source's reference, and the records may belong to several subjects.
LangChain indexing cleanups and vector-store deletes write one per source."""
STORE_RECLAIM_KIND = "tombstone.store-reclaim-receipt"
"""A whole store's reclaim (``tombstone reclaim --store``): what the store's own client had already deleted,
with the scan's counts before and after; no subject, no artifacts."""
BACKUP_RECHECK_KIND = "tombstone.backup-recheck-receipt"
"""A re-check of a declared backup restored after it expired: the erased subject's, no artifacts, a
``backup_recheck`` section (``tombstone backups recheck``)."""
RECEIPT_KINDS = (RECEIPT_KIND, SOURCE_RECEIPT_KIND, STORE_RECLAIM_KIND, BACKUP_RECHECK_KIND)


@lru_cache(maxsize=1)
def receipt_schema() -> dict[str, Any]:
    """The published JSON Schema of the receipt format."""
    text = resources.files("tombstone.receipt").joinpath("receipt.schema.json").read_text("utf-8")
    return json.loads(text)


def sign(body: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """Return the receipt: ``body`` plus its SHA-256 hash and an Ed25519 signature over the same bytes."""
    return signed(body, key)[0]


def signed(body: dict[str, Any], key: Ed25519PrivateKey) -> tuple[dict[str, Any], bytes]:
    """``sign``, with the whole receipt's canonical bytes (what the chain stores), each member encoded once."""
    receipt = {k: v for k, v in body.items() if k not in UNSIGNED_FIELDS}
    members = canonical_members(receipt)
    covered = joined(members)  # the same bytes for the hash and the signature: written once
    receipt["receipt_hash"] = hash_of(covered)
    receipt["signature"] = {
        "algorithm": "ed25519",
        "key_id": key_id(key.public_key()),
        "value": b64(key.sign(covered)),
    }
    validate_schema(receipt)
    members.update(canonical_members({k: receipt[k] for k in UNSIGNED_FIELDS}))
    return receipt, joined(members)


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every local ``{"$ref": "#/$defs/NAME"}`` replaced by that definition (the receipt schema's
    definitions do not refer to themselves): the same constraints, without resolving a reference at each of a
    receipt's thousands of values."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and len(node) == 1:
            return _inlined(defs[ref[len("#/$defs/"):]], defs)
        return {k: _inlined(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inlined(v, defs) for v in node]
    return node


@lru_cache(maxsize=1)
def _validator() -> Any:
    """The schema's validator, built once per process (the schema is checked once, not per receipt)."""
    schema = receipt_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(_inlined(schema, schema.get("$defs", {})))


@lru_cache(maxsize=1)
def _fast_validator() -> Any:
    """jsonschema-rs's compiled validator for the same schema (formats as annotations, as jsonschema treats
    them): it answers "valid" for a receipt of a thousand artifacts in a fraction of the time. Only its "valid"
    is taken; a receipt it rejects is checked again by jsonschema, whose verdict and message stand."""
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - a declared dependency; the slower check still runs
        return None
    return jsonschema_rs.validator_for(receipt_schema(), validate_formats=False)


def validate_schema(receipt: Any) -> None:
    fast = _fast_validator()
    if fast is not None and fast.is_valid(receipt):
        return
    exc = jsonschema.exceptions.best_match(_validator().iter_errors(receipt))
    if exc is not None:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise ReceiptError(f"receipt does not match schema {SCHEMA_VERSION} at {where}: {exc.message}")


MAX_RECEIPT_BYTES = 256 * 1024 * 1024
"""No receipt is read past this size (a receipt of a million artifacts is far smaller)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_lone_surrogates(data: Any) -> None:
    """Refuse a string holding half of a UTF-16 surrogate pair (``"\\ud800"`` alone): JSON lets it be
    written, but it is not Unicode, and no UTF-8 text (a canonical form, a terminal) can carry it."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("a string holds a lone UTF-16 surrogate (invalid Unicode)") from exc


def parse_strict(text: str, what: str) -> Any:
    """JSON as receipts use it: no duplicate keys (readers that keep the first and readers that keep the
    last would see two different receipts), no NaN or Infinity and no number beyond a double's range, no
    invalid Unicode, bounded nesting. ReceiptFormatError else."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_finite_float)
        _no_lone_surrogates(data)
        return data
    except json.JSONDecodeError as exc:
        raise ReceiptFormatError(f"{what} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    except ValueError as exc:
        raise ReceiptFormatError(f"{what} is not strict JSON: {exc}") from exc
    except RecursionError as exc:
        raise ReceiptFormatError(f"{what} is nested too deeply to be a receipt") from exc


def read_receipt(path: str | Path) -> tuple[bytes, dict[str, Any]]:
    """A receipt file's bytes and its strict JSON object, read once; a missing, unreadable, oversized or
    non-strict-JSON file is one ReceiptFormatError."""
    try:
        raw = read_regular_file(path, MAX_RECEIPT_BYTES + 1)
    except FileNotFoundError as exc:
        raise ReceiptFormatError(f"receipt file not found: {path}") from exc
    except NotARegularFile as exc:
        raise ReceiptFormatError(f"receipt {path} is not a regular file ({exc})") from exc
    except OSError as exc:
        raise ReceiptFormatError(f"cannot read receipt {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_RECEIPT_BYTES:
        raise ReceiptFormatError(f"receipt {path} is larger than {MAX_RECEIPT_BYTES // (1024 * 1024)} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReceiptFormatError(f"receipt {path} is not UTF-8 text (byte {exc.start})") from exc
    data = parse_strict(text, f"receipt {path}")
    if not isinstance(data, dict):
        raise ReceiptFormatError(f"receipt {path} is not a JSON object")
    return raw, data


def load_receipt(path: str | Path) -> dict[str, Any]:
    """Read a receipt file; a missing, unreadable, oversized or non-strict-JSON file is one ReceiptFormatError."""
    return read_receipt(path)[1]


@dataclass(frozen=True)
class VerifiedReceipt:
    """What a successful verification established."""

    receipt_hash: str
    """The recomputed hash, equal to the one the receipt carries."""
    key_id: str
    """The key that signed it."""
    previous_receipt_hash: str | None
    """The link to the previous receipt in the chain."""


def verify(receipt: dict[str, Any], public_key: Ed25519PublicKey) -> VerifiedReceipt:
    """Check schema, hash and signature; raise ReceiptError naming the first failure."""
    validate_schema(receipt)
    recomputed = body_hash(receipt)
    if recomputed != receipt["receipt_hash"]:
        raise ReceiptError(f"receipt hash mismatch: content hashes to {recomputed}, receipt says {receipt['receipt_hash']}")
    signature = receipt["signature"]
    expected_id = key_id(public_key)
    if signature["key_id"] != expected_id:
        raise ReceiptError(f"receipt is signed by key {signature['key_id']}, not by the trusted key {expected_id}")
    try:
        raw = base64.b64decode(signature["value"], validate=True)
        if base64.b64encode(raw).decode("ascii") != signature["value"]:
            # the unused low bits of the last character: another string that decodes to the same bytes
            raise ValueError("signature is not in canonical base64")
        public_key.verify(raw, signed_body(receipt))
    except (InvalidSignature, binascii.Error, ValueError) as exc:
        raise ReceiptError("receipt signature does not verify") from exc
    return VerifiedReceipt(recomputed, expected_id, receipt["previous_receipt_hash"])
