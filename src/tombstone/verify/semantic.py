"""The semantic level: did the artifact's neighbourhood keep a trace of it?

Measured, not looked up (Ghost Echoes, calibrated per artifact): the drift of the Top-5 of the artifact's
probe queries from a snapshot taken before suppression to after reclaim, ranked among same-cluster
controls of other subjects whose removal was simulated on the same data, with a bootstrap confidence
interval over the probe queries. The measurement is in :mod:`tombstone.verify.neighbourhood`; this module
takes the snapshot (a saga step before suppress, :func:`snapshot`) and turns the measurement into an
outcome per artifact (the stage).

Outcomes: passed (the hole is the size of a normal same-cluster deletion); failed, naming the live
artifacts that took the erased one's place (the neighbourhood still answers as if it were there: an echo
the lineage graph does not know); not testable (the artifact is in its own Top-5 for too few of its probe
queries: UNVERIFIED); not run (no snapshot, the store no longer held it, or too few controls to rank
against). It is a measurement, not proof, and a side channel: an outsider comparing answers before and
after can tell that something was deleted. The receipt names other subjects' artifacts — the controls, and
for a pass whatever now answers the probes — by keyed reference only (``VerifyContext.reference``); the
echo candidates of a failure are named in the clear, as the lead a person follows.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tombstone.capabilities import Capability
from tombstone.errors import TombstoneError
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify import neighbourhood as nb
from tombstone.verify.levels import Level
from tombstone.verify.result import NotRun, ProbeResult

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext


class SemanticStage:
    """The semantic level as a stage of the verification pipeline."""

    level = Level.SEMANTIC
    capability = Capability.SEMANTIC_PROBE

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        return f"{adapter.backend} declares no semantic probe"

    def run(self, ctx: VerifyContext, adapter: Any, artifacts: Sequence[ArtifactRecord]):
        from tombstone.verify.runner import StageOutput

        out = StageOutput(outcomes={})
        if ctx.semantic_snapshots is None:
            for art in artifacts:
                out.outcomes[art.artifact_id] = NotRun(self.level, NO_SNAPSHOT_HERE)
            return out
        stored = ctx.semantic_snapshots(adapter.store, [a.artifact_id for a in artifacts])
        snaps = {aid: nb.Snapshot.decode(meta, blob) for aid, (meta, blob) in stored.items()}
        measured = {aid: s for aid, s in snaps.items() if s.meta.get("outcome") == "measured"}
        # probes found incomplete after the snapshot (a write of the id since) decide nothing either
        incomplete = set(ctx.probes_incomplete(artifacts)) if ctx.probes_incomplete is not None else set()
        measured = {aid: s for aid, s in measured.items() if aid not in incomplete}
        erased = frozenset(a.artifact_id for a in artifacts)
        failed = None
        reference = functools.lru_cache(maxsize=None)(ctx.reference or _salted_reference())  # controls recur
        try:
            after = _after(ctx.call, adapter, measured, erased)
            noise = _noise_floor(ctx.call, adapter, measured, erased)
        except TombstoneError:
            raise  # the store's: retried, dead-lettered or recorded by the caller
        except Exception as exc:  # noqa: BLE001 - a measurement that breaks must not hold up the receipt
            failed = f"the semantic measurement failed: {type(exc).__name__}: {exc}"
        decisions: dict[str, tuple[list[float], nb.Decision]] = {}
        if not failed:
            try:  # one bootstrap and one rank test per group of alike artifacts, not one per artifact
                drifts = {aid: _drifts(snap, after[aid]) for aid, snap in measured.items()}
                decided = nb.decide_many([(drifts[aid], _control_means(snap)) for aid, snap in measured.items()])
                decisions = {aid: (drifts[aid], d) for aid, d in zip(measured, decided)}
            except Exception as exc:  # noqa: BLE001 - as below, for every artifact measured
                failed = f"the semantic measurement failed: {type(exc).__name__}: {exc}"
        for art in artifacts:
            aid = art.artifact_id
            snap = snaps.get(aid)
            if snap is None:
                out.outcomes[aid] = NotRun(self.level, NO_SNAPSHOT)
            elif aid in incomplete and snap.meta.get("outcome") == "measured":
                out.outcomes[aid] = NotRun(self.level, INCOMPLETE, evidence={"outcome": PROBES_INCOMPLETE})
            elif aid in measured and failed:
                out.outcomes[aid] = NotRun(self.level, failed)
            elif aid in measured:
                try:
                    out.outcomes[aid] = _outcome(adapter.store, aid, snap, after[aid], noise.get(aid, {}), reference,
                                                 decisions[aid])
                except Exception as exc:  # noqa: BLE001 - as above, for this artifact alone
                    out.outcomes[aid] = NotRun(self.level, f"the semantic measurement failed: {type(exc).__name__}: {exc}")
            else:
                why = snap.meta.get("why") or snap.meta.get("outcome", "no measurement")
                evidence = {k: v for k, v in snap.meta.items() if k in ("queries_asked", "unusable", "outcome")}
                if "controls" in snap.meta:
                    evidence["controls"] = len(snap.meta["controls"])
                if snap.meta.get("outcome") == "not testable":
                    out.outcomes[aid] = NotRun(self.level, f"not testable: {why}", evidence=evidence)
                    out.findings[aid] = {"semantic_not_testable": why}
                else:
                    out.outcomes[aid] = NotRun(self.level, why, evidence=evidence)
        return out


PROBES_INCOMPLETE = "probes incomplete"
INCOMPLETE = ("its probes are incomplete: the write queued its fragment probes for background capture and they were"
              " never recorded (the writing process ended first, or its embedder failed), so its neighbourhood"
              " cannot be measured")
NO_SNAPSHOT_HERE = ("an independent verifier has no snapshot of the neighbourhood from before the erasure, so"
                    " the semantic level cannot be measured here")
NO_SNAPSHOT = ("no snapshot of its neighbourhood was taken before suppression (the semantic level was not enabled"
               " when this erasure began)")


def _salted_reference() -> Callable[[str, str], str]:
    """References for a verification without the lineage secret: an HMAC under a salt drawn for this run and
    never kept, so nobody can check one against a guessed id."""
    salt = secrets.token_bytes(32)
    return lambda store, aid: hmac.new(salt, f"{store}\x00{aid}".encode(), hashlib.sha256).hexdigest()[:32]


def _after(call: Callable, adapter: Any, measured: dict[str, nb.Snapshot], erased: frozenset[str]) -> dict[str, list[nb.Neighbours]]:
    """Each measured artifact's probe queries asked again, of the store as it is now (every erased id
    filtered out, so a reclaim that failed is the logical level's finding, not an echo)."""
    order = [(aid, i) for aid, snap in measured.items() for i in range(len(snap.queries))]
    if not order:
        return {}
    vectors = np.concatenate([snap.queries for snap in measured.values()]).astype(np.float32)
    results = list(call(lambda: adapter.semantic_neighbours(vectors, nb.TOP, erased)))
    out: dict[str, list[nb.Neighbours]] = {aid: [] for aid in measured}
    for (aid, _), res in zip(order, results):
        out[aid].append(res)
    return out


