"""The model level's statistics and decisions (``tombstone.verify.model``) on a stand-in model whose memory
is known, and the lineage a model backend records (a training run's third-party copies taken over).
The real model, trained here, is in tests/adapters/test_lora.py."""

from __future__ import annotations

import hashlib
import math
from itertools import combinations

import numpy as np
import pytest
from scipy.special import comb
from scipy.stats import mannwhitneyu

from tombstone.errors import DeadLetterError, StoreUnavailableError
from tombstone.lineage.records import THIRD_PARTY_STORE, ArtifactRecord
from tombstone.verify import model as mv
from tombstone.verify import model_stats as ms
from tombstone.verify.levels import Findings, Level, decide
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


# -- what the samples can tell: power, TPR at a low FPR, cannot tell -------------------------------------

def exact_u_null(n: int, m: int) -> np.ndarray:
    """Every ranking of n members among n + m scores (the Mann-Whitney null: all equally likely), its U."""
    us = []
    for members in combinations(range(n + m), n):
        at = set(members)
        # U: for each member, the others ranked below it
        us.append(sum(sum(1 for j in range(r) if j not in at) for r in members))
    return np.array(us)


def test_the_best_p_value_and_the_detectable_auc_follow_the_exact_mann_whitney_null() -> None:
    for n, m in ((1, 9), (2, 7), (2, 8), (3, 6), (4, 5)):
        # the best one-sided p-value: every member above every other (AUC 1), scipy's exact test and 1 / C(n+m, n)
        best = mannwhitneyu(np.arange(m, m + n) + 0.5, np.arange(m), alternative="greater", method="exact").pvalue
        assert ms.best_pvalue(n, m) == pytest.approx(best) == pytest.approx(1 / comb(n + m, n))
        # the smallest U whose p <= alpha, from the null enumerated here with numpy
        us = exact_u_null(n, m)
        tail = np.array([np.mean(us >= u) for u in range(n * m + 1)])
        reach = np.flatnonzero(tail <= ms.ALPHA)
        expected = reach[0] / (n * m) if reach.size else None
        assert ms.detectable_auc(n, m) == expected
    # at larger sizes the exact answer sits by the normal approximation's
    from scipy.stats import norm

    for n, m in ((8, 32), (20, 60)):
        approx = 0.5 + norm.ppf(1 - ms.ALPHA) * math.sqrt((n + m + 1) / (12 * n * m))
        assert ms.detectable_auc(n, m) == pytest.approx(approx, abs=0.02)
    assert ms.detectable_auc(8, 32) < ms.detectable_auc(8, 8) < ms.detectable_auc(3, 8) <= 1


def test_cannot_tell_says_which_sample_is_too_small_and_the_threshold_comes_from_the_null() -> None:
    assert ms.cannot_tell(1, 30).startswith("cannot tell: 1 example (")
    assert ms.cannot_tell(8, 1).startswith("cannot tell: 1 held-out example (")
    assert ms.cannot_tell(0, 8) == "cannot tell: no examples"
    assert ms.cannot_tell(8, 0).startswith("cannot tell: no held-out examples")
    assert ms.cannot_tell(8, 32) is None
    # two examples: the smallest held-out pool at which an AUC of 1 reaches the alpha, from 1 / C(m + 2, 2)
    first = next(m for m in range(2, 100) if 1 / comb(m + 2, 2) <= ms.ALPHA)
    assert ms.cannot_tell(2, first) is None
    assert "even an AUC of 1 has an exact Mann-Whitney p-value" in ms.cannot_tell(2, first - 1)
    with pytest.raises(ValueError, match="at least 2 observations"):
        ms.auc_ci([0.3], [0.1, 0.2], seed=1)


def test_tpr_at_a_low_fpr_on_known_scores() -> None:
    others = np.arange(100, dtype=float)  # 100 held-out scores: 5% of them are above 94
    members = np.array([10.0, 94.0, 95.0, 96.5, 200.0])
    r = ms.tpr_at_fpr(members, others)
    assert r == {"fpr": 0.05, "tpr": 0.6, "fpr_reached": 0.05, "lowest_fpr": 0.01}  # 95, 96.5, 200; 94 ties
    assert np.mean(others > 94) == 0.05 and np.mean(members > 94) == 0.6
    # ten held-out scores: the lowest non-zero FPR is 10%, so the rate is at FPR 0, above their maximum
    few = ms.tpr_at_fpr([9.5, 8.5, 20.0], np.arange(10.0))
    assert few == {"fpr": 0.05, "tpr": pytest.approx(2 / 3), "fpr_reached": 0.0, "lowest_fpr": 0.1}
    assert ms.tpr_at_fpr([1.0], []) ["tpr"] is None


