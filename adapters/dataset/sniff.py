"""What a file holds, told by its content (never its name, suffix or folder), decoded within bounds.

The physical probe of a dataset decodes every file under the dataset directory that holds rows in a format
it reads, wherever it lies and whatever it is called: a gzip copy of a shard in ``shards/archive/``, a
zstd-compressed Parquet file in ``backup/``, a ``dump.jsonl.gz`` at the top. This module tells the format
from the bytes and yields the decoded string values:

* compression: gzip, zstd, bz2, xz and LZ4 (frame) by their magic numbers, unwrapped one layer at a time
  (at most ``MAX_DEPTH`` layers and archives around one payload);
* archives: zip (its members; an encrypted member cannot be read) and tar (ustar, its regular files);
* payloads: Parquet (a zstd- or snappy-compressed Parquet file is just Parquet: its pages are decoded by
  the Parquet reader), Arrow IPC files (Feather v2) and streams, JSON (any document: a list of rows, an
  object holding them), JSON lines, and CSV whose header names an id or text column (by delimiter ``,``,
  tab, ``;`` or ``|``).

Every decoder is bounded by the store's :class:`~.files.DecodeLimits`: a file's decompressed bytes (all of
its layers and members together), a payload's decoded values and rows. A file that is one of these formats
but cannot be decoded (truncated, corrupt, encrypted, past a bound) raises DatasetFileError or
DatasetBoundError naming it. Bytes that a compression layer or an archive held but that are no format read
here come back whole (:attr:`Piece.raw`), for a byte scan: only a plain file's bytes are on disk as written.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .arrowipc import arrow_batches, is_arrow_file, is_arrow_stream
from .files import DatasetBoundError, DatasetFileError, DecodeLimits
from .shards import _pyarrow, inflate, parquet_batches

HEAD = 1 << 16
"""The bytes of a file read to tell its format (a CSV header must end within them)."""
MAX_DEPTH = 3
"""Compression layers and archives around one payload (``.jsonl.gz``: one; a ``.tar.gz`` member's
``.csv.gz``: three); deeper is not decoded (DatasetFileError: the file is not checked)."""
MAX_MEMBERS = 10_000
"""Members of one archive that are decoded; an archive with more is not checked."""
CODECS = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"\xfd7zXZ\x00": "xz", b"\x04\x22\x4d\x18": "lz4"}
_BZ2_BLOCKS = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")
"""A bzip2 stream's first block (or its end-of-stream marker, when empty) after ``BZh1``-``BZh9``."""
ID_COLUMNS = frozenset({"id", "_id", "uid", "uuid", "key", "example_id", "artifact_id", "doc_id", "document_id",
                        "chunk_id", "record_id", "row_id"})
TEXT_COLUMNS = frozenset({"text", "content", "body", "document", "page_content", "passage", "prompt", "completion",
                          "response", "instruction", "input", "output", "question", "answer", "message", "messages"})
"""A CSV is read when its header names one of these columns (a text file is not otherwise told from CSV)."""
DELIMITERS = (",", "\t", ";", "|")
_BOM = b"\xef\xbb\xbf"
COMPRESSION = frozenset({*CODECS.values(), "bz2"})
TEXT_KINDS = frozenset({"json", "csv"})


@dataclass
class Piece:
    """Part of a decoded file: its string values, or bytes that no format here reads."""

    chain: str
    """How it was reached: ``gzip > jsonl``, ``tar member a/b.csv > csv``."""
    rows: int = 0
    cells: list[Any] = field(default_factory=list)
    """The decoded values that are strings (``str``) or binary (``bytes``), nested ones included."""
    raw: bytes | bytearray | None = None
    """Decompressed (or archived) bytes of no format read here: the caller byte-scans them."""


def kind_of(head: bytes | bytearray) -> str | None:
    """The format ``head`` (a file's first bytes) is: a compression (``gzip``, ``zstd``, ``bz2``, ``xz``,
    ``lz4``), an archive (``zip``, ``tar``), a payload (``parquet``, ``parquet-encrypted``, ``arrow``,
    ``arrow-stream``, ``json``, ``csv``), or None (none read here)."""
    for magic, codec in CODECS.items():
        if head.startswith(magic):
            return codec
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in _BZ2_BLOCKS:
        return "bz2"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"PARE"):
        return "parquet-encrypted"
    if is_arrow_file(head):
        return "arrow"
    if is_arrow_stream(head):
        return "arrow-stream"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    text = bytes(head[:HEAD]).removeprefix(_BOM).lstrip(b" \t\r\n")
    if text[:1] in (b"{", b"["):
        return "json"
    return "csv" if _csv_delimiter(text) else None


