"""Checks on what a model store's registry holds before the store acts on it (see ``store``): the types of
the fields it reads, and the byte limits a store's options set."""

from __future__ import annotations

from typing import Any

from tombstone.errors import ConfigError


def byte_limit(value: Any, name: str, default: int) -> int:
    """A byte limit given as a store option (an int, or a string of one from the command line)."""
    if value is None:
        return default
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = 0
    if limit <= 0:
        raise ConfigError(f"{name} = {value!r} is not a positive number of bytes")
    return limit


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def registry_problem(body: Any, format_name: str) -> str | None:
    """What makes ``body`` not a registry this module could have written (the types of the fields it reads),
    or None."""
    if not isinstance(body, dict) or body.get("format") != format_name:
        return "it is not a model store registry"
    if not isinstance(body.get("config"), dict):
        return "its config is not an object"
    for key in ("n_embd", "n_layer", "n_head", "n_positions", "lora_r", "steps", "batch_size", "base_steps",
                "unlearn_steps"):
        value = body["config"].get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 31:
            return f"config.{key} is not a positive integer"
    base = body.get("base")
    if base is not None and not (isinstance(base, dict) and isinstance(base.get("file"), str)
                                 and isinstance(base.get("sha256"), str)):
        return "its base entry is not a file and a SHA-256"
    dataset = body.get("dataset")
    if dataset is not None and not (isinstance(dataset, dict) and isinstance(dataset.get("path"), str)
                                    and isinstance(dataset.get("store"), str)):
        return "its dataset entry is not a path and a store"
    if not isinstance(body.get("sharded"), bool) or not isinstance(body.get("shards"), dict):
        return "its shards are not an object"
    for name, entry in body["shards"].items():
        if not isinstance(entry, dict) or not _is_str_list(entry.get("examples")):
            return f"shard {name!r} has no list of examples"
        if not _is_str_list(entry.get("suppressed", [])) or not isinstance(entry.get("canaries", {}), dict):
            return f"shard {name!r} has a suppressed list or canaries of the wrong type"
        if entry.get("file") is not None and not (isinstance(entry["file"], str) and isinstance(entry.get("sha256"), str)):
            return f"shard {name!r} names its weights file without a SHA-256, or not as a string"
    if not isinstance(body.get("holdout"), list) or not all(_is_str_list(g) for g in body["holdout"]):
        return "its held-out lists are not lists of example ids"
    for key, what in (("retired", "weights"), ("retired_tensors", "tensors")):
        retired = body.get(key, {})
        if not isinstance(retired, dict) or not all(_is_str_list(v) for v in retired.values()):
            return f"its retired {what} are not lists of hashes"
    return None


__all__ = ["byte_limit", "registry_problem"]
