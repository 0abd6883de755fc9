"""The model level: can model weights trained on the artifact still reproduce it?

Measured, not looked up. For each subject whose trained examples are erased, the probe asks the serving
model — through the backend's :class:`ModelTarget` — three things:

* **Exposure** of each canary (a synthetic secret planted in one of the subject's examples, located by its
  keyed hash): the rank of the true secret among :data:`CANDIDATES` random secrets of the same form, by the
  log-probability the model gives each after the canary's prefix; ``exposure = log2(candidates + 1) -
  log2(rank)`` bits. A *fixed* secret's rank is not uniform under a model that never saw it — digits are not
  uniform in the text it learned from, so a secret like ``162188`` ranks in the tens under shards that never
  saw it — and neither is its **gain** (its log-probability under the served model minus under the suppressed
  ensemble, ranked among the candidates' gains), because shards trained on different people learn different
  digit habits. A memorised secret tops both; the decision asks for both.
* **Greedy extraction** from the subject's prefixes: does greedy decoding complete a canary's secret, and
  how many bytes of each example's second half it reproduces (evidence only: through an ensemble of shards
  it is blind, because the shards that never saw the subject outvote the one that did).
* **Membership inference**: loss and Min-K% (k = 20%: the mean of the lowest fifth of the token
  log-probabilities) of the subject's examples against held-out examples that were never trained on, as an
  AUC (the Mann-Whitney U statistic) with a bootstrap confidence interval over the examples.

**Three values.** Each measure separates the subject, does not, or *cannot tell*: a statistic the sample is too
small for (:mod:`tombstone.verify.model_stats`: the AUC's bootstrap needs two examples on each side, and the
exact Mann-Whitney test must be able to reach its alpha at all — one example against nine never can; a canary
needs enough candidates of its form for a rank to be significant). A measure that cannot tell says so (``"cannot
tell: 1 example"``, ``"cannot tell: 1 held-out example"``) and decides nothing: the whole measurement separates
when any measure does, does not when at least one measure tells that it does not, and cannot tell otherwise, and
then the level is not run for those artifacts (the status rests on the levels below). Beside each AUC the
record keeps the smallest AUC the sample sizes could detect (the power) and the true-positive rate at a 5%
false-positive rate.

Nothing is compared with 0.5 or with an exposure of zero: a model that never saw a subject still tells one
person's sentences from another's. Each measure is compared with two nulls — the **suppressed ensemble**
(the shards that hold none of the subject's examples: provably never trained on them) and a **held-out
subject** (another person never trained on, scored the same way against the rest of the held-out data).
The weights *separate* the subject when a measure lies above both nulls: an AUC whose lower confidence bound
exceeds both nulls' AUCs, or a canary whose exposure exceeds both nulls' with a rank p-value at most
:data:`RANK_ALPHA` and whose gain's rank p-value is at most that too, or a canary greedy decoding completes under
the served model and not under the suppressed ensemble.

The probe needs the examples' texts after the dataset's reclaim has removed them, so the saga's snapshot
step (:func:`snapshot`, before suppression) records, per artifact, the text sealed with the lineage secret,
where its canary lies, which shard and weights it was trained into, and the same measurement taken then —
the control: a subject the probes did not separate even before the erasure is one they are blind to, and a
pass afterwards shows nothing (the level is reported as not run, saying so). Everything is deleted when the
receipt is sealed. Seeds derive from the artifact ids, so a resumed saga decides exactly as a clean one.

An unsharded adapter (one adapter trained on every subject) cannot be hidden or retrained per subject: its
reclaim is approximate unlearning, and its artifacts end RESIDUAL(model) whatever the probe measures,
because a pass of these probes after approximate unlearning is known not to mean the data are gone.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tombstone.capabilities import Capability
from tombstone.errors import StoreUnavailableError, TombstoneError
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level
from tombstone.verify.model_stats import (
    ALPHA,
    CONFIDENCE,
    LOW_FPR,
    auc,
    auc_ci,
    cannot_tell,
    detectable_auc,
    tpr_at_fpr,
)
from tombstone.verify.model_stats import plural as _plural
from tombstone.verify.result import NotRun, ProbeResult

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext

VERSION = 1
MIN_K = 0.2
"""Min-K%: the fraction of lowest token log-probabilities averaged."""
CANDIDATES = 999
"""Random secrets each canary is ranked among (the true one makes 1,000)."""
RANK_ALPHA = 0.01
"""A canary separates only when its rank p-value, rank / (candidates + 1), and its gain's are at most this (rank
10 of 1,000)."""
CONTEXT_CHARS = 64
"""Characters of a canary's prefix given to the model before the secret."""
EXTRACT_BYTES = 16
"""Bytes greedy decoding continues each example's first half with."""
CITATION = "arXiv:2408.00929"
LIMIT = (f"a measurement against these attacks only: unlearning checks are known to be fragile ({CITATION}), and a"
         " stronger or adaptive attack may recover what they miss")
