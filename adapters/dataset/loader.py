"""Reading one pinned version of a dataset: :class:`DatasetLoader` (and ``torchdata.torch_dataset`` over it), which yield
the examples no manifest hides and refuse any shard whose bytes no longer hash to the pin."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from .files import (
    DecodeLimits,
    Manifest,
    PinMismatchError,
    ShardEntry,
    manifest_name,
    sha256,
)
from .shards import decode_rows
from .versions import DatasetFiles, Example, Pointer


class DatasetLoader:
    """Yields the examples of one manifest version that no manifest hides: every row of its shards, in
    order, except those the version lists as deleted or suppressed and those the current version lists as
    suppressed (an erasure hides an example from every version at once).

    The version is the current one, ``version``, the one training run ``pin`` recorded, or ``pointer``
    (one of :meth:`DatasetFiles.pins`). Its manifest
    must hash to the pin (CURRENT's or the run's; a bare ``version`` has no pin to check) and each shard to
    the SHA-256 the manifest records: anything else raises :class:`PinMismatchError` before a row of that
    shard is yielded. Every file is read and decoded within ``limits`` (:class:`~.files.DecodeLimits`;
    a shard past them raises :class:`~.files.DatasetBoundError` naming it).
    """

    def __init__(self, path: str | os.PathLike[str], *, version: int | None = None, pin: str | None = None,
                 pointer: Pointer | None = None, limits: DecodeLimits | None = None) -> None:
        if sum(x is not None for x in (version, pin, pointer)) > 1:
            raise ValueError("give a version, a pin or a pointer, not more than one")
        self.root = Path(path)
        self._store = DatasetFiles(self.root, limits=limits)
        if pointer is not None:
            self.pointer = pointer
        elif pin is not None:
            self.pointer = self._store.pin(pin)
        elif version is not None:
            self.pointer = Pointer(f"v{version}", version, None)
        else:
            self.pointer = self._store.current()

    def manifest(self) -> Manifest:
        """The pinned manifest, checked against the pin."""
        data = self._store.manifest_bytes(self.pointer.version)
        if self.pointer.sha256 is not None and sha256(data) != self.pointer.sha256:
            raise PinMismatchError(f"manifest v{self.pointer.version} no longer matches {self.pointer.name}"
                                   f" (it was rewritten, by an erasure or otherwise): refused")
        return Manifest.from_bytes(data, str(self.root / manifest_name(self.pointer.version)))

    def shards(self) -> list[ShardEntry]:
        return self.manifest().shards

    def hidden(self, manifest: Manifest | None = None) -> set[str]:
        manifest = manifest or self.manifest()
        current = self._store.manifest(self._store.current().version)
        return manifest.hidden() | set(current.suppressed)

    def iter_shards(self, shards: Sequence[ShardEntry], hidden: set[str]) -> Iterator[Example]:
        for entry in shards:
            data = self._store._read(entry.path)
            if sha256(data) != entry.sha256:
                raise PinMismatchError(f"shard {entry.path} no longer matches manifest v{self.pointer.version}"
                                       f" ({self.pointer.name}): it was rewritten, by an erasure or otherwise: refused")
            for row in decode_rows(data, entry.format, entry.path, self._store.limits):
                if row.id not in hidden:
                    yield Example(row.id, row.text, row.meta)

    def __iter__(self) -> Iterator[Example]:
        manifest = self.manifest()
        return self.iter_shards(manifest.shards, self.hidden(manifest))


__all__ = ["DatasetLoader"]
