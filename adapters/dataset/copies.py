"""The dataset's physical probe beyond its manifests: copies of rows anywhere under the dataset directory.

"No file under the dataset directory holds the id" has to hold for files the byte scan cannot see into: a
gzip copy of a shard in ``shards/archive/``, a zstd-compressed Parquet file in ``backup/``, a
``dump.jsonl.gz`` at the top. So every regular file under the directory that the manifest step did not
decode (it decodes the shards the manifests list) and that is not one of the store's own plain-text
records (``CURRENT``, the manifests, the pins, the erasure note) is read from its first bytes: when its
content is a format :mod:`.sniff` reads (told by content, never by name, suffix or folder) it is decoded
within the store's bounds and every decoded value is searched for the artifacts' ids and, with the lineage
key, hashed for their keyed content hash. Bytes a compression layer or an archive held in no format read
here are byte-scanned for the ids. A file in one of these formats that cannot be decoded (truncated,
corrupt, encrypted, past a bound) is named, and the artifacts found nowhere are not probed (UNVERIFIED),
never clean. Any other file is left to the byte scan of every file, as before.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import (
    CURRENT,
    PINS,
    DatasetFileError,
    DecodeLimits,
    iter_files,
    manifest_versions,
    read_file,
)
from .sniff import HEAD, TEXT_KINDS, Piece, decode, kind_of

NAMED_AT_MOST = 50
"""How many decoded copies the evidence names (the rest are counted)."""
REASONS_AT_MOST = 5
"""How many undecodable files the reason of an unprobed artifact names."""
UNLISTED = "listed by no manifest"


def own_records(root: Path, erasure_note: str) -> set[str]:
    """The store's own records (relative paths): the current pointer, the erasure note, the manifest files
    and the pins. Byte-scanned like every file; decoded as copies only when their content is not plain text."""
    out = {CURRENT, erasure_note}
    out.update(os.path.relpath(path, root) for path in manifest_versions(root).values())
    pins = root / PINS
    if pins.is_dir() and not pins.is_symlink():
        out.update(f"{PINS}/{entry.name}" for entry in os.scandir(pins) if entry.name.endswith(".json"))
    return out


class _Matcher:
    """Every form of every artifact id, found in one pass over a blob of decoded values."""

    def __init__(self, forms: Mapping[str, Iterable[bytes]]) -> None:
        import ahocorasick_rs

        owners: dict[bytes, set[str]] = {}
        for artifact_id, spelled in forms.items():
            for form in spelled:
                if form:
                    owners.setdefault(form, set()).add(artifact_id)
        self.patterns = sorted(owners)
        self.owners = [owners[p] for p in self.patterns]
        self.search = ahocorasick_rs.BytesAhoCorasick(self.patterns) if self.patterns else None

    def count(self, blob: bytes) -> dict[str, int]:
        found: dict[str, int] = {}
        if self.search is None or not blob:
            return found
        for index, _, _ in self.search.find_matches_as_indexes(blob, overlapping=True):
            for artifact_id in self.owners[index]:
                found[artifact_id] = found.get(artifact_id, 0) + 1
        return found


@dataclass
class Copies:
    """What the look at the unlisted files found."""

    decoded: dict[str, tuple[set[str], int]] = field(default_factory=dict)
    """Relative path -> (how it was decoded, rows)."""
    unreadable: list[str] = field(default_factory=list)
    """Why each file in a format read here could not be decoded (it names the file)."""
    id_hits: dict[str, dict[str, int]] = field(default_factory=dict)
    """Artifact id -> relative path -> decoded values holding the id."""
    raw_hits: dict[str, dict[str, int]] = field(default_factory=dict)
    """Artifact id -> relative path -> times the id is in its decompressed bytes of no format read here."""
    content_hits: dict[str, dict[str, int]] = field(default_factory=dict)
    """Artifact id -> relative path -> decoded values whose keyed content hash is the artifact's."""

    def found(self, artifact_id: str) -> list[str]:
        """One measurement per file holding the artifact."""
        out = []
        for rel, n in sorted(self.id_hits.get(artifact_id, {}).items()):
            out.append(f"row decoded {n}x in {rel} ({UNLISTED}; {self._how(rel)})")
        for rel, n in sorted(self.raw_hits.get(artifact_id, {}).items()):
            out.append(f"id found {n}x in the decompressed bytes of {rel} ({UNLISTED}; {self._how(rel)})")
        for rel, n in sorted(self.content_hits.get(artifact_id, {}).items()):
            out.append(f"content decoded in {n} value(s) of {rel} ({UNLISTED}; {self._how(rel)})")
        return out

    def id_found(self, artifact_id: str) -> bool:
        return artifact_id in self.id_hits or artifact_id in self.raw_hits

    def _how(self, rel: str) -> str:
        return ", ".join(sorted(self.decoded.get(rel, (set(), 0))[0])) or "decoded"

    def evidence(self) -> dict[str, Any]:
        names = [f"{rel} ({', '.join(sorted(how))}; {rows} row(s))" for rel, (how, rows) in sorted(self.decoded.items())]
        if len(names) > NAMED_AT_MOST:
            names = names[:NAMED_AT_MOST] + [f"... and {len(names) - NAMED_AT_MOST} more"]
        return {"copies_decoded": names, **({"copies_not_decoded": list(self.unreadable)} if self.unreadable else {})}

    def unchecked(self) -> str | None:
        """Why an artifact found nowhere is not probed, or None when every copy was decoded."""
        if not self.unreadable:
            return None
        named = "; ".join(self.unreadable[:REASONS_AT_MOST])
        more = len(self.unreadable) - REASONS_AT_MOST
        return (f"{len(self.unreadable)} file(s) under the dataset directory, {UNLISTED}, hold data in a format the"
                f" probe reads but could not be decoded, so the rows may be there: {named}"
                + (f"; and {more} more" if more > 0 else ""))