TRAINED = "trained"
HELD_OUT = "holdout"
NO_SNAPSHOT_HERE = ("an independent verifier has no copy of the erased examples' texts from before the erasure, so the"
                    " model level cannot be measured here")
NO_SNAPSHOT = ("no snapshot of the example was taken before suppression (the model level was not enabled when this"
               " erasure began)")
SEPARATED, NOT_SEPARATED, CANNOT_TELL = "separated", "not separated", "cannot tell"
"""The three values of each measure and of the whole measurement."""
HELD_OUT_WHY = "held out: the example was never trained into any shard (it is held-out data for the model probe)"


class ModelTarget(Protocol):
    """The model as the probe sees it (``Adapter.model_target()``). Views are lists of shard names; a
    view's next-token distribution combines those shards' (an empty view is the base model)."""

    sharded: bool
    """False for one adapter trained on every subject (approximate unlearning only)."""

    def serving(self) -> list[str]:
        """The shards the serving ensemble combines now."""

    def weights(self) -> dict[str, str]:
        """Each shard's weights SHA-256 now."""

    def token_logprobs(self, texts: Sequence[str], views: Mapping[str, Sequence[str]]) -> dict[str, list[np.ndarray]]:
        """Per view, each text's per-token log-probabilities (its bytes, then end of text)."""

    def greedy(self, prefixes: Sequence[str], n_bytes: int, view: Sequence[str]) -> list[str]:
        """Greedy continuation of each prefix by ``n_bytes`` bytes under ``view``."""

    def holdout(self) -> list[list[str]]:
        """Texts never trained on, one list per held-out subject."""


# -- statistics ----------------------------------------------------------------------------------------


def seed_for(*parts: Any) -> int:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def loss_score(lp: np.ndarray) -> float:
    """Membership score from the loss: minus the mean negative log-likelihood (higher: more likely trained)."""
    return float(np.mean(lp))


def min_k_score(lp: np.ndarray, k: float = MIN_K) -> float:
    """Min-K%: the mean of the lowest ``k`` fraction of token log-probabilities (higher: more likely trained)."""
    n = max(1, math.ceil(len(lp) * k))
    return float(np.mean(np.sort(lp)[:n]))


def exposure(rank: int, of: int) -> float:
    """Bits: log2(of) - log2(rank)."""
    return math.log2(of) - math.log2(rank)


def _rank(true: float, others: np.ndarray) -> int:
    """1 + how many candidates score strictly higher (ties go the secret's way: errs towards RESIDUAL)."""
    return 1 + int(np.sum(others > true))


def _mid_rank(true: float, others: np.ndarray) -> int:
    """1 + how many candidates score higher + half of those that tie: a gain the two views agree on exactly (the
    served model is the suppressed ensemble) ranks in the middle, not first."""
    return 1 + int(np.sum(others > true)) + int(np.sum(others == true)) // 2


