"""Zeroing the free space of SQLite pages in place.

A store whose SQLite connection runs with ``secure_delete`` off leaves a deleted or rewritten row's bytes in
its page: in the page's free space while the page holds other rows, on the freelist once it holds none.
Deleting more rows cannot reach them, and a VACUUM, which can, rewrites the whole file. This zeroes free space
where it lies, in given pages (``zero_freed_space``) or in every page (``zero_all_free_space``), writing only
pages whose free space holds anything, parsing the page layout SQLite documents (the database file format:
page header, cell pointer array, freeblock list, freelist trunk and leaf pages).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from tombstone.faults import kill_point

_BTREE_PAGE_TYPES = {0x02: 12, 0x05: 12, 0x0A: 8, 0x0D: 8}  # page type -> header size (interior pages: 12)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _u16(data: bytes | bytearray, at: int) -> int:
    return _U16.unpack_from(data, at)[0]


def _u32(data: bytes | bytearray, at: int) -> int:
    return _U32.unpack_from(data, at)[0]


def _freelist(fd: int, page_size: int, first_trunk: int, count: int, pages: int) -> dict[int, int] | None:
    """Every freelist page: trunk pages -> the offset where their unused bytes start, leaf pages -> 0.
    None when the list is not what the header says (a loop, a page past the end)."""
    free: dict[int, int] = {}
    trunk = first_trunk
    while trunk:
        if trunk in free or not 1 < trunk <= pages or len(free) > count:
            return None
        head = os.pread(fd, 8, (trunk - 1) * page_size)
        leaves = _u32(head, 4)
        if leaves > page_size // 4 - 2:
            return None
        body = os.pread(fd, 4 * leaves, (trunk - 1) * page_size + 8)
        free[trunk] = 8 + 4 * leaves
        for i in range(leaves):
            leaf = _u32(body, 4 * i)
            if not 1 < leaf <= pages:
                return None
            free[leaf] = 0
        trunk = _u32(head, 0)
    return free if len(free) == count else None


def _free_regions(page: bytes, number: int, usable: int) -> list[tuple[int, int]] | None:
    """The byte ranges of a b-tree page that no cell uses: the gap between the cell pointer array and the
    cell content area, and each freeblock past its 4-byte link and size. None when the page is not a b-tree
    page or its header does not hold together (then nothing on it is touched)."""
    h = 100 if number == 1 else 0
    header_size = _BTREE_PAGE_TYPES.get(page[h])
    if header_size is None:
        return None
    cells = _u16(page, h + 3)
    content = _u16(page, h + 5) or 65536
    pointers_end = h + header_size + 2 * cells
    if not pointers_end <= content <= usable:
        return None
    if cells:
        pointers = struct.unpack_from(f">{cells}H", page, h + header_size)
        if min(pointers) < content or max(pointers) >= usable:
            return None
    regions = [(pointers_end, content)]
    block, floor = _u16(page, h + 1), content
    while block:
        if block < floor or block + 4 > usable:
            return None
        size = _u16(page, block + 2)
        if size < 4 or block + size > usable:
            return None
        regions.append((block + 4, block + size))
        floor, block = block + size, _u16(page, block)
    return regions


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[tuple[int, bytes, int, int, dict[int, int]] | None]:
    """The file opened for writing under an EXCLUSIVE lock taken through SQLite, with its header, page size,
    page count and freelist; None (and no lock) where it is not in a shape the zeroing knows: WAL mode, an
    auto-vacuum or reserved-bytes layout, 2^24 pages or more (an overflow page could then look like a b-tree
    page), a freelist that does not hold together, or a transaction another connection keeps open."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    fd = -1
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                yield None
                return
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError:
            yield None
            return
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            header = os.pread(fd, 100, 0)
            page_size = _u16(header, 16)
            page_size = 65536 if page_size == 1 else page_size
            pages = os.fstat(fd).st_size // page_size
            free = None
            if not (header[20] or _u32(header, 52) or pages >= 1 << 24):
                free = _freelist(fd, page_size, _u32(header, 32), _u32(header, 36), pages)
            yield None if free is None else (fd, header, page_size, pages, free)
        finally:
            conn.execute("COMMIT")
    finally:
        conn.close()
        if fd >= 0:
            os.close(fd)  # after the lock is released: closing any descriptor drops this process's POSIX locks


def _write_zeroed(fd: int, header: bytes, page_size: int, plans, kill: str) -> tuple[int, int]:
    """Zero each plan's (page number, page bytes, free regions) regions where they hold anything, write those
    pages, bump the file change counter (every connection then drops the pages it cached) and fsync.
    Returns (pages written, bytes zeroed)."""
    zeroed = pages_written = 0
    for number, page, regions in plans:
        changed = 0
        for r_start, r_end in regions:
            if page.count(0, r_start, r_end) != r_end - r_start:
                changed += r_end - r_start
                page[r_start:r_end] = bytes(r_end - r_start)
        if changed:
            kill_point(kill)
            os.pwrite(fd, page, (number - 1) * page_size)
            zeroed += changed
            pages_written += 1
    if pages_written:
        counter = _u32(header, 24)
        os.pwrite(fd, _U32.pack((counter + 1) & 0xFFFFFFFF), 24)
        if _u32(header, 92) == counter:  # keep the page count in the header valid
            os.pwrite(fd, _U32.pack((counter + 1) & 0xFFFFFFFF), 92)
        os.fsync(fd)
    return pages_written, zeroed


