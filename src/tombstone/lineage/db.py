"""The lineage db: a SQLite file (stdlib sqlite3, WAL mode), or a PostgreSQL database for several workers.

It records subjects (as keyed hashes), artifacts and their fingerprints, derivation edges, probe
vectors, durable suppression records, sagas with their step journal, and the receipt chain. It
never stores content. Writes that belong together happen in one ``atomic()`` block.

The SQL is written once, in the dialect both engines share (``?`` placeholders and ``ON CONFLICT``
upserts); on PostgreSQL a thin connection wrapper turns ``?`` into psycopg's ``%s`` and the
migrations' SQLite types into PostgreSQL's (see :mod:`tombstone.lineage.postgres`). The artifact
record lives in :mod:`tombstone.lineage.records`, the locks in :mod:`tombstone.lineage.locks`.

:class:`LineageDB` is assembled from one part per kind of record, each a module of its own: probe vectors
and snapshots (:mod:`~tombstone.lineage.probes`), third-party copies and derived artifacts
(:mod:`~tombstone.lineage.derived`), suppressions (:mod:`~tombstone.lineage.suppressions`), sagas, the
journal and the receipt chain (:mod:`~tombstone.lineage.sagas`), a record manager's index records
(:mod:`~tombstone.lineage.index_records`). This module opens the db, holds its transactions and locks, and
answers for subjects, artifacts and their lineage.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.clock import Clock, iso, system_clock
from tombstone.fsutil import create_private
from tombstone.errors import LineageError, ScopeViolationError
from tombstone.keys import LineageSecret
from tombstone.lineage.guard import forbid_lineage, lineage_forbidden_by
from tombstone.lineage.locks import AdvisoryLock, FileLock
from tombstone.lineage.migrations import MIGRATIONS
from tombstone.lineage.derived import DerivedRecords
from tombstone.lineage.index_records import IndexRecords
from tombstone.lineage.postgres import PgConnection, is_dsn, pg_ddl, redact_dsn
from tombstone.lineage.probes import ProbeRecords
from tombstone.lineage.records import (
    DERIVED_KINDS,
    FINGERPRINT_DIMS,
    THIRD_PARTY_STORE,
    ArtifactRecord,
    fingerprint_bytes,
    fingerprint_of,
)
from tombstone.lineage.sagas import SagaRecords
from tombstone.lineage.sql import PROBE_READ_HOOKS, by_store, for_ids, parts
from tombstone.lineage.suppressions import SuppressionRecords
from tombstone.lineage.walstamp import WalStamp

# Still importable from here while callers move to the modules above.
__all__ = [
    "FINGERPRINT_DIMS",
    "PROBE_READ_HOOKS",
    "THIRD_PARTY_STORE",
    "ArtifactRecord",
    "LineageDB",
    "fingerprint_bytes",
    "fingerprint_of",
    "forbid_lineage",
    "is_dsn",
]


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (semicolons inside comments are fine)."""
    out, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete statement in migration: {pending.strip()[:60]}")
    return out


def _has_schema(conn: Any, *, postgres: bool) -> bool:
    """Whether a connection's database holds Tombstone's schema (its migrations table)."""
    if postgres:
        return conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()[0]
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").fetchone()
    return row is not None




