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
from tombstone.scanreport import ScanPlace, ScanReport

Validate = Callable[[list[Any]], "str | None"]
"""Given a carved record's column values, the record's id, or None when it is not a record of the store."""

_LEAF_INDEX, _LEAF_TABLE, _INTERIOR_INDEX, _INTERIOR_TABLE = 10, 13, 2, 5

MAX_CARVE_STEPS = 1_000_000
"""Work bound of the carver on one page (store option ``max_carve_steps``): how many record candidates it
tries there (one parse of serial types and values at one offset, or one length tried for a freed cell's
lost first column; a few microseconds each). Free space is untrusted bytes, and carving tries many offsets
and lengths in it: a crafted 4 KiB page could otherwise keep it busy for many minutes. A 4 KiB page of a
real store takes up to a few hundred thousand. A page that reaches the bound is reported as not fully
carved (``sqlite pages not fully carved``), never as holding nothing."""
MAX_CARVE_STEPS_TOTAL = 100_000_000
"""Work bound of the carver on one database file (store option ``max_carve_steps_total``; a few minutes
of carving): once spent, the pages left are not carved and are reported as not fully carved."""


class CarveBoundReached(Exception):
    """The carver reached its work bound on a page; ``found`` holds the ids carved before it did."""

    def __init__(self, found: set[str]) -> None:
        super().__init__("carve bound reached")
        self.found = found


class CarveBudget:
    """The carver's work bound: ``per_page`` steps on each page (``page()`` starts one), ``total`` in all."""

    def __init__(self, per_page: int = MAX_CARVE_STEPS, total: int = MAX_CARVE_STEPS_TOTAL) -> None:
        if per_page < 1 or total < 1:
            raise ValueError("carve bounds must be at least 1")
        self.per_page = per_page
        self.total = total
        self.left = per_page

    def page(self) -> None:
        self.left = min(self.per_page, self.total)

    @property
    def spent(self) -> bool:
        return self.total <= 0

    def spend(self) -> None:
        """One step; raises CarveBoundReached (with no ids: the caller adds its own) past either bound."""
        self.left -= 1
        self.total -= 1
        if self.left < 0 or self.total < 0:
            raise CarveBoundReached(set())


def carve_budget(store: str, options: Mapping[str, Any]) -> CarveBudget:
    """The carver's bounds from a store's options (``max_carve_steps``, ``max_carve_steps_total``)."""
    from tombstone.config import positive_int

    return CarveBudget(positive_int(options, "max_carve_steps", MAX_CARVE_STEPS, store),
                       positive_int(options, "max_carve_steps_total", MAX_CARVE_STEPS_TOTAL, store))


def _no_spend() -> None:
    pass


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


def _record_at(data: bytes, pos: int, end: int, columns: int,
               spend: Callable[[], None] = _no_spend) -> tuple[list[Any], int] | None:
    """A record whose ``columns`` serial types start at ``pos`` (its header-size byte may be gone)."""
    spend()
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
                               lengths: Sequence[int] | None = None, spend: Callable[[], None] = _no_spend) -> str | None:
    """A freed cell whose first serial type was overwritten by the freeblock header: the other columns'
    types survive, so try each length of the first column until the record validates (only ``lengths``
    where the table's first column has a known size, e.g. 0 for an INTEGER PRIMARY KEY stored as NULL)."""
    for pos in range(start + 4, min(start + 16, end)):
        got = _record_at(data, pos, end, columns - 1, spend)
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
            spend()
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
          hints: Hints | None = None, budget: CarveBudget | None = None) -> set[str]:
    """The ids of the records of ``shapes`` column counts found in ``data[start:end]``. ``first_lengths``
    names, per column count, the only sizes the first column can have (where the schema fixes it): a freed
    cell whose first type is lost is then tried at those sizes only, not at every size up to 512 bytes.
    ``hints`` (``Hints``) narrow where records are looked for. With a ``budget``, each record candidate
    spends a step of it; past its bound this raises CarveBoundReached holding the ids found until then."""
    found: set[str] = set()
    try:
        _carve(data, start, end, shapes, validate, first_lengths or {}, hints or {},
               budget.spend if budget is not None else _no_spend, found)
    except CarveBoundReached as exc:
        exc.found = found
        raise
    return found


