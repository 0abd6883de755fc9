"""The lineage db: a SQLite file (stdlib sqlite3, WAL mode), or a PostgreSQL database for several workers.

It records subjects (as keyed hashes), artifacts and their fingerprints, derivation edges, probe
vectors, durable suppression records, sagas with their step journal, and the receipt chain. It
never stores content. Writes that belong together happen in one ``atomic()`` block.

The SQL is written once, in the dialect both engines share (``?`` placeholders and ``ON CONFLICT``
upserts); on PostgreSQL a thin connection wrapper turns ``?`` into psycopg's ``%s`` and the
migrations' SQLite types into PostgreSQL's (see :mod:`tombstone.lineage.postgres`). The artifact
record lives in :mod:`tombstone.lineage.records`, the locks in :mod:`tombstone.lineage.locks`.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tombstone.clock import Clock, iso, system_clock
from tombstone.fsutil import create_private
from tombstone.errors import LineageError, ScopeViolationError
from tombstone.keys import LineageSecret
from tombstone.lineage.guard import forbid_lineage, lineage_forbidden_by
from tombstone.lineage.locks import AdvisoryLock, FileLock
from tombstone.lineage.migrations import MIGRATIONS
from tombstone.lineage.postgres import PgConnection, is_dsn, pg_ddl, redact_dsn
from tombstone.lineage.records import (
    DERIVED_KINDS,
    EXTERNAL_BACKEND,
    FINGERPRINT_DIMS,
    THIRD_PARTY_STORE,
    ArtifactRecord,
    fingerprint_bytes,
    fingerprint_of,
)

# Still importable from here while callers move to the modules above.
__all__ = [
    "FINGERPRINT_DIMS",
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


PROBE_READ_HOOKS: list[Callable[[], object]] = []
"""Called before probe vectors are read: ``tombstone.capture.deferred`` registers the wait for this process's
queued probe vectors here (the lineage db knows nothing of capture)."""


def _by_store(keys: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(store, id) pairs as each store's distinct ids."""
    out: dict[str, list[str]] = {}
    for store, artifact_id in keys:
        out.setdefault(store, []).append(artifact_id)
    return {store: list(dict.fromkeys(ids)) for store, ids in out.items()}


def _json_text(obj: Any) -> str:
    """JSON text of a journal detail or snapshot record, keys sorted (orjson: a batch journals thousands of
    artifacts' results per step; the standard encoder where orjson refuses a value, such as an integer past
    64 bits). A NaN is written as null: a receipt refuses NaN anyway."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    except TypeError:
        return json.dumps(obj, sort_keys=True)


def _parts(values: list, size: int = 500) -> Iterator[list]:
    """``values`` in slices of at most ``size``: the parameters of one ``IN (...)`` each."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _for_ids(conn: Any, sql: str, keys: Iterable[tuple[str, str]], head: tuple[Any, ...] = ()) -> None:
    """Run ``sql`` once per store and slice of its ids, rather than once per (store, id) pair: its parameters
    are ``head``, the store, then the slice's ids, which ``{ids}`` in ``sql`` stands for (``?, ?, ...``)."""
    for store, ids in _by_store(keys).items():
        for part in _parts(ids):
            conn.execute(sql.format(ids=",".join("?" * len(part))), (*head, store, *part))


def _before_probe_reads() -> None:
    for hook in PROBE_READ_HOOKS:
        hook()


