"""``tombstone demo --via llamaindex``: the demo's chunks written as a LlamaIndex app (an ingestion pipeline with
a cache, an index whose docstore keeps the nodes, persisted), and every copy erased."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("llama_index.core")

from tombstone.cli import main  # noqa: E402
from tombstone.demo import subject_name  # noqa: E402


def holding(folder: Path, needle: bytes) -> list[str]:
    """An independent byte scan: which files under ``folder`` hold ``needle``."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.mark.slow
def test_demo_via_llamaindex_erases_the_nodes_and_their_copies_in_the_persisted_storage(tmp_path):
    workdir = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--workdir", str(workdir), "--via", "llamaindex", "--subjects", "3",
                                       "--backends", "docstore,chroma"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "through llamaindex" in result.output
    receipt = json.loads((workdir / "receipts" / f"{subject_name(1)}.json").read_text())
    assert {a["store"] for a in receipt["artifacts"]} == {"docstore", "chroma", "llamaindex"}
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    copies = [a["artifact_id"] for a in receipt["artifacts"] if a["store"] == "llamaindex"]
    chunks = [a["artifact_id"] for a in receipt["artifacts"] if a["store"] == "chroma"]
    assert copies and sorted(copies) == sorted(chunks)  # each chunk's LlamaIndex copies, under the node's id
    storage = workdir / "stores" / "llamaindex"
    for node in copies:
        assert holding(storage, node.encode()) == []
    # the control: another subject's nodes are still in the docstore, the index store and the ingestion cache
    other = json.loads((storage / "docstore.json").read_text())["docstore/data"]
    assert other and {"docstore.json", "index_store.json", "pipeline/llama_cache"} <= set(
        holding(storage, next(iter(other)).encode()))
