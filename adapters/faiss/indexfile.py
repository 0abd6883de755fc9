"""Reading a FAISS store's index file without trusting it.

``faiss.read_index`` reads each array of a file as a count followed by its elements, and sizes the array from
the count before reading a byte of it: an index file whose id map (or graph) claims 400 million entries makes
it allocate and zero 3 GB before it notices the file is short. So the file is opened here first, as a
regular file inside the store (``tombstone.fsutil.open_regular``: no link, no FIFO, no device), and walked:
it must be what a FAISS store writes — an ``IndexIDMap2`` over an ``IndexHNSWFlat`` over a flat L2 or
inner-product storage — with every count fitting in the bytes the file has after it, the counts agreeing with
each other (one level, one offset and one id per vector, ``d`` floats per vector, as many neighbours as the
offsets say) and nothing left over. Only then does faiss read it, through the descriptor already checked
(``/proc/self/fd``), so the file it reads is the file that was walked. Anything else is refused in one line
naming the file, before faiss allocates anything.

The walk reads a few dozen bytes (the headers and the counts), whatever the file's size.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import faiss

from tombstone.errors import StoreUnavailableError
from tombstone.fsutil import open_regular

_ID_MAP = b"IxM2"
_HNSW_FLAT = b"IHNf"
_FLAT = (b"IxF2", b"IxFI")
_METRICS = (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2)
_HNSW_ARRAYS = (("assign_probas", 8), ("cum_nneighbor_per_level", 4), ("levels", 4), ("offsets", 8),
                ("neighbors", 4))
_HNSW_SCALARS = 20
"""entry_point, max_level, efConstruction, efSearch and a reserved int: five int32."""


class _Walk:
    def __init__(self, fd: int, size: int, path: Path) -> None:
        self.fd, self.size, self.path, self.at = fd, size, path, 0

    def bad(self, why: str) -> ValueError:
        return ValueError(f"{self.path} is not an index file this store writes: {why}")

    def take(self, n: int) -> bytes:
        if n > self.size - self.at:
            raise self.bad(f"it ends at byte {self.size}, before the {n} bytes expected at {self.at}")
        data = os.pread(self.fd, n, self.at)
        if len(data) != n:
            raise self.bad("it was cut short while it was read")
        self.at += n
        return data

    def fourcc(self, allowed: tuple[bytes, ...]) -> bytes:
        tag = self.take(4)
        if tag not in allowed:
            raise self.bad(f"{tag!r} at byte {self.at - 4} where {' or '.join(map(repr, allowed))} was expected")
        return tag

    def header(self) -> tuple[int, int, int]:
        d, ntotal = struct.unpack("<iq", self.take(12))
        self.take(17)  # two reserved int64 and is_trained
        (metric,) = struct.unpack("<i", self.take(4))
        if metric not in _METRICS:
            raise self.bad(f"metric {metric} is neither L2 nor inner product")
        if d <= 0 or ntotal < 0:
            raise self.bad(f"dimension {d} and {ntotal} vectors")
        return d, ntotal, metric

    def array(self, name: str, width: int) -> tuple[int, int]:
        """The count of an array and where its elements start; the elements are skipped, not read."""
        (count,) = struct.unpack("<Q", self.take(8))
        if count > (self.size - self.at) // width:
            raise self.bad(f"its {name} claims {count} entries of {width} bytes, more than the"
                           f" {self.size - self.at} bytes left in the file")
        start = self.at
        self.at += count * width
        return count, start


def check_index_file(fd: int, path: Path) -> None:
    """Raise ValueError (one line naming ``path``) unless the open file ``fd`` is an ``IndexIDMap2`` over an
    ``IndexHNSWFlat`` whose arrays fit in the file and agree with each other."""
    w = _Walk(fd, os.fstat(fd).st_size, path)
    w.fourcc((_ID_MAP,))
    head = w.header()
    w.fourcc((_HNSW_FLAT,))
    if w.header() != head:
        raise w.bad("the graph's header does not match the id map's")
    d, ntotal, _ = head
    counts = {}
    for name, width in _HNSW_ARRAYS:
        counts[name] = w.array(name, width)
    entry_point, max_level = struct.unpack("<ii", w.take(_HNSW_SCALARS)[:8])
    w.fourcc(_FLAT)
    if w.header() != head:
        raise w.bad("the storage's header does not match the id map's")
    codes, _ = w.array("vectors", 4)
    ids, _ = w.array("id map", 8)
    if w.at != w.size:
        raise w.bad(f"{w.size - w.at} bytes follow the id map")
    levels, offsets, neighbors = counts["levels"][0], counts["offsets"][0], counts["neighbors"][0]
    if levels != ntotal or offsets != ntotal + 1 or codes != ntotal * d or ids != ntotal:
        raise w.bad(f"{ntotal} vectors of dimension {d}, but {levels} levels, {offsets} offsets,"
                    f" {codes} floats and {ids} ids")
    (last,) = struct.unpack("<Q", os.pread(fd, 8, counts["offsets"][1] + 8 * ntotal))
    if last != neighbors:
        raise w.bad(f"the offsets end at {last}, the graph holds {neighbors} neighbours")
    if not -1 <= entry_point < max(ntotal, 1) or not -1 <= max_level < counts["cum_nneighbor_per_level"][0]:
        raise w.bad(f"entry point {entry_point} and top level {max_level} lie outside the graph")


def read_index(path: Path, root: Path | None = None, *, flags: int = 0, store: str | None = None) -> Any:
    """``faiss.read_index`` of ``path`` (with ``flags``), once the file was opened as a regular file inside
    ``root`` and walked by :func:`check_index_file`. Raises FileNotFoundError when it is missing, a one-line
    StoreUnavailableError (not retryable) when it must not be read, RuntimeError when faiss cannot read it."""
    fd = open_regular(path, root if root is not None else path.parent, store=store)
    try:
        try:
            check_index_file(fd, path)
        except ValueError as exc:
            raise StoreUnavailableError(str(exc), store=store, retryable=False) from None
        through = f"/proc/self/fd/{fd}"
        if not os.path.exists(through):  # no /proc: the path, which was checked an instant ago
            through = os.fspath(path)
        try:
            return faiss.read_index(through, flags) if flags else faiss.read_index(through)
        except RuntimeError as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise RuntimeError(f"faiss cannot read {path}: {lines[-1] if lines else exc}") from None
    finally:
        os.close(fd)


__all__ = ["check_index_file", "read_index"]
