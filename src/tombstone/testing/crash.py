"""Crash-and-resume trials: kill ``tombstone erase`` with SIGKILL at a named point, resume, compare.

Used by the test suite (``tests/core/test_crash_resume.py``) and by ``benchmarks/run.py`` for RESULTS.md. A
trial copies a template deployment, runs ``tombstone erase`` in a subprocess with ``TOMBSTONE_KILL_AT``
set, runs ``tombstone resume`` (or ``erase`` again when the kill came before the saga existed), and
compares the receipt's statuses and every store's survivors with a clean run on an identical copy.
Survivors are read with each backend's own client, not through Tombstone's wrappers or probes
(``Adapter.read_survivors``) and compared with ``Adapter.survivors_equal`` (Chroma vectors may differ by
2 float32 ULPs, as Chroma re-normalises on every indexing; everything else must be byte-identical). The
harness names no backend: the deployments it copies say which stores they hold.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tombstone.config import load_config
from tombstone.contract import adapter_class

SUBJECT = "user-0001"


def cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}, cwd=cwd, timeout=300)


def _stores(root: Path) -> list[tuple[Any, dict]]:
    """(adapter class, options) of every store of the deployment at ``root``."""
    config = load_config(root / "tombstone.toml")
    return [(adapter_class(cfg.backend), cfg.options) for _, cfg in sorted(config.stores.items())]


def copy_deployment(src: Path, dst: Path) -> None:
    """Copy a deployment; each store then fixes what a copy breaks (``Adapter.after_copy``)."""
    shutil.copytree(src, dst)
    for cls, options in _stores(dst):
        cls.after_copy(options)


def release_stores(root: Path) -> None:
    """Stop whatever this process or its children started for the deployment's stores (``Adapter.release``)."""
    if (root / "tombstone.toml").exists():
        for cls, options in _stores(root):
            cls.release(options)


def statuses(root: Path) -> dict:
    receipt = json.loads((root / "receipts" / f"{SUBJECT}.json").read_text())
    return {(a["store"], a["artifact_id"]): (a["status"], a["level"], a["reason"]) for a in receipt["artifacts"]}


def survivors(root: Path) -> dict:
    """Every surviving record of every store, read with each vendor's client (``Adapter.read_survivors``)."""
    config = load_config(root / "tombstone.toml")
    return {name: (cfg.backend, adapter_class(cfg.backend).read_survivors(cfg.options))
            for name, cfg in sorted(config.stores.items())}


def same_survivors(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(a[k][0] == b[k][0] and adapter_class(a[k][0]).survivors_equal(a[k][1], b[k][1]) for k in a)


def prepare(backends: str, base: Path) -> dict:
    """Build a template demo deployment of ``backends`` (comma-separated), run it cleanly once; return
    template, statuses, survivors and the kill points the clean run passed (step boundaries' before/done
    excluded: they repeat acting/acted)."""
    template = base / "template"
    built = cli("demo", "--workdir", str(template), "--backends", backends, "--subjects", "3", "--erase", "none")
    if built.returncode != 0:
        raise RuntimeError(built.stderr)
    release_stores(template)
    clean = base / "clean"
    copy_deployment(template, clean)
    listing = base / "points.txt"
    ran = cli("erase", SUBJECT, "--config", str(clean / "tombstone.toml"), env={"TOMBSTONE_LIST_KILL_POINTS": str(listing)})
    if ran.returncode != 0:
        raise RuntimeError(ran.stderr)
    points = [p for p in listing.read_text().split() if not p.endswith((":before#1", ":done#1"))]
    prepared = {"template": template, "statuses": statuses(clean), "survivors": survivors(clean), "points": points}
    release_stores(clean)
    return prepared


def run_trial(root: Path, point: str, expected: dict) -> str | None:
    config = str(root / "tombstone.toml")
    killed = cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": point})
    if killed.returncode != -signal.SIGKILL:
        return f"not killed (rc {killed.returncode}): {killed.stderr[-500:]}"
    if point.startswith("saga:create:before"):
        # killed before the saga existed: nothing to resume, the operator runs erase again
        resumed = cli("erase", SUBJECT, "--config", config)
    else:
        resumed = cli("resume", "--config", config)
        if "no interrupted erasure" in resumed.stdout:
            return "resume found nothing to resume"
    if resumed.returncode != 0:
        said = (resumed.stderr.strip() or resumed.stdout.strip())[-1500:]
        return f"resume failed (rc {resumed.returncode}): {said}"
    if not (root / "receipts" / f"{SUBJECT}.json").exists():
        return "no receipt after resume"
    if statuses(root) != expected["statuses"]:
        return f"statuses differ from the clean run: {statuses(root)}"
    if not same_survivors(survivors(root), expected["survivors"]):
        return "survivors differ from the clean run"
    return None


def run_trials(prepared: dict, workdir: Path) -> list[tuple[str, str | None]]:
    """Every kill point of a prepared template: (point, problem or None)."""
    results = []
    for n, point in enumerate(prepared["points"]):
        root = workdir / f"trial-{n}"
        copy_deployment(prepared["template"], root)
        try:
            results.append((point, run_trial(root, point, prepared)))
        finally:
            release_stores(root)
            shutil.rmtree(root, ignore_errors=True)
    return results
