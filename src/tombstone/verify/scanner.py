"""The multi-pattern byte scanner under every physical probe.

One pass over each file finds every pattern of a batch (Aho-Corasick over bytes), reading the
file in bounded chunks that overlap by the longest pattern's length minus one, so a match that
straddles a chunk boundary is found once and memory stays flat whatever the file size.

Only regular files inside the store are read. A store's files are untrusted data: a FIFO, a device, a
socket or a symbolic link that leaves the store (``docstore.db-shm -> /dev/zero``) would block the scan
or feed it bytes forever, so each path is checked with ``lstat`` and opened with ``O_NOFOLLOW |
O_NONBLOCK``, and anything else raises PhysicalUnsupportedError naming the path: the artifact ends
UNVERIFIED, never VERIFIED, and the scan never hangs. No file is read past the size it had when it was
opened, nor past ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ahocorasick_rs

from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError

CHUNK_SIZE = 8 * 1024 * 1024
MAX_FILE_BYTES = 1 << 40
"""No file is scanned past this many bytes (1 TiB): a larger one (a sparse file, say) is reported, not read."""
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Hit:
    """One occurrence of a pattern in a file."""

    file: str
    """Path of the file, as given to the scanner."""
    offset: int
    """Byte offset of the first byte of the match."""


@dataclass
class ScanReport:
    """Where each pattern was found, plus what was scanned."""

    hits: dict[str, list[Hit]] = field(default_factory=dict)
    """Pattern key → occurrences (empty list when absent)."""
    files: list[str] = field(default_factory=list)
    """Every file that was read in full."""
    bytes_scanned: int = 0
    """Total bytes read."""

    def found(self, key: str) -> list[Hit]:
        return self.hits.get(key, [])


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _checked(path: Path, root: str | None) -> tuple[Path, os.stat_result] | None:
    """The file to open for ``path`` and its ``lstat``, or None when nothing is there. Raises
    PhysicalUnsupportedError for what must not be read: a FIFO, a device, a socket, a symbolic link or a
    file that resolves outside ``root``; StoreUnavailableError for a directory (it cannot be read)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
    target = path
    real = os.path.realpath(path)
    if stat.S_ISLNK(st.st_mode):
        if root is None or not _inside(real, root):
            raise PhysicalUnsupportedError(f"{path} is a symbolic link that leaves the store (to {real}); not scanned")
        target = Path(real)
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return None  # a dangling link inside the store holds no bytes
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
    elif root is not None and not _inside(real, root):
        raise PhysicalUnsupportedError(f"{path} resolves outside the store (to {real}); not scanned")
    if stat.S_ISDIR(st.st_mode):
        raise StoreUnavailableError(f"cannot read {path}: it is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise PhysicalUnsupportedError(f"{path} is {_kind(st.st_mode)}, not a regular file; not scanned")
    if st.st_size > MAX_FILE_BYTES:
        raise PhysicalUnsupportedError(f"{path} is larger than the scan bound ({st.st_size} bytes > {MAX_FILE_BYTES})")
    return target, st


def check_regular(files: Iterable[str | os.PathLike[str]]) -> None:
    """Raise PhysicalUnsupportedError naming the first of ``files`` that exists and is not a regular file
    (links followed). For adapters to call before a client library opens the files: SQLite blocks forever
    on a FIFO left at a ``-journal`` path."""
    for path in files:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise PhysicalUnsupportedError(f"{path} is {_kind(st.st_mode)}, not a regular file")


def _open_regular(path: Path, expected: os.stat_result):
    """Open without following a link and without blocking; refuse if it is no longer that regular file."""
    fh = open(path, "rb", buffering=0, opener=lambda p, _flags: os.open(p, _OPEN_FLAGS))
    st = os.fstat(fh.fileno())
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        fh.close()
        raise PhysicalUnsupportedError(f"{path} was replaced while it was being scanned; not scanned")
    return fh, min(st.st_size, MAX_FILE_BYTES)


def scan_files(files: Iterable[str | os.PathLike[str]], patterns: Mapping[str, bytes], *,
               root: str | os.PathLike[str] | None = None) -> ScanReport:
    """Scan ``files`` once each for all ``patterns`` (key → bytes) and report every occurrence.

    Several keys may share the same bytes; each key gets the hits. Files that do not exist are
    skipped (a -wal that was checkpointed away is not an error); a file that exists but cannot be
    read raises StoreUnavailableError, because an unreadable file must never count as clean. Only
    regular files are read, each up to the size it had when opened: a FIFO, a device, a socket, or a
    symbolic link (or a path through one) that leaves ``root`` — the store's folder; without it, any
    symbolic link — raises PhysicalUnsupportedError naming the path.
    """
    report = ScanReport(hits={key: [] for key in patterns})
    by_bytes: dict[bytes, list[str]] = {}
    for key, pattern in patterns.items():
        if not pattern:
            raise ValueError(f"empty pattern for {key!r}")
        by_bytes.setdefault(bytes(pattern), []).append(key)
    distinct = list(by_bytes)
    if not distinct:
        return report
    matcher = ahocorasick_rs.BytesAhoCorasick(distinct, matchkind=ahocorasick_rs.MatchKind.Standard)
    overlap = max(len(p) for p in distinct) - 1
    real_root = os.path.realpath(root) if root is not None else None
    for path in files:
        path = Path(path)
        checked = _checked(path, real_root)
        if checked is None:
            continue
        try:
            size = _scan_one(checked[0], checked[1], matcher, distinct, by_bytes, overlap, report, label=path)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
        report.files.append(str(path))
        report.bytes_scanned += size
    return report


def _scan_one(path, expected, matcher, distinct, by_bytes, overlap, report, *, label) -> int:
    # One buffer for the whole file: the tail of the previous chunk is moved to its front and the
    # next chunk is read in after it, so no chunk is ever copied into a new bytes object.
    buf = bytearray(overlap + CHUNK_SIZE)
    view = memoryview(buf)
    seen: set[tuple[int, int]] = set()
    total = 0
    carried = 0  # bytes at the front of buf that came from the previous chunk
    base = 0  # file offset of buf[0]
    fh, limit = _open_regular(path, expected)
    with fh:
        while total < limit:
            read = fh.readinto(view[carried : carried + min(CHUNK_SIZE, limit - total)])
            if not read:
                break
            total += read
            filled = carried + read
            for index, start, _end in matcher.find_matches_as_indexes(view[:filled], overlapping=True):
                absolute = base + start
                if carried and start < carried and (index, absolute) in seen:
                    continue  # already reported while scanning the previous chunk
                seen.add((index, absolute))
                for key in by_bytes[distinct[index]]:
                    report.hits[key].append(Hit(str(label), absolute))
            keep = min(overlap, filled)
            buf[:keep] = bytes(view[filled - keep : filled])  # regions may overlap: copy first
            base += filled - keep
            carried = keep
            seen = {item for item in seen if item[1] >= base}
    return total


__all__ = ["Hit", "ScanReport", "scan_files", "check_regular", "CHUNK_SIZE", "MAX_FILE_BYTES"]
