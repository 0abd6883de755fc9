"""The semantic level on a templated corpus: clean deletions flagged, before and after matching the controls.

A templated corpus (``tombstone.testing.templated``: 200 people with three documents each, most of them forms
filled from 120 templates, the rest free support notes) in one embedded Chroma collection (cosine), written
through Tombstone's wrapper with the offline MiniLM embedder. Every other subject is erased alone (simulated:
the saga's snapshot on the store, removal by filtering) and each of its artifacts decided twice on the same
data: with the 20 nearest controls (the choice before matching) and with controls matched on how close their
nearest surviving neighbour is (the saga's choice). Then a near-copy of 50 documents planted under
another subject, the original corpus of ``benchmarks/semantic.py`` (600 documents in 12 clusters, one subject
each) with clean deletions, near-copies and paraphrases, a few real erasures whose receipts are searched for
other subjects' ids, and the snapshot's time per artifact with each choice.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

HEADINGS = ("Semantic level: templated corpus, controls matched",)
SUBJECTS = 200
TWIN = 0.86
"""A document whose nearest document of another subject is at least this close has a near-twin."""
NEAR_COPIES = 50
ORIGINAL_TARGETS = 60
REAL = 6
CHOICES = ("nearest", "matched")


def _templated(tmp: Path, embedder, docs):
    import chromadb
    from tombstone_adapters.chroma.wrapper import TombstoneCollection

    from tombstone import Tombstone, init_deployment

    config = init_deployment(tmp / "templated", {"chunks": {"backend": "chroma", "path": "stores/chroma",
                                                             "collection": "chunks"}},
                             levels=("logical", "physical", "semantic", "model"))
    col = chromadb.PersistentClient(path=config.stores["chunks"].options["path"]).create_collection(
        "chunks", metadata={"hnsw:space": "cosine", "hnsw:batch_size": 100, "hnsw:sync_threshold": 1000},
        embedding_function=None)
    tomb = Tombstone(config)
    wrapper = TombstoneCollection(col, lineage=tomb.lineage, store="chunks", embedder=embedder)
    for start in range(0, len(docs), 100):
        part = docs[start : start + 100]
        wrapper.add(ids=[f"doc-{d.index:03d}" for d in part], documents=[d.text for d in part],
                    subject=[f"subject-{d.subject:03d}" for d in part])
    return config, tomb, wrapper


def _twins(embedder, docs, owner) -> np.ndarray:
    """Per document, the cosine similarity of its nearest document of another subject."""
    v = np.asarray(embedder([d.text for d in docs]), dtype=np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    sims = v @ v.T
    owners = np.array([owner(d) for d in docs])
    sims[owners[:, None] == owners[None, :]] = -1.0
    return sims.max(axis=1)


def _decide(adapter, lineage, erased: list[str], matched: bool) -> tuple[dict, float]:
    """Each erased artifact's decision (None: not measured) and the snapshot's seconds per artifact."""
    from tombstone.verify import neighbourhood as nb

    records = [lineage.artifact("chunks", aid) for aid in erased]
    with adapter.store_lock():  # as the saga does: the collection looked up again
        start = time.perf_counter()
        snaps = nb.take_snapshots(adapter, records, probe_vectors=lineage.probe_vectors, artifact=lineage.artifact,
                                  artifacts_many=lineage.artifacts_many, matched=matched)
        seconds = (time.perf_counter() - start) / len(erased)
        measured = {aid: s for aid, s in snaps.items() if s.meta["outcome"] == "measured"}
        after = (adapter.semantic_neighbours(np.concatenate([s.queries for s in measured.values()]), nb.TOP,
                                             frozenset(erased)) if measured else [])
    out: dict[str, object] = dict.fromkeys(erased)
    at = 0
    for aid, snap in measured.items():
        res = after[at : at + len(snap.queries)]
        at += len(snap.queries)
        drifts = [nb.drift(b, a.vectors) for b, a in zip(snap.baselines, res)]
        out[aid] = nb.decide(drifts, [float(np.mean(c["drifts"])) for c in snap.meta["controls"]])
    return out, seconds


def _rate(flags: list) -> dict:
    from scipy import stats

    measured = [f for f in flags if f is not None]
    hits = int(sum(measured))
    ci = stats.binomtest(hits, len(measured)).proportion_ci(method="wilson") if measured else None
    return {"residual": hits, "trials": len(measured), "not_measured": len(flags) - len(measured),
            "rate": hits / len(measured) if measured else None, "ci": [float(ci.low), float(ci.high)] if ci else None}


def _templated_trials(tomb, adapter, wrapper, docs, twin) -> dict:
    from tombstone.testing.templated import near_copy

    flags = {c: {"all": [], "twin": [], "other": []} for c in CHOICES}
    seconds = {c: [] for c in CHOICES}
    for s in range(0, SUBJECTS, 2):
        ids = [f"doc-{d.index:03d}" for d in docs if d.subject == s]
        for choice in CHOICES:
            decisions, secs = _decide(adapter, tomb.lineage, ids, choice == "matched")
            seconds[choice].append(secs)
            for aid, decision in decisions.items():
                flag = None if decision is None else bool(decision.echo)
                flags[choice]["all"].append(flag)
                flags[choice]["twin" if twin[int(aid[4:])] >= TWIN else "other"].append(flag)
    # planted near-copies: the targets spread over the corpus (none of them erased above: odd subjects)
    targets = [d for d in docs if d.subject % 2 == 1][:: max(1, SUBJECTS * 3 // 2 // NEAR_COPIES)][:NEAR_COPIES]
    copies = {c: [] for c in CHOICES}
    for d in targets:
        ids = [f"doc-{x.index:03d}" for x in docs if x.subject == d.subject]
        echo = f"echo-{d.index:03d}"
        wrapper.add(ids=[echo], documents=[near_copy(d)], subject=f"echo-owner-{d.index:03d}")
        for choice in CHOICES:
            decision = _decide(adapter, tomb.lineage, ids, choice == "matched")[0][f"doc-{d.index:03d}"]
            copies[choice].append(None if decision is None else bool(decision.echo))
        wrapper.delete(ids=[echo])
    return {"clean": {c: {k: _rate(v) for k, v in flags[c].items()} for c in CHOICES},
            "near_copy": {c: _rate(copies[c]) for c in CHOICES},
            "snapshot_ms": {c: 1000 * float(np.median(seconds[c])) for c in CHOICES},
            "twin_share": float(np.mean(twin >= TWIN)), "twin_median": float(np.median(twin))}


def _real(tomb, docs, twin) -> dict:
    """Real erasures of subjects with a near-twin among their documents: statuses, and the other subjects'
    ids their receipts name (an echo candidate of a RESIDUAL is named on purpose; a control never is)."""
    subjects = [s for s in range(1, SUBJECTS, 2) if max(twin[d.index] for d in docs if d.subject == s) >= TWIN][-REAL:]
    statuses: dict[str, int] = {}
    named_other, searched = 0, 0
    for s in subjects:
        receipt, path = tomb.erase(f"subject-{s:03d}")
        text = Path(path).read_text()
        own = {f"doc-{d.index:03d}" for d in docs if d.subject == s}
        leads = set()  # what a RESIDUAL names on purpose: the candidates, and what took its place per probe
        for a in receipt["artifacts"]:
            for p in a["evidence"]["probes"]:
                if p["level"] == "semantic":
                    leads |= {c["artifact_id"] for c in p["detail"].get("in_its_place", [])}
                    leads |= {q["in_its_place"] for q in p["detail"].get("probes", []) if isinstance(q["in_its_place"], str)}
        found = set(re.findall(r'"(doc-\d{3})"', text))
        assert own <= found  # the search finds the erased artifacts' own ids
        named_other += len(found - own - leads)
        searched += 1
        for a in receipt["artifacts"]:
            key = f"{a['status']}({a['level'] or 'none'})"
            statuses[key] = statuses.get(key, 0) + 1
    return {"subjects": searched, "statuses": statuses, "other_ids_named": named_other}


def _original(tmp: Path, embedder) -> dict:
    from semantic import _deployment

    from tombstone.testing.echoes import corpus, near_copy, paraphrase

    docs = corpus(600)
    _, tomb, wrapper = _deployment(tmp / "original", embedder, docs)
    try:
        adapter = tomb.adapter("chunks")
        targets = list(range(0, 2 * ORIGINAL_TARGETS, 2))
        embedder([near_copy(docs[t]) for t in targets] + [paraphrase(docs[t]) for t in targets])
        out = {kind: {c: [] for c in CHOICES} for kind in ("clean", "near-copy", "paraphrase")}
        for t in targets:
            aid = f"doc-{t:03d}"
            for kind, make in (("clean", None), ("near-copy", near_copy), ("paraphrase", paraphrase)):
                echo = f"echo-{kind}-{t:03d}"
                if make:
                    wrapper.add(ids=[echo], documents=[make(docs[t])], subject=f"echo-owner-{kind}-{t:03d}")
                for choice in CHOICES:
                    decision = _decide(adapter, tomb.lineage, [aid], choice == "matched")[0][aid]
                    out[kind][choice].append(None if decision is None else bool(decision.echo))
                if make:
                    wrapper.delete(ids=[echo])
        return {kind: {c: _rate(v) for c, v in by.items()} for kind, by in out.items()}
    finally:
        tomb.close()


def run(tmp: Path) -> dict:
    from semantic import _Memo

    from tombstone.capture import MiniLMEmbedder
    from tombstone.testing.templated import templated_corpus

    started = time.perf_counter()
    embedder = _Memo(MiniLMEmbedder())
    docs = templated_corpus(SUBJECTS)
    twin = _twins(embedder, docs, lambda d: d.subject)
    _, tomb, wrapper = _templated(tmp, embedder, docs)
    try:
        adapter = tomb.adapter("chunks")
        out = {"templated": _templated_trials(tomb, adapter, wrapper, docs, twin), "docs": len(docs)}
        out["real"] = _real(tomb, docs, twin)
    finally:
        tomb.close()
    out["original"] = _original(tmp, embedder)
    out["seconds"] = time.perf_counter() - started
    return json.loads(json.dumps(out))


def _cell(r: dict) -> str:
    if not r["trials"]:
        return "not measured"
    return f"{r['residual']} / {r['trials']} ({r['rate']:.2f}, {r['ci'][0]:.2f}–{r['ci'][1]:.2f})"


def section(result: dict) -> str:
    t, o, real = result["templated"], result["original"], result["real"]
    clean = t["clean"]
    rows = [
        ("templated", "clean deletion, every artifact", clean["nearest"]["all"], clean["matched"]["all"]),
        ("templated", f"clean deletion, nearest other-subject document at cosine ≥ {TWIN}", clean["nearest"]["twin"],
         clean["matched"]["twin"]),
        ("templated", f"clean deletion, nearest other-subject document below {TWIN}", clean["nearest"]["other"],
         clean["matched"]["other"]),
        ("templated", "planted near-copy", t["near_copy"]["nearest"], t["near_copy"]["matched"]),
        ("original", "clean deletion", o["clean"]["nearest"], o["clean"]["matched"]),
        ("original", "planted near-copy", o["near-copy"]["nearest"], o["near-copy"]["matched"]),
        ("original", "planted paraphrase", o["paraphrase"]["nearest"], o["paraphrase"]["matched"]),
    ]
    statuses = ", ".join(f"{n} {k}" for k, n in sorted(real["statuses"].items()))
    lines = [
        f"## {HEADINGS[0]}",
        "",
        (f"A templated corpus (`tombstone.testing.templated`): {SUBJECTS} people with three documents each"
        f" ({result['docs']} in all), most of them forms filled from 120 templates with the person's name, dates,"
        " amounts, order and customer numbers, the rest free support notes; embedded with the offline MiniLM model"
        f" in an embedded Chroma collection (cosine) through Tombstone's wrapper. {t['twin_share']:.0%} of the"
        f" documents have another subject's document at cosine ≥ {TWIN} (a form filled for someone else; the"
        f" median nearest other-subject document is at {t['twin_median']:.2f}). Every other subject is erased alone"
        " (the saga's snapshot on the store, removal by filtering) and each of its artifacts decided twice on the"
        " same data: ranked among its 20 nearest usable controls (*nearest*, the choice before this calibration),"
        " and among 20 controls chosen from the 100 nearest for how close their nearest surviving neighbour is to"
        " them, matched to the erased artifact's own (*matched*, the saga's choice). Planted near-copies"
        f" (three words changed, under another subject): {NEAR_COPIES} documents of the templated corpus; the"
        f" original corpus is `benchmarks/semantic.py`'s (600 documents in 12 clusters, one subject each), its"
        f" first {ORIGINAL_TARGETS} trial targets. Called RESIDUAL(semantic): count, rate and 95% interval"
        " (Wilson, `scipy.stats.binomtest`)."),
        "",
        "| corpus | trial | nearest controls (before) | matched controls (after) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {corpus} | {trial} | {_cell(a)} | {_cell(b)} |" for corpus, trial, a, b in rows]
    lines += [
        "",
        ("Ranked among its nearest neighbours, a clean deletion of a document with another person's near-twin is"
        " called an echo far above the 5% level: the twin takes its place and the hole is small, exactly as an"
        " echo's would be, while most of its neighbours have no such twin. Matched controls are deletions whose"
        " neighbours are as close: the rate among near-twins comes down to the nominal one and overall it stays"
        " below it. The price is power where an echo is no closer than the corpus's own near-duplicates: a"
        " near-copy or a paraphrase is found when it is closer to the artifact than documents here usually are"
        " to their nearest neighbours."),
        "",
        (f"Real erasures of {real['subjects']} subjects with a near-twin (sagas: snapshot, suppress, delete, verify):"
        f" {statuses}; ids of other subjects' artifacts in their receipts, other than the echo candidates a"
        f" RESIDUAL names: {real['other_ids_named']} (controls are named by keyed reference). The snapshot took"
        f" {t['snapshot_ms']['nearest']:.0f} ms per artifact with the nearest controls and"
        f" {t['snapshot_ms']['matched']:.0f} ms with matched ones (median over the erasures; the matching asks"
        " one more batched query per erasure, for the candidates' neighbours). The benchmark ran in"
        f" {result['seconds'] / 60:.1f} minutes."),
    ]
    return "\n".join(lines)
