"""Key material created by ``tombstone init``: the Ed25519 signing key and the lineage secret.

The lineage secret keys the HMAC that turns a subject reference into the opaque key the lineage db
stores, and seals (AES-GCM) the few values that must be recoverable, such as the subject reference
a running saga needs for its receipt. A stolen lineage db without this secret does not say who
the subjects are.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tombstone.display import normal_subject
from tombstone.errors import KeyMaterialError, UnknownSubjectError
from tombstone.fsutil import make_private_dirs, write_atomic
from tombstone.inputs import read_user_file

SIGNING_KEY = "signing.key"
PUBLIC_KEY = "signing.pub"
LINEAGE_SECRET = "lineage.secret"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def create_keys(keys_dir: Path) -> None:
    """Create the signing key pair and the lineage secret; never overwrite existing ones."""
    make_private_dirs(keys_dir)
    private_path = keys_dir / SIGNING_KEY
    if not private_path.exists():
        key = Ed25519PrivateKey.generate()
        _write_private(
            private_path,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        write_atomic(keys_dir / PUBLIC_KEY, public_pem(key.public_key()))
    secret_path = keys_dir / LINEAGE_SECRET
    if not secret_path.exists():
        _write_private(secret_path, secrets.token_hex(32).encode() + b"\n")


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: Ed25519PublicKey) -> str:
    """Short stable name of a public key: the first 16 hex digits of SHA-256 of its raw bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


KEY_FILE_LIMIT = 64 * 1024
"""The most bytes read from a key or secret file: a PEM key is a few hundred bytes."""


def read_key_file(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a key file, if it is a regular file of at most KEY_FILE_LIMIT bytes (a FIFO, a device such
    as /dev/zero, or a huge file is one KeyMaterialError line, never a hang or an exhausted memory).
    FileNotFoundError passes through."""
    return read_user_file(path, KEY_FILE_LIMIT, what, error=KeyMaterialError)


def load_private_key(keys_dir: Path) -> Ed25519PrivateKey:
    path = keys_dir / SIGNING_KEY
    try:
        key = serialization.load_pem_private_key(read_key_file(path, "signing key"), password=None)
    except FileNotFoundError as exc:
        raise KeyMaterialError(f"no signing key at {path}; run 'tombstone init'") from exc
    except (OSError, ValueError) as exc:
        raise KeyMaterialError(f"cannot load signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyMaterialError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load a PEM public key (or derive it from a PEM private key file)."""
    try:
        data = read_key_file(path, "public key")
    except OSError as exc:
        raise KeyMaterialError(f"cannot read public key {path}: {exc.strerror or exc}") from exc
    try:
        if b"PRIVATE KEY" in data:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise KeyMaterialError(f"{path} is not a PEM key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyMaterialError(f"{path} is not an Ed25519 key")
    return key


def _subject_bytes(subject: str) -> bytes:
    try:
        return normal_subject(subject).encode("utf-8")
    except ValueError as exc:
        raise UnknownSubjectError(str(exc)) from exc


@dataclass(frozen=True)
class LineageSecret:
    """The local secret behind subject keys and sealed values."""

    value: bytes
    """32 random bytes."""

    @classmethod
    def load(cls, keys_dir: Path) -> LineageSecret:
        path = keys_dir / LINEAGE_SECRET
        try:
            text = read_key_file(path, "lineage secret").decode("ascii").strip()
            value = bytes.fromhex(text)
        except FileNotFoundError as exc:
            raise KeyMaterialError(f"no lineage secret at {path}; run 'tombstone init'") from exc
        except (OSError, ValueError) as exc:
            raise KeyMaterialError(f"cannot load lineage secret {path}: {exc}") from exc
        if len(value) < 16:
            raise KeyMaterialError(f"lineage secret {path} is too short")
        return cls(value)

    def _derive(self, purpose: bytes) -> bytes:
        return hmac.new(self.value, purpose, hashlib.sha256).digest()

    def subject_key(self, subject: str) -> str:
        """Keyed hash of a subject reference (NFC-normalised: two spellings of one name are one subject): what
        the lineage db stores instead of the reference."""
        digest = hmac.new(self._derive(b"subject"), _subject_bytes(subject), hashlib.sha256)
        return digest.hexdigest()

    def file_tag(self, subject: str) -> str:
        """A short keyed hash of a subject reference for file names (12 hex digits): it tells apart subjects
        whose readable forms collide, and without the secret it cannot be checked against a guessed subject."""
        return hmac.new(self._derive(b"receipt-file-name"), _subject_bytes(subject), hashlib.sha256).hexdigest()[:12]

    def content_key(self, sha256_hex: str) -> str:
        """The keyed form of a content hash, which is all the lineage db stores: HMAC over the SHA-256
        digest. Without the secret it cannot be used to confirm a guessed text."""
        try:
            digest = bytes.fromhex(sha256_hex)
        except ValueError as exc:
            raise KeyMaterialError("a content hash must be a SHA-256 hex digest") from exc
        return hmac.new(self._derive(b"content"), digest, hashlib.sha256).hexdigest()

    def artifact_ref(self, store: str, artifact_id: str) -> str:
        """A keyed reference to an artifact (32 hex digits of an HMAC over the store and the id): how a receipt
        names another subject's artifact without naming it. The same artifact gets the same reference in every
        receipt of this deployment; only a holder of the secret can tell which artifact it is."""
        message = store.encode("utf-8") + b"\x00" + artifact_id.encode("utf-8")
        return hmac.new(self._derive(b"artifact-reference"), message, hashlib.sha256).hexdigest()[:32]

    def seal(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + AESGCM(self._derive(b"seal")).encrypt(nonce, plaintext, b"tombstone")

    def unseal(self, sealed: bytes) -> bytes:
        try:
            return AESGCM(self._derive(b"seal")).decrypt(sealed[:12], sealed[12:], b"tombstone")
        except (InvalidTag, ValueError) as exc:
            raise KeyMaterialError("a sealed value does not open with this lineage secret") from exc


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
