"""Small file helpers shared by the core and the adapters."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from tombstone.errors import StoreUnavailableError

PRIVATE_FILE_MODE = 0o600
"""Mode of every file Tombstone creates for itself: the lineage db, receipts, the config, lock files."""
PRIVATE_DIR_MODE = 0o700
"""Mode of every folder a store creates for itself (a FAISS store's directory, a model store's folders)."""
METADATA_LIMIT = 64 * 1024 * 1024
"""Default bound (64 MiB) on a store's metadata file that is read whole: a registry, a state file."""
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class NotARegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a directory where a file's content was expected."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file, opened without blocking (a FIFO, a device or a socket at
    ``path`` raises NotARegularFile at once, never waits for a writer or reads forever). A link is followed
    (the caller named the path), but what it leads to must be a regular file too."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(f"{path} is {_kind(mode)}")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def make_private_dirs(path: str | os.PathLike[str]) -> Path:
    """Create the folder ``path`` and any missing parent of it, each new one with mode 0700
    (``PRIVATE_DIR_MODE``); folders already there keep their mode (a folder the user made is theirs)."""
    path = Path(path)
    missing = []
    here = path
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile by another process
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one.

    The temporary file is created exclusively (``mkstemp``: ``O_CREAT | O_EXCL``, never through a link
    someone placed at a predictable name) beside the target, with mode 0600; it is fsynced, then renamed
    over ``path`` (a link at ``path`` itself is replaced, not followed)."""
    path = Path(path)
    make_private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if nothing is there (for files a library then opens, such as
    a SQLite database: its -wal and -shm files take the database file's mode)."""
    path = Path(path)
    make_private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