def _noise_floor(call: Callable, adapter: Any, measured: dict[str, nb.Snapshot], erased: frozenset[str]) -> dict[str, dict[str, float]]:
    """How far neighbourhoods the erasure did not touch moved between the snapshot and now (a rebuilt
    index, an approximate search): each control's own-vector Top-5, asked again."""
    controls = sorted({c["id"] for snap in measured.values() for c in snap.meta["controls"]})
    if not controls:
        return {}
    own = dict(call(lambda: adapter.stored_vectors(controls)))
    asked = [cid for cid in controls if cid in own]
    if not asked:
        return {}
    results = dict(zip(asked, call(lambda: adapter.semantic_neighbours(np.stack([own[c] for c in asked]), nb.TOP, erased))))
    baseline_ids = sorted({i for snap in measured.values() for c in snap.meta["controls"] for i in c["own_baseline"]})
    vectors = dict(call(lambda: adapter.stored_vectors(baseline_ids)))
    out = {}
    # a control serves many artifacts of a batch: its drift (its own Top-5 then and now) is measured once
    pairs: dict[tuple[str, tuple[str, ...]], tuple[np.ndarray, np.ndarray]] = {}
    for snap in measured.values():
        for c in snap.meta["controls"]:
            res = results.get(c["id"])
            key = (c["id"], tuple(c["own_baseline"]))
            if res is not None and key not in pairs and all(i in vectors for i in c["own_baseline"]):
                pairs[key] = (np.stack([vectors[i] for i in c["own_baseline"]]), res.vectors[: nb.TOP])
    drifts = dict(zip(pairs, nb.drifts(list(pairs.values()))))
    for aid, snap in measured.items():
        moved = [drifts[key] for c in snap.meta["controls"] if (key := (c["id"], tuple(c["own_baseline"]))) in drifts]
        if moved:
            out[aid] = {"median": round(float(np.median(moved)), 6), "max": round(float(np.max(moved)), 6),
                        "neighbourhoods": len(moved)}
    return out


