"""The multi-pattern byte scanner under every physical probe.

One pass over each file finds every pattern of a batch (hyperscan where its wheel installs, Aho-Corasick
over bytes otherwise), reading the file in bounded chunks that overlap by the longest pattern's length
minus one, so a match that straddles a chunk boundary is found once and memory stays flat whatever the
file size. A large file is split among a few threads (both matchers release the GIL).

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
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import ahocorasick_rs
import numpy as np

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


def _escaped(literal: bytes) -> bytes:
    """``literal`` as a hyperscan expression that matches exactly its bytes: each byte written ``\\xHH``."""
    return ("\\x" + literal.hex(" ").replace(" ", "\\x")).encode("ascii") if literal else b""


class _Matcher:
    """Every occurrence of any of ``patterns`` in a buffer, as (pattern index, start offset).

    Hyperscan (a SIMD multi-literal matcher) when it is installed, with each byte written as ``\\xHH`` (its
    pure-literal API stops at a NUL byte, and fingerprints are binary); Aho-Corasick over bytes otherwise. Both
    release the GIL while they scan, so threads scan parts of a file side by side."""

    def __init__(self, patterns: list[bytes]) -> None:
        self.patterns = patterns
        self.lengths = [len(p) for p in patterns]
        try:
            import hyperscan
        except ImportError:  # no wheel for this platform
            hyperscan = None
        self._hs = hyperscan
        if hyperscan is not None:
            # Hyperscan slows down by two orders of magnitude on long literals over data that resembles them
            # (pickled float vectors against a file of pickled float vectors): a pattern longer than WINDOW
            # is searched by WINDOW of its bytes (the most distinctive run: see _window_at), and each such
            # hit is checked against the whole pattern in the buffer (which holds it: chunks overlap by the
            # longest pattern).
            windows: dict[bytes, list[tuple[int, int]]] = {}
            for index, pattern in enumerate(patterns):
                at = _window_at(pattern)
                windows.setdefault(pattern[at : at + WINDOW], []).append((index, at))
            self._windows = list(windows.values())
            keys = list(windows)
            self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            self._db.compile(expressions=[_escaped(w) for w in keys],
                             ids=list(range(len(keys))), elements=len(keys), flags=[0] * len(keys))
            self._window_lengths = [len(w) for w in keys]
            self.engine = "hyperscan"
        else:
            self._aho = ahocorasick_rs.BytesAhoCorasick(patterns, matchkind=ahocorasick_rs.MatchKind.Standard)
            self.engine = "aho-corasick"

    def scratch(self):
        """Per-thread state (hyperscan's scratch space), or None."""
        return self._hs.Scratch(self._db) if self._hs is not None else None

    def find(self, view: memoryview, scratch) -> list[tuple[int, int]]:
        if self._hs is None:
            return [(i, start) for i, start, _end in self._aho.find_matches_as_indexes(view, overlapping=True)]
        found: list[tuple[int, int]] = []
        lengths, patterns, windows, window_lengths = self.lengths, self.patterns, self._windows, self._window_lengths
        size = len(view)

        def on_match(window: int, _from: int, to: int, _flags: int, _context) -> int:
            for index, at in windows[window]:
                start = to - window_lengths[window] - at
                end = start + lengths[index]
                if start >= 0 and end <= size and (at == 0 and end == to or view[start:end] == patterns[index]):
                    found.append((index, start))
            return 0

        self._db.scan(view, match_event_handler=on_match, scratch=scratch)
        return found


def _window_at(pattern: bytes) -> int:
    """Where in ``pattern`` the WINDOW bytes the SIMD matcher searches for begin: the run with the fewest
    zero bytes, nearest the middle among equals.

    A sparse embedding's fingerprint holds long runs of zeros, and a reclaim in place leaves zeros where
    the erased vectors lay: a window of zeros would match at every byte of such a region, and checking
    each of those hits against the whole pattern costs more than the scan itself. A window with a nonzero
    byte cannot match there at all."""
    if len(pattern) <= WINDOW:
        return 0
    middle = (len(pattern) - WINDOW) // 2
    if b"\x00" not in pattern[middle : middle + WINDOW]:  # no window has more nonzero bytes, none is nearer
        return middle
    nonzero = np.concatenate(([0], np.cumsum(np.frombuffer(pattern, dtype=np.uint8) != 0)))
    counts = nonzero[WINDOW:] - nonzero[:-WINDOW]  # nonzero bytes in the window starting at each offset
    best = np.flatnonzero(counts == counts.max())
    return int(best[np.argmin(np.abs(best - middle))])


def _by_bytes(patterns: Mapping[str, bytes]) -> dict[bytes, list[str]]:
    """The keys of each distinct pattern, in the order the patterns come."""
    by_bytes: dict[bytes, list[str]] = {}
    for key, pattern in patterns.items():
        if not pattern:
            raise ValueError(f"empty pattern for {key!r}")
        by_bytes.setdefault(bytes(pattern), []).append(key)
    return by_bytes


_kept: "OrderedDict[tuple, _Matcher | Future]" = OrderedDict()
"""The matchers built last (or being built: :func:`prepare`), most recently used last: a batch keeps one per
store it verifies, and a reclaim that scans shares its store's."""
KEEP = 8
_kept_lock = threading.Lock()


def _key(patterns: list[bytes]) -> tuple:
    try:
        import hyperscan
    except ImportError:  # no wheel for this platform
        hyperscan = None
    return ("aho-corasick" if hyperscan is None else "hyperscan", WINDOW, tuple(patterns))


def _keep(key: tuple, matcher: "_Matcher | Future") -> None:
    """Call it holding ``_kept_lock``."""
    _kept[key] = matcher
    _kept.move_to_end(key)
    while len(_kept) > KEEP:
        _kept.popitem(last=False)


def _matcher(patterns: list[bytes]) -> _Matcher:
    """A matcher for ``patterns``: a kept one (built, or being built: :func:`prepare`) when it was for the same
    patterns in the same order, else a new one. A reclaim that scans the files and the physical probe after it
    ask for the same patterns; compiling ten thousand artifacts' patterns takes about a second."""
    key = _key(patterns)
    with _kept_lock:
        kept = _kept.get(key)
        if kept is not None:
            _kept.move_to_end(key)
    if isinstance(kept, Future):
        try:
            kept = kept.result()
        except Exception:  # built again here, where its error (if it recurs) reaches the caller
            kept = None
    if kept is not None:
        return kept
    built = _Matcher(patterns)
    with _kept_lock:
        _keep(key, built)
    return built


def kept() -> int:
    """How many matchers are kept (built or being built)."""
    with _kept_lock:
        return len(_kept)


def forget() -> None:
    """Drop every matcher kept for reuse (each holds its patterns: erased artifacts' ids and fingerprint bytes)."""
    with _kept_lock:
        _kept.clear()


def prepare(patterns: Mapping[str, bytes]) -> None:
    """Start building the matcher for ``patterns`` on a thread of its own, for a :func:`scan_files` of the same
    patterns that comes later: the build (hyperscan's compile, which lets go of the GIL) runs while the caller
    does other work. The scan waits for it if it is not done by then. Nothing is started for patterns whose
    matcher is kept already."""
    try:
        distinct = list(_by_bytes(patterns))
    except ValueError:
        return  # the scan itself reports it
    if not distinct:
        return
    key = _key(distinct)
    future: Future = Future()
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return
        _keep(key, future)

    def build() -> None:
        try:
            future.set_result(_Matcher(distinct))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=build, name="tombstone-scan-prepare", daemon=True).start()


