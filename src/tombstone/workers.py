"""Several workers, one journal: a queue of sagas on PostgreSQL, worked by ``tombstone worker`` processes.

For deployments that outgrow one machine. The lineage db (with the saga journal) lives on PostgreSQL
(``lineage_dsn`` in the config), and the queue is `procrastinate <https://procrastinate.readthedocs.io>`_'s
job table in the same database: workers fetch jobs with ``SELECT ... FOR UPDATE SKIP LOCKED``, so no job
is handed to two of them.

How the pieces keep the promises:

* **One job per saga.** :func:`enqueue` creates each subject's saga (and its plan) exactly as
  ``tombstone erase`` would, then queues one job naming the saga id (never the subject) with the saga id
  as procrastinate's *queueing lock*: queueing it twice is a no-op.
* **No step run twice.** A job resumes its saga from the journal: steps whose end is journaled are
  skipped. The saga holds its subject's advisory lock on the lineage db connection for as long as it
  runs, and every journal write goes through that same connection, so two workers never run one saga
  at the same time: a second one finds the lock taken and puts the job back (:class:`SubjectBusyError`
  is retried after the lease).
* **No saga lost.** Workers send heartbeats every third of the *lease*. A worker that dies stops
  sending them; once its last heartbeat is older than the lease, any other worker's sweeper puts its
  job back on the queue (once: a sweeper that comes second finds it queued again, or taken, and leaves
  it), and whoever takes it resumes the saga where the journal says it stopped. The
  dead worker's PostgreSQL session (and so its advisory lock) ends with its process; a machine that
  vanishes without closing its socket is noticed by the server's TCP keepalive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.config import Config, load_config
from tombstone.errors import ConfigError, LineageError, SagaError

QUEUE = "tombstone-sagas"
TASK = "tombstone.run_saga"
DEFAULT_LEASE = 30.0

logger = logging.getLogger("tombstone.workers")


def _procrastinate() -> Any:
    try:
        import procrastinate
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigError("several workers need the 'workers' extra: pip install 'tombstone-rag[workers]'") from exc
    return procrastinate


def _require_dsn(config: Config) -> str:
    if not config.lineage_dsn:
        raise ConfigError(f"{config.path}: a queue of sagas needs the lineage db on PostgreSQL"
                          " (set lineage_dsn = \"postgresql://...\" under [tombstone])")
    return config.lineage_dsn


def _queue_error(dsn: str, exc: BaseException) -> LineageError:
    from tombstone.lineage.postgres import redact_dsn

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return LineageError(f"cannot use the saga queue at {redact_dsn(dsn)}: {str(cause).strip() or type(cause).__name__}")


def _database_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error, _procrastinate().exceptions.ProcrastinateException)


def ensure_queue(dsn: str) -> None:
    """Install procrastinate's schema in the lineage database, once (workers starting together wait)."""
    import psycopg

    procrastinate = _procrastinate()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(28853, 1)")
            try:
                if conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is None:
                    conn.execute(procrastinate.schema.SchemaManager.get_schema())
            finally:
                conn.execute("SELECT pg_advisory_unlock(28853, 1)")
    except psycopg.Error as exc:
        raise _queue_error(dsn, exc) from exc


@dataclass
class _WorkerState:
    config_path: Path
    name: str
    lease: float
    finished: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


_state: _WorkerState | None = None


def run_saga_job(saga_id: str) -> dict[str, Any]:
    """The job: resume one saga from the journal and run it to its receipt (in a worker process)."""
    from tombstone.api import Tombstone
    from tombstone.saga.engine import Saga

    assert _state is not None, "run_saga_job runs inside 'tombstone worker'"
    with Tombstone.open(_state.config_path) as tomb:
        tomb.lineage.worker = _state.name
        row = tomb.lineage.saga(saga_id)
        if row is None:
            raise SagaError(f"no saga {saga_id!r} in the lineage db")
        if row["state"] == "done":
            return {"saga_id": saga_id, "already": "done"}
        try:
            saga = Saga.resume(tomb, saga_id)
        except SagaError:
            if (tomb.lineage.saga(saga_id) or {}).get("state") == "done":
                return {"saga_id": saga_id, "already": "done"}
            raise  # SubjectBusyError: another worker holds the subject; the job is retried later
        try:
            receipt = saga.run()
        except Exception as exc:
            _state.failed.append(saga_id)
            print(f"{_state.name}: saga {saga_id} failed: {exc}", flush=True)
            raise
        _state.finished.append(saga_id)
        print(f"{_state.name}: saga {saga_id} done, receipt {saga.receipt_path}"
              f" ({', '.join(f'{k} {v}' for k, v in receipt['summary'].items() if v)})", flush=True)
        return {"saga_id": saga_id, "receipt": str(saga.receipt_path)}


def make_app(dsn: str, lease: float = DEFAULT_LEASE) -> Any:
    """The procrastinate app over the lineage database, with the saga task registered."""
    from tombstone.saga.lock import SubjectBusyError

    procrastinate = _procrastinate()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=4))
    app.task(name=TASK, queue=QUEUE, pass_context=False,
             retry=procrastinate.RetryStrategy(max_attempts=1000, wait=max(1, int(lease)),
                                               retry_exceptions={SubjectBusyError}))(run_saga_job)
    return app


@dataclass(frozen=True)
class Queued:
    subject: str
    saga_id: str
    queued: bool
    """False when a job for this saga was already waiting."""


