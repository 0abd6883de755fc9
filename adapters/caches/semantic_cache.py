"""Semantic cache: answers keyed by the query's embedding, backed by a Chroma collection.

A lookup embeds the prompt and returns the cached answer of the nearest entry within ``threshold``
(cosine distance) for the same LLM. The cache has no hide state: at suppression the entry — and, if
``neighbours`` is set, that many nearest entries around it, which may answer paraphrases of the same
question — is deleted. Probes and reclaim are the backing Chroma store's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.outputs import Generation
from tombstone_adapters.chroma.wrapper import TombstoneCollection

from .attribution import current

BACKEND = "semantic_cache"


def entry_id(prompt: str, llm_string: str) -> str:
    return "semcache-" + hashlib.sha256(f"{prompt}\x00{llm_string}".encode()).hexdigest()[:32]


class _SemanticCollection(TombstoneCollection):
    backend = BACKEND


class TombstoneSemanticCache(BaseCache):
    """A LangChain cache over a Chroma collection (``embedding_function=None``) and your embedder.
    Generations are kept as their text and generation info."""

    def __init__(self, collection: Any, *, lineage, store: str, embedder, threshold: float = 0.05) -> None:
        self.entries = _SemanticCollection(collection, lineage=lineage, store=store, embedder=embedder)
        self.threshold = threshold

    def lookup(self, prompt: str, llm_string: str):
        if self.entries.count() == 0:
            return None
        hits = self.entries.query(query_texts=[prompt], n_results=1, where={"llm": llm_string},
                                  include=["metadatas", "distances"])
        if hits["ids"][0] and hits["distances"][0][0] <= self.threshold:
            return [Generation(text=g["text"], generation_info=g.get("info"))
                    for g in json.loads(hits["metadatas"][0][0]["response"])]
        return None

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Any]) -> None:
        who = current()
        eid = entry_id(prompt, llm_string)
        self.entries.upsert(ids=[eid], documents=[prompt],
                            metadatas=[{"llm": llm_string, "response": json.dumps(
                                [{"text": g.text, "info": g.generation_info} for g in return_val])}],
                            subject=who.subject, kind="semantic_cache_entry",
                            sources=[(s, i, "answer_built_from") for s, i in who.sources])

    # LangChain's async callers would run these in a thread pool; the lineage db's connection belongs to the
    # thread that opened it, so they run here, on the caller's thread.
    async def alookup(self, prompt: str, llm_string: str):
        return self.lookup(prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: Sequence[Any]) -> None:
        self.update(prompt, llm_string, return_val)

    def clear(self, **kwargs: Any) -> None:
        ids = self.entries.collection.get(include=[])["ids"]
        if ids:
            self.entries.delete(ids=ids)