def zero_freed_space(path: Path, hits: Iterable[tuple[int, int]], *, kill: str = "reclaim:sqlite:free-space-page"
                     ) -> dict[str, int] | None:
    """Zero the unused bytes of the SQLite pages in which ``hits`` (offset, length) lie, in place: what
    ``secure_delete`` would have done when the cells were freed, had it been on (a store's own client that
    runs with it off leaves a row it deleted or rewrote in its page's free space, and a page still in use is
    never cleared by deleting more rows or by zeroing the freelist). Only free space is written: the gap
    between a page's cell pointers and its cells, the body of each freeblock, the unused tail of a freelist
    page. Cells, headers and freeblock links are kept, so SQLite reads the file as before.

    Done under an EXCLUSIVE lock taken through SQLite (no reader or writer in between), in rollback-journal
    mode only; the file change counter is bumped afterwards, so every connection drops the pages it cached.
    Returns the counts, or None (nothing written) where the file is not in a shape this knows (``_exclusive``)
    or a hit lies outside every free range (it is in a cell: still live data). The caller then rewrites the
    file instead (a VACUUM)."""
    hits = sorted(set(hits))
    with _exclusive(path) as opened:
        if opened is None:
            return None
        fd, header, page_size, pages, free = opened
        lock_page = (1 << 30) // page_size + 1  # never used by SQLite
        by_page: dict[int, list[tuple[int, int]]] = {}
        for offset, length in hits:
            number = offset // page_size + 1
            if number > pages or number == lock_page:
                return None
            start = offset - (number - 1) * page_size
            by_page.setdefault(number, []).append((start, start + length))
        plans = []
        for number, ranges in by_page.items():
            page = bytearray(os.pread(fd, page_size, (number - 1) * page_size))
            if number in free:
                regions = [(free[number], page_size)]
            else:
                regions = _free_regions(page, number, page_size)
                if regions is None:
                    return None
            if not all(any(s < r_end and r_start < e for r_start, r_end in regions) for s, e in ranges):
                return None  # some hit lies only in a cell: live data, which this must not touch
            plans.append((number, page, regions))
        written, zeroed = _write_zeroed(fd, header, page_size, plans, kill)
        return {"pages": len(plans), "pages_written": written, "bytes_zeroed": zeroed}


def zero_all_free_space(path: Path, *, kill: str = "reclaim:sqlite:free-space-page",
                        batch: int = 4096) -> dict[str, int] | None:
    """Zero the free space of every page of the file, as ``zero_freed_space`` does for some: every b-tree
    page's gap and freeblocks, every freelist page past its list. For a store whose own client deletes and
    rewrites rows with ``secure_delete`` off, the erased records' bytes that no scan pattern names (a
    document's text, say, in a page that holds neither the record's id nor its vector) can be in any page's
    free space. The file is read once, ``batch`` pages at a time; only pages whose free space holds anything
    are written. An overflow page is left as it is (its unused tail, past the payload, is known only to the
    cell that owns it).

    The pages are sorted out in bulk, with numpy over each batch (``_sift``): which are b-tree pages,
    whether each one's header and freeblock list hold together, and whether its free space (the gap, the
    freeblocks' bodies) holds a byte other than zero. Only those last pages, page 1 and the freelist pages
    are looked at one by one, each b-tree page's cell pointers checked again before anything on it is
    written; a page whose free space is all zero is neither parsed in Python nor written (in a profile of a
    71 MiB Chroma file, the pass that parsed every page took 0.19 s and this one 0.05 s). Returns the counts,
    or None (nothing written) where the file is not in a shape this knows, or a page that says it is a
    b-tree page does not hold together."""
    with _exclusive(path) as opened:
        if opened is None:
            return None
        fd, header, page_size, pages, free = opened
        lock_page = (1 << 30) // page_size + 1
        singled = set(free) | {1, lock_page}  # looked at one by one, whatever they hold
        plans = []
        btree = other = 0
        buf = np.empty(min(batch, max(pages, 1)) * page_size + 1, dtype=np.uint8)
        for first in range(1, pages + 1, batch):
            count = min(batch, pages + 1 - first)
            size = count * page_size
            if os.preadv(fd, [memoryview(buf)[:size]], (first - 1) * page_size) != size:
                return None  # shorter than its size said a moment ago: not a file to write into
            block = buf[:size].reshape(count, page_size)
            here = [n for n in singled if first <= n < first + count]
            skip = np.zeros(count, dtype=bool)
            skip[np.array(here, dtype=np.int64) - first] = True
            sifted = _sift(buf[:size + 1], count, page_size, skip)
            if sifted is None:
                return None
            is_btree, look = sifted
            for number in here:
                if number == lock_page:
                    continue
                page = block[number - first].tobytes()
                if number in free:
                    regions = [(free[number], page_size)]
                elif page[100 if number == 1 else 0] in _BTREE_PAGE_TYPES:
                    regions = _free_regions(page, number, page_size)
                    if regions is None:
                        return None
                    btree += 1
                else:
                    other += 1
                    continue
                if any(page.count(0, a, b) != b - a for a, b in regions):
                    plans.append((number, bytearray(page), regions))
            btree += int(is_btree.sum())
            other += count - int(is_btree.sum()) - len(here)
            for row in np.flatnonzero(look).tolist():
                number = first + row
                page = bytearray(block[row].tobytes())
                regions = _free_regions(page, number, page_size)
                if regions is None:
                    return None
                if any(page.count(0, a, b) != b - a for a, b in regions):
                    plans.append((number, page, regions))
        written, zeroed = _write_zeroed(fd, header, page_size, sorted(plans, key=lambda plan: plan[0]), kill)
        return {"pages": pages, "btree_pages": btree, "free_pages": len(free), "overflow_pages": other,
                "pages_written": written, "bytes_zeroed": zeroed}


