"""Weights recognised by their tensors, not their bytes: a strict, streaming reader of safetensors content
(a plain file, or one compressed with gzip, zstd, bz2 or xz, found by its content, never its name), the digest
of every tensor it holds, and how the registry remembers the weights an erasure retired.

A tensor's digest is the SHA-256 of its dtype, its shape and its raw bytes (little-endian, as safetensors
stores them): the same tensor gives the same digest whatever it is called, whatever else the file holds and in
whatever order or with whatever metadata the file was written. The registry keeps no digest itself, only a
tag derived from it (:func:`tensor_tag`, as :func:`retired_tag` does for a whole file), so it names no file
and no tensor an outsider could look up; a probe recomputes the tags of what it reads and compares.

What is read is untrusted. The header is bounded before it is read (its declared length against
``HEADER_LIMIT`` and the file's size); every tensor's dtype must be known, its byte range must match its shape,
lie inside the file and overlap no other; decompression is streamed and stops at the store's
``max_weights_bytes``; nothing is held in memory but the header and one chunk. Content that looks like
safetensors or like a compressed stream and fails any of this raises :class:`Undecodable` naming why.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import itertools
import json
import lzma
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

RETIRED_TAG = b"tombstone-retired-weights\x00"
RETIRED_TENSOR_TAG = b"tombstone-retired-tensor\x00"
HEADER_LIMIT = 16 * 1024 * 1024
"""The largest safetensors header read (a model of a hundred thousand tensors has a header of about 10 MiB);
the store's ``max_metadata_bytes`` lowers it."""
MAX_LAYERS = 3
"""How many times over a file may be compressed and still be read (a fourth layer is Undecodable)."""
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
"""The safetensors dtypes and their sizes in bytes; any other dtype is Undecodable."""
CODECS = (("gzip", b"\x1f\x8b"), ("zstd", b"\x28\xb5\x2f\xfd"), ("xz", b"\xfd7zXZ\x00"), ("bz2", b"BZh"))
_CHUNK = 1 << 20


class Undecodable(Exception):
    """Content that looks like weights (safetensors, or a compressed stream) but cannot be decoded within the
    bounds: the message says why."""


def retired_tag(sha256_hex: str) -> str:
    """How the registry remembers a retired weights file: the SHA-256 of its SHA-256 (names no file)."""
    return hashlib.sha256(RETIRED_TAG + sha256_hex.encode("ascii")).hexdigest()


