"""The files of a dataset: shards (JSONL, gzip JSONL, Parquet), manifests, the current pointer and pins.

A dataset is a directory::

    CURRENT                      {"version": 7, "manifest": "manifests/v000007.json", "sha256": "..."}
    manifests/v000007.json       one manifest per version (shards with rows and SHA-256, suppressed and
                                 deleted ids, the parent version and the SHA-256 of its manifest)
    shards/part-000003.parquet   the examples, one row each: id, text, metadata (JSON text)
    pins/<run>.json              a training run's pin: the version it read and that manifest's SHA-256

Every file is written whole to a temporary file beside its target, fsynced, renamed over the target and
the directory fsynced, so a reader (or a process resumed after a kill) sees the old file or the new one,
never a torn one; files are created mode 0600, folders 0700. Every read opens a regular file inside the
dataset directory (its folders are never links) without following a link and without blocking, and what
is hashed is exactly what is decoded.

Shard files are untrusted data: every decoder is bounded (:class:`DecodeLimits`: the bytes a file may have
on disk and decode to, the rows it may hold), and a file past a bound raises :class:`DatasetBoundError`
naming it, never a MemoryError.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.errors import StoreUnavailableError
from tombstone.faults import kill_point

FORMAT = "tombstone-dataset"
FORMAT_VERSION = 1
CURRENT = "CURRENT"
MANIFESTS = "manifests"
SHARDS = "shards"
PINS = "pins"
TEMP_SUFFIX = ".tmp"
SUFFIXES = {"jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz", "parquet": ".parquet"}
"""Shard formats and the file suffix each is written with."""
COMPRESSIONS = ("zstd", "snappy", "gzip", "none")
GZIP_LEVEL = 6
"""gzip level of ``.jsonl.gz`` shards (gzip's own default; written with no timestamp, so the same rows give
the same bytes)."""
_MANIFEST_NAME = re.compile(r"^v(\d{6,})\.json$")
_PIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class DatasetFileError(StoreUnavailableError):
    """A dataset file that cannot be used: missing, not a regular file, or not what its name says.
    Retrying does not help."""

    retryable = False


class DatasetBoundError(DatasetFileError):
    """A dataset file past a decode bound (:class:`DecodeLimits`): too large on disk, decoding to too many
    bytes (a gzip or Parquet bomb) or holding too many rows. Nothing of it was used."""


MAX_DECODED_BYTES = 1 << 30
"""Default bound (store option ``max_decoded_bytes``) on the bytes of one dataset file: as read from disk,
and as decoded (a gzip shard's decompressed text, a Parquet shard's column values)."""
MAX_ROWS = 2_000_000
"""Default bound (store option ``max_rows``) on the rows of one shard (20 times a shard this store writes
by default)."""


@dataclass(frozen=True)
class DecodeLimits:
    """The decoders' bounds for one store (see ``MAX_DECODED_BYTES`` and ``MAX_ROWS``)."""

    max_decoded_bytes: int = MAX_DECODED_BYTES
    max_rows: int = MAX_ROWS

    @classmethod
    def from_options(cls, options: Any, store: str = "dataset") -> DecodeLimits:
        """The bounds a store's options set (``max_decoded_bytes``, ``max_rows``); anything but a whole
        number of at least 1 is a one-line configuration error."""
        from tombstone.config import positive_int

        return cls(max_decoded_bytes=positive_int(options, "max_decoded_bytes", MAX_DECODED_BYTES, store),
                   max_rows=positive_int(options, "max_rows", MAX_ROWS, store))

    def too_large(self, where: str, what: str, amount: int | str) -> DatasetBoundError:
        return DatasetBoundError(f"{where} {what} {amount} bytes, past the bound (max_decoded_bytes"
                                 f" {self.max_decoded_bytes}): not decoded")

    def too_many_rows(self, where: str, rows: int | str) -> DatasetBoundError:
        return DatasetBoundError(f"{where} holds {rows} rows, past the bound (max_rows {self.max_rows}): not decoded")


