"""``tombstone scan`` for SQLite files: free pages, freeblocks and unallocated page space, parsed at page
level, with deleted records carved from them (the docstore; the exact cache and other SQLite-backed
adapters reuse :func:`scan_sqlite`).

What SQLite leaves behind after a plain DELETE (with ``secure_delete`` off): the freed cell stays in its
page as a *freeblock* (only its first four bytes are overwritten by the freeblock's header), or in the
page's unallocated gap when it was the lowest cell; a page that empties goes on the *freelist* unchanged.
The scan reads a private copy (``Snapshot``) of the database and its WAL, folds the WAL into the copy
(so a delete not yet checkpointed is seen as the store will hold it), and counts the non-zero bytes of
every such region, and the deleted records it can carve there whose id no live row has.
"""

from __future__ import annotations

import re
import sqlite3
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.fsutil import Snapshot
from tombstone.scan import ScanPlace, ScanReport

Validate = Callable[[list[Any]], "str | None"]
"""Given a carved record's column values, the record's id, or None when it is not a record of the store."""

_LEAF_INDEX, _LEAF_TABLE, _INTERIOR_INDEX, _INTERIOR_TABLE = 10, 13, 2, 5


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int] | None:
    value = 0
    for i in range(9):
        if pos + i >= end:
            return None
        byte = data[pos + i]
        if i == 8:
            return (value << 8) | byte, pos + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos + i + 1
    return None


def _serial_length(serial: int) -> int | None:
    if serial in (10, 11):
        return None
    if serial < 12:
        return (0, 1, 2, 3, 4, 6, 8, 8, 0, 0)[serial]
    return (serial - 12) // 2 if serial % 2 == 0 else (serial - 13) // 2


def _decode(serial: int, raw: bytes) -> Any:
    if serial == 0:
        return None
    if serial in (8, 9):
        return serial - 8
    if 1 <= serial <= 6:
        return int.from_bytes(raw, "big", signed=True)
    if serial == 7:
        return struct.unpack(">d", raw)[0]
    if serial >= 13 and serial % 2 == 1:
        return raw.decode("utf-8")  # UnicodeDecodeError: not a record
    return bytes(raw)


def _record_at(data: bytes, pos: int, end: int, columns: int) -> tuple[list[Any], int] | None:
    """A record whose ``columns`` serial types start at ``pos`` (its header-size byte may be gone)."""
    serials, lengths = [], []
    for _ in range(columns):
        got = _varint(data, pos, end)
        if got is None:
            return None
        serial, pos = got
        length = _serial_length(serial)
        if length is None:
            return None
        serials.append(serial)
        lengths.append(length)
    if pos + sum(lengths) > end:
        return None
    values = []
    try:
        for serial, length in zip(serials, lengths):
            values.append(_decode(serial, data[pos:pos + length]))
            pos += length
    except UnicodeDecodeError:
        return None
    return values, pos


def _record_without_first_type(data: bytes, start: int, end: int, columns: int, validate: Validate,
                               lengths: Sequence[int] | None = None) -> str | None:
    """A freed cell whose first serial type was overwritten by the freeblock header: the other columns'
    types survive, so try each length of the first column until the record validates (only ``lengths``
    where the table's first column has a known size, e.g. 0 for an INTEGER PRIMARY KEY stored as NULL)."""
    for pos in range(start + 4, min(start + 16, end)):
        got = _record_at(data, pos, end, columns - 1)
        if got is None:
            continue
        # the first column sits between the types and the known columns; its length is unknown
        serials_end = pos
        for _ in range(columns - 1):
            serials_end = _varint(data, serials_end, end)[1]  # type: ignore[index]
        known = got[1] - serials_end
        room = end - serials_end - known
        candidates = range(1, min(512, room) + 1) if lengths is None else [n for n in lengths if n <= room]
        for first in candidates:
            try:
                head = data[serials_end:serials_end + first].decode("utf-8") if first else None
            except UnicodeDecodeError:
                continue
            rest = _record_at_body(data, pos, serials_end + first, end, columns - 1)
            if rest is None:
                continue
            found = validate([head, *rest])
            if found:
                return found
    return None


