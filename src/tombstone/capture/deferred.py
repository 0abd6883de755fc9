"""Probe fragments embedded and recorded off the write path.

A wrapper's write records what an erasure cannot do without before the store is touched: each chunk's
lineage row (owner, fingerprint, content hash). The probe vectors — the embeddings of three short fragments
of each chunk, which let the logical probe ask the store the way a user would — are only evidence for a
later erasure, and with a real embedding model they are most of the wrapper's cost (three more sequences
per chunk). So by default they are embedded and recorded by one daemon thread per process, with its own
connection to the lineage db, while the application goes on.

What this changes, and what it does not:

* Anything in this process that reads probe vectors (an erasure, ``LineageDB.probe_vectors``) first waits
  for the queue (``flush``), so within one process an erasure sees every probe of every earlier write.
* Probe rows are written only for artifacts still live in the lineage db, in one transaction with that
  check: a chunk erased before its probes were embedded never gets them (records keep nothing of what was
  erased).
* The write records, in the transaction of its lineage rows, that each chunk's capture is pending (the
  ``probe_captures`` table, with a ticket naming the write and the writing process); the transaction that
  records the probe vectors clears it. A process that dies before the queue drains leaves those rows: the
  next wrapper opened on the store with its embedder finishes the capture from the text the store still
  holds (``tombstone.capture.pending``), and an erasure of a chunk still pending says on its receipt that
  its probes are incomplete, and does not measure it at the semantic level.
* ``TOMBSTONE_PROBE_CAPTURE=inline`` embeds the fragments in the write call itself, as one embedding call
  with the chunks (the behaviour before this module existed).
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tombstone.capture.calls import embed
from tombstone.capture.fragments import query_sha256
from tombstone.faults import kill_point
from tombstone.lineage.db import LineageDB
from tombstone.lineage.sql import PROBE_READ_HOOKS

MODE_ENV = "TOMBSTONE_PROBE_CAPTURE"
MODES = ("background", "inline")


def mode() -> str:
    """``background`` (the default) or ``inline``, from ``TOMBSTONE_PROBE_CAPTURE``."""
    value = os.environ.get(MODE_ENV, "background").strip().lower() or "background"
    if value not in MODES:
        from tombstone.errors import ConfigError

        raise ConfigError(f"{MODE_ENV}={value!r}: choose one of {', '.join(MODES)}")
    return value


def _started(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc``); '' where that cannot be read.
    With the pid it names one process: a pid the system reuses later starts at another time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


_writer: tuple[int, str] | None = None


def writer() -> str:
    """This process, as a pending capture records its writer: ``host:pid:start`` (worked out once per process,
    again in a forked child)."""
    global _writer
    pid = os.getpid()
    if _writer is None or _writer[0] != pid:
        _writer = (pid, f"{socket.gethostname()}:{pid}:{_started(pid)}")
    return _writer[1]


def writer_alive(name: str) -> bool:
    """Whether the process a pending capture names may still hold it in its queue: another process on this
    host that is still running. This process's own captures are told apart by their tickets
    (:meth:`ProbeQueue.holds`); a process on another host cannot be checked, and is taken as gone (finishing
    a capture twice writes the same vectors twice)."""
    from tombstone.lineage.locks import pid_alive

    parts = name.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid, started = int(parts[1]), parts[2]
    if pid == os.getpid():
        return False
    return pid_alive(pid) and (not started or _started(pid) in ("", started))


@dataclass
class _Job:
    lineage: Any
    embedder: Callable[[list[str]], Any]
    rows: list[tuple[str, str, str]]
    """(store, artifact id, fragment text)."""
    done: list[tuple[str, str, str]] = field(default_factory=list)
    """(store, artifact id, ticket): the pending captures these rows finish."""


@dataclass
class ProbeQueue:
    """One daemon thread that embeds probe fragments and records their vectors, in submission order."""

    _queue: "queue.Queue[_Job | None]" = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Condition = field(default_factory=lambda: threading.Condition(threading.Lock()))
    _pending: int = 0
    _errors: list[str] = field(default_factory=list)
    _connections: dict[tuple[str, int], Any] = field(default_factory=dict)
    _tickets: dict[str, int] = field(default_factory=dict)

    def submit(self, lineage: Any, embedder: Callable[[list[str]], Any], rows: Sequence[tuple[str, str, str]],
               done: Sequence[tuple[str, str, str]] = ()) -> None:
        """Queue (store, artifact id, fragment) rows whose artifacts ``lineage`` has just recorded, and the
        (store, artifact id, ticket) pending captures they finish."""
        if not rows and not done:
            return
        job = _Job(lineage, embedder, list(rows), list(done))
        with self._idle:
            self._pending += 1
            for ticket in {t for _, _, t in job.done}:
                self._tickets[ticket] = self._tickets.get(ticket, 0) + 1
        self._queue.put(job)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tombstone-probes", daemon=True)
                self._thread.start()

    def flush(self, timeout: float | None = None) -> list[str]:
        """Wait until every queued job is recorded (or ``timeout`` seconds pass); return and forget the errors
        of jobs that failed (their chunks have no probe vectors)."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)
            errors, self._errors = self._errors, []
        return errors

    @property
    def pending(self) -> int:
        with self._idle:
            return self._pending

    def holds(self, ticket: str) -> bool:
        """Whether a job of this process's queue will finish the pending captures of ``ticket``."""
        with self._idle:
            return ticket in self._tickets

    def _connection(self, lineage: Any) -> Any:
        """This thread's own connection to the lineage db ``lineage`` is open on (a LineageDB is not shared
        between threads)."""
        key = (str(lineage.target), id(lineage.secret))
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = LineageDB(lineage.target, lineage.secret, clock=lineage.clock)
        return conn

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                vectors = embed(job.embedder, [text for _, _, text in job.rows])
                kill_point("probes:before-record")  # crash tests: the write landed, its probes did not
                self._connection(job.lineage).record_probes(
                    [(store, aid, query_sha256(text), vectors[k]) for k, (store, aid, text) in enumerate(job.rows)],
                    job.done)
            except Exception as exc:  # the write has landed; only its probe vectors are lost
                stores = sorted({store for store, _, _ in job.rows})
                chunks = len({(store, aid) for store, aid, _ in job.rows})
                with self._idle:
                    self._errors.append(f"probe vectors of {chunks} chunk(s) in {', '.join(stores)} were not"
                                        f" recorded: {type(exc).__name__}: {exc}")
            finally:
                if self._queue.empty():  # idle: hold no connection (nor a file, nor a server slot) meanwhile
                    self._close_connections()
                with self._idle:
                    self._pending -= 1
                    for ticket in {t for _, _, t in job.done}:
                        left = self._tickets.pop(ticket) - 1
                        if left:
                            self._tickets[ticket] = left
                    self._idle.notify_all()

    def _close_connections(self) -> None:
        for conn in self._connections.values():
            try:
                conn.close()
            except Exception:
                pass
        self._connections.clear()


