"""Arrow IPC files and streams (Feather v2), read within :class:`~.files.DecodeLimits`.

An Arrow IPC body may be compressed (LZ4 or zstd, a buffer at a time), and pyarrow decompresses a record
batch whole when it reads it: a few KiB on disk can declare gigabytes. So before pyarrow reads anything,
every message's metadata is walked here (the flatbuffer ``Message`` -> ``RecordBatch`` or
``DictionaryBatch`` -> its buffers and compression) and the bytes its buffers decode to are summed (a
compressed buffer starts with its decompressed length) with the rows its batches declare; past a bound,
DatasetBoundError, nothing decoded. Then each batch is read and its dictionary-encoded columns are counted
as they would decode (one large value repeated) before any value is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .files import DatasetBoundError, DatasetFileError, DecodeLimits
from .shards import _decoded_size, _pyarrow

FILE_MAGIC = b"ARROW1"
STREAM_MARKER = b"\xff\xff\xff\xff"
"""The continuation marker every message of a current IPC stream starts with."""
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3
"""``MessageHeader`` union members (Schema is 1, Tensor 4)."""


def is_arrow_file(head: bytes) -> bool:
    return head.startswith(FILE_MAGIC + b"\x00\x00")


def is_arrow_stream(head: bytes) -> bool:
    """A current-format IPC stream: a continuation marker, then the schema message's length."""
    if not head.startswith(STREAM_MARKER) or len(head) < 8:
        return False
    size = int.from_bytes(head[4:8], "little")
    return 0 < size < (1 << 24) and size % 8 == 0