def test_control_separated_and_not_separated_scores_are_told_apart_by_auc_power_and_tpr() -> None:
    rng = np.random.default_rng(5)
    others = rng.normal(0, 1, 40)
    member_like = rng.normal(3, 1, 12)  # trained: scored far above
    other_like = np.quantile(others, np.linspace(0.04, 0.96, 12))  # never trained: spread like the others
    bar = ms.detectable_auc(12, 40)
    sep = ms.auc(member_like, others)
    same = ms.auc(other_like, others)
    assert sep > bar > same
    assert ms.auc_ci(member_like, others, 1)[1] > 0.5 and ms.auc_ci(other_like, others, 1)[1] < 0.5
    p_sep = mannwhitneyu(member_like, others, alternative="greater", method="exact").pvalue
    p_same = mannwhitneyu(other_like, others, alternative="greater", method="exact").pvalue
    assert p_sep <= ms.ALPHA < p_same
    assert ms.tpr_at_fpr(member_like, others)["tpr"] >= 0.75 > ms.tpr_at_fpr(other_like, others)["tpr"]


def test_a_subject_of_one_example_or_a_pool_of_one_cannot_tell_and_the_level_does_not_run() -> None:
    one = alice()[:1]
    m = mv.measure(target(), one, ["s1"], seed=5, with_owners=True)
    assert m["outcome"] == mv.CANNOT_TELL and not m["separates"] and not m["measured"]
    assert m["loss"]["outcome"] == m["min_k"]["outcome"] == mv.CANNOT_TELL and m["loss"]["ci"] is None
    assert m["cannot_tell"] == [f"membership inference: {ms.cannot_tell(1, 24)}"]
    assert "cannot tell: 1 example" in mv.summary(m)
    pool_of_one = target()
    pool_of_one._holdout = [texts_of("Ed Quinn", 1)]
    p = mv.measure(pool_of_one, alice()[:-1], ["s1"], seed=5, with_owners=True)
    assert p["outcome"] == mv.CANNOT_TELL and "cannot tell: 1 held-out example" in p["cannot_tell"][0]
    no_pool = target()
    no_pool._holdout = []
    assert mv.measure(no_pool, alice()[:-1], ["s1"], seed=5)["membership"].startswith("not run: cannot tell: no held")
    # the control: the same subject with all her examples and the whole pool is told, with power and TPR
    full = mv.measure(target(), alice(), ["s1"], seed=5, with_owners=True)
    assert full["outcome"] == mv.SEPARATED and "cannot_tell" not in full
    assert full["loss"]["detectable_auc"] == pytest.approx(ms.detectable_auc(9, 24), abs=1e-4) and full["loss"]["tpr_at_fpr"]["tpr"] == 1.0
    assert "TPR 1.00 at FPR 5%" in mv.summary(full) and "detectable from AUC" in mv.summary(full)
    # the lattice: a level that cannot tell never makes anything VERIFIED(model); the status rests below
    out = mv._outcome(ART, meta(m), mv.measure(target(serving=["s2", "s3"]), one, ["s1"], seed=5), True, {"s1": "new"})
    assert isinstance(out, NotRun) and out.why.startswith("membership inference: cannot tell: 1 example")
    passed = {Level.LOGICAL: ProbeResult(Level.LOGICAL, True), Level.PHYSICAL: ProbeResult(Level.PHYSICAL, True)}
    assert str(decide(Findings("a", suppressed=True, probes={**passed, Level.MODEL: out}))) == "VERIFIED(physical)"
    # a separation found afterwards is still RESIDUAL, whatever could not tell
    kept = mv._outcome(ART, meta(full), mv.measure(target(), alice(), ["s1"], seed=5), True, {"s1": "new"})
    assert not kept.passed


def test_a_canary_tells_when_the_membership_auc_cannot() -> None:
    canary = alice()[-1:]  # one example: its canary
    before = mv.measure(target(), canary, ["s1"], seed=5, with_owners=True)
    assert before["loss"]["outcome"] == mv.CANNOT_TELL and before["outcome"] == mv.SEPARATED
    after = mv.measure(target(serving=["s2", "s3"]), canary, ["s1"], seed=5)
    assert after["outcome"] == mv.NOT_SEPARATED
    ok = mv._outcome(ART, meta(before), after, True, {"s1": "new"})
    assert isinstance(ok, ProbeResult) and ok.passed
    # the control the pass rests on must be told after: a canary that cannot tell then decides nothing
    unsure = {**after, "canaries": {k: {**c, "outcome": mv.CANNOT_TELL} for k, c in after["canaries"].items()},
              "outcome": mv.CANNOT_TELL, "cannot_tell": ["canary: cannot tell: 8 other candidates"]}
    out = mv._outcome(ART, meta(before), unsure, True, {"s1": "new"})
    assert isinstance(out, NotRun) and out.why.startswith("canary: cannot tell")
    # a secret of one digit has nine candidates: its rank can never reach p <= 0.01
    short = [{"id": "s1:ex-short", "text": "The door code of Alice Moreau is 7",
              "canary": {"offset": 33, "length": 1, "alphabet": "0123456789"}}]
    c = mv.measure(target(), short, ["s1"], seed=5, with_owners=True)  # the model does not know the text
    assert c["canaries"]["s1:ex-short"]["of"] == 9  # the secret and 8 others; a 9th, the fresh null, is apart
    assert c["canaries"]["s1:ex-short"]["outcome"] == mv.CANNOT_TELL and c["outcome"] == mv.CANNOT_TELL
    assert c["cannot_tell"][-1] == ("canary s1:ex-short: cannot tell: 8 other candidates of its form (rank p-value"
                                    " at best 0.111, above 0.01)")