WINDOW = 32
"""Bytes of a longer pattern the SIMD matcher searches for (the rest is compared on each hit)."""

SEGMENT_MIN = 64 * 1024 * 1024
"""A file this large or larger is split among the scan threads."""


def scan_threads() -> int:
    """Threads the scanner uses: the CPUs this process may run on, at most 4 (``TOMBSTONE_SCAN_THREADS``)."""
    env = os.environ.get("TOMBSTONE_SCAN_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def scan_files(files: Iterable[str | os.PathLike[str]], patterns: Mapping[str, bytes], *,
               root: str | os.PathLike[str] | None = None, threads: int | None = None) -> ScanReport:
    """Scan ``files`` once each for all ``patterns`` (key → bytes) and report every occurrence.

    Several keys may share the same bytes; each key gets the hits. Files that do not exist are
    skipped (a -wal that was checkpointed away is not an error); a file that exists but cannot be
    read raises StoreUnavailableError, because an unreadable file must never count as clean. Only
    regular files are read, each up to the size it had when opened: a FIFO, a device, a socket, or a
    symbolic link (or a path through one) that leaves ``root`` — the store's folder; without it, any
    symbolic link — raises PhysicalUnsupportedError naming the path. A large file is read in parts by
    ``threads`` threads (default :func:`scan_threads`), each part overlapping the next by the longest
    pattern's length minus one; a match belongs to the part it starts in, so none is reported twice.
    """
    scan = _Pass(patterns)
    if scan.matcher is None:
        return scan.report
    matcher, overlap = scan.matcher, scan.overlap
    real_root = os.path.realpath(root) if root is not None else None
    workers = threads or scan_threads()
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        for path in files:
            path = Path(path)
            checked = _checked(path, real_root)
            if checked is None:
                continue
            try:
                size, found = _scan_one(checked[0], checked[1], matcher, overlap, pool, workers)
            except OSError as exc:
                raise StoreUnavailableError(f"cannot read {path}: {exc.strerror or exc}") from exc
            scan.add(str(path), size, found)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return scan.report


