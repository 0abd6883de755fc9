"""Model backend: a small causal LM over bytes with sharded LoRA adapters (SISA) trained from a pinned
dataset, the serving ensemble that combines them, and its adapter (suppress recomposes the ensemble without a
shard, reclaim retrains the shard, the model probe measures what the weights still hold)."""

from .model import Ensemble, ModelConfig
from .store import LoraStore, LoraTarget, ModelStoreError

__all__ = ["Ensemble", "LoraAdapter", "LoraStore", "LoraTarget", "ModelConfig", "ModelStoreError"]


def __getattr__(name: str):
    if name == "LoraAdapter":
        from .adapter import LoraAdapter

        return LoraAdapter
    raise AttributeError(name)
