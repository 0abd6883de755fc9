"""``tombstone demo --via langchain``: the demo's chunks and cached answers written through LangChain."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tombstone import Tombstone
from tombstone.cli import main
from tombstone.demo import subject_name


def demo(*args: str):
    return CliRunner().invoke(main, ["demo", *args], catch_exceptions=False)


@pytest.mark.slow
def test_demo_via_langchain_erases_chunks_and_cached_answers(tmp_path):
    workdir = tmp_path / "demo"
    result = demo("--workdir", str(workdir), "--via", "langchain", "--subjects", "3",
                  "--backends", "docstore,chroma,faiss,exact_cache,semantic_cache")
    assert result.exit_code == 0, result.output
    assert "through langchain" in result.output
    receipt = json.loads((workdir / "receipts" / f"{subject_name(1)}.json").read_text())
    stores = {a["store"] for a in receipt["artifacts"]}
    assert stores == {"docstore", "chroma", "faiss", "exact_cache", "semantic_cache"}
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    with Tombstone.open(workdir / "tombstone.toml") as tomb:
        entry = next(a for a in receipt["artifacts"] if a["store"] == "exact_cache")
        sources = tomb.lineage.edges_of(tomb.lineage.artifact("exact_cache", entry["artifact_id"]))["sources"]
        chunk = next(a for a in receipt["artifacts"] if a["store"] == "chroma")
        sources_of_chunk = tomb.lineage.edges_of(tomb.lineage.artifact("chroma", chunk["artifact_id"]))["sources"]
    assert {(s, r) for s, _, r in sources} == {("chroma", "answer_built_from")}  # the chain's answer, from chunks
    assert [(s, r) for s, _, r in sources_of_chunk] == [("docstore", "chunked_into")]  # the chunk, from a document
    verify = CliRunner().invoke(main, ["receipt", "verify", str(workdir / "receipts" / f"{subject_name(1)}.json"),
                                         "--key", str(workdir / "keys" / "signing.pub")])
    assert verify.exit_code == 0, verify.output


def test_demo_via_an_unknown_framework_is_bad_input(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--workdir", str(tmp_path / "d"), "--via", "haystack"])
    assert result.exit_code == 2 and "--via must be one of wrappers, langchain, llamaindex" in result.output
    assert not (tmp_path / "d").exists()
