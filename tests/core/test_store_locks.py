"""Per-store locks, with real processes on real stores: erasures and app writes on one store take turns.

Each test builds a small deployment of one backend (plus a scratch docstore for the caches' sources), then
runs ``tombstone erase`` processes — the first paused inside its reclaim, where it holds the store's lock
in the middle of the backend's rewrite — next to a second erasure, an app process writing through the
wrapper in a loop, or a wrapper write in this process. Afterwards the store is read with the vendor's
client (``Adapter.read_survivors``), independently of the adapters' probes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tombstone import Tombstone, init_deployment
from tombstone.config import load_config
from tombstone.contract import adapter_class
from tombstone.receipt.model import Receipt
from tombstone.verify.levels import StatusKind

HERE = Path(__file__).resolve().parent
SUBJECTS = ["user-0001", "user-0002", "user-0003"]
WRITER_SUBJECT = "app-writer"
LLM = "writer-llm"
BACKENDS = ["docstore", "chroma", "faiss", "qdrant", "exact_cache", "semantic_cache", "pgvector"]
PAUSE_SECONDS = 2.5
# A point inside each backend's reclaim, reached while the erasure holds the store's lock (for Chroma,
# the semantic cache: between the secure deletion of the rows and the HNSW slots; Qdrant: after its delete).
PAUSE_IN_RECLAIM = {
    "docstore": "reclaim:docstore:after-delete",
    "chroma": "reclaim:chroma:rows-deleted",
    "semantic_cache": "reclaim:chroma:rows-deleted",
    "faiss": "reclaim:faiss:zeroed-in-memory",
    "qdrant": "reclaim:qdrant:after-delete",
    "exact_cache": "reclaim:exact_cache:after-delete",
    "pgvector": "reclaim:pgvector:after-delete",
}


@pytest.fixture(scope="module")
def pg_dsn(tmp_path_factory):
    """A real PostgreSQL with pgvector (the embedded server unless TOMBSTONE_TEST_PG_DSN is set), reached by
    every process of a test through the DSN."""
    from tombstone_adapters.pgvector.server import embedded_dsn

    return os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path_factory.mktemp("pg") / "data")


def release_clients() -> None:
    """Let go of what this process holds open on the stores (local mode lets one process at a time in)."""
    if "tombstone_adapters.qdrant.local" in sys.modules:
        sys.modules["tombstone_adapters.qdrant.local"].close_local_clients()
    if "chromadb" in sys.modules:
        sys.modules["chromadb"].api.client.SharedSystemClient.clear_system_cache()


def build(root: Path, backend: str, request) -> Path:
    """A deployment with one store of ``backend`` (named after it) filled with SUBJECTS' demo data."""
    from tombstone.demo import DemoKit, fill, fill_order

    kit = DemoKit(root=root)
    cls = adapter_class(backend)
    stores: dict[str, Any] = {}
    if cls.demo_role == "answers":
        stores["docstore"] = adapter_class("docstore").demo_store(kit)
    if backend == "pgvector":
        stores[backend] = {"backend": "pgvector", "dsn": request.getfixturevalue("pg_dsn"),
                           "table": f"chunks_{uuid.uuid4().hex[:10]}"}
    else:
        stores[backend] = cls.demo_store(kit)
    config = init_deployment(root, stores)
    with Tombstone(config) as tomb:
        kit.tomb = tomb
        for store in fill_order(tomb, list(stores)):
            fill(tomb, store, SUBJECTS, kit=kit)
    release_clients()
    return Path(config.path)


def stored_ids(config: Path, backend: str) -> set[str]:
    """Every record the store holds, read with the vendor's client (not the adapter)."""
    options = load_config(config).stores[backend].options
    survivors = adapter_class(backend).read_survivors(options)
    release_clients()
    if isinstance(survivors, tuple) and isinstance(survivors[0], dict):
        return set(survivors[0])
    return {row[0] for row in survivors}


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]), **extra}


