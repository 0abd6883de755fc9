"""LlamaIndex's persisted JSON, read and scrubbed by what it holds, never by its file's name.

A LlamaIndex app persists its docstore (``docstore.json``: each node whole, text included, under its id), its
index store (``index_store.json``: each index's node ids, inside a JSON string), a simple vector store
(embeddings keyed by node id), and an ingestion pipeline's cache (``llama_cache``: each transformation's output
nodes, whole). Every file of the store's folder that parses as JSON is walked, whatever its name or suffix (a
``.bak`` copy is a copy): an entry is removed where its key is an erased node's id, its value is that id, or its
value is that node (``id_``), a cache entry holding it, or a node whose text has an erased node's keyed content
hash; a JSON object inside a string is walked the same way; a source document's record whose ``node_ids`` the
walk emptied goes too. A gzip, bz2 or xz file is opened (within ``MAX_INFLATED`` bytes) and, where it holds JSON,
written back with the same codec. What is not JSON is left to the byte scan; a file in a codec this cannot open
(zstd, LZ4) or past the bound is named as unreadable, so that nothing it may hold is taken as checked."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tombstone.fsutil import write_atomic

_DROP = object()
MAX_INFLATED = 1 << 30
"""The most bytes one compressed file is inflated to."""
_CODECS = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}
_UNREADABLE = {b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4"}


class Unreadable(Exception):
    """A file whose content this cannot read (a codec it does not open, or past ``MAX_INFLATED``)."""


def codec_of(head: bytes) -> str | None:
    return next((name for magic, name in _CODECS.items() if head.startswith(magic)), None)


def _inflate(raw: bytes, codec: str, where: Path) -> bytes:
    if codec == "gzip":
        unpack = zlib.decompressobj(wbits=47)
        out = unpack.decompress(raw, MAX_INFLATED + 1)
        done = unpack.eof and not unpack.unconsumed_tail
    else:
        unpack = bz2.BZ2Decompressor() if codec == "bz2" else lzma.LZMADecompressor()
        out = unpack.decompress(raw, MAX_INFLATED + 1)
        done = unpack.eof
    if len(out) > MAX_INFLATED or not done:
        raise Unreadable(f"{where}: {codec} data past {MAX_INFLATED} bytes, or more than one stream")
    return out


def _deflate(data: bytes, codec: str) -> bytes:
    return gzip.compress(data, mtime=0) if codec == "gzip" else bz2.compress(data) if codec == "bz2" \
        else lzma.compress(data)


def read(path: Path) -> tuple[bytes, str | None]:
    """The file's content and the codec it was stored with (None: plain); raises Unreadable."""
    raw = path.read_bytes()
    codec = codec_of(raw[:8])
    if codec is not None:
        try:
            return _inflate(raw, codec, path), codec
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise Unreadable(f"{path}: corrupt {codec} data ({exc})") from exc
    other = next((name for magic, name in _UNREADABLE.items() if raw.startswith(magic)), None)
    if other is not None:
        raise Unreadable(f"{path}: {other}-compressed, which this store's probe does not open")
    return raw, None


class Matcher:
    """Which erased node a JSON value is or holds: ``ids`` the erased node ids, ``hashes`` their recorded
    (keyed) content hashes -> id, ``key`` turns a SHA-256 hex digest into the recorded form."""

    def __init__(self, ids: set[str], hashes: dict[str, str], key: Callable[[str], str] | None) -> None:
        self.ids, self.hashes, self.key = ids, hashes, key

    def _text(self, text: str) -> str | None:
        if not self.hashes:
            return None
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return self.hashes.get(self.key(digest) if self.key is not None else digest)

    def hit(self, value: Any) -> set[str]:
        """The erased ids ``value`` is or holds (empty where it is none of them)."""
        if isinstance(value, str):
            return {value} if value in self.ids else set()
        if not isinstance(value, dict):
            return set()
        out = set()
        data = value.get("__data__", value)
        if isinstance(data, dict):
            nid = data.get("id_")
            if isinstance(nid, str) and nid in self.ids:
                out.add(nid)
            text = data.get("text")
            if isinstance(text, str) and (aid := self._text(text)) is not None:
                out.add(aid)
        nodes = value.get("nodes")
        if isinstance(nodes, list):  # an ingestion cache entry: every output node of one transformation run
            for node in nodes:
                out |= self.hit(node)
        return out


