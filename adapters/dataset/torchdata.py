"""PyTorch's view of a dataset: an ``IterableDataset`` over a :class:`~tombstone_adapters.dataset.loader.DatasetLoader`.

Imported only when ``torch_dataset`` is asked for (PyTorch is not needed for anything else).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from .loader import DatasetLoader
from .versions import Example


def _default(example: Example) -> dict[str, str]:
    return {"id": example.id, "text": example.text}


class ExampleDataset(IterableDataset):
    """The loader's examples (pin and hash checks included); in a DataLoader with workers, worker ``k`` of
    ``n`` reads shards ``k, k + n, ...`` of the pinned manifest, so each example is read once."""

    def __init__(self, loader: DatasetLoader, transform: Callable[[Example], Any] | None = None) -> None:
        super().__init__()
        self.loader = loader
        self.transform = transform or _default

    def __iter__(self) -> Iterator[Any]:
        manifest = self.loader.manifest()
        shards = manifest.shards
        info = get_worker_info()
        if info is not None:
            shards = shards[info.id :: info.num_workers]
        for example in self.loader.iter_shards(shards, self.loader.hidden(manifest)):
            yield self.transform(example)


def torch_dataset(path: str | os.PathLike[str], *, version: int | None = None, pin: str | None = None,
                  transform: Any = None) -> Any:
    """A ``torch.utils.data.IterableDataset`` over :class:`DatasetLoader`: each DataLoader worker reads its
    own share of the shards; ``transform(example)`` (default: ``{"id": ..., "text": ...}``) makes each item.
    Needs PyTorch."""
    return ExampleDataset(DatasetLoader(path, version=version, pin=pin), transform)
