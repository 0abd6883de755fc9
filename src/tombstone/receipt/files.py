"""Receipt file names: one file per receipt, never shared, never overwritten.

A subject made only of letters, digits and ``_.@-`` keeps ``<subject>.json`` (nothing is lost in that
mapping). Any other subject gets a readable slug plus a short keyed hash of the reference
(``Zoe_u+3f9a0c1d2b4e.json``): the ``+`` never occurs in the first form, so the two kinds never meet, and the
hash is an HMAC under the lineage secret, so the name does not let anyone confirm a guessed subject. When
the name is taken (a file is there, or another unfinished saga chose it), a counter is added before the
suffix: ``user-0001.2.json``, ``user-0001.3.json``, ...
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tombstone.fsutil import read_regular_file

SAFE_SUBJECT = re.compile(r"[A-Za-z0-9_.@-]{1,120}")
"""Subjects kept as they are in their file name."""


def receipt_file_name(subject: str, tag: Callable[[str], str]) -> str:
    """The file name of a subject's receipt, before any counter. ``tag`` is the keyed hash
    (``LineageSecret.file_tag``)."""
    if SAFE_SUBJECT.fullmatch(subject):
        return f"{subject}.json"
    ascii_only = unicodedata.normalize("NFKD", subject).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^A-Za-z0-9_.@-]+", "_", ascii_only).strip("._")[:60].rstrip("._") or "subject"
    return f"{slug}+{tag(subject)}.json"


def numbered(path: Path, n: int) -> Path:
    """``path`` with a counter before its suffix: ``receipts/user-0001.json`` -> ``receipts/user-0001.2.json``."""
    return path if n <= 1 else path.with_name(f"{path.stem}.{n}{path.suffix}")


def receipt_in(path: Path) -> dict[str, Any] | None:
    """The receipt a file holds (a JSON object with ``saga_id`` and ``receipt_hash``), or None: no file, an
    unreadable one, or one that holds something else."""
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(read_regular_file(path, 256 * 1024 * 1024))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("saga_id"), str) and isinstance(data.get("receipt_hash"), str):
        return data
    return None


def file_name_key(path: Path) -> str:
    """A path's name as compared by ``same_file_name``: equal keys, the same file (also on a case-insensitive
    file system)."""
    return os.path.normcase(str(path)).casefold()


def same_file_name(a: Path, b: Path) -> bool:
    """Whether two paths name the same file, also on a case-insensitive file system."""
    return file_name_key(a) == file_name_key(b)


__all__ = ["SAFE_SUBJECT", "file_name_key", "numbered", "receipt_file_name", "receipt_in", "same_file_name"]
