"""The model level's statistics and decisions (``tombstone.verify.model``) on a stand-in model whose memory
is known, and the lineage a model backend records (a training run's third-party copies taken over).
The real model, trained here, is in tests/adapters/test_lora.py."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from tombstone.lineage.records import THIRD_PARTY_STORE, ArtifactRecord
from tombstone.verify import model as mv
from tombstone.verify.levels import Level, decide, Findings, StatusKind
from tombstone.verify.result import NotRun, ProbeResult
from tombstone.verify.runner import VerifyContext


class Remembers:
    """A stand-in model: shard ``s`` remembers the texts in ``memory[s]`` (log-probability -0.05 a byte, and
    its canary secrets), everything else scores -2 +- noise per byte, the same under every view."""

    def __init__(self, memory: dict[str, list[str]], holdout: list[list[str]], *, sharded: bool = True,
                 serving: list[str] | None = None) -> None:
        self.memory = memory
        self.sharded = sharded
        self._serving = serving if serving is not None else sorted(memory)
        self._holdout = holdout

    def serving(self) -> list[str]:
        return list(self._serving)

    def weights(self) -> dict[str, str]:
        return {s: hashlib.sha256(s.encode()).hexdigest() for s in self.memory}

    def _lp(self, text: str, view) -> np.ndarray:
        rng = np.random.default_rng(int(hashlib.sha256(text.encode()).hexdigest()[:8], 16))
        lp = -2.0 + 0.3 * rng.standard_normal(len(text.encode()) + 1)
        for shard in view:
            for known in self.memory.get(shard, []):
                if known.startswith(text) or text.startswith(known):
                    lp[: len(known.encode())] = -0.05
        return lp

    def token_logprobs(self, texts, views):
        return {name: [self._lp(t, view) for t in texts] for name, view in views.items()}

    def greedy(self, prefixes, n_bytes, view):
        out = []
        for p in prefixes:
            hit = [k for s in view for k in self.memory.get(s, []) if k.startswith(p) and len(k) > len(p)]
            out.append(hit[0][len(p): len(p) + n_bytes] if hit and len(view) == 1 else "")
        return out

    def holdout(self):
        return self._holdout


def texts_of(who: str, n: int = 8) -> list[str]:
    return [f"{who} wrote note {i} about order {1000 + 37 * i + len(who)} and the parcel" for i in range(n)]


SECRET = "482913"
CANARY_TEXT = f"The account PIN of Alice Moreau is {SECRET}."


def alice() -> list[dict]:
    examples = [{"id": f"s1:ex-{i}", "text": t, "canary": None} for i, t in enumerate(texts_of("Alice Moreau"))]
    examples.append({"id": "s1:ex-canary", "text": CANARY_TEXT,
                     "canary": {"offset": CANARY_TEXT.index(SECRET), "length": 6, "alphabet": "0123456789"}})
    return examples


def target(**kw) -> Remembers:
    memory = {"s1": [e["text"] for e in alice()] + texts_of("Bo Lind"), "s2": texts_of("Cy Novak"),
              "s3": texts_of("Di Rossi")}
    holdout = [texts_of("Ed Quinn"), texts_of("Flo Sato"), texts_of("Gus Bauer")]
    return Remembers(memory, holdout, **kw)


def test_auc_is_mann_whitney_u_over_the_sizes_and_its_interval_is_reproducible() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(1, 1, 9), rng.normal(0, 1, 30)
    assert mv.auc(a, b) == pytest.approx(mannwhitneyu(a, b).statistic / (9 * 30))
    point, low, high = mv.auc_ci(a, b, seed=11)
    assert low <= point <= high and 0 <= low < high <= 1
    assert mv.auc_ci(a, b, seed=11) == (point, low, high)
    assert mv.exposure(1, 1000) == pytest.approx(math.log2(1000)) and mv.exposure(1000, 1000) == 0
    assert mv.min_k_score(np.array([-5.0, -1, -1, -1, -1, -1, -1, -1, -1, -1])) == -3.0  # lowest 20%: -5, -1


def test_the_probe_separates_a_remembered_subject_and_not_under_the_suppressed_null() -> None:
    before = mv.measure(target(), alice(), ["s1"], seed=5, with_owners=True)
    assert before["views"] == {"served": ["s1", "s2", "s3"], "suppressed_null": ["s2", "s3"]}
    assert before["separates"]
    assert before["loss"]["ci"][0] > max(before["loss"]["null_suppressed"], before["loss"]["null_heldout"])
    assert before["canaries"]["s1:ex-canary"]["rank"] == 1
    # the suppressed ensemble never saw her: it is the null, and the served model without s1 matches it
    hidden = mv.measure(target(serving=["s2", "s3"]), alice(), ["s1"], seed=5)
    assert not hidden["separates"]
    assert hidden["canaries"]["s1:ex-canary"]["rank"] > 10
    again = mv.measure(target(), alice(), ["s1"], seed=5, with_owners=True)
    assert {**again, "seconds": 0} == {**before, "seconds": 0}  # same seed, same measurement



class LikesOnes(Remembers):
    """A model that never saw any secret but learned that digits are not uniform: every ``1`` in a string gains
    0.6 nats under every view; each view adds its own small noise (the shards differ)."""

    def _lp(self, text: str, view) -> np.ndarray:
        lp = super()._lp(text, view)
        jitter = np.random.default_rng(int(hashlib.sha256(f"{text}|{view}".encode()).hexdigest()[:8], 16))
        lp = lp + 0.05 * jitter.standard_normal(lp.shape)
        digits = text.rsplit(" ", 1)[-1]
        if digits.isdigit():
            at = len(text.encode()) - len(digits)
            lp[at : at + len(digits)] += np.array([0.6 if ch == "1" else 0.0 for ch in digits])
        return lp


def test_a_secret_the_model_merely_finds_likely_is_not_separated_its_gain_over_the_null_must_top_too() -> None:
    """A fixed secret's rank is not uniform under a model that never saw it: secrets rich in a digit the model
    likes rank near the top under every view, served or suppressed. The decision also asks the secret's gain
    over the suppressed ensemble to rank at the top, which such a model gives no secret."""
    rng = np.random.default_rng(17)
    raw_top, separated = 0, 0
    for n in range(60):
        secret = "".join("1" if rng.random() < 0.6 else str(rng.integers(0, 10)) for _ in range(6))
        text = f"The account PIN of Alice Moreau is {secret}"
        example = [{"id": "s1:ex-canary", "text": text,
                    "canary": {"offset": text.index(secret), "length": 6, "alphabet": "0123456789"}}]
        m = LikesOnes({"s1": [], "s2": [], "s3": []}, [], serving=["s1", "s2", "s3"])
        c = mv.measure(m, example, ["s1"], seed=n)["canaries"]["s1:ex-canary"]
        # what the secret's own rank would call memorised: in the top 1% and above both nulls' exposure
        raw_top += c["rank"] <= 10 and c["exposure"] > max(c["null_suppressed"]["exposure"],
                                                           c["null_heldout"]["exposure"])
        separated += c["separates"]
    assert raw_top >= 4
    assert separated <= 2
    # the control: the same model remembering the secret in s1 is separated by its gain
    remembered = {"s1": [CANARY_TEXT], "s2": [], "s3": []}
    c = mv.measure(LikesOnes(remembered, [], serving=["s1", "s2", "s3"]), alice()[-1:], ["s1"],
                   seed=1)["canaries"]["s1:ex-canary"]
    assert c["separates"] and c["gain"]["rank"] == 1

def meta(before: dict, **kw) -> dict:
    return {"kind": "trained", "outcome": "measured", "shards": ["s1"], "weights": {"s1": "old"},
            "canary": None, "sharded": True, "before": before, **kw}


ART = ArtifactRecord(store="model", artifact_id="s1:ex-0", backend="lora", kind="model_example", subject_key="k")


def test_outcomes_pass_residual_blind_unsharded_and_unchanged_weights() -> None:
    before = mv.measure(target(), alice(), ["s1"], seed=5, with_owners=True)
    forgotten = mv.measure(target(serving=["s2", "s3"]), alice(), ["s1"], seed=5)
    remembered = mv.measure(target(), alice(), ["s1"], seed=5)
    new = {"s1": "new"}
    ok = mv._outcome(ART, meta(before), forgotten, True, new)
    assert isinstance(ok, ProbeResult) and ok.passed and mv.CITATION in ok.evidence["limit"]
    kept = mv._outcome(ART, meta(before), remembered, True, new)
    assert not kept.passed and "still separate" in kept.measurement
    blind = mv._outcome(ART, meta(forgotten), forgotten, True, new)
    assert isinstance(blind, NotRun) and blind.why.startswith("blind")
    unsharded = mv._outcome(ART, meta(before), forgotten, False, new)
    assert not unsharded.passed and "unsharded" in unsharded.measurement
    stale = mv._outcome(ART, meta(before), forgotten | {"views": {"served": ["s1", "s2"]}}, True, {"s1": "old"})
    assert not stale.passed and "s1 still serves the weights it had before" in stale.measurement
    # the lattice: RESIDUAL(model) after logical and physical passes; a blind probe leaves VERIFIED(physical)
    passed = {Level.LOGICAL: ProbeResult(Level.LOGICAL, True), Level.PHYSICAL: ProbeResult(Level.PHYSICAL, True)}
    assert str(decide(Findings("a", suppressed=True, probes={**passed, Level.MODEL: kept}))).startswith("RESIDUAL(model")
    assert str(decide(Findings("a", suppressed=True, probes={**passed, Level.MODEL: ok}))) == "VERIFIED(model)"
    assert str(decide(Findings("a", suppressed=True, probes={**passed, Level.MODEL: blind}))) == "VERIFIED(physical)"


def test_stage_without_snapshots_or_for_held_out_examples_does_not_run() -> None:
    class Adapter:
        store = "model"

    held = ArtifactRecord(store="model", artifact_id="holdout:ex-9", backend="lora", kind="model_holdout")
    out = mv.STAGE.run(VerifyContext(), Adapter(), [ART, held])
    assert all(isinstance(o, NotRun) and o.why == mv.NO_SNAPSHOT_HERE for o in out.outcomes.values())
    ctx = VerifyContext(model_snapshots=lambda store, ids: {"holdout:ex-9": ({"kind": "holdout"}, None)})
    out = mv.STAGE.run(ctx, Adapter(), [ART, held])
    assert out.outcomes["s1:ex-0"].why == mv.NO_SNAPSHOT
    assert out.outcomes["holdout:ex-9"].ceiling and "never trained" in out.outcomes["holdout:ex-9"].why


def test_a_model_backend_takes_over_a_training_runs_third_party_copies(tomb) -> None:
    from tombstone_adapters.dataset import DatasetStore

    docs_ids = [f"doc-alice-{i}" for i in range(3)]
    tomb.lineage.record_artifacts("alice", [ArtifactRecord(store="docs", artifact_id=d, backend="docstore",
                                                          kind="document") for d in docs_ids])
    from tombstone.config import StoreConfig

    # the training data's store is part of the deployment (a write to a store it does not list is refused)
    tomb.config.stores["train"] = StoreConfig("train", "dataset", {"path": str(tomb.config.root / "stores/train")})
    train = DatasetStore(tomb.config.root / "stores/train", lineage=tomb.lineage, store="train")
    train.add([f"ex-alice-{i}" for i in range(3)], [f"text {i}" for i in range(3)], subject="alice",
              sources=[("docs", d) for d in docs_ids])
    assert train.record_training_run(train.current_version(), "ft-1") == 3
    key = tomb.lineage.subject_key("alice")
    assert sum(a.store == THIRD_PARTY_STORE for a, _ in tomb.lineage.closure(key)) == 3
    derived = [("train", f"ex-alice-{i}", ArtifactRecord(store="model", artifact_id=f"shard-00:ex-alice-{i}",
                                                          backend="lora", kind="model_example")) for i in range(2)]
    derived.append(("train", "ex-unknown", ArtifactRecord(store="model", artifact_id="shard-00:ex-unknown",
                                                          backend="lora", kind="model_example")))
    recorded, replaced = tomb.lineage.record_derived_artifacts(derived, relation="trained_into",
                                                               replacing="training run ft-1")
    assert replaced == 2 and [a.artifact_id for a in recorded] == ["shard-00:ex-alice-0", "shard-00:ex-alice-1"]
    scope = {(a.store, a.artifact_id): why for a, why in tomb.lineage.closure(key)}
    assert {("model", "shard-00:ex-alice-0"), ("model", "shard-00:ex-alice-1")} <= set(scope)
    assert tomb.lineage.edges_of(recorded[1])["sources"] == [("train", "ex-alice-1", "trained_into")]
    # the example the model did not take keeps its third-party copy (a person must still follow it up)
    assert [aid for store, aid in scope if store == THIRD_PARTY_STORE] == ["training run ft-1:train/ex-alice-2"]
    assert all(a.subject_key == key for a in recorded)