def _csv_delimiter(text: bytes) -> str | None:
    """The delimiter of a CSV header (the first line) naming an id or text column, or None."""
    end = text.find(b"\n")
    if end < 0:
        return None
    try:
        line = text[:end].rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        return None
    for delimiter in DELIMITERS:
        names = {cell.strip().strip('"').strip().lower() for cell in line.split(delimiter)}
        if len(names) > 1 and names & (ID_COLUMNS | TEXT_COLUMNS):
            return delimiter
    return None


class _Budget:
    """The bytes one file's layers and members may decompress to, all together."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        self.left = limits.max_decoded_bytes

    def take(self, n: int, where: str) -> None:
        self.left -= n
        if self.left < 0:
            raise DatasetBoundError(f"{where} decompresses to more than {self.limits.max_decoded_bytes} bytes, past"
                                    f" the bound (max_decoded_bytes {self.limits.max_decoded_bytes}): not decoded")


def decode(data: bytes | bytearray, where: str, limits: DecodeLimits) -> Iterator[Piece]:
    """The decoded pieces of a file's bytes (``where`` names it in errors); nothing when it is no format
    read here and not compressed."""
    yield from _decode(data, where, limits, _Budget(limits), (), 0)


def _decode(data: bytes | bytearray, where: str, limits: DecodeLimits, budget: _Budget, chain: tuple[str, ...],
            depth: int) -> Iterator[Piece]:
    kind = kind_of(data[:HEAD])
    if kind in COMPRESSION or kind in ("zip", "tar"):
        if depth >= MAX_DEPTH:
            raise DatasetFileError(f"{where} is compressed or archived more than {MAX_DEPTH} levels deep: not decoded")
        if kind in ("zip", "tar"):
            yield from _archive(data, kind, where, limits, budget, chain, depth)
            return
        inner = inflate(bytes(data), kind, where, budget.left, limits.max_decoded_bytes)
        budget.take(len(inner), where)
        yield from _decode(inner, where, limits, budget, (*chain, kind), depth + 1)
    elif kind == "parquet":
        for batch in parquet_batches(bytes(data), where, None, limits, require=()):
            yield Piece(_joined(chain, kind), batch.num_rows, _arrow_cells(batch))
    elif kind == "parquet-encrypted":
        raise DatasetFileError(f"{where} is an encrypted Parquet file: not decoded")
    elif kind in ("arrow", "arrow-stream"):
        for batch in arrow_batches(bytes(data), where, limits, stream=kind == "arrow-stream"):
            yield Piece(_joined(chain, kind), batch.num_rows, _arrow_cells(batch))
    elif kind == "json":
        yield from _json(data, where, limits, chain)
    elif kind == "csv":
        yield from _csv(data, where, limits, chain)
    elif chain:
        yield Piece(_joined(chain, "bytes"), raw=data)


def _joined(chain: tuple[str, ...], kind: str) -> str:
    return " > ".join((*chain, kind))


def _archive(data: bytes | bytearray, kind: str, where: str, limits: DecodeLimits, budget: _Budget,
             chain: tuple[str, ...], depth: int) -> Iterator[Piece]:
    """Each regular member of a zip or tar archive, decoded as a file of its own (within the file's budget)."""
    try:
        with _open_archive(data, kind) as archive:
            if kind == "zip":
                members = [m for m in archive.infolist() if not m.is_dir()]
            else:
                members = [m for m in archive.getmembers() if m.isreg()]
            if len(members) > MAX_MEMBERS:
                raise DatasetBoundError(f"{where} holds {len(members)} members, past the bound ({MAX_MEMBERS}): not"
                                        " decoded")
            for member in members:
                name = member.filename if kind == "zip" else member.name
                inside = f"{where} (member {name})"
                if kind == "zip":
                    if member.flag_bits & 0x1:
                        raise DatasetFileError(f"{inside} is encrypted: not decoded")
                    body = _read_member(archive.open(member), inside, budget)
                else:
                    handle = archive.extractfile(member)
                    body = _read_member(handle, inside, budget) if handle is not None else b""
                yield from _decode(body, inside, limits, budget, (*chain, f"{kind} member {name}"), depth + 1)
    except (DatasetFileError, DatasetBoundError):
        raise
    except (zipfile.BadZipFile, tarfile.TarError, NotImplementedError, RuntimeError, OSError, EOFError,
            ValueError) as exc:
        raise DatasetFileError(f"{where} is not a readable {kind} archive ({exc})") from exc


def _open_archive(data: bytes | bytearray, kind: str) -> Any:
    if kind == "zip":
        return zipfile.ZipFile(io.BytesIO(data))
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:")


def _read_member(handle: Any, where: str, budget: _Budget) -> bytes:
    """A member's bytes, read a chunk at a time and never past the file's budget."""
    out = bytearray()
    with handle:
        while True:
            chunk = handle.read(min(1 << 24, max(budget.left, 0) + 1))
            if not chunk:
                return bytes(out)
            out += chunk
            budget.take(len(chunk), where)


def _arrow_cells(batch: Any) -> list[Any]:
    """Every string and binary value of a record batch, nested ones included (dictionary columns decoded:
    the readers counted what that costs before)."""
    pa = _pyarrow()
    cells: list[Any] = []
    for column in batch.columns:
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if kind.num_fields:
            _strings(column.to_pylist(), cells)
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
                pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind) or \
                str(kind) in ("string_view", "binary_view"):
            cells += [v for v in column.to_pylist() if v is not None]
    return cells