def enqueue(tomb: Any, subjects: list[str]) -> list[Queued]:
    """Create (or find) each subject's saga and queue one job for it. Every subject is checked first: an
    unknown one stops the whole call before anything is created or queued."""
    dsn = _require_dsn(tomb.config)
    subjects = tomb.known_subjects(subjects)
    ensure_queue(dsn)
    procrastinate = _procrastinate()
    app = make_app(dsn)
    try:
        return _defer_all(tomb, app, subjects, procrastinate)
    except _database_errors() as exc:
        if isinstance(exc, procrastinate.exceptions.AlreadyEnqueued):
            raise
        raise _queue_error(dsn, exc) from exc


def _defer_all(tomb: Any, app: Any, subjects: list[str], procrastinate: Any) -> list[Queued]:
    from tombstone.saga.engine import Saga
    from tombstone.saga.lock import SubjectBusyError

    out = []
    with app.open():
        task = app.tasks[TASK]
        for subject in subjects:
            key = tomb.lineage.subject_key(subject)
            try:
                saga = Saga.start(tomb, subject)  # creates the saga and its plan, or finds the running one
            except SubjectBusyError:
                running = tomb.lineage.running_saga(key)  # a worker is running it right now: nothing to queue
                out.append(Queued(subject, running["saga_id"] if running else "", False))
                continue
            saga.lock.release()
            try:
                task.configure(queueing_lock=saga.saga_id, lock=f"subject:{key[:32]}").defer(saga_id=saga.saga_id)
                queued = True
            except procrastinate.exceptions.AlreadyEnqueued:
                queued = False
            out.append(Queued(subject, saga.saga_id, queued))
    return out


def queue_counts(dsn: str) -> dict[str, int]:
    """Jobs of the saga queue by status (``todo``, ``doing``, ``succeeded``, ``failed``, ...)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is None:
            return {}  # nothing was ever queued
        rows = conn.execute("SELECT status::text, count(*) FROM procrastinate_jobs WHERE queue_name = %s"
                            " GROUP BY status", (QUEUE,)).fetchall()
    return dict(rows)


# Procrastinate's retry, only while the job is still running under the worker it was found stalled with: the
# row lock makes concurrent sweepers take turns, and the one that comes second (the job queued again, or
# already taken by a live worker) selects no row and retries nothing. procrastinate_retry_job_v2 would raise
# for a job no longer 'doing', and would put a live worker's job back on the queue.
_REQUEUE_STALLED = """
WITH still_stalled AS MATERIALIZED (
    SELECT id FROM procrastinate_jobs
     WHERE id = %(job_id)s AND status = 'doing' AND worker_id IS NOT DISTINCT FROM %(worker_id)s::bigint
       FOR UPDATE
)
SELECT id, procrastinate_retry_job_v2(id, now(), NULL, NULL, NULL) AS retried FROM still_stalled
"""


async def _sweep(app: Any, lease: float) -> int:
    """Put back on the queue the jobs of workers whose lease ran out (no heartbeat for ``lease`` seconds).
    Every worker sweeps: a job another sweeper has put back (or a live worker has taken) since it was
    listed is left alone. Returns how many jobs this sweep put back."""
    name = _state.name if _state else "worker"
    stalled = await app.job_manager.get_stalled_jobs(queue=QUEUE, seconds_since_heartbeat=lease)
    requeued = 0
    for job in stalled:
        rows = await app.connector.execute_query_all_async(_REQUEUE_STALLED, job_id=job.id, worker_id=job.worker_id)
        if not rows:
            logger.info("%s: job %s was queued again or taken by another worker first", name, job.id)
            continue
        requeued += 1
        print(f"{name}: lease of job {job.id} expired; queued again", flush=True)
    return requeued


async def _serve(config: Config, name: str, lease: float, drain: bool, poll: float) -> _WorkerState:
    global _state
    dsn = _require_dsn(config)
    ensure_queue(dsn)
    _state = _WorkerState(config.path, name, lease)
    app = make_app(dsn, lease)
    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(
            queues=[QUEUE], name=name, concurrency=1, wait=True, listen_notify=True,
            fetch_job_polling_interval=poll, update_heartbeat_interval=lease / 3,
            stalled_worker_timeout=lease, delete_jobs="never",
        ))
        try:
            while not worker.done():
                await _sweep(app, lease)
                if drain:
                    counts = await app.job_manager.list_queues_async(queue=QUEUE)
                    pending = sum(q["todo"] + q["doing"] for q in counts)
                    if pending == 0:
                        break
                await asyncio.wait({worker}, timeout=min(poll, lease / 3))
        finally:
            if not worker.done():
                worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass
    return _state


def serve(config_path: str | Path | None = None, *, name: str | None = None, lease: float = DEFAULT_LEASE,
          drain: bool = False, poll: float = 1.0) -> _WorkerState:
    """Run a worker until stopped (SIGINT/SIGTERM finish the current saga first) or, with ``drain``,
    until the queue has nothing waiting or running."""
    if lease <= 0 or poll <= 0:
        raise ConfigError("--lease and --poll must be positive")
    config = load_config(config_path)
    name = name or f"{socket.gethostname()}:{os.getpid()}"
    try:
        return asyncio.run(_serve(config, name, lease, drain, poll))
    except _database_errors() as exc:
        raise _queue_error(config.lineage_dsn or "", exc) from exc
