"""The dataset's demo, canary and survivor hooks (see ``tombstone.contract.Adapter``)."""

from __future__ import annotations

import gzip
import json
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_NAMESPACE = uuid.UUID("0b5d7c1e-5a41-4f0e-9f67-3a1d2c9e8b70")


def example_id(chunk_id: str) -> str:
    """The demo's id for the training example exported from a chunk."""
    return f"ex-{uuid.uuid5(_NAMESPACE, chunk_id)}"


class DatasetHooks:
    demo_role = "examples"
    demo_default = False

    @classmethod
    def demo_store(cls, kit) -> dict[str, Any]:
        return {"backend": "dataset", "path": "stores/dataset"}

    @classmethod
    def demo_fill(cls, kit, store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        """One training example per chunk, exported into Parquet shards: one version per chunk position,
        so each subject's examples lie in several shards and the dataset has a history of versions."""
        from .store import DatasetStore

        data = DatasetStore(options["path"], lineage=kit.lineage, store=store, format="parquet")
        chunks = {ref: kit.chunks(ref) for ref in subjects}
        for n in range(max((len(ids) for ids, _, _ in chunks.values()), default=0)):
            with data.writer() as writer:
                for ref in subjects:
                    ids, texts, _ = chunks[ref]
                    if n < len(ids):
                        writer.add([example_id(ids[n])], [texts[n]], subject=ref,
                                   sources=[kit.chunk_sources([ids[n]])], metadatas=[{"chunk_id": ids[n], "n": n}])

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**options, "path": f"{str(options['path']).rstrip('/')}-tombstone-canary"}

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        place = Path(cls.canary_options(options)["path"])
        shutil.rmtree(place, ignore_errors=True)
        Path(f"{place.resolve()}.tombstone.lock").unlink(missing_ok=True)

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every example the current version serves, read with pyarrow and json directly: (id, text,
        metadata as stored) sorted by id."""
        import pyarrow.parquet as pq

        root = Path(options["path"])
        current = json.loads((root / "CURRENT").read_text())
        manifest = json.loads((root / current["manifest"]).read_text())
        hidden = set(manifest["suppressed"]) | set(manifest["deleted"])
        rows = []
        for shard in manifest["shards"]:
            path = root / shard["path"]
            if shard["format"] == "parquet":
                table = pq.read_table(path)
                rows += zip(*(table.column(c).to_pylist() for c in ("id", "text", "metadata")))
            else:
                raw = path.read_bytes()
                text = gzip.decompress(raw) if shard["format"] == "jsonl.gz" else raw
                for line in text.decode("utf-8").splitlines():
                    obj = json.loads(line)
                    rows.append((obj["id"], obj["text"], json.dumps(obj["metadata"], sort_keys=True)))
        return sorted(row for row in rows if row[0] not in hidden)
