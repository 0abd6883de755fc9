"""``tombstone scan`` for LanceDB: rows the latest version no longer has that the table's files still hold.

Every ``.lance`` file of the table's folder (data files of every version, index files) is decoded with Lance's
own reader on a private copy; an id found there (the id column of a data file, the values of an index on it) that no row of the latest version has is a deleted row still
recoverable (a deletion file only hides it; an older version keeps it until it is cleaned up). Tags are named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tombstone.errors import ConfigError
from tombstone.fsutil import Snapshot
from tombstone.scanreport import ScanPlace, ScanReport

from .decode import MAX_FILE_BYTES, decode_ids_and_vectors, lance_files
from .store import BACKEND, checked_name, table_path


def scan_lancedb(store: str, options: Mapping[str, Any]) -> ScanReport:
    import lance

    for key in ("path", "table"):
        if key not in options:
            raise ConfigError(f'store {store!r}: the {BACKEND} backend needs {key} = "..."', store=store)
    name = checked_name(store, "table", options["table"])
    folder = table_path(options["path"], name)
    if not folder.is_dir():
        raise ConfigError(f"store {store!r}: no LanceDB table {name!r} at {folder}", store=store)
    column = options.get("id_column", "id")
    report = ScanReport(store=store, backend=BACKEND)
    with Snapshot(prefix="tombstone-lancedb-scan-") as snap:
        copy = snap.copy_tree(folder)
        ds = lance.dataset(str(copy))
        live = set(ds.to_table(columns=[column]).column(column).to_pylist())
        tags = sorted(ds.tags.list())
        versions = len(ds.versions())
        places: dict[str, ScanPlace] = {}
        for path in lance_files(copy):
            rel = str(path.relative_to(copy))
            area = rel.split("/", 1)[0]
            place = places.setdefault(area, ScanPlace(place=f"{folder.name}/{area}", kind="decoded .lance files"))
            if path.stat().st_size > MAX_FILE_BYTES:
                place.note = f"{rel}: not decoded (larger than {MAX_FILE_BYTES >> 30} GiB)"
                place.count += 1
                continue
            try:
                strings, _vectors, _rows = decode_ids_and_vectors(path)
            except Exception as exc:
                place.note = f"{rel}: not decoded ({type(exc).__name__}); counted as recoverable"
                place.count += 1
                continue
            # data files: the id column, exactly; index files: a column of the id index's values
            deleted = (strings.get(column, set()) | (strings.get("values", set()) if area == "_indices" else set())) - live
            place.ids = sorted(set(place.ids) | deleted)
            place.count = len(place.ids)
            place.bytes += path.stat().st_size if deleted else 0
    report.places = list(places.values())
    report.notes.append(f"{versions} version(s) on disk" + (f"; tags: {', '.join(tags)}" if tags else ""))
    return report


__all__ = ["scan_lancedb"]
