"""A FAISS store's generations on disk: which one is current, its state file read and checked, its index file
read (mapped where it can be) and its flat vectors' place in that file, and the in-place zeroing of slots
there. The layout is described in :mod:`tombstone_adapters.faiss.store`."""

from __future__ import annotations

import itertools
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.errors import StoreUnavailableError
from tombstone.fsutil import METADATA_LIMIT, open_regular, read_regular

from .labels import IdLabels
from .records import RECORDS, LazyRecords, LineIndex, _json, _parse_lines, _read_heads


_CURRENT_LIMIT = 1 << 20
"""CURRENT holds ``{"generation": N}``: no more than 1 MiB of it is read."""


def current_generation(root: Path) -> int:
    """The generation ``root/CURRENT`` names. Raises OSError, ValueError or KeyError when it does not read,
    StoreUnavailableError when CURRENT is not a regular file inside the store."""
    generation = _json(read_regular(root / "CURRENT", root, _CURRENT_LIMIT), root / "CURRENT")["generation"]
    if not isinstance(generation, int) or isinstance(generation, bool) or not 0 <= generation < 10**9:
        raise ValueError(f"{root / 'CURRENT'} names no generation")
    return generation


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _state_problem(state: Any) -> str | None:
    """What makes a state file's content not one this module writes, or None."""
    if not isinstance(state, dict):
        return "it is not an object"
    if not _ints([state.get("next_label"), state.get("records_length")]) or state["records_length"] < 0:
        return "its next label or records length is not an integer"
    if not all(_ints(state.get(key, [])) for key in ("excluded", "zeroed", "dead")):
        return "its excluded, zeroed or dead labels are not lists of integers"
    heads = state.get("heads")
    if heads is not None and not (_ints(heads) and len(heads) == 3 and min(heads[1:]) >= 0):
        return "its heads are not [token, rows, bytes]"
    return None


def read_generation(root: Path, generation: int, limit: int = METADATA_LIMIT,
                    ) -> tuple[dict[str, Any], LineIndex, dict[int, str]]:
    """Generation ``generation``'s records and state as one dict (``labels``: id -> label, ``records``: id -> the record,
    with its ``document`` and ``metadata``, ``excluded``, ``zeroed``, ``next_label``, ``records_length``,
    ``heads``: the heads files' ``[token, rows, id bytes]`` when they were read, else None), where its records'
    lines lie, and the lines still to blank (label -> id of each record this generation dropped whose line is not
    yet spaces). Reads a ``sidecar-<N>.json`` store too (no lines, nothing to blank). Raises OSError or
    ValueError when the files do not read as a generation, StoreUnavailableError when one is not a regular
    file inside ``root`` or the state or sidecar holds more than ``limit`` bytes.

    Each live line's id and label come from the heads files where the state names them and they agree with it,
    else from the records file (:func:`_parse_lines`); documents and metadata are read when asked for
    (:class:`LazyRecords`)."""
    legacy = root / f"sidecar-{generation:06d}.json"
    state_path = root / f"state-{generation:06d}.json"
    if not os.path.lexists(state_path) and os.path.lexists(legacy):
        side = _json(read_regular(legacy, root, limit, option="max_metadata_bytes"), legacy)
        if not isinstance(side, dict) or not isinstance(side.get("labels"), dict) or not isinstance(
                side.get("records"), dict) or _state_problem({**side, "records_length": 0, "heads": None}):
            raise ValueError(f"{legacy} is not a FAISS store's sidecar")
        side.setdefault("zeroed", [])
        side["records_length"], side["heads"] = 0, None
        return side, LineIndex(), {}
    state = _json(read_regular(state_path, root, limit, option="max_metadata_bytes"), state_path)
    problem = _state_problem(state)
    if problem:
        raise ValueError(f"{state_path} is not a FAISS store's state: {problem}")
    length = int(state["records_length"])
    heads = state.get("heads")
    found = _read_heads(root, heads, length) if heads is not None else None
    if found is None:
        heads = None
        found = (*_parse_lines(root, generation, length), None)
    ids, labels_of, starts, sizes, crcs = found
    lines_at = LineIndex(labels_of, starts, sizes)
    dead = {int(label) for label in state.get("dead", [])}
    to_blank: dict[int, str] = {}
    if dead:
        keep = ~np.isin(labels_of, np.fromiter(dead, np.int64))
        to_blank = {int(labels_of[k]): ids[k] for k in np.flatnonzero(~keep).tolist()}
        ids = list(itertools.compress(ids, keep.tolist()))
        labels_of = labels_of[keep]
        crcs = crcs[keep] if crcs is not None else None
    labels: MutableMapping[str, int] = (IdLabels(ids, labels_of, crcs) if crcs is not None
                                        else dict(zip(ids, labels_of.tolist())))
    side = {"next_label": state["next_label"], "excluded": state.get("excluded", []),
            "zeroed": state.get("zeroed", []), "labels": labels,
            "records": LazyRecords(root / RECORDS, labels, lines_at), "records_length": length, "heads": heads}
    return side, lines_at, to_blank