class _Flat:
    """Just enough of a flatbuffer reader for the IPC message metadata, every read bounds-checked."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def int(self, pos: int, size: int, signed: bool = False) -> int:
        if pos < 0 or pos + size > len(self.buf):
            raise ValueError("a reference past the end of the message metadata")
        return int.from_bytes(self.buf[pos:pos + size], "little", signed=signed)

    def table(self, pos: int) -> tuple[int, int, int]:
        vtable = pos - self.int(pos, 4, signed=True)
        return pos, vtable, self.int(vtable, 2)

    def field(self, table: tuple[int, int, int], index: int) -> int | None:
        pos, vtable, size = table
        at = 4 + 2 * index
        if at + 2 > size:
            return None
        offset = self.int(vtable + at, 2)
        return pos + offset if offset else None

    def ref(self, pos: int) -> int:
        return pos + self.int(pos, 4)


def _message_size(metadata: bytes, body: Any) -> tuple[int, int]:
    """(bytes the message's buffers decode to, rows of its batch) for a record or dictionary batch message;
    (0, 0) for any other."""
    flat = _Flat(metadata)
    message = flat.table(flat.ref(0))
    kind_at, header_at = flat.field(message, 1), flat.field(message, 2)
    kind = flat.int(kind_at, 1) if kind_at is not None else 0
    if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or header_at is None:
        return 0, 0
    batch = flat.table(flat.ref(header_at))
    if kind == _DICTIONARY_BATCH:
        data_at = flat.field(batch, 1)
        if data_at is None:
            return 0, 0
        batch = flat.table(flat.ref(data_at))
    length_at = flat.field(batch, 0)
    rows = flat.int(length_at, 8, signed=True) if length_at is not None else 0
    buffers_at = flat.field(batch, 2)
    compressed = flat.field(batch, 3) is not None
    body_bytes = body.to_pybytes() if compressed and body is not None else b""
    body_size = body.size if body is not None else 0
    total = 0
    if buffers_at is not None:
        vector = flat.ref(buffers_at)
        for n in range(flat.int(vector, 4)):
            offset = flat.int(vector + 4 + 16 * n, 8, signed=True)
            length = flat.int(vector + 12 + 16 * n, 8, signed=True)
            if offset < 0 or length < 0 or offset + length > body_size:
                raise ValueError("a buffer outside the message body")
            if not compressed or length == 0:
                total += length
                continue
            if length < 8:
                raise ValueError("a compressed buffer without its length")
            declared = int.from_bytes(body_bytes[offset:offset + 8], "little", signed=True)
            total += length - 8 if declared == -1 else declared
            if declared < -1:
                raise ValueError("a compressed buffer declares a negative length")
    if rows < 0:
        raise ValueError("a batch declares a negative length")
    return total, rows if kind == _RECORD_BATCH else 0


class _Bound:
    """The bytes and rows the messages declare so far, refused past ``limits``."""

    def __init__(self, where: str, limits: DecodeLimits) -> None:
        self.where, self.limits, self.decoded, self.rows = where, limits, 0, 0

    def add(self, message: Any) -> None:
        size, rows = _message_size(message.metadata.to_pybytes(), message.body)
        self.decoded += size
        self.rows += rows
        if self.decoded > self.limits.max_decoded_bytes:
            raise self.limits.too_large(self.where, "declares", f"more than {self.decoded}")
        if self.rows > self.limits.max_rows:
            raise self.limits.too_many_rows(self.where, f"more than {self.rows}")


def _check_stream(pa: Any, buffer: Any, where: str, limits: DecodeLimits) -> None:
    """Every message of an IPC stream, in the order a reader reads them."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(buffer))
    bound = _Bound(where, limits)
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return
        bound.add(message)


def _check_file(pa: Any, buffer: Any, where: str, limits: DecodeLimits) -> None:
    """Every message an IPC file's footer points at (its dictionaries and record batches: what a reader
    reads, wherever in the file they lie)."""
    size = buffer.size
    if size < 18 or buffer.slice(size - 6).to_pybytes() != FILE_MAGIC:
        raise ValueError("it does not end with the Arrow file magic")
    length = int.from_bytes(buffer.slice(size - 10, 4).to_pybytes(), "little", signed=True)
    start = size - 10 - length
    if length <= 0 or start < 8:
        raise ValueError("its footer is out of place")
    flat = _Flat(buffer.slice(start, length).to_pybytes())
    footer = flat.table(flat.ref(0))
    bound = _Bound(where, limits)
    for index in (2, 3):  # dictionaries, recordBatches: vectors of Block {offset, metaDataLength, bodyLength}
        at = flat.field(footer, index)
        if at is None:
            continue
        vector = flat.ref(at)
        for n in range(flat.int(vector, 4)):
            block = vector + 4 + 24 * n
            offset, meta, body = flat.int(block, 8, True), flat.int(block + 8, 4, True), flat.int(block + 16, 8, True)
            if offset < 8 or meta <= 0 or body < 0 or offset + meta + body > start:
                raise ValueError("a block outside the file")
            bound.add(pa.ipc.read_message(pa.BufferReader(buffer.slice(offset, meta + body))))


def arrow_batches(data: bytes, where: str, limits: DecodeLimits, *, stream: bool) -> Iterator[Any]:
    """The record batches of an Arrow IPC file (``stream=False``; Feather v2) or stream, within ``limits``."""
    pa = _pyarrow()
    buffer = pa.py_buffer(data)
    try:
        if stream:
            _check_stream(pa, buffer, where, limits)
            batches = iter(pa.ipc.open_stream(pa.BufferReader(buffer)))
        else:
            _check_file(pa, buffer, where, limits)
            reader = pa.ipc.open_file(pa.BufferReader(buffer))
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        decoded = 0
        for batch in batches:
            decoded += sum(_decoded_size(pa, column) for column in batch.columns)
            if decoded > limits.max_decoded_bytes:
                raise limits.too_large(where, "decodes to more than", limits.max_decoded_bytes)
            yield batch
    except DatasetBoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetFileError(f"{where} is not a readable Arrow IPC {'stream' if stream else 'file'} ({exc})") from exc


__all__ = ["arrow_batches", "is_arrow_file", "is_arrow_stream"]
