"""The Chroma collection wrapper apps write and read through.

Same calls as a chromadb ``Collection`` (add, upsert, update, query, get, peek, count, delete), plus a
``subject=`` on writes. Writes record lineage and probe vectors. Reads hide what an erasure has suppressed
and not yet reclaimed: the set of those ids comes from the lineage db (``tombstone.capture.hidden``), so
with nothing suppressed a read is the collection's own call (no metadata filter for the store to evaluate
over the whole collection). While something is, a query is first asked for its own number of results, and
only a query whose results held hidden ids is asked again for that many more; the hidden ids are dropped.
Results are also post-filtered on the in-store flag. Only a paginated ``get`` (limit/offset) during that
window, and a read-only wrapper without a lineage db, filter on the flag inside the store.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone import holders
from tombstone.capture.hidden import suppressed_among
from tombstone.capture.hidden import HiddenIds, keep_positions
from tombstone.capture import deferred, pending
from tombstone.capture.vector import Embedder, capture_vectors, embed
from tombstone.capture.writes import check_write
from tombstone.lineage.db import LineageDB
from tombstone.fsutil import create_private, make_private_dirs, write_atomic
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

from ._errors import mapped

BACKEND = "chroma"
REWRITE_SUFFIX = "-tombstone-rewrite"
"""A collection being rewritten by a reclaim or compact carries the store's name with this suffix."""
SUPPRESSED = "tombstone_suppressed"
"""Metadata flag set on suppressed records."""
VISIBLE: dict[str, Any] = {SUPPRESSED: {"$ne": True}}
_QUERY_INCLUDE = ["metadatas", "documents", "distances"]
_GET_INCLUDE = ["metadatas", "documents"]
_NESTED_KEYS = ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data")