def walk(obj: Any, m: Matcher, found: set[str]) -> Any:
    """``obj`` without what ``m`` matches (the same object where nothing matched); ``found`` collects ids."""
    if isinstance(obj, dict):
        out, changed = {}, False
        for k, v in obj.items():
            hits = {k} if k in m.ids else m.hit(v)
            if hits:
                found |= hits
                changed = True
                continue
            new = _inner(v, m, found)
            if new is _DROP:
                changed = True
                continue
            changed |= new is not v
            out[k] = new
        return out if changed else obj
    if isinstance(obj, list):
        out_list, changed = [], False
        for v in obj:
            hits = m.hit(v)
            if hits:
                found |= hits
                changed = True
                continue
            new = _inner(v, m, found)
            changed |= new is not v
            out_list.append(new)
        return out_list if changed else obj
    return obj


def _inner(v: Any, m: Matcher, found: set[str]) -> Any:
    if isinstance(v, str) and v[:1] in "{[":
        try:
            parsed = json.loads(v)
        except ValueError:
            return v
        new = walk(parsed, m, found)
        return v if new is parsed else json.dumps(new)
    if isinstance(v, (dict, list)):
        new = walk(v, m, found)
        if new is not v and isinstance(new, dict) and new.get("node_ids") == [] and v.get("node_ids"):
            return _DROP  # a source document's record, every node of it erased
        return new
    return v


def json_files(folder: Path) -> Iterator[Path]:
    """Every regular file under ``folder`` (links and lock files aside)."""
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.name.endswith(".tombstone.lock"):
            continue
        yield path


def load(path: Path) -> Any:
    """The file's JSON (a compressed file's, inflated), or None where it is not JSON; raises Unreadable."""
    return _load(path)[0]


def _load(path: Path) -> tuple[Any, str | None]:
    data, codec = read(path)
    try:
        return json.loads(data), codec
    except (ValueError, UnicodeDecodeError):
        return None, codec
    except RecursionError:
        raise Unreadable(f"{path}: JSON nested too deep to read") from None


def _walked(path: Path, data: Any, m: Matcher, found: set[str]) -> Any:
    """``walk`` of one file's JSON; Unreadable where it nests deeper than the walk can go."""
    try:
        return walk(data, m, found)
    except RecursionError:
        raise Unreadable(f"{path}: JSON nested too deep to walk") from None


def compressed(folder: Path) -> tuple[list[tuple[str, bytes]], list[str]]:
    """Each gzip, bz2 or xz file's inflated content, by its name relative to the folder (for the byte scan), and
    the files whose content cannot be read (each with why): one read of each file."""
    opened, blocked = [], []
    for path in json_files(folder):
        try:
            data, codec = read(path)
        except Unreadable as exc:
            blocked.append(str(exc))
            continue
        if codec is not None:
            opened.append((f"{path.relative_to(folder).as_posix()} ({codec})", data))
    return opened, blocked


def find(folder: Path, m: Matcher) -> dict[str, set[str]]:
    """Per erased id, the files (relative to ``folder``) whose JSON still holds it."""
    out: dict[str, set[str]] = {}
    for path in json_files(folder):
        try:
            data = load(path)
        except Unreadable:
            continue  # named by ``unreadable``
        if data is None:
            continue
        found: set[str] = set()
        try:
            _walked(path, data, m, found)
        except Unreadable:
            continue  # left to the byte scan, which reads every file whole
        for aid in found:
            out.setdefault(aid, set()).add(path.relative_to(folder).as_posix())
    return out


def scrub(folder: Path, m: Matcher) -> dict[str, int]:
    """Rewrite every JSON file that holds an erased node without it (atomically, keeping the file's mode);
    returns the entries removed per file."""
    changed: dict[str, int] = {}
    for path in json_files(folder):
        try:
            data, codec = _load(path)
        except Unreadable:
            continue  # left as it is: the probe names it
        if data is None:
            continue
        found: set[str] = set()
        try:
            new = _walked(path, data, m, found)
        except Unreadable:
            continue  # left as it is: the byte scan finds the ids it holds
        if new is data:
            continue
        mode = path.stat().st_mode & 0o777
        payload = json.dumps(new).encode("utf-8")
        write_atomic(path, _deflate(payload, codec) if codec is not None else payload)
        os.chmod(path, mode)
        changed[path.relative_to(folder).as_posix()] = len(found)
    return changed
