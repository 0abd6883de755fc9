"""The records file of a FAISS generation and the heads files beside it: where each record's line lies and whose it
is (``LineIndex``), the records read lazily by id (``LazyRecords``), and how both are read from the files."""

from __future__ import annotations

import itertools
import json
import operator
import os
import weakref
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tombstone.fsutil import open_regular, read_fd


RECORDS = "records.jsonl"
HEADS = "heads.bin"
HEAD_IDS = "heads.ids"
_HEAD_COLUMNS = 6
_LABEL, _LINE_AT, _LINE_LEN, _ID_CRC, _ID_AT, _ID_LEN = range(_HEAD_COLUMNS)
"""heads.bin's columns: label, the line's offset and length in the records file, the CRC-32 of the id's UTF-8
(what finds an id's row without a dict of every id), the id's offset and length in heads.ids. Row 0 is the
header: ``_HEADS_MARK``, the token, zeros. A blanked line's row keeps only where its id lay."""
_ZEROED_BYTES = 8 * _ID_AT
"""The bytes of a row zeroed when its line is blanked: label, line place and the id's CRC."""
_HEADS_MARK = int.from_bytes(b"TSHEADS1", "little")

def _json(data: bytes, path: Path) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{path} nests too deep") from None


_DOCUMENT_KEY = b', "document": '
"""What follows a line's id and label (json.dumps's separators; inside a JSON string a quote is escaped, so
this cannot occur in the id)."""


def _record_line(artifact_id: str, label: int, document: Any, metadata: Any) -> bytes:
    return json.dumps({"id": artifact_id, "label": label, "document": document, "metadata": metadata or {}},
                      ensure_ascii=False).encode("utf-8") + b"\n"