def merge_where(where: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's filter AND not-suppressed (records written without the flag stay visible)."""
    if not where:
        return dict(VISIBLE)
    return {"$and": [dict(where), dict(VISIBLE)]}


def _visible(metadata: Mapping[str, Any] | None) -> bool:
    return not (metadata or {}).get(SUPPRESSED)


def _keep(values: Any, keep: list[int]) -> Any:
    if values is None:
        return None
    if isinstance(values, np.ndarray):
        return values[keep]
    return [values[i] for i in keep]


def _filter_flat(result: dict[str, Any], strip_metadata: bool) -> dict[str, Any]:
    keep = [i for i, m in enumerate(result.get("metadatas") or [None] * len(result["ids"])) if _visible(m)]
    out = dict(result)
    for key in ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data"):
        if out.get(key) is not None:
            out[key] = _keep(out[key], keep)
    if strip_metadata:
        out["metadatas"] = None
    return out


def _filter_nested(result: dict[str, Any], strip_metadata: bool) -> dict[str, Any]:
    out = dict(result)
    rows = len(result["ids"])
    for key in ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data"):
        if out.get(key) is not None:
            out[key] = list(out[key])
    for r in range(rows):
        metas = result["metadatas"][r] if result.get("metadatas") is not None else [None] * len(result["ids"][r])
        keep = [i for i, m in enumerate(metas) if _visible(m)]
        for key in ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data"):
            if out.get(key) is not None and out[key][r] is not None:
                out[key][r] = _keep(out[key][r], keep)
    if strip_metadata:
        out["metadatas"] = None
    return out


_ROW_KEYS = ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data")


def _empty(include: list[str]) -> dict[str, Any]:
    """A get result with no rows, shaped as Chroma's."""
    return {"ids": [], **{key: [] if key in include else None for key in _ROW_KEYS[1:]}, "included": include}


def _drop_flat(result: dict[str, Any], hidden: frozenset[str]) -> dict[str, Any]:
    keep = keep_positions(result["ids"], hidden)
    if len(keep) == len(result["ids"]):
        return result
    out = dict(result)
    for key in ("ids", "embeddings", "documents", "metadatas", "distances", "uris", "data"):
        if out.get(key) is not None:
            out[key] = _keep(out[key], keep)
    return out


def _drop_nested(result: dict[str, Any], hidden: frozenset[str], n_results: int) -> dict[str, Any]:
    """Per query row: the first ``n_results`` ids that are not hidden."""
    out = dict(result)
    for key in _NESTED_KEYS:
        if out.get(key) is not None:
            out[key] = list(out[key])
    for r, row in enumerate(result["ids"]):
        keep = keep_positions(row, hidden, n_results)
        for key in _NESTED_KEYS:
            if out.get(key) is not None and out[key][r] is not None:
                out[key][r] = _keep(out[key][r], keep)
    return out


def _short(row: Sequence[Any], hidden: frozenset[str], n_results: int, asked: int) -> bool:
    """Whether a query's result row, asked for ``asked`` results, holds fewer than ``n_results`` that are not
    hidden while the collection may hold more (the row came back full)."""
    if len(row) < asked:
        return False
    return sum(1 for i in row if str(i) not in hidden) < n_results


def _query_rows(query_embeddings: Any) -> list[Any] | None:
    """The query vectors one per row (a single vector is one row), or None where the query is not given
    as vectors (Chroma embeds images or uris itself)."""
    if query_embeddings is None:
        return None
    if isinstance(query_embeddings, np.ndarray):
        return list(query_embeddings.reshape(1, -1) if query_embeddings.ndim == 1 else query_embeddings)
    rows = list(query_embeddings)
    if rows and isinstance(rows[0], (int, float, np.number)):
        return [rows]
    return rows


def _replace_rows(result: dict[str, Any], rows: list[int], again: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its query rows ``rows`` replaced by the rows of ``again`` (a query of just those)."""
    out = dict(result)
    for key in _NESTED_KEYS:
        if out.get(key) is not None and again.get(key) is not None:
            out[key] = list(out[key])
            for n, r in enumerate(rows):
                out[key][r] = again[key][n]
    return out


def _edges(sources) -> list[tuple[str, str, str]]:
    """(store, id) or (store, id, relation) → (store, id, relation)."""
    return [(s[0], s[1], s[2] if len(s) > 2 else "derived") for s in sources]


def _persist_directory(collection: Any) -> str | None:
    """The local directory a collection is persisted in; None for one that is not."""
    try:
        settings = collection._client.get_settings()
    except AttributeError:
        return None
    if not settings.is_persistent or not settings.persist_directory:
        return None
    return str(settings.persist_directory)


def store_lock_of(collection: Any, store: str, wait: float = STORE_LOCK_WAIT) -> StoreLock | None:
    """The lock of the persist directory a collection lives in (``<directory>.tombstone.lock``), the one
    the adapter's reclaim holds; None for a collection that is not persisted in a local directory."""
    directory = _persist_directory(collection)
    return StoreLock(lock_file_for(directory), wait=wait, store=store) if directory else None


CHROMA_DATABASE = "chroma.sqlite3"
"""The SQLite file of a persist directory (records, documents, metadata)."""


def private_persist_directory(persist_directory: str | os.PathLike[str]) -> Path:
    """Make a persist directory that does not exist yet private before Chroma opens it: the directory (and
    any missing parent) mode 0700, its ``chroma.sqlite3`` created empty with mode 0600 (SQLite's journal
    files take its mode; Chroma fills the empty file with its schema). The segment folders and files Chroma
    writes inside keep Chroma's own modes, behind the 0700 directory. A directory already there, the
    user's, is left as it is."""
    path = Path(persist_directory)
    if not os.path.lexists(path):
        make_private_dirs(path)
        create_private(path / CHROMA_DATABASE)
    return path


def persistent_client(persist_directory: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``chromadb.PersistentClient`` on the directory, made private first if Tombstone creates it
    (:func:`private_persist_directory`)."""
    import chromadb

    return chromadb.PersistentClient(path=str(private_persist_directory(persist_directory)), **kwargs)


def fresh_client(persist_directory: str | os.PathLike[str], **kwargs: Any) -> Any:
    """A new ``PersistentClient`` on the directory, with its own Chroma instance: the process-wide one
    for that directory is dropped from chromadb's cache (whoever holds it keeps it), so the collection's
    vector index is loaded afresh from the files rather than taken from another client's memory."""
    import chromadb
    from chromadb.api.shared_system_client import SharedSystemClient
    from chromadb.config import Settings

    identifier = SharedSystemClient._get_identifier_from_settings(
        Settings(is_persistent=True, persist_directory=str(persist_directory)))
    SharedSystemClient._identifier_to_system.pop(identifier, None)
    SharedSystemClient._identifier_to_refcount.pop(identifier, None)
    return chromadb.PersistentClient(path=str(persist_directory), **kwargs)


EPOCH_SUFFIX = ".tombstone.reclaimed"


def epoch_file_for(persist_directory: str | os.PathLike[str]) -> Path:
    """Beside the persist directory (like its lock file): a token an in-place reclaim rewrites when it has
    edited the collection's files. Chroma keeps a collection's vector index in the memory of every client
    that loaded it, and a client that still holds the erased vectors there writes them back the next time
    it persists: a wrapper that finds the token changed opens its collection on a fresh client first."""
    return Path(os.path.realpath(persist_directory) + EPOCH_SUFFIX)


def read_epoch(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return None


def bump_epoch(persist_directory: str | os.PathLike[str]) -> None:
    """Write a new random token (temp file, fsync, rename)."""
    write_atomic(epoch_file_for(persist_directory), secrets.token_hex(16).encode())


class TombstoneCollection:
    """A chromadb collection, wrapped. ``lineage=None`` gives a read-only view (no capture).

    Writes hold the persist directory's lock (``tombstone.storelock``), waiting at most ``lock_wait``
    seconds while an erasure rewrites or probes the collection, and then write to the collection of that
    name as it is after the rewrite."""

    backend = BACKEND

    def __init__(self, collection: Any, *, lineage: LineageDB | None, store: str, embedder: Embedder | None = None,
                 lock_wait: float = STORE_LOCK_WAIT) -> None:
        self._collection = collection
        self.lineage = lineage
        self.store = store
        self.embedder = embedder
        self.lock = store_lock_of(collection, store, lock_wait)
        directory = _persist_directory(collection)
        self._epoch_file = epoch_file_for(directory) if directory else None
        self._epoch = read_epoch(self._epoch_file)
        if directory:
            holders.register(directory)  # an erasure sees this process follows it (the epoch token)
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        """Ids suppressed and not yet reclaimed (None: no lineage db, the in-store flag decides)."""
        self._count_for: frozenset[str] | None = None
        self._count = 1
        """The collection's size when the hidden set ``_count_for`` was first met (sizes a query's first ask)."""
        # probe captures a writer that died left pending: finished from the documents the collection holds
        pending.finish(lineage, store, embedder, self._stored_documents)

    def _stored_documents(self, ids: list[str]) -> dict[str, str | None]:
        """The documents the collection holds for these ids (those it has)."""
        found = self._call("get", ids=list(ids), include=["documents"])
        return dict(zip(found["ids"], found.get("documents") or [None] * len(found["ids"])))

    def _write(self, method: str, **kwargs: Any) -> Any:
        with self.lock if self.lock is not None else contextlib.nullcontext():
            if method in ("add", "upsert", "update"):
                kwargs["metadatas"] = self._keep_hidden(kwargs["ids"], kwargs.get("metadatas"))
            return self._call(method, **kwargs)

    def _keep_hidden(self, ids: Sequence[str], metadatas: Any) -> Any:
        """The metadata to write, with the suppression flag set on ids an erasure has suppressed and not yet
        finished with (the lineage db's durable record): writing one again never clears its suppression."""
        hidden = suppressed_among(self.lineage, self.store, [str(i) for i in ids])
        if not hidden:
            return metadatas
        metadatas = list(metadatas) if metadatas is not None else [None] * len(ids)
        return [{**(m or {}), SUPPRESSED: True} if str(i) in hidden else m for i, m in zip(ids, metadatas)]

    @property
    def name(self) -> str:
        return self._collection.name

    @property
    def collection(self) -> Any:
        """The underlying collection, re-resolved by name if a reclaim rewrote it."""
        return self._collection

    def _reopen_if_reclaimed(self) -> None:
        """After an in-place reclaim (the epoch token changed), the collection on a fresh client: the
        client this wrapper was given may still hold the erased vectors in its in-memory index."""
        epoch = read_epoch(self._epoch_file)
        if epoch == self._epoch:
            return
        from chromadb.api.models.Collection import Collection

        old = self._collection
        with mapped(self.store):
            client = fresh_client(_persist_directory(old), tenant=old.tenant, database=old.database)
            model = client._server.get_collection(name=self.name, tenant=old.tenant, database=old.database)
        self._collection = Collection(client=client._server, model=model,
                                      embedding_function=old._embedding_function, data_loader=old._data_loader)
        self._epoch = epoch

    def _call(self, method: str, **kwargs: Any) -> Any:
        import chromadb.errors

        self._reopen_if_reclaimed()
        try:
            with mapped(self.store):
                return getattr(self._collection, method)(**kwargs)
        except Exception as exc:
            if not isinstance(exc.__cause__, chromadb.errors.NotFoundError):
                raise
        # A reclaim replaced the collection with a rewritten one of the same name.
        from chromadb.api.models.Collection import Collection

        old = self._collection
        with mapped(self.store):
            model = old._client.get_collection(name=self.name, tenant=old.tenant, database=old.database)
            self._collection = Collection(client=old._client, model=model,
                                          embedding_function=old._embedding_function, data_loader=old._data_loader)
            return getattr(self._collection, method)(**kwargs)

    # -- writes -------------------------------------------------------------------------------

    def _capture(self, ids: Sequence[str], documents, embeddings, subject, *, kind: str = "vector",
                 sources: Sequence[tuple[str, str]] = ()) -> np.ndarray:
        if self.lineage is None or self.embedder is None:
            raise ValueError("this wrapper was opened read-only (no lineage db or embedder)")
        ids = [str(i) for i in ids]
        one = subject is None or isinstance(subject, str) or not isinstance(subject, (list, tuple))
        subjects = [subject] * len(ids) if one else list(subject)
        check_write(self.lineage, self.store, subjects if ids else [subject])
        if len(subjects) != len(ids):
            raise ValueError("one subject, or one per id")
        cap = capture_vectors(self.embedder, store=self.store, backend=self.backend, ids=ids,
                              documents=documents, embeddings=embeddings, kind=kind,
                              defer=deferred.mode() == "background")
        # Lineage first, all of it in one transaction: assume the store write will fail. A lineage
        # row for a record that never landed is harmless; a record without lineage can't be erased.
        with self.lineage.atomic():
            for who in dict.fromkeys(subjects):
                mine = {i for i, s in zip(ids, subjects) if s == who}
                self.lineage.record_artifacts(
                    who,
                    [r for r in cap.records if r.artifact_id in mine],
                    probes=[p for p in cap.probes if p[1] in mine],
                    pending=[p for p in cap.pending if p[1] in mine],
                    edges=[(s_store, s_id, self.store, i, relation) for i in mine
                           for s_store, s_id, relation in _edges(sources)],
                )
        cap.submit(self.lineage, self.embedder)
        return cap.vectors

    @staticmethod
    def _unflagged(metadatas) -> Any:
        """The caller's metadata, minus any attempt to set the suppression flag. Nothing is added:
        the filter is ``$ne: true``, which records without the flag pass."""
        if metadatas is None:
            return None
        return [{k: v for k, v in m.items() if k != SUPPRESSED} if m else m for m in metadatas]

    @deferred.after_write
    def add(self, ids, documents=None, metadatas=None, embeddings=None, *, subject, sources=(), kind="vector",
            **kwargs) -> None:
        """Add records for ``subject``. ``sources`` are the (store, artifact id) pairs they were derived from
        (e.g. the docstore document a chunk was cut from): erasing a source erases what was derived from it."""
        vectors = self._capture(ids, documents, embeddings, subject, kind=kind, sources=sources)
        self._write("add", ids=list(ids), embeddings=vectors, documents=documents,
                    metadatas=self._unflagged(metadatas), **kwargs)

    @deferred.after_write
    def upsert(self, ids, documents=None, metadatas=None, embeddings=None, *, subject, sources=(), kind="vector",
               **kwargs) -> None:
        vectors = self._capture(ids, documents, embeddings, subject, kind=kind, sources=sources)
        self._write("upsert", ids=list(ids), embeddings=vectors, documents=documents,
                    metadatas=self._unflagged(metadatas), **kwargs)

    @deferred.after_write
    def update(self, ids, documents=None, metadatas=None, embeddings=None, *, subject=None, **kwargs) -> None:
        """Update records; new documents are re-captured (pass ``subject``), the flag is kept."""
        if documents is not None or embeddings is not None:
            if subject is None:
                raise ValueError("updating content needs subject= so lineage follows it")
            embeddings = self._capture(ids, documents, embeddings, subject)
        self._write("update", ids=list(ids), documents=documents, metadatas=self._unflagged(metadatas),
                    embeddings=embeddings, **kwargs)

    def delete(self, ids=None, where=None, **kwargs) -> None:
        """The store's own delete (not an erasure: bytes stay behind; use ``tombstone erase``)."""
        self._write("delete", ids=ids, where=where, **kwargs)

    # -- reads (every one hides suppressed records) -------------------------------------------

    def _hidden_now(self) -> frozenset[str] | None:
        return self.hidden.current() if self.hidden is not None else None

    def _first_ask(self, n_results: int, hidden: frozenset[str] | None) -> int:
        """``n_results`` plus twice the hidden records expected among them (the hidden share of the collection
        times ``n_results``), at least one more when anything is hidden. The collection's size is counted
        once per hidden set: it only sizes the first ask, and a wrong guess costs one more query, not a
        wrong answer."""
        if not hidden:
            return n_results
        if self._count_for is not hidden:
            self._count_for, self._count = hidden, max(1, int(self._call("count")))
        share = min(1.0, len(hidden) / self._count)
        return n_results + min(len(hidden), max(1, math.ceil(2 * n_results * share)))

    def query(self, query_embeddings=None, query_texts=None, n_results: int = 10, where=None,
              where_document=None, include=None, **kwargs) -> dict[str, Any]:
        if query_texts is not None:
            if self.embedder is None:
                raise ValueError("query_texts needs an embedder")
            query_embeddings = embed(self.embedder, list(query_texts))
        include = list(include) if include is not None else list(_QUERY_INCLUDE)
        hidden = self._hidden_now()
        if hidden is None and not where:
            # No lineage db: the in-store flag is all there is. Rather than a metadata filter, which Chroma
            # evaluates for every query of the call, the flagged ids are listed once and over-fetched past;
            # the results are still filtered on the flag they carry (a record flagged meanwhile stays hidden).
            flagged = frozenset(self._call("get", where={SUPPRESSED: True}, include=[])["ids"])
            result = self._call("query", query_embeddings=query_embeddings, n_results=n_results + len(flagged),
                                where_document=where_document, include=sorted(set(include) | {"metadatas"}),
                                **kwargs)
            return _filter_nested(_drop_nested(result, flagged, n_results), "metadatas" not in include)
        if hidden is None:  # no lineage db, and the caller's filter: the flag joins it
            result = self._call("query", query_embeddings=query_embeddings, n_results=n_results,
                                where=merge_where(where), where_document=where_document,
                                include=sorted(set(include) | {"metadatas"}), **kwargs)
            return _filter_nested(result, "metadatas" not in include)
        asked = sorted(set(include) | {"metadatas"})
        rows = _query_rows(query_embeddings) if hidden else None
        ceiling = n_results + len(hidden or ())  # enough for any query: with every hidden id among them, k remain
        ask = self._first_ask(n_results, hidden) if rows is not None else ceiling
        result = self._call("query", query_embeddings=query_embeddings, n_results=ask, where=where,
                            where_document=where_document, include=asked, **kwargs)
        if hidden and rows is not None:
            # Each query is first asked for its k plus the few hidden records its results are expected to hold
            # (sized from the hidden share of the collection). Only a query left short of k visible results is
            # asked again, four times wider each time, up to the ceiling that cannot fall short: asking every
            # query for k plus all hidden ids would make Chroma turn that many more rows into Python lists.
            short = [r for r, row in enumerate(result["ids"]) if _short(row, hidden, n_results, ask)]
            while short and ask < ceiling:
                ask = min(ceiling, ask * 4)
                again = self._call("query", query_embeddings=[rows[r] for r in short], n_results=ask, where=where,
                                   where_document=where_document, include=asked, **kwargs)
                result = _replace_rows(result, short, again)
                short = [r for r, row in zip(short, again["ids"]) if _short(row, hidden, n_results, ask)]
        return _filter_nested(_drop_nested(result, hidden, n_results), "metadatas" not in include)

    def get(self, ids=None, where=None, limit=None, offset=None, where_document=None, include=None,
            **kwargs) -> dict[str, Any]:
        include = list(include) if include is not None else list(_GET_INCLUDE)
        hidden = self._hidden_now()
        paginated = ids is None and (limit is not None or offset)
        if hidden is None:  # no lineage db: the in-store flag is all there is
            result = self._call("get", ids=ids, where=merge_where(where), limit=limit, offset=offset,
                                where_document=where_document, include=sorted(set(include) | {"metadatas"}),
                                **kwargs)
            return _filter_flat(result, "metadatas" not in include)
        if hidden and paginated:
            # Pages must count visible records only: list the matching ids (no content), drop the hidden and
            # flagged ones, cut the page, then read it. Only while something is hidden.
            listing = self._call("get", where=where, where_document=where_document, include=["metadatas"], **kwargs)
            visible = [i for i, m in zip(listing["ids"], listing["metadatas"]) if i not in hidden and _visible(m)]
            start = offset or 0
            ids = visible[start: start + limit if limit is not None else None]
            if not ids:
                return _empty(include)
            page = self._call("get", ids=ids, include=sorted(set(include) | {"metadatas"}), **kwargs)
            order = {i: n for n, i in enumerate(ids)}
            keep = sorted(range(len(page["ids"])), key=lambda n: order[page["ids"][n]])
            page = {key: (_keep(value, keep) if key in _ROW_KEYS and value is not None else value)
                    for key, value in page.items()}
            return _filter_flat(page, "metadatas" not in include)
        if hidden and ids is not None:
            ids = [i for i in ([ids] if isinstance(ids, str) else ids) if str(i) not in hidden]
            if not ids:  # every id asked for is hidden
                return _empty(include)
        result = self._call("get", ids=ids, where=where, limit=limit, offset=offset, where_document=where_document,
                            include=sorted(set(include) | {"metadatas"}), **kwargs)
        return _filter_flat(_drop_flat(result, hidden) if hidden else result, "metadatas" not in include)

    def peek(self, limit: int = 10) -> dict[str, Any]:
        return self.get(limit=limit, include=["embeddings", "documents", "metadatas"])

    def count(self) -> int:
        hidden = self._hidden_now()
        if hidden is None:
            return len(self.get(include=[])["ids"])
        # the store's own count, less what it still holds that is hidden: flagged in the store, or suppressed
        # in the lineage db and not yet removed by reclaim
        invisible = set(self._call("get", where={SUPPRESSED: True}, include=[])["ids"])
        if hidden:
            invisible |= set(self._call("get", ids=sorted(hidden), include=[])["ids"])
        return self._call("count") - len(invisible)