PROBES = ProbeQueue()
"""This process's queue."""

_held = threading.local()


def submit(lineage: Any, embedder: Callable[[list[str]], Any], rows: Sequence[tuple[str, str, str]],
           done: Sequence[tuple[str, str, str]] = ()) -> None:
    """Queue probe fragments (and the pending captures they finish); inside a write decorated with
    ``after_write``, once that write has returned."""
    jobs = getattr(_held, "jobs", None)
    if jobs is not None:
        jobs.append((lineage, embedder, list(rows), list(done)))
    else:
        PROBES.submit(lineage, embedder, rows, done)


def after_write(method: Callable[..., Any]) -> Callable[..., Any]:
    """For a wrapper's write method: the probe fragments its capture queues start once the store write has
    returned, so the background thread never competes with the write it follows. A write that raises queues
    none (its records may not have landed; their lineage rows stay, harmless)."""
    import functools

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if getattr(_held, "jobs", None) is not None:  # nested: the outermost write submits
            return method(*args, **kwargs)
        _held.jobs = []
        try:
            result = method(*args, **kwargs)
            jobs = _held.jobs
        finally:
            _held.jobs = None
        for lineage, embedder, rows, done in jobs:
            PROBES.submit(lineage, embedder, rows, done)
        return result

    return wrapped


def flush(timeout: float | None = None) -> list[str]:
    """Wait for this process's queued probe vectors to be recorded; the errors of jobs that failed."""
    return PROBES.flush(timeout)


atexit.register(flush, 120.0)
PROBE_READ_HOOKS.append(flush)  # a read of probe vectors in this process waits for the queue  # a stuck embedder does not hold the process forever

__all__ = ["MODES", "MODE_ENV", "PROBES", "ProbeQueue", "after_write", "flush", "mode", "submit", "writer",
           "writer_alive"]