DEFAULT_LIMITS = DecodeLimits()
FILE_MODE = 0o600
FOLDER_MODE = 0o700


class PinMismatchError(DatasetFileError):
    """A manifest or shard whose bytes no longer hash to what its pin records (an erasure rewrote it, or
    something else did): the loader refuses it rather than train on data nobody pinned."""


# -- bytes on disk ------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_file(path: Path, limit: int = MAX_DECODED_BYTES, *, head: int | None = None) -> bytes:
    """The bytes of a regular file, opened without following a link or blocking (a FIFO or a link planted
    at a shard path is refused, never waited on or followed), and no larger than ``limit`` bytes
    (DatasetBoundError); with ``head``, its first ``head`` bytes only, whatever its size. FileNotFoundError
    when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise DatasetFileError(f"dataset file {path} cannot be read ({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DatasetFileError(f"dataset file {path} is not a regular file")
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DatasetFileError(f"dataset file {path} is not a regular file that can be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        now = os.fstat(fh.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise DatasetFileError(f"dataset file {path} is not a regular file")
        if head is not None:
            return fh.read(head)
        if now.st_size > limit:
            raise DatasetBoundError(f"dataset file {path} has {now.st_size} bytes, past the bound"
                                    f" (max_decoded_bytes {limit}): not read")
        data = fh.read(limit + 1)
        if len(data) > limit:
            raise DatasetBoundError(f"dataset file {path} grew past the bound (max_decoded_bytes {limit}): not read")
        return data


def dataset_folder(root: Path, name: str) -> Path:
    """``root / name``, one of the dataset's folders: refused (DatasetFileError) when it is a link or not a
    folder, so nothing is read, written or removed through it outside the dataset directory."""
    path = root / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise DatasetFileError(f"dataset folder {path} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DatasetFileError(f"dataset folder {path} is a link or not a folder: refused (nothing is read or"
                               " written through it)")
    return path


def make_folder(path: Path) -> None:
    """Create a folder of the dataset and the folders above it that are missing, each mode 0700."""
    missing = []
    while not path.exists() and not path.is_symlink() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=FOLDER_MODE)


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def write_atomic(path: Path, data: bytes, *, before_rename: str | None = None) -> None:
    """Write ``path`` so that it holds the old bytes or the new ones, never part of them: an exclusive
    temporary file beside it (``.<name>.<random>.tmp``), fsynced, renamed over it, the folder fsynced.
    ``before_rename`` names the kill point between the complete temporary file and the rename. The file is
    mode 0600 (``mkstemp``), a folder it needs 0700."""
    make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename:
            kill_point(before_rename)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def target_of_temp(name: str) -> str:
    """The file a temporary file was being written for (``.part-1.parquet.x1y2.tmp`` → ``part-1.parquet``)."""
    return name[1:-len(TEMP_SUFFIX)].rsplit(".", 1)[0]


# -- manifests, the current pointer, pins --------------------------------------------------------


@dataclass(frozen=True)
class ShardEntry:
    path: str
    """Relative to the dataset directory (``shards/part-000001.parquet``)."""
    format: str
    rows: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "rows": self.rows, "sha256": self.sha256}


@dataclass
class Manifest:
    """One version of the dataset."""

    version: int
    parent: int | None = None
    """The version this one was made from."""
    previous_sha256: str | None = None
    """SHA-256 of the parent's manifest file."""
    shards: list[ShardEntry] = field(default_factory=list)
    suppressed: list[str] = field(default_factory=list)
    """Examples an erasure is removing: no loader yields them, whatever version it reads."""
    deleted: list[str] = field(default_factory=list)
    """Examples deleted from this version on (the dataset's own delete): their rows stay in the shards."""
    rewritten_by_erasure: bool = False
    """An erasure removed example ids from this file after it was first written."""

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "version": self.version, "parent": self.parent,
            "previous_sha256": self.previous_sha256, "shards": [s.to_json() for s in self.shards],
            "suppressed": sorted(set(self.suppressed)), "deleted": sorted(set(self.deleted)),
        }
        if self.rewritten_by_erasure:
            body["rewritten_by_erasure"] = True
        return (json.dumps(body, ensure_ascii=False, indent=1, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("format") != FORMAT:
                raise ValueError("not a dataset manifest")
            if body.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format version {body.get('format_version')!r} is not {FORMAT_VERSION}")
            shards = [ShardEntry(safe_relpath(s["path"], SHARDS), str(s["format"]), int(s["rows"]), str(s["sha256"]))
                      for s in body["shards"]]
            if any(s.format not in SUFFIXES for s in shards):
                raise ValueError("unknown shard format")
            parent = body.get("parent")
            manifest = cls(version=int(body["version"]), parent=None if parent is None else int(parent),
                           previous_sha256=body.get("previous_sha256"), shards=shards,
                           suppressed=[str(i) for i in body.get("suppressed", [])],
                           deleted=[str(i) for i in body.get("deleted", [])],
                           rewritten_by_erasure=bool(body.get("rewritten_by_erasure", False)))
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetFileError(f"{where} is not a readable dataset manifest ({exc})") from exc
        return manifest

    def hidden(self) -> set[str]:
        return set(self.suppressed) | set(self.deleted)


def safe_relpath(path: str, folder: str) -> str:
    """A path inside ``folder`` of the dataset, as manifests record it; anything else is refused."""
    if not isinstance(path, str) or "\x00" in path or "\\" in path:
        raise ValueError(f"path {path!r} is not a file under {folder}/")
    parts = Path(path).parts
    if Path(path).is_absolute() or len(parts) != 2 or parts[0] != folder or parts[1] in ("", ".", ".."):
        raise ValueError(f"path {path!r} is not a file under {folder}/")
    return "/".join(parts)


def manifest_name(version: int) -> str:
    return f"{MANIFESTS}/v{version:06d}.json"


def manifest_versions(root: Path) -> dict[int, Path]:
    """Every manifest file on disk, by version."""
    where = dataset_folder(root, MANIFESTS)
    if not where.is_dir():
        return {}
    out = {}
    for entry in os.scandir(where):
        match = _MANIFEST_NAME.match(entry.name)
        if match:
            out[int(match.group(1))] = Path(entry.path)
    return dict(sorted(out.items()))


def pin_file(root: Path, run_id: str) -> Path:
    """Where a training run's pin lives: ``pins/<run id>.json``, or a slug plus a short hash of the run id
    when it is not a plain file name."""
    if _PIN_NAME.match(run_id):
        return root / PINS / f"{run_id}.json"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._-")[:60] or "run"
    return root / PINS / f"{slug}+{sha256(run_id.encode('utf-8'))[:12]}.json"


def dump_json(body: dict[str, Any]) -> bytes:
    return (json.dumps(body, ensure_ascii=False, indent=1, sort_keys=True) + "\n").encode("utf-8")


def load_json(data: bytes, where: str, keys: Iterable[str]) -> dict[str, Any]:
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or any(k not in body for k in keys):
            raise ValueError(f"it needs {', '.join(keys)}")
    except ValueError as exc:
        raise DatasetFileError(f"{where} is not readable ({exc})") from exc
    return body


def iter_files(root: Path) -> list[Path]:
    """Every non-folder under the dataset directory (the physical probe's list: the scanner refuses, and
    names, whatever is not a regular file)."""
    out = []
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            else:
                out.append(Path(entry.path))
    return sorted(out)


__all__ = ["CURRENT", "DatasetBoundError", "DatasetFileError", "DecodeLimits", "Manifest", "PinMismatchError",
           "ShardEntry", "dataset_folder", "iter_files", "read_file", "write_atomic"]
