"""Building a receipt body from the decided findings of a saga (the signing is ``signing.sign``)."""

from __future__ import annotations

import datetime as dt

from collections.abc import Mapping, Sequence
from typing import Any

from tombstone.lineage.records import ArtifactRecord
from tombstone.receipt.sealing import seal
from tombstone.receipt.signing import RECEIPT_KIND, RECEIPT_KINDS, SCHEMA_VERSION
from tombstone.verify.levels import Status, StatusKind
from tombstone.version import __version__

ALWAYS_OUT_OF_SCOPE = (
    ("backups", "backups and snapshots taken outside the configured store files are not probed"),
    ("write-ahead logs and archives", "WAL segments shipped or archived outside the store files are not probed"),
    ("replicas", "replicas and mirrors of the stores are not probed"),
    ("provider logs", "logs kept by hosting providers and API gateways cannot be reached"),
    ("copies outside the wrappers", "data copied by code that did not go through a Tombstone wrapper has no lineage"),
)
"""What no probe of this tool reaches; every receipt says so explicitly."""


def status_record(status: Status) -> dict[str, Any]:
    """A decided status as the receipt (and the journal) records it."""
    return {
        "status": status.kind.value,
        "level": status.level.value if status.level else None,
        "reason": status.reason,
        "measurement": status.measurement,
        "action": status.action,
    }


def artifact_entry(art: ArtifactRecord, decided: Mapping[str, Any], *, scope: str, suppression: Mapping[str, Any],
                   reclaim: Mapping[str, Any] | None, auditors: Sequence[Any] = ()) -> dict[str, Any]:
    """One artifact's entry: its status (``decided["status"]``) and the evidence of every step.

    The fingerprint never goes on the receipt in the clear: it is sealed to each of ``auditors`` (their
    X25519 public keys, ``receipt.sealing``), or left out when there are none."""
    entry = {
        "artifact_id": art.artifact_id,
        "store": art.store,
        "backend": art.backend,
        "kind": art.kind,
        **decided["status"],
        "fingerprint": None,
        "inv_norm": None,
        "evidence": {
            "scope": scope,
            "suppression": {"recorded": True, **suppression},
            "reclaim": dict(reclaim) if reclaim else None,
            "probes": decided["probes"],
        },
    }
    if decided.get("probe_capture"):  # its fragment probes were never recorded (tombstone.capture.pending)
        entry["evidence"]["probe_capture"] = dict(decided["probe_capture"])
    if art.fingerprint is not None and auditors:
        entry["sealed_patterns"] = seal({"fingerprint": list(art.fingerprint), "inv_norm": art.inv_norm}, auditors)
    return entry


def summary(entries: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many artifacts ended with each status."""
    counts = {kind.value: 0 for kind in StatusKind}
    for entry in entries:
        counts[entry["status"]] += 1
    return counts


def receipt_body(*, subject: str, saga_id: str, sequence: int, started_at: str, finished_at: str,
                 entries: Sequence[Mapping[str, Any]], previous_receipt_hash: str | None,
                 statement: str | None = None, kind: str = RECEIPT_KIND,
                 store_reclaim: Mapping[str, Any] | None = None, backups: Sequence[Mapping[str, Any]] = (),
                 backup_recheck: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The body that is hashed and signed: everything but ``receipt_hash`` and ``signature``. ``kind`` is
    ``RECEIPT_KIND`` for a subject's erasure, ``SOURCE_RECEIPT_KIND`` for named records of a source,
    ``STORE_RECLAIM_KIND`` for a whole store's reclaim (whose ``store_reclaim`` section says what was done
    and what the scan counted before and after)."""
    if kind not in RECEIPT_KINDS:
        raise ValueError(f"unknown receipt kind {kind!r}")
    body = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "subject": subject,
        "saga_id": saga_id,
        "sequence": sequence,
        "started_at": started_at,
        "finished_at": finished_at,
        "tool": {"name": "tombstone-rag", "version": __version__},
        "artifacts": list(entries),
        "out_of_scope": [{"what": w, "status": "OUT_OF_SCOPE", "reason": r} for w, r in ALWAYS_OUT_OF_SCOPE],
        "summary": summary(entries),
        "previous_receipt_hash": previous_receipt_hash,
    }
    if statement:
        body["statement"] = statement
    if store_reclaim is not None:
        body["store_reclaim"] = dict(store_reclaim)
    if backups:
        body["backups"] = [dict(b) for b in backups]
    if backup_recheck is not None:
        body["backup_recheck"] = dict(backup_recheck)
    return body


BEYOND_USE = "beyond use until overwritten"
"""The status of a declared copy that still holds erased records (``tombstone.backups``)."""


def backups_section(backups: Sequence[Any], entries: Sequence[Mapping[str, Any]], finished: dt.datetime
                    ) -> list[dict[str, Any]]:
    """The ``backups`` section of an erasure receipt: each declared copy of a store with erased records in
    ``entries`` (those kept by an exception are not erased, so not counted), with its expiry."""
    erased: dict[str, int] = {}
    for entry in entries:
        if entry.get("status") != "OUT_OF_SCOPE":
            erased[entry["store"]] = erased.get(entry["store"], 0) + 1
    out = []
    for backup in backups:
        stores = [s for s in backup.stores if erased.get(s)]
        if not stores:
            continue
        out.append({"name": backup.name, "kind": backup.kind, "where": backup.where, "stores": stores,
                    "records": sum(erased[s] for s in stores), "retention_days": backup.retention_days,
                    "expires_on": (finished.date() + dt.timedelta(days=backup.retention_days)).isoformat(),
                    "status": BEYOND_USE})
    return out


def pretty(receipt: Mapping[str, Any], *, finite: bool = False) -> bytes:
    """The receipt as the file delivered to the operator: indented, sorted keys, UTF-8.

    orjson writes it: the standard library's encoder leaves its C code for Python once asked to indent, which
    made printing a batch's receipts cost more than erasing the batch. A value orjson refuses or would bend
    (an integer past 64 bits; a NaN or infinity, which it writes as null and a receipt never holds) goes to
    the standard library, which writes it exactly or refuses it. ``finite=True`` says the caller has already
    encoded this receipt with NaN and infinity refused (its canonical bytes), so that check is not repeated."""
    import json

    import orjson

    try:
        if not finite:
            json.dumps(receipt, allow_nan=False)  # C code: refuses a NaN or infinity before orjson could bend it
        return orjson.dumps(receipt, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
    except (ValueError, TypeError):
        pass
    return (json.dumps(receipt, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


__all__ = ["ALWAYS_OUT_OF_SCOPE", "artifact_entry", "pretty", "receipt_body", "status_record", "summary"]