class Snapshot:
    """A private copy of a store's files in a new temporary folder (mode 0700), for a reader that must not
    change the store while the store's client writes whenever it opens one (Chroma, SQLite in WAL mode).

    Only regular files and folders are copied, each file read without following a link and without
    blocking; links, FIFOs, devices and sockets are left out (the physical probe, which reads the
    originals, names them). ``close()`` removes the copy.
    """

    def __init__(self, prefix: str = "tombstone-snapshot-") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))

    def copy_file(self, source: Path, target: Path) -> bool:
        """Copy one regular file to ``target`` (inside the snapshot); False when there is none to copy."""
        try:
            fd = os.open(source, _READ_FLAGS)
        except (FileNotFoundError, OSError):
            return False
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                return False
            target.parent.mkdir(parents=True, exist_ok=True)
            fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
            with os.fdopen(fd_out, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        return True

    def copy_files(self, sources: list[Path], name: str = "files") -> Path:
        """Copy the listed files (those that exist) into one folder of the snapshot; return the folder."""
        folder = self.dir / name
        folder.mkdir(parents=True, exist_ok=True)
        for source in sources:
            self.copy_file(Path(source), folder / Path(source).name)
        return folder

    def copy_tree(self, source: Path, name: str = "store") -> Path:
        """Copy the regular files and folders under ``source`` (links are not followed); return the copy."""
        root = self.dir / name
        root.mkdir(parents=True, exist_ok=True)
        source = Path(source)
        for folder, dirs, files in os.walk(source, followlinks=False):
            relative = Path(folder).relative_to(source)
            for d in dirs:
                if not os.path.islink(os.path.join(folder, d)):
                    (root / relative / d).mkdir(exist_ok=True)
            for f in files:
                self.copy_file(Path(folder) / f, root / relative / f)
        return root

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _refused(message: str, store: str | None) -> StoreUnavailableError:
    return StoreUnavailableError(message, store=store, retryable=False)


def confined_path(root: str | os.PathLike[str], relative: object, what: str, *, store: str | None = None) -> Path:
    """``root / relative`` for a path a store's own metadata names (a registry entry, say), refused unless it
    stays inside ``root``: a relative path without ``..`` whose folder, links resolved, lies inside ``root``.
    The last component is not resolved here: :func:`open_regular` refuses it if it is a link. Raises a
    one-line StoreUnavailableError (not retryable) naming ``what``."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise _refused(f"{what} {relative!r} is not a file name inside the store {root}: refused", store)
    norm = os.path.normpath(relative)
    if os.path.isabs(relative) or norm in (".", "..") or norm.startswith(".." + os.sep):
        raise _refused(f"{what} {relative!r} leaves the store {root}: refused", store)
    path = Path(root) / norm
    real_parent = os.path.realpath(path.parent)
    if not _inside(real_parent, os.path.realpath(root)):
        raise _refused(f"{what} {relative!r} leaves the store {root} (its folder is {real_parent}): refused", store)
    return path


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *, write: bool = False,
                 create: bool = False, store: str | None = None) -> int:
    """A file descriptor of ``path``, opened only if it is a regular file (whose folder, links resolved, lies
    inside ``root`` when one is given): never through a symbolic link (``O_NOFOLLOW``), never blocking
    (``O_NONBLOCK``; a FIFO, a device or a socket is refused after ``lstat``, not opened), and checked again
    with ``fstat`` once open. ``write`` opens it read-write; ``create`` creates it (mode 0600) when nothing is
    there. FileNotFoundError when it is missing (and not created); anything else that must not be opened is a
    one-line StoreUnavailableError (not retryable) naming the path."""
    path = Path(path)
    if root is not None and not _inside(os.path.realpath(path.parent), os.path.realpath(root)):
        raise _refused(f"{path} lies outside the store {root}: not opened", store)
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
        before = None
    if before is not None and not stat.S_ISREG(before.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(before.st_mode) else _kind(before.st_mode)
        raise _refused(f"{path} is {kind}, not a regular file: not opened", store)
    flags = _READ_FLAGS | (os.O_RDWR if write or create else 0) | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            raise _refused(f"{path} was replaced by something that is not a regular file: not opened",
                           store) from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (before is not None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino)):
        os.close(fd)
        raise _refused(f"{path} was replaced while it was opened: not opened", store)
    return fd


def read_fd(fd: int, size: int, offset: int = 0) -> bytes:
    """Up to ``size`` bytes of ``fd`` from ``offset``, read in chunks of at most 16 MiB: no buffer of ``size``
    bytes is allocated before the bytes are there."""
    parts, at = [], offset
    while at - offset < size:
        chunk = os.pread(fd, min(size - (at - offset), 1 << 24), at)
        if not chunk:
            break
        parts.append(chunk)
        at += len(chunk)
    return b"".join(parts)


def overwrite_ranges(fd: int, places: Iterable[tuple[int, int]], fill: int, *, gap: int = 4096,
                     most: int = 8 << 20) -> int:
    """Overwrite each ``(offset, length)`` of ``fd`` with the byte ``fill``. Places at most ``gap`` bytes apart
    are done together (up to ``most`` bytes): the span is read, its places filled, and the span written back,
    the bytes between them as they were; so thousands of adjacent records cost a few writes, not one each.
    The caller holds whatever keeps other writers off the file meanwhile. Returns how many writes it took."""
    ordered = sorted((int(at), int(length)) for at, length in places if length > 0)
    writes = i = 0
    while i < len(ordered):
        start, end = ordered[i][0], ordered[i][0] + ordered[i][1]
        j = i + 1
        while j < len(ordered) and ordered[j][0] - end <= gap and ordered[j][0] + ordered[j][1] - start <= most:
            end = max(end, ordered[j][0] + ordered[j][1])
            j += 1
        span = bytearray(os.pread(fd, end - start, start)) if j > i + 1 else None
        if span is None or len(span) != end - start:  # one place, or a file shorter than its places say
            for at, length in ordered[i:j]:
                os.pwrite(fd, bytes([fill]) * length, at)
                writes += 1
        else:
            for at, length in ordered[i:j]:
                span[at - start : at - start + length] = bytes([fill]) * length
            os.pwrite(fd, span, start)
            writes += 1
        i = j
    return writes


def read_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                 limit: int = METADATA_LIMIT, *, option: str | None = None, store: str | None = None) -> bytes:
    """The whole of ``path``, opened as :func:`open_regular` opens it, if it holds at most ``limit`` bytes
    (default :data:`METADATA_LIMIT`); a larger file is refused in one line before anything is read (naming
    ``option``, the store option that raises the limit, when given). FileNotFoundError when it is missing."""
    fd = open_regular(path, root, store=store)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            how = f"; the store option {option} raises the limit" if option else ""
            raise _refused(f"{path} holds {size} bytes, over the limit of {limit}{how}: not read", store)
        data = read_fd(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _refused(f"{path} grew past the limit of {limit} bytes while it was read: not read", store)
    return data


__all__ = ["PRIVATE_FILE_MODE", "NotARegularFile", "Snapshot", "create_private", "make_private_dirs", "read_regular_file",
           "write_atomic",
           "METADATA_LIMIT", "PRIVATE_DIR_MODE", "confined_path", "open_regular", "overwrite_ranges", "read_fd",
           "read_regular"]
