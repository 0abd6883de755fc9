"""Training-data backend: examples exported from chunks into JSONL and Parquet shards, versioned by
pinned manifests. The store apps write through (:class:`DatasetStore`), its training loaders and its adapter."""

from .files import PinMismatchError
from .store import DatasetFiles, DatasetLoader, DatasetStore, Example, torch_dataset

__all__ = ["DatasetAdapter", "DatasetFiles", "DatasetLoader", "DatasetStore", "Example", "PinMismatchError",
           "torch_dataset"]


def __getattr__(name: str):
    if name == "DatasetAdapter":
        from .adapter import DatasetAdapter

        return DatasetAdapter
    raise AttributeError(name)