def _record_at_body(data: bytes, types_at: int, body_at: int, end: int, columns: int) -> list[Any] | None:
    pos, serials = types_at, []
    for _ in range(columns):
        got = _varint(data, pos, end)
        if got is None:
            return None
        serial, pos = got
        serials.append(serial)
    values = []
    try:
        for serial in serials:
            length = _serial_length(serial)
            if length is None or body_at + length > end:
                return None
            values.append(_decode(serial, data[body_at:body_at + length]))
            body_at += length
    except UnicodeDecodeError:
        return None
    return values


Hints = Mapping[int, tuple["re.Pattern[bytes] | None", "re.Pattern[bytes] | None"]]
"""Per column count: a pattern that matches where an intact record's serial types start, and one that matches
inside what survives of a freed cell whose first bytes the freeblock header overwrote (within 24 bytes of
the cell's start). Where a schema gives them, only those places are tried instead of every byte."""


def carve(data: bytes, start: int, end: int, shapes: Sequence[int], validate: Validate,
          freeblock: bool = False, first_lengths: Mapping[int, Sequence[int]] | None = None,
          hints: Hints | None = None) -> set[str]:
    """The ids of the records of ``shapes`` column counts found in ``data[start:end]``. ``first_lengths``
    names, per column count, the only sizes the first column can have (where the schema fixes it): a freed
    cell whose first type is lost is then tried at those sizes only, not at every size up to 512 bytes.
    ``hints`` (``Hints``) narrow where records are looked for."""
    first_lengths = first_lengths or {}
    hints = hints or {}
    found: set[str] = set()

    def damaged_at(pos: int, columns: int) -> None:
        size = int.from_bytes(data[pos + 2:pos + 4], "big")
        if 8 <= size <= end - pos:
            got = _record_without_first_type(data, pos, pos + size, columns, validate, first_lengths.get(columns))
            if got:
                found.add(got)

    # a freed cell keeps a freeblock header where its first bytes were, also once merged into a
    # neighbour or swallowed by the unallocated gap: try each plausible one (with enough surviving
    # column types to tell a record from noise)
    for columns in (c for c in shapes if c >= 3):
        damaged_hint = hints.get(columns, (None, None))[1]
        if damaged_hint is None:
            for pos in range(start, end - 8):
                damaged_at(pos, columns)
            continue
        tried: set[int] = set()
        for match in damaged_hint.finditer(data, start, end):
            for pos in range(max(start, match.start() - 24), min(match.start(), end - 8)):
                if pos not in tried:
                    tried.add(pos)
                    damaged_at(pos, columns)

    def intact_at(pos: int, columns: int) -> bool:
        got = _record_at(data, pos, end, columns)
        if got is not None:
            ident = validate(got[0])
            if ident:
                found.add(ident)
                return True
        return False

    plain = [c for c in shapes if hints.get(c, (None, None))[0] is None]
    for columns in shapes:
        intact_hint = hints.get(columns, (None, None))[0]
        if intact_hint is not None:
            for match in intact_hint.finditer(data, start, end):
                intact_at(match.start(), columns)
    if plain:
        pos = start
        while pos < end:
            if data[pos] == 0:
                pos += 1
                continue
            for columns in plain:
                if intact_at(pos, columns):
                    break
            pos += 1
    return found


def _nonzero(data: bytes, start: int, end: int) -> int:
    chunk = data[start:end]
    return len(chunk) - chunk.count(0)


GAP_STRUCTURE = 16
"""Non-zero runs of up to this many bytes in a page's unallocated gap are stale pointers, not cell data."""

_ISLAND = re.compile(rb"[^\x00](?:\x00{0,3}[^\x00])*")


def _nonzero_content(data: bytes, start: int, end: int, structure: int = 4) -> int:
    """Non-zero bytes of a page's free space, less what is structure: with ``secure_delete`` on, a freed
    cell is zeroed but the freeblock header written over its first four bytes stays (also once the
    unallocated gap swallows it), so islands of at most four bytes are not counted."""
    return sum(len(m.group()) - m.group().count(0) for m in _ISLAND.finditer(data, start, end)
               if len(m.group()) > structure)


