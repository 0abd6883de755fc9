"""Declared copies — backups, snapshots, replicas, archives — until they expire (``tombstone backups``).

An erasure cannot reach a copy taken before it, but the copy does not live for ever. The operator declares each
one in the config (``[backups.NAME]``: the stores it copies, how many days each copy is kept, where it is
kept). Then:

* each erasure receipt lists, for every declared copy of a store that held erased records, the day the last
  copy taken before the erasure expires, marked "beyond use until overwritten" (the records are not restored
  into service; the copy is deleted by its own rotation);
* ``due`` lists the copies whose expiry has passed and that nobody has re-checked;
* ``recheck`` opens a restored copy (a directory, a file, a database) read-only with the store's own adapter,
  runs the physical probe for every erased record of the receipt on it, and seals the result as a follow-up
  receipt of the subject's chain (kind ``tombstone.backup-recheck-receipt``): "absent" confirms the rotation
  did its work, "found" shows the copy still holds the bytes (the control: a restore of a copy taken before the
  erasure), "unchecked" says it could not be read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError, TombstoneError

from tombstone.receipt.build import BEYOND_USE, backups_section as receipt_section  # noqa: F401  (re-exported)
LOCATION_KEYS = ("path", "persist_dir", "dsn")
"""The store option a restored copy replaces: the first of these the store's options have."""


def _sealed(lineage: Any, subject_key: str | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(row, json.loads(row["body"])) for row in lineage.receipts(subject_key)]


def _rechecked(sealed: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The re-checks done, by (erasure receipt hash, backup, store): the follow-up receipts' sections."""
    out = {}
    for _, receipt in sealed:
        section = receipt.get("backup_recheck")
        if section:
            out[(section["of_receipt"], section["backup"], section["store"])] = {**section,
                                                                                  "receipt_hash": receipt["receipt_hash"]}
    return out


def due(lineage: Any, today: dt.date) -> list[dict[str, Any]]:
    """Every (erasure receipt, declared copy, store) whose copy has expired by ``today``, with whether and how
    it was re-checked; those not re-checked are due."""
    sealed = _sealed(lineage)
    done = _rechecked(sealed)
    out = []
    for _, receipt in sealed:
        for copy in receipt.get("backups") or []:
            for store in copy["stores"]:
                expires = dt.date.fromisoformat(copy["expires_on"])
                check = done.get((receipt["receipt_hash"], copy["name"], store))
                out.append({"subject": receipt["subject"], "receipt_hash": receipt["receipt_hash"],
                            "sequence": receipt["sequence"], "backup": copy["name"], "store": store,
                            "where": copy["where"], "expires_on": copy["expires_on"], "expired": expires <= today,
                            "recheck": check})
    return out


def restored_options(config: Any, store: str, restored: str) -> tuple[dict[str, Any], str]:
    """The store's options with its location replaced by the restored copy's; returns them and the key."""
    spec = config.stores.get(store)
    if spec is None:
        raise ConfigError(f"store {store!r} is not configured")
    key = next((k for k in LOCATION_KEYS if k in spec.options), None)
    if key is None:
        raise ConfigError(f"store {store!r} has no location option ({', '.join(LOCATION_KEYS)}) a restored copy"
                          " could stand in for")
    value = restored
    if key != "dsn":
        path = Path(restored).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"--restored {restored}: nothing there (restore the copy first)")
        value = str(path)
    elif not restored.startswith(("postgresql://", "postgres://")):
        raise ConfigError("--restored must be a postgresql:// DSN for a store kept in a database (the one the copy was"
                          " restored into)")
    return {**spec.options, key: value}, key


def probe_restored(config: Any, receipt: Mapping[str, Any], backup: str, store: str, restored: str
                   ) -> dict[str, Any]:
    """Open the restored copy read-only with the store's adapter and run the physical probe for each record the
    receipt erased from ``store``; the ``backup_recheck`` section of the follow-up receipt."""
    from tombstone.contract import adapter_class
    from tombstone.lineage.records import ArtifactRecord
    from tombstone.lineage.postgres import redact_dsn

    options, key = restored_options(config, store, restored)
    backend = config.stores[store].backend
    records = [ArtifactRecord(store=store, artifact_id=e["artifact_id"], backend=e.get("backend", backend),
                              kind=e.get("kind", ""))
               for e in receipt.get("artifacts", []) if e["store"] == store and e.get("status") != "OUT_OF_SCOPE"]
    shown = redact_dsn(restored) if key == "dsn" else options[key]
    section: dict[str, Any] = {"backup": backup, "store": store, "backend": backend, "restored": shown,
                               "of_receipt": receipt["receipt_hash"]}
    try:
        adapter = adapter_class(backend).open_read_only(store, options)
        try:
            results = adapter.probe_physical(records)
        finally:
            adapter.close()
    except TombstoneError as exc:
        section.update(result="unchecked", evidence={"why": str(exc)},
                       records=[{"artifact_id": r.artifact_id, "found": None, "measurement": None} for r in records])
        return section
    rows = [{"artifact_id": r.artifact_id, "found": not results[r.artifact_id].passed,
             "measurement": results[r.artifact_id].measurement} for r in records]
    section.update(records=rows, result="found" if any(r["found"] for r in rows) else "absent",
                   evidence={"patterns": "the record ids, as the store writes them (the receipt holds no content)"})
    return section


def recheck(tomb: Any, subject: str, backup: str, restored: str, store: str | None = None) -> tuple[dict[str, Any], Path]:
    """Re-check a restored copy of ``backup`` for the subject's latest erasure receipt that lists it; seal the
    follow-up receipt and return it with its file."""
    from tombstone.saga import Saga

    key = tomb.lineage.subject_key(subject)
    listed = [(receipt, copy) for _, receipt in _sealed(tomb.lineage, key)
              for copy in receipt.get("backups") or [] if copy["name"] == backup]
    if not listed:
        raise ConfigError(f"no sealed erasure receipt of this subject lists backup {backup!r}")
    receipt, copy = listed[-1]
    if store is None:
        if len(copy["stores"]) > 1:
            raise ConfigError(f"backup {backup!r} copies {', '.join(copy['stores'])}: name the one restored with --store")
        store = copy["stores"][0]
    elif store not in copy["stores"]:
        raise ConfigError(f"the receipt lists backup {backup!r} for {', '.join(copy['stores'])}, not {store!r}")
    section = probe_restored(tomb.config, receipt, backup, store, restored)
    statement = (f"re-check of {backup} ({copy['where']}) restored at {section['restored']}, for store {store}, after"
                 f" it expired on {copy['expires_on']}: {section['result']}")
    saga = Saga.start_backup_recheck(tomb.context, subject, section, statement)
    result = tomb._under_way([saga.subject], saga.run)
    return result, saga.receipt_path


__all__ = ["BEYOND_USE", "due", "probe_restored", "receipt_section", "recheck", "restored_options"]
