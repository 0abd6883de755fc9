"""The multi-pattern byte scanner under every physical probe.

One pass over each file finds every pattern of a batch (Aho-Corasick over bytes), reading the
file in bounded chunks that overlap by the longest pattern's length minus one, so a match that
straddles a chunk boundary is found once and memory stays flat whatever the file size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ahocorasick_rs

from tombstone.errors import StoreUnavailableError

CHUNK_SIZE = 8 * 1024 * 1024


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


def scan_files(files: Iterable[str | os.PathLike[str]], patterns: Mapping[str, bytes]) -> ScanReport:
    """Scan ``files`` once each for all ``patterns`` (key → bytes) and report every occurrence.

    Several keys may share the same bytes; each key gets the hits. Files that do not exist are
    skipped (a -wal that was checkpointed away is not an error); a file that exists but cannot be
    read raises StoreUnavailableError, because an unreadable file must never count as clean.
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
    for path in files:
        path = Path(path)
        if not path.exists():
            continue
        try:
            size = _scan_one(path, matcher, distinct, by_bytes, overlap, report)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
        report.files.append(str(path))
        report.bytes_scanned += size
    return report


def _scan_one(path, matcher, distinct, by_bytes, overlap, report) -> int:
    # One buffer for the whole file: the tail of the previous chunk is moved to its front and the
    # next chunk is read in after it, so no chunk is ever copied into a new bytes object.
    buf = bytearray(overlap + CHUNK_SIZE)
    view = memoryview(buf)
    seen: set[tuple[int, int]] = set()
    total = 0
    carried = 0  # bytes at the front of buf that came from the previous chunk
    base = 0  # file offset of buf[0]
    with open(path, "rb") as fh:
        while True:
            read = fh.readinto(view[carried:])
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
                    report.hits[key].append(Hit(str(path), absolute))
            keep = min(overlap, filled)
            buf[:keep] = bytes(view[filled - keep : filled])  # regions may overlap: copy first
            base += filled - keep
            carried = keep
            seen = {item for item in seen if item[1] >= base}
    return total


__all__ = ["Hit", "ScanReport", "scan_files", "CHUNK_SIZE"]
