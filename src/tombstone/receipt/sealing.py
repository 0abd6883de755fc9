"""Content patterns on a receipt, sealed to the auditors' public keys and to nobody else.

An auditor re-probing a store needs what the erased artifact looked like in bytes (its fingerprint and
the norm that gives the normalised form a cosine index keeps). In the clear on a receipt those would make
every receipt a copy of what was erased: anyone holding one could confirm a guessed text by embedding it.
So a receipt carries them only inside libsodium sealed boxes (X25519 + XSalsa20-Poly1305, via PyNaCl),
one per auditor public key named in the deployment's config; with no auditor key configured it carries
none, and an audit is by id alone (the report says so).

Auditor keys are created with ``tombstone auditor-key DIR``: ``auditor.key`` (keep it; mode 0600) and
``auditor.pub`` (give it to the operator, who lists it under ``auditor_keys`` in tombstone.toml).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.errors import KeyMaterialError
from tombstone.fsutil import make_private_dirs, read_regular_file, write_atomic

PUBLIC_PREFIX = "tombstone-auditor-public:"
PRIVATE_PREFIX = "tombstone-auditor-private:"
AUDITOR_PRIVATE = "auditor.key"
AUDITOR_PUBLIC = "auditor.pub"


def _nacl():
    from nacl import public

    return public


def key_id(public_key: Any) -> str:
    """``x25519:`` and the first 16 hex digits of the SHA-256 of the raw public key."""
    return "x25519:" + hashlib.sha256(bytes(public_key)).hexdigest()[:16]


def create_auditor_keys(directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """A new auditor key pair in ``directory``; never overwrites. Returns (private, public) paths."""
    directory = make_private_dirs(directory)
    private_path, public_path = directory / AUDITOR_PRIVATE, directory / AUDITOR_PUBLIC
    if private_path.exists() or public_path.exists():
        raise KeyMaterialError(f"{directory} already holds an auditor key; pick another directory")
    key = _nacl().PrivateKey.generate()
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(PRIVATE_PREFIX + base64.b64encode(bytes(key)).decode() + "\n")
    write_atomic(public_path, (PUBLIC_PREFIX + base64.b64encode(bytes(key.public_key)).decode() + "\n").encode())
    return private_path, public_path


def _read(path: str | os.PathLike[str], prefix: str, what: str) -> bytes:
    try:
        text = read_regular_file(path, 64 * 1024).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyMaterialError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not text.startswith(prefix):
        other = PRIVATE_PREFIX if prefix == PUBLIC_PREFIX else PUBLIC_PREFIX
        hint = f" (it is an auditor {'private' if text.startswith(PRIVATE_PREFIX) else 'public'} key)" \
            if text.startswith(other) else ""
        raise KeyMaterialError(f"{path} is not an {what}{hint}: expected a file made by 'tombstone auditor-key'")
    try:
        raw = base64.b64decode(text[len(prefix):], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyMaterialError(f"{path} is not an {what}: the key is not valid base64") from exc
    if len(raw) != 32:
        raise KeyMaterialError(f"{path} is not an {what}: wrong key length")
    return raw


def load_public(path: str | os.PathLike[str]) -> Any:
    return _nacl().PublicKey(_read(path, PUBLIC_PREFIX, "auditor public key"))


def load_private(path: str | os.PathLike[str]) -> Any:
    return _nacl().PrivateKey(_read(path, PRIVATE_PREFIX, "auditor private key"))


def seal(patterns: Mapping[str, Any], recipients: Sequence[Any]) -> list[dict[str, str]]:
    """One sealed box of ``patterns`` (JSON) per recipient public key."""
    if not recipients:
        return []
    box = _nacl().SealedBox
    data = json.dumps(patterns, sort_keys=True, separators=(",", ":")).encode()
    return [{"recipient": key_id(pk), "box": base64.b64encode(box(pk).encrypt(data)).decode()}
            for pk in recipients]


def open_sealed(sealed: Sequence[Mapping[str, str]], private_key: Any) -> dict[str, Any] | None:
    """The patterns sealed to ``private_key``'s public key, or None when the receipt holds none for it."""
    from nacl.exceptions import CryptoError

    mine = key_id(private_key.public_key)
    for item in sealed:
        if item.get("recipient") != mine:
            continue
        try:
            data = _nacl().SealedBox(private_key).decrypt(base64.b64decode(item["box"], validate=True))
            patterns = json.loads(data)
        except (CryptoError, binascii.Error, ValueError) as exc:
            raise KeyMaterialError(f"a sealed box for {mine} does not open with this key") from exc
        return patterns if isinstance(patterns, dict) else None
    return None


__all__ = ["AUDITOR_PRIVATE", "AUDITOR_PUBLIC", "create_auditor_keys", "key_id", "load_private", "load_public",
           "open_sealed", "seal"]
