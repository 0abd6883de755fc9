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
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.errors import ConfigError
from tombstone.scan import ScanPlace, ScanReport

from .store import (HEAD_IDS, HEADS, RECORDS, _HEAD_COLUMNS, _ID_AT, _ID_LEN, _LABEL, _LINE_LEN, _read_index,
                    current_generation, id_label_pairs, read_generation)


def _nonzero(chunk: bytes) -> int:
    return len(chunk) - chunk.count(0)


def _unblanked(chunk: bytes) -> int:
    return len(chunk) - chunk.count(b" ")


def _read_at(fh, offset: int, length: int) -> bytes:
    fh.seek(offset)
    return fh.read(length)


def scan_faiss(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    if "path" not in options:
        raise ConfigError(f'store {store!r}: the {backend} backend needs path = "..."', store=store)
    root = Path(options["path"])
    try:
        generation = current_generation(root)
        index_file = root / f"index-{generation:06d}.faiss"
        side, lines, to_blank = read_generation(root, generation)
        index, _ = _read_index(index_file)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"store {store!r}: no readable FAISS store at {root}: {exc}", store=store) from exc
    report = ScanReport(store=store, backend=backend)
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
    if side.get("records_length") is not None and records.exists():
        # lines a generation dropped that a crash left unblanked, and a crashed commit's tail past the
        # committed length: both still hold the records' ids and texts
        with open(records, "rb") as fh:
            unblanked = sum(_unblanked(_read_at(fh, *place)) for place in lines.places(to_blank))
            fh.seek(side["records_length"])
            tail = len(fh.read())
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
        if to_blank:  # the rows of records a crash left unblanked (none after a clean commit: nothing read)
            table = np.fromfile(root / HEADS, dtype="<i8", count=_HEAD_COLUMNS * (rows + 1))
            table = table.reshape(-1, _HEAD_COLUMNS)[1:]
            pending = table[np.isin(table[:, _LABEL], np.fromiter(to_blank, np.int64, len(to_blank)))
                            & (table[:, _LINE_LEN] > 0)]
        with open(root / HEAD_IDS, "rb") as fh:
            unblanked = sum(_unblanked(_read_at(fh, at, n)) for at, n in pending[:, [_ID_AT, _ID_LEN]].tolist())
            fh.seek(size)
            tail = len(fh.read())
        tail += max(0, (root / HEADS).stat().st_size - 8 * _HEAD_COLUMNS * (rows + 1))
        report.places.append(ScanPlace(
            place=HEAD_IDS, kind="dropped records' ids not yet blanked", count=len(pending), bytes=unblanked,
            note="the next write or erasure blanks them with their lines"))
        report.places.append(ScanPlace(
            place=f"{HEADS}, {HEAD_IDS}", kind="heads past the committed length", count=1 if tail else 0,
            bytes=tail, note="written by a commit that did not finish; the next write cuts them off"))
    keep = {index_file.name, f"state-{generation:06d}.json", f"sidecar-{generation:06d}.json", RECORDS, "CURRENT"}
    if heads is not None:
        keep |= {HEADS, HEAD_IDS}
    stale = [p for p in sorted(root.iterdir()) if p.is_file() and p.name not in keep
             and (p.name.startswith(("index-", "sidecar-", "state-")) or p.name in (HEADS, HEAD_IDS))]
    report.places.append(ScanPlace(
        place=root.name, kind="files of other generations", count=len(stale),
        bytes=sum(_nonzero(p.read_bytes()) for p in stale), note=", ".join(p.name for p in stale)))
    return report
