"""The Python API: open a deployment, wrap stores, erase subjects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tombstone.clock import Clock, system_clock
from tombstone.config import CONFIG_NAME, Config, load_config, write_config
from tombstone.contract import Adapter, open_adapter
from tombstone.errors import ConfigError
from tombstone.keys import LineageSecret, create_keys
from tombstone.lineage.db import LineageDB
from tombstone.saga.engine import Saga


def init_deployment(root: str | Path, stores: dict[str, dict[str, Any]] | None = None) -> Config:
    """Create ``root/tombstone.toml`` (unless present), the keys and the lineage db. Idempotent."""
    root = Path(root)
    config_path = root / CONFIG_NAME
    if not config_path.exists():
        write_config(config_path, stores)
    config = load_config(config_path)
    create_keys(config.keys_dir)
    LineageDB(config.lineage_db, LineageSecret.load(config.keys_dir)).close()
    return config


class Tombstone:
    """An open deployment: its config, lineage db and (lazily opened) store adapters."""

    def __init__(self, config: Config, *, clock: Clock = system_clock) -> None:
        self.config = config
        self.clock = clock
        self.secret = LineageSecret.load(config.keys_dir)
        self.lineage = LineageDB(config.lineage_db, self.secret, clock=clock)
        self._adapters: dict[str, Adapter] = {}

    @classmethod
    def open(cls, config_path: str | Path | None = None, *, clock: Clock = system_clock) -> "Tombstone":
        return cls(load_config(config_path), clock=clock)

    def close(self) -> None:
        for adapter in self._adapters.values():
            adapter.close()
        self._adapters.clear()
        self.lineage.close()

    def __enter__(self) -> "Tombstone":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def adapter(self, store: str) -> Adapter:
        """The adapter serving a configured store (opened once, then reused)."""
        if store not in self._adapters:
            if store not in self.config.stores:
                raise ConfigError(f"store {store!r} is not configured in {self.config.path}", store=store)
            cfg = self.config.stores[store]
            self._adapters[store] = open_adapter(store, cfg.backend, cfg.options)
        return self._adapters[store]

    def default_receipt_path(self, subject: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", subject)[:120] or "subject"
        return self.config.receipts_dir / f"{safe}.json"

    def erase(self, subject: str, *, out: str | Path | None = None,
              artifacts: list[tuple[str, str]] | None = None) -> tuple[dict[str, Any], Path]:
        """Erase a subject (or finish its interrupted erasure); return the receipt and where it was written.

        ``artifacts`` limits the erasure to some (store, id) pairs of the subject's lineage graph; anything
        outside it raises ScopeViolationError before anything is touched.
        """
        saga = Saga.start(self, subject, str(out) if out else None, artifacts=artifacts)
        receipt = saga.run()
        return receipt, saga.receipt_path

    def resume(self) -> list[tuple[dict[str, Any], Path]]:
        """Finish every saga that was interrupted."""
        done = []
        for row in self.lineage.sagas("running"):
            saga = Saga.resume(self, row["saga_id"])
            done.append((saga.run(), saga.receipt_path))
        return done
