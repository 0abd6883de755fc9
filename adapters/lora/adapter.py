"""Adapter for the lora backend: the serving ensemble recomposed without a shard, the shard retrained,
a probe of the registry and of every file, and the model probe (``tombstone.verify.model``)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tombstone.contract import Adapter, Capability, ExtraFinding, ProbeResult
from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.fsutil import open_regular
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.physical import default_patterns

from .hooks import LoraHooks
from .store import BACKEND, LoraStore, LoraTarget, split_artifact
from .tensors import (
    Contents,
    Undecodable,
    read_contents,
    retired_index,
    retired_tag,
    tensor_tag,
)

for _module in ("torch", "transformers", "peft"):  # the model extra; imported only when a model is loaded
    if importlib.util.find_spec(_module) is None:
        raise ImportError(f"No module named {_module!r}")

_CHUNK = 1 << 20


class LoraAdapter(LoraHooks, Adapter):
    """Options: ``path`` (the model store directory, required), ``lock_wait`` (seconds, optional),
    ``max_metadata_bytes`` (the largest registry read, 64 MiB by default) and ``max_weights_bytes`` (the largest
    weights file read, 4 GiB by default)."""

    backend = BACKEND
    capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                              Capability.PHYSICAL_SCAN, Capability.MODEL_PROBE})
    levels = (Level.LOGICAL, Level.PHYSICAL, Level.MODEL)
    read_only_supported = True

    def __init__(self, store: str, options: dict[str, Any]) -> None:
        super().__init__(store, options)
        self.require("path")
        kwargs: dict[str, Any] = {"lock_wait": float(options["lock_wait"])} if "lock_wait" in options else {}
        kwargs.update({key: options[key] for key in ("max_metadata_bytes", "max_weights_bytes") if key in options})
        self.model = LoraStore(options["path"], store=store, create=False, **kwargs)
        self.model.registry()  # a registry that cannot be read stops an erasure before it starts

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """The file system's errors, and safetensors' (a weights file it cannot read)."""
        errors: tuple[type[BaseException], ...] = (OSError,)
        try:
            from safetensors import SafetensorError

            errors += (SafetensorError,)
        except ImportError:  # pragma: no cover - installed with the model extra
            pass
        return errors

    def lock_path(self) -> Path:
        return self.model.root

    def _locked(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.read_only else self.model.lock

    # -- the erasure --------------------------------------------------------------------------

    @staticmethod
    def _ids(artifacts: Sequence[ArtifactRecord]) -> list[str]:
        return [a.artifact_id for a in artifacts]

    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return self.model.suppress(self._ids(artifacts))

    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        return self.model.reclaim(self._ids(artifacts))

    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        self.model.delete_examples(self._ids(artifacts))

    # -- logical: does the serving composition use weights trained on it? ---------------------------

    def probe_logical(self, artifacts: Sequence[ArtifactRecord], probe_vectors=None) -> dict[str, ProbeResult]:
        with self._locked():
            reg = self.model.registry()
        serving = self.model.serving(reg)
        held = {i for g in reg["holdout"] for i in g}
        out = {}
        for art in artifacts:
            shard, eid = split_artifact(art.artifact_id)
            if shard is None:
                found = eid in held
                out[art.artifact_id] = ProbeResult(
                    Level.LOGICAL, passed=not found,
                    measurement="listed as held-out data the model probe reads" if found else None,
                    evidence={"paths": ["registry: held-out lists"], "serving": serving})
                continue
            entry = reg["shards"].get(shard) or {"examples": []}
            trained = eid in entry["examples"]
            served = trained and shard in serving
            evidence = {"paths": ["serving ensemble (registry)"], "serving": serving, "shard": shard,
                        "shard_trained_on_it": trained, "shard_serving": shard in serving}
            if trained and not served:
                evidence["hidden"] = f"{shard} is left out of the serving ensemble"
            out[art.artifact_id] = ProbeResult(
                Level.LOGICAL, passed=not served,
                measurement=(f"served: {shard}'s weights were trained on it and are in the serving ensemble"
                             if served else None), evidence=evidence)
        return out

    # -- physical: every file, for the ids, and any copy of weights an erasure retired ----------------

    @contextlib.contextmanager
    def physical_snapshot(self) -> Iterator[dict[Path, str]]:
        root = self.model.root
        if not os.access(root, os.R_OK | os.X_OK):
            raise PhysicalUnsupportedError(f"model store directory {root} is not readable", store=self.store)
        with self._locked():
            yield {path: os.path.relpath(path, root) for path in _files(root)}

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        """The artifact id, and the example id (as UTF-8 and as JSON escapes it)."""
        patterns = default_patterns(artifact)
        _, eid = split_artifact(artifact.artifact_id)
        patterns["id_example"] = eid.encode("utf-8")
        escaped = json.dumps(eid, ensure_ascii=True)[1:-1].encode("utf-8")
        if escaped != patterns["id_example"]:
            patterns["id_example_json"] = escaped
        return patterns

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """Read every file by its content: one whose SHA-256 (or, compressed with gzip, zstd, bz2 or xz, whose
        content's SHA-256) is a weights file an erasure retired, or safetensors content (plain or compressed)
        holding any tensor of retired weights, is a copy of those weights, whatever its name. Content that looks
        like either and cannot be decoded within the bounds leaves a shard with retired weights unchecked:
        PhysicalUnsupportedError naming the files (the artifacts UNVERIFIED), unless a copy was found anyway."""
        with self._locked():
            reg = self.model.registry()
            whole, by_tensor = retired_index(reg)
            copies: dict[str, dict[str, str]] = {}
            undecodable: dict[str, str] = {}
            hashed = decoded = 0
            for path in _files(self.model.root):
                rel = os.path.relpath(path, self.model.root)
                try:  # a regular file when listed; opened so that a FIFO or link put there since is refused
                    fd = open_regular(path, self.model.root, store=self.store)
                except (OSError, StoreUnavailableError) as exc:
                    raise PhysicalUnsupportedError(f"{path} could not be hashed: {exc}", store=self.store) from exc
                with open(fd, "rb") as fh:
                    try:
                        contents = read_contents(fh, os.fstat(fh.fileno()).st_size, self.model.max_weights_bytes,
                                                 header_limit=self.model.max_metadata_bytes, decode=bool(whole))
                    except Undecodable as exc:
                        undecodable[rel] = str(exc)
                        continue
                    except OSError as exc:
                        raise PhysicalUnsupportedError(f"{path} could not be hashed: {exc}", store=self.store) from exc
                hashed += 1
                decoded += bool(contents.kinds)
                for shard, how in _matches(contents, whole, by_tensor).items():
                    copies.setdefault(shard, {})[rel] = how
        blind = sorted({shard for art in artifacts if (shard := split_artifact(art.artifact_id)[0]) is not None
                        and shard in set(whole.values()) and shard not in copies})
        if undecodable and blind:
            named = "; ".join(f"{rel} ({why})" for rel, why in sorted(undecodable.items())[:5])
            more = f" and {len(undecodable) - 5} more" if len(undecodable) > 5 else ""
            also = "".join(f"; a copy of {s}'s retired weights was found: {', '.join(sorted(f))}"
                           for s, f in sorted(copies.items()))
            raise PhysicalUnsupportedError(
                f"weights in the model store that cannot be decoded: {named}{more}; a copy of the retired weights of"
                f" {', '.join(blind)} in them would not be seen{also}", store=self.store)
        evidence: dict[str, Any] = {
            "files_hashed": hashed, "files_decoded": decoded, "retired_weights_known": len(whole),
            "retired_tensors_known": sum(len(t) for t in by_tensor.values()),
            "weights_check": "no file may hash to weights an erasure retired, nor hold (plain or compressed with"
                             " gzip, zstd, bz2 or xz) safetensors content with a tensor of them, whatever its name"}
        if undecodable:
            evidence["not_decoded"] = {rel: undecodable[rel] for rel in sorted(undecodable)[:50]}
        if unmatched := sorted(set(whole.values()) - set(by_tensor)):
            evidence["retired_without_tensor_digests"] = unmatched  # a registry from before: whole files only
        out = {}
        for art in artifacts:
            shard, _ = split_artifact(art.artifact_id)
            found = ([f"a copy of {shard}'s retired weights: "
                      + ", ".join(f"{rel} ({how})" for rel, how in sorted(copies[shard].items()))]
                     if shard in copies else [])
            out[art.artifact_id] = ExtraFinding(found=found, content_found=bool(found), evidence=evidence)
        return out

    # -- the model probe ---------------------------------------------------------------------------

    def model_material(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, dict[str, Any]]:
        reg = self.model.registry()
        trained = {}
        out: dict[str, dict[str, Any]] = {}
        for art in artifacts:
            shard, eid = split_artifact(art.artifact_id)
            if shard is None:
                out[art.artifact_id] = {"kind": "holdout"}
                continue
            entry = reg["shards"].get(shard)
            if entry is None or not entry.get("file"):
                out[art.artifact_id] = {"kind": "not trained", "why": f"the store has no weights for {shard} any more"}
                continue
            # measured even when the registry no longer lists it: weights trained on it may still serve
            trained[art.artifact_id] = (shard, eid, entry)
        if trained:
            texts, _ = self.model.dataset_texts([eid for _, eid, _ in trained.values()], hidden_too=True, registry=reg)
        for aid, (shard, eid, entry) in trained.items():
            text = texts.get(eid)
            if text is None:
                out[aid] = {"kind": "not trained", "why": "its text is no longer in the dataset it was trained from"}
                continue
            out[aid] = {"kind": "trained", "shards": [shard], "weights": {shard: entry["sha256"]}, "text": text,
                        "canary": self._canary(text, entry.get("canaries", {}).get(eid)), "sharded": reg["sharded"]}
        return out

    def _canary(self, text: str, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        """Where the canary lies in the text: at the recorded offset, or wherever a run of its alphabet
        hashes to the recorded (keyed) SHA-256."""
        if not spec:
            return None
        key = getattr(self, "content_key", None) if spec.get("keyed") else (lambda h: h)
        if key is None:
            return None  # a keyed canary and no key (an independent verifier)
        length, alphabet = int(spec["length"]), spec["alphabet"]

        def matches(at: int) -> bool:
            part = text[at : at + length]
            return len(part) == length and key(hashlib.sha256(part.encode("utf-8")).hexdigest()) == spec["sha256"]

        offsets = [int(spec["offset"])] + [i for i in range(len(text) - length + 1)
                                          if all(ch in alphabet for ch in text[i : i + length])]
        for at in offsets:
            if matches(at):
                return {"offset": at, "length": length, "alphabet": alphabet}
        return None

    def model_target(self) -> LoraTarget:
        with self._locked():
            return LoraTarget(self.model)

    def unsupported_reason(self, level: Level) -> str | None:
        return None

    # -- hooks ----------------------------------------------------------------------------------------

    @classmethod
    def read_survivors(cls, options: dict[str, Any]) -> Any:
        """The registry read with json: each shard's weights SHA-256, examples and serving state, the
        held-out lists, and the files in the store (sorted)."""
        root = Path(options["path"])
        reg = LoraStore(root, create=False).registry()
        shards = {name: (e.get("sha256"), sorted(e["examples"]), sorted(e.get("suppressed", ())))
                  for name, e in sorted(reg["shards"].items())}
        return {"shards": shards, "holdout": reg["holdout"],
                "files": sorted(os.path.relpath(p, root) for p in _files(root) if not p.name.endswith(".tmp"))}


def _matches(contents: Contents, whole: dict[str, str], by_tensor: dict[str, set[str]]) -> dict[str, str]:
    """The shards whose retired weights a file's contents hold, and how: the same bytes (of the file, or of
    what it decompresses to), or some of the tensors."""
    out: dict[str, str] = {}
    codecs = [k for k in contents.kinds if k != "safetensors"]
    for layer, sha in enumerate(contents.sha256s):
        if (shard := whole.get(retired_tag(sha))) is not None:
            out[shard] = "the same bytes" + (f", {'+'.join(codecs[:layer])}-compressed" if layer else "")
    tags = {tensor_tag(t.digest) for t in contents.tensors if not t.constant}
    for shard, retired in by_tensor.items():
        if held := len(tags & retired):
            how = f"{held} of its {len(retired)} retired tensors" + (f", {'+'.join(codecs)}-compressed" if codecs else "")
            out[shard] = f"{out[shard]}; {how}" if shard in out else how
    return out


def _files(root: Path) -> list[Path]:
    """Every regular file under the store directory."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                out.append(path)
    return out


__all__ = ["LoraAdapter"]
