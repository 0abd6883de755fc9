"""LanceDB, wrapped: a table of a local LanceDB database, lineage recorded on write, suppressed ids never
returned.

``TombstoneLanceTable`` wraps the app's own ``lancedb`` table: ``add`` records lineage first, then calls the
table's ``add``; ``search`` and ``get`` push the suppressed ids into LanceDB's own where-clause (a prefilter,
so a search still returns ``k`` rows). The ids an erasure has suppressed are kept, until its reclaim, in a
table of their own beside it (``<table>_tombstone_hidden``) and in the lineage db.

What LanceDB keeps of a deleted row: a ``delete`` writes a deletion file (a bitmap of row offsets) and a new
manifest, and leaves the row in its data file; ``optimize`` rewrites only fragments whose deleted share is
above its threshold (10% by default), so one subject's rows usually survive it; every older version, its
manifests, transaction files (which hold the delete's own predicate, ids included) and data files stay until
``cleanup_old_versions`` (7 days by default), and a tag keeps its version's files whatever the age.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture.vector import Embedder, embed, record_write
from tombstone.errors import StoreUnavailableError
from tombstone.lineage.db import LineageDB
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

BACKEND = "lancedb"
TESTED = {"lancedb": ("0.40.",), "pylance": ("14.",)}
"""The releases whose files and commands this backend knows (the extra pins them): where a delete, a compaction
and a cleanup leave a row is release-specific, so another release is refused."""
HIDDEN_SUFFIX = "_tombstone_hidden"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,100}$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_PAGE = 1000


def check_release(store: str) -> None:
    """Refuse, in one line, a lancedb or pylance release outside the tested range."""
    from importlib.metadata import PackageNotFoundError, version

    for package, prefixes in TESTED.items():
        try:
            found = version(package)
        except PackageNotFoundError:
            raise StoreUnavailableError(f"the {BACKEND} backend needs {package}: pip install 'tombstone-rag[lancedb]'",
                                        store=store, retryable=False) from None
        if not found.startswith(prefixes):
            raise StoreUnavailableError(f"{package} {found} is outside the tested range ({', '.join(p + 'x' for p in prefixes)}):"
                                        " where its delete, compaction and cleanup leave a row is not known to this"
                                        " release", store=store, retryable=False)


def checked_name(store: str, what: str, value: Any, pattern: re.Pattern = _NAME) -> str:
    """A table or column name, refused unless plain (it is spliced into where-clauses and paths)."""
    if not isinstance(value, str) or not pattern.match(value):
        raise StoreUnavailableError(f"store {store!r}: {what} = {value!r} is not a plain name (letters, digits,"
                                    " underscores)", store=store, retryable=False)
    return value


def quoted(ids: Sequence[str]) -> str:
    """SQL string literals for a where-clause: ``'a', 'b'`` (quotes doubled)."""
    return ", ".join("'" + str(i).replace("'", "''") + "'" for i in ids)


def hidden_ids(db: Any, table: str) -> set[str]:
    """The ids listed in the table's hidden-ids table (none when it does not exist)."""
    name = table + HIDDEN_SUFFIX
    if name not in table_names(db):
        return set()
    return {row["id"] for row in db.open_table(name).to_arrow().to_pylist()}


def table_names(db: Any) -> list[str]:
    listed = db.list_tables() if hasattr(db, "list_tables") else db.table_names()
    names = getattr(listed, "tables", listed)
    return list(names)


def hide(db: Any, table: str, ids: Sequence[str]) -> int:
    """Add ``ids`` to the hidden-ids table (created on first use); returns how many were new."""
    import pyarrow as pa

    name = table + HIDDEN_SUFFIX
    have = hidden_ids(db, table)
    new = sorted(set(map(str, ids)) - have)
    if not new:
        return 0
    data = pa.table({"id": pa.array(new, type=pa.string())})
    if name in table_names(db):
        db.open_table(name).add(data)
    else:
        db.create_table(name, data)
    return len(new)


