"""A FAISS store: ``IndexHNSWFlat`` inside ``IndexIDMap2``, persisted as an index file, a records file and a
small state file per generation.

Layout of the store directory::

    CURRENT                 {"generation": N}: replaced atomically on every commit
    index-<N>.faiss         faiss.write_index of the IndexIDMap2
    state-<N>.json          next label, excluded labels, zeroed labels (slots an in-place reclaim zeroed, hidden
                            until ``compact``), the records file's committed length, and the labels whose lines
                            this generation dropped (blanked right after the switch)
    records.jsonl           one JSON object per line: id, label, document, metadata; shared by the generations,
                            appended to past the committed length, a dropped record's line overwritten with
                            spaces where it lies
    heads.bin, heads.ids    where each line lies and whose it is, kept beside the records file so that opening
                            the store parses no line: per line, six little-endian int64 (label, the line's
                            offset and length, the CRC-32 of the id, the id's offset and length in heads.ids)
                            after a header row (a mark and the token the state names), and the ids, each
                            followed by a newline. Appended with the records file, cut back with it; a dropped
                            record's row is zeroed (all but where its id lay) and its id overwritten with
                            spaces right after its line is blanked. A state that names no heads (an older
                            store, ids with a newline) is read by parsing the records file; its next commit
                            writes them anew

A commit appends the new records' lines past the committed length, writes the index of generation N+1 (or,
when only the state changed, hard-links N's), writes state N+1 (temp file, fsync, rename), then switches
CURRENT and deletes every other generation; only then are the dropped records' lines blanked. A crash before
the switch leaves N intact (its records end at its committed length; nothing of it was blanked); after it,
N+1, whose state names the lines to blank, which the next writer blanks if the crash came first. So an
exclusion, or an in-place reclaim of one subject, writes what changed, not every record of the store.

Opening a store maps the index file's flat vectors read-only (``faiss.IO_FLAG_MMAP_IFC``; the graph and the id
map are read) and reads each live line's id and label from the heads files (or, without them, parses them from
the start of each line, where every line has them); a record's document
and metadata are read from its line when first asked for (:class:`LazyRecords`). Searches read the vectors
where the file keeps them. The first change to the index in memory (an ``add``, a zeroing that cannot go
through the file, ``FaissStore.index`` asked for by a caller) copies the vectors into memory first; the in-place reclaim
writes its zeros into the file, which the shared mapping shows at once.

A store written as ``sidecar-<N>.json`` (every record in one JSON document) is read as before, and its next
commit writes it in this layout.

The store's files are untrusted data: each is opened only as a regular file inside the store directory
(``tombstone.fsutil.open_regular``: never through a link, never a FIFO or a device, which are refused in one
line naming the file); CURRENT, the state and a ``sidecar-<N>.json`` are read whole only up to
``max_metadata_bytes`` (64 MiB unless the store's options say otherwise), and the state's fields must be of
the types written here. Every count the files hold is checked against the bytes the files really have before
anything is allocated for it: the index file is walked before faiss reads it (``indexfile``), the heads rows
and ids the state names must fit in the heads files, and the records' committed length in the records file.
The directory is created mode 0700 and every file in it 0600.

Every change (``add``, and the adapter's ``exclude``, ``drop_mapping`` and ``rebuild``) holds the store's
lock, ``<directory>.tombstone.lock`` beside the directory (``tombstone.storelock``), and starts by
loading the newest generation: writers in several processes, and an erasure, take turns, and none
commits a generation built from an older one.
"""

from __future__ import annotations

import itertools
import contextlib
import json
import math
import mmap
import os
import secrets
import zlib
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.faults import kill_point
from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture import deferred, pending
from tombstone.capture.vector import Embedder, embed, vectors_for_write
from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.fsutil import METADATA_LIMIT, make_private_dirs, open_regular, overwrite_ranges, read_regular
from tombstone.fsutil import write_atomic as _write_atomic
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

from .labels import IdLabels, id_label_pairs, label_array  # noqa: F401  (also imported from here)
from .records import (_HEAD_COLUMNS, _HEADS_MARK, _ID_AT, _ID_LEN, _LABEL, _LINE_LEN, _ZEROED_BYTES, HEAD_IDS,  # noqa: F401
                      HEADS, RECORDS, LazyRecords, LineIndex, _followed_by, _json, _parse_lines, _read_heads,
                      _record_line)
from .threads import apply as apply_threads
from .threads import parse as parse_threads

BACKEND = "faiss"
_METRICS = {"l2": faiss.METRIC_L2, "ip": faiss.METRIC_INNER_PRODUCT}
_LOAD_TRIES = 3
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


