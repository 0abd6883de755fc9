"""The model as the model probe sees it (``tombstone.verify.model.ModelTarget``), over a
:class:`~tombstone_adapters.lora.store.LoraStore`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class LoraTarget:
    """The model as the model probe sees it (``tombstone.verify.model.ModelTarget``): the registry and the
    weights as they stand when it is made."""

    def __init__(self, store: Any) -> None:
        """``store``: the :class:`~tombstone_adapters.lora.store.LoraStore` (which imports this module)."""
        self._store = store
        self.registry = store.registry()
        self.sharded = bool(self.registry["sharded"])
        self._ensemble = store.ensemble(self.registry)

    def serving(self) -> list[str]:
        return self._store.serving(self.registry)

    def weights(self) -> dict[str, str]:
        return {name: e["sha256"] for name, e in self.registry["shards"].items() if e.get("sha256")}

    def token_logprobs(self, texts: Sequence[str], views: Mapping[str, Sequence[str]]) -> dict[str, list[Any]]:
        return self._ensemble.token_logprobs(texts, views)

    def greedy(self, prefixes: Sequence[str], n_bytes: int, view: Sequence[str]) -> list[str]:
        return self._ensemble.greedy(prefixes, n_bytes, view)

    def holdout(self) -> list[list[str]]:
        groups = self.registry["holdout"]
        texts, _ = self._store.dataset_texts([i for g in groups for i in g], registry=self.registry)
        return [[texts[i] for i in g if i in texts] for g in groups]


__all__ = ["LoraTarget"]