def tensor_tag(digest_hex: str) -> str:
    """How the registry remembers one tensor of retired weights: the SHA-256 of its digest."""
    return hashlib.sha256(RETIRED_TENSOR_TAG + digest_hex.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    digest: str
    """SHA-256 of dtype, shape and raw bytes (see the module docstring)."""
    constant: bool
    """Every element is the same (or there is none): such a tensor says nothing of what was trained."""


@dataclass
class Contents:
    """What one file holds, layer by layer."""

    kinds: list[str] = field(default_factory=list)
    """The layers recognised, outermost first (e.g. ``["gzip", "safetensors"]``); empty: neither."""
    sha256s: list[str] = field(default_factory=list)
    """The SHA-256 of the file, then of each decompressed layer."""
    tensors: list[Tensor] = field(default_factory=list)


def sniff(head: bytes) -> str | None:
    """The codec whose magic bytes ``head`` starts with, ``"safetensors"`` for an 8-byte length followed by a
    JSON object, or None."""
    for kind, magic in CODECS:
        if head.startswith(magic) and (kind != "bz2" or head[3:4] in (b"1", b"2", b"3", b"4", b"5", b"6", b"7",
                                                                         b"8", b"9")):
            return kind
    return "safetensors" if head[8:9] == b"{" else None


class _Reader:
    """A stream read front to back: every byte read is hashed and counted, and reading more than ``limit``
    bytes (None: no limit) raises Undecodable."""

    def __init__(self, raw: Any, limit: int | None, what: str) -> None:
        self.raw, self.limit, self.what = raw, limit, what
        self.buffer = b""
        self.count = 0
        self.sha = hashlib.sha256()

    def peek(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.raw.read(n - len(self.buffer))
            if not chunk:
                break
            self.buffer += chunk
        return self.buffer[:n]

    def read(self, n: int = _CHUNK) -> bytes:
        """Up to ``n`` bytes: fewer only at the end."""
        parts, have = [self.buffer[:n]], min(n, len(self.buffer))
        self.buffer = self.buffer[n:]
        while have < n:
            chunk = self.raw.read(min(n - have, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.count += len(data)
        if self.limit is not None and self.count > self.limit:
            raise Undecodable(f"{self.what} is larger than {self.limit} bytes (max_weights_bytes)")
        self.sha.update(data)
        return data

    def drain(self) -> None:
        while self.read():
            pass


def _open(kind: str, source: _Reader) -> Any:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=source, mode="rb")
    if kind == "bz2":
        return bz2.BZ2File(source, mode="rb")
    if kind == "xz":
        return lzma.LZMAFile(source, mode="rb")
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)


def _codec_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:  # pragma: no cover - a dependency of the dataset backend
        pass
    return errors


def _entries(header: Any, size: int | None) -> list[tuple[int, int, str, str, tuple[int, ...]]]:
    """The tensors a header declares, by offset: each checked (dtype known, byte range matching the shape,
    inside the data when its size is known, overlapping no other)."""
    if not isinstance(header, dict):
        raise Undecodable("its header is not a JSON object")
    out = []
    for name, spec in header.items():
        if name == "__metadata__":
            if spec is not None and not isinstance(spec, dict):
                raise Undecodable("its __metadata__ is not an object")
            continue
        if not isinstance(spec, dict):
            raise Undecodable(f"tensor {name!r} is not described by an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise Undecodable(f"tensor {name!r} has an unknown dtype {str(dtype)[:40]!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise Undecodable(f"tensor {name!r} has no valid shape")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise Undecodable(f"tensor {name!r} has no valid data_offsets")
        begin, end = offsets
        if math.prod(shape) * DTYPE_SIZES[dtype] != end - begin:
            raise Undecodable(f"tensor {name!r}: its byte range does not match its dtype and shape")
        if size is not None and end > size:
            raise Undecodable(f"tensor {name!r} ends past the end of the file")
        out.append((begin, end, name, dtype, tuple(shape)))
    out.sort()
    for (_, end, name, _, _), (begin, _, other, _, _) in itertools.pairwise(out):
        if begin < end:
            raise Undecodable(f"tensors {name!r} and {other!r} overlap")
    return out


def read_safetensors(reader: _Reader, size: int | None, header_limit: int = HEADER_LIMIT) -> list[Tensor]:
    """Every tensor of the safetensors content ``reader`` is at the start of (``size``: its length, when
    known), with its digest; the header is checked before any tensor is read."""
    head = reader.read(8)
    if len(head) < 8:
        raise Undecodable("it is truncated before its header length")
    n = int.from_bytes(head, "little")
    if n > header_limit:
        raise Undecodable(f"it declares a header of {n} bytes, over the limit of {header_limit}")
    if size is not None and 8 + n > size:
        raise Undecodable(f"it declares a header of {n} bytes in {size} bytes")
    raw = reader.read(n)
    if len(raw) < n:
        raise Undecodable("it is truncated inside its header")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Undecodable(f"its header is not JSON ({str(exc).splitlines()[0][:80]})") from None
    out, at = [], 0
    for begin, end, name, dtype, shape in _entries(header, None if size is None else size - 8 - n):
        while at < begin:
            skipped = reader.read(min(begin - at, _CHUNK))
            if not skipped:
                raise Undecodable(f"it is truncated before tensor {name!r}")
            at += len(skipped)
        digest = hashlib.sha256(f"{dtype}\x00{','.join(map(str, shape))}\x00".encode("ascii"))
        width, pattern, constant = DTYPE_SIZES[dtype], b"", True
        while at < end:
            chunk = reader.read(min(end - at, _CHUNK))
            if not chunk:
                raise Undecodable(f"it is truncated inside tensor {name!r}")
            digest.update(chunk)
            pattern = pattern or chunk[:width]
            # chunks are whole multiples of the element width (the chunk size and every range are)
            constant = constant and chunk == pattern * (len(chunk) // width)
            at += len(chunk)
        out.append(Tensor(name, dtype, shape, digest.hexdigest(), constant))
    return out


def read_contents(fh: BinaryIO, size: int, limit: int, *, header_limit: int = HEADER_LIMIT,
                  decode: bool = True) -> Contents:
    """What the file ``fh`` (``size`` bytes) holds: its SHA-256 always; with ``decode``, each compressed layer
    decompressed (at most ``limit`` bytes each) and hashed, and the tensors of safetensors content (of at most
    ``limit`` bytes, its header of at most ``header_limit``). Undecodable when content that looks like either
    cannot be read within the bounds. An error reading the file itself is raised as it is (OSError)."""
    out = Contents()
    outer = _Reader(fh, None, "the file")
    readers = [outer]
    reader, known = outer, size
    try:
        while decode:
            kind = sniff(reader.peek(16))
            if kind is None:
                break
            out.kinds.append(kind)
            if kind == "safetensors":
                if known is not None and known > limit:
                    raise Undecodable(f"it is {known} bytes, over the limit of {limit} (max_weights_bytes)")
                out.tensors = read_safetensors(reader, known, min(HEADER_LIMIT, header_limit, limit))
                break
            if len(out.kinds) > MAX_LAYERS:
                raise Undecodable(f"it is compressed more than {MAX_LAYERS} times over")
            reader = _Reader(_open(kind, reader), limit, f"its {kind} content")
            readers.append(reader)
            known = None
        for layer in reversed(readers):  # innermost first: reading it reads the layers around it
            layer.drain()
    except _codec_errors() as exc:
        if reader is outer and not isinstance(exc, EOFError):
            raise  # the file itself cannot be read: the caller's error, not the content's
        codec = next((k for k in reversed(out.kinds) if k != "safetensors"), "content")
        raise Undecodable(f"its {codec} stream cannot be decompressed"
                          f" ({str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__})") from None
    out.sha256s = [layer.sha.hexdigest() for layer in readers]
    return out


def tensors_of(data: bytes) -> list[Tensor]:
    """The tensors of safetensors bytes held in memory."""
    return read_safetensors(_Reader(io.BytesIO(data), None, "the weights"), len(data))


def _tensors_or_none(data: bytes | None) -> list[Tensor]:
    try:
        return tensors_of(data) if data is not None else []
    except Undecodable:
        return []


def retire(reg: dict[str, Any], shard: str, old_sha: str, old: bytes | None, keep: bytes | None = None) -> int:
    """Record in the registry that ``shard``'s weights ``old_sha`` were retired: the tag of the whole file, and
    (from ``old``, its bytes, when they could be read) the tag of each of its tensors that carries anything
    trained: a constant tensor, or one the weights replacing it (``keep``) hold too, is left out. Returns how
    many tensor tags the shard has."""
    tags = reg.setdefault("retired", {}).setdefault(shard, [])
    if retired_tag(old_sha) not in tags:
        tags.append(retired_tag(old_sha))
    tensors, kept = _tensors_or_none(old), _tensors_or_none(keep)
    known = reg.setdefault("retired_tensors", {}).setdefault(shard, [])
    kept_digests = {t.digest for t in kept}
    for t in tensors:
        if not t.constant and t.digest not in kept_digests and tensor_tag(t.digest) not in known:
            known.append(tensor_tag(t.digest))
    return len(known)


def retired_index(reg: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """The registry's retired weights: whole-file tag -> shard, and shard -> its tensor tags (a registry written
    before tensors were recorded has none)."""
    whole = {tag: shard for shard, tags in reg.get("retired", {}).items() for tag in tags}
    tensors = {shard: set(tags) for shard, tags in reg.get("retired_tensors", {}).items() if tags}
    return whole, tensors


__all__ = [
    "CODECS",
    "DTYPE_SIZES",
    "HEADER_LIMIT",
    "Contents",
    "Tensor",
    "Undecodable",
    "read_contents",
    "read_safetensors",
    "retire",
    "retired_index",
    "retired_tag",
    "sniff",
    "tensor_tag",
    "tensors_of",
]