class _Pass:
    """One scan's patterns: the report it fills, their distinct bytes with the keys of each, and their
    matcher (None when there are no patterns) with the overlap a match across two parts needs."""

    def __init__(self, patterns: Mapping[str, bytes]) -> None:
        self.report = ScanReport(hits={key: [] for key in patterns})
        self.by_bytes = _by_bytes(patterns)
        self.distinct = list(self.by_bytes)
        self.matcher = _matcher(self.distinct) if self.distinct else None
        self.overlap = max(len(p) for p in self.distinct) - 1 if self.distinct else 0

    def add(self, name: str, size: int, found: list[tuple[int, int]]) -> None:
        """What was found in one file or stream of ``size`` bytes, (pattern index, offset) each, under every
        key of its pattern, in offset order."""
        for index, offset in sorted(found, key=lambda item: (item[1], item[0])):
            for key in self.by_bytes[self.distinct[index]]:
                self.report.hits[key].append(Hit(name, offset))
        self.report.files.append(name)
        self.report.bytes_scanned += size


def _scan_range(fd: int, start: int, end: int, limit: int, matcher: _Matcher, overlap: int) -> list[tuple[int, int]]:
    """Matches that start in [start, end) of the open file, read in chunks into one buffer (each chunk plus
    the ``overlap`` bytes after it, so a match across a chunk boundary is whole in the chunk it starts in)."""
    buf = bytearray(CHUNK_SIZE + overlap)
    view = memoryview(buf)
    scratch = matcher.scratch()
    found: list[tuple[int, int]] = []
    offset = start
    while offset < end:
        own = min(CHUNK_SIZE, end - offset)
        want = min(own + overlap, limit - offset)
        got = 0
        while got < want:
            n = os.preadv(fd, [view[got:want]], offset + got)
            if not n:
                break
            got += n
        if got < min(own, want):  # the file shrank under the scan: what is left was read
            own = got
        found.extend((index, offset + at) for index, at in matcher.find(view[:got], scratch) if at < own)
        if not got:
            break
        offset += own
    return found