class LineageDB(ProbeRecords, DerivedRecords, SuppressionRecords, SagaRecords, IndexRecords):
    """Access to one lineage db: a SQLite file, or a PostgreSQL database named by a ``postgresql://`` DSN.
    Not shared between threads; open one per process (or per job)."""

    def __init__(self, target: str | Path, secret: LineageSecret, *, clock: Clock = system_clock,
                 create: bool = False) -> None:
        """Open the lineage db at ``target``. Only ``create=True`` (``tombstone init``) makes a new one: without
        it a missing SQLite file, or a PostgreSQL database without Tombstone's schema, is a LineageError and
        nothing is created."""
        self._setup(target, secret, clock)
        if self.postgres:
            try:
                self._conn = PgConnection(str(target))
                if not create and not _has_schema(self._conn, postgres=True):
                    self._conn.close()
                    raise LineageError(f"lineage db {self.where} does not exist (the database has no Tombstone schema):"
                                       " run 'tombstone init --lineage-dsn DSN' to create it")
                # Workers starting together must not run the same migration twice.
                self._conn.execute("SELECT pg_advisory_lock(?, 0)", (AdvisoryLock.NAMESPACE,))
                try:
                    self._migrate()
                finally:
                    self._conn.execute("SELECT pg_advisory_unlock(?, 0)", (AdvisoryLock.NAMESPACE,))
            except Exception as exc:
                if isinstance(exc, LineageError):
                    raise
                import psycopg

                if isinstance(exc, psycopg.Error):
                    raise LineageError(f"cannot open lineage db {self.where}: {str(exc).strip()}") from exc
                raise
            return
        try:
            if create:
                # Created 0600 before SQLite opens it: its -wal and -shm files take the database file's mode.
                create_private(self.path)
                self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            else:
                if not self.path.is_file():
                    raise LineageError(f"lineage db {self.path} does not exist: run 'tombstone init' to create it"
                                       " (or point lineage_db in the config at the existing one)")
                # mode=rw: never creates the file, even if it vanishes after the check above
                self._conn = sqlite3.connect(self.path.absolute().as_uri() + "?mode=rw", uri=True,
                                             isolation_level=None, timeout=30)
                if not _has_schema(self._conn, postgres=False):
                    self._conn.close()
                    raise LineageError(f"{self.path} is not a lineage db (it has no Tombstone schema): run"
                                       " 'tombstone init' to create one, or point lineage_db in the config at it")
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._wal = WalStamp(self.path)
            # Purged probe rows must not linger in free pages, whatever SQLite's build default is.
            self._conn.execute("PRAGMA secure_delete=ON")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise LineageError(f"cannot open lineage db {self.path}: {exc}") from exc

    def _setup(self, target: str | Path, secret: LineageSecret, clock: Clock) -> None:
        """What every way of opening the db sets before connecting (the auditor's guard first)."""
        forbidden_by = lineage_forbidden_by()
        if forbidden_by is not None:
            raise LineageError(f"{forbidden_by} does not open the lineage db ({target})")
        self.postgres = is_dsn(target)
        self.target = target
        """The SQLite path or DSN this db was opened from (a DSN may hold a password: never shown)."""
        self.path = None if self.postgres else Path(target)
        self.where = redact_dsn(str(target)) if self.postgres else str(target)
        """Where the db is, for messages (a DSN's password is never shown)."""
        self.secret = secret
        self.clock = clock
        self.worker = ""
        """Who runs this process's steps, as journaled next to each step (set by ``tombstone worker``)."""
        self._depth = 0
        self._wal: WalStamp | None = None
        self._holding: dict[str, int] = {}
        """Named locks (``_held``) this instance holds, with the thread holding each. Taken again inside its
        block by the same thread, a lock is not waited for."""

    @staticmethod
    def exists(target: str | Path) -> bool:
        """Whether a lineage db is there: a SQLite file with Tombstone's schema, or a PostgreSQL database that
        has it. Creates nothing."""
        forbidden_by = lineage_forbidden_by()
        if forbidden_by is not None:
            raise LineageError(f"{forbidden_by} does not open the lineage db ({target})")
        if not is_dsn(target):
            path = Path(target)
            if not path.is_file():
                return False
            try:
                conn = sqlite3.connect(path.absolute().as_uri() + "?mode=rw", uri=True, timeout=30)
                try:
                    return _has_schema(conn, postgres=False)
                finally:
                    conn.close()
            except sqlite3.DatabaseError:
                return True  # a file is there that SQLite cannot read: say it exists rather than replace it
        try:
            conn = PgConnection(str(target))
        except Exception as exc:
            raise LineageError(f"cannot open lineage db {redact_dsn(str(target))}: {str(exc).strip()}") from exc
        try:
            return _has_schema(conn, postgres=True)
        finally:
            conn.close()

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
        self._conn.close()

    def commit_stamp(self) -> bytes | None:
        """What changes with every commit to this db by any process (a SQLite db's wal-index header,
        :mod:`tombstone.lineage.walstamp`), read without a transaction; None where that cannot be known (a
        PostgreSQL db, no wal-index, a commit half written, a transaction of this connection's own open)."""
        if self._wal is None or self._conn.in_transaction:
            return None
        return self._wal.read()

    def __enter__(self) -> "LineageDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- locks --------------------------------------------------------------------------------

    def _lock(self, name: str) -> FileLock | AdvisoryLock:
        if self.postgres:
            return AdvisoryLock(self._conn, name)
        return FileLock(self.path.parent / "locks" / f"{name}.lock")

    def subject_lock(self, subject_key: str) -> FileLock | AdvisoryLock:
        """The lock that keeps one saga per subject at a time, across processes (and, on PostgreSQL,
        across machines). Named by the keyed hash, never the subject."""
        return self._lock(subject_key[:32])

    @contextlib.contextmanager
    def chain_lock(self, wait: float = 60.0) -> Iterator[None]:
        """Held while a receipt is signed and appended: the chain has one head at a time."""
        with self._held("receipt-chain", "the receipt chain", wait):
            yield

    @contextlib.contextmanager
    def receipt_names_lock(self, wait: float = 60.0) -> Iterator[None]:
        """Held while a saga's receipt file name is chosen and recorded: no two sagas choose the same file."""
        with self._held("receipt-names", "the choice of receipt file names", wait):
            yield

    @contextlib.contextmanager
    def _held(self, name: str, what: str, wait: float) -> Iterator[None]:
        me = threading.get_ident()
        if self._holding.get(name) == me:  # taken again inside its own block (a batch creating its sagas)
            yield
            return
        lock = self._lock(name)
        deadline = time.monotonic() + wait
        while not lock.try_acquire():
            if time.monotonic() >= deadline:
                raise LineageError(f"{what} stayed locked by {lock.owner()} for {wait:.0f}s")
            time.sleep(0.02)
        self._holding[name] = me
        try:
            yield
        finally:
            del self._holding[name]
            lock.release()

    # -- transactions -------------------------------------------------------------------------

    @contextlib.contextmanager
    def atomic(self, *, savepoint: bool = True) -> Iterator[Any]:
        """One transaction: all of it lands, or none. Nested in another, a savepoint: its failure undoes its own
        writes and the enclosing block may go on. With ``savepoint=False`` a nested block is part of the
        enclosing transaction, with no savepoint of its own: its failure is undone by the enclosing block, which
        it must end too (it raises through it). For bulk writes inside a larger transaction: under a savepoint
        SQLite copies every page a statement changes into a journal of the savepoint first, which made a batch's
        purge of its probe vectors three times as slow as the same purge on its own."""
        if self._depth > 0 and not savepoint:
            yield self._conn
            return
        name = f"sp{self._depth}"
        if self._depth == 0:
            self._conn.execute("BEGIN IMMEDIATE")
        else:
            self._conn.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield self._conn
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._conn.execute("ROLLBACK")
            else:
                self._conn.execute(f"ROLLBACK TO {name}")
                self._conn.execute(f"RELEASE {name}")
            raise
        else:
            self._depth -= 1
            self._conn.execute("COMMIT" if self._depth == 0 else f"RELEASE {name}")

    def _migrate(self) -> None:
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        applied = {row[0] for row in self._conn.execute("SELECT version FROM schema_migrations")}
        known = {version for version, _, _ in MIGRATIONS}
        if applied - known:
            raise LineageError(
                f"lineage db {self.where} was written by a newer Tombstone (migration {max(applied)})"
            )
        for version, name, script in MIGRATIONS:
            if version in applied:
                continue
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if callable(script):
                    script(self)
                elif self.postgres:
                    self._conn.execute(pg_ddl(script))
                else:
                    for statement in _statements(script):
                        self._conn.execute(statement)
                self._conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, self._now())
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def schema_version(self) -> int:
        return self._conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]

    def _now(self) -> str:
        return iso(self.clock())

    # -- capture ------------------------------------------------------------------------------

    def subject_key(self, subject: str) -> str:
        return self.secret.subject_key(subject)

    def record_artifacts(
        self,
        subject: str,
        artifacts: Iterable[ArtifactRecord],
        *,
        probes: Iterable[tuple[str, str, str, np.ndarray]] = (),
        edges: Iterable[tuple[str, str, str, str, str]] = (),
        pending: Iterable[tuple[str, str, str, str]] = (),
    ) -> None:
        """Record artifacts owned by ``subject``, their probe vectors and derivation edges, atomically.

        ``probes`` rows are (store, artifact_id, sha256 of the probe query, vector); ``edges`` rows are
        (src_store, src_id, dst_store, dst_id, relation); ``pending`` rows are (store, artifact_id, ticket,
        writer): artifacts whose probe fragments were queued for background capture (``record_probes``
        clears them). Any other recorded artifact's capture is complete (inline, or it has no text).
        Re-recording an artifact of the same subject updates it; recording another subject's artifact id
        raises ScopeViolationError.
        """
        pending = list(pending)
        key = self.subject_key(subject)
        now = self._now()
        artifacts = list(artifacts)
        with self.atomic() as conn:
            conn.execute("INSERT INTO subjects VALUES (?, ?) ON CONFLICT DO NOTHING", (key, now))
            by_store: dict[str, list[str]] = {}
            for art in artifacts:
                by_store.setdefault(art.store, []).append(art.artifact_id)
            for store, ids in by_store.items():
                for start in range(0, len(ids), 500):
                    part = ids[start : start + 500]
                    owned = conn.execute(
                        f"SELECT artifact_id FROM artifacts WHERE store = ? AND subject_key != ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))}) LIMIT 1",
                        (store, key, *part),
                    ).fetchone()
                    if owned is not None:
                        raise ScopeViolationError(
                            f"artifact {owned[0]} in store {store} already belongs to another subject", store=store
                        )
            conn.executemany(
                "INSERT INTO artifacts (store, artifact_id, backend, kind, subject_key, fingerprint,"
                " content_hash, created_at, state, inv_norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'live', ?)"
                " ON CONFLICT (store, artifact_id) DO UPDATE SET backend = excluded.backend,"
                " kind = excluded.kind, fingerprint = excluded.fingerprint,"
                " content_hash = excluded.content_hash, state = 'live', inv_norm = excluded.inv_norm",
                [
                    (a.store, a.artifact_id, a.backend, a.kind, key,
                     fingerprint_bytes(a.fingerprint) if a.fingerprint is not None else None,
                     self.secret.content_key(a.content_hash) if a.content_hash else None, now, a.inv_norm)
                    for a in artifacts
                ],
            )
            conn.executemany(
                "INSERT INTO probes VALUES (?, ?, ?, ?) ON CONFLICT (store, artifact_id, query_sha256)"
                " DO UPDATE SET vector = excluded.vector",
                [(s, a, q, np.asarray(v, dtype="<f4").tobytes()) for s, a, q, v in probes],
            )
            conn.executemany(
                "INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(*edge, now) for edge in edges],
            )
            queued = {(store, aid) for store, aid, _, _ in pending}
            conn.executemany("DELETE FROM probe_captures WHERE store = ? AND artifact_id = ?",
                             [(a.store, a.artifact_id) for a in artifacts if (a.store, a.artifact_id) not in queued])
            conn.executemany(
                "INSERT INTO probe_captures VALUES (?, ?, ?, ?, ?) ON CONFLICT (store, artifact_id) DO UPDATE"
                " SET ticket = excluded.ticket, writer = excluded.writer, queued_at = excluded.queued_at",
                [(store, aid, ticket, writer, now) for store, aid, ticket, writer in pending])

    # -- queries ------------------------------------------------------------------------------

    @staticmethod
    def _artifact(row: Any) -> ArtifactRecord:
        fp = row["fingerprint"]
        return ArtifactRecord(
            store=row["store"],
            artifact_id=row["artifact_id"],
            backend=row["backend"],
            kind=row["kind"],
            subject_key=row["subject_key"],
            fingerprint=tuple(np.frombuffer(fp, dtype="<f4").tolist()) if fp is not None else None,
            content_hash=row["content_hash"],
            created_at=row["created_at"],
            state=row["state"],
            inv_norm=row["inv_norm"],
        )

    def has_artifacts(self, subject_key: str) -> bool:
        """Whether the db records any artifact for the subject (``artifacts_for`` is not empty)."""
        return self._conn.execute("SELECT 1 FROM artifacts WHERE subject_key = ? LIMIT 1", (subject_key,)).fetchone() \
            is not None

    def artifacts_many(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ArtifactRecord]:
        """The artifacts the db knows among (store, id) pairs, keyed by the pair: ``artifact`` for many."""
        out: dict[tuple[str, str], ArtifactRecord] = {}
        for store, ids in by_store(keys).items():
            for part in parts(ids):
                for row in self._conn.execute(
                        f"SELECT * FROM artifacts WHERE store = ? AND artifact_id IN ({','.join('?' * len(part))})",
                        (store, *part)):
                    out[(store, row["artifact_id"])] = self._artifact(row)
        return out

    def artifacts_for(self, subject_key: str) -> list[ArtifactRecord]:
        rows = self._conn.execute(
            "SELECT * FROM artifacts WHERE subject_key = ? ORDER BY store, artifact_id", (subject_key,)
        )
        return [self._artifact(row) for row in rows]

    def closure(self, subject_key: str) -> list[tuple[ArtifactRecord, str]]:
        """The subject's artifacts and everything derived from them, transitively, with why each is in scope.

        Derived artifacts are in scope whoever they were recorded for: a cache entry built from the
        subject's chunk holds the subject's data. Artifacts that merely share content are not reached.
        """
        owned = self.artifacts_for(subject_key)
        out: dict[tuple[str, str], tuple[ArtifactRecord, str]] = {(a.store, a.artifact_id): (a, "owned") for a in owned}
        frontier = list(out)
        derived: dict[tuple[str, str], list[tuple[str, str, str]]] = {}  # each source's edges, in key order
        while frontier:
            store, aid = frontier.pop()
            if (store, aid) not in derived:  # read for every source on the frontier at once
                self._edges_from([key for key in frontier if key not in derived] + [(store, aid)], derived)
            for dst_store, dst_id, relation in derived[(store, aid)]:
                if (dst_store, dst_id) in out:
                    continue
                art = self.artifact(dst_store, dst_id)
                if art is None:
                    continue  # reported as a lineage gap on the source
                out[(dst_store, dst_id)] = (art, f"{relation} from {store}/{aid}")
                frontier.append((dst_store, dst_id))
        return sorted(out.values(), key=lambda pair: (pair[0].store, pair[0].artifact_id))

    def _edges_from(self, sources: list[tuple[str, str]], into: dict[tuple[str, str], list[tuple[str, str, str]]]) -> None:
        """The outgoing edges of each of ``sources`` as (dst store, dst id, relation), ordered by destination
        (the edges' key), added to ``into``; a source with none gets an empty list."""
        for store, ids in by_store(sources).items():
            for part in parts(ids):
                for src_id, dst_store, dst_id, relation in self._conn.execute(
                        f"SELECT src_id, dst_store, dst_id, relation FROM edges WHERE src_store = ?"
                        f" AND src_id IN ({','.join('?' * len(part))}) ORDER BY src_id, dst_store, dst_id",
                        (store, *part)).fetchall():
                    into.setdefault((store, src_id), []).append((dst_store, dst_id, relation))
        for key in sources:
            into.setdefault(key, [])

    def edges_of(self, artifact: ArtifactRecord) -> dict[str, list[tuple[str, str, str]]]:
        """Incoming (``sources``) and outgoing (``derived``) edges as (store, id, relation)."""
        key = (artifact.store, artifact.artifact_id)
        sources = self._conn.execute("SELECT src_store, src_id, relation FROM edges WHERE dst_store = ? AND dst_id = ?"
                                     " ORDER BY src_store, src_id", key).fetchall()
        derived = self._conn.execute("SELECT dst_store, dst_id, relation FROM edges WHERE src_store = ? AND src_id = ?"
                                     " ORDER BY dst_store, dst_id", key).fetchall()
        return {"sources": [tuple(r) for r in sources], "derived": [tuple(r) for r in derived]}

    def lineage_gap(self, artifact: ArtifactRecord) -> str | None:
        """What is missing around an artifact: an edge to an artifact the db does not know, or a derived
        copy whose source was never recorded."""
        return self.lineage_gaps([artifact])[(artifact.store, artifact.artifact_id)]

    def lineage_gaps(self, artifacts: Iterable[ArtifactRecord]) -> dict[tuple[str, str], str | None]:
        """:meth:`lineage_gap` of each artifact, keyed by (store, id), in a few queries for many artifacts."""
        arts = list(artifacts)
        sources: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        derived: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for store, ids in by_store((a.store, a.artifact_id) for a in arts).items():
            for part in parts(ids):
                marks = ",".join("?" * len(part))
                for src_store, src_id, relation, dst_id in self._conn.execute(
                        f"SELECT src_store, src_id, relation, dst_id FROM edges WHERE dst_store = ?"
                        f" AND dst_id IN ({marks})", (store, *part)):
                    sources.setdefault((store, dst_id), []).append((src_store, src_id, relation))
                for dst_store, dst_id, relation, src_id in self._conn.execute(
                        f"SELECT dst_store, dst_id, relation, src_id FROM edges WHERE src_store = ?"
                        f" AND src_id IN ({marks})", (store, *part)):
                    derived.setdefault((store, src_id), []).append((dst_store, dst_id, relation))
        ends = {(s, a) for rows in sources.values() for s, a, _ in rows} | {
            (s, a) for rows in derived.values() for s, a, _ in rows}
        known = set()
        for store, ids in by_store(sorted(ends)).items():
            for part in parts(ids):
                known.update((store, row[0]) for row in self._conn.execute(
                    f"SELECT artifact_id FROM artifacts WHERE store = ? AND artifact_id IN ({','.join('?' * len(part))})",
                    (store, *part)))
        out: dict[tuple[str, str], str | None] = {}
        for art in arts:
            key = (art.store, art.artifact_id)
            ins = sorted(sources.get(key, []))
            gap = next((f"derived ({r}) from {s}/{a}, which the lineage db does not know"
                        for s, a, r in ins if (s, a) not in known), None)
            if gap is None:
                gap = next((f"edge ({r}) to {s}/{a}, which the lineage db does not know"
                            for s, a, r in sorted(derived.get(key, [])) if (s, a) not in known), None)
            if gap is None and art.kind in DERIVED_KINDS and not ins:
                gap = f"a {art.kind} with no recorded source"
            out[key] = gap
        return out

    def artifact(self, store: str, artifact_id: str) -> ArtifactRecord | None:
        row = self._conn.execute(
            "SELECT * FROM artifacts WHERE store = ? AND artifact_id = ?", (store, artifact_id)
        ).fetchone()
        return self._artifact(row) if row else None

    def live_sharing_content(self, artifact: ArtifactRecord) -> list[ArtifactRecord]:
        """Live artifacts of *other* subjects whose content hash equals this artifact's."""
        return self.live_sharing_content_many([artifact])[(artifact.store, artifact.artifact_id)]

    def live_sharing_content_many(self, artifacts: Iterable[ArtifactRecord]) -> dict[tuple[str, str], list[ArtifactRecord]]:
        """:meth:`live_sharing_content` of each artifact, keyed by (store, id), in a few queries for many."""
        arts = list(artifacts)
        hashes = list(dict.fromkeys(a.content_hash for a in arts if a.content_hash is not None))
        live: dict[str, list[ArtifactRecord]] = {}
        for part in parts(hashes):
            for row in self._conn.execute(
                    f"SELECT * FROM artifacts WHERE content_hash IN ({','.join('?' * len(part))}) AND state = 'live'",
                    part):
                live.setdefault(row["content_hash"], []).append(self._artifact(row))
        return {(a.store, a.artifact_id): [o for o in live.get(a.content_hash, []) if o.subject_key != a.subject_key]
                if a.content_hash is not None else [] for a in arts}

    def count_artifacts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT state, count(*) FROM artifacts GROUP BY state").fetchall())

    def set_state(self, artifacts: Iterable[ArtifactRecord], state: str) -> None:
        with self.atomic(savepoint=False) as conn:
            for_ids(conn, "UPDATE artifacts SET state = ? WHERE store = ? AND artifact_id IN ({ids})",
                     [(a.store, a.artifact_id) for a in artifacts], (state,))

    def rekey_content_hashes(self) -> None:
        """Migration 6: turn every stored unkeyed SHA-256 of content into its keyed form (inside the
        migration's transaction)."""
        rows = self._conn.execute("SELECT store, artifact_id, content_hash FROM artifacts"
                                  " WHERE content_hash IS NOT NULL").fetchall()
        self._conn.executemany("UPDATE artifacts SET content_hash = ? WHERE store = ? AND artifact_id = ?",
                               [(self.secret.content_key(h), store, aid) for store, aid, h in rows])