def _read_index(path: Path) -> tuple[Any, bool]:
    """``path``'s index, its flat vectors mapped read-only where faiss can map them (True), else read in;
    the file checked first (``indexfile.read_index``: a regular file of the store, every count within its
    bytes)."""
    from .indexfile import read_index

    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)  # faiss 1.11 and later
    if flag is not None:
        try:
            return read_index(path, flags=flag), True
        except RuntimeError:
            if not path.exists():
                raise
    return read_index(path), False


def _link(source: Path, target: Path) -> bool:
    """Hard-link ``target`` to ``source`` (replacing a leftover ``target``); False where links are refused."""
    try:
        target.unlink(missing_ok=True)
        os.link(source, target)
    except OSError:
        return False
    return True


def flat_codes_offset(path: Path, index: Any) -> int | None:
    """Where the flat storage's vectors start in the index file ``path`` that ``faiss.write_index`` wrote for
    ``index`` (an ``IndexIDMap2`` over ``IndexHNSWFlat``), or None when the file does not read as expected.

    The file ends with the flat storage's vectors (ntotal x d float32) followed by the id map (a u64 count,
    then ntotal int64 labels). The offset is checked, not assumed: the count before the vectors, the id map
    byte for byte, and the first and last vectors against the index in memory."""
    storage = faiss.downcast_index(faiss.downcast_index(index.index).storage)
    n, d = index.ntotal, index.d
    if not isinstance(storage, faiss.IndexFlat) or n == 0:
        return None
    ids = faiss.vector_to_array(index.id_map).astype("<i8")
    tail, codes = 8 + 8 * n, 4 * n * d
    try:
        fd = open_regular(path, path.parent)
    except (OSError, StoreUnavailableError):
        return None
    try:
        size = os.fstat(fd).st_size
        start = size - tail - codes
        if start < 8:
            return None
        with open(fd, "rb", closefd=False) as fh:
            fh.seek(start - 8)
            count = int.from_bytes(fh.read(8), "little")
            first = fh.read(4 * d)
            fh.seek(start + codes - 4 * d)
            last = fh.read(4 * d)
            stored_ids = fh.read(tail)
    except OSError:
        return None
    finally:
        os.close(fd)
    flat = faiss.rev_swig_ptr(storage.get_xb(), n * d)
    if count not in (n * d, codes) or stored_ids != n.to_bytes(8, "little") + ids.tobytes():
        return None
    if first != np.asarray(flat[:d], dtype="<f4").tobytes() or last != np.asarray(flat[-d:], dtype="<f4").tobytes():
        return None
    return start


def _zero_slots(path: Path, offset: int, slots: list[int], width: int) -> bool:
    """Overwrite ``width`` bytes at ``offset + slot * width`` for each slot with zeros, then fsync: one write
    per run of adjacent slots (a subject's chunks, written together, lie side by side)."""
    try:
        fd = open_regular(path, path.parent, write=True)
    except (OSError, StoreUnavailableError):
        return False
    try:
        ordered = sorted(set(slots))
        most = max(1, (8 << 20) // width)  # at most 8 MiB of zeros per write
        at = 0
        while at < len(ordered):
            end = at + 1
            while end < len(ordered) and end - at < most and ordered[end] == ordered[end - 1] + 1:
                end += 1
            os.pwrite(fd, bytes(width * (end - at)), offset + ordered[at] * width)
            at = end
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