def _strings(value: Any, out: list[Any]) -> None:
    """Append every string (and bytes) in a nested value, keys of objects included, to ``out``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
"""A JSON string literal (quotes, escapes), on one line."""


def _json(data: bytes | bytearray, where: str, limits: DecodeLimits, chain: tuple[str, ...]) -> Iterator[Piece]:
    """A JSON document or JSON lines: every string in it; its rows (a list's items, the items of lists an
    object holds, or the object; one per line). Text that starts like JSON but is not (a torn copy, a log
    whose lines start with ``[``) is searched by its string literals, each decoded, and by its bytes."""
    text = bytes(data).removeprefix(_BOM)
    cells: list[Any] = []
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        pass
    else:
        if isinstance(doc, list):
            rows = len(doc)
        elif isinstance(doc, dict):
            rows = sum(len(v) for v in doc.values() if isinstance(v, list) and v and isinstance(v[0], dict)) or 1
        else:
            rows = 1
        if rows > limits.max_rows:
            raise limits.too_many_rows(where, rows)
        _strings(doc, cells)
        yield Piece(_joined(chain, "json"), rows, cells)
        return
    lines = [line for line in text.split(b"\n") if line.strip()]
    if len(lines) > limits.max_rows:
        raise limits.too_many_rows(where, len(lines))
    try:
        for line in lines:
            _strings(json.loads(line), cells)
    except (ValueError, RecursionError):
        pass
    else:
        yield Piece(_joined(chain, "jsonl"), len(lines), cells)
        return
    cells = []
    for literal in _STRING.finditer(text):
        with contextlib.suppress(ValueError):
            cells.append(json.loads(literal.group()))
    yield Piece(_joined(chain, "text, not JSON: its JSON strings"), len(lines), cells)
    if chain:
        yield Piece(_joined(chain, "bytes"), raw=data)


def _csv(data: bytes | bytearray, where: str, limits: DecodeLimits, chain: tuple[str, ...]) -> Iterator[Piece]:
    """A CSV file read by pyarrow, every column as binary (no type guessed, no encoding refused); a row with
    the wrong number of fields is kept whole as one value. Text with a CSV header that pyarrow cannot read
    at all is searched by its bytes."""
    pa = _pyarrow()
    import pyarrow.csv

    text = bytes(data).removeprefix(_BOM).lstrip(b" \t\r\n")
    delimiter = _csv_delimiter(text[:HEAD])
    if delimiter is None:  # pragma: no cover - kind_of read the same header
        raise DatasetFileError(f"{where} has no CSV header")
    first = text[:text.find(b"\n")].rstrip(b"\r").decode("utf-8")
    header = next(csv.reader([first], delimiter=delimiter))
    ragged: list[Any] = []

    def keep(row: Any) -> str:
        ragged.append(row.text)
        return "skip"

    try:
        table = pyarrow.csv.read_csv(
            pa.BufferReader(text),
            read_options=pyarrow.csv.ReadOptions(use_threads=False),
            parse_options=pyarrow.csv.ParseOptions(delimiter=delimiter, newlines_in_values=True,
                                                   invalid_row_handler=keep),
            convert_options=pyarrow.csv.ConvertOptions(column_types={n: pa.binary() for n in header},
                                                       strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowException, OSError, ValueError):
        # its bytes: on disk as they are (the byte scan of every file reads them) or decompressed here
        yield Piece(_joined(chain, "text, not CSV"), text.count(b"\n"), raw=data if chain else None)
        return
    rows = table.num_rows + len(ragged)
    if rows > limits.max_rows:
        raise limits.too_many_rows(where, rows)
    cells: list[Any] = [name.encode("utf-8") for name in table.column_names] + ragged
    for column in table.columns:
        cells += [v for v in column.to_pylist() if v is not None]
    yield Piece(_joined(chain, "csv"), rows, cells)


__all__ = ["COMPRESSION", "HEAD", "MAX_DEPTH", "MAX_MEMBERS", "TEXT_KINDS", "Piece", "decode", "kind_of"]
