"""Kill trials for the embedded PostgreSQL: the server dies with SIGKILL while the pgvector reclaim runs one
of its statements (VACUUM FULL, which writes the table and builds its HNSW index anew, and the ANALYZE that
rebuilds the statistics), is
started again the way a user would (by ``tombstone resume``, which starts the embedded server), and the
erasure is finished. Used by ``tests/faults/test_pg_kill.py`` and ``benchmarks/faults_pg.py``.

Catching the statement is an event, never a sleep: the trial holds the table's store lock until the erasure
process is seen waiting for it (so the adapter is open and its ``ALTER TABLE`` done), then takes in a second
session a lock that the chosen statement, and none before it, must wait for, lets the erasure go, and kills
once ``pg_stat_activity`` shows that statement waiting. The postmaster's pid comes from ``postmaster.pid``
and is checked to be the parent of that backend, a postgres running in this data directory.

Victims: ``host`` (the postmaster and the erasing process together, as when the machine dies), ``postmaster``
(the server alone; the erasing process carries on with its retries) and ``backend`` (the statement's server
process alone; the postmaster resets the others and recovers by itself).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DIM = 32
SUBJECTS = ("alice", "bob", "carol", "dave", "erin")
VICTIM = "alice"
ROWS = 12
TABLE = "chunks"
STATEMENTS = {
    # statement prefix, the blocker's SQL (in an open transaction)
    "vacuum_full": ("VACUUM FULL", f"LOCK TABLE {TABLE} IN ACCESS SHARE MODE"),
    # ANALYZE opens pg_statistic_ext for writing after it wrote pg_statistic (VACUUM FULL writes
    # pg_statistic too, but not pg_statistic_ext): killed there, its new statistics are not committed.
    "analyze": ("ANALYZE", "LOCK TABLE pg_statistic_ext IN SHARE MODE"),
}
WAIT = 120.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tombstone", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def build(root: Path) -> dict[str, Any]:
    """A deployment with one pgvector table on an embedded server, five subjects of ``ROWS`` rows; the
    server stopped again. Returns its paths and every row's vector (as text) by id."""
    import psycopg

    from tombstone import Tombstone, init_deployment
    from tombstone.capture import HashingEmbedder

    from .server import embedded_dsn, stop_embedded
    from .store import PgVectorStore

    config = init_deployment(root / "deploy", {"pg": {"backend": "pgvector", "data_dir": "stores/pgvector/pgdata",
                                                      "table": TABLE}})
    data = Path(config.stores["pg"].options["data_dir"])
    with Tombstone(config) as tomb, psycopg.connect(embedded_dsn(data), autocommit=True) as conn:
        table = PgVectorStore(conn, TABLE, dim=DIM, lineage=tomb.lineage, store="pg", embedder=HashingEmbedder(DIM))
        for subject in SUBJECTS:
            table.add([f"{subject}-row-{i:03d}" for i in range(ROWS)],
                      documents=[f"{subject} wrote note {i} about invoice {1000 + i}" for i in range(ROWS)],
                      subject=subject)
        rows = dict(conn.execute(f"SELECT id, embedding::text FROM {TABLE}").fetchall())
    stop_embedded(data)
    return {"config": config.path, "data": data, "rows": rows}


def _activity(conn, like: str, exclude: set[int]) -> list[tuple]:
    rows = conn.execute("SELECT pid, state, wait_event_type, query FROM pg_stat_activity WHERE query ILIKE %s",
                        (like,)).fetchall()
    return [r for r in rows if r[0] not in exclude]


