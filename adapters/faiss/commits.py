"""The FAISS store's commit: a new generation written beside the current one and switched to atomically, the
records and heads files appended to, and the lines of dropped records blanked after the switch (the layout
and the crash cases are in :mod:`tombstone_adapters.faiss.store`)."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import zlib
from collections.abc import Mapping

import faiss
import numpy as np

from tombstone.errors import StoreUnavailableError
from tombstone.faults import kill_point
from tombstone.fsutil import open_regular, overwrite_ranges
from tombstone.fsutil import write_atomic as _write_atomic

from .generations import _link, current_generation
from .labels import id_label_pairs
from .records import (_HEAD_COLUMNS, _HEADS_MARK, _ID_AT, _ID_LEN, _LABEL, _LINE_LEN, _ZEROED_BYTES, HEAD_IDS, HEADS,
                      RECORDS, LineIndex, _followed_by, _record_line)


class FaissCommits:
    """Mixin of :class:`~tombstone_adapters.faiss.store.FaissStore`: how a generation is committed."""

    def commit(self, index_changed: bool = True) -> None:
        """Persist a new generation, atomically, and drop the old ones (see the module's docstring). When only
        the state changed (``index_changed=False``: an exclusion, a dropped mapping, or zeros already written
        into the committed index file), the new generation's index is a hard link to the current one, not a
        copy of every vector; the records file is appended to (new records) and blanked (dropped ones) where
        the lines lie, never written anew (except once, for a store read from a ``sidecar-<N>.json``)."""
        previous = self.index_path
        if (self.dir / "CURRENT").exists():
            # A generation built from an older one would cut the records file back past lines a newer one
            # holds: every writer refreshes under the lock first, and this makes sure of it.
            try:
                current = current_generation(self.dir)
            except (OSError, ValueError, KeyError) as exc:
                raise StoreUnavailableError(f"cannot read {self.dir / 'CURRENT'}: {exc}", store=self.store) from exc
            if current != self.generation:
                raise StoreUnavailableError(f"FAISS store {self.dir} moved to generation {current} while this"
                                            f" process held generation {self.generation}; nothing was written",
                                            store=self.store)
        self.generation += 1
        dead = sorted(self._dead)
        try:
            length, appended = self._append_records()
            heads = self._append_heads(appended)
            if index_changed or not _link(previous, self.index_path):
                _write_atomic(self.index_path, faiss.serialize_index(self._index).tobytes())
            state = {"next_label": self.side["next_label"], "excluded": self.side["excluded"],
                     "zeroed": self.side.get("zeroed", []), "records_length": length, "dead": dead,
                     "heads": heads}
            _write_atomic(self.state_path, json.dumps(state, sort_keys=True).encode("utf-8"))
            kill_point("faiss:commit:before-switch")
            _write_atomic(self.dir / "CURRENT", json.dumps({"generation": self.generation}).encode())
        except OSError as exc:
            raise StoreUnavailableError(f"cannot write FAISS store {self.dir}: {exc.strerror or exc}",
                                        store=self.store) from exc
        self.side["records_length"], self.side["heads"] = length, heads
        self._lines.update(appended)
        self._new, self._rewrite_records = [], False
        self._views = None
        self._current_stamp = None
        keep = {self.index_path.name, self.state_path.name, RECORDS, "CURRENT"}
        if heads:
            keep |= {HEADS, HEAD_IDS}
        for path in self.dir.iterdir():
            if path.is_file() and path.name not in keep:
                path.unlink()
        self._blank(dead)

    def _append_records(self) -> tuple[int, dict[int, tuple[int, int]]]:
        """Cut the records file back to the committed length (a crashed commit's tail), append the new records'
        lines (every record's, for a store read from a ``sidecar-<N>.json``), fsync; the new length and where
        the appended lines lie."""
        committed = 0 if self._rewrite_records else int(self.side.get("records_length", 0))
        new = list(self.side["labels"]) if self._rewrite_records else [i for i in self._new if i in self.side["labels"]]
        lines = [_record_line(i, self.side["labels"][i], self.side["records"][i]["document"],
                              self.side["records"][i]["metadata"]) for i in new]
        fd = open_regular(self.records_path, self.dir, create=True, store=self.store)
        try:
            size = os.fstat(fd).st_size
            if size != committed:
                os.ftruncate(fd, committed)
            appended, offset = {}, committed
            if lines:
                os.pwrite(fd, b"".join(lines), committed)
                for i, line in zip(new, lines):
                    appended[self.side["labels"][i]] = (offset, len(line) - 1)
                    offset += len(line)
            if lines or size != committed:
                os.fsync(fd)
        finally:
            os.close(fd)
        if self._rewrite_records:
            self._lines = LineIndex()
        return offset, appended

    def _append_heads(self, appended: Mapping[int, tuple[int, int]]) -> list[int] | None:
        """Write the heads rows and ids of the lines ``_append_records`` just appended (after cutting both files
        back to the committed generation's heads), fsync; the state's ``[token, rows, id bytes]``. Where the
        committed generation has no heads (an older store, or heads that did not agree with its state), they are
        written anew under a new token, for every line the records file holds and has not blanked. None (and the
        heads files go with the switch) when an id holds a newline, which the ids file cannot hold."""
        committed = self.side.get("heads")
        if committed is None or self._rewrite_records:
            labels, offsets, lengths = self._lines.known()
            live_ids, live_labels = id_label_pairs(self.side["labels"])
            id_of = dict(zip(live_labels.tolist(), live_ids))
            id_of.update(self._dead)
            token, rows, size = secrets.randbits(62), 0, 0
        else:
            labels, offsets, lengths = (np.zeros(0, np.int64),) * 3
            id_of = {self.side["labels"][i]: i for i in self._new if i in self.side["labels"]}
            token, rows, size = (int(v) for v in committed)
        labels, offsets, lengths = _followed_by((labels, offsets, lengths), appended)
        try:
            names = [id_of[label].encode("utf-8") for label in labels.tolist()]
        except KeyError:  # a line whose id is not known here: heads cannot be written for it
            return None
        if any(b"\n" in name for name in names):
            return None
        id_lengths = np.fromiter(map(len, names), np.int64, len(names))
        id_offsets = size + np.cumsum(id_lengths + 1) - id_lengths - 1
        crcs = np.fromiter(map(zlib.crc32, names), np.int64, len(names))
        table = np.stack([labels, offsets, lengths, crcs, id_offsets, id_lengths], axis=1).astype("<i8")
        if rows == 0:
            header = np.zeros((1, _HEAD_COLUMNS), "<i8")
            header[0, :2] = (_HEADS_MARK, token)
            table = np.concatenate([header, table])
        row_bytes = 8 * _HEAD_COLUMNS
        for name, at, data in ((HEADS, row_bytes * (rows + 1 if rows else 0), table.tobytes()),
                               (HEAD_IDS, size, b"".join(n + b"\n" for n in names))):
            fd = open_regular(self.dir / name, self.dir, create=True, store=self.store)
            try:
                cut = os.fstat(fd).st_size != at
                if cut:
                    os.ftruncate(fd, at)
                if data:
                    os.pwrite(fd, data, at)
                if data or cut:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return [token, rows + len(names), size + int(id_lengths.sum()) + len(names)]

    def _blank(self, labels: list[int]) -> None:
        """Overwrite the dropped records' lines with spaces where they lie, then fsync. Called once the
        generation that dropped them is the current one; one it cannot finish stays named in that generation's
        state, and the next writer (or the next erasure) finishes it."""
        places = self._lines.places(labels)
        if places:
            try:
                fd = open_regular(self.records_path, self.dir, write=True, store=self.store)
            except (OSError, StoreUnavailableError):
                return
            try:
                overwrite_ranges(fd, places, ord(" "))
                os.fsync(fd)
            except OSError:
                return
            finally:
                os.close(fd)
        if labels and self.side.get("heads") is not None:
            kill_point("faiss:blank:lines-blanked")
            if not self._blank_heads(labels):
                return
        self._lines.forget(labels)
        for label in labels:
            self._dead.pop(label, None)

    def _blank_heads(self, labels: list[int]) -> bool:
        """Zero the heads rows of ``labels`` (all but where their id lay) and overwrite their ids with spaces,
        then fsync; after their lines were blanked, so that a crash in between leaves rows that still lead to
        those lines (blanked again, harmlessly). False when the files cannot be written."""
        _, rows, _ = (int(v) for v in self.side["heads"])
        row_bytes = 8 * _HEAD_COLUMNS
        try:
            heads = open_regular(self.dir / HEADS, self.dir, write=True, store=self.store)
            try:
                if os.fstat(heads).st_size < row_bytes * (rows + 1):
                    return False
                # mapped read-only (the rows are found in place, not copied); the writes below go through the fd
                view = mmap.mmap(heads, row_bytes * (rows + 1), prot=mmap.PROT_READ)
                table = np.frombuffer(view, dtype="<i8").reshape(rows + 1, _HEAD_COLUMNS)[1:]
                hits = np.flatnonzero(np.isin(table[:, _LABEL], np.asarray(labels, np.int64))
                                      & (table[:, _LINE_LEN] > 0))
                places = table[hits][:, [_ID_AT, _ID_LEN]].tolist()
                del table
                with contextlib.suppress(BufferError):  # an array on it still held elsewhere (a tracer's frame):
                    view.close()  # then the mapping goes with the last of them
                if not len(hits):
                    return True
                ids = open_regular(self.dir / HEAD_IDS, self.dir, write=True, store=self.store)
                try:
                    overwrite_ranges(heads, [(row_bytes * (row + 1), _ZEROED_BYTES) for row in hits.tolist()], 0)
                    overwrite_ranges(ids, places, ord(" "))
                    os.fsync(ids)
                finally:
                    os.close(ids)
                os.fsync(heads)
            finally:
                os.close(heads)
        except (OSError, ValueError, StoreUnavailableError):
            return False
        return True