def _carve(data: bytes, start: int, end: int, shapes: Sequence[int], validate: Validate,
           first_lengths: Mapping[int, Sequence[int]], hints: Hints, spend: Callable[[], None],
           found: set[str]) -> None:

    def damaged_at(pos: int, columns: int) -> None:
        size = int.from_bytes(data[pos + 2:pos + 4], "big")
        if 8 <= size <= end - pos:
            got = _record_without_first_type(data, pos, pos + size, columns, validate, first_lengths.get(columns),
                                             spend)
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
        got = _record_at(data, pos, end, columns, spend)
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
            # no more cell pointers than the page can hold: a crafted count never reads past it
            cells = min(int.from_bytes(data[header + 3:header + 5], "big"), (base + page_size - header - 12) // 2)
            todo.append(int.from_bytes(data[header + 8:header + 12], "big"))
            for i in range(cells):
                ptr = int.from_bytes(data[header + 12 + 2 * i:header + 14 + 2 * i], "big")
                todo.append(int.from_bytes(data[base + ptr:base + ptr + 4], "big"))
    return pages


def _copy_facts(store: str, database: Path, live_ids: Callable[[sqlite3.Connection], set[str]]
                ) -> tuple[bytes, set[str], list[int], int]:
    """On a private copy of the database and its WAL (folded in): the file's bytes, the live ids, the
    b-tree roots and the freelist count. A file that is not a SQLite database, or not this store's, is a
    one-line StoreUnavailableError naming it: never a traceback, never a clean report."""
    from tombstone.errors import StoreUnavailableError

    def refuse(why: str) -> StoreUnavailableError:
        return StoreUnavailableError(f"store {store!r}: {database} {why}; not scanned", store=store, retryable=False)

    snapshot = Snapshot(prefix="tombstone-scan-")
    try:
        folder = snapshot.copy_files([database, Path(f"{database}-wal")])
        copy = folder / database.name
        if not copy.is_file():
            raise refuse("is not a regular file that can be read")
        with copy.open("rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                raise refuse("is not a SQLite database (no SQLite header)")
        conn = sqlite3.connect(copy)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the copy's WAL folds into the copy
            conn.execute("PRAGMA journal_mode=DELETE")
            live = live_ids(conn)
            roots = [r for (r,) in conn.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 0")]
            freelist_count = conn.execute("PRAGMA freelist_count").fetchone()[0]
        except sqlite3.Error as exc:
            raise refuse(f"is not a readable SQLite database of this store ({exc})") from None
        finally:
            conn.close()
        data = copy.read_bytes()
    finally:
        snapshot.close()
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1) or page_size - data[20] < 480:
        raise refuse(f"has a page size SQLite does not write ({page_size}, {data[20]} reserved)")
    return data, live, [r for r in roots if isinstance(r, int)], freelist_count


def scan_sqlite(store: str, backend: str, database: Path, live_ids: Callable[[sqlite3.Connection], set[str]],
                shapes: Sequence[int], validate: Validate,
                find_ids: Callable[[bytes], set[str]] | None = None,
                first_lengths: Mapping[int, Sequence[int]] | None = None, hints: Hints | None = None,
                budget: CarveBudget | None = None) -> ScanReport:
    """Scan one SQLite database (and its WAL) for deleted data, on a private copy; never opens the original.

    ``find_ids``, when given, also reads ids out of each free region's bytes (for a store whose rows keep
    the id inside a serialised value rather than in a column). ``budget`` bounds the carving
    (:class:`CarveBudget`; default ``MAX_CARVE_STEPS`` per page, ``MAX_CARVE_STEPS_TOTAL`` in all): a page
    whose carving reaches it, or whose freeblock list does not hold together, is counted in a place
    ``sqlite pages not fully carved``, which makes the report recoverable (never clean)."""
    report = ScanReport(store=store, backend=backend)
    database = Path(database)
    if not database.is_file():
        from tombstone.errors import ConfigError

        raise ConfigError(f"store {store!r}: no database file at {database}", store=store)
    data, live, roots, freelist_count = _copy_facts(store, database, live_ids)
    report.notes.append("the WAL was folded into a private copy; superseded WAL frames are not parsed"
                        " (the physical probe byte-scans them)")
    budget = budget or CarveBudget()
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    usable = page_size - data[20]
    total = len(data) // page_size
    name = database.name
    unchecked: list[int] = []

    def carve_page(number: int, regions: Sequence[tuple[int, int, bool]], into: set[str], whole: bool = True) -> None:
        """Carve one page's free regions (start, end, is a freeblock) into ``into``, within the page's bound;
        a page that reaches it (or that ``whole`` says was not read whole) is counted as not fully carved."""
        complete = whole
        if budget.spent:
            complete = False
        else:
            budget.page()
            try:
                for start, end, block in regions:
                    into.update(carve(data, start, end, shapes, validate, freeblock=block, first_lengths=first_lengths,
                                      hints=hints, budget=budget))
            except CarveBoundReached as exc:
                into.update(exc.found)
                complete = False
        if find_ids is not None:
            for start, end, _ in regions:
                into.update(find_ids(data[start:end]))
        if not complete:
            unchecked.append(number)

    # the freelist: trunk pages (their page list is structure) and leaf pages (kept as they were); each
    # page once, however often a crafted list names it
    free_ids: set[str] = set()
    free_bytes = free_pages = 0
    trunk = int.from_bytes(data[32:36], "big")
    seen: set[int] = set()
    while trunk and trunk not in seen and 1 <= trunk <= total:
        seen.add(trunk)
        base = (trunk - 1) * page_size
        count = int.from_bytes(data[base + 4:base + 8], "big")
        listed = [int.from_bytes(data[base + 8 + 4 * i:base + 12 + 4 * i], "big") for i in range(min(count, usable // 4 - 2))]
        tail = (base + 8 + 4 * len(listed), base + usable)
        free_pages += 1
        free_bytes += _nonzero(data, *tail)
        carve_page(trunk, [(*tail, False)], free_ids)
        for leaf in listed:
            if not 1 <= leaf <= total or leaf in seen:
                continue
            seen.add(leaf)
            free_pages += 1
            region = ((leaf - 1) * page_size, (leaf - 1) * page_size + usable)
            free_bytes += _nonzero(data, *region)
            carve_page(leaf, [(*region, False)], free_ids)
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
        regions: list[tuple[int, int, bool]] = []
        cells = int.from_bytes(data[header + 3:header + 5], "big")
        content = int.from_bytes(data[header + 5:header + 7], "big") or 65536
        pointers_end = header + (8 if kind in (_LEAF_INDEX, _LEAF_TABLE) else 12) + 2 * cells
        if pointers_end < base + content <= base + usable:
            # the cell pointers of removed cells stay past the end of the array: structure, not data
            gap = pointers_end
            while gap + 2 <= base + content and pointers_end - base <= int.from_bytes(data[gap:gap + 2], "big") < usable:
                gap += 2
            # Rebalancing a b-tree rewrites pages without clearing this gap: stale cell and child pointers
            # stay there, in runs of a few bytes. Runs of up to 16 bytes count as structure here; a freed
            # cell is longer, and one whose id can be read is counted by name whatever its length.
            free[table] += _nonzero_content(data, gap, base + content, structure=GAP_STRUCTURE)
            regions.append((pointers_end, base + content, False))
        # freeblocks lie in ascending order and never overlap: a list that does otherwise is not followed
        # past that point (and the page is counted as not fully carved)
        block = int.from_bytes(data[header + 1:header + 3], "big")
        floor, whole = 0, True
        while block:
            size = int.from_bytes(data[base + block + 2:base + block + 4], "big") if block + 4 <= usable else 0
            if block < floor or size < 4 or block + size > usable:
                whole = False
                break
            end = base + block + size
            blocks[table] += 1
            free[table] += _nonzero_content(data, base + block + 4, end)
            regions.append((base + block, end, True))
            floor = block + size
            block = int.from_bytes(data[base + block:base + block + 2], "big")
        if regions or not whole:
            carve_page(page, regions, found[table], whole)
    for table in (True, False):
        deleted = found[table] - live
        report.places.append(ScanPlace(
            place=name, kind="sqlite freeblocks" if table else "sqlite index freeblocks", count=len(deleted),
            bytes=free[table], ids=sorted(deleted), bytes_count=table,
            note=(f"{blocks[table]} freeblock(s) and the unallocated space of the table b-tree pages" if table else
                  f"{blocks[table]} freeblock(s) and the unallocated space of the index b-tree pages: keys only,"
                  " and rebalancing leaves fragments of live keys there, so only deleted records named there"
                  " count")))
    if unchecked:
        shown = ", ".join(map(str, unchecked[:10])) + (", ..." if len(unchecked) > 10 else "")
        report.places.append(ScanPlace(
            place=name, kind="sqlite pages not fully carved", count=len(unchecked), bytes=0, bytes_count=False,
            note=f"page(s) {shown}: carving stopped at the work bound (max_carve_steps {budget.per_page} per page,"
                 " max_carve_steps_total) or at a freeblock list that does not hold together; what they hold"
                 " was not checked (their free bytes are counted above)"))
        report.notes.append(f"{len(unchecked)} page(s) of {name} were not fully carved: deleted records there"
                            " may go uncounted, so the scan does not call them clean")
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
    return index_row_id(values)


def index_row_id(values: list[Any]) -> str | None:
    """The id of a row of an index on a text id (id, rowid), if ``values`` is one; else None."""
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

    return scan_sqlite(store, BACKEND, Path(options["path"]), live, (4, 2), _docstore_record,
                       budget=carve_budget(store, options))