def erase(config: Path, subject: str, *, pause_at: str | None = None, points: Path | None = None) -> subprocess.Popen:
    extra = {}
    if pause_at:
        extra = {"TOMBSTONE_PAUSE_AT": f"{pause_at}={PAUSE_SECONDS}", "TOMBSTONE_LIST_KILL_POINTS": str(points)}
    return subprocess.Popen([sys.executable, "-m", "tombstone", "erase", subject, "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(**extra))


def wait_for(condition: Callable[[], bool], what: str, *procs: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"a process ended (exit {proc.returncode}) while waiting for {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def paused(points: Path, name: str) -> Callable[[], bool]:
    return lambda: points.exists() and any(line.split("#")[0] == name for line in points.read_text().split())


def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    return out, err


def erased_ids(config: Path, subject: str, backend: str) -> set[str]:
    """The subject's artifacts in ``backend``'s store, each of which the receipt must say is VERIFIED."""
    receipt = Receipt.parse(json.loads((load_config(config).receipts_dir / f"{subject}.json").read_text()))
    mine = [a for a in receipt.artifacts if a.store == backend]
    assert mine, f"the receipt of {subject} names nothing in {backend}"
    assert all(a.status is StatusKind.VERIFIED for a in receipt.artifacts), \
        [a.status_text for a in receipt.artifacts if a.status is not StatusKind.VERIFIED]
    return {a.artifact_id for a in mine}


# -- the app's writes, as an app makes them ---------------------------------------------------------


def make_writer(config: Path, tomb: Tombstone, backend: str, closing: contextlib.ExitStack) -> Callable[[str, str], str]:
    """``write(key, text)`` through ``backend``'s wrapper for WRITER_SUBJECT; returns the record's id. What
    it opens is closed with ``closing``."""
    from tombstone.demo import DemoKit

    options = tomb.config.stores[backend].options
    embedder = DemoKit(root=config.parent).embedder()
    common = {"lineage": tomb.lineage, "store": backend}
    if backend == "docstore":
        from tombstone_adapters.docstore import DocStore

        docs = DocStore(options["path"], **common)
        closing.callback(docs.close)
        return lambda key, text: docs.add(key, text, subject=WRITER_SUBJECT) or key
    if backend == "chroma":
        import chromadb

        from tombstone_adapters.chroma import TombstoneCollection

        chunks = TombstoneCollection(chromadb.PersistentClient(path=options["path"]).get_collection(options["collection"]),
                                     embedder=embedder, **common)
        return lambda key, text: chunks.add(ids=[key], documents=[text], subject=WRITER_SUBJECT) or key
    if backend == "faiss":
        from tombstone_adapters.faiss import FaissStore

        index = FaissStore(options["path"], embedder=embedder, **common)
        return lambda key, text: index.add([key], documents=[text], subject=WRITER_SUBJECT) or key
    if backend == "qdrant":
        from tombstone_adapters.qdrant import TombstoneQdrant, local_client

        points = TombstoneQdrant(local_client(options["path"]), options["collection"], embedder=embedder, **common)
        return lambda key, text: points.upsert([key], documents=[text], subject=WRITER_SUBJECT) or key
    if backend == "pgvector":
        import psycopg

        from tombstone_adapters.pgvector import PgVectorStore

        conn = psycopg.connect(options["dsn"], autocommit=True)
        closing.callback(conn.close)
        rows = PgVectorStore(conn, options["table"], embedder=embedder, **common)
        return lambda key, text: rows.add([key], documents=[text], subject=WRITER_SUBJECT) or key
    from langchain_core.outputs import Generation

    from tombstone_adapters.caches import attribution

    if backend == "exact_cache":
        from tombstone_adapters.caches.exact import TombstoneSQLiteCache, entry_id

        cache = TombstoneSQLiteCache(options["path"], **common)
        closing.callback(cache.engine.dispose)
    else:
        import chromadb

        from tombstone_adapters.caches.semantic import TombstoneSemanticCache, entry_id

        cache = TombstoneSemanticCache(chromadb.PersistentClient(path=options["path"]).get_collection(
            options["collection"]), embedder=embedder, **common)

    def cached(key: str, text: str) -> str:
        with attribution(WRITER_SUBJECT):
            cache.update(key, LLM, [Generation(text=text)])
        return entry_id(key, LLM)

    return cached


def writer_main(config: str, backend: str, acked: str, stop: str) -> None:
    """The app process: writes one record at a time until ``stop`` exists; a line in ``acked`` for each
    write the wrapper acknowledged (returned from), with the time."""
    with Tombstone(load_config(config)) as tomb, open(acked, "a", encoding="utf-8") as out, \
            contextlib.ExitStack() as closing:
        write = make_writer(Path(config), tomb, backend, closing)
        n = 0
        while not os.path.exists(stop):
            key = f"writer-rec-{n:05d}-{uuid.uuid4().hex[:12]}"
            aid = write(key, f"record {n} written by the app while an erasure runs, about topic {n % 7}")
            out.write(f"{aid} {time.time():.3f}\n")
            out.flush()
            n += 1


def holder_main(config: str, backend: str, held: str, release: str, released: str) -> None:
    """Holds the store's lock the way a saga step does (``Adapter.store_lock``) until ``release`` exists."""
    with Tombstone(load_config(config)) as tomb:
        with tomb.adapter(backend).store_lock():
            Path(held).touch()
            while not os.path.exists(release):
                time.sleep(0.02)
            Path(released).write_text(f"{time.time():.6f}")


def run_helper(name: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys, test_store_locks as t; t.{name}(*sys.argv[1:])",
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())


def acked(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    return {aid: float(at) for aid, at in (line.split() for line in path.read_text().splitlines() if line.strip())}


# -- the tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_erasures_of_different_subjects_at_once_both_end_verified(backend, tmp_path, request):
    config = build(tmp_path / "d", backend, request)
    before = stored_ids(config, backend)
    points = tmp_path / "points"
    first = erase(config, "user-0001", pause_at=PAUSE_IN_RECLAIM[backend], points=points)
    wait_for(paused(points, PAUSE_IN_RECLAIM[backend]), "the first erasure to pause inside its reclaim", first)
    second = erase(config, "user-0002")  # starts while the first holds the store mid-reclaim
    try:
        finished(second)
    finally:
        finished(first)  # waited for whatever the second did: no process or pipe outlives the test
    gone = erased_ids(config, "user-0001", backend) | erased_ids(config, "user-0002", backend)
    after = stored_ids(config, backend)
    assert not gone & after, "an erased record is back in the store"
    assert after == before - gone, "a record of another subject was lost"


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_acknowledged_during_an_erasure_are_kept(backend, tmp_path, request):
    config = build(tmp_path / "d", backend, request)
    before = stored_ids(config, backend)
    log, stop, points = tmp_path / "acked", tmp_path / "stop", tmp_path / "points"
    writer = run_helper("writer_main", config, backend, log, stop)
    try:
        wait_for(lambda: len(acked(log)) >= 3, "the app's first writes", writer)
        started = time.time()
        eraser = erase(config, "user-0001", pause_at=PAUSE_IN_RECLAIM[backend], points=points)
        finished(eraser)
        ended = time.time()
        count = len(acked(log))
        wait_for(lambda: len(acked(log)) >= count + 2, "the app's writes after the erasure", writer)
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, f"{out}\n{err}"
    written = acked(log)
    assert any(started <= at <= ended for at in written.values()), "no write was acknowledged during the erasure"
    gone = erased_ids(config, "user-0001", backend)
    after = stored_ids(config, backend)
    assert set(written) <= after, f"acknowledged writes lost: {sorted(set(written) - after)[:5]}"
    assert not gone & after, "an erased record is still in the store"
    assert after == (before - gone) | set(written)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrapper_write_waits_while_a_saga_step_holds_the_store(backend, tmp_path, request):
    config = build(tmp_path / "d", backend, request)
    held, release, released = tmp_path / "held", tmp_path / "release", tmp_path / "released"
    holder = run_helper("holder_main", config, backend, held, release, released)
    done: dict[str, Any] = {}
    try:
        wait_for(held.exists, "the store's lock to be taken", holder)

        def app_write() -> None:
            try:  # opening the wrapper may itself wait (a FAISS store loads, a Qdrant directory opens)
                with Tombstone(load_config(config)) as tomb, contextlib.ExitStack() as closing:
                    write = make_writer(config, tomb, backend, closing)
                    done["id"] = write(f"writer-rec-waiting-{uuid.uuid4().hex[:12]}", "a record written while"
                                       " an erasure step holds the store")
                    done["at"] = time.time()
            except BaseException as exc:  # reported below
                done["error"] = exc

        thread = threading.Thread(target=app_write)
        thread.start()
        thread.join(1.5)
        assert thread.is_alive(), f"the write did not wait for the store's lock: {done}"
        release.touch()
        thread.join(120)
        assert not thread.is_alive()
        release_clients()
    finally:
        release.touch()
        out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, f"{out}\n{err}"
    assert "error" not in done, done.get("error")
    assert done["at"] >= float(released.read_text()), "the write went through before the lock was released"
    assert done["id"] in stored_ids(config, backend)


def test_a_failed_faiss_load_leaves_the_store_on_the_generation_it_holds(tmp_path):
    """A handle that fails to load a newer generation (here: its index file unreadable for a moment) must not
    believe it is on that generation: its next commit would be built from the older sidecar and drop the
    records the newer generation added."""
    from tombstone.errors import StoreUnavailableError
    from tombstone_adapters.faiss import FaissStore

    directory = tmp_path / "faiss"
    mine = FaissStore(directory, dim=8)
    mine.add(["mine-rec-0001-aaaaaaaa"], embeddings=np.full((1, 8), 0.1, dtype=np.float32))
    other = subprocess.run([sys.executable, "-c", "import sys, numpy as np\n"
                            "from tombstone_adapters.faiss import FaissStore\n"
                            "FaissStore(sys.argv[1]).add(['other-rec-0002-bbbbbbbb'],"
                            " embeddings=np.full((1, 8), 0.2, dtype=np.float32))", str(directory)],
                           capture_output=True, text=True, env=env(), timeout=120)
    assert other.returncode == 0, other.stderr
    newest = json.loads((directory / "CURRENT").read_text())["generation"]
    index = directory / f"index-{newest:06d}.faiss"
    intact = index.read_bytes()
    index.write_bytes(b"not an index")
    with pytest.raises(StoreUnavailableError):
        mine.refresh()
    index.write_bytes(intact)
    mine.add(["mine-rec-0003-cccccccc"], embeddings=np.full((1, 8), 0.3, dtype=np.float32))
    assert set(FaissStore(directory, create=False).get()) == {
        "mine-rec-0001-aaaaaaaa", "other-rec-0002-bbbbbbbb", "mine-rec-0003-cccccccc"}