def find_copies(root: Path, skip: set[str], own: set[str], forms: Mapping[str, Iterable[bytes]],
                by_content: Mapping[str, set[str]], keyed: Callable[[str], str] | None,
                limits: DecodeLimits) -> Copies:
    """Decode every regular file under ``root`` but those in ``skip`` (decoded from the manifests) and the
    store's plain-text records ``own``, when its content is a format read here; search the decoded values
    for ``forms`` (artifact id -> the byte forms of its id) and, with ``keyed``, for the keyed content
    hashes in ``by_content`` (keyed hash -> artifact ids)."""
    matcher = _Matcher(forms)
    copies = Copies()
    for path in iter_files(root):
        rel = os.path.relpath(path, root)
        if rel in skip:
            continue
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # the byte scan names what is not a regular file
            kind = kind_of(read_file(path, limits.max_decoded_bytes, head=HEAD))
            if kind is None or (rel in own and kind in TEXT_KINDS):
                continue
            data = read_file(path, limits.max_decoded_bytes)
            for piece in decode(data, rel, limits):
                _search(piece, rel, matcher, by_content, keyed, copies)
        except FileNotFoundError:
            continue
        except DatasetFileError as exc:
            copies.unreadable.append(str(exc))
    return copies


def _search(piece: Piece, rel: str, matcher: _Matcher, by_content: Mapping[str, set[str]],
            keyed: Callable[[str], str] | None, copies: Copies) -> None:
    how, rows = copies.decoded.get(rel, (set(), 0))
    copies.decoded[rel] = (how | {piece.chain}, rows + piece.rows)
    if piece.raw is not None:
        _add(copies.raw_hits, matcher.count(bytes(piece.raw)), rel)
        return
    values = [v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass") for v in piece.cells]
    _add(copies.id_hits, matcher.count(b"\x00".join(values)), rel)
    if keyed is not None and by_content:
        hits: dict[str, int] = {}
        for value, n in Counter(values).items():  # each distinct value hashed once (JSON keys repeat in every row)
            for owner in by_content.get(keyed(hashlib.sha256(value).hexdigest()), ()):
                hits[owner] = hits.get(owner, 0) + n
        _add(copies.content_hits, hits, rel)


def _add(into: dict[str, dict[str, int]], counts: Mapping[str, int], rel: str) -> None:
    for artifact_id, n in counts.items():
        into.setdefault(artifact_id, {}).setdefault(rel, 0)
        into[artifact_id][rel] += n


__all__ = ["Copies", "find_copies", "own_records"]
