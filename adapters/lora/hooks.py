"""The lora backend's demo hooks (see ``tombstone.contract.Adapter``): a small model trained, on this machine's
CPU, on the training examples ``tombstone demo`` exported from its chunks into a dataset store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError

DEMO_RUN = "demo-training"
"""The training run the demo pins in the dataset store and trains from."""
BASE_PREFIX = "stranger-"
"""The base model is trained on demo notes about subjects of this name, none of them in the deployment."""
BASE_SUBJECTS = 60
SHARDS = 2


def demo_config() -> Any:
    """The demo's model: the CI configuration on shorter texts and schedules (seconds of training on one core).
    The base only has to learn the form of a support note; the shards do the remembering, and 64 bytes of a
    note hold its subject and account number."""
    from .model import ModelConfig

    return ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "n_positions": 64, "base_steps": 120, "steps": 100})


def held_out(subjects: Sequence[str]) -> list[str]:
    """The demo's held-out subjects (never trained on: the model probe's comparison data): the last quarter,
    at least one when there are two subjects or more."""
    count = max(1, len(subjects) // 4) if len(subjects) > 1 else 0
    return list(subjects[len(subjects) - count:]) if count else []


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread while the demo trains: its model is so small that more threads only wait on one
    another (on two busy cores, five times slower). The setting is put back afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LoraHooks:
    demo_role = "model"
    demo_needs = ("examples",)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every example a shard was trained on, as ``(<shard>:<example id>, shard, SHA-256 of the shard's
        weights file)`` sorted, read from the registry and the files directly (a shard left without examples
        has no weights file)."""
        import hashlib
        import json

        root = Path(options["path"])
        registry = json.loads((root / "registry.json").read_text())
        rows = []
        for shard, info in registry["shards"].items():
            weights = hashlib.sha256((root / info["file"]).read_bytes()).hexdigest() if info.get("file") else None
            rows += [(f"{shard}:{example}", shard, weights) for example in info["examples"]]
        return sorted(rows)

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "lora", "path": "stores/lora"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        """Pin the examples' current version as a training run, train a base model on notes about other
        people, then one LoRA shard per group of subjects from the pinned examples (the last quarter of the
        subjects held out)."""
        from tombstone_adapters.dataset import DatasetLoader, DatasetStore

        from .store import LoraStore

        found = kit.store_with_role("examples")
        if found is None:
            raise ConfigError(f"the {store} store is trained on training examples: the demo needs a store that"
                              f" holds them (add dataset to --backends)")
        ds_name, ds_options = found
        dataset = DatasetStore(ds_options["path"], lineage=kit.lineage, store=ds_name)
        dataset.record_training_run(dataset.current_version(), DEMO_RUN, note="the demo's model")
        model = LoraStore(options["path"], lineage=kit.lineage, store=store, config=demo_config())
        strangers = [text for i in range(BASE_SUBJECTS) for text in kit.chunks(f"{BASE_PREFIX}{i:03d}")[1]]
        holdout = held_out(subjects)
        planted = canaries(kit, ds_name, DatasetLoader(dataset.root, pin=DEMO_RUN), subjects)
        with one_thread():
            model.train_base(strangers)
            model.train(dataset, pin=DEMO_RUN, shards=min(SHARDS, max(1, len(subjects) - len(holdout))),
                        holdout_subjects=holdout, canaries=planted)


def canaries(kit, store: str, examples, subjects: Sequence[str]) -> dict[str, str]:
    """Each subject's canary: its first example (by id) holding its account number once, mapped to the number."""
    owner = {kit.lineage.subject_key(ref): ref for ref in subjects}
    out: dict[str, str] = {}
    done: set[str] = set()
    for example in sorted(examples, key=lambda e: e.id):
        art = kit.lineage.artifact(store, example.id)
        ref = owner.get(art.subject_key) if art is not None else None
        if ref is None or ref in done:
            continue
        secret = kit.account(ref)
        if example.text.count(secret) == 1:
            out[example.id] = secret
            done.add(ref)
    return out
