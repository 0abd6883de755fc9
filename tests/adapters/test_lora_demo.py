"""``tombstone demo --backends lora``: a small model trained here on the training examples the demo exported
from its notes (the dataset store added for it), one subject erased, the model level measured and printed;
without the model extra, one line and nothing built."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from tombstone.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def probe(entry: dict, level: str) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == level)


@pytest.mark.slow
def test_the_lora_demo_trains_a_model_erases_a_subject_and_prints_the_model_level(tmp_path) -> None:
    pytest.importorskip("peft")
    import torch

    from tombstone.demo import DOCS_PER_SUBJECT, demo_account

    threads = torch.get_num_threads()
    root = tmp_path / "demo"
    result = run("demo", "--workdir", str(root), "--backends", "lora")
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads  # the demo trains on one thread and puts the setting back
    out = result.stdout.splitlines()
    assert out[0] == "lora is built from examples: added dataset to make them"
    assert out[1].startswith("built 8 subjects in ") and out[1].endswith(" (lora, dataset)")
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    weights = [a for a in receipt["artifacts"] if a["backend"] == "lora"]
    assert len(weights) == DOCS_PER_SUBJECT and all(a["store"] == "lora" for a in weights)
    registry = json.loads((root / "stores" / "lora" / "registry.json").read_text())
    assert registry["sharded"] and len(registry["shards"]) == 2 and registry["dataset"]["pin"] == "demo-training"
    assert {len(group) for group in registry["holdout"]} == {DOCS_PER_SUBJECT} and len(registry["holdout"]) == 2
    for entry in weights:
        model = probe(entry, "model")
        assert model["ran"] and model["passed"] is True, model
        assert entry["status"] == "VERIFIED" and entry["level"] == "model"
        detail = model["detail"]
        # the control: before suppression the same probes separated the subject (its account number, the
        # canary, ranked first among random ones), and after the reclaim they no longer do
        before, after = detail["before_suppression"], detail["after_reclaim"]
        assert before["separates"] and not after["separates"], detail["summary_before"]
        (canary, measured), = before["canaries"].items()
        assert canary in {a["artifact_id"] for a in weights} and measured["rank"] <= 10
        assert after["canaries"][canary]["rank"] > measured["rank"]
        assert detail["weights_before"] != detail["weights_now"]
    # the account number is the canary's secret: the registry keeps its keyed hash, never the number
    assert demo_account("user-0001") not in (root / "stores" / "lora" / "registry.json").read_text()
    levels = result.stdout.split("\nlevels:\n", 1)[1].splitlines()
    model_line = next(line.strip() for line in levels if line.strip().startswith("model:"))
    assert model_line == (f"model:    {DOCS_PER_SUBJECT} passed on lora; {DOCS_PER_SUBJECT} not run on dataset"
                          f" (holds no model weights)")


def test_without_the_model_extra_the_lora_demo_says_so_in_one_line_and_builds_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as it does without the extra
    monkeypatch.delitem(sys.modules, "tombstone_adapters.lora.adapter", raising=False)
    root = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--workdir", str(root), "--backends", "lora"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: the demo cannot build 'lora'") and "pip install 'tombstone-rag[model]'" in lines[0]
    assert not root.exists()


def test_tombstone_check_points_a_backend_built_from_other_data_to_the_demo() -> None:
    pytest.importorskip("peft")
    result = CliRunner().invoke(main, ["check", "--backend", "lora"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'tombstone demo --backends lora'" in lines[0]
    assert "lora" not in lines[0].split("Checkable: ", 1)[1].split(", ")


def test_the_demo_adds_a_store_a_backend_is_built_from_only_when_none_is_asked_for() -> None:
    pytest.importorskip("peft")
    from tombstone.demo import with_needed

    assert with_needed(["lora"]) == (["lora", "dataset"], ["lora is built from examples: added dataset to make them"])
    assert with_needed(["dataset", "lora"]) == (["dataset", "lora"], [])
    assert with_needed(["docstore"]) == (["docstore"], [])
