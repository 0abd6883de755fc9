"""Adapter for the dataset backend: manifest suppressed list, shard rewrite + re-pin, decode-and-scan probe."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter, Capability, ExtraFinding, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.physical import default_patterns

from .copies import find_copies, own_records
from .files import (
    CURRENT,
    DatasetBoundError,
    DatasetFileError,
    DecodeLimits,
    PinMismatchError,
    iter_files,
    read_file,
)
from .hooks import DatasetHooks
from .loader import DatasetLoader
from .shards import decode_columns, format_of
from .store import BACKEND, ERASURE, DatasetFiles, DatasetStore

MAX_VERSIONS_LISTED = 20
"""The evidence lists this many manifest versions by name (the newest), and counts the rest."""


class DatasetAdapter(DatasetHooks, Adapter):
    """Options: ``path`` (the dataset directory, required), ``lock_wait`` (seconds, optional),
    ``max_decoded_bytes`` and ``max_rows`` (the decode bounds of one file, :class:`~.files.DecodeLimits`)."""

    backend = BACKEND
    capabilities = frozenset(
        {Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE, Capability.PHYSICAL_SCAN}
    )
    levels = (Level.LOGICAL, Level.PHYSICAL)
    read_only_supported = True

    def __init__(self, store: str, options: dict[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        root = Path(options["path"])
        if not (root / CURRENT).exists():
            raise StoreUnavailableError(f"no dataset at {root} (it has no {CURRENT} file)", store=store,
                                        retryable=False)
        kwargs = {"lock_wait": float(options["lock_wait"])} if "lock_wait" in options else {}
        self.limits = DecodeLimits.from_options(options, store)
        self.data = DatasetStore(root, store=store, create=False, limits=self.limits, **kwargs)
        self.files: DatasetFiles = self.data
        self.files.manifest()  # a current pointer or manifest that cannot be read stops an erasure before it starts

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """The file system's errors, and pyarrow's (a Parquet shard it cannot read or write)."""
        errors: tuple[type[BaseException], ...] = (OSError,)
        try:
            import pyarrow

            errors += (pyarrow.ArrowException,)
        except ImportError:  # pragma: no cover - installed with the dataset extra
            pass
        return errors

    def lock_path(self) -> Path:
        """The dataset directory: its lock file is ``<directory>.tombstone.lock``, the one writers take."""
        return self.files.root

    def _locked(self) -> contextlib.AbstractContextManager[Any]:
        """The store's lock around a probe (a read-only adapter takes none: it creates no file)."""
        return contextlib.nullcontext() if getattr(self, "read_only", False) else self.data.lock

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    # -- the erasure --------------------------------------------------------------------------

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return self.data.suppress(self._ids(artifacts))

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.data.delete(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return self.data.reclaim(self._ids(artifacts))

    # -- logical: what a training loader would still yield --------------------------------------

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        wanted = set(self._ids(artifacts))
        returned: dict[str, set[str]] = {}
        refused: dict[str, str] = {}
        read: dict[tuple[int, str | None], tuple[set[str], str | None]] = {}
        with self._locked():
            for pointer in self.files.pins():
                path = "loader (current)" if pointer.name == CURRENT else f"loader ({pointer.name}, v{pointer.version})"
                key = (pointer.version, pointer.sha256)
                if key not in read:  # runs pinned to one version read the same rows: load it once
                    seen: set[str] = set()
                    why = None
                    try:
                        # rows yielded before a refusal count: a trainer would have read them
                        for example in DatasetLoader(self.files.root, pointer=pointer, limits=self.limits):
                            if example.id in wanted:
                                seen.add(example.id)
                    except PinMismatchError as exc:
                        why = str(exc)
                    except DatasetBoundError as exc:  # what a loader would yield from it is not known
                        raise PhysicalUnsupportedError(f"{exc}; {path} cannot be checked", store=self.store) from exc
                    read[key] = (seen, why)
                returned[path], why = read[key]
                if why:
                    refused[path] = why
        results = {}
        for art in artifacts:
            by = sorted(path for path, ids in returned.items() if art.artifact_id in ids)
            results[art.artifact_id] = ProbeResult(
                level=Level.LOGICAL,
                passed=not by,
                measurement=f"yielded by {', '.join(by)}" if by else None,
                evidence={"paths": sorted(returned), "returned_by": by,
                          **({"refused": refused} if refused else {})},
            )
        return results

    # -- physical: every byte of every file, and every decoded row of every shard ----------------

    @contextlib.contextmanager
    def physical_snapshot(self) -> Iterator[dict[Path, str]]:
        root = self.files.root
        if not os.access(root, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"dataset directory {root} is not readable", store=self.store)
        with self._locked():
            yield {path: os.path.relpath(path, root) for path in iter_files(root)}

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        """The id as UTF-8 and, where JSON escapes it differently, as a JSON string holds it (raw UTF-8, ASCII
        escapes, escaped slashes: the ways a JSON writer spells it in a shard that is byte-scanned only)."""
        patterns = default_patterns(artifact)
        forms = set()
        for spelled in (json.dumps(artifact.artifact_id, ensure_ascii=False)[1:-1], json.dumps(artifact.artifact_id)[1:-1]):
            forms.update((spelled.encode("utf-8"), spelled.replace("/", "\\/").encode("utf-8")))
        forms.discard(patterns["id"])
        for n, form in enumerate(sorted(forms)):
            patterns["id_json" if n == 0 else f"id_json{n}"] = form
        return patterns

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """Decode every row of every shard file a manifest lists — current, older versions' — and look for
        each artifact's id and (with the lineage key) its keyed content hash: a Parquet or gzip shard is
        compressed, so the byte scan alone proves nothing about it. Every decode is bounded (``limits``): a
        listed shard past a bound cannot be checked (PhysicalUnsupportedError naming it: UNVERIFIED). Every
        other file under the dataset directory whose content is a format the probe reads is decoded and
        searched too (:mod:`.copies`); one that cannot be decoded leaves the artifacts found nowhere
        unprobed (UNVERIFIED, naming it)."""
        ids = set(self._ids(artifacts))
        keyed = getattr(self, "content_key", None)
        by_content: dict[str, set[str]] = {}
        if keyed is not None:
            for art in artifacts:
                if art.content_hash:
                    by_content.setdefault(art.content_hash, set()).add(art.artifact_id)
        id_hits: dict[str, dict[str, int]] = {}
        content_hits: dict[str, dict[str, int]] = {}
        rows = 0
        decoded: list[str] = []
        with self._locked():
            references = self.files.references()
            pins = self.files.pins()
            versions = self.files.versions()
            for path in self.files.shard_files():
                rel = os.path.relpath(path, self.files.root)
                fmt = format_of(path.name)
                if fmt is None or rel not in references:
                    continue  # not a listed shard: a copy, if its content is a format read here
                try:
                    data = read_file(path, self.limits.max_decoded_bytes)
                    shard_ids, texts = decode_columns(data, fmt, rel, texts=bool(by_content), limits=self.limits)
                except FileNotFoundError:
                    continue
                except DatasetFileError as exc:
                    raise PhysicalUnsupportedError(f"{exc}; its rows cannot be checked", store=self.store) from exc
                decoded.append(rel)
                rows += len(shard_ids)
                for row_id in shard_ids:
                    if row_id in ids:
                        id_hits.setdefault(row_id, {}).setdefault(rel, 0)
                        id_hits[row_id][rel] += 1
                if by_content and texts is not None:
                    for row_id, text in zip(shard_ids, texts):
                        for owner in by_content.get(keyed(hashlib.sha256(text.encode("utf-8")).hexdigest()), ()):
                            if owner != row_id:
                                content_hits.setdefault(owner, {}).setdefault(rel, 0)
                                content_hits[owner][rel] += 1
            forms = {art.artifact_id: [p for kind, p in self.physical_patterns(art).items() if kind.startswith("id")]
                     for art in artifacts}
            copies = find_copies(self.files.root, set(decoded), own_records(self.files.root, ERASURE), forms,
                                 by_content, keyed, self.limits)
        evidence = {
            "rows_decoded": rows,
            "shard_files_decoded": len(decoded),
            "content_check": "keyed content hash of every decoded row" if keyed is not None
            else "ids only (no lineage key: an independent verifier)",
            "manifest_versions": _versions_listed(versions, references, self.files.root),
            "pins": [f"{p.name} -> v{p.version}" for p in pins],
            **copies.evidence(),
        }
        out = {}
        for art in artifacts:
            found = []
            for rel, n in sorted(id_hits.get(art.artifact_id, {}).items()):
                found.append(f"row decoded {n}x in {rel} ({_listed_by(rel, references)})")
            for rel, n in sorted(content_hits.get(art.artifact_id, {}).items()):
                found.append(f"content decoded in {n} other row(s) of {rel} ({_listed_by(rel, references)})")
            found += copies.found(art.artifact_id)
            out[art.artifact_id] = ExtraFinding(
                found=found, id_found=art.artifact_id in id_hits or copies.id_found(art.artifact_id),
                content_found=art.artifact_id in content_hits or art.artifact_id in copies.content_hits,
                evidence=evidence, unchecked=copies.unchecked())
        return out


def _listed_by(rel: str, references: dict[str, list[str]]) -> str:
    listed = references.get(rel)
    return f"listed by manifest {', '.join(listed)}" if listed else "listed by no manifest"


def _versions_listed(versions: list[int], references: dict[str, list[str]], root: Path) -> list[str]:
    """Each manifest version on disk with how many of its shards are on disk (every one of them decoded)."""
    per_version: dict[str, list[str]] = {}
    for rel, labels in references.items():
        for label in labels:
            per_version.setdefault(label.split(" ", 1)[0], []).append(rel)
    out = []
    for version in versions[-MAX_VERSIONS_LISTED:]:
        shards = per_version.get(f"v{version}", [])
        on_disk = sum(1 for rel in shards if (root / rel).exists())
        out.append(f"v{version}: {len(shards)} shard(s), {on_disk} on disk")
    if len(versions) > MAX_VERSIONS_LISTED:
        out.insert(0, f"{len(versions) - MAX_VERSIONS_LISTED} older version(s) (their shards decoded too)")
    return out
