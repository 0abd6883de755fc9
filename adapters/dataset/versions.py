"""A dataset directory as readers see it: the current pointer, the manifest versions, the pins and the shard
files (:class:`DatasetFiles`), and the records they yield (:class:`Example`, :class:`Pointer`). Below both the
loaders (``loader``) and the writing store (``store``), which import it; it imports neither."""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import (
    CURRENT,
    MANIFESTS,
    PINS,
    SHARDS,
    DatasetFileError,
    DecodeLimits,
    Manifest,
    dataset_folder,
    is_temp,
    load_json,
    manifest_name,
    manifest_versions,
    pin_file,
    read_file,
)

BACKEND = "dataset"
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


def content_hash(text: str) -> str:
    """SHA-256 hex of an example's text (the lineage db keeps it keyed, never the text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Example:
    """One training example, as a loader yields it."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pointer:
    """A pin: the manifest version a reader uses and the SHA-256 its manifest file had when pinned."""

    name: str
    """``CURRENT`` or ``training run <id>``."""
    version: int
    sha256: str | None


class DatasetFiles:
    """A dataset directory, read-only: the current pointer, the manifest versions, the pins and the shard
    files (what loaders and the probes read; :class:`DatasetStore` adds the writes). Every file is read
    within ``limits`` (:class:`~.files.DecodeLimits`), from the dataset directory or one of its folders,
    never through a link."""

    def __init__(self, path: str | os.PathLike[str], *, store: str = BACKEND, limits: DecodeLimits | None = None) -> None:
        self.root = Path(path)
        self.store = store
        self.limits = limits or DecodeLimits()

    def _file(self, path: Path) -> bytes:
        """A file of the dataset, read within the bound (``read_file``)."""
        return read_file(path, self.limits.max_decoded_bytes)

    def _folder(self, name: str) -> Path:
        """One of the dataset's folders, refused when it is a link or not a folder."""
        return dataset_folder(self.root, name)

    # -- reading the versions --------------------------------------------------------------------

    def current(self) -> Pointer:
        """The current pointer: the version new readers get."""
        body = load_json(self._read(CURRENT), f"{self.root / CURRENT}", ("version", "sha256"))
        return Pointer(CURRENT, int(body["version"]), str(body["sha256"]))

    def current_version(self) -> int:
        return self.current().version

    def versions(self) -> list[int]:
        """Every manifest version on disk."""
        return list(manifest_versions(self.root))

    def manifest_bytes(self, version: int) -> bytes:
        self._folder(MANIFESTS)
        path = self.root / manifest_name(version)
        try:
            return self._file(path)
        except FileNotFoundError:
            raise DatasetFileError(f"dataset {self.root} has no manifest version {version} ({path} is missing)",
                                   store=self.store) from None

    def manifest(self, version: int | None = None) -> Manifest:
        """A manifest version (default: the current one), as its file holds it."""
        version = self.current().version if version is None else version
        return Manifest.from_bytes(self.manifest_bytes(version), str(self.root / manifest_name(version)))

    def pins(self) -> list[Pointer]:
        """The current pointer and every training run's pin."""
        out = [self.current()]
        folder = self._folder(PINS)
        if folder.is_dir():
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.endswith(".json") and not is_temp(entry.name):
                    body = load_json(self._file(Path(entry.path)), entry.path, ("run_id", "version", "manifest_sha256"))
                    out.append(Pointer(f"training run {body['run_id']}", int(body["version"]),
                                       str(body["manifest_sha256"])))
        return out

    def pin(self, run_id: str) -> Pointer:
        self._folder(PINS)
        path = pin_file(self.root, run_id)
        try:
            data = self._file(path)
        except FileNotFoundError:
            raise DatasetFileError(f"no training run {run_id!r} is pinned in {self.root}", store=self.store) from None
        body = load_json(data, str(path), ("run_id", "version", "manifest_sha256"))
        return Pointer(f"training run {body['run_id']}", int(body["version"]), str(body["manifest_sha256"]))

    def _read(self, rel: str) -> bytes:
        if "/" in rel:
            self._folder(rel.split("/", 1)[0])
        path = self.root / rel
        try:
            return self._file(path)
        except FileNotFoundError:
            raise DatasetFileError(f"dataset file {path} is missing", store=self.store) from None

    def shard_files(self) -> list[Path]:
        """Every file in ``shards/`` (shards of any version, shards no manifest lists, temporary files)."""
        folder = self._folder(SHARDS)
        if not folder.is_dir():
            return []
        return sorted(Path(e.path) for e in os.scandir(folder) if not e.is_dir(follow_symlinks=False))

    # -- what the probes read ----------------------------------------------------------------------

    def references(self) -> dict[str, list[str]]:
        """For each shard path any manifest on disk lists: which versions list it, and which pins point at
        those versions (``v3 (pinned by training run ft-7)``)."""
        pinned: dict[int, list[str]] = {}
        with contextlib.suppress(DatasetFileError):
            for pointer in self.pins():
                pinned.setdefault(pointer.version, []).append(pointer.name)
        out: dict[str, list[str]] = {}
        for version, path in manifest_versions(self.root).items():
            try:
                manifest = Manifest.from_bytes(self._file(path), str(path))
            except DatasetFileError:
                continue
            label = f"v{version}" + (f" (pinned by {', '.join(pinned[version])})" if version in pinned else "")
            for entry in manifest.shards:
                out.setdefault(entry.path, []).append(label)
        return out


__all__ = ["BACKEND", "DatasetFiles", "Example", "Pointer", "content_hash"]
