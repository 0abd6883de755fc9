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

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture import deferred, pending
from tombstone.capture.vector import Embedder, embed, vectors_for_write
from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.fsutil import METADATA_LIMIT, make_private_dirs
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

from .commits import FaissCommits
from .erasing import FaissErasing
from .generations import _read_index, current_generation, read_generation
from .labels import IdLabels, id_label_pairs, label_array  # noqa: F401  (also imported from here)
from .records import (_HEAD_COLUMNS, _HEADS_MARK, _ID_AT, _ID_LEN, _LABEL, _LINE_LEN, _ZEROED_BYTES, HEAD_IDS,  # noqa: F401
                      HEADS, RECORDS, LazyRecords, LineIndex, _followed_by, _json, _parse_lines, _read_heads,
                      _record_line)
from .threads import apply as apply_threads
from .threads import parse as parse_threads

BACKEND = "faiss"
_METRICS = {"l2": faiss.METRIC_L2, "ip": faiss.METRIC_INNER_PRODUCT}
_LOAD_TRIES = 3



class FaissStore(FaissCommits, FaissErasing):
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
