"""Disk faults under a real erasure: the store's folder fills up (ENOSPC) or turns read-only (EROFS) between
its suppression and its reclaim.

Used by ``tests/faults/test_disk.py`` and ``benchmarks/faults_disk.py``. Needs root (it mounts): a cell
builds a one-backend demo deployment, puts the store's folder on its own tmpfs, runs ``tombstone erase`` and
kills it (SIGKILL) just before the store's reclaim, puts the fault in place, runs ``tombstone resume`` with
the fault held, lifts the fault (the tmpfs grown again, or remounted read-write) and runs ``tombstone resume``
again (``tombstone dlq retry`` when the saga ended with a dead letter, ``tombstone erase`` again when it ended
with a receipt that only says what to do). It reports what the operator and an
auditor would see:

- ``survivors_lost``: survivors (every record not erased) lost, changed or not found by a search with their
  own vector, counted with :mod:`tombstone.testing.census`;
- ``false_verified``: VERIFIED claims on a receipt that ``tombstone audit`` does not confirm on the final files;
- ``finished_on_resume`` / ``dead_lettered``: how the saga ended; ``recovery_s``: from lifting the fault to
  the erasure finished.

The full-disk fault leaves the tmpfs no free page at all (its size shrunk to what it holds), so any write that
needs a new page fails; a write in place into pages already held would not, and ``fault_seen`` says whether
the error the operator saw names the fault (``No space left on device``, SQLite's ``database or disk is
full``, ``Read-only file system``...).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tombstone.config import load_config
from tombstone.testing import census as census_mod
from tombstone.testing.crash import SUBJECT, cli, copy_deployment, release_stores

FAULTS = ("enospc", "readonly")
NEEDS = {"exact_cache": ("docstore",), "semantic_cache": ("docstore",)}
"""What a backend's demo store is built from besides itself: a cached answer's source documents, without which
the cache entry's erasure is UNVERIFIED (a lineage gap) whatever the fault did."""
MARKERS = {
    "enospc": ("no space left on device", "enospc", "errno 28", "database or disk is full"),
    "readonly": ("read-only file system", "erofs", "errno 30", "readonly database", "read-only", "not writable"),
}


def mount_refused() -> str | None:
    """Why this process cannot mount a tmpfs (None when it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (run as root, as CI does)"
    probe = Path(f"/tmp/tombstone-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            return f"mount -t tmpfs is not permitted here: {done.stderr.strip()}"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    finally:
        probe.rmdir()


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {done.stderr.strip()}")


class StoreMount:
    """The folder ``path`` moved onto a tmpfs of its own (same files, modes and times); ``fill`` leaves it no
    free page, ``readonly`` remounts it read-only, ``lift`` undoes either; ``unmount`` puts the files back on
    the disk underneath."""

    ROOMY = 512 * 1024 * 1024

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        staged = self.path.with_name(self.path.name + ".staged")
        self.path.rename(staged)
        self.path.mkdir(mode=staged.stat().st_mode & 0o7777)
        try:
            _mount("-t", "tmpfs", "-o", f"size={self.ROOMY},mode={staged.stat().st_mode & 0o7777:o}", "tmpfs",
                   str(self.path))
        except RuntimeError:
            self.path.rmdir()
            staged.rename(self.path)
            raise
        self.mounted = True
        shutil.copytree(staged, self.path, dirs_exist_ok=True, symlinks=True)
        shutil.rmtree(staged)

    def used(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, headroom: int = 0) -> None:
        """``headroom`` bytes free (rounded up to a page), no more: the size shrunk to what the files hold."""
        _mount("-o", f"remount,size={max(self.used() + headroom, 4096)}", str(self.path))

    def readonly(self) -> None:
        _mount("-o", "remount,ro", str(self.path))

    def lift(self) -> None:
        _mount("-o", f"remount,rw,size={self.ROOMY}", str(self.path))

    def unmount(self) -> None:
        """Copy the files back onto the disk under the mount point, then unmount."""
        if not self.mounted:
            return
        keep = self.path.with_name(self.path.name + ".kept")
        try:
            shutil.copytree(self.path, keep, symlinks=True)
        finally:
            done = subprocess.run(["umount", str(self.path)], capture_output=True)
            if done.returncode != 0:  # a file some process still holds open: detach it now, freed when closed
                subprocess.run(["umount", "-l", str(self.path)], check=True)
            self.mounted = False
        shutil.rmtree(self.path)
        keep.rename(self.path)


def build_template(backend: str, base: Path) -> Path:
    """A demo deployment of ``backend`` (and what it is built from, ``NEEDS``) with three subjects, nothing
    erased."""
    template = base / f"template-{backend}"
    backends = ",".join((backend, *NEEDS.get(backend, ())))
    built = cli("demo", "--workdir", str(template), "--backends", backends, "--subjects", "3", "--erase", "none")
    if built.returncode != 0:
        raise RuntimeError(f"demo of {backend} failed: {built.stderr[-800:]}")
    release_stores(template)
    return template


def store_folder(config_path: Path, store: str) -> Path:
    path = Path(load_config(config_path).stores[store].options["path"])
    return path if path.is_dir() else path.parent


def erased_ids(config_path: Path, subject: str = SUBJECT) -> set[tuple[str, str]]:
    """Every (store, artifact id) the subject's erasure takes (the lineage closure)."""
    from tombstone import Tombstone

    with Tombstone.open(config_path) as tomb:
        key = tomb.lineage.subject_key(subject)
        return {(art.store, art.artifact_id) for art, _why in tomb.lineage.closure(key)}


