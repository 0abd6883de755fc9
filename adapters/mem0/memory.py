"""``TombstoneMemory``: a Mem0 ``Memory`` built on a configured ``mem0`` store, whose memories get lineage.

Mem0 keeps its memories in a vector store and the history of each memory's text in a SQLite db. This builds a
``Memory`` on the store's Qdrant local-mode directory (through the process's shared client, as every Tombstone
wrapper of that directory) and its history db, with a Tombstone embedder, and hands Mem0 a vector store that
records each memory's lineage — its subject is the memory's ``user_id`` — before the point is written, and
hides what an erasure has suppressed from every read. ``delete`` and ``delete_all(user_id=...)`` erase through
Tombstone (a receipt each), since Mem0's own leave the text in the history db. Memories are added without an
LLM by default (``infer=False``); hand ``llm`` (anything with Mem0's ``generate_response``) to infer them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tombstone.capture.hidden import HiddenIds, suppressed_among
from tombstone.capture.vector import embed, vectors_for_write
from tombstone.lineage.records import ArtifactRecord
from tombstone_adapters.qdrant.local import held, local_client
from tombstone_adapters.qdrant.wrapper import ID_KEY, SUPPRESSED

from .adapter import BACKEND, MESSAGE

os.environ.setdefault("MEM0_TELEMETRY", "false")  # Mem0 reports usage to its makers unless told not to

import mem0.memory.main as _mem0_main  # noqa: E402
import mem0.memory.telemetry as _mem0_telemetry  # noqa: E402
from mem0.embeddings.base import EmbeddingBase  # noqa: E402
from mem0.memory.main import Memory  # noqa: E402

# Mem0 read the variable when it was first imported, perhaps before this module: its switches are turned off
# here too, so that no usage event and no notice fetch reaches the network from a Memory built by this module.
_mem0_telemetry.MEM0_TELEMETRY = _mem0_main.MEM0_TELEMETRY = False


class _Embedding(EmbeddingBase):
    """A Tombstone embedder as Mem0's: what Mem0 stores is what the lineage capture computes."""

    def __init__(self, embedder: Any) -> None:
        super().__init__()
        self.embedder = embedder

    def embed(self, text, memory_action=None):
        return embed(self.embedder, [text])[0].tolist()

    def embed_batch(self, texts, memory_action="add"):
        return embed(self.embedder, list(texts)).tolist()