def _drifts(snap: nb.Snapshot, after: list[nb.Neighbours]) -> list[float]:
    """Each probe query's drift: its Top-5 before suppression against its answer after reclaim (one artifact's
    at a time: its few pairs' arrays stay in the cache, where a batch's thousands at once would not)."""
    return nb.drifts([(before, res.vectors[: nb.TOP]) for before, res in zip(snap.baselines, after)])


def _control_means(snap: nb.Snapshot) -> list[float]:
    return [sum(c["drifts"]) / len(c["drifts"]) for c in snap.meta["controls"]]


def _outcome(store: str, aid: str, snap: nb.Snapshot, after: list[nb.Neighbours], noise: dict[str, float],
             reference: Callable[[str, str], str], decided: tuple[list[float], nb.Decision]) -> ProbeResult:
    """One artifact's semantic outcome from its probes' drifts and its decision (taken for the whole batch)."""
    drifts, decision = decided
    probes, replaced = [], Counter()
    for probe, d, res in zip(snap.meta["probes"], drifts, after):
        now = res.ids[: nb.TOP]
        took = now[probe["rank"] - 1] if len(now) >= probe["rank"] else None
        if took is not None:
            replaced[took] += 1
        probes.append({"query": probe["label"], "rank_before": probe["rank"], "drift": round(d, 6),
                       "in_its_place": took})
    controls = snap.meta["controls"]
    median = float(np.median(decision.control_drifts))
    if not decision.echo:
        # not a lead: the artifacts of other subjects that now answer its probes are named by keyed reference only
        for probe in probes:
            probe["in_its_place"] = None if probe["in_its_place"] is None else {"ref": reference(store, probe["in_its_place"])}
    candidates = [{"store": store, "artifact_id": cid, "queries": n}
                  for cid, n in sorted(replaced.items(), key=lambda kv: (-kv[1], kv[0]))[:3]] if decision.echo else []
    matched = snap.meta.get("controls_chosen") == nb.MATCHED
    similarities = [c.get("similarity") for c in controls]
    own_similarity = snap.meta.get("nearest_similarity")
    evidence = {
        "method": (f"drift of the 1/rank^2-weighted Top-{nb.TOP} centroid of each probe query, before suppression vs"
                   f" after reclaim, ranked among {len(controls)} same-cluster controls of other subjects"
                   + (" matched on how close their nearest surviving neighbour is" if matched else "")
                   + " (removal simulated by filtering); a measurement, not proof"),
        "drift": round(decision.drift, 6),
        "ci": [round(decision.ci[0], 6), round(decision.ci[1], 6)],
        "confidence": nb.CONFIDENCE,
        "rank": decision.rank,
        "of": len(controls) + 1,
        "p": round(decision.p, 6),
        "alpha": nb.ALPHA,
        "nearest_similarity": own_similarity,
        "controls": {"refs": [reference(store, c["id"]) for c in controls],
                     "drifts": [round(x, 6) for x in decision.control_drifts], "median": round(median, 6),
                     "chosen": snap.meta.get("controls_chosen", nb.NEAREST),
                     **({"similarities": similarities} if matched else {})},
        "probes": probes,
        "unusable_queries": snap.meta.get("unusable", []),
        "noise_floor": {"repeat_before_suppression": round(float(snap.meta.get("noise_floor_repeat", 0.0)), 6),
                        "controls_after_reclaim": noise or None},
        "in_its_place": candidates,
    }
    summary = (f"neighbourhood drift {decision.drift:.4f} ({nb.CONFIDENCE:.0%} CI {decision.ci[0]:.4f}-{decision.ci[1]:.4f}),"
               f" rank {decision.rank} of {len(controls) + 1} among same-cluster controls (median {median:.4f},"
               f" Mann-Whitney p={decision.p:.3f})")
    if not decision.echo:
        return ProbeResult(level=Level.SEMANTIC, passed=True, evidence={**evidence, "summary": summary})
    names = ", ".join(f"{c['store']}/{c['artifact_id']}" for c in candidates) or "none returned"
    known = [x for x in similarities if x is not None]
    closer = (f"; its nearest surviving neighbour is at cosine {own_similarity:.3f}, the matched controls' at"
              f" {min(known):.3f}-{max(known):.3f}") if matched and known and own_similarity is not None else ""
    measurement = (f"{summary}: the neighbourhood still answers as if it were there{closer}; in its place: {names}")
    return ProbeResult(level=Level.SEMANTIC, passed=False, measurement=measurement, evidence={**evidence, "summary": summary})


