"""The files of a dataset: shards (JSONL, gzip JSONL, Parquet), manifests, the current pointer and pins.

A dataset is a directory::

    CURRENT                      {"version": 7, "manifest": "manifests/v000007.json", "sha256": "..."}
    manifests/v000007.json       one manifest per version (shards with rows and SHA-256, suppressed and
                                 deleted ids, the parent version and the SHA-256 of its manifest)
    shards/part-000003.parquet   the examples, one row each: id, text, metadata (JSON text)
    pins/<run>.json              a training run's pin: the version it read and that manifest's SHA-256

Every file is written whole to a temporary file beside its target, fsynced, renamed over the target and
the directory fsynced, so a reader (or a process resumed after a kill) sees the old file or the new one,
never a torn one. Every read opens a regular file without following a link and without blocking, and
what is hashed is exactly what is decoded.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Iterable, Sequence
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


class PinMismatchError(DatasetFileError):
    """A manifest or shard whose bytes no longer hash to what its pin records (an erasure rewrote it, or
    something else did): the loader refuses it rather than train on data nobody pinned."""


# -- bytes on disk ------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_file(path: Path) -> bytes:
    """The bytes of a regular file, opened without following a link or blocking (a FIFO planted at a shard
    path is refused, never waited on). FileNotFoundError when nothing is there."""
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise DatasetFileError(f"dataset file {path} is not a regular file")
        return fh.read()


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def write_atomic(path: Path, data: bytes, *, before_rename: str | None = None) -> None:
    """Write ``path`` so that it holds the old bytes or the new ones, never part of them: an exclusive
    temporary file beside it (``.<name>.<random>.tmp``), fsynced, renamed over it, the folder fsynced.
    ``before_rename`` names the kill point between the complete temporary file and the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
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


# -- shards --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One training example as a shard holds it."""

    id: str
    text: str
    metadata: str
    """The example's metadata as the JSON text stored in the shard."""

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads(self.metadata) if self.metadata else {}


def format_of(name: str) -> str | None:
    """The shard format a file name says (a temporary file's target name counts), or None."""
    if is_temp(name):
        name = target_of_temp(name)
    for fmt, suffix in sorted(SUFFIXES.items(), key=lambda kv: -len(kv[1])):
        if name.endswith(suffix):
            return fmt
    return None


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as exc:  # pragma: no cover - pyarrow is installed with the dataset extra
        raise DatasetFileError("Parquet shards need pyarrow: pip install 'tombstone-rag[dataset]'") from exc
    return pyarrow


def encode_rows(rows: Sequence[Row], fmt: str, *, compression: str = "zstd") -> bytes:
    """A shard's bytes holding ``rows`` in ``fmt``."""
    if fmt == "parquet":
        pa = _pyarrow()
        table = pa.table({"id": pa.array([r.id for r in rows], pa.string()),
                          "text": pa.array([r.text for r in rows], pa.string()),
                          "metadata": pa.array([r.metadata for r in rows], pa.string())})
        return _parquet_bytes(table, compression)
    data = b"".join(_jsonl_line(row) for row in rows)
    if fmt == "jsonl.gz":
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    if fmt == "jsonl":
        return data
    raise ValueError(f"unknown shard format {fmt!r}")


