"""Faults in the stores themselves: a writer in another process during the reclaim, and a backup restored
after the erasure. One trial per call, in a fresh directory.

``CELLS[name](directory)`` runs one trial of a cell and returns ``survivors_lost`` (other subjects' records
gone, changed or no longer found by their own vector), ``false_verified`` (erased records the receipt calls
VERIFIED that ``tombstone audit`` finds in the final files; for a restored-backup cell, 1 when the audit
still says the receipt holds after the restore, a miss, else 0), ``finished_on_resume`` (the erasure exited
3 and ``tombstone resume`` finished it), ``dead_lettered`` and ``recovery_s`` (writer cells: from the
writer's start to the erasure finished, resume included; restore cells: from the restore to the audit's
verdict).

The cells are the tests' (``tests/faults/census_conc.py``, ``restore_conc.py``): a writer cell starts a
writer process (``wrapper``: new subjects through Tombstone's wrappers; ``raw``: records through the store's
own client) and an erasing process that waits, inside the reclaim and holding the store's lock, until one
of the writer's writes is under way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

FAULTS = Path(__file__).resolve().parent.parent / "tests" / "faults"


def _modules():
    if str(FAULTS) not in sys.path:
        sys.path.insert(0, str(FAULTS))
    import census_conc
    import restore_conc

    return census_conc, restore_conc


_KEYS = ("survivors_lost", "false_verified", "finished_on_resume", "dead_lettered", "recovery_s")


def _writer(backend: str, mode: str) -> Callable[[Path], dict]:
    def trial(directory: Path) -> dict:
        result = _modules()[0].writer_cell(Path(directory), backend, mode)
        return {k: result[k] for k in _KEYS}
    return trial


def _restore(backend: str) -> Callable[[Path], dict]:
    def trial(directory: Path) -> dict:
        result = _modules()[1].restore_cell(Path(directory), backend)
        return {k: result[k] for k in _KEYS}
    return trial


CELLS: dict[str, Callable[[Path], dict]] = {
    **{f"writer-{backend}-{mode}": _writer(backend, mode)
       for backend in ("chroma", "faiss", "qdrant", "pgvector") for mode in ("wrapper", "raw")},
    **{f"restored-{backend}": _restore(backend)
       for backend in ("chroma", "faiss", "qdrant", "docstore", "dataset", "lora", "exact_cache", "semantic_cache")},
}
