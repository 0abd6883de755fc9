"""Batches: one reclaim and one probe pass per store for many subjects, one receipt each."""

from __future__ import annotations

import shutil

from tombstone import Tombstone

from test_cli import one_line_error, run


def statuses(receipt):
    return {(a["store"], a["artifact_id"]): (a["status"], a["level"], a["reason"]) for a in receipt["artifacts"]}


def test_batch_equals_single_erasures_with_one_pass_per_store(tmp_path, monkeypatch):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "5", "--erase", "none").exit_code == 0
    single = tmp_path / "single"
    shutil.copytree(root, single)
    subjects = ["user-0001", "user-0003", "user-0004"]
    with Tombstone.open(single / "tombstone.toml") as tomb:
        one_by_one = {s: statuses(tomb.erase(s)[0]) for s in subjects}

    from tombstone_adapters.chroma.adapter import ChromaAdapter
    from tombstone_adapters.docstore.adapter import DocstoreAdapter

    calls = {(cls.__name__, name): 0 for cls in (ChromaAdapter, DocstoreAdapter)
             for name in ("reclaim", "probe_physical")}
    for cls in (ChromaAdapter, DocstoreAdapter):
        for name in ("reclaim", "probe_physical"):
            real = getattr(cls, name)

            def counting(self, *args, _real=real, _name=name, **kwargs):
                if type(self) in (ChromaAdapter, DocstoreAdapter):
                    calls[(type(self).__name__, _name)] += 1
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting)
    listing = tmp_path / "subjects.txt"
    listing.write_text("\n".join(["# erasure requests, week 48", *subjects, ""]))
    result = run("erase", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    # one reclaim and one verify scan per store for the whole batch (Chroma's in-place recipe scans the
    # files once more inside that one reclaim, for what to zero, and probes again only after a VACUUM)
    assert calls[("DocstoreAdapter", "reclaim")] == 1 and calls[("ChromaAdapter", "reclaim")] == 1
    assert calls[("DocstoreAdapter", "probe_physical")] == 1
    assert calls[("ChromaAdapter", "probe_physical")] == 1, calls
    import json

    for subject in subjects:
        receipt = json.loads((root / "receipts" / f"{subject}.json").read_text())
        assert statuses(receipt) == one_by_one[subject]
        assert receipt["artifacts"][0]["evidence"]["reclaim"]["batch_subjects"] == 3
    assert run("receipt", "verify", str(root / "receipts" / "user-0004.json"), "--key",
               str(root / "keys" / "signing.pub")).exit_code == 0


def test_an_unknown_subject_in_a_batch_gets_a_signed_receipt_saying_so_and_the_others_are_erased(tmp_path):
    import json

    from tombstone.receipt import Receipt

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    listing = tmp_path / "subjects.txt"
    listing.write_text("user-0001\nnobody\n")
    result = run("erase", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 3, result.output  # a person should check the reference that matched nothing
    assert "no artifact is recorded for this subject" in result.output
    erased = Receipt.load(root / "receipts" / "user-0001.json")
    assert {a.status.value for a in erased.artifacts} == {"VERIFIED"}
    unknown = Receipt.load(root / "receipts" / "nobody.json")
    assert unknown.artifacts == () and "records no artifact" in unknown.statement
    assert "outside Tombstone's wrappers are not covered" in unknown.statement
    assert unknown.sequence in (1, 2) and {erased.sequence, unknown.sequence} == {1, 2}  # both in the chain
    key = str(root / "keys" / "signing.pub")
    assert run("receipt", "verify", str(root / "receipts" / "nobody.json"), "--key", key).exit_code == 0


def test_bad_batch_input_is_one_line(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    config = str(root / "tombstone.toml")
    listing = tmp_path / "subjects.txt"
    listing.write_text("user-0001\n")
    one_line_error(run("erase", "--config", config), 2)
    one_line_error(run("erase", "user-0001", "--subjects-file", str(listing), "--config", config), 2)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nobody this week\n")
    one_line_error(run("erase", "--subjects-file", str(empty), "--config", config), 2)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"user-0001\n\xff\xfe\x00\x9c bad")
    err = one_line_error(run("erase", "--subjects-file", str(binary), "--config", config), 2)
    assert "not UTF-8 or UTF-16" in err
    assert "no erasure has been run" in run("status", "--config", config).output


def test_a_utf16_subjects_file_is_read(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none").exit_code == 0
    listing = tmp_path / "subjects.txt"
    listing.write_bytes("user-0001\r\nuser-0002\r\n".encode("utf-16"))  # what a Windows editor saves, with a BOM
    result = run("erase", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    assert "2 subjects erased in one batch" in result.output


def test_a_long_subject_is_cut_in_errors(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    err = one_line_error(run("erase", "x" * 5000, "--config", str(root / "tombstone.toml")), 2)
    assert len(err) < 200 and "xxxx...'" in err


def test_a_batch_killed_after_writing_every_receipt_seals_none_and_resume_seals_each(tmp_path):
    """A batch's receipts are signed in chain order and written, then sealed in one transaction: killed in
    between, the chain holds none of them (each saga still running, its file unsealed) and resume seals each."""
    import json
    import signal

    from tombstone.testing.crash import cli

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "3", "--erase", "none").exit_code == 0
    config = str(root / "tombstone.toml")
    listing = tmp_path / "subjects.txt"
    listing.write_text("user-0001\nuser-0002\nuser-0003\n")
    killed = cli("erase", "--subjects-file", str(listing), "--config", config,
                 env={"TOMBSTONE_KILL_AT": "saga:receipt:before-chain#3"})
    assert killed.returncode == -signal.SIGKILL
    files = sorted(p.name for p in (root / "receipts").iterdir())
    assert files == ["user-0001.json", "user-0002.json", "user-0003.json"], "every file written first"
    assert [json.loads((root / "receipts" / f).read_text())["sequence"] for f in files] == [1, 2, 3]
    with Tombstone.open(root / "tombstone.toml") as tomb:
        assert tomb.lineage.chain_head() is None and len(tomb.lineage.sagas("running")) == 3
    resumed = cli("resume", "--config", config)
    assert resumed.returncode == 0, resumed.stderr
    key = str(root / "keys" / "signing.pub")
    for f in files:
        assert cli("receipt", "verify", str(root / "receipts" / f), "--key", key).returncode == 0
    assert cli("receipt", "head", "--config", config).stdout.startswith("3:")


def test_a_receipt_that_cannot_be_written_mid_batch_seals_those_before_it(tmp_path, monkeypatch):
    """Writing the second of three receipts fails: the first is sealed, the other two sagas stay running
    with nothing of theirs in the chain (the third's file not even written), and resume finishes them on the
    same chain."""
    import errno

    from tombstone.errors import SagaError
    from tombstone.saga import engine

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "3", "--erase", "none").exit_code == 0
    real = engine.write_atomic

    attempted = []

    def full_disk(path, data):
        attempted.append(path.name)
        if path.name.startswith("user-0002"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(engine, "write_atomic", full_disk)
    with Tombstone.open(root / "tombstone.toml") as tomb:
        try:
            tomb.erase_many(["user-0001", "user-0002", "user-0003"])
        except SagaError as exc:
            assert "No space left" in str(exc) and "tombstone resume" in str(exc)
        else:
            raise AssertionError("the failed write was not reported")
        head = tomb.lineage.chain_head()
        assert head is not None and head[0] == 1
        assert len(tomb.lineage.sagas("running")) == 2
        # written in chain order (on a thread of their own), none after the one that failed
        assert attempted == ["user-0001.json", "user-0002.json"]
        assert not (root / "receipts" / "user-0003.json").exists()
    monkeypatch.setattr(engine, "write_atomic", real)
    config = str(root / "tombstone.toml")
    assert run("resume", "--config", config).exit_code == 0
    key = str(root / "keys" / "signing.pub")
    for subject in ("user-0001", "user-0002", "user-0003"):
        assert run("receipt", "verify", str(root / "receipts" / f"{subject}.json"), "--key", key).exit_code == 0
    with Tombstone.open(root / "tombstone.toml") as tomb:
        assert tomb.lineage.chain_head()[0] == 3 and not tomb.lineage.sagas("running")


def demo_and_copy(tmp_path):
    """A four-subject demo deployment, a copy of it to erase as the control, and three subjects to erase."""
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "4", "--erase", "none").exit_code == 0
    control = tmp_path / "control"
    shutil.copytree(root, control)
    return root, control, ["user-0001", "user-0002", "user-0003"]


def test_the_physical_probes_matcher_is_built_while_the_levels_below_run(tmp_path, monkeypatch):
    """Each store's verification starts building the physical probe's matcher on a thread of its own before the
    logical probe runs, and the physical probe uses it: after the first logical probe no matcher is built in the
    erasure's own thread. The statuses are those of the same batch without it."""
    import threading

    from tombstone.verify import logical, physical, scanner

    root, control, subjects = demo_and_copy(tmp_path)
    with monkeypatch.context() as m:
        m.delattr(type(physical.STAGE), "prepared")  # the control: no stage prepares anything
        with Tombstone.open(control / "tombstone.toml") as tomb:
            expected = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    events = []
    real_matcher, real_logical = scanner._Matcher, type(logical.STAGE).run

    def building(patterns):
        events.append(("build", threading.current_thread().name))
        return real_matcher(patterns)

    def probing(self, *args, **kwargs):
        events.append(("logical", threading.current_thread().name))
        return real_logical(self, *args, **kwargs)

    monkeypatch.setattr(scanner, "_Matcher", building)
    monkeypatch.setattr(type(logical.STAGE), "run", probing)
    with Tombstone.open(root / "tombstone.toml") as tomb:
        got = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    assert got == expected
    first = events.index(next(e for e in events if e[0] == "logical"))
    assert ("build", "tombstone-scan-prepare") in events[:first]
    main = threading.current_thread().name
    assert ("build", main) not in events[first:], events


def test_each_stores_matcher_is_started_before_its_reclaim_and_used_by_its_probe(tmp_path, monkeypatch):
    """In a batch, each store's physical-probe matcher is started at that store's first step (its snapshot), on
    a thread of its own, so it is built while the snapshots, suppressions, reclaims and logical probes run; a
    reclaim that scans and the probe use it, and no matcher is built in the erasure's own thread. The receipts
    are those of the same batch without it, and nothing of the patterns is kept once the batch is done."""
    import contextlib
    import threading

    from tombstone.saga.engine import Saga
    from tombstone.verify import physical, scanner

    root, control, subjects = demo_and_copy(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(Saga, "_physical_ready", lambda self, store, arts: contextlib.nullcontext())  # the control
        with Tombstone.open(control / "tombstone.toml") as tomb:
            expected = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    events = []
    real_prepare, real_reclaim, real_matcher = scanner.prepare, Saga._reclaim, scanner._Matcher
    real_snapshot = Saga._snapshot

    def snapshotting(self, store, *args, **kwargs):
        events.append(("snapshot", store))
        return real_snapshot(self, store, *args, **kwargs)

    def preparing(patterns):
        events.append(("prepare", len(patterns)))
        return real_prepare(patterns)

    def reclaiming(self, store, *args, **kwargs):
        events.append(("reclaim", store))
        return real_reclaim(self, store, *args, **kwargs)

    def building(patterns):
        events.append(("build", threading.current_thread().name))
        return real_matcher(patterns)

    computed: dict[str, list] = {}
    real_patterns = physical._patterns

    def computing(adapter, arts):
        got = real_patterns(adapter, arts)
        seen = computed.setdefault(adapter.store, [])
        if not any(got[1] is earlier for earlier in seen):  # computed anew, not the kept ones
            seen.append(got[1])
        return got

    monkeypatch.setattr(scanner, "prepare", preparing)
    monkeypatch.setattr(Saga, "_reclaim", reclaiming)
    monkeypatch.setattr(Saga, "_snapshot", snapshotting)
    monkeypatch.setattr(scanner, "_Matcher", building)
    monkeypatch.setattr(physical, "_patterns", computing)
    with Tombstone.open(root / "tombstone.toml") as tomb:
        got = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    assert got == expected
    # each store's patterns are computed once, at its snapshot, though other stores' come in between
    assert len(computed) >= 3 and {store: len(seen) for store, seen in computed.items()} == dict.fromkeys(computed, 1)
    snapshots = [i for i, e in enumerate(events) if e[0] == "snapshot"]
    reclaims = [i for i, e in enumerate(events) if e[0] == "reclaim"]
    assert len(snapshots) >= 3 and len(reclaims) >= 3
    prepared = [i for i in snapshots if any(e[0] == "prepare" for e in events[i - 2 : i])]
    assert len(prepared) >= 3, events  # the stores with a physical probe: prepared just before their snapshot
    assert max(prepared) < min(reclaims), events  # so every one of them before the first reclaim
    assert not [i for i in reclaims if any(e[0] == "prepare" for e in events[i - 2 : i])], events  # not again
    assert not [e for e in events if e == ("build", threading.current_thread().name)], events
    assert physical._last.patterns is None and scanner.kept() == 0


def test_a_batch_records_its_new_sagas_in_one_transaction_and_reads_back_what_it_journaled(tmp_path, monkeypatch):
    """The batch's new sagas are recorded together (one commit, under the receipt-names lock until then): a
    failure while recording them records none. What a saga reads back of the steps it journaled itself comes
    from memory, and is what the journal gives back."""
    import pytest

    from tombstone.saga import Saga, run_batch
    from tombstone.saga.engine import create_deferred

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "4", "--erase", "none").exit_code == 0
    subjects = ["user-0001", "user-0002", "user-0003"]
    with Tombstone.open(root / "tombstone.toml") as tomb:
        ctx, lineage = tomb.context, tomb.lineage
        sagas = [Saga.start(ctx, s, defer_create=True) for s in subjects]
        assert lineage.sagas("running") == []  # not recorded until create_deferred
        real, made = lineage.create_saga, []

        def failing_third(*args, **kwargs):
            made.append(args[0])
            if len(made) == 3:
                raise OSError("disk full")
            return real(*args, **kwargs)

        monkeypatch.setattr(lineage, "create_saga", failing_third)
        with pytest.raises(OSError):
            create_deferred(ctx, sagas)
        assert len(made) == 3 and lineage.sagas("running") == []  # the first two were rolled back with it
        assert all(s._creation is not None for s in sagas)
        monkeypatch.setattr(lineage, "create_saga", real)

        commits = []
        lineage._conn.set_trace_callback(lambda sql: commits.append(sql) if sql.strip() == "COMMIT" else None)
        create_deferred(ctx, sagas)
        lineage._conn.set_trace_callback(None)
        assert len(commits) == 1, commits
        running = {row["saga_id"]: row["out_path"] for row in lineage.sagas("running")}
        assert running == {s.saga_id: s.out_path for s in sagas}
        assert len(set(running.values())) == 3
        with lineage.receipt_names_lock(wait=0):  # released: another process could take it now
            pass

        results = run_batch(sagas)
        assert [r["subject"] for r, _ in results] == subjects
        checked = 0
        for saga in sagas:
            assert saga._ended  # every step's result came from memory
            for (step, target), detail in saga._ended.items():
                assert lineage.step_result(saga.saga_id, step, target) == detail, (step, target)
                checked += 1
        assert checked >= 3 * 4  # plan, and snapshot/suppress/reclaim/verify of each store


def test_the_cycle_collector_is_held_off_while_sagas_run_and_restored_after(tmp_path, monkeypatch):
    """A batch runs with Python's cycle collector off and leaves it as it found it: on after a batch that
    succeeded or failed, off where the application had switched it off, and on only once the last of two
    overlapping runs is out."""
    import gc
    import threading

    import pytest

    from tombstone.gcpause import collector_paused
    from tombstone_adapters.chroma.adapter import ChromaAdapter

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "4", "--erase", "none").exit_code == 0
    seen = []
    real = ChromaAdapter.reclaim

    def watching(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ChromaAdapter, "reclaim", watching)
    assert gc.isenabled()
    with Tombstone.open(root / "tombstone.toml") as tomb:
        tomb.erase_many(["user-0001", "user-0002"])
        assert seen and not any(seen) and gc.isenabled()  # one reclaim per Chroma store of the demo
        seen.clear()

        def failing(self, *args, **kwargs):
            seen.append(gc.isenabled())
            raise OSError("disk full")

        monkeypatch.setattr(ChromaAdapter, "reclaim", failing)
        with pytest.raises(Exception):
            tomb.erase("user-0003")
        assert seen == [False] and gc.isenabled()

        gc.disable()
        try:
            monkeypatch.setattr(ChromaAdapter, "reclaim", watching)
            tomb.resume()
            assert len(seen) > 1 and not any(seen) and not gc.isenabled()  # the application's choice stands
        finally:
            gc.enable()

    inside, release = threading.Event(), threading.Event()

    def other_run():
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other_run)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other run is still inside
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_batchs_receipts_take_the_receipt_names_lock_once(tmp_path, monkeypatch):
    """Every saga of a batch confirms its receipt file under the receipt-names lock; the batch takes the file
    lock once for all of them, not once per saga."""
    from tombstone.lineage.locks import FileLock

    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "6", "--erase", "none").exit_code == 0
    taken = []
    real = FileLock.try_acquire

    def counting(self):
        got = real(self)
        if got and self.path.name == "receipt-names.lock":
            taken.append(self.path)
        return got

    monkeypatch.setattr(FileLock, "try_acquire", counting)
    subjects = [f"user-{n:04d}" for n in range(1, 6)]
    with Tombstone.open(root / "tombstone.toml") as tomb:
        results = tomb.erase_many(subjects)
    assert [r["subject"] for r, _ in results] == subjects
    assert all(path.exists() for _, path in results)
    # once to record the new sagas, once for their receipts
    assert len(taken) == 2, taken


