"""Disk faults: the store's folder full (ENOSPC) or read-only (EROFS) between suppression and reclaim.

``CELLS`` maps ``"<backend>/<fault>"`` to a callable that runs ONE trial in a fresh directory and returns
``survivors_lost``, ``false_verified``, ``finished_on_resume``, ``dead_lettered`` and ``recovery_s`` (seconds
from lifting the fault to the erasure finished: ``tombstone resume``, or ``tombstone dlq retry`` when the saga
had ended with a dead letter). The trial is ``tombstone.testing.diskfaults.run_cell``, the same the tests
run; it builds its own three-subject demo deployment of the backend and needs root (it mounts a tmpfs). The
tests take their cells (``BACKENDS``, ``FAULTS``, ``HEADROOM``) from here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path


BACKENDS = ("chroma", "faiss", "qdrant", "docstore", "dataset", "lora", "exact_cache", "semantic_cache")
"""Every file-based store (pgvector's files belong to its server: its faults are the kill cells). The two caches
are built with the document store their answers came from (``diskfaults.NEEDS``)."""
FAULTS = ("enospc", "readonly")
HEADROOM = {"chroma": 64 * 1024}
"""Bytes left free when the disk fills (none elsewhere): Chroma's client cannot open a folder with no free page
at all (its write-ahead log), so the reclaim would never run; with 64 KiB it opens and its reclaim's writes
still fail."""


def trial(backend: str, fault: str, tmp: Path) -> dict:
    from tombstone.testing.diskfaults import build_template, run_cell, summary

    template = build_template(backend, Path(tmp))
    return summary(run_cell(template, backend, fault, Path(tmp) / "trial", headroom=HEADROOM.get(backend, 0)))


def _cells() -> dict[str, Callable[[Path], dict]]:
    return {f"{backend}/{fault}": partial(trial, backend, fault) for backend in BACKENDS for fault in FAULTS}


CELLS: dict[str, Callable[[Path], dict]] = _cells()
