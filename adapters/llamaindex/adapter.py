"""Adapter for the folder a LlamaIndex app persists its storage to (``StorageContext.persist``, an ingestion
pipeline's ``persist``): the docstore, the index store, a simple vector store and the ingestion cache, as JSON.

An artifact is a node (or a source document) wherever the folder holds a copy of it; its id is the node id.
Hidden from the app's reads through ``TombstoneLlamaDocstore``; reclaimed by rewriting every JSON file of the
folder without it (``jsonfiles``); probed logically by walking that JSON (by id, and by the text's keyed hash)
and physically by the byte scan of every file of the folder."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter, Capability, ProbeResult
from tombstone.errors import ConfigError, PhysicalUnsupportedError, StoreUnavailableError
from tombstone.fsutil import write_atomic
from tombstone.lineage.db import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.physical import ExtraFinding

from . import jsonfiles

BACKEND = "llamaindex"
NODE = "node"
SUPPRESSED_FILE = ".tombstone-suppressed.json"
"""The folder's list of suppressed node ids, which ``TombstoneLlamaDocstore`` and the cache read (in any process);
the reclaim's rewrite of the folder's JSON removes each id from it with the rest."""


def suppressed_ids(folder: Path) -> set[str]:
    data = jsonfiles.load(folder / SUPPRESSED_FILE) if (folder / SUPPRESSED_FILE).is_file() else None
    ids = data.get("suppressed") if isinstance(data, dict) else None
    return {i for i in ids if isinstance(i, str)} if isinstance(ids, list) else set()


def matcher(artifacts: Sequence[ArtifactRecord], key: Any) -> jsonfiles.Matcher:
    return jsonfiles.Matcher({a.artifact_id for a in artifacts},
                             {a.content_hash: a.artifact_id for a in artifacts if a.content_hash}, key)


class LlamaStorageAdapter(Adapter):
    """Options: ``persist_dir``, the folder the app persists its LlamaIndex storage (and ingestion cache) to."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                              Capability.PHYSICAL_SCAN})
    levels = (Level.LOGICAL, Level.PHYSICAL)

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        super().__init__(store, options)
        if "persist_dir" not in options:
            raise ConfigError(f'store {store!r}: the {BACKEND} backend needs persist_dir = "..." (the folder'
                              " the app persists its LlamaIndex storage to)", store=store)
        self.folder = Path(options["persist_dir"])
        if self.folder.is_symlink() or not self.folder.is_dir():
            raise StoreUnavailableError(f"store {store!r}: no LlamaIndex persist folder at {self.folder}",
                                        store=store, retryable=False)

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        return (OSError, jsonfiles.Unreadable)

    def lock_path(self) -> Path:
        return self.folder

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        with self.store_lock():
            before = suppressed_ids(self.folder)
            ids = sorted(before | {a.artifact_id for a in artifacts})
            if len(ids) != len(before):
                write_atomic(self.folder / SUPPRESSED_FILE, json.dumps({"suppressed": ids}).encode("utf-8"))
        return {"mechanism": f"ids listed in {SUPPRESSED_FILE}, which TombstoneLlamaDocstore and"
                             " TombstoneIngestionCache read (and the lineage db's erased ids)",
                "listed": len(artifacts)}

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        with self.store_lock():
            rewritten = jsonfiles.scrub(self.folder, matcher(artifacts, self.content_key))
        return {"mechanism": "every JSON file of the folder rewritten without the nodes (by id, and by the"
                             " text's keyed hash), atomically", "rewritten": rewritten}

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        """What LlamaIndex's own deletes do to the folder: each node deleted from the persisted docstore
        (``delete_document``) and from every index of the index store, both persisted again; the ingestion cache,
        which LlamaIndex never prunes, keeps them."""
        from llama_index.core.storage.docstore import SimpleDocumentStore
        from llama_index.core.storage.index_store import SimpleIndexStore

        ids = [a.artifact_id for a in artifacts]
        docstore_file, index_file = self.folder / "docstore.json", self.folder / "index_store.json"
        if docstore_file.is_file():
            docstore = SimpleDocumentStore.from_persist_path(str(docstore_file))
            for aid in ids:
                docstore.delete_document(aid, raise_error=False)
            docstore.persist(str(docstore_file))
        if index_file.is_file():
            index_store = SimpleIndexStore.from_persist_path(str(index_file))
            for struct in index_store.index_structs():
                for aid in ids:
                    if aid in getattr(struct, "nodes_dict", {}):
                        struct.delete(aid)
                index_store.add_index_struct(struct)
            index_store.persist(str(index_file))

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        held = jsonfiles.find(self.folder, matcher(artifacts, self.content_key))
        by = "id and the text's keyed hash" if self.content_key is not None else "id (no secret: not by text)"
        out = {}
        for art in artifacts:
            files = sorted(held.get(art.artifact_id, ()))
            out[art.artifact_id] = ProbeResult(
                level=Level.LOGICAL, passed=not files,
                measurement=f"held by {', '.join(files)}" if files else None,
                evidence={"paths": ["every JSON file of the folder"], "matched_by": by, "returned_by": files})
        return out

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """What the byte scan cannot see: inside each gzip, bz2 or xz file, the artifact's id patterns in the
        inflated bytes; a file this cannot open leaves every artifact found nowhere unchecked."""
        inflated, unreadable = jsonfiles.compressed(self.folder)
        blocked = "; ".join(unreadable) or None
        patterns = {a.artifact_id: [p for k, p in self.physical_patterns(a).items() if k.startswith("id")]
                    for a in artifacts}
        found: dict[str, list[str]] = {a.artifact_id: [] for a in artifacts}
        opened = []
        for name, data in inflated:
            opened.append(name)
            for aid, places in found.items():
                if any(p in data for p in patterns[aid]):
                    places.append(f"id in {name}")
        return {aid: ExtraFinding(found=places, id_found=bool(places), unchecked=blocked,
                                  evidence={"compressed_files_opened": opened})
                for aid, places in found.items()}

    def physical_files(self) -> list[Path]:
        if not os.access(self.folder, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"folder {self.folder} is not readable", store=self.store)
        return sorted(p for p in self.folder.rglob("*") if not p.is_dir()
                      and not p.name.endswith(".tombstone.lock"))


__all__ = ["BACKEND", "LlamaStorageAdapter", "NODE", "SUPPRESSED_FILE", "suppressed_ids"]