def saga_state(config_path: Path) -> dict[str, Any]:
    """Running sagas and open dead letters (their one-line errors)."""
    from tombstone import Tombstone

    with Tombstone.open(config_path) as tomb:
        return {"running": [s["saga_id"] for s in tomb.lineage.sagas("running")],
                "dead_letters": [dict(d) for d in tomb.lineage.dead_letters("open")]}


def audit_disagreements(config_path: Path, receipt: Path) -> int:
    """VERIFIED claims of ``receipt`` that ``tombstone audit`` re-probing the final files does not confirm."""
    body = json.loads(receipt.read_text())
    verified = [a for a in body["artifacts"] if a["status"] == "VERIFIED"]
    if not verified:
        return 0
    done = cli("audit", str(receipt), "--config", str(config_path), "--json")
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return len(verified)  # no report: nothing is confirmed
    confirmed = sum(1 for a in report.get("artifacts", [])
                    if str(a.get("receipt_says", "")).startswith("VERIFIED") and a.get("verdict") == "agree")
    return len(verified) - confirmed


def run_cell(template: Path, backend: str, fault: str, root: Path, headroom: int = 0) -> dict[str, Any]:
    """One trial of ``fault`` on ``backend``'s store (see the module's docstring); ``root`` must not exist.
    ``headroom``: bytes left free when the disk fills (a client that cannot open a folder with no free page
    at all never reaches its reclaim)."""
    copy_deployment(template, root)
    config = root / "tombstone.toml"
    store = backend
    erased = erased_ids(config)
    before = census_mod.census(config)
    mount = StoreMount(store_folder(config, store))
    out: dict[str, Any] = {"backend": backend, "fault": fault, "survivors_before": census_mod.count(before),
                           "erased": len(erased),
                           "erased_in_census": sum((s, i) in erased for s, ids in before.items() for i in ids)}
    try:
        killed = cli("erase", SUBJECT, "--config", str(config), env={"TOMBSTONE_KILL_AT": f"saga:reclaim:{store}:before"})
        if killed.returncode != -signal.SIGKILL:
            raise RuntimeError(f"erase was not stopped before the reclaim (rc {killed.returncode}): {killed.stderr[-800:]}")
        if fault == "enospc":
            mount.fill(headroom)
            out["free_bytes_during_fault"] = mount.free()
        else:
            mount.readonly()
        held = cli("resume", "--config", str(config))
        state = saga_state(config)
        receipt = root / "receipts" / f"{SUBJECT}.json"
        out["rc_during_fault"] = held.returncode
        out["stderr_during_fault"] = held.stderr.strip()
        out["dead_letter_errors"] = [d["error"] for d in state["dead_letters"]]
        said = " ".join([held.stderr, held.stdout, *out["dead_letter_errors"]]).lower()
        out["fault_seen"] = any(m in said for m in MARKERS[fault])
        out["dead_lettered"] = bool(state["dead_letters"])
        out["running_during_fault"] = bool(state["running"])
        out["false_verified"] = audit_disagreements(config, receipt) if receipt.exists() else 0
        out["receipt_during_fault"] = json.loads(receipt.read_text()) if receipt.exists() else None
        start = time.perf_counter()
        mount.lift()
        if state["running"]:
            after = cli("resume", "--config", str(config))
            out["finished_on_resume"] = after.returncode == 0 and not saga_state(config)["running"]
        elif state["dead_letters"]:
            after = cli("dlq", "retry", "--config", str(config))
            out["finished_on_resume"] = False
        else:  # the saga ended with a receipt whose action is to erase again (a reclaim that could not run)
            after = cli("erase", SUBJECT, "--config", str(config))
            out["finished_on_resume"] = False
        out["recovery_s"] = time.perf_counter() - start
        out["rc_after_lift"] = after.returncode
        out["stderr_after_lift"] = after.stderr.strip()
        out["recovered"] = after.returncode == 0 and not saga_state(config)["running"]
        latest = max((root / "receipts").glob("*.json"), key=lambda p: p.stat().st_mtime_ns, default=None)
        if latest is not None and (latest != receipt or out["receipt_during_fault"] is None):
            out["false_verified"] += audit_disagreements(config, latest)
            out["receipt_after_lift"] = json.loads(latest.read_text())
        now = census_mod.census(config)
        problems = census_mod.compare(before, now, erased) + census_mod.unsearchable(config, now)
        out["survivor_problems"] = problems
        out["survivors_lost"] = len(problems)
        out["survivors_after"] = census_mod.count(now)
        return out
    finally:
        release_stores(root)
        mount.unmount()


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The five figures a benchmark cell reports."""
    return {k: result[k] for k in ("survivors_lost", "false_verified", "finished_on_resume", "dead_lettered",
                                   "recovery_s")}


__all__ = ["FAULTS", "NEEDS", "StoreMount", "build_template", "mount_refused", "run_cell", "summary"]
