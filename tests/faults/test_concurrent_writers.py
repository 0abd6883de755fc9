"""Another process writes to a store while an erasure reclaims it (real stores, real processes).

The writer is a process of its own that writes new subjects one after another: through Tombstone's wrappers
as an app would, or raw through the store's own client (no lineage, and, where the client does not know
of it, no store lock). The erasing process stops inside the reclaim, holding the store's lock, until a
write of the writer is under way (``census_conc``): the fault really happens in every cell, which each test
checks first (the control). Then: no survivor lost (every other subject's records, those from before and
those the writer added, present with their vectors and found by them), no erased record reported VERIFIED
that the final files contradict (``tombstone audit`` once the writer has stopped), and the erasure
finished, or says that work remains (exit 3) and ``resume`` finishes it or the dead-letter list names why.
A raw Chroma client is the exception: Chroma's embedded clients are not safe across processes, so while one
of another process holds the store the erasure changes nothing (exit 2, naming it), and runs once it is closed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if str(Path(__file__).parent) not in sys.path:  # the helpers beside it, whether or not tests/faults is a package
    sys.path.insert(0, str(Path(__file__).parent))

from census_conc import VECTOR_BACKENDS, writer_cell

CELLS = [pytest.param(backend, mode, id=f"{backend}-{mode}", marks=[pytest.mark.slow])
         for backend in VECTOR_BACKENDS for mode in ("wrapper", "raw")]


def _check(result: dict, backend: str, mode: str) -> None:
    if (backend, mode) == ("chroma", "raw"):
        _check_refused(result)
        return
    # the control: a write was under way while the reclaim held the store, and writes returned after it
    assert result["attempt"], "the writer never wrote while the reclaim held the store"
    assert result["after_attempt"] >= 1 and result["added"], result["writer_errors"]
    assert result["receipt"], result["erase_err"]
    assert result["erase_code"] in (0, 3), result["erase_err"]
    if result["erase_code"] == 3:  # work remains: resume finishes it, or a dead letter says why in one line
        assert result["finished_on_resume"] or result["dead_lettered"], result["resume"]
        for letter in result["dead"]:
            assert letter["error"] and "\n" not in letter["error"], letter
    else:
        assert not result["dead_lettered"], result["dead"]
    assert result["survivors_lost"] == 0, f"survivors lost: {result['lost']}"
    if not result["dead_lettered"]:
        assert result["still_there"] == [], "the erased records are still in the store"
    assert result["false_verified"] == 0, (
        f"VERIFIED on the receipt, contradicted by the final files: {result['false_verified_ids']}")


def _check_refused(result: dict) -> None:
    """Chroma's embedded clients are not safe across processes: one that loaded the collection writes its own
    copy of the vector index back over an erasure (erased vectors included), and can lose its own writes when
    the files change under it. With a raw client of another process open on the store, the erasure changes
    nothing: one line naming that process, exit 2, every record where it was. With the writer stopped, the
    erasure run again is VERIFIED, and the auditor's scan of the final files agrees."""
    err = result["erase_err"].strip()
    assert result["erase_code"] == 2, err
    assert "\n" not in err and "outside Tombstone" in err and f"pid {result['writer_pid']}" in err, err
    assert "nothing was changed" in err, err
    # the control: the writer held its client open and wrote throughout (before the erasure and after it)
    assert result["added"] and result["writer_errors"] == "", result["writer_errors"]
    assert result["refused_left"] == result["erased"], "the refused erasure changed the erased records"
    assert result["survivors_lost"] == 0, f"survivors lost: {result['lost']}"
    assert result["again"] is not None and result["again"][0] == 0, result["again"]
    assert result["still_there"] == [] and result["verified"] == result["erased"], result["again"]
    assert result["audit_code"] == 0 and result["false_verified"] == 0, result["false_verified_ids"]


@pytest.mark.parametrize("backend,mode", CELLS)
def test_a_writer_in_another_process_during_the_reclaim(tmp_path, backend, mode):
    result = writer_cell(tmp_path, backend, mode)
    if backend == "qdrant":
        # local mode opens the folder for one client at a time: the wrapper waits for the erasure to hand it
        # over (no write fails); a raw client is refused while the erasure has it open, and writes after
        if mode == "wrapper":
            assert result["writer_errors"] == ""
        else:
            assert "already accessed by another instance" in result["writer_errors"]
    _check(result, backend, mode)
