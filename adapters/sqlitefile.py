"""Canary hooks shared by the backends whose store is one SQLite file (the docstore, the exact cache)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class SQLiteFileCanaries:
    """``tombstone check --config`` places canaries in a file beside the configured one, then deletes it."""

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        path = Path(options["path"])
        return {**options, "path": str(path.with_name(f"{path.stem}-tombstone-canary{path.suffix}"))}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Delete the canaries' file, its SQLite sidecars and its lock file."""
        from tombstone.storelock import lock_file_for

        path = Path(cls.canary_options(options)["path"])
        lock = lock_file_for(path)
        for file in (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal")), lock):
            file.unlink(missing_ok=True)
