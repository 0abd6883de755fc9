"""The files side of the Chroma adapter: the HNSW segment's header and tails, the segments table, the
embeddings queue, ``VACUUM`` and orphan segment folders."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import struct
from pathlib import Path
from typing import Any

from tombstone.errors import StoreUnavailableError

UUID_DIR = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def hnsw_header(segment_dir: Path) -> dict[str, int] | None:
    """Parse Chroma's ``header.bin`` (hnswlib's index header preceded by a u32 version)."""
    try:
        raw = (segment_dir / "header.bin").read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < 52:
        return None
    _version, = struct.unpack_from("<I", raw, 0)
    _offset_level0, max_elements, cur_count, size_per_element, _label_offset, offset_data = struct.unpack_from("<6Q", raw, 4)
    return {"max_elements": max_elements, "cur_element_count": cur_count,
            "size_data_per_element": size_per_element, "offset_data": offset_data}


def zero_past(path: Path, keep: int) -> int:
    """Overwrite every byte of ``path`` after the first ``keep`` with zeros; return how many."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size <= keep:
        return 0
    with open(path, "r+b") as fh:
        fh.seek(keep)
        remaining = size - keep
        block = b"\x00" * (1 << 20)
        while remaining:
            n = min(remaining, len(block))
            fh.write(block[:n])
            remaining -= n
        fh.flush()
        os.fsync(fh.fileno())
    return size - keep


class ChromaSegments:
    """The adapter's methods on the persist directory's files (``path``, ``store``, ``collection()``)."""

    def _db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path / "chroma.sqlite3", timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _segments(self) -> dict[str, str]:
        conn = self._db()
        try:
            return dict(conn.execute("SELECT id, scope FROM segments").fetchall())
        finally:
            conn.close()

    def _settle_and_zero_tails(self) -> dict[str, int]:
        """Let this process's fresh Chroma instance load the collection's vector segment first (a read
        does), then zero the tails: a segment Chroma has not persisted yet is set up again at load, and its
        files are written then from buffers that hold whatever the process's heap held."""
        col = self.collection()
        if col.count():
            col.get(limit=1, include=["embeddings"])
        return self._zero_hnsw_tails()

    def _zero_hnsw_tails(self) -> dict[str, int]:
        """hnswlib allocates room for max_elements and Chroma may persist the whole buffer; the slots
        past cur_element_count were never written by the index and can hold stale heap memory."""
        zeroed = {}
        for seg, scope in self._segments().items():
            directory = self.path / seg
            header = hnsw_header(directory) if scope == "VECTOR" else None
            if header is None:
                continue
            cur = header["cur_element_count"]
            n = zero_past(directory / "data_level0.bin", cur * header["size_data_per_element"])
            n += zero_past(directory / "length.bin", cur * 4)
            zeroed[seg] = n
        return zeroed

    def _purge_queue(self) -> int:
        """Drop embeddings-queue rows of collections that no longer exist (the rewritten original's ADD
        rows keep documents and vectors). Rows of live collections may not be applied yet: kept."""
        conn = self._db()
        try:
            live = {row[0] for row in conn.execute("SELECT id FROM collections")}
            topics = [row[0] for row in conn.execute("SELECT DISTINCT topic FROM embeddings_queue")]
            dead = [t for t in topics if t.rsplit("/", 1)[-1] not in live]
            purged = 0
            for topic in dead:
                purged += conn.execute("DELETE FROM embeddings_queue WHERE topic = ?", (topic,)).rowcount
            return purged
        finally:
            conn.close()

    def _vacuum(self) -> dict[str, Any]:
        conn = self._db()
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return {"journal_mode": mode, "secure_delete": bool(conn.execute("PRAGMA secure_delete").fetchone()[0])}
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailableError(f"VACUUM of chroma.sqlite3 failed: {exc}", store=self.store) from exc
        finally:
            conn.close()

    def _remove_orphans(self) -> list[str]:
        live = set(self._segments())
        removed = []
        for child in sorted(self.path.iterdir()):
            if child.is_dir() and UUID_DIR.match(child.name) and child.name not in live:
                shutil.rmtree(child)
                removed.append(child.name)
        return removed


__all__ = ["UUID_DIR", "ChromaSegments", "hnsw_header", "zero_past"]