_INTERIOR = np.array([0x02, 0x05], dtype=np.uint8)
_LEAF = np.array([0x0A, 0x0D], dtype=np.uint8)


def _sift(flat: np.ndarray, count: int, page_size: int, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For ``count`` pages read into ``flat`` (one spare byte at its end), as arrays of one flag per page:
    which say they are b-tree pages (by the type byte at their start), but for the pages ``skip`` marks,
    which the caller looks at itself (page 1, whose header lies past the file header; freelist pages, which
    keep what they held; the lock page), and which of those hold a byte other than zero in their
    free space (the gap between the cell pointer array and the cell content area, the body of each
    freeblock). None when a page that says it is a b-tree page has a header or a freeblock list that does
    not hold together (what ``_free_regions`` refuses, but for the cell pointers, which the caller checks on
    the pages it writes)."""
    pages = flat[:count * page_size].reshape(count, page_size)
    kind = pages[:, 0]
    interior = np.isin(kind, _INTERIOR)
    is_btree = (interior | np.isin(kind, _LEAF)) & ~skip
    head = pages[:, 1:7].astype(np.int64)
    block = (head[:, 0] << 8) | head[:, 1]
    cells = (head[:, 2] << 8) | head[:, 3]
    content = (head[:, 4] << 8) | head[:, 5]
    content[content == 0] = 65536
    pointers_end = np.where(interior, 12, 8) + 2 * cells
    if np.any(is_btree & ~((pointers_end <= content) & (content <= page_size))):
        return None
    held = np.zeros(count, dtype=bool)
    starts = np.arange(count, dtype=np.int64) * page_size

    def any_held(rows: np.ndarray, begin: np.ndarray, end: np.ndarray) -> None:
        # the bytes of each range [begin, end) of these rows OR-ed together, every range in one pass (the
        # stretches between two ranges are reduced too, and dropped); ranges must be non-empty, one per row
        if len(rows):
            bounds = np.empty(2 * len(rows), dtype=np.int64)
            bounds[0::2] = starts[rows] + begin
            bounds[1::2] = starts[rows] + end
            held[rows] |= np.bitwise_or.reduceat(flat, bounds)[0::2] != 0

    gap = np.flatnonzero(is_btree & (pointers_end < content))
    any_held(gap, pointers_end[gap], content[gap])
    floor = content
    rows = np.flatnonzero(is_btree & (block != 0))
    while len(rows):  # the freeblock lists, one link of every page's list at a time
        at = block[rows]
        if np.any(at < floor[rows]) or np.any(at + 4 > page_size):
            return None
        offsets = starts[rows] + at
        nxt = (flat[offsets].astype(np.int64) << 8) | flat[offsets + 1]
        size = (flat[offsets + 2].astype(np.int64) << 8) | flat[offsets + 3]
        if np.any(size < 4) or np.any(at + size > page_size):
            return None
        body = size > 4
        any_held(rows[body], at[body] + 4, at[body] + size[body])
        floor[rows] = at + size  # each next freeblock lies past this one: every list ends
        block[rows] = nxt
        rows = rows[nxt != 0]
    return is_btree, held


def is_sqlite(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def where_found(files: Iterable[str | os.PathLike[str]], patterns: Mapping[str, bytes], *,
                root: str | os.PathLike[str]) -> dict[str, list[tuple[str, int, int]]]:
    """Scan ``files`` once for ``patterns``: pattern key -> every (file, offset, length) it was found at."""
    from tombstone.verify.scanner import scan_files

    report = scan_files(files, patterns, root=root)
    return {key: [(hit.file, hit.offset, len(patterns[key])) for hit in found]
            for key, found in report.hits.items() if found}