def snapshot(adapter: Any, artifacts: Sequence[ArtifactRecord], lineage: Any, owners: dict[str, str]) -> dict[str, Any]:
    """The saga's snapshot step for one store, before anything is hidden: measure each artifact's
    neighbourhood and its controls (:func:`tombstone.verify.neighbourhood.take_snapshots`) and record it in
    the lineage db (``owners`` maps artifact ids to their saga). Returns the journal's detail (ids, counts,
    outcomes — never a vector). An artifact already suppressed (a saga begun before the level was enabled)
    gets no baseline: suppression may already hide it. A store error is recorded, not retried: the
    erasure goes on, and the level reports it as not run."""
    suppressed = lineage.suppressed_pairs(artifacts)  # one query a store, not one an artifact
    fresh = [a for a in artifacts if (a.store, a.artifact_id) not in suppressed]
    fresh_ids = {a.artifact_id for a in fresh}
    snaps: dict[str, nb.Snapshot] = {
        a.artifact_id: nb.Snapshot({"version": nb.VERSION, "outcome": "suppressed first",
                                    "why": "it was suppressed before a snapshot of its neighbourhood could be taken"})
        for a in artifacts if a.artifact_id not in fresh_ids}
    # an artifact whose fragment probes were never recorded is not measured on what is left of its probes
    incomplete = lineage.probes_incomplete(fresh) if fresh else set()
    snaps.update({aid: nb.Snapshot({"version": nb.VERSION, "outcome": PROBES_INCOMPLETE, "why": INCOMPLETE})
                  for aid in sorted(incomplete)})
    fresh = [a for a in fresh if a.artifact_id not in incomplete]
    error = None
    try:
        if fresh:
            with adapter.store_lock():
                snaps.update(nb.take_snapshots(adapter, fresh, probe_vectors=lineage.probe_vectors,
                                               artifact=lineage.artifact, artifacts_many=lineage.artifacts_many))
    except Exception as exc:  # noqa: BLE001 - a store error or a broken measurement must not stop the erasure
        error = str(exc) if isinstance(exc, TombstoneError) else f"{type(exc).__name__}: {exc}"
        snaps.update({a.artifact_id: nb.Snapshot({"version": nb.VERSION, "outcome": "failed",
                                                  "why": f"the snapshot before suppression failed: {error}"})
                      for a in fresh})
    by_saga: dict[str, dict[str, tuple[dict[str, Any], bytes]]] = {}
    for aid, snap in snaps.items():
        by_saga.setdefault(owners.get(aid, ""), {})[aid] = snap.encode()
    lineage.save_semantic_snapshots(adapter.store, by_saga)  # one statement and one commit for a batch's sagas
    detail: dict[str, Any] = {"artifacts": {aid: {"outcome": s.meta.get("outcome"), "probes": len(s.meta.get("probes", [])),
                                                  "controls": len(s.meta.get("controls", []))}
                                            for aid, s in sorted(snaps.items())}}
    if error:
        detail["error"] = error
    return detail


STAGE = SemanticStage()
