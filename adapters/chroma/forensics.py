"""``tombstone scan`` for an embedded Chroma folder (``PersistentClient(path=...)``), read from a private
copy with SQLite and plain file reads (never with Chroma's client, which writes on opening):

- ``embeddings_queue`` rows of ADD, UPDATE or UPSERT (vector and metadata, the document among it) whose id
  no live embedding of any collection has;
- HNSW slots that hnswlib marks deleted (the flag byte of the slot's level-0 link list), or whose id no
  live embedding has (a delete Chroma has not yet persisted), whose vector is not all zeros (``header.bin``,
  ``data_level0.bin``, ``index_metadata.pickle`` read by an unpickler that runs no code);
- segment folders no segment of ``chroma.sqlite3`` names (orphans);
- ``chroma.sqlite3``'s free pages, freeblocks and unallocated page space (the docstore's ``scan_sqlite``).
"""

from __future__ import annotations

import pickle  # noqa: S403 - read through _MetadataUnpickler only, which builds no class it names
import re
import sqlite3
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError
from tombstone.fsutil import Snapshot
from tombstone.scanreport import ScanPlace, ScanReport

SQLITE_NAME = "chroma.sqlite3"
DELETE_OPERATION = 3  # chromadb.db.mixins.embeddings_queue._operation_codes[Operation.DELETE]
# header.bin as chroma-hnswlib's persistent index writes it: a format version, then hnswlib's saveIndex header
# (offsetLevel0, max_elements, cur_element_count, size_data_per_element, label_offset, offset_data,
# maxlevel, enterpoint_node, maxM, maxM0, M, mult, ef_construction)
_HEADER = struct.Struct("<iQQQQQQiIQQQdQ")
DELETE_MARK = 0x01
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _nonzero(chunk: bytes) -> int:
    return len(chunk) - chunk.count(0)


def _embedding_record(values: list[Any]) -> str | None:
    """A row of ``embeddings`` (id, segment_id, embedding_id, seq_id, created_at) or of its unique index
    (segment_id, embedding_id, rowid)."""
    if len(values) == 5:
        _rowid, segment, ident, _seq, _created = values
    elif len(values) == 3:
        segment, ident, _rowid = values
    else:
        return None
    if isinstance(segment, str) and _UUID.fullmatch(segment) and isinstance(ident, str):
        return ident if ident and ident.isprintable() else None
    return None


class _Stub:
    """What the restricted unpickler builds instead of any class the metadata names: only its state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _MetadataUnpickler(pickle.Unpickler):
    """Reads ``index_metadata.pickle`` without importing or calling anything it names."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in ("dict", "list", "set", "int", "str", "tuple", "frozenset"):
            return getattr(__import__("builtins"), name)
        return _Stub


def _label_to_id(folder: Path) -> dict[int, str]:
    """Chroma's label -> id map of a segment (``index_metadata.pickle``, read with no code run)."""
    path = folder / "index_metadata.pickle"
    try:
        with path.open("rb") as fh:
            obj = _MetadataUnpickler(fh).load()
    except Exception:
        return {}
    state = getattr(obj, "state", obj)
    if isinstance(state, tuple):
        state = next((x for x in state if isinstance(x, dict)), {})
    mapping = state.get("label_to_id", {}) if isinstance(state, dict) else {}
    return {int(k): str(v) for k, v in mapping.items() if isinstance(k, int)}


def hnsw_deleted_slots(folder: Path, live: set[str] | None = None) -> tuple[int, int, set[str]]:
    """Slots of one HNSW segment folder that hnswlib marks deleted, or whose id no live embedding has,
    and whose vector is not zero: (slots, vector bytes, the ids Chroma's metadata still gives them)."""
    header_file, data_file = folder / "header.bin", folder / "data_level0.bin"
    if not (header_file.is_file() and data_file.is_file()):
        return 0, 0, set()
    raw = header_file.read_bytes()
    if len(raw) < _HEADER.size:
        return 0, 0, set()
    offset_level0, _max, count, size, label_offset, offset_data = _HEADER.unpack_from(raw)[1:7]
    data = data_file.read_bytes()
    if not size or count * size > len(data) or not offset_data < label_offset <= size - 8:
        return 0, 0, set()
    labels = _label_to_id(folder) if live is not None else {}
    slots = nbytes = 0
    ids: set[str] = set()
    for i in range(count):
        base = i * size
        label = int.from_bytes(data[base + label_offset:base + label_offset + 8], "little")
        ident = labels.get(label)
        marked = bool(data[base + offset_level0 + 2] & DELETE_MARK)
        if marked or (live is not None and ident is not None and ident not in live):
            vector = _nonzero(data[base + offset_data:base + label_offset])
            if vector:
                slots += 1
                nbytes += vector
                if ident is not None and (live is None or ident not in live):
                    ids.add(ident)
    return slots, nbytes, ids


