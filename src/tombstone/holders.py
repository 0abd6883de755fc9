"""Which other processes hold a store's files open, and whether Tombstone knows them.

An embedded store's client can keep part of the store in its own memory and write it back later: a Chroma
client holds each collection's vector index as it loaded it, and persists that copy, erased vectors
included, the next time it writes. Tombstone's wrappers watch for an erasure (the epoch token beside the
store) and load the files again first; a client opened outside Tombstone does not. So a physical probe
that finds nothing is only final when no such client is left open: ``holders(path)`` lists the processes
that have files under ``path`` open, and tells those that registered themselves (``register``: Tombstone's
wrappers and adapters do, in a folder beside the store) from the foreign ones, and among those the ones that
hold every file only for reading (a copy, a backup, a read-only ``tombstone scan`` or ``audit``) from those
that may write.

Read from ``/proc/<pid>/fd``. Where there is no ``/proc``, or a process's descriptors cannot be read (another
user's, without root), the listing says so (``listed``, ``uninspectable``): it never reports a process it
could not see as absent without saying it did not look.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGISTRY_SUFFIX = ".tombstone.clients"
_PROC = Path("/proc")
_registered: dict[str, Path] = {}


def registry_for(store_path: str | os.PathLike[str]) -> Path:
    """The folder beside the store (named after its real path, like its lock file) where the processes that
    hold it through Tombstone leave one empty file each, ``<pid>-<start time>``."""
    return Path(os.path.realpath(store_path) + REGISTRY_SUFFIX)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the pid, it
    names one process even after pids are reused."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _entry(pid: int) -> str | None:
    start = _start_time(pid)
    return None if start is None else f"{pid}-{start}"


def register(store_path: str | os.PathLike[str]) -> bool:
    """Say that this process holds the store through Tombstone (its in-memory copies follow an erasure).
    Best effort: where the entry cannot be written the process stays unregistered, and an erasure that sees
    it holding the store's files leaves the physical level UNVERIFIED while it does. Returns whether the
    entry is in place. Entries of processes no longer running are removed on the way."""
    folder = registry_for(store_path)
    key = str(folder)
    entry = _entry(os.getpid())
    if entry is None:
        return False
    if key in _registered and _registered[key].exists():
        return True
    mine = folder / entry
    try:
        for attempt in range(3):  # another process's exit may remove the folder, empty, in between
            folder.mkdir(mode=0o700, exist_ok=True)
            try:
                os.close(os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # readable by no one else
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        for other in folder.iterdir():
            pid = other.name.split("-", 1)[0]
            if other.name != entry and pid.isdigit() and _entry(int(pid)) != other.name:
                other.unlink(missing_ok=True)
    except OSError:
        return False
    _registered[key] = mine
    return True


@atexit.register
def _unregister_all() -> None:
    """At exit, take this process's entries back, except where it still holds files of the store: a store's
    client is closed only after the exit handlers have run, and an entry gone while its files are still open
    would show the exiting process as a foreign holder to an erasure verifying meanwhile. An entry left so
    names a process that is no longer running (its pid and start time), so it counts for nobody; the next
    process to register beside the store removes it."""
    for key, mine in _registered.items():
        if _holds_files(key[: -len(REGISTRY_SUFFIX)]):
            continue
        try:
            mine.unlink(missing_ok=True)
            mine.parent.rmdir()  # the last one out leaves nothing beside the store
        except OSError:
            pass
    _registered.clear()


def _holds_files(root: str) -> bool:
    """Whether this process has a file under ``root`` open (True where that cannot be read: keep the entry)."""
    try:
        fds = os.listdir(_PROC / "self" / "fd")
    except OSError:
        return True
    return _opens_under(_PROC / "self" / "fd", fds, root)


def _opens_under(fd_dir: Path, fds: list[str], root: str) -> bool:
    """Whether any of the descriptors ``fds`` in ``fd_dir`` (``/proc/<pid>/fd``) names ``root`` or a file under it."""
    return bool(_under(fd_dir, fds, root))


def _under(fd_dir: Path, fds: list[str], root: str) -> list[str]:
    """Those of the descriptors ``fds`` in ``fd_dir`` that name ``root`` or a file under it."""
    inside = root.rstrip(os.sep) + os.sep
    out = []
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target == root or target.startswith(inside):
            out.append(fd)
    return out


def _may_write(proc: Path, fds: list[str]) -> bool:
    """Whether any of the process's descriptors ``fds`` is open for writing (``/proc/<pid>/fdinfo``: the access
    mode in its flags); True where that cannot be read. A store's client opens its database for writing; a
    process that only reads the files (a copy, a backup, Tombstone's own read-only scan) does not."""
    for fd in fds:
        try:
            info = (proc / "fdinfo" / fd).read_text()
        except OSError:
            return True
        flags = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("flags:")), None)
        try:
            if flags is None or int(flags, 8) & os.O_ACCMODE != os.O_RDONLY:
                return True
        except ValueError:
            return True
    return False


@dataclass
class Holders:
    """The other processes that have files under a store's path open."""

    foreign: list[tuple[int, str]] = field(default_factory=list)
    """(pid, command line) of each process holding the files that did not register through Tombstone and has
    one of them open for writing (or whose open modes could not be read)."""
    readers: list[tuple[int, str]] = field(default_factory=list)
    """(pid, command line) of the other unregistered holders: every file of the store they hold is open only
    for reading, so they can write nothing back."""
    registered: list[int] = field(default_factory=list)
    """Pids of the holders that did."""
    listed: bool = True
    """False where other processes' open files cannot be listed (no ``/proc``)."""
    uninspectable: int = 0
    """Processes whose open files could not be read (another user's, without the privilege)."""

    def evidence(self) -> dict[str, Any]:
        if not self.listed:
            return {"other_holders": "not listed: this system has no /proc to list other processes' open files"}
        out: dict[str, Any] = {"other_holders": {"outside_tombstone": [f"pid {p}: {c}" for p, c in self.foreign],
                                                 "through_tombstone": len(self.registered)}}
        if self.readers:
            out["other_holders"]["reading_only"] = [f"pid {p}: {c}" for p, c in self.readers]
        if self.uninspectable:
            out["other_holders"]["not_readable"] = self.uninspectable
        return out


def _command(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(raw.replace(b"\x00", b" ").decode("utf-8", "replace").split())  # one line
    return text[:200] or "?"


def holders(store_path: str | os.PathLike[str]) -> Holders:
    """The processes other than this one that hold a file under ``store_path`` open (``/proc/<pid>/fd``)."""
    if not (_PROC / "self" / "fd").is_dir():
        return Holders(listed=False)
    root = os.path.realpath(store_path)
    try:
        known = {p.name for p in registry_for(store_path).iterdir()}
    except OSError:
        known = set()
    me = os.getpid()
    out = Holders()
    for proc in _PROC.iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        pid = int(proc.name)
        try:
            fds = os.listdir(proc / "fd")
        except PermissionError:
            out.uninspectable += 1
            continue
        except OSError:  # gone meanwhile
            continue
        held = _under(proc / "fd", fds, root)
        if held:
            if _entry(pid) in known:
                out.registered.append(pid)
            elif _may_write(proc, held):
                out.foreign.append((pid, _command(pid)))
            else:
                out.readers.append((pid, _command(pid)))
    return out


__all__ = ["Holders", "REGISTRY_SUFFIX", "holders", "register", "registry_for"]
