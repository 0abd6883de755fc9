"""Copies of a weights file as a person might keep them after an erasure retired it, and files that look
like weights but cannot be read: the cases the physical probe's weights check is tested and measured on
(``tests/adapters/test_lora_copies.py``, ``benchmarks/lora_copies.py``). Each case is a file name inside the
model store and the bytes to put there; every copy holds at least one tensor of the weights unchanged."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Mapping, Sequence
from typing import Any

_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64", "int32": "I32", "uint8": "U8",
           "int8": "I8", "bool": "BOOL"}


def write_safetensors(tensors: Sequence[tuple[str, Any]], metadata: Mapping[str, str] | None = None) -> bytes:
    """Safetensors bytes with the header's entries and the tensors' data in the order given (the safetensors
    library sorts them by dtype and name), and ``metadata`` first in the header."""
    import numpy as np

    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    parts, at = [], 0
    for name, array in tensors:
        array = np.ascontiguousarray(array)
        raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[array.dtype.name], "shape": list(array.shape), "data_offsets": [at, at + len(raw)]}
        parts.append(raw)
        at += len(raw)
    head = json.dumps(header).encode("utf-8")
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(parts)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


def copies(data: bytes) -> dict[str, tuple[str, bytes]]:
    """Copies of the safetensors weights ``data``: case -> (file name, bytes)."""
    from safetensors.numpy import load, save

    tensors = load(data)
    names = sorted(tensors)
    half = names[: max(1, len(names) // 2)]
    return {
        "byte-identical copy": ("backup/weights.safetensors", data),
        "gzip copy": ("backup/weights.safetensors.gz", gzip.compress(data, mtime=0)),
        "zstd copy": ("backup/weights.safetensors.zst", _zstd(data)),
        "xz copy": ("backup/weights.safetensors.xz", lzma.compress(data)),
        "bz2 copy": ("backup/weights.safetensors.bz2", bz2.compress(data)),
        "re-saved: tensors reordered, metadata added": (
            "export/adapter.safetensors",
            write_safetensors([(n, tensors[n]) for n in reversed(names)], {"exported_by": "ops", "note": "backup"})),
        "re-saved: every tensor renamed": (
            "export/renamed.safetensors", save({f"layer{i}.weight": tensors[n] for i, n in enumerate(names)})),
        "re-saved: half of the tensors": ("export/half.safetensors", save({n: tensors[n] for n in half})),
        "re-saved: one tensor, renamed, gzip, named notes.txt": (
            "notes.txt", gzip.compress(save({"x": tensors[names[-1]]}), mtime=0)),
    }


def unrelated(data: bytes) -> dict[str, tuple[str, bytes]]:
    """Files that hold none of the tensors of ``data`` (other weights; one changed element of each tensor,
    compressed): the control that a copy is found by its tensors and nothing else is."""
    import numpy as np
    from safetensors.numpy import load, save

    tensors = load(data)
    nudged = {}
    for name, array in tensors.items():
        array = array.copy()
        array.flat[0] = np.nextafter(array.flat[0], np.inf) if array.dtype.kind == "f" else array.flat[0] + 1
        nudged[name] = array
    return {"every tensor nudged by one ulp, gzip": ("backup/nudged.safetensors.gz", gzip.compress(save(nudged), mtime=0))}


def broken(data: bytes) -> dict[str, tuple[str, bytes]]:
    """Files that look like weights and cannot be decoded: case -> (file name, bytes)."""
    packed = bytearray(gzip.compress(data, mtime=0))
    middle = len(packed) // 2
    packed[middle : middle + 16] = bytes(b ^ 0xFF for b in packed[middle : middle + 16])
    bomb = (1 << 62).to_bytes(8, "little") + b'{"a": {"dtype": "F32"'
    return {
        "truncated safetensors": ("backup/truncated.safetensors", data[: len(data) // 2]),
        "corrupt gzip": ("backup/corrupt.safetensors.gz", bytes(packed)),
        "header bomb (2^62-byte header declared)": ("backup/bomb.safetensors", bomb),
        "header bomb inside xz": ("backup/bomb.bin", lzma.compress(bomb)),
    }


__all__ = ["broken", "copies", "unrelated", "write_safetensors"]