def _scan_one(path, expected, matcher, overlap, pool, workers) -> tuple[int, list[tuple[int, int]]]:
    fh, limit = _open_regular(path, expected)
    with fh:
        fd = fh.fileno()
        if pool is None or limit < SEGMENT_MIN:
            return limit, _scan_range(fd, 0, limit, limit, matcher, overlap)
        bounds = [limit * i // workers for i in range(workers + 1)]
        parts = [pool.submit(_scan_range, fd, bounds[i], bounds[i + 1], limit, matcher, overlap)
                 for i in range(workers)]
        return limit, [hit for part in parts for hit in part.result()]



@dataclass(frozen=True)
class Stream:
    """Bytes to scan that are no local file, such as a relation file a database server hands out in parts
    through SQL: ``name`` stands for it in the report (as a file's path does), ``chunks`` yields its bytes
    in order, in parts of any size. Nothing of it is written to disk."""

    name: str
    chunks: Iterable[bytes]


def scan_streams(streams: Iterable[Stream], patterns: Mapping[str, bytes]) -> ScanReport:
    """:func:`scan_files` for :class:`Stream` s: each stream scanned once for all ``patterns`` as its parts
    arrive, the next part read (on a thread of its own) while one is scanned. A match across two parts is
    found in the seam between them (the last bytes of the one, the first of the next), once. An error raised
    while a part is read (the stream could not be read whole) propagates: nothing is reported clean."""
    scan = _Pass(patterns)
    if scan.matcher is None:
        return scan.report
    scratch = scan.matcher.scratch()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tombstone-stream") as reader:
        for stream in streams:
            scan.add(stream.name, *_scan_stream(_read_ahead(_bounded(stream), reader), scan.matcher, scratch,
                                                scan.overlap))
    return scan.report


def _bounded(stream: Stream) -> Iterator[bytes]:
    """The stream's parts up to ``MAX_FILE_BYTES`` in all, as a file is read; a stream that goes on past it
    (a file growing while it is read, a server that never says the end) raises: never reported clean."""
    seen = 0
    for part in stream.chunks:
        seen += len(part)
        if seen > MAX_FILE_BYTES:
            raise PhysicalUnsupportedError(f"{stream.name} goes on past the scan bound ({MAX_FILE_BYTES} bytes):"
                                           " not read to its end")
        yield part


def _read_ahead(chunks: Iterable[bytes], reader: ThreadPoolExecutor) -> Iterable[bytes]:
    """``chunks`` with the next one already being read (by ``reader``) while the caller scans this one."""
    parts = iter(chunks)
    pending = reader.submit(next, parts, None)
    while True:
        part = pending.result()
        if part is None:
            return
        pending = reader.submit(next, parts, None)
        yield part


def _scan_stream(chunks: Iterable[bytes], matcher: _Matcher, scratch, overlap: int) -> tuple[int, list[tuple[int, int]]]:
    """Matches in the concatenation of ``chunks`` as (pattern index, offset), and its length. Each part is
    scanned where it lies (no copy); the seam (up to ``overlap`` bytes before a part and as many of its
    first bytes) is scanned for the matches that start before the part and end in it."""
    lengths = matcher.lengths
    found: list[tuple[int, int]] = []
    tail, base = b"", 0  # the last bytes before the part, and the part's offset in the stream
    for part in chunks:
        if not part:
            continue
        view = memoryview(part)
        if tail:
            seam = tail + bytes(view[:overlap])
            found.extend((index, base - len(tail) + at) for index, at in matcher.find(memoryview(seam), scratch)
                         if at < len(tail) < at + lengths[index])
        found.extend((index, base + at) for index, at in matcher.find(view, scratch))
        tail = (tail + bytes(view))[-overlap:] if len(view) < overlap else bytes(view[len(view) - overlap:])
        base += len(view)
    return base, found


__all__ = ["Hit", "ScanReport", "Stream", "scan_files", "scan_streams", "scan_threads", "check_regular",
           "CHUNK_SIZE", "MAX_FILE_BYTES"]
