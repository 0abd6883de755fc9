"""Chroma's in-place reclaim: the erased records' rows and HNSW slots are cleared where they lie, and nothing
else in the collection is rewritten.

The persisted HNSW segment (one folder per segment, named by its id) holds:

- ``header.bin``: a format version (u32), then hnswlib's index header (element count, the size of one slot,
  where in a slot the vector and the label lie);
- ``data_level0.bin``: one slot per element: its level-0 link list (a u16 count, a flag byte whose lowest bit
  marks the element deleted, the neighbours), its vector (normalised in cosine space), its label (u64);
- ``index_metadata.pickle``: Chroma's id <-> label map, a plain dict of strings and integers.

Erasing in place marks each erased slot deleted and zeroes its vector (hnswlib keeps a deleted element's
vector and its links; a deleted element is never returned), zeroes the vector of every slot already marked
deleted (an earlier delete by the store's own client left it), and drops the ids from the id map. The slots
and their links stay until ``tombstone compact`` rewrites the collection.
"""

from __future__ import annotations

import os
import pickle  # noqa: S403 - read through _PlainUnpickler only, which builds nothing but builtins
import sqlite3
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.faults import kill_point
from tombstone.fsutil import write_atomic

from .fulltext import changed

ID_MAP = "index_metadata.pickle"
DELETE_MARK = 0x01
DELETE_OPERATION = 3  # chromadb's code for Operation.DELETE in embeddings_queue
# version, offsetLevel0, max_elements, cur_element_count, size_data_per_element, label_offset, offset_data
_HEADER = struct.Struct("<i6Q")
_ID_MAP_KEYS = {"dimensionality", "total_elements_added", "max_seq_id", "id_to_label", "label_to_id", "id_to_seq_id"}