def scan_chroma(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    from tombstone_adapters.docstore.forensics import carve_budget, scan_sqlite

    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {backend} backend needs path = "..."', store=store)
    budget = carve_budget(store, options)  # a bad bound is refused before anything is read
    root = Path(options["path"])
    if not (root / SQLITE_NAME).is_file():
        raise ConfigError(f"store {store!r}: no Chroma folder at {root} (no {SQLITE_NAME})", store=store)
    report = ScanReport(store=store, backend=backend)
    snapshot = Snapshot(prefix="tombstone-scan-chroma-")
    try:
        copy = snapshot.copy_tree(root)
        conn = sqlite3.connect(copy / SQLITE_NAME)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            live = {i for (i,) in conn.execute("SELECT embedding_id FROM embeddings")}
            segments = {s for (s,) in conn.execute("SELECT id FROM segments")}
            queued = conn.execute("SELECT id, operation, coalesce(length(vector), 0) + coalesce(length(metadata), 0)"
                                  " FROM embeddings_queue").fetchall()
        finally:
            conn.close()
        dead = {}
        for ident, operation, size in queued:
            if operation != DELETE_OPERATION and ident not in live:
                dead[ident] = dead.get(ident, 0) + int(size)
        report.places.append(ScanPlace(
            place=f"{SQLITE_NAME} embeddings_queue", kind="queue rows of deleted ids", count=len(dead),
            bytes=sum(dead.values()), ids=sorted(dead),
            note="the write-ahead queue keeps each write's vector and metadata (with the document)"))
        slots = nbytes = 0
        slot_ids: set[str] = set()
        orphans: list[str] = []
        orphan_bytes = 0
        for folder in sorted(p for p in copy.iterdir() if p.is_dir()):
            if folder.name not in segments:
                orphans.append(folder.name)
                orphan_bytes += sum(_nonzero(f.read_bytes()) for f in folder.rglob("*") if f.is_file())
                continue
            s, b, found = hnsw_deleted_slots(folder, live)
            slots, nbytes = slots + s, nbytes + b
            slot_ids |= found
        report.places.append(ScanPlace(
            place="HNSW segments", kind="slots of deleted ids with a vector", count=slots, bytes=nbytes,
            ids=sorted(slot_ids),
            note="slots marked deleted, or whose id (index_metadata.pickle, read with no code run) is not live"))
        report.places.append(ScanPlace(
            place="segment folders", kind="orphan folders (no segment names them)", count=len(orphans),
            bytes=orphan_bytes, ids=[], note=", ".join(orphans)))
    finally:
        snapshot.close()

    def live_ids(conn: sqlite3.Connection) -> set[str]:
        return {i for (i,) in conn.execute("SELECT embedding_id FROM embeddings")}

    # embeddings rows start with the INTEGER PRIMARY KEY (stored as NULL: 0 bytes), index cells with the
    # segment's uuid (36 bytes): a freed cell whose first type is lost is tried at that size alone
    sqlite_report = scan_sqlite(store, backend, root / SQLITE_NAME, live_ids, (5, 3), _embedding_record,
                                first_lengths={5: (0,), 3: (36,)},
                                # a row's types start NULL (the id), 0x55 (the 36-character segment uuid);
                                # an index cell's body starts with that uuid
                                hints={5: (re.compile(rb"\x00\x55"), re.compile(rb"\x55")),
                                       3: (re.compile(rb"\x55"), re.compile(_UUID.pattern.encode()))},
                                budget=budget)
    for place in sqlite_report.places:
        # Chroma's own schema migrations leave free pages in a store that never deleted a record: only
        # the deleted embedding rows carved there count, the bytes are shown
        place.bytes_count = False
        if place.kind != "sqlite pages not fully carved":
            place.note += "; bytes include Chroma's own housekeeping, only carved deleted rows count"
    report.places.extend(sqlite_report.places)
    report.notes.extend(sqlite_report.notes)
    return report