class LineageDB:
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
        self._conn.close()

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
    def atomic(self) -> Iterator[Any]:
        """One transaction (nested calls become savepoints): all of it lands, or none."""
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
        for store, ids in _by_store(keys).items():
            for part in _parts(ids):
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
        for store, ids in _by_store(sources).items():
            for part in _parts(ids):
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
        for store, ids in _by_store((a.store, a.artifact_id) for a in arts).items():
            for part in _parts(ids):
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
        for store, ids in _by_store(sorted(ends)).items():
            for part in _parts(ids):
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

    def record_third_party(self, subject: str, src_store: str, src_id: str, recipient: str, *,
                           sent_at: str | None = None, note: str = "") -> ArtifactRecord:
        """Record that a copy of an artifact left for a third party. It can only ever be NEEDS_HUMAN."""
        artifact = ArtifactRecord(store=THIRD_PARTY_STORE, artifact_id=f"{recipient}:{src_store}/{src_id}",
                                  backend=EXTERNAL_BACKEND, kind="external_copy")
        with self.atomic() as conn:
            self.record_artifacts(subject, [artifact], edges=[(src_store, src_id, artifact.store, artifact.artifact_id,
                                                               "sent_to_third_party")])
            conn.execute("INSERT INTO third_parties VALUES (?, ?, ?, ?) ON CONFLICT (artifact_id) DO UPDATE SET"
                         " recipient = excluded.recipient, sent_at = excluded.sent_at, note = excluded.note",
                         (artifact.artifact_id, recipient, sent_at or self._now(), note))
        return artifact

    def record_third_parties(self, sources: Iterable[tuple[str, str]], recipient: str, *, sent_at: str | None = None,
                             note: str = "", kind: str = "external_copy",
                             relation: str = "sent_to_third_party") -> list[ArtifactRecord]:
        """Record, in one transaction, that copies of many artifacts left for one third party (a model
        trained on them, an export): as :meth:`record_third_party`, each copy recorded for the subject that
        owns its source. Sources the lineage db does not know are skipped. Each copy can only ever be
        NEEDS_HUMAN."""
        by_store: dict[str, list[str]] = {}
        for store, aid in sources:
            by_store.setdefault(store, []).append(aid)
        now = self._now()
        sent_at = sent_at or now
        copies: list[ArtifactRecord] = []
        with self.atomic() as conn:
            for store, ids in by_store.items():
                ids = list(dict.fromkeys(ids))
                for start in range(0, len(ids), 500):
                    part = ids[start : start + 500]
                    rows = conn.execute(
                        f"SELECT artifact_id, subject_key FROM artifacts WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)).fetchall()
                    owners = {row[0]: row[1] for row in rows}
                    batch = [(aid, ArtifactRecord(store=THIRD_PARTY_STORE, artifact_id=f"{recipient}:{store}/{aid}",
                                                  backend=EXTERNAL_BACKEND, kind=kind, subject_key=owners[aid]))
                             for aid in part if aid in owners]
                    conn.executemany(
                        "INSERT INTO artifacts (store, artifact_id, backend, kind, subject_key, fingerprint,"
                        " content_hash, created_at, state, inv_norm) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, 'live', NULL)"
                        " ON CONFLICT (store, artifact_id) DO UPDATE SET kind = excluded.kind, state = 'live'",
                        [(a.store, a.artifact_id, a.backend, a.kind, a.subject_key, now) for _, a in batch])
                    conn.executemany("INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                     [(store, aid, a.store, a.artifact_id, relation, now) for aid, a in batch])
                    conn.executemany(
                        "INSERT INTO third_parties VALUES (?, ?, ?, ?) ON CONFLICT (artifact_id) DO UPDATE SET"
                        " recipient = excluded.recipient, sent_at = excluded.sent_at, note = excluded.note",
                        [(a.artifact_id, recipient, sent_at, note) for _, a in batch])
                    copies += [a for _, a in batch]
        return copies

    def third_party(self, artifact_id: str) -> dict[str, str] | None:
        row = self._conn.execute("SELECT recipient, sent_at, note FROM third_parties WHERE artifact_id = ?",
                                 (artifact_id,)).fetchone()
        return {"recipient": row[0], "sent_at": row[1], "note": row[2]} if row else None

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
        for part in _parts(hashes):
            for row in self._conn.execute(
                    f"SELECT * FROM artifacts WHERE content_hash IN ({','.join('?' * len(part))}) AND state = 'live'",
                    part):
                live.setdefault(row["content_hash"], []).append(self._artifact(row))
        return {(a.store, a.artifact_id): [o for o in live.get(a.content_hash, []) if o.subject_key != a.subject_key]
                if a.content_hash is not None else [] for a in arts}

    def record_probes(self, probes: Iterable[tuple[str, str, str, np.ndarray]],
                      done: Iterable[tuple[str, str, str]] = ()) -> int:
        """Record (store, artifact id, sha256 of the probe query, vector) rows of artifacts that are still live
        (``tombstone.capture.deferred``): an artifact erased meanwhile gets none. In the same transaction the
        pending captures ``done`` names — (store, artifact id, ticket) — are cleared, where the artifact is
        still live and no later write replaced the ticket. Returns the probe rows written."""
        written = 0
        with self.atomic() as conn:
            for store, aid, query, vector in probes:
                written += conn.execute(
                    "INSERT INTO probes SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM artifacts WHERE store = ?"
                    " AND artifact_id = ? AND state = 'live') ON CONFLICT (store, artifact_id, query_sha256)"
                    " DO UPDATE SET vector = excluded.vector",
                    (store, aid, query, np.asarray(vector, dtype="<f4").tobytes(), store, aid)).rowcount
            conn.executemany(
                "DELETE FROM probe_captures WHERE store = ? AND artifact_id = ? AND ticket = ? AND EXISTS"
                " (SELECT 1 FROM artifacts a WHERE a.store = probe_captures.store"
                " AND a.artifact_id = probe_captures.artifact_id AND a.state = 'live')",
                list(done))
        return written

    def pending_captures(self, store: str) -> list[tuple[str, str, str]]:
        """The store's artifacts whose probe capture is pending: (artifact id, ticket, writer), by id."""
        return [tuple(row) for row in self._conn.execute(
            "SELECT artifact_id, ticket, writer FROM probe_captures WHERE store = ? ORDER BY artifact_id", (store,))]

    def probes_incomplete(self, artifacts: Iterable[ArtifactRecord]) -> set[str]:
        """Ids of the artifacts whose probe capture never finished (after this process's queued probes are
        recorded): their fragment probe vectors are missing."""
        _before_probe_reads()
        out: set[str] = set()
        for store, ids in _by_store((a.store, a.artifact_id) for a in artifacts).items():
            for part in _parts(ids):
                out.update(row[0] for row in self._conn.execute(
                    f"SELECT artifact_id FROM probe_captures WHERE store = ?"
                    f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)))
        return out

    def probe_vectors(self, artifacts: Iterable[ArtifactRecord]) -> dict[str, list[np.ndarray]]:
        """Probe vectors of each artifact, keyed by artifact id (after this process's queued probes are
        recorded)."""
        _before_probe_reads()  # once for the batch, not once per artifact
        arts = list(artifacts)
        found: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
        for store, ids in _by_store((a.store, a.artifact_id) for a in arts).items():
            for part in _parts(ids):
                for aid, query, vector in self._conn.execute(
                        f"SELECT artifact_id, query_sha256, vector FROM probes WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)):
                    found.setdefault((store, aid), []).append((query, np.frombuffer(vector, dtype="<f4")))
        # each artifact's in the order _probes gives them (by the query's hash)
        return {a.artifact_id: [v for _, v in sorted(found.get((a.store, a.artifact_id), []), key=lambda p: p[0])]
                for a in arts}

    def probe_counts(self, artifacts: Iterable[ArtifactRecord]) -> dict[str, int]:
        """How many probe vectors each artifact has, keyed by artifact id, without reading them (the primary
        key's index answers it); after this process's queued probes are recorded."""
        _before_probe_reads()
        arts = list(artifacts)
        found: dict[tuple[str, str], int] = {}
        for store, ids in _by_store((a.store, a.artifact_id) for a in arts).items():
            for part in _parts(ids):
                for aid, n in self._conn.execute(
                        f"SELECT artifact_id, count(*) FROM probes WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))}) GROUP BY artifact_id", (store, *part)):
                    found[(store, aid)] = n
        return {a.artifact_id: found.get((a.store, a.artifact_id), 0) for a in arts}

    def count_artifacts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT state, count(*) FROM artifacts GROUP BY state").fetchall())

    def probes_for(self, store: str, artifact_id: str) -> list[tuple[str, np.ndarray]]:
        _before_probe_reads()
        return self._probes(store, artifact_id)

    def _probes(self, store: str, artifact_id: str) -> list[tuple[str, np.ndarray]]:
        rows = self._conn.execute(
            "SELECT query_sha256, vector FROM probes WHERE store = ? AND artifact_id = ? ORDER BY query_sha256",
            (store, artifact_id),
        )
        return [(q, np.frombuffer(v, dtype="<f4")) for q, v in rows]

    def set_state(self, artifacts: Iterable[ArtifactRecord], state: str) -> None:
        with self.atomic() as conn:
            _for_ids(conn, "UPDATE artifacts SET state = ? WHERE store = ? AND artifact_id IN ({ids})",
                     [(a.store, a.artifact_id) for a in artifacts], (state,))

    def purge_probes(self, artifacts: Iterable[ArtifactRecord]) -> None:
        keys = [(a.store, a.artifact_id) for a in artifacts]
        with self.atomic() as conn:
            _for_ids(conn, "DELETE FROM probes WHERE store = ? AND artifact_id IN ({ids})", keys)
            _for_ids(conn, "DELETE FROM probe_captures WHERE store = ? AND artifact_id IN ({ids})", keys)

    # -- semantic snapshots (tombstone.verify.semantic) ---------------------------------------

    def save_semantic_snapshots(self, saga_id: str, store: str, snapshots: dict[str, tuple[dict[str, Any], bytes]]) -> None:
        """Record, per artifact id, what the semantic level measured before suppression: ``(meta, vectors)``
        (JSON-able metadata, float32 bytes). Replaces an earlier snapshot of the same artifact. The rows hold
        the artifact's own vector: they are deleted with its probe vectors when its receipt is sealed."""
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO semantic_snapshots VALUES (?, ?, ?, ?, ?) ON CONFLICT (store, artifact_id)"
                " DO UPDATE SET saga_id = excluded.saga_id, meta = excluded.meta, vectors = excluded.vectors",
                [(store, aid, saga_id, _json_text(meta), vectors)
                 for aid, (meta, vectors) in sorted(snapshots.items())],
            )

    def semantic_snapshots(self, store: str, artifact_ids: Iterable[str]) -> dict[str, tuple[dict[str, Any], bytes]]:
        """The recorded snapshots of these artifacts of ``store`` (those that have one): ``(meta, vectors)``."""
        out = {}
        for part in _parts(list(dict.fromkeys(artifact_ids))):
            for aid, meta, vectors in self._conn.execute(
                    "SELECT artifact_id, meta, vectors FROM semantic_snapshots WHERE store = ? AND artifact_id IN"
                    f" ({','.join('?' * len(part))})", (store, *part)):
                out[aid] = (json.loads(meta), bytes(vectors))
        return out

    # -- model snapshots (tombstone.verify.model) ----------------------------------------------

    def save_model_snapshots(self, saga_id: str, store: str, snapshots: dict[str, tuple[dict[str, Any], str | None]]) -> None:
        """Record, per artifact id, what the model level needs after the erasure: ``(meta, text)`` (JSON-able
        metadata; the trained example's text, kept sealed with the lineage secret, or None). Replaces an
        earlier snapshot of the same artifact. Deleted when the artifact's receipt is sealed."""
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO model_snapshots VALUES (?, ?, ?, ?, ?) ON CONFLICT (store, artifact_id)"
                " DO UPDATE SET saga_id = excluded.saga_id, meta = excluded.meta, text_sealed = excluded.text_sealed",
                [(store, aid, saga_id, _json_text(meta),
                  None if text is None else self.secret.seal(text.encode("utf-8")))
                 for aid, (meta, text) in sorted(snapshots.items())],
            )

    def model_snapshots(self, store: str, artifact_ids: Iterable[str]) -> dict[str, tuple[dict[str, Any], str | None]]:
        """The recorded model snapshots of these artifacts of ``store`` (those that have one): ``(meta, text)``."""
        out = {}
        for aid in artifact_ids:
            row = self._conn.execute("SELECT meta, text_sealed FROM model_snapshots WHERE store = ? AND artifact_id = ?",
                                     (store, aid)).fetchone()
            if row is not None:
                text = None if row[1] is None else self.secret.unseal(bytes(row[1])).decode("utf-8")
                out[aid] = (json.loads(row[0]), text)
        return out

    # -- artifacts derived by a backend (a model trained on examples) ----------------------------

    def record_derived_artifacts(self, derived: Iterable[tuple[str, str, ArtifactRecord]], *, relation: str,
                                 replacing: str | None = None) -> tuple[list[ArtifactRecord], int]:
        """Record, in one transaction, artifacts derived from others (``(src_store, src_id, artifact)``): each
        owned by the subject that owns its source, with an edge source → artifact. Sources the lineage db does
        not know are skipped. With ``replacing`` (a third party's recipient, e.g. ``training run ft-7``), the
        copies :meth:`record_third_parties` recorded for that recipient from the same sources are replaced by
        these artifacts — a backend that can reach the copy takes it over from a person — unless an erasure
        has already begun on them. Returns the recorded artifacts and how many third-party copies they
        replaced."""
        derived = list(derived)
        now = self._now()
        recorded: list[ArtifactRecord] = []
        replaced = 0
        with self.atomic() as conn:
            owners: dict[tuple[str, str], str] = {}
            by_store: dict[str, list[str]] = {}
            for src_store, src_id, _ in derived:
                by_store.setdefault(src_store, []).append(src_id)
            for store, ids in by_store.items():
                ids = list(dict.fromkeys(ids))
                for start in range(0, len(ids), 500):
                    part = ids[start : start + 500]
                    rows = conn.execute(
                        f"SELECT artifact_id, subject_key FROM artifacts WHERE store = ?"
                        f" AND artifact_id IN ({','.join('?' * len(part))})", (store, *part)).fetchall()
                    owners.update({(store, row[0]): row[1] for row in rows})
            batch = [(s, i, a, owners[(s, i)]) for s, i, a in derived if (s, i) in owners]
            conn.executemany(
                "INSERT INTO artifacts (store, artifact_id, backend, kind, subject_key, fingerprint, content_hash,"
                " created_at, state, inv_norm) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, 'live', NULL)"
                " ON CONFLICT (store, artifact_id) DO UPDATE SET backend = excluded.backend, kind = excluded.kind,"
                " subject_key = excluded.subject_key, state = 'live'",
                [(a.store, a.artifact_id, a.backend, a.kind, key, now) for _, _, a, key in batch])
            conn.executemany("INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             [(s, i, a.store, a.artifact_id, relation, now) for s, i, a, _ in batch])
            if replacing:
                for s, i, _, _ in batch:
                    copy = f"{replacing}:{s}/{i}"
                    gone = conn.execute(
                        "DELETE FROM artifacts WHERE store = ? AND artifact_id = ? AND state = 'live'"
                        " AND NOT EXISTS (SELECT 1 FROM suppressions WHERE store = ? AND artifact_id = ?)",
                        (THIRD_PARTY_STORE, copy, THIRD_PARTY_STORE, copy)).rowcount
                    if gone:
                        conn.execute("DELETE FROM edges WHERE dst_store = ? AND dst_id = ?", (THIRD_PARTY_STORE, copy))
                        conn.execute("DELETE FROM third_parties WHERE artifact_id = ?", (copy,))
                        replaced += 1
            recorded = [ArtifactRecord(store=a.store, artifact_id=a.artifact_id, backend=a.backend, kind=a.kind,
                                       subject_key=key, created_at=now) for _, _, a, key in batch]
        return recorded, replaced

    # -- suppression --------------------------------------------------------------------------

    def record_suppressions(self, saga_id: str, artifacts: Iterable[ArtifactRecord]) -> None:
        """The durable suppression record: from its commit on, every wrapper hides the artifacts."""
        now = self._now()
        artifacts = list(artifacts)
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO suppressions (store, artifact_id, saga_id, suppressed_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (store, artifact_id) DO UPDATE SET cleared_at = NULL",
                [(a.store, a.artifact_id, saga_id, now) for a in artifacts],
            )
            self._bump_generations(conn, {a.store for a in artifacts})

    def clear_suppressions(self, artifacts: Iterable[ArtifactRecord]) -> None:
        """The store's reclaim removed these records: wrappers need not filter them any more."""
        now = self._now()
        artifacts = list(artifacts)
        with self.atomic() as conn:
            _for_ids(conn, "UPDATE suppressions SET cleared_at = ? WHERE store = ? AND artifact_id IN ({ids})"
                     " AND cleared_at IS NULL", [(a.store, a.artifact_id) for a in artifacts], (now,))
            self._bump_generations(conn, {a.store for a in artifacts})

    @staticmethod
    def _bump_generations(conn: Any, stores: Iterable[str]) -> None:
        conn.executemany(
            "INSERT INTO suppression_generations (store, generation) VALUES (?, 1)"
            " ON CONFLICT (store) DO UPDATE SET generation = suppression_generations.generation + 1",
            [(store,) for store in sorted(stores)],
        )

    def suppression_generation(self, store: str) -> int:
        """Changes whenever the store's set of hidden ids does (0: never anything suppressed)."""
        row = self._conn.execute("SELECT generation FROM suppression_generations WHERE store = ?",
                                 (store,)).fetchone()
        return int(row[0]) if row else 0

    def hidden_ids(self, store: str) -> set[str]:
        """Ids suppressed in ``store`` whose records reclaim has not removed: what wrappers must not return."""
        rows = self._conn.execute("SELECT artifact_id FROM suppressions WHERE store = ? AND cleared_at IS NULL",
                                  (store,))
        return {row[0] for row in rows}

    def is_suppressed(self, store: str, artifact_id: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM suppressions WHERE store = ? AND artifact_id = ?", (store, artifact_id)
        ).fetchone()
        return row is not None

    def suppressed_among(self, store: str, artifact_ids: Iterable[str]) -> set[str]:
        """Which of ``artifact_ids`` in ``store`` have ever been suppressed (``is_suppressed`` for many, a few
        hundred ids a query)."""
        ids = list(dict.fromkeys(artifact_ids))
        out: set[str] = set()
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            rows = self._conn.execute(
                f"SELECT artifact_id FROM suppressions WHERE store = ? AND artifact_id IN ({', '.join('?' * len(part))})",
                (store, *part))
            out.update(row[0] for row in rows)
        return out

    def suppressed_ids(self, store: str) -> set[str]:
        rows = self._conn.execute("SELECT artifact_id FROM suppressions WHERE store = ?", (store,))
        return {row[0] for row in rows}

    # -- sagas and journal --------------------------------------------------------------------

    def create_saga(self, saga_id: str, subject: str, out_path: str | None, plan: dict[str, Any] | None = None) -> None:
        """Create a running saga and, in the same transaction, journal its plan: a saga never exists without one."""
        with self.atomic() as conn:
            conn.execute(
                "INSERT INTO sagas VALUES (?, ?, ?, 'running', ?, NULL, ?)",
                (saga_id, self.subject_key(subject), self.secret.seal(subject.encode()), self._now(), out_path),
            )
            if plan is not None:
                self.journal(saga_id, "plan", "", "begin")
                self.journal(saga_id, "plan", "", "end", plan)

    def saga(self, saga_id: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT * FROM sagas WHERE saga_id = ?", (saga_id,)).fetchone()
        return self._saga(row) if row else None

    def _saga(self, row: Any) -> dict[str, Any]:
        saga = {key: row[key] for key in row.keys()}
        saga["subject"] = self.secret.unseal(bytes(saga.pop("subject_sealed"))).decode()
        return saga

    def running_out_paths(self) -> dict[str, str]:
        """The receipt file each unfinished saga will write, by saga id (sagas that chose none are left out)."""
        rows = self._conn.execute("SELECT saga_id, out_path FROM sagas WHERE state = 'running' AND out_path IS NOT NULL")
        return {row[0]: row[1] for row in rows}

    def set_out_path(self, saga_id: str, out_path: str) -> None:
        """Record where a running saga writes its receipt (a resume writes the same file)."""
        with self.atomic() as conn:
            conn.execute("UPDATE sagas SET out_path = ? WHERE saga_id = ? AND state = 'running'", (out_path, saga_id))

    def running_saga(self, subject_key: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT * FROM sagas WHERE subject_key = ? AND state = 'running'", (subject_key,)
        ).fetchone()
        return self._saga(row) if row else None

    def sagas(self, state: str | None = None) -> list[dict[str, Any]]:
        if state:
            rows = self._conn.execute("SELECT * FROM sagas WHERE state = ? ORDER BY started_at", (state,))
        else:
            rows = self._conn.execute("SELECT * FROM sagas ORDER BY started_at")
        return [self._saga(row) for row in rows]

    def journal(self, saga_id: str, step: str, target: str, phase: str, detail: dict[str, Any] | None = None) -> None:
        self.journal_many([(saga_id, step, target, phase, detail)])

    def journal_many(self, entries: Sequence[tuple[str, str, str, str, dict[str, Any] | None]]) -> None:
        """``journal`` for several sagas' entries (saga id, step, target, phase, detail) in one transaction:
        a batch's sagas journal a shared step together, all or none."""
        if not entries:
            return
        now = self._now()
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO journal (saga_id, step, target, phase, at, detail, worker) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(saga_id, step, target, phase, now, _json_text(detail or {}), self.worker)
                 for saga_id, step, target, phase, detail in entries])

    def step_result(self, saga_id: str, step: str, target: str = "") -> dict[str, Any] | None:
        """The detail journaled when the step ended, or None if it never ended."""
        row = self._conn.execute(
            "SELECT detail FROM journal WHERE saga_id = ? AND step = ? AND target = ? AND phase = 'end'"
            " ORDER BY seq DESC LIMIT 1",
            (saga_id, step, target),
        ).fetchone()
        return json.loads(row[0]) if row else None

    def journal_entries(self, saga_id: str) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT * FROM journal WHERE saga_id = ? ORDER BY seq", (saga_id,))
        return [dict(row) for row in rows]

    # -- dead letters -------------------------------------------------------------------------

    def add_dead_letter(self, saga_id: str, store: str, step: str, artifacts: int, error: str, attempts: int) -> None:
        with self.atomic() as conn:
            conn.execute("INSERT INTO dead_letters (saga_id, store, step, artifacts, error, attempts, at)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", (saga_id, store, step, artifacts, error, attempts, self._now()))

    def dead_letters(self, state: str | None = "open") -> list[dict[str, Any]]:
        query = "SELECT d.*, s.subject_sealed FROM dead_letters d JOIN sagas s USING (saga_id)"
        rows = self._conn.execute(query + (" WHERE d.state = ?" if state else "") + " ORDER BY d.seq",
                                  (state,) if state else ()).fetchall()
        out = []
        for row in rows:
            item = dict(row)
            item["subject"] = self.secret.unseal(bytes(item.pop("subject_sealed"))).decode()
            out.append(item)
        return out

    def mark_dead_letters_retried(self, seqs: list[int]) -> None:
        with self.atomic() as conn:
            conn.executemany("UPDATE dead_letters SET state = 'retried' WHERE seq = ?", [(s,) for s in seqs])

    # -- index records (a record manager's rows: keys an index run wrote, when, from which source) --

    def _group_key(self, group: str) -> str:
        return self.secret.subject_key("index-group\x00" + group)

    def index_update(self, namespace: str, keys: Sequence[str], groups: Sequence[str | None], at: float) -> None:
        """Upsert index records: each key with its group (source; None for none), updated at ``at``."""
        rows = [(namespace, key, None if group is None else self._group_key(group),
                 None if group is None else self.secret.seal(group.encode("utf-8")), at)
                for key, group in zip(keys, groups)]
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO index_records VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, record_key) DO UPDATE"
                " SET group_key = excluded.group_key, group_sealed = excluded.group_sealed,"
                " updated_at = excluded.updated_at", rows)

    def index_exists(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        found: set[str] = set()
        keys = list(keys)
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            rows = self._conn.execute(
                f"SELECT record_key FROM index_records WHERE namespace = ?"
                f" AND record_key IN ({','.join('?' * len(part))})", (namespace, *part)).fetchall()
            found.update(row[0] for row in rows)
        return [key in found for key in keys]

    def index_keys(self, namespace: str, *, before: float | None = None, after: float | None = None,
                   groups: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
        """Keys updated before/after a time, of some groups, oldest first."""
        where, params = ["namespace = ?"], [namespace]
        if before is not None:
            where.append("updated_at < ?")
            params.append(before)
        if after is not None:
            where.append("updated_at > ?")
            params.append(after)
        if groups is not None:
            if not groups:
                return []
            where.append(f"group_key IN ({','.join('?' * len(groups))})")
            params += [self._group_key(g) for g in groups]
        query = f"SELECT record_key FROM index_records WHERE {' AND '.join(where)} ORDER BY updated_at, record_key"
        if limit:
            query += f" LIMIT {int(limit)}"
        return [row[0] for row in self._conn.execute(query, params).fetchall()]

    def index_groups(self, namespace: str, keys: Sequence[str]) -> dict[str, str | None]:
        """The group (source) of each key that has a record (None: recorded without one)."""
        out: dict[str, str | None] = {}
        keys = list(keys)
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            rows = self._conn.execute(
                f"SELECT record_key, group_sealed FROM index_records WHERE namespace = ?"
                f" AND record_key IN ({','.join('?' * len(part))})", (namespace, *part)).fetchall()
            for key, sealed in rows:
                out[key] = None if sealed is None else self.secret.unseal(bytes(sealed)).decode("utf-8")
        return out

    def index_delete(self, namespace: str, keys: Sequence[str]) -> None:
        with self.atomic() as conn:
            conn.executemany("DELETE FROM index_records WHERE namespace = ? AND record_key = ?",
                             [(namespace, key) for key in keys])

    # -- receipt chain ------------------------------------------------------------------------

    def chain_head(self) -> tuple[int, str] | None:
        row = self._conn.execute("SELECT seq, receipt_hash FROM receipts ORDER BY seq DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else None

    def receipts(self, subject_key: str | None = None) -> list[dict[str, Any]]:
        """The sealed receipts of the chain, in order: ``seq``, ``saga_id``, ``subject_key``, ``receipt_hash``,
        ``previous_hash``, ``created_at`` and ``body`` (the signed receipt's canonical bytes, unsealed)."""
        query = "SELECT seq, saga_id, subject_key, receipt_hash, previous_hash, created_at, receipt_sealed FROM receipts"
        rows = self._conn.execute(query + (" WHERE subject_key = ?" if subject_key else "") + " ORDER BY seq",
                                  (subject_key,) if subject_key else ()).fetchall()
        out = []
        for row in rows:
            item = {key: row[key] for key in ("seq", "saga_id", "subject_key", "receipt_hash", "previous_hash",
                                              "created_at")}
            item["body"] = self.secret.unseal(bytes(row["receipt_sealed"]))
            out.append(item)
        return out

    def receipt_seq(self, receipt_hash: str) -> int | None:
        """The chain position of a sealed receipt, or None when the chain holds no receipt with this hash."""
        row = self._conn.execute("SELECT seq FROM receipts WHERE receipt_hash = ?", (receipt_hash,)).fetchone()
        return row[0] if row else None

    def receipt_for_saga(self, saga_id: str) -> bytes | None:
        row = self._conn.execute("SELECT receipt_sealed FROM receipts WHERE saga_id = ?", (saga_id,)).fetchone()
        return self.secret.unseal(bytes(row[0])) if row else None

    def rekey_content_hashes(self) -> None:
        """Migration 6: turn every stored unkeyed SHA-256 of content into its keyed form (inside the
        migration's transaction)."""
        rows = self._conn.execute("SELECT store, artifact_id, content_hash FROM artifacts"
                                  " WHERE content_hash IS NOT NULL").fetchall()
        self._conn.executemany("UPDATE artifacts SET content_hash = ? WHERE store = ? AND artifact_id = ?",
                               [(self.secret.content_key(h), store, aid) for store, aid, h in rows])

    def append_receipts(self, rows: Sequence[tuple[str, str, str, str | None, bytes, Iterable[ArtifactRecord]]]
                        ) -> list[int]:
        """Add receipts to the chain and close their sagas, in one transaction: all of them are sealed, or none.

        Each row is ``(saga_id, subject_key, receipt_hash, previous, body, purge)``, in chain order (each one's
        previous hash the one before it). ``purge`` names the saga's artifacts: in the same transaction their
        fingerprints, keyed content hashes, norms, probe vectors, semantic and model snapshots are removed, so
        once a receipt is sealed Tombstone's records keep nothing of what was erased but ids and statuses
        (``secure_delete`` zeroes the freed bytes; the write-ahead log is checkpointed and truncated afterwards,
        once for all the rows)."""
        now = self._now()
        rows = [(saga_id, key, digest, previous, body, [(a.store, a.artifact_id) for a in purge])
                for saga_id, key, digest, previous, body, purge in rows]
        purge = [pair for *_, pairs in rows for pair in pairs]
        seqs = []
        with self.atomic() as conn:
            _for_ids(conn, "UPDATE artifacts SET fingerprint = NULL, content_hash = NULL, inv_norm = NULL"
                     " WHERE store = ? AND artifact_id IN ({ids})", purge)
            for table in ("probes", "probe_captures", "semantic_snapshots", "model_snapshots"):
                _for_ids(conn, f"DELETE FROM {table} WHERE store = ? AND artifact_id IN ({{ids}})", purge)
            head = self.chain_head()
            for saga_id, subject_key, receipt_hash, previous, body, _ in rows:
                if (head[1] if head else None) != previous:
                    raise LineageError("receipt chain moved while this receipt was being signed; resume the saga")
                seq = (head[0] if head else 0) + 1
                conn.execute(
                    "INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (seq, saga_id, subject_key, receipt_hash, previous, now, self.secret.seal(body)),
                )
                conn.execute(
                    "UPDATE sagas SET state = 'done', finished_at = ? WHERE saga_id = ?", (now, saga_id)
                )
                head = (seq, receipt_hash)
                seqs.append(seq)
        if purge and not self.postgres:
            # The WAL still holds page images from before the purge: fold them into the (zeroed) file.
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return seqs