class _NoLLM:
    """Mem0 asks an LLM only to infer memories; without one handed in, such a call says how to add them."""

    def generate_response(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError("this TombstoneMemory has no LLM: add memories with infer=False, or pass llm=...")


def _subject(payload: dict) -> str:
    subject = (payload or {}).get("user_id")
    if not isinstance(subject, str) or not subject:
        raise ValueError("a memory needs a user_id: whose data it is must be known when it is written, or no"
                         " erasure could find it")
    return subject


class _RecordingStore:
    """Mem0's Qdrant vector store as ``TombstoneMemory`` hands it to Mem0: each call runs on the process's shared
    client under the directory's lock; ``insert`` and ``update`` record lineage before writing (the memory id is
    the artifact id, carried in the payload as ``tombstone_id``); reads drop suppressed memories."""

    def __init__(self, inner: Any, *, owner: "TombstoneMemory") -> None:
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with held(self._owner.path, store=self._owner.store) as client:
            self._inner.client = client
            return getattr(self._inner, name)(*args, **kwargs)

    def _record(self, ids: Sequence[str], vectors: Sequence[Sequence[float]], payloads: Sequence[dict]) -> list[dict]:
        owner = self._owner
        by_subject: dict[str, list[int]] = {}
        for i, payload in enumerate(payloads):
            by_subject.setdefault(_subject(payload), []).append(i)
        for subject, rows in by_subject.items():
            vectors_for_write(owner.embedder, owner.lineage, store=owner.store, backend=BACKEND,
                              ids=[str(ids[i]) for i in rows], documents=[payloads[i].get("data") for i in rows],
                              embeddings=np.asarray([vectors[i] for i in rows], dtype=np.float32), subject=subject)
        hidden = suppressed_among(owner.lineage, owner.store, [str(i) for i in ids])
        return [{**payload, ID_KEY: str(aid), **({SUPPRESSED: True} if str(aid) in hidden else {})}
                for aid, payload in zip(ids, payloads)]

    def insert(self, vectors, payloads=None, ids=None):
        if payloads is None or ids is None:
            raise ValueError("Mem0 writes memories with ids and payloads; this store records nothing else")
        return self._run("insert", vectors=vectors, payloads=self._record(ids, vectors, payloads), ids=ids)

    def update(self, vector_id, vector=None, payload=None):
        if payload is not None:
            if vector is None:
                raise ValueError("an update of a memory's payload needs its vector (to record its lineage)")
            [payload] = self._record([vector_id], [vector], [payload])
        return self._run("update", vector_id=vector_id, vector=vector, payload=payload)

    # -- reads: suppressed memories are never returned --------------------------------------------

    def _visible(self, points: Any) -> list:
        hidden = self._owner.hidden.current()
        out = []
        for p in points or []:
            payload = p.payload or {}
            if payload.get(SUPPRESSED) or str(p.id) in hidden:
                continue
            p.payload = {k: v for k, v in payload.items() if k != ID_KEY}
            out.append(p)
        return out

    def search(self, *args: Any, **kwargs: Any) -> list:
        return self._visible(self._run("search", *args, **kwargs))

    def keyword_search(self, *args: Any, **kwargs: Any) -> Any:
        found = self._run("keyword_search", *args, **kwargs)
        return None if found is None else self._visible(found)

    def search_batch(self, *args: Any, **kwargs: Any) -> list:
        return [self._visible(part) for part in self._run("search_batch", *args, **kwargs)]

    def get(self, vector_id):
        found = self._visible([p for p in [self._run("get", vector_id=vector_id)] if p is not None])
        return found[0] if found else None

    def list(self, filters=None, top_k: int = 100):
        points, offset = self._run("list", filters=filters, top_k=top_k)
        return self._visible(points), offset

    def delete(self, vector_id):
        return self._run("delete", vector_id=vector_id)


class TombstoneMemory:
    """A Mem0 ``Memory`` on the configured ``mem0`` store ``store`` of the open deployment ``tombstone``.

    ``embedder`` is a Tombstone embedder (its dimension is the collection's). Mem0's methods are this object's:
    ``add``, ``search``, ``get``, ``get_all``, ``update``, ``history``; ``delete`` and ``delete_all`` erase
    through Tombstone. ``receipts`` lists (receipt, path) of every erasure it ran. Close it (or use ``with``)."""

    def __init__(self, tombstone: Any, store: str, *, embedder: Any, llm: Any = None) -> None:
        spec = tombstone.config.stores.get(store)
        if spec is None or spec.backend != BACKEND:
            raise ValueError(f"no store {store!r} of the {BACKEND} backend in the deployment's config")
        options = spec.options
        self.tombstone, self.store, self.embedder = tombstone, store, embedder
        self.lineage = tombstone.lineage
        self.path = Path(options["path"])
        self.hidden = HiddenIds(self.lineage, store)
        self.receipts: list = []
        history_db = Path(options["history_path"])
        dim = len(embed(embedder, ["dimension"])[0])
        config = {"vector_store": {"provider": "qdrant",
                                   "config": {"collection_name": str(options["collection"]), "client": local_client(self.path),
                                              "embedding_model_dims": dim, "on_disk": True}},
                  "history_db_path": str(history_db),
                  # built but never called: the embedder and the LLM are replaced below, before any use
                  "embedder": {"provider": "openai", "config": {"api_key": "unused", "embedding_dims": dim}},
                  "llm": {"provider": "openai", "config": {"api_key": "unused"}}}
        with held(self.path, store=store):
            self.mem0 = Memory.from_config(config)
        self.mem0.embedding_model = _Embedding(embedder)
        self.mem0.llm = llm if llm is not None else _NoLLM()
        self.mem0.vector_store = _RecordingStore(self.mem0.vector_store, owner=self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mem0, name)

    def __enter__(self) -> "TombstoneMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.mem0.db.close() if hasattr(self.mem0.db, "close") else None

    def add(self, messages: Any, *, user_id: str, infer: bool = False, **kwargs: Any) -> dict:
        """Mem0's ``add`` for ``user_id`` (required: it is the memories' subject); ``infer=False`` by default."""
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("add needs user_id: whose memories these are")
        result = self.mem0.add(messages, user_id=user_id, infer=infer, **kwargs)
        if infer:
            self._record_messages(user_id)
        return result

    def _record_messages(self, user_id: str) -> None:
        """Mem0 keeps a session's last messages, content included, in its history db (``messages``) when it
        infers memories: each row is recorded as an artifact of the subject (after Mem0 wrote it: their ids
        are Mem0's, chosen inside the write)."""
        from mem0.memory.main import _build_session_scope

        scope = _build_session_scope({"user_id": user_id})
        rows = self.mem0.db.connection.execute("SELECT id, content FROM messages WHERE session_scope = ?",
                                               (scope,)).fetchall()
        known = {a.artifact_id for a in self.lineage.artifacts_for(self.lineage.subject_key(user_id))
                 if a.store == self.store}
        records = [ArtifactRecord(store=self.store, artifact_id=str(rid), backend=BACKEND, kind=MESSAGE,
                                  content_hash=hashlib.sha256(str(content).encode()).hexdigest())
                   for rid, content in rows if str(rid) not in known]
        if records:
            self.lineage.record_artifacts(user_id, records)

    def delete(self, memory_id: str) -> dict:
        """Erase one memory through Tombstone (suppress, reclaim the point and its history, verify; a receipt)."""
        art = self.lineage.artifact(self.store, str(memory_id))
        if art is None or art.state != "live":
            raise ValueError(f"Memory with id {memory_id} not found")
        self.receipts.append(self.tombstone.erase_artifacts(
            f"memory:{memory_id}", [(self.store, str(memory_id))], why="deleted",
            statement="a memory deleted through Mem0"))
        return {"message": "Memory erased"}

    def delete_all(self, user_id: str | None = None, **kwargs: Any) -> dict:
        """Erase every memory of ``user_id`` in this store through Tombstone (one receipt for the subject)."""
        if kwargs or not user_id:
            raise ValueError("delete_all erases a user's memories: pass user_id (and nothing else)")
        arts = [(a.store, a.artifact_id) for a in self.lineage.artifacts_for(self.lineage.subject_key(user_id))
                if a.store == self.store and a.state == "live"]
        if arts:
            self.receipts.append(self.tombstone.erase(user_id, artifacts=arts))
        return {"message": "Memories erased"}




__all__ = ["TombstoneMemory"]
