"""PyTorch's view of a dataset: an ``IterableDataset`` over a :class:`~tombstone_adapters.dataset.store.DatasetLoader`.

Imported only by ``torch_dataset`` (PyTorch is not needed for anything else).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from .store import DatasetLoader, Example


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
