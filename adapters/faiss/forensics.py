"""``tombstone scan`` for a FAISS store (``IndexHNSWFlat`` inside ``IndexIDMap2``, see ``store``), read
with ``faiss.read_index`` (the flat vectors mapped read-only where faiss can map them) and plain file reads
(nothing is written, no lock file is made):

- vectors whose label no id of the store maps to any more (what ``remove_ids`` cannot do on HNSW, so an
  app forgets the mapping and the vector stays);
- vectors of labels the store excludes from search (suppressed, awaiting a reclaim);
- files of other generations than ``CURRENT`` names (left by a crash between write and clean-up);
- in the records file, lines of dropped records a crash left unblanked, and bytes past the committed length;
  in the heads files, the ids of those records and bytes past the committed length (heads files the
  generation does not name count with the other generations' files).

Only regular files inside the store are read, never blocking and never through a link (``tombstone.fsutil.
open_regular``); anything else in the store directory (a FIFO, a device, a socket, a link) is named in the
report's notes, not opened. A file the store cannot be read without (CURRENT, the state, the index, the
records or heads files) that is not a regular file stops the scan with one line naming it. Counts the files
hold are checked against their real sizes before anything is allocated for them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.fsutil import METADATA_LIMIT, open_regular, read_fd
from tombstone.scanreport import ScanPlace, ScanReport

from .generations import _read_index, current_generation, read_generation
from .labels import id_label_pairs
from .records import HEAD_IDS, HEADS, RECORDS, _HEAD_COLUMNS, _ID_AT, _ID_LEN, _LABEL, _LINE_LEN
from .store import metadata_limit


def _nonzero(chunk: bytes) -> int:
    return len(chunk) - chunk.count(0)


def _unblanked(chunk: bytes) -> int:
    return len(chunk) - chunk.count(b" ")


def _read_at(fd: int, offset: int, length: int) -> bytes:
    return read_fd(fd, length, offset)


def _nonzero_in(fd: int) -> int:
    """Bytes of the open file that are not zero, read in chunks."""
    total, at, size = 0, 0, os.fstat(fd).st_size
    while at < size:
        chunk = os.pread(fd, min(1 << 24, size - at), at)
        if not chunk:
            break
        total += _nonzero(chunk)
        at += len(chunk)
    return total


def _special(root: Path) -> list[str]:
    """Entries of the store directory that are neither regular files nor folders, as notes (never opened)."""
    notes = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            continue
        kind = next((name for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                                             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                             (stat.S_ISSOCK, "a socket")) if test(mode)), "not a regular file")
        notes.append(f"{entry.name} is {kind}: not read (a store writes only regular files)")
    return notes


def scan_faiss(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {backend} backend needs path = "..."', store=store)
    root = Path(options["path"])
    try:
        generation = current_generation(root)
        index_file = root / f"index-{generation:06d}.faiss"
        side, lines, to_blank = read_generation(root, generation, metadata_limit(store, options) or METADATA_LIMIT)
        index, _ = _read_index(index_file)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, StoreUnavailableError) as exc:
        raise ConfigError(f"store {store!r}: no readable FAISS store at {root}: {exc}", store=store) from exc
    try:
        return _scan(store, backend, root, generation, index_file, side, lines, to_blank, index)
    except (OSError, StoreUnavailableError) as exc:
        raise ConfigError(f"store {store!r}: cannot scan the FAISS store at {root}: {exc}", store=store) from exc


def _scan(store: str, backend: str, root: Path, generation: int, index_file: Path, side: dict[str, Any], lines: Any,
          to_blank: dict[int, str], index: Any) -> ScanReport:
    report = ScanReport(store=store, backend=backend)
    report.notes.extend(_special(root))
    labels = faiss.vector_to_array(index.id_map) if hasattr(index, "id_map") else np.arange(index.ntotal)
    base = faiss.downcast_index(index.index) if hasattr(index, "index") else index
    storage = faiss.downcast_index(base.storage) if hasattr(base, "storage") else base
    width = storage.code_size if hasattr(storage, "code_size") else 0
    if width and hasattr(storage, "codes") and labels.size:
        # the codes where they lie (mapped from the file, or in memory), one row per slot, never written
        if hasattr(storage.codes, "data"):
            codes = faiss.rev_swig_ptr(storage.codes.data(), labels.size * width).reshape(labels.size, width)
            codes.flags.writeable = False
        else:  # an older faiss: a copy
            codes = faiss.vector_to_array(storage.codes).reshape(labels.size, width)
    else:
        codes = np.zeros((labels.size, 0), np.uint8)
    id_labels = side.get("labels", {})
    live_ids, live_labels = id_label_pairs(id_labels)
    excluded = np.fromiter({int(label) for label in side.get("excluded", [])}, np.int64)
    gone = ~np.isin(labels, live_labels)
    held = np.isin(labels, excluded) & ~gone
    # bytes that are not zero in each slot of interest only (slots of live ids are not read)
    orphan_bytes = np.count_nonzero(codes[gone], axis=1)  # zeros where no codes were read (width 0)
    hidden_bytes = np.count_nonzero(codes[held], axis=1)
    orphan = [int(np.count_nonzero(orphan_bytes)), int(orphan_bytes.sum())]
    named = labels[held][hidden_bytes > 0]
    hidden = [int(named.size), int(hidden_bytes.sum()),
              [live_ids[k] for k in np.flatnonzero(np.isin(live_labels, named)).tolist()]]
    report.places.append(ScanPlace(
        place=index_file.name, kind="vectors without a live id", count=orphan[0], bytes=orphan[1],
        note="their id is gone from the records, so it cannot be named"))
    report.places.append(ScanPlace(
        place=index_file.name, kind="vectors excluded from search (suppressed)", count=hidden[0],
        bytes=hidden[1], ids=sorted(hidden[2]), note="hidden on every query path, still stored until a reclaim"))
    records = root / RECORDS
    if side.get("records_length") is not None and os.path.lexists(records):
        # lines a generation dropped that a crash left unblanked, and a crashed commit's tail past the
        # committed length: both still hold the records' ids and texts
        fd = open_regular(records, root, store=store)
        try:
            unblanked = sum(_unblanked(_read_at(fd, *place)) for place in lines.places(to_blank))
            tail = max(0, os.fstat(fd).st_size - side["records_length"])
        finally:
            os.close(fd)
        report.places.append(ScanPlace(
            place=RECORDS, kind="dropped records' lines not yet blanked", count=len(to_blank), bytes=unblanked,
            note="the next write or erasure blanks them"))
        report.places.append(ScanPlace(
            place=RECORDS, kind="bytes past the committed length", count=1 if tail else 0, bytes=tail,
            note="written by a commit that did not finish; the next write cuts them off"))
    heads = side.get("heads")
    if heads is not None:
        _, rows, size = (int(v) for v in heads)
        pending = np.zeros((0, _HEAD_COLUMNS), np.int64)
        heads_fd = open_regular(root / HEADS, root, store=store)
        try:
            heads_size = os.fstat(heads_fd).st_size
            if to_blank:  # the rows of records a crash left unblanked (none after a clean commit: nothing read)
                # the state's row count was checked against the file when the generation was read; read no more
                # than the file holds all the same
                data = read_fd(heads_fd, min(heads_size, 8 * _HEAD_COLUMNS * (rows + 1)))
                table = np.frombuffer(data[: len(data) - len(data) % (8 * _HEAD_COLUMNS)], dtype="<i8")
                table = table.reshape(-1, _HEAD_COLUMNS)[1:]
                pending = table[np.isin(table[:, _LABEL], np.fromiter(to_blank, np.int64, len(to_blank)))
                                & (table[:, _LINE_LEN] > 0)]
        finally:
            os.close(heads_fd)
        fd = open_regular(root / HEAD_IDS, root, store=store)
        try:
            unblanked = sum(_unblanked(_read_at(fd, at, n)) for at, n in pending[:, [_ID_AT, _ID_LEN]].tolist())
            tail = max(0, os.fstat(fd).st_size - size)
        finally:
            os.close(fd)
        tail += max(0, heads_size - 8 * _HEAD_COLUMNS * (rows + 1))
        report.places.append(ScanPlace(
            place=HEAD_IDS, kind="dropped records' ids not yet blanked", count=len(pending), bytes=unblanked,
            note="the next write or erasure blanks them with their lines"))
        report.places.append(ScanPlace(
            place=f"{HEADS}, {HEAD_IDS}", kind="heads past the committed length", count=1 if tail else 0,
            bytes=tail, note="written by a commit that did not finish; the next write cuts them off"))
    keep = {index_file.name, f"state-{generation:06d}.json", f"sidecar-{generation:06d}.json", RECORDS, "CURRENT"}
    if heads is not None:
        keep |= {HEADS, HEAD_IDS}
    stale = [p for p in sorted(root.iterdir()) if not p.is_symlink() and p.is_file() and p.name not in keep
             and (p.name.startswith(("index-", "sidecar-", "state-")) or p.name in (HEADS, HEAD_IDS))]
    stale_bytes = 0
    for path in stale:
        try:
            fd = open_regular(path, root, store=store)
        except (OSError, StoreUnavailableError) as exc:  # replaced since it was listed: named, not read
            report.notes.append(f"{path.name}: {exc}")
            continue
        try:
            stale_bytes += _nonzero_in(fd)
        finally:
            os.close(fd)
    report.places.append(ScanPlace(
        place=root.name, kind="files of other generations", count=len(stale),
        bytes=stale_bytes, note=", ".join(p.name for p in stale)))
    return report