def test_a_batch_reads_each_subjects_lineage_once(tmp_path, monkeypatch):
    """A batch reads each subject's lineage closure once (for its stores' preflight and its plan) and runs on
    the records it planned, not read again; the receipts are those of a batch that reads every plan back."""
    from tombstone.lineage.db import LineageDB
    from tombstone.saga.engine import Saga

    root, control, subjects = demo_and_copy(tmp_path)
    real_plan, reread = Saga._plan, []

    def from_the_journal(self):  # the control: the planned records dropped, the plan read back
        reread.append(self._planned is not None)
        self._planned = None
        return real_plan(self)

    with monkeypatch.context() as m:
        m.setattr(Saga, "_plan", from_the_journal)
        with Tombstone.open(control / "tombstone.toml") as tomb:
            expected = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    assert reread == [True] * len(subjects)  # the batch had its plans' records, and the control dropped them
    reads = {"closure": 0, "plan read back": 0}
    real_closure = LineageDB.closure

    def closure(self, *args, **kwargs):
        reads["closure"] += 1
        return real_closure(self, *args, **kwargs)

    def planning(self):
        many = self.lineage.artifacts_many

        def counting(*args, **kwargs):
            reads["plan read back"] += 1
            return many(*args, **kwargs)

        self.lineage.artifacts_many = counting
        try:
            return real_plan(self)
        finally:
            del self.lineage.artifacts_many

    monkeypatch.setattr(LineageDB, "closure", closure)
    monkeypatch.setattr(Saga, "_plan", planning)
    with Tombstone.open(root / "tombstone.toml") as tomb:
        got = [statuses(r) for r, _ in tomb.erase_many(subjects)]
    assert got == expected
    assert reads == {"closure": len(subjects), "plan read back": 0}, reads
