"""``tombstone scan``: how much deleted data a store still holds today, without the lineage db.

A scan is read-only: the backend's :meth:`~tombstone.contract.Adapter.scan_deleted` reads a private copy of
whatever its client would write to on opening (``tombstone.fsutil.Snapshot``) and never changes a byte of
the store. It reports, per place (a file, a table, a segment), what the store itself marks deleted or
unreachable but still holds: counts and bytes, and — only when asked — the ids it can recover. Never
content.

The core knows no backend: each adapter package implements ``scan_deleted`` (in its ``forensics``
module), and this module only finds the store, calls it and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tombstone.errors import ConfigError
from tombstone.scanreport import ScanPlace, ScanReport


def scan_options(store: str, backend: str, options: Mapping[str, Any]) -> ScanReport:
    """Scan one store given its backend and options (no deployment needed)."""
    from tombstone.contract import adapter_class

    cls = adapter_class(backend)
    try:
        report = cls.scan_deleted(store, dict(options))
    except NotImplementedError as exc:
        raise ConfigError(str(exc) or f"the {backend} adapter cannot scan for deleted data", store=store) from exc
    return report


def scan_configured(config_path: str | None, store: str) -> ScanReport:
    """Scan the store ``store`` of a configuration file (only its ``[stores]`` are read)."""
    from tombstone.config import load_config

    config = load_config(config_path)
    if store not in config.stores:
        known = ", ".join(sorted(config.stores)) or "none"
        raise ConfigError(f"no store {store!r} in {config.path} (stores: {known})")
    sc = config.stores[store]
    return scan_options(sc.name, sc.backend, sc.options)


__all__ = ["ScanPlace", "ScanReport", "scan_configured", "scan_options"]
