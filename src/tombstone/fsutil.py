"""Small file helpers shared by the core and the adapters."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
"""Mode of every file Tombstone creates for itself: the lineage db, receipts, the config, lock files."""
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


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one.

    The temporary file is created exclusively (``mkstemp``: ``O_CREAT | O_EXCL``, never through a link
    someone placed at a predictable name) beside the target, with mode 0600; it is fsynced, then renamed
    over ``path`` (a link at ``path`` itself is replaced, not followed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
    path.parent.mkdir(parents=True, exist_ok=True)
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


__all__ = ["PRIVATE_FILE_MODE", "NotARegularFile", "Snapshot", "create_private", "read_regular_file", "write_atomic"]
