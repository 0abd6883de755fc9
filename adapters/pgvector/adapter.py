"""Adapter for pgvector: tombstoned column, DELETE + VACUUM FULL + ANALYZE, relation-file scan.

The physical probe is the shared one (``tombstone.verify.physical``) over the table's relation files,
which ``physical_streams`` reads in parts through ``pg_read_binary_file`` (heap, TOAST, every index, every
1 GB segment) after a CHECKPOINT, scanning each part as it arrives (nothing is copied to disk). Because a
byte scan cannot see compressed values, ``physical_extra`` also checks the planner statistics
(``pg_stats``), which keep sample values of every column and survive VACUUM FULL until the next ANALYZE.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from tombstone.faults import kill_point
from tombstone.contract import Adapter, Capability, ExtraFinding, ProbeResult
from tombstone.errors import ConfigError, PhysicalUnsupportedError, ReclaimUnavailableError, TombstoneError
from tombstone.lineage.db import ArtifactRecord
from tombstone.storelock import STORE_LOCK_WAIT
from tombstone.verify.levels import Level
from tombstone.verify.logical import TOP_K, fit_dim, nearest_paths_many, probe_count, probe_set
from tombstone.verify.neighbourhood import Neighbours
from tombstone.verify.scanner import Stream

from .server import connect, dsn_from, hold_embedded, read_only_dsn, unhold_embedded
from .store import BACKEND, TOMBSTONED, PgVectorStore, lock_table, unlock_table
from .hooks import PgVectorHooks

READ_FUNCTION = "pg_read_binary_file(text, bigint, bigint, boolean)"
_CHUNK = 64 * 1024 * 1024


_MEMORY = re.compile(r"[1-9][0-9]{0,9}(kB|MB|GB|TB)")


EMBEDDED_WORK_MEM = "1GB"
"""The reclaim's least ``maintenance_work_mem`` on the embedded server, unless the store option says otherwise:
PostgreSQL's default (64MB) builds the HNSW graph of 100,000 dim-384 rows in about 290 s here, 1GB in about
60 s (RESULTS.md, "pgvector at scale"). It is a ceiling: the build takes what the graph needs. A table whose
graph needs more gets more (``graph_memory``)."""

GRAPH_PER_INDEX_BYTE = 1.25
"""Memory an HNSW build's graph takes per byte of the built index, with room to spare: pgvector 0.8.2 reports
the graph of dim-384 rows full of 16MB after about 7,450 rows (some 2,250 bytes a row), whose index takes 2,048
bytes a row on disk: 1.1 (RESULTS.md, "pgvector at scale", measured by ``benchmarks/pgvector_scale.py``)."""


def graph_memory(index_bytes: int, *, least_mb: int = 1024, physical_bytes: int | None = None) -> tuple[int, bool]:
    """Megabytes of ``maintenance_work_mem`` for rebuilding an HNSW index of ``index_bytes``: enough for its
    graph (``GRAPH_PER_INDEX_BYTE``), at least ``least_mb``, at most a quarter of ``physical_bytes`` (the
    machine's memory; a build that spills out of memory is far slower, one that exhausts it fails). Returns
    (megabytes, whether the graph fits in them)."""
    need = -(-int(index_bytes * GRAPH_PER_INDEX_BYTE) // 2**20)
    cap = None if not physical_bytes else max(least_mb, physical_bytes // 4 // 2**20)
    chosen = max(least_mb, need) if cap is None else min(max(least_mb, need), cap)
    return chosen, need <= chosen


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _work_mem(store: str, value: Any, *, embedded: bool = False) -> str | None:
    """The ``maintenance_work_mem`` store option, checked: a size as PostgreSQL writes one (``"2GB"``,
    ``"512MB"``), or an integer of megabytes. Unset: ``EMBEDDED_WORK_MEM`` on the embedded server (Tombstone's
    own), None (the server's setting) on a server given by ``dsn``."""
    if value is None:
        return EMBEDDED_WORK_MEM if embedded else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**7:
        return f"{value}MB"
    if isinstance(value, str) and _MEMORY.fullmatch(value.strip()):
        return value.strip()
    raise ConfigError(f"store {store!r}: maintenance_work_mem must be a size such as \"2GB\" or \"512MB\" (or a"
                      f" number of megabytes), not {value!r}")


class PgVectorAdapter(PgVectorHooks, Adapter):
    """Options: ``dsn`` (your server) or ``data_dir`` (embedded server), ``table``, optional ``schema``,
    ``id_column``, ``document_column``, ``metadata_column``, ``embedding_column``, ``distance``."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN,
                              Capability.SEMANTIC_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.SEMANTIC)

    read_only_supported = True
    READ_ONLY_CHECKPOINT = ("not run: read-only (a row changed in the last moments may not be on disk yet;"
                            " the logical probe reads through the server's memory)")

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        self.require("table")
        self._work_mem = _work_mem(store, options.get("maintenance_work_mem"),
                                   embedded=bool(options.get("data_dir") and not options.get("dsn")))
        """The reclaim session's ``maintenance_work_mem`` (store option), or None for the server's own."""
        self._copy: Any = None
        """Read-only on an embedded data directory: the server on its private copy (``embedded.PrivateCopy``)."""
        self._held = bool(options.get("data_dir") and not options.get("dsn") and not self.read_only)
        """Whether this adapter holds the embedded server (``server.hold_embedded``) until ``close``."""
        try:
            if self._held:
                hold_embedded(options["data_dir"])
            self._connect()
        except BaseException:
            self._let_go()
            raise

    def _let_go(self) -> None:
        try:
            self._close_copy()
        finally:
            if self._held:
                self._held = False
                unhold_embedded(self.options["data_dir"])

    def _dsn(self) -> str:
        if self.read_only and not self.options.get("dsn") and self.options.get("data_dir"):
            # Never a server started on the handed directory itself: a copy (or Tombstone's own running one).
            if self._copy is not None and not self._copy.alive():
                self._close_copy()
            if self._copy is None:
                self._read_only_dsn, self._copy = read_only_dsn(self.options["data_dir"])
            return self._read_only_dsn
        return dsn_from(self.options, self.store)

    def _close_copy(self) -> None:
        copy, self._copy = getattr(self, "_copy", None), None
        if copy is not None:
            copy.close()

    def _connect(self) -> None:
        self.conn = connect(self._dsn(), self.store)
        if self.read_only:
            # Every transaction of this session is read-only: the server refuses any write, and neither
            # CHECKPOINT nor ANALYZE is run (nor the ALTER TABLE that adds the tombstoned column).
            self.conn.execute("SET default_transaction_read_only = on")
        options = self.options
        columns = {role: options[f"{role}_column"] for role in ("id", "document", "metadata", "embedding")
                   if options.get(f"{role}_column")}
        self.pg = PgVectorStore(self.conn, options["table"], schema=options.get("schema"), columns=columns,
                                distance=options.get("distance", "cosine"), store=self.store, create=False)
        self.table, self.c = self.pg.table, self.pg.c

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            self._let_go()

    @classmethod
    def credential_destination(cls, store: str, options: Mapping[str, Any]) -> str | None:
        """A ``dsn`` names a server: libpq sends it a password ($PGPASSWORD, ~/.pgpass) or client
        certificate of whoever connects. An embedded server (``data_dir``) is local and needs none."""
        if not options.get("dsn"):
            return None
        try:
            from psycopg.conninfo import conninfo_to_dict

            host = conninfo_to_dict(str(options["dsn"])).get("host") or "the default PostgreSQL host"
        except Exception:  # an unparsable DSN: name none of it
            host = "the host its dsn names"
        return f"your PostgreSQL credentials ($PGPASSWORD, ~/.pgpass, client certificates) to {host}"

    @contextlib.contextmanager
    def store_lock(self) -> Iterator[None]:
        """The table's advisory lock, exclusive, on this adapter's connection (``store.lock_table``): no
        lock file, since the server may be on another machine; keyed on the table, so other tables of the
        same database are not held up. The server drops it if this process dies."""
        if self.conn.closed:  # the server ended the session (a restart, a failover): every attempt starts here
            self._connect()
        if self.read_only:  # the auditor takes no lock: it changes nothing, and must not hold up erasures
            yield
            return
        regclass = self.pg.regclass
        wait = float(self.options.get("lock_wait", STORE_LOCK_WAIT))
        try:
            lock_table(self.conn, regclass, store=self.store, wait=wait)
        except psycopg.Error as exc:
            raise self.map_vendor_error(exc) from exc
        try:
            yield
        finally:
            try:
                unlock_table(self.conn, regclass)
            except psycopg.Error:
                pass  # the connection is gone, and the lock with it

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """psycopg's errors: every error the server reports, and a lost connection."""
        return (psycopg.Error,)

    def map_vendor_error(self, exc: BaseException) -> TombstoneError:
        """As the base, but errors retrying cannot fix (a missing privilege, table or column: SQLSTATE
        class 42; a feature the server lacks) are not retryable."""
        error = super().map_vendor_error(exc)
        if isinstance(exc, (psycopg.ProgrammingError, psycopg.NotSupportedError)):
            error.retryable = False
        return error

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    @property
    def role(self) -> str:
        return self.conn.execute("SELECT current_user").fetchone()[0]

    # -- suppress / delete --------------------------------------------------------------------

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        cur = self.conn.execute(sql.SQL("UPDATE {} SET {} = true WHERE {} = ANY(%s)").format(
            self.table, self.c["tombstoned"], self.c["id"]), (self._ids(artifacts),))
        return {"mechanism": f"{TOMBSTONED} column in the WHERE clause of every wrapper query + post-filter",
                "rows_marked": cur.rowcount}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.conn.execute(sql.SQL("DELETE FROM {} WHERE {} = ANY(%s)").format(self.table, self.c["id"]),
                          (self._ids(artifacts),))

    # -- reclaim ------------------------------------------------------------------------------

    def _oid(self) -> int:
        return self.conn.execute("SELECT %s::regclass::oid", (self.table.as_string(self.conn),)).fetchone()[0]

    def _indexes(self) -> list[sql.Composable]:
        rows = self.conn.execute(
            "SELECT n.nspname, c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.indrelid = %s ORDER BY c.relname",
            (self._oid(),)).fetchall()
        return [sql.Identifier(schema, name) for schema, name in rows]

    def _may_maintain(self) -> bool:
        return self.conn.execute("SELECT has_table_privilege(%s::regclass, 'MAINTAIN')",
                                 (self.table.as_string(self.conn),)).fetchone()[0]

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        with self.conn.transaction():
            deleted = self.conn.execute(sql.SQL("DELETE FROM {} WHERE {} = ANY(%s)").format(self.table, self.c["id"]),
                                        (self._ids(artifacts),)).rowcount
            xid = int(self.conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        if not self._may_maintain():
            raise ReclaimUnavailableError(
                f"deleted {deleted} row(s), but role {self.role} may not VACUUM, REINDEX or ANALYZE"
                f" {self.pg.qualified}: ask the DBA for: GRANT MAINTAIN ON TABLE {self.pg.qualified} TO {self.role};"
                " (or ownership of the table)", store=self.store)
        steps = ["DELETE"]
        kill_point("reclaim:pgvector:after-delete")
        # VACUUM FULL copies a deleted row to the new file while any transaction that could still see it runs
        # (one that began before the DELETE committed: another session's ANALYZE, a probe, a reader), and while
        # any transaction older than the DELETE still runs on the server, in any database (it is in VACUUM's
        # own snapshot): wait, bounded, until none does.
        held = self._older_sessions(xid)
        deadline = time.monotonic() + float(self.options.get("lock_wait", STORE_LOCK_WAIT))
        pause = 0.001  # most are another worker's journal write, over in milliseconds; the table stays locked meanwhile
        while held and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            held = self._older_sessions(xid)
        if held:
            steps.append(f"{len(held)} other session(s) kept a snapshot or a transaction from before the DELETE"
                         f" ({', '.join(held)}): VACUUM FULL may keep the rows they can still see")
        # VACUUM FULL writes the table into a new file and builds every index of it from the rows it copied, the
        # HNSW graph included: no index keeps a deleted row's vector after it, and a REINDEX before it would
        # build the graph twice (the costliest statement here, growing with the table). REINDEX runs only
        # where VACUUM FULL is refused.
        vacuum_full = True
        with self._maintenance_memory(steps) as work_mem:
            try:
                self.conn.execute(sql.SQL("VACUUM FULL {}").format(self.table))
                steps.append("VACUUM FULL (the table and every index written anew)")
            except psycopg.Error as exc:
                vacuum_full = False
                self.conn.execute(sql.SQL("VACUUM {}").format(self.table))
                for index in self._indexes():
                    self.conn.execute(sql.SQL("REINDEX INDEX {}").format(index))
                steps += [f"VACUUM FULL denied ({exc.sqlstate}): VACUUM", "REINDEX INDEX (each index)"]
        kill_point("reclaim:pgvector:after-vacuum")
        # Statistics are rebuilt from the survivors: the old ones sample erased values.
        self.conn.execute(sql.SQL("ANALYZE {}").format(self.table))
        steps.append("ANALYZE")
        if self.conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(self.table)).fetchone()[0]:
            # ANALYZE samples no row of an empty table and then leaves the old statistics in place —
            # sample values of the rows just erased. Only a superuser may drop them.
            try:
                self.conn.execute("DELETE FROM pg_statistic WHERE starelid = %s", (self._oid(),))
                steps.append("empty table: old planner statistics deleted (ANALYZE keeps them)")
            except psycopg.Error as exc:
                steps.append(f"empty table: old planner statistics could not be deleted ({exc.sqlstate})")
        return {"steps": steps, "deleted": deleted, "vacuum_full": vacuum_full, "maintenance_work_mem": work_mem,
                "checkpoint": self._checkpoint(), "credit": "REINDEX + VACUUM idea: the vector-forget project"}

    def _older_sessions(self, xid8: int) -> list[str]:
        """What keeps rows deleted by transaction ``xid8`` visible to a VACUUM FULL starting now: another session
        of this database whose snapshot or transaction began before ``xid8`` committed, and any transaction
        still running with an id at or below ``xid8``, in whichever database (``pid state``, or the
        transaction's id where no session shows it). The second matters because every snapshot taken while
        such a transaction runs, VACUUM FULL's own included, counts it as running: the lineage db's writes on
        the same server hold this table's deleted rows back as surely as a reader of the table does."""
        xid = str(xid8 % 2**32)
        rows = self.conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND ("
            " (datname = current_database() AND backend_xmin IS NOT NULL AND age(backend_xmin) >= age(%s::text::xid))"
            " OR (backend_xid IS NOT NULL AND age(backend_xid) >= age(%s::text::xid)))",
            (xid, xid)).fetchall()
        held = [f"pid {pid} {state}" for pid, state in rows]
        if not held:
            # A transaction no session shows (a prepared one) is still in every snapshot: the oldest id a
            # snapshot counts as running misses none.
            oldest = int(self.conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])
            if oldest <= xid8:
                held.append(f"transaction {oldest}, which no session shows (a prepared transaction?)")
        return held

    def _largest_graph(self) -> int:
        """Bytes of the table's largest HNSW index (0 where it has none): the graph its rebuild holds."""
        row = self.conn.execute(
            "SELECT max(pg_relation_size(i.indexrelid)) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = %s AND a.amname = 'hnsw'", (self._oid(),)).fetchone()
        return int(row[0] or 0)

    @contextlib.contextmanager
    def _maintenance_memory(self, steps: list[str]) -> Iterator[str]:
        """The memory the index builds of the rewrite may use: the store option ``maintenance_work_mem`` for this
        session while they run (an HNSW graph larger than it is built far more slowly), else on the embedded
        server ``EMBEDDED_WORK_MEM`` or what the table's largest graph needs (``graph_memory``), else the
        server's. Yields the value in force, as the server shows it; a graph that will not fit in it is said in
        ``steps``."""
        graph = self._largest_graph()
        chosen = self._work_mem
        if chosen == EMBEDDED_WORK_MEM and self.options.get("maintenance_work_mem") is None:
            megabytes, _ = graph_memory(graph, physical_bytes=_physical_memory())
            chosen = f"{megabytes}MB" if megabytes > 1024 else EMBEDDED_WORK_MEM
        if chosen is not None:
            self.conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(chosen)))
        try:
            in_bytes, shown = self.conn.execute(  # the setting is in kB; current_setting as SHOW writes it
                "SELECT setting::bigint * 1024, current_setting('maintenance_work_mem') FROM pg_settings"
                " WHERE name = 'maintenance_work_mem'").fetchone()
            if graph * GRAPH_PER_INDEX_BYTE > in_bytes:
                steps.append(f"the HNSW graph (its index {graph / 2**20:.0f} MiB) may not fit in maintenance_work_mem"
                             f" ({shown}): its rebuild runs far more slowly; the store option maintenance_work_mem"
                             " raises it for the reclaim")
            yield shown
        finally:
            if chosen is not None:
                with contextlib.suppress(psycopg.Error):  # a connection lost meanwhile takes the setting with it
                    self.conn.execute("RESET maintenance_work_mem")

    def _checkpoint(self) -> str:
        try:
            self.conn.execute("CHECKPOINT")
            return "done"
        except psycopg.Error as exc:
            return f"not permitted ({exc.sqlstate})"

    # -- probes -------------------------------------------------------------------------------

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        probe_vectors = probe_vectors or {}
        dim = self.conn.execute(sql.SQL("SELECT vector_dims({}) FROM {} LIMIT 1").format(
            self.c["embedding"], self.table)).fetchone()
        dim = dim[0] if dim else None
        total = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self.table)).fetchone()[0]

        def searcher(raw: bool):
            def search(vectors: np.ndarray, k: int):
                ids, candidates = [], []
                rows = self.pg.search(query_embeddings=vectors, k=k, raw=raw)
                # Another saga (another worker) may delete rows between the search and this read: a row
                # that is gone is no longer there to be returned, so it drops out. One read for every row.
                found = self.pg.vectors_by_id(list(dict.fromkeys(r["id"] for row in rows for r in row)))
                for row in rows:
                    kept = [r["id"] for r in row if r["id"] in found]
                    ids.append(kept)
                    candidates.append(np.stack([found[i] for i in kept]) if kept else np.zeros((0, dim)))
                return ids, candidates

            return search

        results = {}
        listed = {r["id"] for r in self.pg.get()}  # the wrapper's full listing, once for the batch
        every = [a.artifact_id for a in artifacts]
        selected, got = set(), set()  # the by-id paths, asked for the batch in pages (not once per artifact)
        for start in range(0, len(every), 1000):
            part = every[start:start + 1000]
            selected |= {r["id"] for r in self.pg.get(ids=part, raw=True)}
            got |= {r["id"] for r in self.pg.get(ids=part)}
        # Every search returns rows of the table, named by their id column: an id no row holds (tombstoned or
        # not, which the raw select above reads) cannot come back from any search, so its probe vectors are
        # not searched, nor read from the lineage db (after a clean erasure, none are). FAISS, Chroma and
        # Qdrant decide the same from the ids their stores can still name.
        queries = {art.artifact_id: [(label, fit_dim(v, dim)) for label, v in
                                     probe_set(art.fingerprint, probe_vectors.get(art.artifact_id, []), dim)]
                   if dim else [] for art in artifacts if art.artifact_id in selected}
        nearest = nearest_paths_many(list(queries.items()), {"raw": searcher(True), "wrapper": searcher(False)},
                                     min(TOP_K, total))
        for art in artifacts:
            aid = art.artifact_id
            paths = {
                "raw.select(id)": aid in selected,
                "wrapper.get(ids)": aid in got,
                "wrapper.get()": aid in listed,
            }
            paths.update(nearest.get(aid, {}))
            returned = sorted(p for p, hit in paths.items() if hit)
            count = len(queries[aid]) if aid in queries else probe_count(art.fingerprint, probe_vectors, aid)
            evidence = {"paths": sorted(paths), "returned_by": returned, "probe_vectors": count}
            if aid not in queries and count:
                evidence["nearest_neighbours"] = ("not searched: every search returns rows of the table, named by"
                                                  " their id, and no row holds this id")
            results[aid] = ProbeResult(
                level=Level.LOGICAL, passed=not returned,
                measurement=f"returned by {', '.join(returned)}" if returned else None,
                evidence=evidence,
            )
        return results

    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()) -> list[Neighbours]:
        """The table's nearest rows without the tombstone filter, over-fetched by ``len(exclude)``; a row
        deleted between the search and the read of its vector drops out."""
        vectors = np.asarray(vectors, dtype=np.float32)
        out = []
        for rows in self.pg.search(query_embeddings=vectors, k=k + len(exclude), raw=True):
            rows = [r for r in rows if r["id"] not in exclude]
            found = self.pg.vectors_by_id([r["id"] for r in rows[:k]])  # the vectors of the k kept, not all
            if len(found) < min(k, len(rows)):
                found = self.pg.vectors_by_id([r["id"] for r in rows])
            rows = [r for r in rows if r["id"] in found][:k]
            out.append(Neighbours([r["id"] for r in rows], [r["distance"] for r in rows],
                                  np.asarray([found[r["id"]] for r in rows], dtype=np.float32).reshape(len(rows), -1)))
        return out

    def stored_vectors(self, ids) -> dict[str, np.ndarray]:
        return self.pg.vectors_by_id(list(ids))

    def _relations(self) -> list[tuple[str, str]]:
        """(name, data-directory-relative path) of the heap, its TOAST table and index, and every index."""
        oid = self._oid()
        rows = self.conn.execute(
            "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid = %s"
            " OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s)"
            " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN"
            "   (%s, (SELECT reltoastrelid FROM pg_class WHERE oid = %s)))"
            " ORDER BY c.relname", (oid, oid, oid, oid)).fetchall()
        return [(name, path) for name, path in rows if path]

    def _relation_streams(self) -> Iterator[Stream]:
        """Every segment of every relation file, as a stream of parts read through ``pg_read_binary_file``."""
        for name, path in self._relations():
            segment = 0
            while True:
                remote = path if segment == 0 else f"{path}.{segment}"
                first = self._read_part(remote, 0)
                if not first:
                    break
                yield Stream(f"{name} ({remote})", self._parts(remote, first))
                segment += 1

    def _parts(self, remote: str, first: bytes) -> Iterator[bytes]:
        part, offset = first, 0
        while part:
            yield part
            offset += len(part)
            if len(part) < _CHUNK:
                return
            part = self._read_part(remote, offset)

    def _read_part(self, remote: str, offset: int) -> bytes:
        """Up to ``_CHUNK`` bytes of a relation file from ``offset`` (empty past its end, or for no such file)."""
        try:
            # in binary: the text form of a bytea is hex, twice the bytes to send and decode
            data = self.conn.execute("SELECT pg_read_binary_file(%s, %s, %s, true)", (remote, offset, _CHUNK),
                                     binary=True).fetchone()[0]
        except psycopg.Error as exc:
            if "permission denied" in str(exc):
                raise PhysicalUnsupportedError(f"managed: pgvector: {exc}".strip(), store=self.store) from exc
            raise
        return bytes(data) if data else b""

    def _stats_values(self) -> dict[str, list[str]]:
        """Column → sample values the planner keeps (most common values and histogram bounds)."""
        rows = self.conn.execute(
            "SELECT attname, v FROM pg_stats, LATERAL unnest(coalesce(most_common_vals::text::text[], '{}')"
            " || coalesce(histogram_bounds::text::text[], '{}')) AS v"
            " WHERE schemaname = coalesce(%s, current_schema()) AND tablename = %s",
            (self.pg.schema, self.pg.table_name)).fetchall()
        out: dict[str, list[str]] = {}
        for column, value in rows:
            out.setdefault(column, []).append(value)
        return out

    def physical_streams(self) -> contextlib.AbstractContextManager[Iterator[Stream]]:
        """The table's relation files (heap, TOAST, every index, every 1 GB segment), read in parts through
        ``pg_read_binary_file`` after a CHECKPOINT and scanned as the parts arrive: nothing is copied to disk,
        and no more than a few parts are held at once, whatever the table's size."""
        return self._streams()

    @contextlib.contextmanager
    def _streams(self) -> Iterator[Iterator[Stream]]:
        role = self.role
        may_read = self.conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (READ_FUNCTION,)).fetchone()[0]
        if not may_read:
            raise PhysicalUnsupportedError(
                f"managed: role {role} cannot read relation files, so no physical check is possible;"
                f" ask the DBA for: GRANT EXECUTE ON FUNCTION {READ_FUNCTION} TO {role};", store=self.store)
        if not self.read_only and self._checkpoint() != "done":
            # Without a checkpoint the files can lag the server's memory: rows written or deleted a
            # moment ago may not be on disk yet, so absence in the files would prove nothing. (Read-only,
            # the auditor runs none: bytes found are there; a row re-written since is the logical probe's.)
            raise PhysicalUnsupportedError(
                f"managed: role {role} may not run CHECKPOINT, so relation files can lag the server's memory"
                f" and their bytes prove nothing; ask the DBA for: GRANT pg_checkpoint TO {role};", store=self.store)
        yield self._relation_streams()

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]):
        """Dead tuples and planner statistics of ids no live row has, read-only (``forensics``)."""
        from .forensics import scan_pgvector

        return scan_pgvector(cls, store, options)

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """The planner statistics (``pg_stats``): sample values survive VACUUM FULL until the next ANALYZE,
        and a byte scan cannot see values PostgreSQL compressed."""
        stats = self._stats_values()
        document_values = stats.get(self.pg.cols["document"], [])
        # The lineage db keeps only keyed content hashes: without the key (an independent verifier) the
        # statistics are searched for ids alone.
        keyed = self.content_key
        doc_hashes = {keyed(hashlib.sha256(v.encode("utf-8")).hexdigest()) for v in document_values} if keyed else set()
        dead = self._dead_tuples()
        out = {}
        for art in artifacts:
            stats_id = sorted(col for col, values in stats.items() if any(art.artifact_id in v for v in values))
            stats_content = art.content_hash is not None and art.content_hash in doc_hashes
            found = []
            if stats_id:
                found.append(f"id in planner statistics of column(s) {', '.join(stats_id)}")
            if stats_content:
                found.append("content in planner statistics")
            out[art.artifact_id] = ExtraFinding(
                found=found, id_found=bool(stats_id), content_found=stats_content,
                evidence={"checkpoint": self.READ_ONLY_CHECKPOINT if self.read_only else "done", "statistics_hits": stats_id + (["content"] if stats_content else []),
                          "dead_tuples": dead, "out_of_scope": "WAL, base backups and replicas are not read"})
        return out

    def _dead_tuples(self) -> Any:
        """pgstattuple's dead-tuple count when the extension is installed (evidence, not the decision)."""
        installed = self.conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple'").fetchone()
        if not installed:
            return "pgstattuple not installed"
        try:
            return self.conn.execute("SELECT dead_tuple_count FROM pgstattuple(%s::regclass)",
                                     (self.table.as_string(self.conn),)).fetchone()[0]
        except psycopg.Error as exc:
            return f"pgstattuple failed ({exc.sqlstate})"
