"""Who else has a Chroma persist directory open, and whether its files can be written: what the adapter checks
before it changes anything."""

from __future__ import annotations

import os
from pathlib import Path

from tombstone import holders
from tombstone.errors import StoreUnavailableError

LOW_SPACE = 1 << 20
"""Free bytes below which a Chroma client that failed to open is reported as short of space (opening one
creates its write-ahead log and shared-memory files)."""


def write_refused(path: Path) -> str | None:
    """Why Chroma cannot write its persist directory, or None: ``chroma.sqlite3`` cannot be opened for
    writing (a read-only mount, no permission), or the filesystem is (nearly) full."""
    try:
        os.close(os.open(path / "chroma.sqlite3", os.O_RDWR))
        st = os.statvfs(path)
    except OSError as exc:
        return f"chroma.sqlite3 cannot be written: {exc.strerror or exc}"
    free = st.f_bavail * st.f_frsize
    return f"No space left on device: {free} bytes free on its filesystem" if free < LOW_SPACE else None


def foreign_clients(seen: holders.Holders) -> str:
    """The processes outside Tombstone that hold the store's files, named (pid and command line)."""
    named = "; ".join(f"pid {pid} ({cmd[:80]})" for pid, cmd in seen.foreign[:3])
    more = f" and {len(seen.foreign) - 3} more" if len(seen.foreign) > 3 else ""
    return f"a process outside Tombstone has the Chroma store's files open for writing: {named}{more}"


def refuse_foreign_clients(path: Path, store: str, *, retryable: bool = True) -> None:
    """StoreUnavailableError while a process outside Tombstone holds files under ``path`` open. Chroma's
    embedded clients are not safe across processes: one that loaded the collection keeps its own copy of the
    vector index and writes it back (erased vectors included) when it next persists, and rows or index files
    changed under it can cost it its own writes. So no erasure changes the files while one is open. Where
    other processes' open files cannot be listed (no ``/proc``), nothing is refused: the verify step then says
    what it could not check."""
    seen = holders.holders(path)
    if seen.foreign:
        raise StoreUnavailableError(
            f"store {store!r}: {foreign_clients(seen)}; Chroma's clients are not safe across processes (that"
            " client would write its own copy of the index back over the erasure, and can lose its writes when"
            " the files change under it): close it, or open the collection through TombstoneCollection, then"
            " run this again",
            store=store, retryable=retryable)


__all__ = ["LOW_SPACE", "foreign_clients", "refuse_foreign_clients", "write_refused"]
