"""Disk faults in the stores themselves: the store's folder full (ENOSPC) or read-only between its suppression
and its reclaim, on the real engines (``tombstone.testing.diskfaults``: each store on a tmpfs of its own).

Every cell checks that the fault really hit the erasure (the error the operator saw names it), that the CLI
said work remains while it held, that no erased artifact was VERIFIED without the probe running on the final
files (every VERIFIED claim re-checked by ``tombstone audit``), that the erasure finishes once the fault is
lifted (``resume``, ``dlq retry`` after a dead letter, or ``erase`` again where the receipt says so), and that
no survivor was lost, changed or stopped being found by a search with its own vector."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest

from tombstone.testing.diskfaults import MARKERS, StoreMount, build_template, mount_refused, run_cell

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from faults_disk import BACKENDS, FAULTS, HEADROOM  # the benchmark's cells: one table for both


@pytest.fixture(scope="module")
def can_mount():
    refused = mount_refused()
    if refused:
        pytest.skip(refused)


@pytest.fixture(scope="module")
def templates(tmp_path_factory, can_mount):
    built: dict[str, Path] = {}

    def template(backend: str) -> Path:
        if backend not in built:
            built[backend] = build_template(backend, tmp_path_factory.mktemp(backend))
        return built[backend]

    return template


def test_the_tmpfs_faults_are_real_and_lift(tmp_path, can_mount):
    """The control: a filled store folder refuses a new page with ENOSPC, a read-only one any write with
    EROFS; lifting either lets the write through, and unmounting keeps the files."""
    folder = tmp_path / "store"
    folder.mkdir()
    (folder / "data.bin").write_bytes(b"x" * 10_000)
    mount = StoreMount(folder)
    try:
        mount.fill()
        assert mount.free() == 0
        with pytest.raises(OSError) as full:
            (folder / "more.bin").write_bytes(b"y" * 8192)
        assert full.value.errno == errno.ENOSPC
        mount.lift()
        (folder / "more.bin").write_bytes(b"y" * 8192)
        mount.readonly()
        with pytest.raises(OSError) as ro:
            (folder / "data.bin").write_bytes(b"z")
        assert ro.value.errno == errno.EROFS
        mount.lift()
    finally:
        mount.unmount()
    assert (folder / "data.bin").read_bytes() == b"x" * 10_000 and (folder / "more.bin").stat().st_size == 8192
    assert not folder.is_mount()


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_fault_between_suppression_and_reclaim(templates, backend, fault, tmp_path):
    r = run_cell(templates(backend), backend, fault, tmp_path / "trial", headroom=HEADROOM.get(backend, 0))
    said = f"stderr: {r['stderr_during_fault']!r}; dead letters: {r['dead_letter_errors']}"
    # the fault really hit this erasure
    assert r["fault_seen"], said
    if fault == "enospc":
        assert r["free_bytes_during_fault"] <= HEADROOM.get(backend, 0)
    # (d) while it held, the CLI said work remains
    assert r["rc_during_fault"] == 3, said
    # (c) the store's artifacts are dead letters with a one-line reason, or the saga stopped in one line and
    # is left running for `tombstone resume`
    during = r["receipt_during_fault"]
    assert r["dead_lettered"] != r["running_during_fault"], said
    if r["dead_lettered"]:
        assert all("\n" not in e and e.strip() for e in r["dead_letter_errors"]), r["dead_letter_errors"]
        assert any(m in e.lower() for e in r["dead_letter_errors"] for m in MARKERS[fault]), said
        mine = [a for a in during["artifacts"] if a["store"] == backend]
        assert mine and all(a["status"] == "UNVERIFIED" and a["reason"].startswith("dlq: ") for a in mine), mine
    else:
        errors = [line for line in r["stderr_during_fault"].splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "tombstone resume" in errors[0], said
    # (b) nothing erased is VERIFIED on a receipt written while the reclaim could not run, and every VERIFIED
    # claim of any receipt is confirmed by `tombstone audit` on the final files
    if during is not None:
        assert not [a for a in during["artifacts"] if a["store"] == backend and a["status"] == "VERIFIED"]
    assert r["false_verified"] == 0
    # (c) once the fault is lifted the erasure finishes, and the store's artifacts end VERIFIED
    assert r["recovered"], f"rc {r['rc_after_lift']}: {r['stderr_after_lift']}"
    assert r["finished_on_resume"] == r["running_during_fault"]
    final = r["receipt_after_lift"]
    mine = [a for a in final["artifacts"] if a["store"] == backend]
    assert mine and all(a["status"] == "VERIFIED" for a in mine), [(a["status"], a["reason"]) for a in mine]
    # (a) no survivor lost, changed or unsearchable
    assert r["survivors_lost"] == 0, r["survivor_problems"]
    assert r["survivors_after"] == r["survivors_before"] - r["erased_in_census"] > 0


@pytest.mark.slow
def test_chroma_without_a_free_page_says_so_and_resumes(templates, tmp_path):
    """With no free page at all Chroma's own client cannot open the folder (its error was an AttributeError
    from inside the client): the saga stops before the reclaim, in one line naming the cause, and is left
    running for `tombstone resume`, which finishes it once there is room."""
    r = run_cell(templates("chroma"), "chroma", "enospc", tmp_path / "trial", headroom=0)
    assert r["free_bytes_during_fault"] == 0
    assert r["rc_during_fault"] == 3 and r["running_during_fault"] and not r["dead_lettered"]
    line = r["stderr_during_fault"].splitlines()[-1]
    assert "cannot open Chroma store" in line and "No space left on device" in line, line
    assert "AttributeError" not in r["stderr_during_fault"]
    assert r["recovered"] and r["finished_on_resume"], r["stderr_after_lift"]
    assert r["false_verified"] == 0 and r["survivors_lost"] == 0, r["survivor_problems"]