def _wait_for(what: str, check, erase: subprocess.Popen) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        found = check()
        if found:
            return found
        if erase.poll() is not None:
            raise RuntimeError(f"the erasure ended (rc {erase.returncode}) before {what}:"
                               f" {erase.stderr.read()[-800:] if erase.stderr else ''}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _postmaster_of(backend: int, data: Path) -> int:
    """The postmaster's pid, read from postmaster.pid and checked: a postgres in ``data`` whose child is
    ``backend``."""
    import psutil

    pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    proc = psutil.Process(pid)
    if proc.name() != "postgres" or os.path.realpath(proc.cwd()) != os.path.realpath(data):
        raise RuntimeError(f"postmaster.pid names pid {pid}, which is not the server on {data}")
    if psutil.Process(backend).ppid() != pid:
        raise RuntimeError(f"backend {backend} is not a child of postmaster {pid}")
    return pid


def _leaks(conn, data: Path, artifact_ids: list[str], rows: dict[str, str]) -> dict[str, list[str]]:
    """Per artifact id: where its id or vector bytes are, read independently of Tombstone's probes: the
    table's current relation files (heap, TOAST, every index), the files in the database's folder that no
    relation owns (a statement killed mid-write leaves its new files there), and the planner statistics."""
    import numpy as np

    conn.execute("CHECKPOINT")
    current = conn.execute(
        "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid = %s::regclass"
        " OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)"
        " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass"
        "   OR indrelid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass))",
        (TABLE,) * 4).fetchall()
    folder = conn.execute("SELECT 'base/' || oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
    owned = {Path(p).name for (p,) in conn.execute("SELECT pg_relation_filepath(oid) FROM pg_class"
                                                   " WHERE pg_relation_filepath(oid) IS NOT NULL").fetchall()}
    files: dict[str, bytes] = {}
    for name, path in current:
        if path:
            files[name] = b"".join(Path(data, p).read_bytes() for p in Path(data).glob(f"{path}*")
                                   if p.name.split(".")[0] == Path(path).name and "_" not in p.name)
    for path in sorted(Path(data, folder).iterdir()):
        stem = path.name.split("_")[0].split(".")[0]
        if stem.isdigit() and stem not in owned:
            files[f"orphan {folder}/{path.name}"] = path.read_bytes()
    stats = " ".join(v for (v,) in conn.execute(
        "SELECT coalesce(most_common_vals::text, '') || coalesce(histogram_bounds::text, '') FROM pg_stats"
        " WHERE tablename = %s", (TABLE,)).fetchall())
    out = {}
    for aid in artifact_ids:
        vector = np.asarray(json.loads(rows[aid]), dtype=np.float32).tobytes()
        where = [name for name, blob in files.items() if aid.encode() in blob or vector in blob]
        if aid in stats:
            where.append("pg_stats")
        out[aid] = where
    return out


def trial(root: Path, statement: str, victim: str = "host") -> dict[str, Any]:
    """One trial: build, erase ``VICTIM`` while ``statement`` (a key of STATEMENTS) is killed by ``victim``,
    restart, resume; measure. Returns the benchmark's keys and, for the tests, what each process said.
    ``finished_on_resume``: the saga is done once ``tombstone resume`` has run (where the erasing process
    survived the kill it may have finished the saga itself; the resume then finds nothing to do)."""
    import psutil
    import psycopg

    from tombstone import Tombstone
    from tombstone.config import load_config

    from .server import embedded_dsn, stop_embedded
    from .store import lock_table, unlock_table

    built = build(root)
    config, data, rows = str(built["config"]), built["data"], built["rows"]
    prefix, blocker_sql = STATEMENTS[statement]
    out: dict[str, Any] = {"statement": statement, "victim": victim}
    try:
        dsn = embedded_dsn(data)
        holder = psycopg.connect(dsn, autocommit=True)
        blocker = psycopg.connect(dsn)
        ours = {holder.info.backend_pid, blocker.info.backend_pid}
        # Control: before the erasure, the independent reading finds every erased row's bytes.
        out["leaks_before"] = _leaks(holder, data, [aid for aid in rows if aid.startswith(f"{VICTIM}-")], rows)
        lock_table(holder, TABLE, store="pg", wait=10)
        erase = subprocess.Popen(_cli("erase", VICTIM, "--config", config), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_env())
        try:
            _wait_for("the erasure waits for the store lock",
                      lambda: _activity(holder, "%pg_try_advisory_lock%", ours), erase)
            blocker.execute(blocker_sql)  # its transaction stays open: the lock is held until the kill
            unlock_table(holder, TABLE)
            waiting = _wait_for(f"{prefix} waits in pg_stat_activity", lambda: [
                r for r in _activity(holder, f"{prefix}%", ours) if r[1] == "active" and r[2] == "Lock"], erase)
            backend = waiting[0][0]
            postmaster = _postmaster_of(backend, data)
            out["killed_statement"] = waiting[0][3]
            if victim == "host":
                erase.kill()
                os.kill(postmaster, signal.SIGKILL)
            elif victim == "postmaster":
                os.kill(postmaster, signal.SIGKILL)
            else:
                os.kill(backend, signal.SIGKILL)
            killed_at = time.monotonic()
            psutil.wait_procs([p for p in (psutil.Process(postmaster),) if victim != "backend"], timeout=60)
            erase_out, erase_err = erase.communicate(timeout=600)
        except BaseException:
            if erase.poll() is None:
                erase.kill()
                erase.communicate()
            raise
        finally:
            for conn in (holder, blocker):
                try:
                    conn.close()
                except psycopg.Error:
                    pass
        out.update(erase_rc=erase.returncode, erase_stdout=erase_out, erase_stderr=erase_err)
        erase_ended = restarted = time.monotonic()
        resumed = subprocess.run(_cli("resume", "--config", config), capture_output=True, text=True, env=_env(),
                                 timeout=600)
        out.update(resume_rc=resumed.returncode, resume_stdout=resumed.stdout, resume_stderr=resumed.stderr)
        # host: from the restart (resume starts the server) to the saga finished or dead-lettered; postmaster
        # and backend: the erasing process lives on, so from the kill to the end of the erasure, or of the
        # resume when the erasure left work for it.
        finished_at = time.monotonic()
        if victim == "host":
            out["recovery_s"] = finished_at - restarted
        else:
            out["recovery_s"] = (erase_ended if erase.returncode == 0 else finished_at) - killed_at

        with Tombstone(load_config(config)) as tomb:
            sagas = [s for s in tomb.lineage.sagas() if s["subject"] == VICTIM]
            letters = [d for d in tomb.lineage.dead_letters(state=None) if d["saga_id"] in {s["saga_id"] for s in sagas}]
        out["saga_states"] = [s["state"] for s in sagas]
        out["dead_letters"] = [d["error"] for d in letters]
        receipt_path = Path(config).parent / "receipts" / f"{VICTIM}.json"
        receipt = json.loads(receipt_path.read_text()) if receipt_path.exists() else None
        out["statuses"] = {a["artifact_id"]: (a["status"], a["level"]) for a in receipt["artifacts"]} if receipt else {}
        out["reasons"] = sorted({a.get("reason") or "" for a in receipt["artifacts"]}) if receipt else []
        erased = [aid for aid in rows if aid.startswith(f"{VICTIM}-")]
        with psycopg.connect(embedded_dsn(data), autocommit=True) as conn:
            after = dict(conn.execute(f"SELECT id, embedding::text FROM {TABLE}").fetchall())
            leaks = _leaks(conn, data, erased, rows)
        out["leaks"] = {aid: where for aid, where in leaks.items() if where}
        survivors = {aid: vec for aid, vec in rows.items() if aid not in erased}
        out["survivors_lost"] = sum(after.get(aid) != vec for aid, vec in survivors.items())
        out["false_verified"] = sum(1 for aid, (status, _) in out["statuses"].items()
                                    if status == "VERIFIED" and leaks.get(aid))
        out["finished_on_resume"] = bool(sagas) and all(s == "done" for s in out["saga_states"]) and receipt is not None
        out["dead_lettered"] = bool(letters)
        return out
    finally:
        stop_embedded(data)


def cell(statement: str, victim: str = "host"):
    """A benchmark cell: one trial in a fresh folder, reduced to the numbers the benchmark keeps."""
    def run(root: Path) -> dict:
        result = trial(root, statement, victim)
        return {key: result[key] for key in ("survivors_lost", "false_verified", "finished_on_resume",
                                             "dead_lettered", "recovery_s")}

    return run
