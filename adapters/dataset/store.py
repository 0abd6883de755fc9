"""The dataset store apps use: training examples in shard files, versioned by pinned manifests.

RAG text often also becomes fine-tuning data: chunks are exported as training examples into shard files,
and a manifest pins the exact shard hashes a training run used. :class:`DatasetStore` writes the examples
(recording at write time which subject owns each and which chunk it was exported from), suppresses and
deletes them, reclaims them (drops the rows, rewrites the shards, re-hashes, writes a new manifest version
and re-pins the current pointer) and records training runs. :class:`DatasetLoader` (and
``torch_dataset``) yields the unsuppressed rows of one pinned version and refuses any shard whose bytes no
longer hash to the pin. The file layout is in :mod:`tombstone_adapters.dataset.files`.

Writes hold the store's lock (``<directory>.tombstone.lock``, beside it; ``tombstone.storelock``): a writer
from its first shard until its commit, the erasure steps for their whole run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.capture.writes import check_write
from tombstone.errors import StoreUnavailableError
from tombstone.faults import kill_point
from tombstone.lineage.db import ArtifactRecord, LineageDB

from .files import (
    COMPRESSIONS,
    CURRENT,
    MANIFESTS,
    PINS,
    SHARDS,
    SUFFIXES,
    DatasetBoundError,
    DecodeLimits,
    Manifest,
    PinMismatchError,
    ShardEntry,
    dump_json,
    is_temp,
    load_json,
    make_folder,
    manifest_name,
    manifest_versions,
    pin_file,
    sha256,
    write_atomic,
)
from .loader import DatasetLoader
from .shards import Row, decode_columns, drop_rows, encode_rows, format_of
from .versions import BACKEND, DatasetFiles, Example, Pointer, content_hash

try:
    from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for
except ImportError:  # pragma: no cover - a Tombstone release without per-store locks
    STORE_LOCK_WAIT = 300.0

    def lock_file_for(store_path: str | os.PathLike[str]) -> Path:
        return Path(os.path.realpath(store_path) + ".tombstone.lock")

    class StoreLock(contextlib.AbstractContextManager):  # type: ignore[no-redef]
        """Stands in where Tombstone has no per-store locks: takes none."""

        def __init__(self, path: Any, *, wait: float = STORE_LOCK_WAIT, store: str | None = None) -> None:
            self.path = Path(path)

        def acquire(self) -> None:
            pass

        def release(self) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            return None

KIND = "training_example"
"""The lineage kind of a training example."""
EXPORT_RELATION = "exported_as_example"
"""The lineage edge from the artifact an example was exported from (a chunk) to the example."""
TRAINING_KIND = "model_training"
"""The lineage kind of the record that a training run read an example (in the pseudo-store 'third-party')."""
TRAINING_RELATION = "trained_on_by"
"""The lineage edge from an example to the record of a training run that read it."""
ERASURE = "ERASURE"
"""The reclaim's note of the shards it rewrote (their paths and SHA-256 before), kept until the current
pointer is re-pinned: a resumed reclaim re-hashes exactly those shards, and no shard changed by anything else."""


def _sources(value: Any) -> list[tuple[str, str]]:
    """One example's sources: a (store, artifact id) pair or a list of them."""
    if value is None:
        return []
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return [value]
    pairs = [tuple(v) for v in value]
    if not all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        raise ValueError("each source is a (store, artifact id) pair")
    return pairs  # type: ignore[return-value]


