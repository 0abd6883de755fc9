"""Shard files' contents: rows encoded as JSONL, gzip JSONL or Parquet, and decoded within bounds.

A shard is untrusted data: every decoder here is bounded by :class:`~.files.DecodeLimits` (the bytes a
shard may decode to, the rows it may hold). A gzip shard is decompressed a chunk at a time and never past
the bound; a Parquet shard is decoded a batch at a time with its string columns dictionary-encoded, so a
value repeated a million times (a Parquet bomb) is counted before it is built. Past a bound:
:class:`~.files.DatasetBoundError` naming the shard, never a MemoryError.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .files import (
    DEFAULT_LIMITS,
    GZIP_LEVEL,
    SUFFIXES,
    DatasetBoundError,
    DatasetFileError,
    DecodeLimits,
    is_temp,
    target_of_temp,
)

PARQUET_BATCH_ROWS = 65_536
"""Rows a Parquet shard is decoded by, checking the bounds after each batch."""

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


def _jsonl_lines(data: bytes, fmt: str, where: str, limits: DecodeLimits = DEFAULT_LIMITS) -> list[bytes]:
    text = _jsonl_text(data, fmt, where, limits)
    return text[:-1].split(b"\n") if text else []


GUNZIP_CHUNK = 1 << 24


def _gunzip(data: bytes, where: str, limit: int) -> bytearray:
    """A gzip shard's content, never past ``limit`` bytes (:func:`inflate`)."""
    return inflate(data, "gzip", f"shard {where}", limit)


def _opener(codec: str) -> Any:
    if codec == "gzip":
        return lambda data: gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
    if codec == "bz2":
        return lambda data: bz2.BZ2File(io.BytesIO(data), mode="rb")
    if codec == "xz":
        return lambda data: lzma.LZMAFile(io.BytesIO(data), mode="rb")
    pa = _pyarrow()  # zstd and lz4 (frame format): Arrow's codecs, installed with pyarrow
    return lambda data: pa.CompressedInputStream(pa.BufferReader(data), codec)


def inflate(data: bytes, codec: str, where: str, limit: int, bound: int | None = None) -> bytearray:
    """``data`` decompressed (``codec``: gzip, bz2, xz, zstd or lz4) a chunk at a time and never past
    ``limit`` bytes (a decompression bomb stops there: DatasetBoundError, which names ``bound``, the store's
    max_decoded_bytes, default ``limit``). A stream that is truncated or corrupt: DatasetFileError."""
    bound = limit if bound is None else bound
    out = bytearray()
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)
    if codec in ("zstd", "lz4"):
        errors += (_pyarrow().ArrowException,)
    try:
        with _opener(codec)(data) as fh:
            while True:
                chunk = fh.read(min(GUNZIP_CHUNK, limit + 1 - len(out)))
                if not chunk:
                    return out
                out += chunk
                if len(out) > limit:
                    raise DatasetBoundError(f"{where} decompresses to more than {limit} bytes, past the bound"
                                            f" (max_decoded_bytes {bound}): not decoded")
    except DatasetBoundError:
        raise
    except errors as exc:
        raise DatasetFileError(f"{where} is not a complete {codec} file ({exc})") from exc


def _jsonl_text(data: bytes, fmt: str, where: str, limits: DecodeLimits = DEFAULT_LIMITS) -> bytes | bytearray:
    """A JSONL shard's text (decompressed, within ``limits``), which ends with a newline unless it is empty."""
    if len(data) > limits.max_decoded_bytes:
        raise limits.too_large(f"shard {where}", "has", len(data))
    text: bytes | bytearray = _gunzip(data, where, limits.max_decoded_bytes) if fmt == "jsonl.gz" else data
    if text and not text.endswith(b"\n"):
        raise DatasetFileError(f"shard {where} ends in the middle of a row")
    rows = text.count(b"\n")
    if rows > limits.max_rows:
        raise limits.too_many_rows(f"shard {where}", rows)
    return text