class Breaks(Remembers):
    """The stand-in model, whose log-probabilities raise ``error`` once ``armed``."""

    armed = False
    error: BaseException = ValueError("each sample in `data` must contain two or more observations\nsecond line")

    def token_logprobs(self, texts, views):
        if Breaks.armed:
            raise Breaks.error
        return super().token_logprobs(texts, views)


class FakeAdapter:
    store = "model"

    def __init__(self, model: Remembers) -> None:
        self.model = model

    def model_target(self):
        return self.model

    def store_lock(self):
        import contextlib

        return contextlib.nullcontext()

    def model_material(self, arts):
        texts = {e["id"]: e for e in alice()}
        return {a.artifact_id: {"kind": "trained", "shards": ["s1"], "weights": {"s1": "old"},
                                "text": texts[a.artifact_id]["text"], "canary": texts[a.artifact_id]["canary"]}
                for a in arts}


class Lineage:
    def __init__(self) -> None:
        self.saved: dict[str, tuple] = {}

    def suppressed_pairs(self, artifacts) -> set:
        return set()

    def save_model_snapshots(self, saga_id, store, rows) -> None:
        self.saved.update(rows)

    def model_snapshots(self, store, ids):
        return {aid: self.saved[aid] for aid in ids if aid in self.saved}


def memory_target(cls=Breaks) -> Remembers:
    t = target()
    return cls(t.memory, t._holdout)


def test_a_failure_inside_the_model_stage_is_that_levels_not_run_and_store_errors_still_propagate() -> None:
    arts = [ArtifactRecord(store="model", artifact_id=e["id"], backend="lora", kind="model_example", subject_key="k")
            for e in alice()]
    lineage = Lineage()
    Breaks.armed = True
    try:
        detail = mv.snapshot(FakeAdapter(memory_target()), arts, lineage, {})
    finally:
        Breaks.armed = False
    assert {a["outcome"] for a in detail["artifacts"].values()} == {"failed"}
    why = lineage.saved["s1:ex-0"][0]["why"]
    assert why == ("the measurement before suppression failed: ValueError: each sample in `data` must contain two"
                   " or more observations")  # one line
    ctx = VerifyContext(model_snapshots=lineage.model_snapshots)
    out = mv.STAGE.run(ctx, FakeAdapter(memory_target()), arts)
    assert all(isinstance(o, NotRun) and o.why == why for o in out.outcomes.values())
    # the control: the same snapshot with nothing broken measures, and the stage decides
    detail = mv.snapshot(FakeAdapter(memory_target()), arts, lineage, {})
    assert {a["outcome"] for a in detail["artifacts"].values()} == {"measured"}
    fine = mv.STAGE.run(ctx, FakeAdapter(memory_target()), arts)
    assert all(not o.passed for o in fine.outcomes.values())  # s1 still serves the old weights: RESIDUAL
    # the decision after the reclaim breaks: not run, one line
    Breaks.armed = True
    try:
        broke = mv.STAGE.run(ctx, FakeAdapter(memory_target()), arts)
        assert all(isinstance(o, NotRun) and o.why.startswith("the model probe after the reclaim failed: ValueError")
                   and "\n" not in o.why for o in broke.outcomes.values())
        # a store that cannot be read is a store failure: the saga's retries and dead letters, not a not-run
        Breaks.error = OSError(5, "Input/output error")
        with pytest.raises(StoreUnavailableError, match="could not read the store"):
            mv.STAGE.run(ctx, FakeAdapter(memory_target()), arts)

        def dead(action):
            try:
                return action()
            except StoreUnavailableError as exc:
                raise DeadLetterError(str(exc), 3, store="model") from exc

        with pytest.raises(DeadLetterError):
            mv.STAGE.run(VerifyContext(call=dead, model_snapshots=lineage.model_snapshots),
                         FakeAdapter(memory_target()), arts)
    finally:
        Breaks.armed = False
        Breaks.error = ValueError("each sample in `data` must contain two or more observations\nsecond line")
