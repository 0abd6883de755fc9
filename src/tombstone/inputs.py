"""What a user hands Tombstone, checked before anything is read or changed: subject references, and the
files named on the command line.

A subject reference is a non-empty string of valid Unicode without NUL characters, at most
:data:`MAX_SUBJECT_CHARS` characters once NFC-normalised (as it is keyed, :func:`tombstone.display.normal_subject`).
Wrappers' writes, ``Tombstone.erase`` and ``erase_many`` and the CLI refuse anything else with the same
one-line UnknownSubjectError.

A file the user names is read only if it is a regular file (a FIFO, a device, a socket or a folder is
refused at once, never waited on or read forever), and only up to a bound: :data:`CONFIG_LIMIT` for
``tombstone.toml``, :data:`SUBJECTS_FILE_LIMIT` for ``--subjects-file`` (whose ``-`` reads standard input,
within the same bound). A file Tombstone writes where the user says (``--out``) must be a regular file or a
new path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from tombstone.display import normal_subject
from tombstone.errors import ConfigError, UnknownSubjectError, shown
from tombstone.fsutil import NotARegularFile, read_regular_file

MAX_SUBJECT_CHARS = 1024
"""The longest subject reference, in characters after NFC normalisation."""
CONFIG_LIMIT = 1 << 20
"""The largest ``tombstone.toml`` read (1 MiB)."""
SUBJECTS_FILE_LIMIT = 64 << 20
"""The largest ``--subjects-file`` read (64 MiB), standard input included."""


def check_subject(subject: Any) -> str:
    """``subject`` unchanged if it is a usable subject reference; else a one-line UnknownSubjectError."""
    if subject is None:
        raise UnknownSubjectError("no subject reference given (subject=None): every write and erasure names the"
                                  " subject it is for")
    if not isinstance(subject, str):
        raise UnknownSubjectError(f"a subject reference must be a string, not {type(subject).__name__}")
    if not subject.strip():
        raise UnknownSubjectError("subject reference is empty")
    if "\x00" in subject:
        raise UnknownSubjectError(f"subject reference {shown(subject)} holds a NUL character")
    try:
        normal = normal_subject(subject)
    except ValueError as exc:
        raise UnknownSubjectError(str(exc)) from exc
    if len(normal) > MAX_SUBJECT_CHARS:
        raise UnknownSubjectError(f"subject reference {shown(subject)} is {len(normal)} characters long; the limit is"
                                  f" {MAX_SUBJECT_CHARS}")
    return subject


def _kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is not a regular file ("a FIFO", "a directory", ...); None for a regular file
    or nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_user_file(path: str | os.PathLike[str], limit: int, what: str, *, hint: str = "",
                   error: type[Exception] = ConfigError) -> bytes:
    """The bytes of a file the user named, if it is a regular file of at most ``limit`` bytes; else one
    ``error`` line (ConfigError by default) naming ``what`` (``--config``, ``--subjects-file``, a key) and, for
    a file that is not a regular one, ``hint``. FileNotFoundError passes through (the caller says what to do
    about a missing file)."""
    try:
        data = read_regular_file(path, limit + 1)
    except NotARegularFile as exc:
        kind = _kind(path) or "not a regular file"
        raise error(f"{what} {path} is {kind}: name a regular file{hint}") from exc
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise error(f"{what} {path} is larger than {_size(limit)}, the limit for it: not read")
    return data


def read_stream(stream: BinaryIO, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of an open stream (standard input); a longer one is one ConfigError line."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{what} is longer than {_size(limit)}, the limit for it: not read")
    return data


def check_out_path(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` as a file Tombstone may write: a regular file (or a link to one) or a new path whose folder,
    if it exists, is a folder. A device, a FIFO, a socket or a folder is one ConfigError line."""
    kind = _kind(path)
    if kind is not None:
        raise ConfigError(f"{what} {path} is {kind}: name a regular file or a new path")
    parent = Path(path).absolute().parent
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise ConfigError(f"{what} {path}: {parent} is not a directory")
    return Path(path)


def _size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n >> 10} KiB" if n >= 1 << 10 and n % (1 << 10) == 0 else f"{n} bytes"


__all__ = ["CONFIG_LIMIT", "MAX_SUBJECT_CHARS", "SUBJECTS_FILE_LIMIT", "check_out_path", "check_subject",
           "read_stream", "read_user_file"]
