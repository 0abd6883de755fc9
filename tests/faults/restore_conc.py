"""One trial of a restored-backup cell: the store's files, copied before an erasure, are put back after it
(an app restoring a backup), and the receipt of the erasure no longer holds.

``tombstone audit`` is the command that can tell: it re-probes every artifact the receipt names in the
stores as they are now. ``tombstone scan`` cannot (it looks for what a store's own client deleted; a
restored record is live, not deleted), nor can ``tombstone check`` (it erases canaries of its own in a
scratch place): each cell records what they say, so the tests can show it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from census_conc import ERASED, audit_rows, build, cli, release

from tombstone.testing.diskfaults import NEEDS  # what a cache is built from besides itself

FILE_BACKENDS = ("chroma", "faiss", "qdrant", "docstore", "dataset", "lora", "exact_cache", "semantic_cache")


def restore_cell(root: Path, backend: str) -> dict[str, Any]:
    """Build a deployment with ``backend``'s demo store (and what it is built from), back up the store's
    folder, erase ``user-0001``, audit the receipt (the control), put the backup back, audit again, and
    scan the store. Returns what each said."""
    root.mkdir(parents=True, exist_ok=True)
    config = build(root / "deploy", [backend, *NEEDS.get(backend, ())])
    try:
        folder = config.parent / "stores" / backend
        backup = root / "backup"
        shutil.copytree(folder, backup, symlinks=True)
        erased = cli("erase", ERASED, "--config", str(config))
        receipt = config.parent / "receipts" / f"{ERASED}.json"
        body = json.loads(receipt.read_text()) if receipt.exists() else {"artifacts": []}
        mine = {a["artifact_id"] for a in body["artifacts"] if a["store"] == backend}
        before_code, before_rows, _ = audit_rows(config, receipt)
        started = time.monotonic()
        shutil.rmtree(folder)
        shutil.copytree(backup, folder, symlinks=True)  # the backup taken before the erasure comes back
        after = cli("audit", str(receipt), "--config", str(config.parent.parent / "deploy-auditor" / "stores.toml"),
                    "--key", str(config.parent / "keys" / "signing.pub"))
        after_code, after_rows, _ = audit_rows(config, receipt)
        detect_s = time.monotonic() - started
        scan = cli("scan", "--config", str(config), "--store", backend)
        contradicted = {r["artifact_id"] for r in after_rows if r["verdict"] == "contradicted"}
        return {
            "survivors_lost": 0, "false_verified": 0 if after_code == 1 else 1, "finished_on_resume": False,
            "dead_lettered": False, "recovery_s": detect_s,
            "erase_code": erased.returncode, "erase_out": erased.stdout + erased.stderr, "mine": sorted(mine),
            "statuses": sorted({a["status"] for a in body["artifacts"] if a["store"] == backend}),
            "before_code": before_code, "before_verdicts": {r["artifact_id"]: r["verdict"] for r in before_rows},
            "after_code": after_code, "after_text": after.stdout, "contradicted": sorted(contradicted),
            "after_found": {r["artifact_id"]: r["audit_found"] for r in after_rows},
            "scan_code": scan.returncode, "scan_out": scan.stdout + scan.stderr,
        }
    finally:
        release(config)
