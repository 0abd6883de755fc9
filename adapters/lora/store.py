"""The model store apps use: a base model and sharded LoRA adapters trained from a pinned dataset.

SISA (sharded, isolated, sliced, aggregated training) for a fine-tune: the subjects of a dataset are split
into shards, each shard gets its own LoRA adapter trained only on its subjects' examples, and the model
that serves combines the shards (:class:`~tombstone_adapters.lora.model.Ensemble`). Erasing a subject then
touches one shard: suppression recomposes the serving ensemble without it (at once, and reversibly: the
weights stay until the reclaim), the reclaim retrains that shard from the dataset without the subject's
examples, replaces its weights atomically and removes the old file. An unsharded adapter (``shards=1``)
cannot be hidden per subject; its reclaim is approximate unlearning (training continued on the remaining
examples) and its artifacts stay RESIDUAL(model).

A model store is a directory::

    registry.json                        the adapter registry (below), written atomically
    base/base-<sha16>.safetensors        the base model's weights
    adapters/<shard>-<sha16>.safetensors each shard's LoRA weights

The registry records the model's configuration, the base weights, the dataset (its path relative to the
store, the store name, the training run's pin and the manifest version read), and per shard: its weights
file and SHA-256, the manifest version it was trained from, the example ids it was trained on, those an
erasure has suppressed, the canaries among them (offset, length, alphabet and keyed SHA-256 of the secret:
never the secret) and how it was trained; the held-out examples (one list per held-out subject: never
trained, what the model probe compares against); and, per shard, the SHA-256 of each weights file an
erasure retired and the digest of each of its tensors, hashed again (``tensors``: the registry names no
retired file or tensor, and a probe can still recognise a copy of one, re-saved or compressed).

The store's files are untrusted data. The registry and the weights are read only as regular files inside
the store (never through a link, never a FIFO or a device: ``tombstone.fsutil.read_regular``), the registry
up to ``max_metadata_bytes`` (64 MiB unless the store's options say otherwise) and a weights file up to
``max_weights_bytes`` (4 GiB); a registry whose fields are not of the types written here is refused. A file
the registry names (a shard's or the base model's weights) must lie inside the store: an entry that leaves it
(``../``, an absolute path, a folder that is a link out of the store) is refused in one line naming the
entry, and nothing is read, written or deleted through it. Folders are created mode 0700, files 0600.

Lineage: :meth:`LoraStore.train` records, for every example it trains into a shard, an artifact
``<shard>:<example id>`` (kind ``model_example``) derived from the example, and for every held-out example
``holdout:<example id>`` (kind ``model_holdout``), each owned by the example's subject. A training run the
dataset store recorded (``DatasetStore.record_training_run``) for the pin this store trains from becomes
these artifacts: no longer a third party's copy that a person must follow up, but weights this backend
retrains and probes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tombstone.errors import StoreUnavailableError
from tombstone.faults import kill_point
from tombstone.fsutil import METADATA_LIMIT, confined_path, make_private_dirs, read_regular, write_atomic
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for

from . import model as M
from .registry import byte_limit, registry_problem
from .target import LoraTarget
from .tensors import retire, retired_tag

BACKEND = "lora"
REGISTRY = "registry.json"
BASE_DIR = "base"
ADAPTERS_DIR = "adapters"
FORMAT = "tombstone-lora"
FORMAT_VERSION = 1
EXAMPLE_KIND = "model_example"
"""The lineage kind of an example trained into a shard."""
HOLDOUT_KIND = "model_holdout"
"""The lineage kind of an example held out of every shard (the model probe's comparison data)."""
TRAINED_RELATION = "trained_into"
HELD_OUT_RELATION = "held_out_by"
HOLDOUT_PREFIX = "holdout:"
DIGITS = "0123456789"
WEIGHTS_LIMIT = 4 * 1024 * 1024 * 1024
"""Default bound (4 GiB) on a weights file the store reads (the store option ``max_weights_bytes``)."""


class ModelStoreError(StoreUnavailableError):
    """A model store file that cannot be used (missing, or not what the registry says). Retrying does not help."""

    retryable = False


def artifact_id(shard: str, example_id: str) -> str:
    return f"{shard}:{example_id}"


def split_artifact(aid: str) -> tuple[str | None, str]:
    """``(shard, example id)`` of a model artifact id (shard None for a held-out example)."""
    if aid.startswith(HOLDOUT_PREFIX):
        return None, aid[len(HOLDOUT_PREFIX) :]
    shard, _, example = aid.partition(":")
    if not example:
        raise ValueError(f"{aid!r} is not a model artifact id (<shard>:<example id> or holdout:<example id>)")
    return shard, example


def _digest(ids: Iterable[str]) -> str:
    return hashlib.sha256("\x00".join(sorted(ids)).encode("utf-8")).hexdigest()


class LoraStore:
    """A model store directory (see the module docstring) and the operations on it.

    ``lineage`` and ``store`` (the configured store name) let training record lineage; ``config`` is the
    model's configuration for a new store (an existing store keeps its own). ``create=False`` refuses a
    directory without a registry.
    """

    def __init__(self, path: str | os.PathLike[str], *, lineage: Any = None, store: str = BACKEND,
                 config: M.ModelConfig | None = None, create: bool = True, lock_wait: float = STORE_LOCK_WAIT,
                 content_key: Callable[[str], str] | None = None, max_metadata_bytes: int | None = None,
                 max_weights_bytes: int | None = None) -> None:
        self.root = Path(path)
        self.max_metadata_bytes = byte_limit(max_metadata_bytes, "max_metadata_bytes", METADATA_LIMIT)
        """No registry larger than this is read (64 MiB by default)."""
        self.max_weights_bytes = byte_limit(max_weights_bytes, "max_weights_bytes", WEIGHTS_LIMIT)
        """No weights file larger than this is read (4 GiB by default)."""
        self.lineage = lineage
        self.store = store
        self.content_key = content_key or (lineage.secret.content_key if lineage is not None else None)
        """Keys a SHA-256 hex digest (a canary's), as the lineage db keys content hashes; None: unkeyed."""
        self.lock = StoreLock(lock_file_for(self.root), wait=lock_wait, store=store)
        if not os.path.lexists(self.root / REGISTRY):
            if not create:
                raise StoreUnavailableError(f"no model store at {self.root} (it has no {REGISTRY})", store=store,
                                            retryable=False)
            with self.lock:
                if not os.path.lexists(self.root / REGISTRY):
                    make_private_dirs(self.root)
                    cfg = config or M.ModelConfig()
                    self._write({"format": FORMAT, "format_version": FORMAT_VERSION, "config": cfg.to_dict(),
                                 "base": None, "dataset": None, "sharded": True, "shards": {}, "holdout": [],
                                 "retired": {}})
        self._cache: tuple[str, Any] | None = None

    # -- the registry ------------------------------------------------------------------------------

    def _read(self, path: Path, limit: int, option: str) -> bytes:
        """A file of the store, read as a regular file inside it, of at most ``limit`` bytes."""
        try:
            return read_regular(path, self.root, limit, option=option, store=self.store)
        except FileNotFoundError:
            raise ModelStoreError(f"model store file {path} is missing", store=self.store) from None
        except OSError as exc:
            raise ModelStoreError(f"cannot read {path}: {exc.strerror or exc}", store=self.store) from exc

    def _file(self, relative: Any, what: str) -> Path:
        """The path of a file the registry names (``what``: which entry), refused unless inside the store."""
        return confined_path(self.root, relative, f"{self.root / REGISTRY}: {what}", store=self.store)

    def registry(self) -> dict[str, Any]:
        data = self._read(self.root / REGISTRY, self.max_metadata_bytes, "max_metadata_bytes")
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ModelStoreError(f"{self.root / REGISTRY} is not JSON: {str(exc).splitlines()[0]}",
                                  store=self.store) from None
        problem = registry_problem(body, FORMAT)
        if problem:
            raise ModelStoreError(f"{self.root / REGISTRY} is refused: {problem}", store=self.store)
        return body

    def _write(self, body: Mapping[str, Any]) -> None:
        write_atomic(self.root / REGISTRY, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode("utf-8"))

    @property
    def config(self) -> M.ModelConfig:
        return M.ModelConfig.from_dict(self.registry()["config"])

    def serving(self, registry: Mapping[str, Any] | None = None) -> list[str]:
        """The shards the serving ensemble combines: every trained shard, except (when sharded) those holding
        an example an erasure has suppressed and not yet reclaimed."""
        reg = registry or self.registry()
        out = []
        for name, entry in sorted(reg["shards"].items()):
            if not entry.get("file"):
                continue
            if reg["sharded"] and set(entry.get("suppressed", ())) & set(entry["examples"]):
                continue
            out.append(name)
        return out

    def dataset_root(self, registry: Mapping[str, Any] | None = None) -> Path:
        reg = registry or self.registry()
        if not reg.get("dataset"):
            raise ModelStoreError(f"model store {self.root} has not been trained from a dataset", store=self.store)
        return (self.root / reg["dataset"]["path"]).resolve()

    # -- weights -----------------------------------------------------------------------------------

    def _write_weights(self, rel: str, data: bytes) -> None:
        """Write a weights file this store names itself (``base/...``, ``adapters/...``), in a folder of mode
        0700 inside the store."""
        path = self._file(rel, "new weights file")
        make_private_dirs(path.parent)
        self._file(rel, "new weights file")  # the folder made (or found) is inside the store
        write_atomic(path, data)

    def _weights(self, rel: str, sha256: str, what: str = "weights file") -> bytes:
        path = self._file(rel, what)
        data = self._read(path, self.max_weights_bytes, "max_weights_bytes")
        if M.adapter_sha256(data) != sha256:
            raise ModelStoreError(f"{path} does not hash to what the registry records: refused", store=self.store)
        return data

    def _readable(self, rel: str | None, sha256: str | None, what: str) -> bytes | None:
        """A weights file's bytes, or None where there is none, or it cannot be read or is not what it should be."""
        try:
            return self._weights(rel, sha256, what) if rel and sha256 else None
        except StoreUnavailableError:
            return None

    def base_model(self, registry: Mapping[str, Any] | None = None) -> Any:
        reg = registry or self.registry()
        if not reg.get("base"):
            raise ModelStoreError(f"model store {self.root} has no base model yet (train_base first)", store=self.store)
        cfg = M.ModelConfig.from_dict(reg["config"])
        data = self._weights(reg["base"]["file"], reg["base"]["sha256"], "base.file")
        # the model is built from the registry's config before the weights are loaded into it: a config that
        # asks for more parameters than the weights file holds is refused before anything is allocated
        params = (M.VOCAB + cfg.n_positions) * cfg.n_embd + cfg.n_layer * (12 * cfg.n_embd ** 2 + 13 * cfg.n_embd)
        if 2 * params > len(data) + (1 << 20):
            raise ModelStoreError(f"{self.root / REGISTRY}: its config asks for a model of about {params} parameters,"
                                  f" more than the base weights file ({len(data)} bytes) holds: refused",
                                  store=self.store)
        return M.load_base(cfg, data)

    def ensemble(self, registry: Mapping[str, Any] | None = None) -> M.Ensemble:
        """The base model with every trained shard's adapter loaded (weights checked against the registry);
        cached until the registry changes."""
        reg = registry or self.registry()
        key = json.dumps(reg, sort_keys=True)
        if self._cache is None or self._cache[0] != key:
            shards = {name: M.load_state(self._weights(e["file"], e["sha256"], f"shards.{name}.file"))
                      for name, e in sorted(reg["shards"].items()) if e.get("file")}
            self._cache = (key, M.Ensemble(M.ModelConfig.from_dict(reg["config"]), self.base_model(reg), shards))
        return self._cache[1]

    # -- what apps call ----------------------------------------------------------------------------

    def train_base(self, texts: Sequence[str]) -> dict[str, Any]:
        """Train the base model on ``texts`` (text with no subject's data in it) and keep its weights. Any
        shards trained on an earlier base must be trained again (:meth:`train`)."""
        with self.lock:
            reg = self.registry()
            cfg = M.ModelConfig.from_dict(reg["config"])
            start = time.perf_counter()
            model, stats = M.train_base(cfg, list(texts))
            data = M.base_bytes(model)
            sha = M.adapter_sha256(data)
            rel = f"{BASE_DIR}/base-{sha[:16]}.safetensors"
            old = reg.get("base")
            old_path = self._file(old["file"], "base.file") if old else None  # refused before anything changes
            self._write_weights(rel, data)
            reg["base"] = {"file": rel, "sha256": sha, "texts": len(texts),
                           "trained": {**stats, "seconds": round(time.perf_counter() - start, 2)}}
            self._write(reg)
            if old_path is not None and old["file"] != rel:
                old_path.unlink(missing_ok=True)
            return dict(reg["base"])

    def train(self, dataset: Any, *, pin: str | None = None, version: int | None = None, shards: int = 4,
              holdout_subjects: int | Sequence[str] = 2, canaries: Mapping[str, str] | None = None, alphabet: str = DIGITS,
              dataset_store: str | None = None) -> dict[str, Any]:
        """Train one LoRA adapter per shard on the examples of a dataset version: the one training run
        ``pin`` recorded (``DatasetStore.record_training_run``), ``version``, or the current one.

        Subjects (the examples' owners in the lineage db; without one, each example is its own subject) are
        ordered by a keyed hash; the first ``holdout_subjects`` (a count, or the subjects' references) are held
        out of every shard (the model probe's comparison data), the rest dealt to ``shards`` shards in turn. ``shards=1`` trains one
        unsharded adapter. ``canaries`` maps example ids to the secret planted in their text (characters of
        ``alphabet``): the registry keeps where it lies and its keyed hash. ``dataset`` is a
        ``DatasetStore`` or a dataset directory (then name its store with ``dataset_store``). Replaces any
        earlier training of this store; returns what was trained."""
        from tombstone_adapters.dataset import DatasetLoader

        if shards < 1:
            raise ValueError("shards must be at least 1")
        root = Path(getattr(dataset, "root", dataset))
        ds_store = dataset_store or getattr(dataset, "store", "dataset")
        loader = DatasetLoader(root, pin=pin) if pin is not None else DatasetLoader(root, version=version)
        examples = sorted(loader, key=lambda e: e.id)
        by_id = {e.id: e for e in examples}
        canaries = dict(canaries or {})
        for eid, secret in canaries.items():
            if eid not in by_id:
                raise ValueError(f"canary example {eid!r} is not in the dataset version trained on")
            if not secret or any(ch not in alphabet for ch in secret):
                raise ValueError(f"canary of {eid!r}: the secret must be characters of {alphabet!r}")
            if by_id[eid].text.count(secret) != 1:
                raise ValueError(f"canary of {eid!r}: the secret must occur exactly once in the example's text")
        owners: dict[str, str] = {}
        for e in examples:
            art = self.lineage.artifact(ds_store, e.id) if self.lineage is not None else None
            owners[e.id] = art.subject_key if art is not None else f"example:{e.id}"
        with self.lock:
            reg = self.registry()
            cfg = M.ModelConfig.from_dict(reg["config"])
            base = self.base_model(reg)
            old_files = {e["file"]: self._file(e["file"], f"shards.{n}.file")  # refused before anything changes
                         for n, e in reg["shards"].items() if e.get("file")}
            subjects = sorted(set(owners.values()), key=lambda k: hashlib.sha256(f"{cfg.seed}\x00{k}".encode()).hexdigest())
            if isinstance(holdout_subjects, int):
                held = subjects[:holdout_subjects]
            else:
                if self.lineage is None:
                    raise ValueError("holding out subjects by name needs the lineage db")
                held = [k for k in subjects if k in {self.lineage.subject_key(ref) for ref in holdout_subjects}]
            rest = [k for k in subjects if k not in set(held)]
            sharded = shards > 1
            names = [f"shard-{i:02d}" for i in range(shards)] if sharded else ["all"]
            members: dict[str, list[str]] = {name: [] for name in names}
            for i, subject in enumerate(rest):
                members[names[i % len(names)]].extend(e.id for e in examples if owners[e.id] == subject)
            new_shards: dict[str, Any] = {}
            for name in names:
                ids = sorted(members[name])
                entry = self._train_shard(cfg, base, name, [by_id[i].text for i in ids], ids,
                                          seed=M.seed_of(cfg.seed, name, "train", _digest(ids)))
                entry["manifest_version"] = loader.pointer.version
                entry["canaries"] = {i: self._canary(by_id[i].text, canaries[i], alphabet) for i in ids if i in canaries}
                new_shards[name] = entry
            holdout = [sorted(e.id for e in examples if owners[e.id] == subject) for subject in held]
            self._record_lineage(ds_store, new_shards, holdout, pin)
            old = reg["shards"]
            reg.update({"dataset": {"path": os.path.relpath(root.resolve(), self.root.resolve()), "store": ds_store,
                                    "pin": pin, "version": loader.pointer.version},
                        "sharded": sharded, "shards": new_shards, "holdout": holdout})
            self._write(reg)
            kept = {e["file"] for e in new_shards.values() if e.get("file")}
            for entry in old.values():
                if entry.get("file") and entry["file"] not in kept:
                    old_files[entry["file"]].unlink(missing_ok=True)
            return {"shards": {n: {k: e[k] for k in ("sha256", "trained")} | {"examples": len(e["examples"])}
                               for n, e in new_shards.items()},
                    "holdout_examples": sum(len(g) for g in holdout), "manifest_version": loader.pointer.version}

    def _canary(self, text: str, secret: str, alphabet: str) -> dict[str, Any]:
        digest = hashlib.sha256(secret.encode("utf-8")).hexdigest()
        return {"offset": text.index(secret), "length": len(secret), "alphabet": alphabet,
                "sha256": self.content_key(digest) if self.content_key else digest,
                "keyed": self.content_key is not None}

    def _train_shard(self, cfg: M.ModelConfig, base: Any, name: str, texts: Sequence[str], ids: Sequence[str], *,
                     seed: int, init: Mapping[str, Any] | None = None, steps: int | None = None,
                     on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Train (or continue) one shard's adapter and write its weights file; the registry entry for it."""
        if not texts:
            return {"file": None, "sha256": None, "examples": [], "suppressed": [],
                    "trained": {"steps": 0, "note": "no examples"}}
        start = time.perf_counter()
        state, stats = M.train_adapter(cfg, base, texts, seed=seed, init=init, steps=steps, on_step=on_step)
        data = M.state_bytes(state, f"lora adapter {name}")
        sha = M.adapter_sha256(data)
        rel = f"{ADAPTERS_DIR}/{name}-{sha[:16]}.safetensors"
        self._write_weights(rel, data)
        return {"file": rel, "sha256": sha, "examples": list(ids), "suppressed": [],
                "trained": {**stats, "seconds": round(time.perf_counter() - start, 2),
                            "mode": "continued" if init is not None else "from scratch"}}

    def _record_lineage(self, ds_store: str, shards: Mapping[str, Any], holdout: Sequence[Sequence[str]],
                        pin: str | None) -> None:
        if self.lineage is None:
            return
        from tombstone.lineage.records import ArtifactRecord

        derived = [(ds_store, eid, ArtifactRecord(store=self.store, artifact_id=artifact_id(name, eid), backend=BACKEND,
                                                  kind=EXAMPLE_KIND))
                   for name, entry in sorted(shards.items()) for eid in entry["examples"]]
        held = [(ds_store, eid, ArtifactRecord(store=self.store, artifact_id=HOLDOUT_PREFIX + eid, backend=BACKEND,
                                               kind=HOLDOUT_KIND))
                for group in holdout for eid in group]
        replacing = f"training run {pin}" if pin is not None else None
        self.lineage.record_derived_artifacts(derived, relation=TRAINED_RELATION, replacing=replacing)
        self.lineage.record_derived_artifacts(held, relation=HELD_OUT_RELATION, replacing=replacing)

    def logprobs(self, texts: Sequence[str]) -> list[Any]:
        """Per-token log-probabilities of each text under the serving ensemble."""
        reg = self.registry()
        return self.ensemble(reg).token_logprobs(texts, {"served": self.serving(reg)})["served"]

    def generate(self, prompt: str, max_bytes: int = 64) -> str:
        """Greedy continuation of ``prompt`` by the serving ensemble (at most ``max_bytes`` bytes)."""
        reg = self.registry()
        return self.ensemble(reg).greedy([prompt], max_bytes, self.serving(reg))[0]

    # -- reading the dataset ---------------------------------------------------------------------------

    def _dataset_lock(self, reg: Mapping[str, Any]) -> StoreLock:
        return StoreLock(lock_file_for(self.dataset_root(reg)), wait=self.lock.wait, store=reg["dataset"]["store"])

    def dataset_texts(self, ids: Iterable[str], *, hidden_too: bool = False,
                      registry: Mapping[str, Any] | None = None) -> tuple[dict[str, str], int]:
        """The texts of these example ids in the dataset's current version (with ``hidden_too``, rows its
        manifests hide as well: what is still stored), and the version read."""
        from tombstone_adapters.dataset import DatasetLoader, PinMismatchError

        reg = registry or self.registry()
        wanted = set(ids)
        try:
            with self._dataset_lock(reg):
                loader = DatasetLoader(self.dataset_root(reg))
                manifest = loader.manifest()
                hidden = set() if hidden_too else loader.hidden(manifest)
                out = {e.id: e.text for e in loader.iter_shards(manifest.shards, hidden) if e.id in wanted}
        except PinMismatchError as exc:
            raise StoreUnavailableError(f"the dataset changed while it was read: {exc}", store=self.store) from exc
        return out, loader.pointer.version

    # -- the erasure ---------------------------------------------------------------------------------

    @staticmethod
    def _group(aids: Iterable[str]) -> tuple[dict[str, set[str]], set[str]]:
        trained: dict[str, set[str]] = {}
        held: set[str] = set()
        for aid in aids:
            shard, eid = split_artifact(aid)
            if shard is None:
                held.add(eid)
            else:
                trained.setdefault(shard, set()).add(eid)
        return trained, held

    def suppress(self, aids: Iterable[str]) -> dict[str, Any]:
        """Hide the examples: each shard holding one leaves the serving ensemble (a sharded store); held-out
        examples leave the held-out lists. Idempotent."""
        trained, held = self._group(aids)
        with self.lock:
            reg = self.registry()
            before = self.serving(reg)
            changed = False
            for shard, eids in sorted(trained.items()):
                entry = reg["shards"].get(shard)
                if entry is None:
                    continue
                new = sorted(set(entry.get("suppressed", ())) | (eids & set(entry["examples"])))
                if new != sorted(entry.get("suppressed", ())):
                    entry["suppressed"] = new
                    changed = True
            changed |= self._drop_holdout(reg, held)
            if changed:
                self._write(reg)
                kill_point("suppress:lora:after-registry")
            after = self.serving(reg)
            evidence: dict[str, Any] = {"serving_before": before, "serving": after,
                                        "shards_hidden": sorted(set(before) - set(after))}
            if reg["sharded"]:
                evidence["mechanism"] = "the serving ensemble recomposed without the shards that hold the examples"
            else:
                evidence["mechanism"] = "none: an unsharded adapter cannot be hidden per subject"
                evidence["hidden"] = False
            return evidence

    @staticmethod
    def _drop_holdout(reg: dict[str, Any], eids: set[str]) -> bool:
        if not eids:
            return False
        groups = [[i for i in g if i not in eids] for g in reg["holdout"]]
        groups = [g for g in groups if g]
        if groups == reg["holdout"]:
            return False
        reg["holdout"] = groups
        return True

    def reclaim(self, aids: Iterable[str]) -> dict[str, Any]:
        """Retrain each shard holding one of the examples from the dataset's current version without them
        (and without anything the dataset hides), write its new weights, record them in the registry
        (recomposing the ensemble), then remove the old weights file and any weights file the registry does
        not name. An unsharded adapter continues training its weights on the remaining examples instead
        (approximate unlearning). Idempotent, and safe to run again after a kill at any point: a retrain is
        seeded from the shard and the examples it keeps, so it writes the same bytes again."""
        trained, held = self._group(aids)
        with self.lock:
            reg = self.registry()
            cfg = M.ModelConfig.from_dict(reg["config"])
            retrained: dict[str, Any] = {}
            base = None
            for shard, eids in sorted(trained.items()):
                entry = reg["shards"].get(shard)
                if entry is None:
                    continue
                gone = eids & set(entry["examples"])
                # the file the entry names is checked before anything is trained, written or removed: an entry
                # that leaves the store fails this shard's reclaim in one line, and nothing is deleted
                old_path = self._file(entry["file"], f"shards.{shard}.file") if entry.get("file") else None
                if not gone:
                    if set(entry.get("suppressed", ())) & eids:
                        entry["suppressed"] = sorted(set(entry["suppressed"]) - eids)
                        self._write(reg)
                    continue
                keep = [i for i in entry["examples"] if i not in eids]
                texts, version = self.dataset_texts(keep, registry=reg)
                ids = [i for i in keep if i in texts]
                base = base or self.base_model(reg)
                old_file, old_sha = entry["file"], entry["sha256"]
                halfway = max(1, (cfg.steps if reg["sharded"] else cfg.unlearn_steps) // 2)

                def on_step(step: int) -> None:
                    if step == halfway:
                        kill_point("reclaim:lora:mid-training")

                if reg["sharded"]:
                    new = self._train_shard(cfg, base, shard, [texts[i] for i in ids], ids, on_step=on_step,
                                            seed=M.seed_of(cfg.seed, shard, "train", _digest(ids)))
                else:
                    init = M.load_state(self._weights(old_file, old_sha, f"shards.{shard}.file"))
                    new = self._train_shard(cfg, base, shard, [texts[i] for i in ids], ids, init=init,
                                            steps=cfg.unlearn_steps, on_step=on_step,
                                            seed=M.seed_of(cfg.seed, shard, "unlearn", old_sha, _digest(ids)))
                kill_point("reclaim:lora:after-weights-write")
                new["manifest_version"] = version
                new["canaries"] = {i: c for i, c in entry.get("canaries", {}).items() if i in set(ids)}
                new["suppressed"] = sorted(set(entry.get("suppressed", ())) - eids)
                reg["shards"][shard] = new
                if old_sha:  # the old file's tag, and its tensors' (those the new weights do not share)
                    retire(reg, shard, old_sha, self._readable(old_file, old_sha, f"shards.{shard}.file"),
                           self._readable(new["file"], new["sha256"], f"shards.{shard}.file"))
                self._write(reg)
                kill_point("reclaim:lora:after-registry")
                if old_path is not None and old_file != new["file"]:
                    old_path.unlink(missing_ok=True)
                    kill_point("reclaim:lora:after-old-removed")
                retrained[shard] = {"examples_dropped": len(gone), "examples_kept": len(ids),
                                    "not_in_dataset": len(keep) - len(ids), "manifest_version": version,
                                    "old_sha256": old_sha, "new_sha256": new["sha256"],
                                    "weights_changed": old_sha != new["sha256"], "trained": new["trained"]}
            if self._drop_holdout(reg, held):
                self._write(reg)
            removed = self._remove_unreferenced(reg)
            return {"steps": ["retrain each shard holding an erased example from the dataset without it" if reg["sharded"]
                              else "continue training the unsharded adapter on the remaining examples"
                                   " (approximate unlearning)",
                              "write the new weights atomically", "record them in the registry (the ensemble recomposed)",
                              "remove the old weights file and any weights file the registry does not name"],
                    "sharded": reg["sharded"], "retrained": retrained, "serving": self.serving(reg),
                    "files_removed": removed}

    def _remove_unreferenced(self, reg: Mapping[str, Any]) -> list[str]:
        """Weights files and temporary files the registry does not name (an old shard's weights left by a
        kill, a retrain's file from before a kill)."""
        named = {e["file"] for e in reg["shards"].values() if e.get("file")}
        if reg.get("base"):
            named.add(reg["base"]["file"])
        removed = []
        root = os.path.realpath(self.root)
        for folder in (ADAPTERS_DIR, BASE_DIR, "."):
            path = self.root / folder
            # a folder that is a link (out of the store, or anywhere) is not the store's: nothing in it is removed
            if folder != "." and (path.is_symlink() or os.path.dirname(os.path.realpath(path)) != root):
                continue
            if not path.is_dir():
                continue
            for entry in os.scandir(path):
                rel = os.path.normpath(os.path.join(folder, entry.name))
                if entry.is_dir(follow_symlinks=False):
                    continue
                if folder == "." and not entry.name.endswith(".tmp"):
                    continue
                if rel not in named:
                    os.unlink(entry.path)
                    removed.append(rel)
        return sorted(removed)

    def delete_examples(self, aids: Iterable[str]) -> None:
        """What dropping examples from a training list without retraining does (the control): the ids leave
        the registry, the weights trained on them stay and keep serving."""
        trained, held = self._group(aids)
        with self.lock:
            reg = self.registry()
            for shard, eids in trained.items():
                entry = reg["shards"].get(shard)
                if entry is not None:
                    entry["examples"] = [i for i in entry["examples"] if i not in eids]
                    entry["suppressed"] = [i for i in entry.get("suppressed", ()) if i not in eids]
                    entry["canaries"] = {i: c for i, c in entry.get("canaries", {}).items() if i not in eids}
            self._drop_holdout(reg, held)
            self._write(reg)


__all__ = ["BACKEND", "EXAMPLE_KIND", "HOLDOUT_KIND", "LoraStore", "LoraTarget", "ModelStoreError", "REGISTRY",
           "WEIGHTS_LIMIT", "artifact_id", "retired_tag", "split_artifact"]
