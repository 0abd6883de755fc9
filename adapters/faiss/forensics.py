"""``tombstone scan`` for a FAISS store (``IndexHNSWFlat`` inside ``IndexIDMap2``, see ``store``), read
with ``faiss.read_index`` and plain file reads (nothing is written, no lock file is made):

- vectors whose label no id of the store maps to any more (what ``remove_ids`` cannot do on HNSW, so an
  app forgets the mapping and the vector stays);
- vectors of labels the store excludes from search (suppressed, awaiting a reclaim);
- files of other generations than ``CURRENT`` names (left by a crash between write and clean-up);
- in the records file, lines of dropped records a crash left unblanked, and bytes past the committed length.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.errors import ConfigError
from tombstone.scan import ScanPlace, ScanReport

from .store import RECORDS, current_generation, read_generation


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
        index = faiss.read_index(str(index_file))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"store {store!r}: no readable FAISS store at {root}: {exc}", store=store) from exc
    report = ScanReport(store=store, backend=backend)
    labels = faiss.vector_to_array(index.id_map) if hasattr(index, "id_map") else np.arange(index.ntotal)
    base = faiss.downcast_index(index.index) if hasattr(index, "index") else index
    storage = faiss.downcast_index(base.storage) if hasattr(base, "storage") else base
    codes = faiss.vector_to_array(storage.codes).tobytes() if hasattr(storage, "codes") else b""
    width = storage.code_size if hasattr(storage, "code_size") else 0
    live = {int(label): ident for ident, label in side.get("labels", {}).items()}
    excluded = {int(label) for label in side.get("excluded", [])}
    orphan = [0, 0]
    hidden: list[Any] = [0, 0, []]
    for slot, label in enumerate(labels.tolist()):
        held = _nonzero(codes[slot * width:(slot + 1) * width]) if width else 0
        if label not in live:
            if held:
                orphan[0] += 1
                orphan[1] += held
        elif label in excluded and held:
            hidden[0] += 1
            hidden[1] += held
            hidden[2].append(live[label])
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
    keep = {index_file.name, f"state-{generation:06d}.json", f"sidecar-{generation:06d}.json", RECORDS, "CURRENT"}
    stale = [p for p in sorted(root.iterdir()) if p.is_file() and p.name not in keep
             and (p.name.startswith(("index-", "sidecar-", "state-")))]
    report.places.append(ScanPlace(
        place=root.name, kind="files of other generations", count=len(stale),
        bytes=sum(_nonzero(p.read_bytes()) for p in stale), note=", ".join(p.name for p in stale)))
    return report