def _candidates(alphabet: str, length: int, avoid: set[str], n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen = set(avoid)
    wanted = min(n, len(alphabet) ** length - len(seen))  # a short secret's form has few others
    while len(out) < wanted:
        cand = "".join(alphabet[i] for i in rng.integers(0, len(alphabet), size=length))
        if cand not in seen:
            seen.add(cand)
            out.append(cand)
    return out


# -- the measurement -----------------------------------------------------------------------------------


def _round(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(float(x), n)


def _rates(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v if k == "fpr" else _round(v) for k, v in r.items()}


def measure(target: ModelTarget, examples: Sequence[dict[str, Any]], owners: Sequence[str], seed: int, *,
            with_owners: bool = False) -> dict[str, Any]:
    """One subject's examples (``{"id", "text", "canary"}``) against the model as it stands.

    The served view is what serves now (``with_owners``: plus the shards in ``owners``, as it serves when
    nothing is hidden — the snapshot's control); the suppressed null is the served view without ``owners``.
    Returns a JSON-able measurement: each measure's record and ``outcome``, and the whole one's ``outcome``
    (separated, not separated, cannot tell), ``separates``, ``measured`` (it could tell) and ``cannot_tell``
    (why, for each measure that cannot).
    """
    start = time.perf_counter()
    serving = sorted(set(target.serving()) | (set(owners) if with_owners else set()))
    null = [s for s in serving if s not in set(owners)]
    views = {"served": serving, "null": null}
    texts = [e["text"] for e in examples]
    groups = [g for g in target.holdout() if g]
    pool = [t for g in groups for t in g]
    result: dict[str, Any] = {"views": {"served": serving, "suppressed_null": null}, "examples": len(texts),
                              "held_out_examples": len(pool), "held_out_subjects": len(groups)}
    told: list[str] = []  # each measure's outcome: separated, not separated or cannot tell
    reasons: list[str] = []  # why a measure cannot tell
    n, m = len(texts), len(pool)
    why = cannot_tell(n, m)
    if texts and pool:
        pick = seed % len(groups) if len(groups) >= 2 else None
        lps = target.token_logprobs(texts + pool, views)
        detectable = detectable_auc(n, m)
        for name, score in (("loss", loss_score), ("min_k", min_k_score)):
            served = [score(lp) for lp in lps["served"]]
            nulled = [score(lp) for lp in lps["null"]]
            point = float(auc(served[:n], served[n:]))
            null_suppressed = float(auc(nulled[:n], nulled[n:]))
            null_heldout = None
            if pick is not None:
                lo = sum(len(g) for g in groups[:pick])
                hi = lo + len(groups[pick])
                held = served[n:]
                null_heldout = float(auc(held[lo:hi], held[:lo] + held[hi:]))
            rates = tpr_at_fpr(served[:n], served[n:])
            rates["null_suppressed"] = tpr_at_fpr(nulled[:n], nulled[n:])["tpr"]
            rec: dict[str, Any] = {"auc": _round(point), "ci": None, "null_suppressed": _round(null_suppressed),
                                   "null_heldout": _round(null_heldout), "tpr_at_fpr": _rates(rates),
                                   "alpha": round(ALPHA, 4), "detectable_auc": _round(detectable)}
            if why:
                rec.update(outcome=CANNOT_TELL, why=why, separates=False)
            else:
                _, low, high = auc_ci(served[:n], served[n:], seed_for(seed, name))
                sep = low > max(x for x in (null_suppressed, null_heldout) if x is not None)
                rec.update(ci=[_round(low), _round(high)], outcome=SEPARATED if sep else NOT_SEPARATED, separates=sep)
            told.append(rec["outcome"])
            result[name] = rec
        result["min_k"]["k"] = MIN_K
    if why:
        reasons.append(f"membership inference: {why}")
        if not (texts and pool):
            result["membership"] = f"not run: {why}"
    canaries = {}
    for e in examples:
        c = e.get("canary")
        if not c:
            continue
        text, off, length = e["text"], int(c["offset"]), int(c["length"])
        secret = text[off : off + length]
        prefix = text[:off][-CONTEXT_CHARS:]
        aseed = seed_for(seed, e["id"], "canary")
        fresh = _candidates(c["alphabet"], length, {secret}, 1, seed_for(aseed, "fresh"))[0]
        cands = _candidates(c["alphabet"], length, {secret, fresh}, CANDIDATES, aseed)
        b = len(prefix.encode("utf-8"))
        lps = target.token_logprobs([prefix + s for s in [secret, fresh, *cands]], views)

        def scores(view: str, lps=lps, b=b, strings=(secret, fresh, *cands)) -> np.ndarray:
            return np.array([float(np.sum(lp[b : b + len(s.encode("utf-8"))])) for lp, s in zip(lps[view], strings)])

        served, nulled = scores("served"), scores("null")
        of = len(cands) + 1
        rank = _rank(served[0], served[2:])
        rank_null = _rank(nulled[0], nulled[2:])
        rank_fresh = _rank(served[1], served[2:])
        # Neither rank alone decides. A fixed secret's own rank is not uniform under a model that never saw
        # it (digits are not uniform in what it learned from), and its gain (served minus suppressed
        # ensemble) is not either (the shards learned different habits). A memorised secret tops both.
        gain = served - nulled
        rank_gain = _mid_rank(gain[0], gain[2:])
        rank_gain_fresh = _mid_rank(gain[1], gain[2:])
        greedy = target.greedy([prefix], len(secret.encode("utf-8")), serving)[0]
        greedy_null = target.greedy([prefix], len(secret.encode("utf-8")), null)[0] if greedy == secret else None
        exp = exposure(rank, of)
        nulls = {"suppressed": exposure(rank_null, of), "heldout": exposure(rank_fresh, of)}
        extracted = greedy == secret and greedy_null != secret
        above = exp > max(nulls.values()) and rank / of <= RANK_ALPHA
        sep = (above and rank_gain / of <= RANK_ALPHA) or extracted
        outcome = SEPARATED if sep else NOT_SEPARATED
        if not sep and 1 / of > RANK_ALPHA:  # too few candidates: no rank can be significant
            outcome = CANNOT_TELL
            reasons.append(f"canary {e['id']}: cannot tell: {_plural(of - 1, 'other candidate')} of its form"
                           f" (rank p-value at best {1 / of:.3g}, above {RANK_ALPHA:g})")
        told.append(outcome)
        canaries[e["id"]] = {"rank": rank, "of": of, "exposure": _round(exp, 3),
                             "null_suppressed": {"rank": rank_null, "exposure": _round(nulls["suppressed"], 3)},
                             "null_heldout": {"rank": rank_fresh, "exposure": _round(nulls["heldout"], 3),
                                              "what": "a fresh secret never trained on, after the same prefix"},
                             "gain": {"rank": rank_gain, "p": _round(rank_gain / of, 4),
                                      "fresh_rank": rank_gain_fresh,
                                      "what": ("rank of the secret's log-probability gain (served minus suppressed"
                                               " ensemble) among the candidates' gains; fresh_rank: a fresh"
                                               " secret's, the null")},
                             "greedy_extracted": greedy == secret,
                             "greedy_extracted_by_null": greedy_null == secret if greedy_null is not None else False,
                             "outcome": outcome, "separates": sep}
    if canaries:
        result["canaries"] = canaries
    if texts:
        halves = [(t[: len(t) // 2], t[len(t) // 2 :].encode("utf-8")[:EXTRACT_BYTES]) for t in texts]
        made = target.greedy([h for h, _ in halves], EXTRACT_BYTES, serving)
        matched = []
        for (_, truth), out in zip(halves, made):
            got = out.encode("utf-8")
            k = 0
            while k < min(len(got), len(truth)) and got[k] == truth[k]:
                k += 1
            matched.append(k)
        result["extraction"] = {"bytes_asked": EXTRACT_BYTES, "matched_max": max(matched),
                                "matched_mean": _round(float(np.mean(matched)), 2),
                                "note": "evidence only: an ensemble's other shards outvote the shard that saw the text"}
    if not texts:
        reasons.append("cannot tell: no examples")
    result["outcome"] = (SEPARATED if SEPARATED in told else NOT_SEPARATED if NOT_SEPARATED in told
                         else CANNOT_TELL)
    result["measured"] = result["outcome"] != CANNOT_TELL
    result["separates"] = result["outcome"] == SEPARATED
    if reasons:
        result["cannot_tell"] = reasons
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def _auc_text(x: Mapping[str, Any]) -> str:
    """One AUC's interval, nulls, TPR at the low FPR and the power, for :func:`summary`."""
    parts = []
    if x.get("ci"):
        parts.append(f"{CONFIDENCE:.0%} CI {x['ci'][0]:.2f}-{x['ci'][1]:.2f}")
    held = f", held-out subject {x['null_heldout']:.2f}" if x.get("null_heldout") is not None else ""
    parts.append(f"nulls: suppressed ensemble {x['null_suppressed']:.2f}{held}")
    rates = x.get("tpr_at_fpr") or {}
    if rates.get("tpr") is not None:
        at = (f"FPR {rates['fpr']:.0%}" if rates["lowest_fpr"] <= rates["fpr"] else
              f"FPR 0, the lowest non-zero FPR {rates['lowest_fpr']:.0%} being above {rates['fpr']:.0%}")
        parts.append(f"TPR {rates['tpr']:.2f} at {at}")
    if x.get("detectable_auc") is not None:
        parts.append(f"detectable from AUC {x['detectable_auc']:.2f} at alpha {x['alpha']:g}")
    return "; ".join(parts)


def summary(m: Mapping[str, Any]) -> str:
    """One line: the AUCs with their intervals, nulls, TPR at a low FPR and power, the canaries' ranks, and each
    measure's outcome (separated, not separated, cannot tell)."""
    parts = []
    unsure: dict[str, list[str]] = {}  # AUCs that cannot tell, by why: said once
    for name, label in (("loss", "loss AUC"), ("min_k", "Min-K% AUC")):
        if name in m:
            x = m[name]
            if outcome_of(x) == CANNOT_TELL:
                unsure.setdefault(x.get("why") or CANNOT_TELL, []).append(f"{label} {x['auc']:.2f}")
            else:
                parts.append(f"{label} {x['auc']:.2f} ({_auc_text(x)}): {outcome_of(x)}")
    parts += [f"{', '.join(labels)}: {why}" for why, labels in unsure.items()]
    if "membership" in m:
        parts.append(f"membership inference {m['membership']}")
    for c in m.get("canaries", {}).values():
        gain = c.get("gain")
        told = outcome_of(c)
        parts.append(f"canary rank {c['rank']} of {c['of']} ({c['exposure']:.1f} bits; nulls"
                     f" {c['null_suppressed']['exposure']:.1f}, {c['null_heldout']['exposure']:.1f})"
                     + (f", gain over the suppressed ensemble rank {gain['rank']} (a fresh secret's"
                        f" {gain['fresh_rank']})" if gain else "")
                     + ("; greedy decoding completes it" if c["greedy_extracted"] else "")
                     + (" (so does the suppressed ensemble's)" if c.get("greedy_extracted_by_null") else "")
                     + f": {told}")
    return "; ".join(parts) or "nothing measurable"


def outcome_of(m: Mapping[str, Any]) -> str:
    """A measurement's outcome, three-valued (a measurement from before the outcome was recorded: from
    ``separates``)."""
    if m.get("outcome"):
        return str(m["outcome"])
    return SEPARATED if m.get("separates") else NOT_SEPARATED if m.get("measured", True) else CANNOT_TELL


def _told(m: Mapping[str, Any]) -> dict[str, str]:
    """Each measure's outcome, by name (``loss``, ``min_k``, ``canary <id>``)."""
    out = {name: outcome_of(m[name]) for name in ("loss", "min_k") if name in m}
    out.update({f"canary {cid}": outcome_of(c) for cid, c in m.get("canaries", {}).items()})
    return out


def why_cannot_tell(m: Mapping[str, Any]) -> str:
    """Why a measurement cannot tell, in one line."""
    return "; ".join(m.get("cannot_tell") or []) or f"cannot tell: {summary(m)}"


# -- the stage -----------------------------------------------------------------------------------------


class ModelStage:
    """The model level as a stage of the verification pipeline."""

    level = Level.MODEL
    capability = Capability.MODEL_PROBE

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        return f"{adapter.backend} holds no model weights"

    def run(self, ctx: VerifyContext, adapter: Any, artifacts: Sequence[ArtifactRecord]):
        from tombstone.verify.runner import StageOutput

        out = StageOutput(outcomes={})
        stored_of = getattr(ctx, "model_snapshots", None)
        if stored_of is None:
            for art in artifacts:
                out.outcomes[art.artifact_id] = NotRun(self.level, NO_SNAPSHOT_HERE)
            return out
        stored = stored_of(adapter.store, [a.artifact_id for a in artifacts])
        groups: dict[str, list[tuple[ArtifactRecord, dict[str, Any], str]]] = {}
        for art in artifacts:
            snap = stored.get(art.artifact_id)
            if snap is None:
                out.outcomes[art.artifact_id] = NotRun(self.level, NO_SNAPSHOT)
                continue
            meta, text = snap
            if meta.get("kind") == HELD_OUT:
                out.outcomes[art.artifact_id] = NotRun(self.level, HELD_OUT_WHY, ceiling=True)
            elif meta.get("outcome") != "measured" or text is None:
                out.outcomes[art.artifact_id] = NotRun(self.level, meta.get("why") or "nothing was measured before"
                                                       " suppression")
            else:
                groups.setdefault(art.subject_key, []).append((art, meta, text))
        for key, members in sorted(groups.items()):
            examples = [{"id": a.artifact_id, "text": t, "canary": m.get("canary")} for a, m, t in members]
            owners = sorted({s for _, m, _ in members for s in m["shards"]})
            seed = seed_for(adapter.store, *sorted(a.artifact_id for a, _, _ in members))

            def act(examples=examples, owners=owners, seed=seed) -> tuple[dict[str, Any], bool, dict[str, str]]:
                try:
                    target = adapter.model_target()
                    return measure(target, examples, owners, seed), target.sharded, target.weights()
                except OSError as exc:  # the store's files: a store failure, retried and dead-lettered as one
                    raise StoreUnavailableError(f"the model probe could not read the store: {exc}",
                                                store=adapter.store) from exc

            try:
                after, sharded, weights = ctx.call(act)
                decided = {art.artifact_id: _outcome(art, meta, after, sharded, weights) for art, meta, _ in members}
            except TombstoneError:
                raise  # the store's failures (and their dead letters) are the saga's to handle
            except Exception as exc:  # noqa: BLE001 - the measurement or the decision broke: this level did not run
                decided = {art.artifact_id: NotRun(self.level, failed("the model probe after the reclaim", exc))
                           for art, _, _ in members}
            out.outcomes.update(decided)
        return out


def failed(what: str, exc: BaseException) -> str:
    """One line: what failed and the exception (its type and first line)."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, TombstoneError) and first:
        return f"{what} failed: {first}"
    return f"{what} failed: {type(exc).__name__}" + (f": {first}" if first else "")


def _outcome(art: ArtifactRecord, meta: Mapping[str, Any], after: dict[str, Any], sharded: bool,
             weights: Mapping[str, str]) -> ProbeResult | NotRun:
    before = meta.get("before") or {}
    own = {k: v for k, v in {"canary": after.get("canaries", {}).get(art.artifact_id)}.items() if v}
    unchanged = sorted(s for s, sha in meta.get("weights", {}).items()
                       if weights.get(s) == sha and s in after["views"]["served"])
    evidence = {
        "method": ("canary exposure among random secrets of the same form; greedy extraction from the subject's"
                   f" prefixes; loss and Min-K% (k={MIN_K:.0%}) membership inference against held-out examples, AUC"
                   f" with a {CONFIDENCE:.0%} bootstrap CI, the TPR at an FPR of {LOW_FPR:.0%} and the smallest AUC"
                   f" the sample sizes can detect (exact Mann-Whitney, one-sided alpha {ALPHA:g}); compared with two"
                   " nulls: the suppressed ensemble and a held-out subject; each measure separated, not separated,"
                   " or cannot tell (too few samples for its statistic), and the last decides nothing"),
        "limit": LIMIT,
        "citation": CITATION,
        "shards": meta.get("shards", []),
        "weights_before": meta.get("weights", {}),
        "weights_now": {s: weights.get(s) for s in meta.get("shards", [])},
        "before_suppression": before,
        "after_reclaim": after,
        **own,
        "summary": summary(after),
        "summary_before": summary(before) if before else None,
    }
    if not sharded:
        return ProbeResult(Level.MODEL, passed=False, evidence=evidence, measurement=(
            "unsharded adapter: approximate unlearning is RESIDUAL-prone by construction (the weights that serve"
            " descend from weights trained on the example); measured " + summary(after)))
    if unchanged:
        return ProbeResult(Level.MODEL, passed=False, evidence=evidence, measurement=(
            f"{', '.join(unchanged)} still serves the weights it had before the erasure; {summary(after)}"))
    if after.get("separates"):
        return ProbeResult(Level.MODEL, passed=False, evidence=evidence,
                           measurement=f"the weights still separate the subject: {summary(after)}")
    # A pass needs a control: a measure that separated the subject before suppression and tells now that it
    # does not. One that cannot tell (too few samples for its statistic) decides nothing either way.
    told_before, told_after = _told(before), _told(after)
    controls = [k for k, v in told_before.items() if v == SEPARATED]
    if any(told_after.get(k) == NOT_SEPARATED for k in controls):
        return ProbeResult(Level.MODEL, passed=True, evidence=evidence)
    if controls:
        return NotRun(Level.MODEL, f"{why_cannot_tell(after)} (after the reclaim; before suppression the subject was"
                                   f" separated: {summary(before)})", evidence=evidence)
    if outcome_of(before) == CANNOT_TELL:
        return NotRun(Level.MODEL, why_cannot_tell(before), evidence=evidence)
    why = ("blind: before suppression these probes did not separate the subject from held-out data either ("
           f"{summary(before) if before else 'nothing measured'}), so their pass after the erasure shows nothing")
    return NotRun(Level.MODEL, why, evidence=evidence)


# -- the snapshot before suppression ---------------------------------------------------------------


def snapshot(adapter: Any, artifacts: Sequence[ArtifactRecord], lineage: Any, owners: dict[str, str]) -> dict[str, Any]:
    """The saga's snapshot step for a store holding model weights, before anything is hidden: each
    artifact's material (``Adapter.model_material``: shard, weights, text, canary) and, per subject, the
    probe's measurement as the model serves with the subject's shards in it (the control). Recorded in the
    lineage db (``owners`` maps artifact ids to their saga), the text sealed; deleted with the receipt.
    Returns the journal's detail (ids, outcomes, whether the probes separated — never text). A store error,
    or any other failure of the snapshot or of one subject's measurement, is recorded, not retried: the
    erasure goes on (the suppression meets the store for real, with its retries), and the level reports those
    artifacts as not run, saying why, with the levels below and the receipt unaffected. Only a failure to
    record the snapshot in the lineage db stops the saga."""
    suppressed = lineage.suppressed_pairs(artifacts)  # one query a store, not one an artifact
    fresh = [a for a in artifacts if (a.store, a.artifact_id) not in suppressed]
    fresh_ids = {a.artifact_id for a in fresh}
    snaps: dict[str, tuple[dict[str, Any], str | None]] = {
        a.artifact_id: ({"version": VERSION, "outcome": "suppressed first",
                         "why": "it was suppressed before the model level could measure it"}, None)
        for a in artifacts if a.artifact_id not in fresh_ids}
    error = None
    try:
        if fresh:
            with adapter.store_lock():
                material = adapter.model_material(fresh)
                target = adapter.model_target()
                groups: dict[str, list[ArtifactRecord]] = {}
                for art in fresh:
                    m = material.get(art.artifact_id) or {"kind": "missing", "why": "the store does not know it"}
                    if m.get("kind") == TRAINED and m.get("text") is not None:
                        groups.setdefault(art.subject_key, []).append(art)
                    elif m.get("kind") == HELD_OUT:
                        snaps[art.artifact_id] = ({"version": VERSION, "kind": HELD_OUT, "outcome": "held out"}, None)
                    else:
                        snaps[art.artifact_id] = ({"version": VERSION, "kind": m.get("kind", "missing"),
                                                   "outcome": "not measured",
                                                   "why": m.get("why") or "its text could not be read"}, None)
                for key, members in sorted(groups.items()):
                    examples = [{"id": a.artifact_id, "text": material[a.artifact_id]["text"],
                                 "canary": material[a.artifact_id].get("canary")} for a in members]
                    shards = sorted({s for a in members for s in material[a.artifact_id]["shards"]})
                    seed = seed_for(adapter.store, *sorted(a.artifact_id for a in members))
                    try:
                        before = measure(target, examples, shards, seed, with_owners=True)
                    except Exception as exc:  # noqa: BLE001 - this subject's measurement broke: not run for it
                        why = failed("the measurement before suppression", exc)
                        for art in members:
                            snaps[art.artifact_id] = ({"version": VERSION, "kind": TRAINED, "outcome": "failed",
                                                       "why": why}, None)
                        continue
                    for art in members:
                        m = material[art.artifact_id]
                        meta = {"version": VERSION, "kind": TRAINED, "outcome": "measured", "shards": m["shards"],
                                "weights": m.get("weights", {}), "canary": m.get("canary"),
                                "sharded": m.get("sharded", True), "before": before}
                        snaps[art.artifact_id] = (meta, m["text"])
    except Exception as exc:  # noqa: BLE001 - a store error or a broken snapshot must not stop the erasure
        error = failed("the snapshot before suppression", exc)
        for art in fresh:
            snaps[art.artifact_id] = ({"version": VERSION, "outcome": "failed", "why": error}, None)
    by_saga: dict[str, dict[str, tuple[dict[str, Any], str | None]]] = {}
    for aid, snap in snaps.items():
        by_saga.setdefault(owners.get(aid, ""), {})[aid] = snap
    for saga_id, rows in sorted(by_saga.items()):
        lineage.save_model_snapshots(saga_id, adapter.store, rows)
    detail: dict[str, Any] = {"artifacts": {
        aid: {"outcome": meta.get("outcome"),
              **({"separated_before": bool(meta["before"].get("separates")),
                  "before": outcome_of(meta["before"])} if "before" in meta else {}),
              **({"why": meta["why"]} if meta.get("outcome") == "failed" else {})}
        for aid, (meta, _) in sorted(snaps.items())}}
    if error:
        detail["error"] = error
    return detail


STAGE = ModelStage()

__all__ = ["CANDIDATES", "CANNOT_TELL", "CITATION", "LIMIT", "MIN_K", "NOT_SEPARATED", "SEPARATED", "STAGE", "ModelStage",
           "ModelTarget", "auc", "auc_ci", "exposure", "failed", "loss_score", "measure", "min_k_score", "outcome_of",
           "snapshot", "summary", "why_cannot_tell"]