class NotInPlace(Exception):
    """The segment is not in a shape the in-place recipe knows; the caller rewrites instead."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise NotInPlace(f"{ID_MAP} names {module}.{name}: not the plain id map this recipe edits")


def read_id_map(folder: Path) -> dict[str, Any] | None:
    """The segment's id map, or None when the segment was never persisted. Only a plain dict of the keys
    Chroma's Rust core writes is accepted (no class is built, no code runs)."""
    path = folder / ID_MAP
    try:
        with path.open("rb") as fh:
            data = _PlainUnpickler(fh).load()
    except FileNotFoundError:
        return None
    except NotInPlace:
        raise
    except Exception as exc:
        raise NotInPlace(f"{ID_MAP} is not readable as a plain id map: {exc}") from exc
    if not isinstance(data, dict) or not {"id_to_label", "label_to_id"} <= set(data) or set(data) - _ID_MAP_KEYS:
        raise NotInPlace(f"{ID_MAP} has keys {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    return data


def write_id_map(folder: Path, data: Mapping[str, Any]) -> None:
    """Replace the id map atomically (temp file in the folder, fsync, rename), then fsync the folder."""
    write_atomic(folder / ID_MAP, pickle.dumps(dict(data), protocol=3))
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def header(folder: Path) -> dict[str, int] | None:
    try:
        raw = (folder / "header.bin").read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _HEADER.size:
        raise NotInPlace("header.bin is shorter than hnswlib's header")
    _version, offset_level0, _max, count, size, label_offset, offset_data = _HEADER.unpack_from(raw)
    if not size or not offset_level0 + 3 <= offset_data < label_offset <= size - 8:
        raise NotInPlace("header.bin does not describe the slot layout this recipe knows")
    return {"offset_level0": offset_level0, "count": count, "size": size, "label_offset": label_offset,
            "offset_data": offset_data}


_ABSENT: dict[str, tuple[tuple[int, int, int], frozenset[str]]] = {}
"""Per segment folder, ids this process knows its id map does not hold, with the map file's (inode, size,
mtime) when it knew it: ``erase_slots`` records the ids it was asked to erase once the map it wrote (or
found) holds none of them. Kept for the last few folders only."""


def _map_stamp(folder: Path) -> tuple[int, int, int] | None:
    try:
        st = (folder / ID_MAP).stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _remember_absent(folder: Path, ids: Iterable[str]) -> None:
    stamp = _map_stamp(folder)
    if stamp is None:
        return
    _ABSENT.pop(str(folder), None)
    _ABSENT[str(folder)] = (stamp, frozenset(ids))
    while len(_ABSENT) > 4:
        _ABSENT.pop(next(iter(_ABSENT)))


def known_absent(folder: Path, ids: Iterable[str]) -> bool:
    """True when this process itself left the segment's id map without any of ``ids`` (``erase_slots``) and
    the file is still the one it wrote or read then (same inode, size and modification time): a search,
    which names its results through that map, cannot return them. False when that is not known; the
    caller then reads the map or searches."""
    held = _ABSENT.get(str(folder))
    return held is not None and held[0] == _map_stamp(folder) and set(ids) <= held[1]


def erase_slots(folder: Path, ids: Iterable[str]) -> dict[str, int]:
    """Mark the slots of ``ids`` deleted and zero their vectors, zero the vectors of slots already marked
    deleted, fsync; then drop ``ids`` from the id map. Idempotent: run again after a crash, it finds the
    slots it zeroed already zero and the ids already gone. Returns counts."""
    head = header(folder)
    id_map = read_id_map(folder)
    if head is None or id_map is None or head["count"] == 0:
        return {"slots_marked": 0, "vectors_zeroed": 0, "ids_dropped": 0}
    data_file = folder / "data_level0.bin"
    count, size = head["count"], head["size"]
    if data_file.stat().st_size < count * size:
        raise NotInPlace("data_level0.bin is shorter than its header says")
    asked = list(ids)
    ids = [i for i in asked if i in id_map["id_to_label"]]
    erased_labels = {int(id_map["id_to_label"][i]) for i in ids}
    slots = np.memmap(data_file, dtype=np.uint8, mode="r+", shape=(count, size))
    try:
        lo, vo, vend = head["label_offset"], head["offset_data"], head["label_offset"]
        labels = np.ascontiguousarray(slots[:, lo:lo + 8]).view("<u8").ravel()
        flag_col = head["offset_level0"] + 2
        erased = np.isin(labels, np.fromiter(erased_labels, dtype=np.uint64, count=len(erased_labels)))
        marked_before = (slots[:, flag_col] & DELETE_MARK).astype(bool)
        newly_marked = erased & ~marked_before
        targets = np.flatnonzero(erased | marked_before)
        nonzero = targets[slots[targets, vo:vend].any(axis=1)] if len(targets) else targets
        if newly_marked.any():
            slots[newly_marked, flag_col] |= DELETE_MARK
        for t in nonzero.tolist():
            slots[t, vo:vend] = 0
        slots.flush()
    finally:
        del slots
    fd = os.open(data_file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    kill_point("reclaim:chroma:slots-zeroed")  # zeroed and synced, the id map not yet rewritten
    if ids:
        for i in ids:
            label = id_map["id_to_label"].pop(i)
            id_map["label_to_id"].pop(label, None)
            if isinstance(id_map.get("id_to_seq_id"), dict):
                id_map["id_to_seq_id"].pop(i, None)
        write_id_map(folder, id_map)
    _remember_absent(folder, asked)  # the map now on disk holds none of them
    return {"slots_marked": int(newly_marked.sum()), "vectors_zeroed": len(nonzero), "ids_dropped": len(ids)}


def delete_rows(conn: Any, ids: list[str], metadata_segment: str | None, topics: list[str],
                before: Callable[[Any], None] | None = None) -> dict[str, int]:
    """Delete the records' rows on ``conn`` (which has ``secure_delete`` on, so SQLite zeroes their cells and
    the pages it frees): the metadata segment's rows (embeddings, their metadata, the document's full-text
    row) and every queue row of theirs in this collection's topics, which becomes an empty DELETE (of id
    ``''``, which no record has). One transaction, in which ``before(conn)`` runs first. ``conn`` is
    ``sqlite3``'s or apsw's (``fulltext.connect``)."""
    counts = {"embeddings": 0, "metadata": 0, "fulltext": 0, "queue": 0}
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    per_row = [t for t in ("embedding_metadata", "embedding_metadata_array") if t in tables]
    fulltext = "embedding_fulltext_search" in tables
    conn.execute("BEGIN IMMEDIATE")
    try:
        if before is not None:
            before(conn)
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" * len(part))
            rowids: list[int] = []
            if metadata_segment is not None:
                rowids = [r for (r,) in conn.execute(
                    f"SELECT id FROM embeddings WHERE segment_id = ? AND embedding_id IN ({marks})",  # noqa: S608
                    (metadata_segment, *part))]
            for rstart in range(0, len(rowids), 500):
                rpart = rowids[rstart:rstart + 500]
                rmarks = ",".join("?" * len(rpart))
                for table in per_row:
                    counts["metadata"] += changed(conn, f"DELETE FROM {table} WHERE id IN ({rmarks})", rpart)  # noqa: S608
                if fulltext:
                    counts["fulltext"] += changed(
                        conn, f"DELETE FROM embedding_fulltext_search WHERE rowid IN ({rmarks})", rpart)  # noqa: S608
                counts["embeddings"] += changed(conn, f"DELETE FROM embeddings WHERE id IN ({rmarks})", rpart)  # noqa: S608
            for topic in topics:
                # emptied, not deleted: the queue's seq_id has no AUTOINCREMENT, so deleting its last rows
                # would hand their seq_ids to the next writes, which every segment has seen already and skips
                counts["queue"] += changed(
                    conn, f"UPDATE embeddings_queue SET operation = ?, id = '', vector = NULL, encoding = NULL,"  # noqa: S608
                    f" metadata = NULL WHERE topic = ? AND id IN ({marks})", (DELETE_OPERATION, topic, *part))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return counts


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the transaction if SQLite has not already: a statement that fails with SQLITE_FULL (disk
    full) or SQLITE_IOERR rolls it back itself, and a ROLLBACK then would raise "no transaction is active" in
    place of the error that says what happened."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def flag_rows(conn: sqlite3.Connection, metadata_segment: str, ids: list[str], key: str) -> int:
    """Set the boolean metadata ``key`` to true on the records ``ids`` hold in ``metadata_segment``, in its
    table, as Chroma's own ``update`` stores it (a row of ``embedding_metadata`` with ``bool_value`` 1), in one
    transaction; returns how many records hold it. Chroma's read paths filter on that table, so a ``where``
    on the key sees it at once, in every process. Done here rather than through ``update``, which first makes
    the client load the whole HNSW index into memory (seconds at a million vectors) for a change that touches
    no vector."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        rowids: list[int] = []
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            rowids += [r for (r,) in conn.execute(
                f"SELECT id FROM embeddings WHERE segment_id = ? AND embedding_id IN ({','.join('?' * len(part))})",  # noqa: S608
                (metadata_segment, *part))]
        conn.executemany(
            "INSERT INTO embedding_metadata (id, key, bool_value) VALUES (?, ?, 1) ON CONFLICT (id, key) DO UPDATE"
            " SET string_value = NULL, int_value = NULL, float_value = NULL, bool_value = 1",
            [(r, key) for r in rowids])
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return len(rowids)