class DatasetStore(DatasetFiles):
    """A dataset directory (see :mod:`~tombstone_adapters.dataset.files`) and the operations on it.

    ``format`` (``jsonl``, ``jsonl.gz`` or ``parquet``) and ``compression`` (Parquet: ``zstd``,
    ``snappy``, ``gzip`` or ``none``) apply to shards this store writes; ``shard_rows`` bounds the rows of
    one shard. ``lineage`` and ``store`` (the configured store name) let writes record lineage; without a
    lineage db nothing is recorded (the adapter opens the store that way). ``create=False`` refuses a
    directory that holds no dataset. ``limits`` bound every decode (:class:`~.files.DecodeLimits`). The
    files it creates are mode 0600, its folders 0700.
    """

    def __init__(self, path: str | os.PathLike[str], *, lineage: LineageDB | None = None, store: str = BACKEND,
                 format: str = "jsonl", compression: str = "zstd", shard_rows: int = 100_000, create: bool = True,
                 lock_wait: float = STORE_LOCK_WAIT, limits: DecodeLimits | None = None) -> None:
        if format not in SUFFIXES:
            raise ValueError(f"unknown shard format {format!r}: one of {', '.join(SUFFIXES)}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"unknown Parquet compression {compression!r}: one of {', '.join(COMPRESSIONS)}")
        if shard_rows < 1:
            raise ValueError("shard_rows must be at least 1")
        super().__init__(path, store=store, limits=limits)
        self.lineage = lineage
        self.format = format
        self.compression = compression
        self.shard_rows = shard_rows
        if not (self.root / CURRENT).exists():
            if not create:
                raise StoreUnavailableError(f"no dataset at {self.root} (it has no {CURRENT} file)", store=store,
                                            retryable=False)
        self.lock = StoreLock(lock_file_for(self.root), wait=lock_wait, store=store)
        if not (self.root / CURRENT).exists():
            with self.lock:
                if not (self.root / CURRENT).exists():
                    for folder in (MANIFESTS, SHARDS, PINS):
                        make_folder(self._folder(folder))
                    self._commit(Manifest(version=1))

    # -- writing -----------------------------------------------------------------------------------

    def loader(self, *, version: int | None = None, pin: str | None = None) -> "DatasetLoader":
        """A loader of one version: the current one, ``version``, or the one training run ``pin`` recorded."""
        return DatasetLoader(self.root, version=version, pin=pin, limits=self.limits)

    @contextlib.contextmanager
    def writer(self) -> Iterator["DatasetWriter"]:
        """Add examples in one new manifest version: ``with store.writer() as w: w.add(...)``. Nothing is
        committed if the block raises (shards it already wrote are removed)."""
        writer = DatasetWriter(self)
        try:
            yield writer
        except BaseException:
            writer.abort()
            raise
        writer.commit()

    def add(self, ids: Sequence[str], texts: Sequence[str], *, subject: str,
            sources: Sequence[Any] | None = None, metadatas: Sequence[Mapping[str, Any]] | None = None) -> int:
        """Add examples owned by ``subject`` as one new version; return the version. ``sources[i]`` is what
        example ``i`` was exported from: a (store, artifact id) pair or a list of them (lineage edges)."""
        with self.writer() as writer:
            writer.add(ids, texts, subject=subject, sources=sources, metadatas=metadatas)
        return writer.version

    def _commit(self, manifest: Manifest, *, after: str | None = None) -> Pointer:
        """Write ``manifest`` as the next version and point CURRENT at it (manifest first: CURRENT never
        names a missing file)."""
        version = max([0, *self.versions()]) + 1
        self._folder(MANIFESTS)
        manifest.version = version
        data = manifest.to_bytes()
        write_atomic(self.root / manifest_name(version), data)
        if after:
            kill_point(f"{after}:after-manifest-write")
        pointer = Pointer(CURRENT, version, sha256(data))
        write_atomic(self.root / CURRENT, dump_json({"version": version, "manifest": manifest_name(version),
                                                     "sha256": pointer.sha256}))
        if after:
            kill_point(f"{after}:after-repin")
        return pointer

    def _next_from_current(self) -> tuple[Pointer, Manifest]:
        """The current manifest, as the base of the next version (parent and hash chain filled in)."""
        pointer = self.current()
        data = self.manifest_bytes(pointer.version)
        base = Manifest.from_bytes(data, str(self.root / manifest_name(pointer.version)))
        return pointer, Manifest(version=0, parent=pointer.version, previous_sha256=sha256(data),
                                 shards=list(base.shards), suppressed=list(base.suppressed), deleted=list(base.deleted))

    def _write_shard(self, rows: Sequence[Row], fmt: str) -> ShardEntry:
        data = encode_rows(rows, fmt, compression=self.compression)
        digest = sha256(data)
        self._folder(SHARDS)
        name, n = f"part-{digest[:16]}", 1
        while (self.root / SHARDS / f"{name}{SUFFIXES[fmt]}").exists() or (self.root / SHARDS / f"{name}{SUFFIXES[fmt]}").is_symlink():
            n += 1
            name = f"part-{digest[:16]}-{n}"
        rel = f"{SHARDS}/{name}{SUFFIXES[fmt]}"
        write_atomic(self.root / rel, data)
        return ShardEntry(rel, fmt, len(rows), digest)

    def delete(self, ids: Iterable[str]) -> int | None:
        """The dataset's own delete: a new version listing the ids as deleted, so loaders of it skip them.
        The rows stay in the shard files (every earlier version still holds them). Returns the new version,
        or None when every id was deleted already."""
        ids = set(ids)
        with self.lock:
            _, manifest = self._next_from_current()
            new = ids - set(manifest.deleted)
            if not new:
                return None
            manifest.deleted = sorted(set(manifest.deleted) | new)
            return self._commit(manifest).version

    # -- the erasure -------------------------------------------------------------------------------

    def suppress(self, ids: Iterable[str]) -> dict[str, Any]:
        """Add the ids to the manifest's suppressed list in a new version (no loader of any version yields
        them from then on). Idempotent: no new version when every id is suppressed already."""
        ids = set(ids)
        with self.lock:
            pointer, manifest = self._next_from_current()
            new = ids - set(manifest.suppressed)
            if new:
                manifest.suppressed = sorted(set(manifest.suppressed) | new)
                pointer = self._commit(manifest, after="suppress:dataset")
            return {"mechanism": "manifest suppressed list", "newly_suppressed": len(new), "version": pointer.version}

    def reclaim(self, ids: Iterable[str]) -> dict[str, Any]:
        """Drop the examples' rows from every shard file (each rewritten atomically), remove their ids from
        every manifest version, write a new manifest version with the rewritten shards re-hashed and re-pin
        the current pointer. Idempotent, and safe to run again after a kill at any point."""
        drop = set(ids)
        with self.lock:
            removed = self._remove_temp_files()
            note_path = self.root / ERASURE
            note: dict[str, str] = {}
            if note_path.exists():
                note = dict(load_json(self._file(note_path), str(note_path), ("shards",))["shards"])
            rewritten = []
            fresh: dict[str, ShardEntry] = {}
            rows_dropped = 0
            rows_rewritten = 0
            beyond: list[str] = []
            for path in self.shard_files():
                fmt = format_of(path.name)
                if fmt is None:
                    continue
                rel = f"{SHARDS}/{path.name}"
                try:
                    data = self._file(path)
                    new, dropped, kept = drop_rows(data, fmt, drop, rel, self.limits)
                except DatasetBoundError as exc:
                    beyond.append(str(exc))  # left as it is: the physical probe names it, UNVERIFIED
                    continue
                if new is None:
                    continue
                if rel not in note:
                    note[rel] = sha256(data)
                    write_atomic(note_path, dump_json({"shards": note}))
                write_atomic(path, new, before_rename="reclaim:dataset:shard-temp-written")
                kill_point("reclaim:dataset:after-shard-write")
                fresh[rel] = ShardEntry(rel, fmt, kept, sha256(new))
                rewritten.append(rel)
                rows_dropped += dropped
                rows_rewritten += kept
            scrubbed, relinked = self._scrub_manifests(drop)
            pointer = self.current()
            manifest = self.manifest(pointer.version)
            desired = self._rehashed(manifest, note, fresh)
            repinned = None
            if desired.shards != manifest.shards or pointer.sha256 != sha256(self.manifest_bytes(pointer.version)):
                desired.parent = pointer.version
                desired.previous_sha256 = sha256(self.manifest_bytes(pointer.version))
                repinned = self._repin(desired).version
            if note_path.exists():
                note_path.unlink()
                kill_point("reclaim:dataset:after-note-removed")
            return {
                "steps": ["drop rows and rewrite each affected shard (temporary file, fsync, rename)",
                          "remove the ids from every manifest version", "new manifest version with re-hashed shards",
                          "re-pin CURRENT"],
                "shards_rewritten": rewritten,
                "rows_dropped": rows_dropped,
                "rows_kept_in_rewritten_shards": rows_rewritten,
                "manifests_scrubbed": [f"v{v}" for v in scrubbed],
                "manifests_relinked": [f"v{v}" for v in relinked],
                "new_version": repinned,
                "current_version": self.current().version,
                "temporary_files_removed": removed,
                **({"shards_past_the_decode_bounds": beyond} if beyond else {}),
            }

    def _remove_temp_files(self) -> list[str]:
        """Temporary files a killed write left (only this store writes them, under its lock)."""
        removed = []
        for folder in (self.root, self._folder(SHARDS), self._folder(MANIFESTS), self._folder(PINS)):
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                if is_temp(entry.name) and not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
                    removed.append(os.path.relpath(entry.path, self.root))
        return sorted(removed)

    def _scrub_manifests(self, drop: set[str]) -> tuple[list[int], list[int]]:
        """Remove the ids from every manifest file, oldest first, and re-link the hash chain of each
        manifest whose parent an erasure rewrote (each file an erasure rewrites says so, so a resumed
        reclaim finds the links still to mend)."""
        scrubbed, relinked = [], []
        versions = manifest_versions(self.root)
        for version, path in versions.items():
            manifest = Manifest.from_bytes(self._file(path), str(path))
            changed = False
            if drop & manifest.hidden():
                manifest.suppressed = [i for i in manifest.suppressed if i not in drop]
                manifest.deleted = [i for i in manifest.deleted if i not in drop]
                manifest.rewritten_by_erasure = True
                scrubbed.append(version)
                changed = True
            parent = versions.get(manifest.parent) if manifest.parent is not None else None
            if parent is not None:
                parent_data = self._file(parent)
                if manifest.previous_sha256 != sha256(parent_data) and \
                        Manifest.from_bytes(parent_data, str(parent)).rewritten_by_erasure:
                    manifest.previous_sha256 = sha256(parent_data)
                    manifest.rewritten_by_erasure = True
                    relinked.append(version)
                    changed = True
            if changed:
                write_atomic(path, manifest.to_bytes())
                kill_point("reclaim:dataset:after-manifest-scrub")
        return scrubbed, relinked

    def _rehashed(self, manifest: Manifest, note: Mapping[str, str], fresh: Mapping[str, ShardEntry]) -> Manifest:
        """``manifest`` with the shards the erasure rewrote (``note``) re-hashed and re-counted (``fresh``:
        those this run wrote, whose hash and rows are known)."""
        shards = []
        for entry in manifest.shards:
            if entry.path in fresh and fresh[entry.path].format == entry.format:
                entry = fresh[entry.path]
            elif entry.path in note:
                data = self._read(entry.path)
                ids, _ = decode_columns(data, entry.format, entry.path, texts=False, limits=self.limits)
                entry = ShardEntry(entry.path, entry.format, len(ids), sha256(data))
            shards.append(entry)
        return Manifest(version=0, shards=shards, suppressed=list(manifest.suppressed), deleted=list(manifest.deleted))

    def _repin(self, desired: Manifest) -> Pointer:
        """Point CURRENT at ``desired``: at a manifest a killed reclaim already wrote with this content, or
        at a new version."""
        versions = self.versions()
        if versions and versions[-1] != desired.parent:
            latest = self.manifest(versions[-1])
            if (latest.parent, latest.previous_sha256, latest.shards, sorted(latest.suppressed), sorted(latest.deleted)) == \
                    (desired.parent, desired.previous_sha256, desired.shards, sorted(desired.suppressed), sorted(desired.deleted)):
                data = self.manifest_bytes(latest.version)
                write_atomic(self.root / CURRENT, dump_json({"version": latest.version,
                                                             "manifest": manifest_name(latest.version),
                                                             "sha256": sha256(data)}))
                kill_point("reclaim:dataset:after-repin")
                return Pointer(CURRENT, latest.version, sha256(data))
        return self._commit(desired, after="reclaim:dataset")

    # -- training runs -----------------------------------------------------------------------------

    def record_training_run(self, manifest_version: int, run_id: str, *, note: str = "") -> int:
        """Record that training run ``run_id`` reads manifest version ``manifest_version``: pin it
        (``pins/<run>.json``: the version and its manifest's SHA-256, what ``loader(pin=run_id)`` reads) and,
        in the lineage db, mark every example the run reads as derived into the run (an edge example →
        training run). A model trained on an example cannot be erased from here: erasing its subject gives
        that record NEEDS_HUMAN ("a model was trained on this example") until a model backend can check the
        weights. Record a run before it reads (the version must still load: an erasure since then rewrote
        it, and the loader would refuse it too). Returns how many examples were recorded."""
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id must be a non-empty string")
        with self.lock:
            data = self.manifest_bytes(manifest_version)
            pointer = Pointer(f"training run {run_id}", manifest_version, sha256(data))
            ids = [ex.id for ex in DatasetLoader(self.root, pointer=pointer, limits=self.limits)]
            self._folder(PINS)
            write_atomic(pin_file(self.root, run_id), dump_json({"run_id": run_id, "version": manifest_version,
                                                                 "manifest_sha256": pointer.sha256}))
        if self.lineage is None:
            return 0
        what = f"a model was trained on this example (dataset {self.store!r}, manifest v{manifest_version})"
        copies = self.lineage.record_third_parties(
            [(self.store, i) for i in ids], f"training run {run_id}",
            note=f"{what}; retrain or unlearn without it{': ' + note if note else ''}",
            kind=TRAINING_KIND, relation=TRAINING_RELATION)
        return len(copies)

class DatasetWriter:
    """Buffers examples into shards of ``shard_rows`` rows; commits them as one new version (see
    :meth:`DatasetStore.writer`)."""

    def __init__(self, store: DatasetStore) -> None:
        self.store = store
        self.rows: list[Row] = []
        self.written: list[ShardEntry] = []
        self.ids: set[str] = set()
        self.version: int | None = None
        self._locked = False

    def add(self, ids: Sequence[str], texts: Sequence[str], *, subject: str, sources: Sequence[Any] | None = None,
            metadatas: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Add examples owned by ``subject``. Lineage is recorded first, in its own transaction (assume the
        write will fail: a lineage row without its example costs nothing, an example without lineage could
        never be erased)."""
        if self.store.lineage is not None:
            check_write(self.store.lineage, self.store.store, [subject])
        ids, texts = list(ids), list(texts)
        sources = list(sources) if sources is not None else [None] * len(ids)
        metadatas = list(metadatas) if metadatas is not None else [{}] * len(ids)
        if not (len(ids) == len(texts) == len(sources) == len(metadatas)):
            raise ValueError("ids, texts, sources and metadatas must have the same length")
        for i, text in zip(ids, texts):
            if not isinstance(i, str) or not i:
                raise ValueError("each example id must be a non-empty string")
            if not isinstance(text, str):
                raise ValueError(f"example {i!r}: text must be a string")
            if i in self.ids:
                raise ValueError(f"example {i!r} is added twice")
        rows = [Row(i, t, json.dumps(dict(m), ensure_ascii=False, separators=(",", ":"), sort_keys=True))
                for i, t, m in zip(ids, texts, metadatas)]
        edges = [(src_store, src_id, self.store.store, i, EXPORT_RELATION)
                 for i, src in zip(ids, sources) for src_store, src_id in _sources(src)]
        if self.store.lineage is not None:
            self.store.lineage.record_artifacts(
                subject,
                [ArtifactRecord(store=self.store.store, artifact_id=i, backend=BACKEND, kind=KIND,
                                content_hash=content_hash(t)) for i, t in zip(ids, texts)],
                edges=edges)
        self.ids.update(ids)
        self.rows += rows
        while len(self.rows) >= self.store.shard_rows:
            self._flush(self.rows[: self.store.shard_rows])
            self.rows = self.rows[self.store.shard_rows :]

    def _flush(self, rows: list[Row]) -> None:
        if not self._locked:
            self.store.lock.acquire()
            self._locked = True
        self.written.append(self.store._write_shard(rows, self.store.format))

    def commit(self) -> None:
        try:
            if self.rows:
                self._flush(self.rows)
                self.rows = []
            with self.store.lock:
                if not self.written:
                    self.version = self.store.current_version()
                    return
                _, manifest = self.store._next_from_current()
                manifest.shards += self.written
                self.version = self.store._commit(manifest).version
        finally:
            self._unlock()

    def abort(self) -> None:
        try:
            for entry in self.written:
                with contextlib.suppress(OSError):
                    (self.store.root / entry.path).unlink()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            self.store.lock.release()


__all__ = ["BACKEND", "DatasetFiles", "DatasetLoader", "DatasetStore", "DatasetWriter", "Example", "PinMismatchError", "Pointer",
           "content_hash"]
