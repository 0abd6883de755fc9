"""Training-data backend: examples exported from chunks into JSONL and Parquet shards, versioned by
pinned manifests. The store apps write through (:class:`DatasetStore`), its training loaders and its adapter."""

from .files import PinMismatchError
from .loader import DatasetLoader
from .store import DatasetStore
from .versions import DatasetFiles, Example

__all__ = ["DatasetAdapter", "DatasetFiles", "DatasetLoader", "DatasetStore", "Example", "PinMismatchError",
           "torch_dataset"]


def __getattr__(name: str):
    if name == "torch_dataset":  # imports PyTorch: only when asked for
        from .torchdata import torch_dataset

        return torch_dataset
    if name == "DatasetAdapter":
        from .adapter import DatasetAdapter

        return DatasetAdapter
    raise AttributeError(name)