class FaissStore:
    """The persisted store. ``lineage`` + ``embedder`` make it the capturing wrapper apps write through."""

    def __init__(
        self,
        directory: str | Path,
        *,
        dim: int | None = None,
        m: int = 32,
        ef_construction: int = 40,
        ef_search: int = 64,
        metric: str = "l2",
        lineage: LineageDB | None = None,
        store: str = BACKEND,
        embedder: Embedder | None = None,
        create: bool = True,
        lock_wait: float = STORE_LOCK_WAIT,
        max_metadata_bytes: int | str | None = None,
        threads: int | str | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.threads = apply_threads(parse_threads(threads, store))
        """FAISS's OpenMP thread count in force after opening (``threads.py``: half the usable CPUs by default)."""
        try:
            # no state or sidecar larger than this is read (64 MiB by default)
            self.max_metadata_bytes = METADATA_LIMIT if max_metadata_bytes is None else int(max_metadata_bytes)
        except (TypeError, ValueError):
            self.max_metadata_bytes = 0
        if self.max_metadata_bytes <= 0:
            raise ValueError(f"max_metadata_bytes = {max_metadata_bytes!r} is not a positive number of bytes")
        self.lineage, self.store, self.embedder = lineage, store, embedder
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        """Ids suppressed in the lineage db and not yet reclaimed: hidden like excluded labels."""
        self._views: tuple[set[int], dict[int, str]] | None = None
        self._hidden_cache: tuple[Any, frozenset[str], set[int]] | None = None
        """(views, the lineage db's hidden set, the labels hidden) as ``_hidden_labels`` last made them."""
        self._current_path = os.fspath(self.dir / "CURRENT")
        self._lines = LineIndex()
        """Where the records' lines lie in the records file (those not yet blanked)."""
        self._new: list[str] = []
        """Ids added since the last commit (their lines are appended by the next one)."""
        self._dead: dict[int, str] = {}
        """Labels dropped since the last commit, plus any the committed generation still names to blank, with
        their ids (what their heads rows hold, for a commit that writes the heads anew)."""
        self._rewrite_records = False
        """Loaded from a ``sidecar-<N>.json`` store: the next commit writes every record to the records file."""
        if create:
            self.dir.parent.mkdir(parents=True, exist_ok=True)
        self.lock = StoreLock(lock_file_for(self.dir), wait=lock_wait, store=store)
        with self.lock:
            self._open(dim, m, ef_construction, ef_search, metric, create)
        # probe captures a writer that died left pending: finished from the documents the records hold
        pending.finish(lineage, store, embedder,
                       lambda ids: {aid: rec["document"] for aid, rec in self.get(ids).items()})

    def _open(self, dim, m, ef_construction, ef_search, metric, create) -> None:
        if os.path.lexists(self.dir / "CURRENT"):  # whatever is there: one that is not a file is refused
            self._load()
        elif create:
            if dim is None:
                raise ValueError("a new FAISS store needs dim=")
            if metric not in _METRICS:
                raise ValueError(f"metric must be one of {sorted(_METRICS)}")
            make_private_dirs(self.dir)
            self._index = self._new_index(dim, m, ef_construction, ef_search, _METRICS[metric])
            self._mapped = False
            self.generation = 0
            self.side: dict[str, Any] = {"next_label": 0, "labels": {}, "excluded": [], "zeroed": [],
                                         "records": {}, "records_length": 0, "heads": None}
            self._rewrite_records = True
            self.commit()
        else:
            raise StoreUnavailableError(f"no FAISS store at {self.dir}", store=self.store, retryable=False)

    # -- persistence --------------------------------------------------------------------------

    @staticmethod
    def _new_index(dim: int, m: int, ef_construction: int, ef_search: int, metric: int) -> Any:
        base = faiss.IndexHNSWFlat(dim, m, metric)
        base.hnsw.efConstruction = ef_construction
        base.hnsw.efSearch = ef_search
        return faiss.IndexIDMap2(base)

    def _load(self) -> None:
        """Read CURRENT and that generation's index, state and records; the store takes them only once all were
        read. A failed load leaves it as it was: never a new generation number over the old index and
        records, since the next commit would then write a generation without the writes it missed."""
        generation = None
        for attempt in range(_LOAD_TRIES):
            try:
                generation = current_generation(self.dir)
                index, mapped = _read_index(self._index_file(generation))
                side, lines, to_blank = read_generation(self.dir, generation, self.max_metadata_bytes)
                break
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                # a writer may have switched generations (and blanked lines) while this one was being read
                try:
                    moved = generation is not None and current_generation(self.dir) != generation
                except (OSError, ValueError, KeyError, TypeError):
                    moved = False
                if moved and attempt + 1 < _LOAD_TRIES:
                    continue
                raise StoreUnavailableError(f"cannot load FAISS store {self.dir}: {exc}", store=self.store) from exc
        self.generation, self._index, self._mapped, self.side = generation, index, mapped, side
        self._lines, self._new, self._dead = lines, [], dict(to_blank)
        self._rewrite_records = not os.path.lexists(self._state_file(generation))
        self._views = None

    def look_up(self, ids: Iterable[str]) -> None:
        """Find many ids' labels at once, for the lookups by id that follow (``IdLabels.look_up``)."""
        labels = self.side.get("labels") if isinstance(self.side, Mapping) else None
        if isinstance(labels, IdLabels):
            labels.look_up(ids)

    def refresh(self) -> None:
        """Reload if another process (or the adapter) committed a newer generation. One writer at a time.

        CURRENT is replaced by a rename on every commit, so an unchanged (inode, mtime, size) means an
        unchanged generation and costs one ``stat`` instead of reading and parsing the file."""
        try:
            st = os.stat(self._current_path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == getattr(self, "_current_stamp", None):
                return
            current = current_generation(self.dir)
        except (OSError, ValueError, KeyError) as exc:
            raise StoreUnavailableError(f"cannot read {self.dir / 'CURRENT'}: {exc}", store=self.store) from exc
        if current != self.generation:
            self._load()
        self._current_stamp = stamp

    def _index_file(self, generation: int) -> Path:
        return self.dir / f"index-{generation:06d}.faiss"

    def _state_file(self, generation: int) -> Path:
        return self.dir / f"state-{generation:06d}.json"

    @property
    def index_path(self) -> Path:
        return self._index_file(self.generation)

    @property
    def state_path(self) -> Path:
        return self._state_file(self.generation)

    @property
    def records_path(self) -> Path:
        return self.dir / RECORDS

    def _put(self, artifact_id: str, label: int, document: Any, metadata: Any) -> None:
        self.side["labels"][artifact_id] = label
        self.side["records"][artifact_id] = {"document": document, "metadata": metadata or {}}
        self._new.append(artifact_id)

    def _drop(self, artifact_id: str) -> bool:
        """Forget a record: its line is blanked by the next commit, once that commit is the current one."""
        label = self.side["labels"].pop(artifact_id, None)
        self.side["records"].pop(artifact_id, None)
        if label is None:
            return False
        self._dead[label] = artifact_id
        return True

    @property
    def hnsw(self) -> Any:
        return faiss.downcast_index(self._index.index)

    @property
    def index(self) -> Any:
        """The ``IndexIDMap2``, its vectors in memory: a caller may change it (then ``commit()``). A loaded store
        maps its vectors from the committed file read-only (a write there would crash the process); the first
        time it is asked for here they are copied into memory, once per loaded generation."""
        return self._own()

    @property
    def dim(self) -> int:
        return self._index.d

    @property
    def ntotal(self) -> int:
        return self._index.ntotal

    def _own(self) -> Any:
        """The index with its vectors in memory: copied out of the mapping if they are mapped (from memory, not
        the file, which a newer generation may have removed since)."""
        if self._mapped:
            self._index = faiss.deserialize_index(faiss.serialize_index(self._index))
            self._mapped = False
        return self._index

    def commit(self, index_changed: bool = True) -> None:
        """Persist a new generation, atomically, and drop the old ones (see the module's docstring). When only
        the state changed (``index_changed=False``: an exclusion, a dropped mapping, or zeros already written
        into the committed index file), the new generation's index is a hard link to the current one, not a
        copy of every vector; the records file is appended to (new records) and blanked (dropped ones) where
        the lines lie, never written anew (except once, for a store read from a ``sidecar-<N>.json``)."""
        previous = self.index_path
        if (self.dir / "CURRENT").exists():
            # A generation built from an older one would cut the records file back past lines a newer one
            # holds: every writer refreshes under the lock first, and this makes sure of it.
            try:
                current = current_generation(self.dir)
            except (OSError, ValueError, KeyError) as exc:
                raise StoreUnavailableError(f"cannot read {self.dir / 'CURRENT'}: {exc}", store=self.store) from exc
            if current != self.generation:
                raise StoreUnavailableError(f"FAISS store {self.dir} moved to generation {current} while this"
                                            f" process held generation {self.generation}; nothing was written",
                                            store=self.store)
        self.generation += 1
        dead = sorted(self._dead)
        try:
            length, appended = self._append_records()
            heads = self._append_heads(appended)
            if index_changed or not _link(previous, self.index_path):
                _write_atomic(self.index_path, faiss.serialize_index(self._index).tobytes())
            state = {"next_label": self.side["next_label"], "excluded": self.side["excluded"],
                     "zeroed": self.side.get("zeroed", []), "records_length": length, "dead": dead,
                     "heads": heads}
            _write_atomic(self.state_path, json.dumps(state, sort_keys=True).encode("utf-8"))
            kill_point("faiss:commit:before-switch")
            _write_atomic(self.dir / "CURRENT", json.dumps({"generation": self.generation}).encode())
        except OSError as exc:
            raise StoreUnavailableError(f"cannot write FAISS store {self.dir}: {exc.strerror or exc}",
                                        store=self.store) from exc
        self.side["records_length"], self.side["heads"] = length, heads
        self._lines.update(appended)
        self._new, self._rewrite_records = [], False
        self._views = None
        self._current_stamp = None
        keep = {self.index_path.name, self.state_path.name, RECORDS, "CURRENT"}
        if heads:
            keep |= {HEADS, HEAD_IDS}
        for path in self.dir.iterdir():
            if path.is_file() and path.name not in keep:
                path.unlink()
        self._blank(dead)

    def _append_records(self) -> tuple[int, dict[int, tuple[int, int]]]:
        """Cut the records file back to the committed length (a crashed commit's tail), append the new records'
        lines (every record's, for a store read from a ``sidecar-<N>.json``), fsync; the new length and where
        the appended lines lie."""
        committed = 0 if self._rewrite_records else int(self.side.get("records_length", 0))
        new = list(self.side["labels"]) if self._rewrite_records else [i for i in self._new if i in self.side["labels"]]
        lines = [_record_line(i, self.side["labels"][i], self.side["records"][i]["document"],
                              self.side["records"][i]["metadata"]) for i in new]
        fd = open_regular(self.records_path, self.dir, create=True, store=self.store)
        try:
            size = os.fstat(fd).st_size
            if size != committed:
                os.ftruncate(fd, committed)
            appended, offset = {}, committed
            if lines:
                os.pwrite(fd, b"".join(lines), committed)
                for i, line in zip(new, lines):
                    appended[self.side["labels"][i]] = (offset, len(line) - 1)
                    offset += len(line)
            if lines or size != committed:
                os.fsync(fd)
        finally:
            os.close(fd)
        if self._rewrite_records:
            self._lines = LineIndex()
        return offset, appended

    def _append_heads(self, appended: Mapping[int, tuple[int, int]]) -> list[int] | None:
        """Write the heads rows and ids of the lines ``_append_records`` just appended (after cutting both files
        back to the committed generation's heads), fsync; the state's ``[token, rows, id bytes]``. Where the
        committed generation has no heads (an older store, or heads that did not agree with its state), they are
        written anew under a new token, for every line the records file holds and has not blanked. None (and the
        heads files go with the switch) when an id holds a newline, which the ids file cannot hold."""
        committed = self.side.get("heads")
        if committed is None or self._rewrite_records:
            labels, offsets, lengths = self._lines.known()
            live_ids, live_labels = id_label_pairs(self.side["labels"])
            id_of = dict(zip(live_labels.tolist(), live_ids))
            id_of.update(self._dead)
            token, rows, size = secrets.randbits(62), 0, 0
        else:
            labels, offsets, lengths = (np.zeros(0, np.int64),) * 3
            id_of = {self.side["labels"][i]: i for i in self._new if i in self.side["labels"]}
            token, rows, size = (int(v) for v in committed)
        labels, offsets, lengths = _followed_by((labels, offsets, lengths), appended)
        try:
            names = [id_of[label].encode("utf-8") for label in labels.tolist()]
        except KeyError:  # a line whose id is not known here: heads cannot be written for it
            return None
        if any(b"\n" in name for name in names):
            return None
        id_lengths = np.fromiter(map(len, names), np.int64, len(names))
        id_offsets = size + np.cumsum(id_lengths + 1) - id_lengths - 1
        crcs = np.fromiter(map(zlib.crc32, names), np.int64, len(names))
        table = np.stack([labels, offsets, lengths, crcs, id_offsets, id_lengths], axis=1).astype("<i8")
        if rows == 0:
            header = np.zeros((1, _HEAD_COLUMNS), "<i8")
            header[0, :2] = (_HEADS_MARK, token)
            table = np.concatenate([header, table])
        row_bytes = 8 * _HEAD_COLUMNS
        for name, at, data in ((HEADS, row_bytes * (rows + 1 if rows else 0), table.tobytes()),
                               (HEAD_IDS, size, b"".join(n + b"\n" for n in names))):
            fd = open_regular(self.dir / name, self.dir, create=True, store=self.store)
            try:
                cut = os.fstat(fd).st_size != at
                if cut:
                    os.ftruncate(fd, at)
                if data:
                    os.pwrite(fd, data, at)
                if data or cut:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return [token, rows + len(names), size + int(id_lengths.sum()) + len(names)]

    def _blank(self, labels: list[int]) -> None:
        """Overwrite the dropped records' lines with spaces where they lie, then fsync. Called once the
        generation that dropped them is the current one; one it cannot finish stays named in that generation's
        state, and the next writer (or the next erasure) finishes it."""
        places = self._lines.places(labels)
        if places:
            try:
                fd = open_regular(self.records_path, self.dir, write=True, store=self.store)
            except (OSError, StoreUnavailableError):
                return
            try:
                overwrite_ranges(fd, places, ord(" "))
                os.fsync(fd)
            except OSError:
                return
            finally:
                os.close(fd)
        if labels and self.side.get("heads") is not None:
            kill_point("faiss:blank:lines-blanked")
            if not self._blank_heads(labels):
                return
        self._lines.forget(labels)
        for label in labels:
            self._dead.pop(label, None)

    def _blank_heads(self, labels: list[int]) -> bool:
        """Zero the heads rows of ``labels`` (all but where their id lay) and overwrite their ids with spaces,
        then fsync; after their lines were blanked, so that a crash in between leaves rows that still lead to
        those lines (blanked again, harmlessly). False when the files cannot be written."""
        _, rows, _ = (int(v) for v in self.side["heads"])
        row_bytes = 8 * _HEAD_COLUMNS
        try:
            heads = open_regular(self.dir / HEADS, self.dir, write=True, store=self.store)
            try:
                if os.fstat(heads).st_size < row_bytes * (rows + 1):
                    return False
                # mapped read-only (the rows are found in place, not copied); the writes below go through the fd
                view = mmap.mmap(heads, row_bytes * (rows + 1), prot=mmap.PROT_READ)
                table = np.frombuffer(view, dtype="<i8").reshape(rows + 1, _HEAD_COLUMNS)[1:]
                hits = np.flatnonzero(np.isin(table[:, _LABEL], np.asarray(labels, np.int64))
                                      & (table[:, _LINE_LEN] > 0))
                places = table[hits][:, [_ID_AT, _ID_LEN]].tolist()
                del table
                with contextlib.suppress(BufferError):  # an array on it still held elsewhere (a tracer's frame):
                    view.close()  # then the mapping goes with the last of them
                if not len(hits):
                    return True
                ids = open_regular(self.dir / HEAD_IDS, self.dir, write=True, store=self.store)
                try:
                    overwrite_ranges(heads, [(row_bytes * (row + 1), _ZEROED_BYTES) for row in hits.tolist()], 0)
                    overwrite_ranges(ids, places, ord(" "))
                    os.fsync(ids)
                finally:
                    os.close(ids)
                os.fsync(heads)
            finally:
                os.close(heads)
        except (OSError, ValueError, StoreUnavailableError):
            return False
        return True

    def files(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if p.is_file())

    # -- writes -------------------------------------------------------------------------------

    @deferred.after_write
    def add(self, ids: Sequence[str], documents=None, metadatas=None, embeddings=None, *, subject=None) -> None:
        """Add records. With a lineage db, ``subject`` is required and lineage is written first."""
        ids = [str(i) for i in ids]
        with self.lock:
            self.refresh()
            if any(i in self.side["labels"] for i in ids) or len(set(ids)) != len(ids):
                raise ValueError("ids must be new and distinct")
        vectors = vectors_for_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                                    documents=documents, embeddings=embeddings, subject=subject)
        with self.lock:
            self._add(ids, vectors, documents, metadatas)

    def _add(self, ids: list[str], vectors: np.ndarray, documents, metadatas) -> None:
        self.refresh()
        if any(i in self.side["labels"] for i in ids):
            raise ValueError("ids must be new and distinct")
        start = self.side["next_label"]
        labels = np.arange(start, start + len(ids), dtype=np.int64)
        self._own().add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), labels)
        docs = list(documents) if documents is not None else [None] * len(ids)
        metas = list(metadatas) if metadatas is not None else [None] * len(ids)
        for i, label, doc, meta in zip(ids, labels.tolist(), docs, metas):
            self._put(i, label, doc, meta)
        self.side["next_label"] = start + len(ids)
        # An id an erasure has suppressed and not yet finished with (written again after the reclaim
        # removed it) is written excluded: it stays hidden until the erasure is over.
        hidden = suppressed_among(self.lineage, self.store, ids)
        if hidden:
            self.side["excluded"] = sorted(self._excluded() | {self.side["labels"][i] for i in hidden})
        self.commit()

    # -- reads (every one hides excluded records) ---------------------------------------------

    def _cached(self) -> tuple[set[int], dict[int, str]]:
        """The excluded labels and label -> id (filled by ``_id_of`` when first asked for: a listing or a
        by-id read needs only the first), built once per loaded or committed generation."""
        if getattr(self, "_views", None) is None:
            self._views = (set(self.side["excluded"]) | set(self.side.get("zeroed", [])), {})
        return self._views

    def _excluded(self) -> set[int]:
        """Labels excluded by a suppression (not the zeroed slots of an in-place reclaim)."""
        return set(self.side["excluded"])

    def _hidden_labels(self) -> set[int]:
        """Labels the store excludes, plus those of ids an erasure has suppressed in the lineage db and not
        yet reclaimed (hidden from the moment the suppression is recorded, before the store is touched).
        Cached until the generation's views or the lineage db's hidden set change."""
        views = self._cached()
        hidden = self.hidden.current() if self.hidden is not None else frozenset()
        if not hidden:
            return views[0]
        cached = self._hidden_cache
        if cached is not None and cached[0] is views and cached[1] is hidden:
            return cached[2]
        labels = self.side["labels"]
        out = views[0] | {labels[i] for i in hidden if i in labels}
        self._hidden_cache = (views, hidden, out)
        return out

    def _visible_id(self, artifact_id: str, hidden: set[int] | None = None) -> bool:
        label = self.side["labels"].get(artifact_id)
        return label is not None and label not in (self._hidden_labels() if hidden is None else hidden)

    def get(self, ids: Sequence[str] | None = None, where: Mapping[str, Any] | None = None) -> dict[str, dict]:
        """Records by id and/or metadata equality, excluded ones hidden: ``{id: {"document", "metadata"}}``."""
        self.refresh()
        records = self.side["records"]
        if ids is None:
            candidates = self.ids()
        else:
            hidden = self._hidden_labels()
            candidates = [i for i in ids if self._visible_id(i, hidden)]
        if isinstance(records, LazyRecords):
            records.hold(candidates)
        out = {}
        for i in candidates:
            rec = records.get(i)
            if rec is None:  # its line was blanked by a newer generation since this one was read
                continue
            if where and any(rec["metadata"].get(k) != v for k, v in where.items()):
                continue
            out[i] = {"document": rec["document"], "metadata": rec["metadata"]}
        return out

    def ids(self) -> list[str]:
        """Every visible record's id (what ``get()`` lists), without building the records."""
        self.refresh()
        hidden = self._hidden_labels()
        labels = self.side["labels"]
        if not hidden:
            return list(labels)
        if isinstance(labels, IdLabels):
            return labels.shown(hidden)
        return [i for i, label in labels.items() if label not in hidden]

    def count(self) -> int:
        return len(self.ids())

    def _id_of(self) -> dict[int, str]:
        id_of = self._cached()[1]
        if not id_of and self.side["labels"]:
            ids, labels = id_label_pairs(self.side["labels"])
            id_of.update(zip(labels.tolist(), ids))
        return id_of

    def raw_search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The index's own search: no exclusion, labels as stored."""
        return self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def search(self, query_embeddings=None, query_texts=None, k: int = 10, where=None) -> list[list[tuple[str, float]]]:
        """Nearest records per query as (id, distance), excluded and filtered-out records never returned.

        HNSW with an ID selector can return fewer than k; the search over-fetches until it has k
        visible results or has seen every record.
        """
        self.refresh()
        if query_texts is not None:
            query_embeddings = embed(self.embedder, list(query_texts))
        queries = np.ascontiguousarray(np.asarray(query_embeddings, dtype=np.float32).reshape(-1, self._index.d))
        total = self._index.ntotal
        excluded = self._hidden_labels()
        id_of = self._id_of()
        if not total:
            return [[] for _ in queries]
        todo = list(range(len(queries)))
        results: list[list[tuple[str, float]]] = [[] for _ in queries]
        if not where:
            # The index's own search, all queries at once, hidden labels dropped from its results (label -1,
            # a short result, maps to no id). While records are hidden, each query asks for its k plus twice
            # the hidden ones expected among them (and a few more: a graph search that deep costs about what k
            # costs); only a query that drop left short of k is searched again below, past the hidden labels.
            ask = min(total, k + (math.ceil(2 * k * len(excluded) / total) + 4 if excluded else 0))
            dist, labels = self._index.search(queries, ask)
            todo = []
            for q, (drow, lrow) in enumerate(zip(dist.tolist(), labels.tolist())):
                hits = [(id_of[label], d) for d, label in zip(drow, lrow) if label in id_of and label not in excluded]
                if len(hits) < min(k, total) and any(label in excluded for label in lrow):
                    todo.append(q)
                else:
                    results[q] = hits[:k]
            if not todo:
                return results
        params = None
        if excluded:
            selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.fromiter(excluded, dtype=np.int64)))
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.hnsw.hnsw.efSearch, k))

        def visible(drow, lrow) -> list[tuple[str, float]]:
            hits = []
            for d, label in zip(drow, lrow):
                aid = id_of.get(label)
                if label < 0 or aid is None or label in excluded:
                    continue  # post-filter: never trust the selector alone
                if where:
                    rec = self.side["records"].get(aid)
                    if rec is None or any(rec["metadata"].get(key) != v for key, v in where.items()):
                        continue
                hits.append((aid, float(d)))
            return hits

        first = min(total, max(k, 1) * 2)
        # The remaining queries in one call; only one left short of k visible results is searched again, wider.
        dist, labels = self._index.search(queries[todo], first, params=params)
        for q, drow, lrow in zip(todo, dist.tolist(), labels.tolist()):
            hits = visible(drow, lrow)
            if len(hits) >= k or first >= total:
                results[q] = hits[:k]
                continue
            fetch = min(total, first * 4)
            while True:
                d1, l1 = self._index.search(queries[q][None, :], fetch, params=params)
                hits = visible(d1[0].tolist(), l1[0].tolist())
                if len(hits) >= k or fetch >= total:
                    results[q] = hits[:k]
                    break
                fetch = min(total, fetch * 4)
        return results

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        labels = [self.side["labels"][i] for i in ids]
        if not labels:
            return np.zeros((0, self._index.d), dtype=np.float32)
        return self._index.reconstruct_batch(np.asarray(labels, dtype=np.int64))

    # -- used by the adapter ------------------------------------------------------------------

    def exclude(self, ids: Sequence[str]) -> int:
        with self.lock:
            return self._exclude(ids)

    def _exclude(self, ids: Sequence[str]) -> int:
        self.refresh()
        self.look_up(ids)
        labels = {self.side["labels"][i] for i in ids if i in self.side["labels"]}
        new = labels - self._excluded()
        if new:
            self.side["excluded"] = sorted(self._excluded() | new)
            self.commit(index_changed=False)
        return len(labels)

    def drop_mapping(self, ids: Sequence[str]) -> int:
        """What an app can do when ``remove_ids`` fails on HNSW: forget the id; the vector stays."""
        with self.lock:
            return self._drop_mapping(ids)

    def _drop_mapping(self, ids: Sequence[str]) -> int:
        self.refresh()
        dropped = 0
        for i in ids:
            dropped += self._drop(i)
        if dropped:
            self.commit(index_changed=False)
        return dropped

    def zero_in_place(self, erase: Sequence[str]) -> dict[str, Any]:
        """Erase without rebuilding: zero the erased vectors in the flat storage under the HNSW graph (and where
        they lie in the committed index file), drop their ids, documents and metadata (their lines blanked once
        the new generation is current), and commit a new generation. The graph keeps the slots (their links and
        their int64 labels, which name no id: structural traces that ``compact`` removes); the labels stay
        hidden on every query path. Cost: the erased slots and lines and a small state file, no graph build."""
        with self.lock:
            return self._zero_in_place(erase)

    def _zero_in_place(self, erase: Sequence[str]) -> dict[str, Any]:
        self.refresh()
        self._blank(sorted(self._dead))  # lines the current generation dropped and a crash left unblanked
        self.look_up(erase)
        erase_set = {i for i in erase if i in self.side["labels"]}
        labels = {self.side["labels"][i] for i in erase_set}
        storage = faiss.downcast_index(self.hnsw.storage)
        if not isinstance(storage, faiss.IndexFlat):  # another storage (quantised codes): rebuild instead
            return {"mechanism": "rebuild", **self._rebuild(sorted(erase_set))}
        # Vectors whose id the app already dropped (remove_ids cannot, on HNSW) are zeroed with them: no id
        # names them, so no erasure could ever ask for them by name.
        in_index = faiss.vector_to_array(self._index.id_map)
        mapped = label_array(self.side["labels"])
        known_zero = np.fromiter(self.side.get("zeroed", []), np.int64)
        orphans = set(in_index[~np.isin(in_index, mapped) & ~np.isin(in_index, known_zero)].tolist()) - labels
        labels |= orphans
        slots: list[int] = []
        offset = None
        d = storage.d
        on_disk = False
        if labels:
            slots = np.flatnonzero(np.isin(in_index, np.fromiter(labels, np.int64))).tolist()
            # where the committed file keeps the vectors, read before the copy in memory changes
            offset = flat_codes_offset(self.index_path, self._index)
            if self._mapped and offset is not None:
                # The vectors in memory are the file's, mapped: the zeros go into the file where those vectors
                # lie, and the mapping shows them (checked below; a mapping that does not is read in and zeroed).
                kill_point("reclaim:faiss:zeroed-in-memory")
                on_disk = _zero_slots(self.index_path, offset, slots, 4 * d)
                flat = faiss.rev_swig_ptr(faiss.downcast_index(self.hnsw.storage).get_xb(), self._index.ntotal * d)
                if on_disk and slots and flat[: self._index.ntotal * d].reshape(-1, d)[slots].any():
                    on_disk = False
            if not on_disk:
                self._own()
                storage = faiss.downcast_index(self.hnsw.storage)
                flat = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * d)  # a view: writes go to the index
                if slots:
                    flat.reshape(-1, d)[slots] = 0.0
                kill_point("reclaim:faiss:zeroed-in-memory")
                # The same zeros written into the committed index file where those vectors lie: the slots are
                # excluded from every read path already, so a crash midway leaves nothing visible, and the
                # next attempt writes the same zeros again. The next generation then links this file.
                on_disk = offset is not None and _zero_slots(self.index_path, offset, slots, 4 * d)
        zeroed = len(slots)
        if on_disk:
            kill_point("reclaim:faiss:zeroed-on-disk")
        for i in erase_set:
            self._drop(i)
        self.side["zeroed"] = sorted(set(self.side.get("zeroed", [])) | labels)
        self.side["excluded"] = sorted(self._excluded() - labels)
        if labels:
            self.commit(index_changed=not on_disk)
        return {"mechanism": "in-place", "vectors_zeroed": zeroed, "ids_dropped": len(erase_set),
                "index_file": "zeroed where it lies" if on_disk else "written anew",
                "orphans_zeroed": len(orphans),
                "zeroed_slots_total": len(self.side["zeroed"]), "vectors_in_index": self._index.ntotal}

    def compact(self) -> dict[str, Any]:
        """Rebuild the graph from the live records, dropping every zeroed slot and its links."""
        with self.lock:
            self.refresh()
            slots = len(self.side.get("zeroed", []))
            out = self._rebuild([])
            return {**out, "zeroed_slots_removed": slots}

    def rebuild(self, erase: Sequence[str]) -> dict[str, Any]:
        """Rebuild the index from the survivors with the same parameters; commit atomically."""
        with self.lock:
            return self._rebuild(erase)

    def _rebuild(self, erase: Sequence[str]) -> dict[str, Any]:
        self.refresh()
        erase_set = set(erase)
        erased_labels = {label for i, label in self.side["labels"].items() if i in erase_set}
        survivors = sorted((label, i) for i, label in self.side["labels"].items() if i not in erase_set)
        old = self.hnsw
        fresh = self._new_index(self._index.d, old.hnsw.nb_neighbors(1), old.hnsw.efConstruction,
                                old.hnsw.efSearch, old.metric_type)
        if survivors:
            labels = np.array([label for label, _ in survivors], dtype=np.int64)
            vectors = np.stack([self._index.reconstruct(int(label)) for label in labels])
            fresh.add_with_ids(vectors, labels)
        before = self._index.ntotal
        kill_point("reclaim:faiss:rebuilt-in-memory")
        self._index, self._mapped = fresh, False
        for i in erase_set:
            self._drop(i)
        # Labels no id maps to any more (the app dropped the mapping) are not survivors either.
        self.side["excluded"] = sorted(self._excluded() - erased_labels & set(self.side["labels"].values()))
        self.side["zeroed"] = []  # a rebuild keeps live records only
        self.commit()
        return {"vectors_before": before, "vectors_after": fresh.ntotal, "survivors": len(survivors)}


def metadata_limit(store: str, options: Mapping[str, Any]) -> int | None:
    """The ``max_metadata_bytes`` option (a positive integer, or a string of one), or None for the default."""
    value = options.get("max_metadata_bytes")
    if value is None:
        return None
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = 0
    if limit <= 0:
        raise ConfigError(f"store {store!r}: max_metadata_bytes = {value!r} is not a positive number of bytes",
                          store=store)
    return limit
