"""The lora backend on a real model built and trained here: a 2-layer GPT-2 over bytes, a base trained on
other people's sentences, four LoRA shards trained from a pinned dataset; erasure through the saga from a
document through its training example into the shard's weights, the model probe with its control, the
physical probe of the registry and weights, a kill inside the shard retrain, and the unsharded case.

One deployment is trained per module (the CI configuration: a minute or so on two cores) and copied for
each test."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from tombstone_adapters.lora import LoraStore, ModelConfig
from tombstone_adapters.lora import synthetic as S
from tombstone_adapters.lora.adapter import LoraAdapter
from tombstone_adapters.lora.store import retired_tag

from tombstone import Tombstone
from tombstone.cli import main
from tombstone.config import load_config
from tombstone.testing import crash
from tombstone.verify import model as mv

pytestmark = pytest.mark.slow

SUBJECT = crash.SUBJECT  # user-0001: trained (the last four subjects are held out)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora") / "template"
    S.build_deployment(root)
    return root


def copy(template: Path, dst: Path) -> Path:
    crash.copy_deployment(template, dst)
    return dst


def registry(root: Path) -> dict:
    return json.loads((root / "stores/model/registry.json").read_text())


def shard_of(root: Path, ref: str) -> str:
    return next(name for name, e in registry(root)["shards"].items() if f"ex-{ref}-00" in e["examples"])


def files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def model_artifacts(receipt: dict) -> list[dict]:
    return [a for a in receipt["artifacts"] if a["store"] == "model"]


def probe(entry: dict, level: str) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == level)


@pytest.fixture(scope="module")
def erased(template: Path, tmp_path_factory) -> dict:
    """user-0001 erased in-process on a copy: what the store held before, the receipt, `where` before."""
    root = copy(template, tmp_path_factory.mktemp("erased") / "deploy")
    shard = shard_of(root, SUBJECT)
    entry = registry(root)["shards"][shard]
    old = (root / "stores/model" / entry["file"]).read_bytes()
    where = CliRunner().invoke(main, ["where", SUBJECT, "--config", str(root / "tombstone.toml")],
                               catch_exceptions=False).output
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    return {"root": root, "shard": shard, "old_entry": entry, "old_weights": old, "receipt": receipt,
            "where": where, "survivors": crash.survivors(root), "statuses": crash.statuses(root)}


def test_where_follows_the_subject_from_a_document_through_its_example_into_the_shard(erased: dict) -> None:
    where, shard = erased["where"], erased["shard"]
    assert f"model/{shard}:ex-{SUBJECT}-03" in where
    assert f"train/ex-{SUBJECT}-03\n  training_example in a dataset store; in scope: owned\n  derived into: model/{shard}:ex-{SUBJECT}-03" in where
    assert f"docs/doc-{SUBJECT}-03\n  document in a docstore store; in scope: owned\n  derived into: train/ex-{SUBJECT}-03" in where
    assert "third-party" not in where and "third party" not in where  # the training run became the model's


def test_erasure_reaches_the_weights_and_the_model_probe_verifies_it(erased: dict) -> None:
    receipt, root, shard = erased["receipt"], erased["root"], erased["shard"]
    statuses = {(a["store"], a["artifact_id"]): f"{a['status']}({a['level'] or a['reason']})" for a in receipt["artifacts"]}
    assert len(statuses) == 24 and not any("NEEDS_HUMAN" in s for s in statuses.values())
    assert {s for (store, _), s in statuses.items() if store != "model"} == {"VERIFIED(physical)"}
    assert {s for (store, _), s in statuses.items() if store == "model"} == {"VERIFIED(model)"}
    canary_entry = next(a for a in model_artifacts(receipt) if a["artifact_id"].endswith("-07"))
    detail = probe(canary_entry, "model")["detail"]
    before, after = detail["before_suppression"], detail["after_reclaim"]
    # the control: before suppression the same probes separate her, or the probe is blind
    assert before["separates"], f"the probe did not separate the subject before erasure (blind): {detail['summary_before']}"
    canary_before = before["canaries"][canary_entry["artifact_id"]]
    assert canary_before["rank"] <= 10 and canary_before["exposure"] > canary_before["null_suppressed"]["exposure"]
    assert any(before[m]["ci"][0] > max(before[m]["null_suppressed"], before[m]["null_heldout"])
               for m in ("loss", "min_k"))
    assert not after["separates"]
    assert after["canaries"][canary_entry["artifact_id"]]["rank"] > canary_before["rank"]
    assert detail["citation"] == "arXiv:2408.00929" and "fragile" in detail["limit"]
    # reclaim: the shard retrained without her, the ensemble recomposed, the old weights gone
    rec = canary_entry["evidence"]["reclaim"]["evidence"]["retrained"][shard]
    assert rec["weights_changed"] and rec["old_sha256"] == erased["old_entry"]["sha256"]
    assert rec["examples_dropped"] == 8 and rec["examples_kept"] == 16
    reg = registry(root)
    new = reg["shards"][shard]
    assert new["sha256"] == rec["new_sha256"] != erased["old_entry"]["sha256"]
    assert LoraStore(root / "stores/model", create=False).serving() == sorted(reg["shards"])  # recomposed
    assert retired_tag(erased["old_entry"]["sha256"]) in reg["retired"][shard]
    store = root / "stores/model"
    assert not (store / erased["old_entry"]["file"]).exists()
    assert files_holding(store, f"ex-{SUBJECT}".encode()) == []
    assert files_holding(store, erased["old_entry"]["sha256"].encode()) == []
    assert not any(hashlib.sha256(p.read_bytes()).hexdigest() == erased["old_entry"]["sha256"]
                   for p in store.rglob("*") if p.is_file())
    # the lineage db keeps nothing of the texts once the receipt is sealed
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        assert tomb.lineage.model_snapshots("model", [a["artifact_id"] for a in model_artifacts(receipt)]) == {}


def test_a_copy_of_the_retired_weights_is_found_under_any_name(erased: dict, tmp_path: Path) -> None:
    root = copy(erased["root"], tmp_path / "deploy")
    (root / "stores/model/backup").mkdir()
    (root / "stores/model/backup/weights.bin").write_bytes(erased["old_weights"])
    adapter = LoraAdapter("model", {"path": str(root / "stores/model")})
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(SUBJECT)) if a.store == "model"]
    results = adapter.probe_physical(arts)
    assert all(not r.passed and f"a copy of {erased['shard']}'s retired weights: backup/weights.bin" in r.measurement
               for r in results.values())


def test_suppression_recomposes_the_ensemble_without_the_shard_and_the_probe_sees_it(template: Path, tmp_path: Path) -> None:
    root = copy(template, tmp_path / "deploy")
    ref = S.subject_ref(1)
    shard = shard_of(root, ref)
    weights = registry(root)["shards"][shard]
    adapter = LoraAdapter("model", {"path": str(root / "stores/model")})
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        adapter.content_key = tomb.secret.content_key
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(ref)) if a.store == "model"]
    material = adapter.model_material(arts)
    examples = [{"id": a.artifact_id, "text": material[a.artifact_id]["text"], "canary": material[a.artifact_id]["canary"]}
                for a in arts]
    assert sum(e["canary"] is not None for e in examples) == 1
    seed = mv.seed_for("model", *sorted(a.artifact_id for a in arts))
    served = mv.measure(adapter.model_target(), examples, [shard], seed)
    assert served["separates"], mv.summary(served)
    evidence = adapter.suppress(arts)
    assert evidence["shards_hidden"] == [shard] and shard not in evidence["serving"]
    hidden = mv.measure(adapter.model_target(), examples, [shard], seed)
    assert hidden["views"]["served"] == hidden["views"]["suppressed_null"]
    assert not hidden["separates"], mv.summary(hidden)
    assert all(r.passed for r in adapter.probe_logical(arts).values())
    assert not any(r.passed for r in adapter.probe_physical(arts).values())  # ids and weights still stored
    assert registry(root)["shards"][shard]["sha256"] == weights["sha256"]  # reversible: nothing retrained
    assert (root / "stores/model" / weights["file"]).exists()


def test_dropping_ids_from_the_training_list_without_retraining_is_residual_at_the_model_level(template: Path, tmp_path: Path) -> None:
    """The control: the registry forgets the examples but the weights keep them. The byte-level probes pass
    (the ids are nowhere); the model probe still separates the subject."""
    root = copy(template, tmp_path / "deploy")
    ref = S.subject_ref(2)
    adapter = LoraAdapter("model", {"path": str(root / "stores/model")})
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(ref)) if a.store == "model"]
        adapter.native_delete(arts)
        receipt, _ = tomb.erase(ref)
    for entry in model_artifacts(receipt):
        assert probe(entry, "physical")["passed"] is True
        assert entry["status"] == "RESIDUAL" and entry["level"] == "model"
        assert "still serves the weights it had before the erasure" in entry["measurement"]


def test_kill_inside_the_shard_retrain_then_resume_matches_a_clean_erasure(template: Path, erased: dict,
                                                                          tmp_path: Path) -> None:
    root = copy(template, tmp_path / "deploy")
    config = str(root / "tombstone.toml")
    killed = crash.cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": "reclaim:lora:mid-training"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert registry(root)["shards"][erased["shard"]]["sha256"] == erased["old_entry"]["sha256"]  # mid-retrain
    resumed = crash.cli("resume", "--config", config)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert crash.statuses(root) == erased["statuses"]
    assert crash.same_survivors(crash.survivors(root), erased["survivors"])


def test_an_unsharded_adapter_is_residual_by_construction(tmp_path: Path) -> None:
    root = tmp_path / "deploy"
    small = ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "base_steps": 60, "steps": 40, "unlearn_steps": 10})
    S.build_deployment(root, subjects=5, shards=1, holdout_subjects=1, config=small, base_texts=100)
    old = registry(root)["shards"]["all"]
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
    entries = model_artifacts(receipt)
    assert entries and all(e["status"] == "RESIDUAL" and e["level"] == "model" for e in entries)
    assert all("unsharded adapter: approximate unlearning is RESIDUAL-prone by construction" in e["measurement"]
               for e in entries)
    assert all(e["evidence"]["suppression"]["evidence"]["hidden"] is False for e in entries)
    assert all(probe(e, "logical")["passed"] and probe(e, "physical")["passed"] for e in entries)
    rec = entries[0]["evidence"]["reclaim"]["evidence"]["retrained"]["all"]
    assert rec["trained"]["mode"] == "continued" and rec["weights_changed"]
    assert not (root / "stores/model" / old["file"]).exists()


# -- too few samples for a statistic, and failures inside the model stage ---------------------------------

FEW = {"subjects": 6, "examples": (1, 8, 8, 8, 8, 1), "shards": 2, "holdout_subjects": 2, "canary": False,
       "base_texts": 100}
ONE = S.subject_ref(0)  # trained on one example
EIGHT = S.subject_ref(1)  # trained on eight
HELD_EIGHT = S.subject_ref(4)  # held out, eight examples (the other held-out subject has one)


def small_config() -> ModelConfig:
    return ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "base_steps": 60, "steps": 40, "unlearn_steps": 10})


@pytest.fixture(scope="module")
def few(tmp_path_factory) -> Path:
    """Six people without canaries: the first trained on one example; two held out, of eight and one examples."""
    root = tmp_path_factory.mktemp("few") / "template"
    S.build_deployment(root, config=small_config(), **FEW)
    return root


def receipt_of(root: Path, ref: str, n: int = 1) -> dict:
    return json.loads((root / "receipts" / (f"{ref}.json" if n == 1 else f"{ref}.{n}.json")).read_text())


def assert_rests_on_the_levels_below(receipt: dict, why: str) -> None:
    """Every artifact VERIFIED(physical) with its logical and physical probes passed; the model level not run,
    saying ``why``."""
    assert receipt["artifacts"] and {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    assert all(probe(a, "logical")["passed"] and probe(a, "physical")["passed"] for a in receipt["artifacts"])
    for entry in model_artifacts(receipt):
        model = probe(entry, "model")
        assert model["ran"] is False and why in model["detail"]["why"], model["detail"]["why"]
        assert "\n" not in model["detail"]["why"]


def test_a_subject_of_one_example_cannot_tell_and_the_erasure_ends_in_a_receipt(few: Path, tmp_path: Path) -> None:
    root = copy(few, tmp_path / "deploy")
    config = str(root / "tombstone.toml")
    done = crash.cli("erase", ONE, "--config", config)
    assert done.returncode == 0, done.stderr[-2000:]  # 0: every artifact VERIFIED (physical), nothing to act on
    assert "Traceback" not in done.stdout + done.stderr
    receipt = receipt_of(root, ONE)
    assert_rests_on_the_levels_below(receipt, "cannot tell: 1 example")
    detail = probe(model_artifacts(receipt)[0], "model")["detail"]
    before = detail["before_suppression"]
    assert before["examples"] == 1 and before["held_out_examples"] == 9
    assert before["outcome"] == "cannot tell" and before["loss"]["ci"] is None
    assert before["loss"]["why"].startswith("cannot tell: 1 example")
    assert before["loss"]["tpr_at_fpr"]["lowest_fpr"] == pytest.approx(1 / 9, abs=1e-4)
    # nothing is left for resume, and erasing the subject again works
    resumed = crash.cli("resume", "--config", config)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = crash.cli("erase", ONE, "--config", config)
    assert again.returncode == 0 and "Traceback" not in again.stdout + again.stderr, again.stderr[-2000:]
    assert {a["status"] for a in receipt_of(root, ONE, 2)["artifacts"]} == {"VERIFIED"}


def test_a_held_out_pool_of_one_cannot_tell_and_the_erasure_ends_in_a_receipt(few: Path, tmp_path: Path) -> None:
    root = copy(few, tmp_path / "deploy")
    config = str(root / "tombstone.toml")
    adapter = LoraAdapter("model", {"path": str(root / "stores/model")})
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(EIGHT)) if a.store == "model"]
        material = adapter.model_material(arts)
        examples = [{"id": a.artifact_id, "text": material[a.artifact_id]["text"], "canary": None} for a in arts]
        seed = mv.seed_for("model", *sorted(a.artifact_id for a in arts))
        # the control: against the whole pool (nine held-out examples) the measurement can tell
        full = mv.measure(adapter.model_target(), examples, [shard_of(root, EIGHT)], seed, with_owners=True)
        assert full["held_out_examples"] == 9 and full["outcome"] != "cannot tell", mv.summary(full)
        assert full["loss"]["detectable_auc"] is not None and full["loss"]["ci"] is not None
        # erasing the held-out subject of eight leaves a pool of one
        tomb.erase(HELD_EIGHT)
    assert [len(g) for g in registry(root)["holdout"] if g] == [1]
    done = crash.cli("erase", EIGHT, "--config", config)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    receipt = receipt_of(root, EIGHT)
    assert_rests_on_the_levels_below(receipt, "cannot tell: 1 held-out example")
    assert len(model_artifacts(receipt)) == 8
    again = crash.cli("erase", EIGHT, "--config", config)
    assert again.returncode == 0, again.stderr[-2000:]


def test_a_saga_stuck_in_the_model_snapshot_resumes_and_a_broken_decision_is_that_levels_not_run(
        few: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy(few, tmp_path / "deploy")
    config = str(root / "tombstone.toml")
    ref = S.subject_ref(2)

    def stuck(*args, **kwargs):  # what the bootstrap used to raise out of the snapshot
        raise ValueError("each sample in `data` must contain two or more observations along `axis`.")

    with monkeypatch.context() as patch:
        patch.setattr(mv, "snapshot", stuck)
        with Tombstone(load_config(root / "tombstone.toml")) as tomb, pytest.raises(ValueError):
            tomb.erase(ref)
    assert not (root / "receipts" / f"{ref}.json").exists()
    # resumed: the snapshot measures; the measurement after the reclaim breaks inside the model stage
    real, calls = mv.measure, []

    def breaks_after_reclaim(*args, **kwargs):
        calls.append(kwargs.get("with_owners", False))
        if not kwargs.get("with_owners"):
            raise FloatingPointError("overflow in the ensemble\nand a second line")
        return real(*args, **kwargs)

    monkeypatch.setattr(mv, "measure", breaks_after_reclaim)
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        [(receipt, _)] = tomb.resume()
    monkeypatch.undo()
    assert calls == [True, False]  # the control: the snapshot measured; only the measurement after the reclaim broke
    assert_rests_on_the_levels_below(receipt, "the model probe after the reclaim failed: FloatingPointError: overflow"
                                              " in the ensemble")
    assert receipt_of(root, ref)["artifacts"] == receipt["artifacts"]
    again = crash.cli("erase", ref, "--config", config)
    assert again.returncode == 0 and "Traceback" not in again.stdout + again.stderr, again.stderr[-2000:]