def _followed_by(lines: tuple[np.ndarray, np.ndarray, np.ndarray], more: Mapping[int, tuple[int, int]],
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, offsets and lengths of ``lines``, then those of ``more`` (label -> (offset, length))."""
    if not more:
        return lines
    rows = np.array([(label, o, n) for label, (o, n) in more.items()], np.int64).reshape(-1, 3)
    return tuple(np.concatenate([column, rows[:, k]]) for k, column in enumerate(lines))  # type: ignore[return-value]


class LineIndex:
    """Where each record's line lies in the records file (label -> offset and length), for the lines not yet
    blanked: arrays for the lines a load found, a dict for those appended since."""

    def __init__(self, labels: np.ndarray | None = None, offsets: np.ndarray | None = None,
                 lengths: np.ndarray | None = None) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self._labels = labels if labels is not None else empty
        self._offsets = offsets if offsets is not None else empty
        self._lengths = lengths if lengths is not None else empty
        self._appended: dict[int, tuple[int, int]] = {}
        self._gone: set[int] = set()
        self._order: np.ndarray | None = None
        """The loaded lines' rows sorted by label (for ``place``), made on its first call."""

    def update(self, appended: Mapping[int, tuple[int, int]]) -> None:
        self._appended.update(appended)

    def places(self, labels: Sequence[int]) -> list[tuple[int, int]]:
        """(offset, length) of the lines of ``labels`` that are known and not yet blanked."""
        wanted = [label for label in labels if label not in self._gone]
        out = [self._appended[label] for label in wanted if label in self._appended]
        _, offsets, lengths = self.located(np.fromiter((label for label in wanted if label not in self._appended),
                                                       np.int64))
        return out + list(zip(offsets.tolist(), lengths.tolist()))

    def forget(self, labels: Sequence[int]) -> None:
        for label in labels:
            self._appended.pop(label, None)
            self._gone.add(label)

    def located(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The loaded lines (not blanked) of ``labels``, in file order: their labels, offsets and lengths."""
        if not len(self._labels) or not len(labels):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        rows = np.flatnonzero(np.isin(self._labels, labels))
        if self._gone:
            rows = rows[~np.isin(self._labels[rows], np.fromiter(self._gone, np.int64, len(self._gone)))]
        return self._labels[rows], self._offsets[rows], self._lengths[rows]

    def known(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every line known and not yet blanked (those a load found, then those appended since): labels,
        offsets and lengths."""
        labels, offsets, lengths = self._labels, self._offsets, self._lengths
        if self._gone and len(labels):
            keep = ~np.isin(labels, np.fromiter(self._gone, np.int64, len(self._gone)))
            labels, offsets, lengths = labels[keep], offsets[keep], lengths[keep]
        return _followed_by((labels, offsets, lengths), self._appended)

    def place(self, label: int) -> tuple[int, int] | None:
        """(offset, length) of one label's line, or None when it is not known or already blanked: a binary
        search over the loaded lines (sorted by label once, on the first call), not a pass over them."""
        if label in self._gone:
            return None
        if label in self._appended:
            return self._appended[label]
        if not len(self._labels):
            return None
        order = self._order
        if order is None:
            order = self._order = np.argsort(self._labels, kind="stable")
        at = int(np.searchsorted(self._labels, label, sorter=order))
        if at >= len(order) or self._labels[order[at]] != label:
            return None
        row = order[at]
        return int(self._offsets[row]), int(self._lengths[row])


_BULK_READ = 256
"""Records asked for at once past which their lines are read in one pass over the records file."""


class LazyRecords(MutableMapping):
    """id -> ``{"document", "metadata"}`` of a generation read from the records file. Opening the store parses
    each line's id and label only; a record's line is read and parsed the first time it is asked for (a
    search's ``where``, a ``get``), then kept. Membership follows the generation's id -> label map, which
    ``_put`` and ``_drop`` change together with this mapping."""

    def __init__(self, path: Path, labels: dict[str, int], lines: LineIndex) -> None:
        self._path, self._labels, self._lines = path, labels, lines
        self._held: dict[str, dict[str, Any]] = {}
        self._fd: int | None = None
        """The records file, opened at the first read and closed with this mapping (a commit appends to and
        blanks the same file, never replaces it)."""

    def _read(self, offset: int, length: int) -> bytes:
        if self._fd is None:
            self._fd = open_regular(self._path, self._path.parent)
            weakref.finalize(self, os.close, self._fd)
        return os.pread(self._fd, length, offset)

    def __getitem__(self, key: str) -> dict[str, Any]:
        held = self._held.get(key)
        if held is not None:
            return held
        label = self._labels.get(key)
        place = self._lines.place(label) if label is not None else None
        if place is None:
            raise KeyError(key)
        line = self._read(*place)
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or row.get("id") != key:
            raise KeyError(key)  # blanked by a newer generation meanwhile: the record is gone
        record = {"document": row.get("document"), "metadata": row.get("metadata") or {}}
        self._held[key] = record
        return record

    def hold(self, keys: Sequence[str]) -> None:
        """Read the lines of those of ``keys`` not read yet in one pass over the file, where there are many
        (a listing, a ``where`` over every record); a few are left to be read one by one when asked for."""
        by_label = {self._labels[k]: k for k in keys if k not in self._held and k in self._labels}
        if len(by_label) < _BULK_READ:
            return
        labels, offsets, lengths = self._lines.located(np.fromiter(by_label, np.int64, len(by_label)))
        if not len(labels):
            return
        with open(self._path, "rb", opener=lambda path, _flags: open_regular(path, self._path.parent)) as fh:
            data = read_fd(fh.fileno(), int((offsets + lengths).max()))
        chunks = [data[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist())]
        try:
            rows = orjson.loads(b"[" + b",".join(chunks) + b"]")
        except orjson.JSONDecodeError:
            return  # a line changed since the load (blanked by a newer generation): each is read when asked
        for label, row in zip(labels.tolist(), rows):
            key = by_label[label]
            if isinstance(row, dict) and row.get("id") == key:
                self._held[key] = {"document": row.get("document"), "metadata": row.get("metadata") or {}}

    def __setitem__(self, key: str, value: dict[str, Any]) -> None:
        self._held[key] = value

    def __delitem__(self, key: str) -> None:
        self._held.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._labels

    def __iter__(self):
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)


def _read_heads(root: Path, heads: Any, records_length: int,
                ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The live lines' ids, labels, offsets, lengths and id CRCs as the heads files ``heads`` (the state's
    ``[token, rows, id bytes]``) name them, or None when the state names none or the files do not agree with
    it (missing, short, another token, rows and ids that do not add up): the records file is parsed then."""
    try:
        token, rows, size = (int(v) for v in heads)
        table_bytes = 8 * _HEAD_COLUMNS * (rows + 1)
        fds = [open_regular(root / HEADS, root)]
        try:
            fds.append(open_regular(root / HEAD_IDS, root))
            # rows and bytes the state claims past what the files hold: never allocated, the records parsed
            if rows < 0 or size < 0 or os.fstat(fds[0]).st_size < table_bytes or os.fstat(fds[1]).st_size < size:
                return None
            table = np.frombuffer(read_fd(fds[0], table_bytes), dtype="<i8")
            blob = read_fd(fds[1], size)
        finally:
            for fd in fds:
                os.close(fd)
        if table.size != _HEAD_COLUMNS * (rows + 1) or len(blob) != size:
            return None
        table = table.reshape(rows + 1, _HEAD_COLUMNS)
        if table[0, 0] != _HEADS_MARK or table[0, 1] != token:
            return None
        table = table[1:]
        id_ends = np.cumsum(table[:, _ID_LEN] + 1)
        if rows and (id_ends[-1] != size or not np.array_equal(table[:, _ID_AT], id_ends - table[:, _ID_LEN] - 1)):
            return None
        ids = blob.decode("utf-8").split("\n")
    except (OSError, TypeError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    live = table[:, _LINE_LEN] > 0
    if len(ids) != rows + 1 or ids[-1]:
        return None
    if live.all():
        del ids[-1]
    else:
        table, ids = table[live], list(itertools.compress(ids, live.tolist()))
    if np.any(table[:, _LINE_AT] + table[:, _LINE_LEN] > records_length):
        return None
    return ids, table[:, _LABEL], table[:, _LINE_AT], table[:, _LINE_LEN], table[:, _ID_CRC]


def _parse_lines(root: Path, generation: int, length: int) -> tuple[list[str], np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """The live lines' ids, labels, offsets and lengths, parsed from the first ``length`` bytes of the records
    file: each line's head (its id and label, which every line starts with) only, all at once (orjson). A
    line that does not start that way is parsed whole."""
    fd = open_regular(root / RECORDS, root)
    try:
        if os.fstat(fd).st_size < length:  # refused before a buffer of the claimed length is allocated
            raise ValueError(f"{RECORDS} is shorter than generation {generation} says")
        data = read_fd(fd, length)
    finally:
        os.close(fd)
    if len(data) != length or (length and not data.endswith(b"\n")):
        raise ValueError(f"{RECORDS} is shorter than generation {generation} says")
    lines = data.split(b"\n")[:-1]
    del data
    sizes = np.fromiter(map(len, lines), np.int64, len(lines))
    starts = np.cumsum(sizes + 1) - (sizes + 1)
    live = np.fromiter((line[:1] == b"{" for line in lines), bool, len(lines))
    if not all(not line.strip(b" ") for line in itertools.compress(lines, ~live)):
        raise ValueError(f"{RECORDS} holds a line that is neither a record nor blanked")
    live_lines = list(itertools.compress(lines, live))
    del lines
    heads = [line[:end] + b"}" if end > 0 else line
             for line, end in zip(live_lines, (line.find(_DOCUMENT_KEY) for line in live_lines))]
    try:
        try:
            rows = orjson.loads(b"[" + b",".join(heads) + b"]")
        except orjson.JSONDecodeError:  # a line not cut where this writer's lines are: every line whole
            rows = orjson.loads(b"[" + b",".join(live_lines) + b"]")
        del heads

        def ids_and_labels(rows: list[Any]) -> tuple[list[str], np.ndarray]:
            return (list(map(operator.itemgetter("id"), rows)),
                    np.fromiter(map(operator.itemgetter("label"), rows), np.int64, len(rows)))

        try:
            ids, labels_of = ids_and_labels(rows)
        except (KeyError, TypeError):
            # a line not written as id, label, document, metadata: those lines are parsed whole
            ids, labels_of = ids_and_labels([row if isinstance(row, dict) and "id" in row and "label" in row
                                             else orjson.loads(line) for row, line in zip(rows, live_lines)])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{RECORDS} does not parse: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{RECORDS} holds a line without an id and label: {exc}") from exc
    return ids, labels_of, starts[live], sizes[live]