def _btree_pages(data: bytes, page_size: int, roots: Sequence[int]) -> set[int]:
    pages: set[int] = set()
    todo = [r for r in roots if r]
    total = len(data) // page_size
    while todo:
        page = todo.pop()
        if page in pages or not 1 <= page <= total:
            continue
        pages.add(page)
        base = (page - 1) * page_size
        header = base + (100 if page == 1 else 0)
        kind = data[header]
        if kind in (_INTERIOR_INDEX, _INTERIOR_TABLE):
            cells = int.from_bytes(data[header + 3:header + 5], "big")
            todo.append(int.from_bytes(data[header + 8:header + 12], "big"))
            for i in range(cells):
                ptr = int.from_bytes(data[header + 12 + 2 * i:header + 14 + 2 * i], "big")
                todo.append(int.from_bytes(data[base + ptr:base + ptr + 4], "big"))
    return pages


def scan_sqlite(store: str, backend: str, database: Path, live_ids: Callable[[sqlite3.Connection], set[str]],
                shapes: Sequence[int], validate: Validate,
                find_ids: Callable[[bytes], set[str]] | None = None,
                first_lengths: Mapping[int, Sequence[int]] | None = None, hints: Hints | None = None) -> ScanReport:
    """Scan one SQLite database (and its WAL) for deleted data, on a private copy; never opens the original.

    ``find_ids``, when given, also reads ids out of each free region's bytes (for a store whose rows keep
    the id inside a serialised value rather than in a column)."""
    report = ScanReport(store=store, backend=backend)
    database = Path(database)
    if not database.is_file():
        from tombstone.errors import ConfigError

        raise ConfigError(f"store {store!r}: no database file at {database}", store=store)
    snapshot = Snapshot(prefix="tombstone-scan-")
    try:
        folder = snapshot.copy_files([database, Path(f"{database}-wal")])
        copy = folder / database.name
        conn = sqlite3.connect(copy)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the copy's WAL folds into the copy
            conn.execute("PRAGMA journal_mode=DELETE")
            live = live_ids(conn)
            roots = [r for (r,) in conn.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 0")]
            freelist_count = conn.execute("PRAGMA freelist_count").fetchone()[0]
        finally:
            conn.close()
        data = copy.read_bytes()
        report.notes.append("the WAL was folded into a private copy; superseded WAL frames are not parsed"
                            " (the physical probe byte-scans them)")
    finally:
        snapshot.close()
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    reserved = data[20]
    usable = page_size - reserved
    name = database.name

    # the freelist: trunk pages (their page list is structure) and leaf pages (kept as they were)
    free_ids: set[str] = set()
    free_bytes = free_pages = 0
    trunk = int.from_bytes(data[32:36], "big")
    seen: set[int] = set()
    while trunk and trunk not in seen and trunk * page_size <= len(data):
        seen.add(trunk)
        base = (trunk - 1) * page_size
        count = int.from_bytes(data[base + 4:base + 8], "big")
        leaves = [int.from_bytes(data[base + 8 + 4 * i:base + 12 + 4 * i], "big") for i in range(min(count, usable // 4))]
        regions = [(base + 8 + 4 * len(leaves), base + usable)]
        regions += [((leaf - 1) * page_size, (leaf - 1) * page_size + usable) for leaf in leaves
                    if 1 <= leaf <= len(data) // page_size]
        free_pages += 1 + len(leaves)
        for start, end in regions:
            free_bytes += _nonzero(data, start, end)
            free_ids |= carve(data, start, end, shapes, validate, first_lengths=first_lengths, hints=hints)
            if find_ids is not None:
                free_ids |= find_ids(data[start:end])
        trunk = int.from_bytes(data[base:base + 4], "big")
    free_deleted = free_ids - live
    report.places.append(ScanPlace(
        place=name, kind="sqlite free pages", count=len(free_deleted), bytes=free_bytes, ids=sorted(free_deleted),
        note=f"{free_pages} page(s) on the freelist (PRAGMA freelist_count {freelist_count})"))

    # freeblocks and the unallocated gap of every b-tree page; table pages and index pages apart: an index
    # page holds keys only, and rebalancing leaves fragments of live keys in its free space, so there only
    # the deleted records named count (a table page's free bytes count alone: they are what a row held)
    found: dict[bool, set[str]] = {True: set(), False: set()}
    free: dict[bool, int] = {True: 0, False: 0}
    blocks = {True: 0, False: 0}
    for page in sorted(_btree_pages(data, page_size, roots)):
        base = (page - 1) * page_size
        header = base + (100 if page == 1 else 0)
        kind = data[header]
        if kind not in (_LEAF_INDEX, _LEAF_TABLE, _INTERIOR_INDEX, _INTERIOR_TABLE):
            continue
        table = kind in (_LEAF_TABLE, _INTERIOR_TABLE)
        cell_ids = found[table]
        cells = int.from_bytes(data[header + 3:header + 5], "big")
        content = int.from_bytes(data[header + 5:header + 7], "big") or 65536
        pointers_end = header + (8 if kind in (_LEAF_INDEX, _LEAF_TABLE) else 12) + 2 * cells
        if base + content > pointers_end:
            # the cell pointers of removed cells stay past the end of the array: structure, not data
            gap = pointers_end
            while gap + 2 <= base + content and pointers_end - base <= int.from_bytes(data[gap:gap + 2], "big") < usable:
                gap += 2
            # Rebalancing a b-tree rewrites pages without clearing this gap: stale cell and child pointers
            # stay there, in runs of a few bytes. Runs of up to 16 bytes count as structure here; a freed
            # cell is longer, and one whose id can be read is counted by name whatever its length.
            free[table] += _nonzero_content(data, gap, base + content, structure=GAP_STRUCTURE)
            cell_ids |= carve(data, pointers_end, base + content, shapes, validate, first_lengths=first_lengths, hints=hints)
            if find_ids is not None:
                cell_ids |= find_ids(data[pointers_end:base + content])
        block = int.from_bytes(data[header + 1:header + 3], "big")
        visited: set[int] = set()
        while block and block not in visited and block + 4 <= usable:
            visited.add(block)
            size = int.from_bytes(data[base + block + 2:base + block + 4], "big")
            end = min(base + block + size, base + usable)
            blocks[table] += 1
            free[table] += _nonzero_content(data, base + block + 4, end)
            cell_ids |= carve(data, base + block, end, shapes, validate, freeblock=True, first_lengths=first_lengths, hints=hints)
            if find_ids is not None:
                cell_ids |= find_ids(data[base + block:end])
            block = int.from_bytes(data[base + block:base + block + 2], "big")
    for table in (True, False):
        deleted = found[table] - live
        report.places.append(ScanPlace(
            place=name, kind="sqlite freeblocks" if table else "sqlite index freeblocks", count=len(deleted),
            bytes=free[table], ids=sorted(deleted), bytes_count=table,
            note=(f"{blocks[table]} freeblock(s) and the unallocated space of the table b-tree pages" if table else
                  f"{blocks[table]} freeblock(s) and the unallocated space of the index b-tree pages: keys only,"
                  " and rebalancing leaves fragments of live keys there, so only deleted records named there"
                  " count")))
    return report


# -- the docstore ---------------------------------------------------------------------------------


def _docstore_record(values: list[Any]) -> str | None:
    """A row of ``documents`` (id, text, metadata, suppressed) or of its primary-key index (id, rowid)."""
    if len(values) == 4:
        ident, text, metadata, suppressed = values
        if (isinstance(ident, str) and isinstance(text, str) and isinstance(metadata, str)
                and metadata.startswith("{") and metadata.endswith("}") and suppressed in (0, 1)):
            return ident if ident and ident.isprintable() else None
        return None
    if len(values) == 2:
        ident, rowid = values
        if isinstance(ident, str) and isinstance(rowid, int) and not isinstance(rowid, bool) and rowid > 0:
            return ident if ident and ident.isprintable() else None
    return None


def scan_docstore(store: str, options: Mapping[str, Any]) -> ScanReport:
    from tombstone.errors import ConfigError

    from .store import BACKEND

    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {BACKEND} backend needs path = "..."', store=store)

    def live(conn: sqlite3.Connection) -> set[str]:
        return {i for (i,) in conn.execute("SELECT id FROM documents")}

    return scan_sqlite(store, BACKEND, Path(options["path"]), live, (4, 2), _docstore_record)