def _jsonl_line(row: Row) -> bytes:
    meta = json.loads(row.metadata) if row.metadata else {}
    return (json.dumps({"id": row.id, "text": row.text, "metadata": meta}, ensure_ascii=False,
                       separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")


def _parquet_bytes(table: Any, compression: str) -> bytes:
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(table, sink, compression=None if compression == "none" else compression)
    return sink.getvalue().to_pybytes()


def _jsonl_lines(data: bytes, fmt: str, where: str) -> list[bytes]:
    text = _jsonl_text(data, fmt, where)
    return text[:-1].split(b"\n") if text else []


def _jsonl_text(data: bytes, fmt: str, where: str) -> bytes:
    """A JSONL shard's text (decompressed), which ends with a newline unless it is empty."""
    if fmt == "jsonl.gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetFileError(f"shard {where} is not a complete gzip file ({exc})") from exc
    if data and not data.endswith(b"\n"):
        raise DatasetFileError(f"shard {where} ends in the middle of a row")
    return data


def _parse_line(line: bytes, where: str, n: int) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise DatasetFileError(f"shard {where}: row {n} is not JSON ({exc})") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(obj.get("text"), str):
        raise DatasetFileError(f"shard {where}: row {n} has no string id and text")
    return obj


def _parquet_table(data: bytes, where: str, columns: Sequence[str] | None = None) -> Any:
    pa = _pyarrow()
    try:
        table = pa.parquet.read_table(pa.BufferReader(data), columns=list(columns) if columns else None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetFileError(f"shard {where} is not a readable Parquet file ({exc})") from exc
    for name in columns or ("id", "text", "metadata"):
        if name not in table.column_names:
            raise DatasetFileError(f"shard {where} has no {name!r} column")
    return table


def decode_rows(data: bytes, fmt: str, where: str = "shard") -> list[Row]:
    """Every row of a shard, in order."""
    if fmt == "parquet":
        table = _parquet_table(data, where)
        return [Row(i, t or "", m or "") for i, t, m in zip(table.column("id").to_pylist(),
                                                           table.column("text").to_pylist(),
                                                           table.column("metadata").to_pylist())]
    rows = []
    for n, line in enumerate(_jsonl_lines(data, fmt, where)):
        obj = _parse_line(line, where, n)
        rows.append(Row(obj["id"], obj["text"], json.dumps(obj.get("metadata") or {}, ensure_ascii=False,
                                                          separators=(",", ":"), sort_keys=True)))
    return rows


def decode_columns(data: bytes, fmt: str, where: str = "shard", *, texts: bool = True) -> tuple[list[str], list[str] | None]:
    """The ids (and texts) of every row of a shard: what the probes need, without building rows."""
    if fmt == "parquet":
        table = _parquet_table(data, where, ("id", "text") if texts else ("id",))
        return (table.column("id").to_pylist(), [t or "" for t in table.column("text").to_pylist()] if texts else None)
    ids, out = [], []
    for n, line in enumerate(_jsonl_lines(data, fmt, where)):
        obj = _parse_line(line, where, n)
        ids.append(obj["id"])
        out.append(obj["text"])
    return ids, out if texts else None


def drop_rows(data: bytes, fmt: str, drop: set[str], where: str = "shard") -> tuple[bytes | None, int, int]:
    """The shard's bytes without the rows whose id is in ``drop``: (new bytes or None when nothing is
    dropped, rows dropped, rows kept). Surviving JSONL lines are copied byte for byte; a Parquet shard is
    rewritten with its own schema and the compression of its first column."""
    if fmt == "parquet":
        pa = _pyarrow()
        try:
            meta = pa.parquet.read_metadata(pa.BufferReader(data))
            compression = meta.row_group(0).column(0).compression.lower() if meta.num_row_groups else "zstd"
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DatasetFileError(f"shard {where} is not a readable Parquet file ({exc})") from exc
        table = _parquet_table(data, where)
        hit = pa.compute.is_in(table.column("id"), value_set=pa.array(sorted(drop), pa.string()))
        dropped = pa.compute.sum(hit).as_py() or 0
        if not dropped:
            return None, 0, table.num_rows
        kept = table.filter(pa.compute.invert(hit))
        return _parquet_bytes(kept, "none" if compression == "uncompressed" else compression), dropped, kept.num_rows
    text = _jsonl_text(data, fmt, where)
    total = text.count(b"\n")
    spans = []
    for start, end in _lines_that_may_hold(text, drop):
        try:
            row_id = _parse_line(text[start:end], where, -1)["id"]
        except DatasetFileError:
            _parse_line(text[start:end], where, text.count(b"\n", 0, start))  # raises, naming the row
            raise
        if row_id in drop:
            spans.append((start, end + 1))
    if not spans:
        return None, 0, total
    out, at = [], 0
    for start, end in spans:
        out.append(text[at:start])
        at = end
    out.append(text[at:])
    kept = b"".join(out)
    dropped = len(spans)
    return (gzip.compress(kept, compresslevel=GZIP_LEVEL, mtime=0) if fmt == "jsonl.gz" else kept), dropped, total - dropped


def _lines_that_may_hold(text: bytes, ids: set[str]) -> list[tuple[int, int]]:
    """The (start, end) of each line of JSON text that can hold one of the ids as a string, found in one pass
    for every way a JSON writer spells them (raw UTF-8, ASCII escapes, escaped slashes). Only these lines are
    parsed; the probe decodes every line regardless, so a spelling missed here could never pass as erased."""
    import ahocorasick_rs

    forms = set()
    for i in ids:
        for spelled in (json.dumps(i, ensure_ascii=False)[1:-1], json.dumps(i)[1:-1]):
            forms.update((spelled.encode("utf-8"), spelled.replace("/", "\\/").encode("utf-8")))
    forms.discard(b"")
    if not forms:
        return []
    lines = set()
    for _, match_start, _ in ahocorasick_rs.BytesAhoCorasick(sorted(forms)).find_matches_as_indexes(text, overlapping=True):
        start = text.rfind(b"\n", 0, match_start) + 1
        lines.add((start, text.index(b"\n", match_start)))
    return sorted(lines)


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
    def from_bytes(cls, data: bytes, where: str) -> "Manifest":
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
    parts = Path(path).parts
    if Path(path).is_absolute() or len(parts) != 2 or parts[0] != folder or parts[1] in ("", ".", ".."):
        raise ValueError(f"path {path!r} is not a file under {folder}/")
    return "/".join(parts)


def manifest_name(version: int) -> str:
    return f"{MANIFESTS}/v{version:06d}.json"


def manifest_versions(root: Path) -> dict[int, Path]:
    """Every manifest file on disk, by version."""
    folder = root / MANIFESTS
    if not folder.is_dir():
        return {}
    out = {}
    for entry in os.scandir(folder):
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