class TombstoneLanceTable:
    """The app's LanceDB table, written with lineage and read with suppressed ids left out.

    ``id_column`` names the string column holding each row's artifact id, ``vector_column`` the vector,
    ``text_column`` the chunk's text (embedded when no vector is given). Writes hold the store's lock
    (``<table folder>.tombstone.lock``)."""

    def __init__(self, db: Any, table: str, *, lineage: LineageDB | None = None, embedder: Embedder | None = None,
                 store: str = BACKEND, id_column: str = "id", vector_column: str = "vector", text_column: str = "text",
                 lock_wait: float = STORE_LOCK_WAIT) -> None:
        self.db = db
        self.name = checked_name(store, "table", table)
        self.store = store
        self.id_column = checked_name(store, "id_column", id_column, _COLUMN)
        self.vector_column = checked_name(store, "vector_column", vector_column, _COLUMN)
        self.text_column = checked_name(store, "text_column", text_column, _COLUMN)
        self.lineage = lineage
        self.embedder = embedder
        self.hidden = HiddenIds(lineage, store) if lineage is not None else None
        if self.name not in table_names(db):
            raise StoreUnavailableError(f"no LanceDB table {self.name!r} in {db.uri}", store=store, retryable=False)
        self.table = db.open_table(self.name)
        self.lock = StoreLock(lock_file_for(table_path(db.uri, self.name)), wait=lock_wait, store=store)

    # -- writes -------------------------------------------------------------------------------

    def add(self, ids: Sequence[str], texts: Sequence[str] | None = None, *, subject: str,
            metadatas: Sequence[Mapping[str, Any]] | None = None, vectors: Any = None,
            sources: Sequence[Sequence[tuple[str, str, str]]] | None = None) -> None:
        """Add rows for ``subject``: lineage first (assume the table write will fail), then the table's own
        ``add``. ``metadatas`` are extra columns per row; ``sources`` as for the other wrappers."""
        if self.lineage is None or self.embedder is None:
            raise ValueError("this table was opened without a lineage db or an embedder: it cannot write")
        ids = [str(i) for i in ids]
        written = record_write(self.embedder, self.lineage, store=self.store, backend=BACKEND, ids=ids,
                               documents=texts, embeddings=vectors, subject=subject, sources=sources)
        rows = self._arrow(ids, texts, metadatas, np.asarray(written, dtype=np.float32))
        with self.lock:
            hidden = suppressed_among(self.lineage, self.store, ids)
            if hidden:  # written again while an erasure has it suppressed: stays hidden until the erasure ends
                hide(self.db, self.name, sorted(hidden))
            self._latest().add(rows)

    def _latest(self) -> Any:
        """The table at its latest version: a reclaim removes every older version's files, so a handle left on
        one of them (the app's, opened before the erasure) would read files that are gone."""
        self.table.checkout_latest()
        return self.table

    def _arrow(self, ids: list[str], texts, metadatas, vectors: np.ndarray) -> Any:
        """The rows as one Arrow table in the table's column order (the vectors as one fixed-size list array,
        not a Python list per row)."""
        import pyarrow as pa

        schema = self._latest().schema
        columns: dict[str, Any] = {self.id_column: pa.array(ids, type=pa.string())}
        width = schema.field(self.vector_column).type.list_size
        columns[self.vector_column] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)[: len(ids) * width],
                                                                                 type=pa.float32()), width)
        if texts is not None:
            columns[self.text_column] = pa.array(list(texts), type=pa.string())
        extra = sorted({key for m in (metadatas or []) if m for key in m} - set(columns))
        for key in extra:
            columns[key] = pa.array([(m or {}).get(key) for m in metadatas])
        return pa.table({f.name: columns[f.name].cast(f.type) if f.name in columns else pa.nulls(len(ids), f.type)
                         for f in schema})

    # -- reads (suppressed ids left out by LanceDB's own where-clause) ------------------------

    def _hidden_now(self) -> set[str]:
        now = hidden_ids(self.db, self.name)
        if self.hidden is not None:
            now |= set(self.hidden.current())
        return now

    def _where(self, where: str | None) -> str | None:
        hidden = self._hidden_now()
        if not hidden:
            return where
        clause = f"{self.id_column} NOT IN ({quoted(sorted(hidden))})"
        return clause if not where else f"({where}) AND {clause}"

    def search(self, query: Any = None, *, text: str | None = None, k: int = 4, where: str | None = None) -> list[dict]:
        """The ``k`` nearest rows to ``query`` (a vector) or ``text`` (embedded), nearest first, as dicts."""
        if text is not None:
            if self.embedder is None:
                raise ValueError("searching by text needs an embedder")
            query = embed(self.embedder, [text])[0]
        builder = self._latest().search(np.asarray(query, dtype=np.float32), vector_column_name=self.vector_column).limit(k)
        clause = self._where(where)
        if clause:
            builder = builder.where(clause, prefilter=True)
        return builder.to_list()

    def get(self, ids: Sequence[str]) -> list[dict]:
        """The rows of ``ids`` that are stored and not suppressed."""
        out = []
        for start in range(0, len(ids), _PAGE):
            part = [str(i) for i in ids[start : start + _PAGE]]
            if part:
                clause = self._where(f"{self.id_column} IN ({quoted(part)})")
                out += self._latest().search().where(clause).limit(len(part) * 2 + 10).to_list()
        return out

    def count(self) -> int:
        clause = self._where(None)
        table = self._latest()
        return table.count_rows(clause) if clause else table.count_rows()

    def delete(self, ids: Sequence[str]) -> None:
        """LanceDB's own delete (what an app calls): a deletion file; the rows stay in their data files."""
        with self.lock:
            table = self._latest()
            for start in range(0, len(ids), _PAGE):
                table.delete(f"{self.id_column} IN ({quoted(ids[start : start + _PAGE])})")


def table_path(uri: str | Path, table: str) -> Path:
    """The folder a local LanceDB table lives in."""
    return Path(uri) / f"{table}.lance"


__all__ = ["BACKEND", "HIDDEN_SUFFIX", "TESTED", "TombstoneLanceTable", "check_release", "checked_name", "hidden_ids", "hide", "quoted",
           "table_names", "table_path"]