def _parse_line(line: bytes, where: str, n: int) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise DatasetFileError(f"shard {where}: row {n} is not JSON ({exc})") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(obj.get("text"), str):
        raise DatasetFileError(f"shard {where}: row {n} has no string id and text")
    return obj


def _decoded_size(pa: Any, array: Any) -> int:
    """The bytes ``array`` holds once decoded: a dictionary-encoded column's values counted once per row
    (what makes a Parquet bomb: one large value repeated), computed without materialising them; a nested
    column (lists, structs) counted through its children."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        value_type = kind.value_type
        if pa.types.is_binary(value_type) or pa.types.is_string(value_type) or \
                pa.types.is_large_binary(value_type) or pa.types.is_large_string(value_type):
            lengths = pa.compute.binary_length(array.dictionary)
            total = pa.compute.sum(pa.compute.take(lengths, array.indices)).as_py() or 0
            return int(total) + 8 * len(array)
        return array.indices.nbytes + array.dictionary.nbytes * max(1, len(array))
    if kind.num_fields:  # nested: structs, lists, maps, unions
        if pa.types.is_struct(kind):
            children = array.flatten()
        elif pa.types.is_union(kind):
            children = [array.field(i) for i in range(kind.num_fields)]
        else:
            children = [array.flatten()]
        return 8 * len(array) + sum(_decoded_size(pa, child) for child in children)
    return array.nbytes


SHARD_COLUMNS = ("id", "text", "metadata")
_DICTIONARY_LOGICAL = ("STRING", "NONE", "JSON", "BSON", "ENUM")


def parquet_batches(data: bytes, where: str, columns: Sequence[str] | None = None,
                    limits: DecodeLimits = DEFAULT_LIMITS, require: Sequence[str] = SHARD_COLUMNS) -> Iterator[Any]:
    """The file's record batches (``columns``, or all), decoded a batch at a time within ``limits``: the
    rows the footer declares and those decoded are counted, and the bytes the values decode to (every string
    leaf, nested ones too, is read dictionary-encoded, so a value repeated a million times is counted, never
    built, until the bounds are checked). Every column of ``require`` must be there. A string leaf comes as
    a dictionary array."""
    pa = _pyarrow()
    if len(data) > limits.max_decoded_bytes:
        raise limits.too_large(where, "has", len(data))
    try:
        schema = pa.parquet.ParquetFile(pa.BufferReader(data)).schema
        names = list(columns) if columns else list(schema.to_arrow_schema().names)
        for name in (*require, *names):
            if name not in schema.to_arrow_schema().names:
                raise DatasetFileError(f"{where} has no {name!r} column")
        textual = [c.path for c in (schema.column(i) for i in range(len(schema)))
                   if c.physical_type == "BYTE_ARRAY" and c.logical_type.type in _DICTIONARY_LOGICAL
                   and c.path.split(".")[0] in names]
        shard = pa.parquet.ParquetFile(pa.BufferReader(data), read_dictionary=textual)
        meta = shard.metadata
        if meta.num_rows > limits.max_rows:
            raise limits.too_many_rows(where, meta.num_rows)
        indices = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in names]
        declared = sum(meta.row_group(g).column(i).total_uncompressed_size
                       for g in range(meta.num_row_groups) for i in indices)
        if declared > limits.max_decoded_bytes:
            raise limits.too_large(where, "declares", declared)
        rows, decoded = 0, 0
        for batch in shard.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=names, use_threads=False):
            rows += batch.num_rows
            if rows > limits.max_rows:
                raise limits.too_many_rows(where, f"more than {limits.max_rows}")
            decoded += sum(_decoded_size(pa, column) for column in batch.columns)
            if decoded > limits.max_decoded_bytes:
                raise limits.too_large(where, "decodes to more than", limits.max_decoded_bytes)
            yield batch
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetFileError(f"{where} is not a readable Parquet file ({exc})") from exc


def _parquet_table(data: bytes, where: str, columns: Sequence[str] | None = None,
                   limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """The shard's columns (``columns``, or all) as one table within ``limits`` (:func:`parquet_batches`),
    its string columns decoded."""
    pa = _pyarrow()
    try:
        batches = list(parquet_batches(data, f"shard {where}", columns, limits))
        if batches:
            table = pa.Table.from_batches(batches)
        else:
            arrow = pa.parquet.ParquetFile(pa.BufferReader(data)).schema_arrow
            table = pa.schema([arrow.field(n) for n in (columns or arrow.names)]).empty_table()
        for n, field in enumerate(table.schema):
            if pa.types.is_dictionary(field.type):
                plain = pa.chunked_array([chunk.dictionary_decode() for chunk in table.column(n).chunks],
                                         type=field.type.value_type)
                table = table.set_column(n, field.name, plain)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetFileError(f"shard {where} is not a readable Parquet file ({exc})") from exc
    return table


def decode_rows(data: bytes, fmt: str, where: str = "shard", limits: DecodeLimits = DEFAULT_LIMITS) -> list[Row]:
    """Every row of a shard, in order (within ``limits``: DatasetBoundError past them)."""
    if fmt == "parquet":
        table = _parquet_table(data, where, ("id", "text", "metadata"), limits)
        return [Row(i, t or "", m or "") for i, t, m in zip(table.column("id").to_pylist(),
                                                           table.column("text").to_pylist(),
                                                           table.column("metadata").to_pylist())]
    rows = []
    for n, line in enumerate(_jsonl_lines(data, fmt, where, limits)):
        obj = _parse_line(line, where, n)
        rows.append(Row(obj["id"], obj["text"], json.dumps(obj.get("metadata") or {}, ensure_ascii=False,
                                                          separators=(",", ":"), sort_keys=True)))
    return rows


def decode_columns(data: bytes, fmt: str, where: str = "shard", *, texts: bool = True,
                   limits: DecodeLimits = DEFAULT_LIMITS) -> tuple[list[str], list[str] | None]:
    """The ids (and texts) of every row of a shard: what the probes need, without building rows (within
    ``limits``: DatasetBoundError past them)."""
    if fmt == "parquet":
        table = _parquet_table(data, where, ("id", "text") if texts else ("id",), limits)
        return (table.column("id").to_pylist(), [t or "" for t in table.column("text").to_pylist()] if texts else None)
    ids, out = [], []
    for n, line in enumerate(_jsonl_lines(data, fmt, where, limits)):
        obj = _parse_line(line, where, n)
        ids.append(obj["id"])
        out.append(obj["text"])
    return ids, out if texts else None


def drop_rows(data: bytes, fmt: str, drop: set[str], where: str = "shard",
              limits: DecodeLimits = DEFAULT_LIMITS) -> tuple[bytes | None, int, int]:
    """The shard's bytes without the rows whose id is in ``drop``: (new bytes or None when nothing is
    dropped, rows dropped, rows kept). Surviving JSONL lines are copied byte for byte; a Parquet shard is
    rewritten with its own schema and the compression of its first column. Within ``limits``
    (DatasetBoundError past them)."""
    if fmt == "parquet":
        pa = _pyarrow()
        try:
            meta = pa.parquet.read_metadata(pa.BufferReader(data))
            compression = meta.row_group(0).column(0).compression.lower() if meta.num_row_groups else "zstd"
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DatasetFileError(f"shard {where} is not a readable Parquet file ({exc})") from exc
        table = _parquet_table(data, where, None, limits)
        hit = pa.compute.is_in(table.column("id"), value_set=pa.array(sorted(drop), pa.string()))
        dropped = pa.compute.sum(hit).as_py() or 0
        if not dropped:
            return None, 0, table.num_rows
        kept = table.filter(pa.compute.invert(hit))
        return _parquet_bytes(kept, "none" if compression == "uncompressed" else compression), dropped, kept.num_rows
    text = _jsonl_text(data, fmt, where, limits)
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
    return (gzip.compress(kept, compresslevel=GZIP_LEVEL, mtime=0) if fmt == "jsonl.gz" else bytes(kept)), dropped, total - dropped


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
