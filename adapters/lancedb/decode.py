"""Reading every ``.lance`` file under a folder with Lance's own file reader, whatever its encodings, for ids
and vectors: what the physical probe and ``tombstone scan`` use where a byte scan cannot see (a string column
Lance compressed)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

MAX_FILE_BYTES = 4 << 30
"""A ``.lance`` file past this size is not decoded (reported as not decoded, never as clean)."""


def lance_files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*.lance") if p.is_file() and not p.is_symlink())


def _columns(table):
    """(name, kind, array) per column: ``str`` for string columns, ``vec`` for float32 fixed-size lists."""
    import pyarrow as pa

    for name, column in zip(table.column_names, table.columns):
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            yield name, "str", column
        elif pa.types.is_fixed_size_list(kind) and pa.types.is_float32(kind.value_type):
            yield name, "vec", column


def decode_ids_and_vectors(path: Path) -> tuple[dict[str, set[str]], np.ndarray | None, int]:
    """The strings of each string column (by name), and every row's vector (float32, one row each) of the first
    vector column, of one ``.lance`` file; and its row count."""
    from lance.file import LanceFileReader

    table = LanceFileReader(str(path)).read_all().to_table()
    strings: dict[str, set[str]] = {}
    vectors = None
    for name, kind, column in _columns(table):
        if kind == "str":
            strings[name] = {s for s in column.to_pylist() if s is not None}
        elif vectors is None:
            width = column.type.list_size
            flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
            vectors = np.asarray(flat, dtype=np.float32).reshape(-1, width)
    return strings, vectors, table.num_rows


def find_in_lance_files(root: Path, ids: Iterable[str], prints: Mapping[str, bytes]
                        ) -> tuple[dict[str, list[str]], list[str], int]:
    """For each id (and each fingerprint: an erased vector's first floats, as bytes), the ``.lance`` files under
    ``root`` that hold it once decoded; the files that could not be decoded; how many were."""
    ids = set(ids)
    found: dict[str, list[str]] = {}
    unreadable: list[str] = []
    decoded = 0
    for path in lance_files(root):
        rel = str(path.relative_to(root))
        if path.stat().st_size > MAX_FILE_BYTES:
            unreadable.append(f"{rel} (larger than {MAX_FILE_BYTES >> 30} GiB)")
            continue
        try:
            strings, vectors, _rows = decode_ids_and_vectors(path)
        except Exception as exc:  # a file Lance cannot read: unchecked, never clean
            unreadable.append(f"{rel} ({type(exc).__name__})")
            continue
        decoded += 1
        for aid in ids & set().union(*strings.values()):
            found.setdefault(aid, []).append(rel)
        if vectors is not None and prints:
            heads = {}
            for aid, fp in prints.items():
                n = len(fp) // 4
                if n and n <= vectors.shape[1]:
                    heads.setdefault(n, set()).add(aid)
            for n, aids in heads.items():
                present = {row.tobytes() for row in np.ascontiguousarray(vectors[:, :n])}
                for aid in aids:
                    if prints[aid] in present and rel not in found.get(aid, []):
                        found.setdefault(aid, []).append(rel)
    return found, unreadable, decoded


__all__ = ["MAX_FILE_BYTES", "decode_ids_and_vectors", "find_in_lance_files", "lance_files"]
