"""Survivor census and the two processes of the concurrent-writer fault cells.

A *census* reads a store through its own client only (no Tombstone code in the read path, except FAISS,
whose store class is its client): every record's id and vector. ``survivors_lost`` compares two censuses
and asks the store, by each survivor's own vector, whether it is still found.

Run as a script it is one of the cell's processes (the test starts them; they signal through files in a
folder, so nothing waits on a timer):

- ``write CONFIG STORE wrapper|raw DIR``: writes new subjects, one write after another, until ``DIR/stop``
  appears, numbering each try in ``DIR/begin`` before it and ``DIR/end`` after it. Each write that
  returned is appended to ``DIR/written.jsonl`` (ids and vectors); a write that raised to ``DIR/errors.txt``
  (and is tried again, as an app would).
- ``erase CONFIG SUBJECT DIR``: ``tombstone erase``, with the pause point that ``TOMBSTONE_PAUSE_AT`` names
  (a point inside the reclaim, under the store's lock) turned into a rendezvous: it creates
  ``DIR/in-reclaim`` and waits there until a write of the writer is under way (begun, not ended), then
  records it in ``DIR/attempt`` and goes on: that write runs, or waits, while the reclaim holds the store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ERASED = "user-0001"
VECTOR_BACKENDS = ("chroma", "faiss", "qdrant", "pgvector")
PAUSE_POINTS = {  # a point each backend's reclaim reaches holding the store's lock
    "chroma": "reclaim:chroma:rows-deleted",
    "faiss": "reclaim:faiss:zeroed-on-disk",
    "qdrant": "reclaim:qdrant:after-delete",
    "pgvector": "reclaim:pgvector:after-delete",
}
RENDEZVOUS_WAIT = 60.0


# -- building a deployment ---------------------------------------------------------------------


def build(root: Path, backends: list[str], subjects: int = 4) -> Path:
    """A deployment at ``root`` with each backend's demo store (and what it is built from), filled with
    ``subjects`` demo subjects through the wrappers, embedded with the offline hashing embedder."""
    from tombstone import Tombstone, init_deployment
    from tombstone.contract import adapter_class
    from tombstone.demo import DemoKit, fill, fill_order, subject_name, with_needed

    names, _ = with_needed(backends)
    kit = DemoKit(root=root)
    stores = {name: adapter_class(name).demo_store(kit) for name in names}
    config = init_deployment(root, stores)
    refs = [subject_name(i) for i in range(1, subjects + 1)]
    with Tombstone(config) as tomb:
        kit.tomb = tomb
        for name in fill_order(tomb, names):
            fill(tomb, name, refs, kit=kit)
    release(root / "tombstone.toml")
    return root / "tombstone.toml"


def release(config_path: Path) -> None:
    """Let go of what this process holds of the deployment's stores: Qdrant's folder lock, and the embedded
    PostgreSQL servers it started or joined (each stops once no live process uses it)."""
    from tombstone.config import load_config
    from tombstone_adapters.qdrant.local import close_local_clients

    close_local_clients()
    for cfg in load_config(config_path).stores.values():
        if cfg.backend == "pgvector" and cfg.options.get("data_dir"):
            from tombstone_adapters.pgvector.server import stop_embedded

            stop_embedded(cfg.options["data_dir"])


def options(config_path: Path, store: str) -> dict[str, Any]:
    from tombstone.config import load_config

    return dict(load_config(config_path).stores[store].options)


def embed_dim() -> int:
    from tombstone.demo import EMBEDDING_DIM

    return EMBEDDING_DIM


# -- census ------------------------------------------------------------------------------------


def census(config_path: Path, store: str) -> dict[str, np.ndarray]:
    """Every record the store holds: id -> vector (float32), read through the store's own client."""
    return _reader(config_path, store)(None)


def found_by_own_vector(config_path: Path, store: str, records: dict[str, np.ndarray], k: int = 5) -> set[str]:
    """The ids among ``records`` that a search with their own vector returns in its first ``k``."""
    if not records:
        return set()
    return _reader(config_path, store)((list(records), np.stack(list(records.values())), k))


def _reader(config_path: Path, store: str):
    backend = store
    opts = options(config_path, store)
    return {"chroma": _chroma, "faiss": _faiss, "qdrant": _qdrant, "pgvector": _pgvector}[backend](opts)


def _found(ids: list[str], hits: list[list[str]]) -> set[str]:
    return {i for i, row in zip(ids, hits) if i in row}


def _chroma(opts):
    def read(search):
        import chromadb

        with tempfile.TemporaryDirectory(prefix="census-chroma-") as tmp:
            copy = Path(tmp) / "copy"
            shutil.copytree(opts["path"], copy)
            client = chromadb.PersistentClient(path=str(copy))
            try:
                col = client.get_collection(opts["collection"])
                if search is None:
                    got = col.get(include=["embeddings"])
                    return {i: np.asarray(v, np.float32) for i, v in zip(got["ids"], got["embeddings"])}
                ids, vecs, k = search
                res = col.query(query_embeddings=vecs.tolist(), n_results=min(k, col.count()), include=[])
                return _found(ids, res["ids"])
            finally:
                client.close()
    return read


def _faiss(opts):
    def read(search):
        from tombstone_adapters.faiss.store import FaissStore

        fs = FaissStore(opts["path"], create=False)
        if search is None:
            ids = fs.ids()
            return {i: np.asarray(v, np.float32) for i, v in zip(ids, fs.vectors(ids))}
        ids, vecs, k = search
        return _found(ids, [[hit for hit, _ in row] for row in fs.search(query_embeddings=vecs, k=k)])
    return read


def _qdrant(opts):
    def read(search):
        from qdrant_client import QdrantClient

        with tempfile.TemporaryDirectory(prefix="census-qdrant-") as tmp:
            copy = Path(tmp) / "copy"
            shutil.copytree(opts["path"], copy)
            client = QdrantClient(path=str(copy))
            try:
                name = opts["collection"]
                if search is None:
                    points, _ = client.scroll(name, limit=100_000, with_vectors=True, with_payload=True)
                    return {(p.payload or {}).get("tombstone_id", str(p.id)): np.asarray(p.vector, np.float32)
                            for p in points}
                ids, vecs, k = search
                hits = [[(p.payload or {}).get("tombstone_id", str(p.id))
                         for p in client.query_points(name, query=v.tolist(), limit=k, with_payload=True).points]
                        for v in vecs]
                return _found(ids, hits)
            finally:
                client.close()
    return read


def _pgvector(opts):
    def read(search):
        import psycopg
        from psycopg import sql

        from tombstone_adapters.pgvector.server import dsn_from

        table = sql.Identifier(opts["table"])
        with psycopg.connect(dsn_from(opts, "pgvector"), autocommit=True) as conn:
            if search is None:
                rows = conn.execute(sql.SQL("SELECT id, embedding::text FROM {}").format(table)).fetchall()
                return {i: np.asarray(json.loads(v), np.float32) for i, v in rows}
            ids, vecs, k = search
            hits = [[r[0] for r in conn.execute(
                sql.SQL("SELECT id FROM {} ORDER BY embedding <-> %s::vector LIMIT %s").format(table),
                (json.dumps([float(x) for x in v]), k)).fetchall()] for v in vecs]
            return _found(ids, hits)
    return read


def same_direction(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two vectors are the same up to scale (a cosine store keeps them normalised)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return na == nb
    return a.shape == b.shape and float(np.dot(a, b) / (na * nb)) > 0.9999


def survivors_lost(expected: dict[str, np.ndarray], after: dict[str, np.ndarray], searchable: set[str]) -> list[str]:
    """Ids of ``expected`` that are gone from ``after``, came back with another vector, or are not found
    by their own vector."""
    return sorted(i for i, v in expected.items()
                  if i not in after or not same_direction(v, after[i]) or i not in searchable)


def written(folder: Path) -> dict[str, np.ndarray]:
    """What the writer process says it wrote (each write that returned)."""
    path = folder / "written.jsonl"
    out: dict[str, np.ndarray] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            out.update({i: np.asarray(v, np.float32) for i, v in zip(entry["ids"], entry["vectors"])})
    return out


# -- the writer process -------------------------------------------------------------------------


def _raw_vectors(n: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + n)
    v = rng.standard_normal((count, embed_dim())).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


WRITES = 5000
"""At most this many writes per writer (then it idles, its client open, until DIR/stop)."""


class RawWriter:
    """Writes through the store's own client, as an app that bypasses Tombstone would (no lineage)."""

    def __init__(self, config_path: Path, store: str) -> None:
        self.store, self.opts = store, options(config_path, store)
        self.client: Any = None

    def write(self, n: int) -> tuple[list[str], np.ndarray]:
        ids = [f"raw-{n:04d}-{k}-{uuid.uuid4().hex[:12]}" for k in range(2)]
        vecs = _raw_vectors(n, len(ids))
        docs = [f"raw record {i} written by another process" for i in ids]
        getattr(self, f"_{self.store}")(ids, vecs, docs)
        return ids, vecs

    def _chroma(self, ids, vecs, docs):
        import chromadb

        if self.client is None:  # an app keeps its client open
            self.client = chromadb.PersistentClient(path=self.opts["path"])
        self.client.get_collection(self.opts["collection"]).add(ids=ids, embeddings=vecs.tolist(), documents=docs)

    def _faiss(self, ids, vecs, docs):
        from tombstone_adapters.faiss.store import FaissStore

        FaissStore(self.opts["path"], create=False).add(ids, documents=docs, embeddings=vecs)

    def _qdrant(self, ids, vecs, docs):
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=self.opts["path"])  # local mode: the folder is this process's while open
        try:
            client.upsert(self.opts["collection"], [
                models.PointStruct(id=str(uuid.uuid5(uuid.NAMESPACE_URL, i)), vector=v.tolist(),
                                   payload={"tombstone_id": i, "document": d}) for i, v, d in zip(ids, vecs, docs)])
        finally:
            client.close()

    def _pgvector(self, ids, vecs, docs):
        import psycopg
        from psycopg import sql

        from tombstone_adapters.pgvector.server import dsn_from

        if self.client is None:
            self.client = psycopg.connect(dsn_from(self.opts, self.store), autocommit=True)
        with self.client.cursor() as cur:
            cur.executemany(sql.SQL("INSERT INTO {} (id, document, embedding) VALUES (%s, %s, %s::vector)")
                            .format(sql.Identifier(self.opts["table"])),
                            [(i, d, json.dumps([float(x) for x in v])) for i, v, d in zip(ids, vecs, docs)])


def writer_main(config_path: Path, store: str, mode: str, folder: Path) -> int:
    from tombstone import Tombstone
    from tombstone.config import load_config
    from tombstone.demo import DemoKit, fill

    raw = RawWriter(config_path, store) if mode == "raw" else None
    tomb = Tombstone(load_config(config_path)) if mode == "wrapper" else None
    kit = DemoKit(root=config_path.parent)
    if tomb is not None:
        kit.tomb = tomb
    embedder = kit.embedder()
    n = tries = 0
    try:
        while not (folder / "stop").exists():
            if n >= WRITES:
                # the cap reached before the erasure ended: the app idles with its client still open (what the
                # erasure must see), until told to stop
                time.sleep(0.02)
                continue
            tries += 1
            _mark(folder / "begin", tries)
            try:
                if raw is not None:
                    ids, vecs = raw.write(n)
                else:
                    ref = f"writer-{n:04d}"
                    ids, texts, _ = kit.chunks(ref)
                    fill(tomb, store, [ref], kit=kit)
                    vecs = np.asarray(embedder.embed(texts), np.float32)
            except Exception as exc:  # the app sees the error and tries again
                with open(folder / "errors.txt", "a") as fh:
                    fh.write(f"{n}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n")
                if (folder / "stop").exists():
                    break
                continue
            finally:
                _mark(folder / "end", tries)
            with open(folder / "written.jsonl", "a") as fh:
                fh.write(json.dumps({"n": n, "try": tries, "ids": ids, "vectors": vecs.tolist()}) + "\n")
            n += 1
    finally:
        if tomb is not None:
            tomb.close()
        release(config_path)
    return 0


def _mark(path: Path, n: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(n))
    tmp.replace(path)


def _read_mark(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


# -- the erasing process -------------------------------------------------------------------------


def erase_main(config_path: Path, subject: str, folder: Path) -> int:
    import tombstone.faults as faults
    from tombstone.cli import main

    class Rendezvous:  # the pause point's sleep, made a wait for the writer's attempt
        @staticmethod
        def sleep(_seconds: float) -> None:
            (folder / "in-reclaim").touch()
            first = _read_mark(folder / "begin")
            deadline = time.monotonic() + RENDEZVOUS_WAIT
            while time.monotonic() < deadline:
                begun, ended = _read_mark(folder / "begin"), _read_mark(folder / "end")
                # a write under way, or one begun (and maybe refused) since the reclaim took the store
                if begun is not None and (ended is None or ended < begun or first is None or begun > first):
                    (folder / "attempt").write_text(str(begun))
                    return
                time.sleep(0.005)

    faults.time = Rendezvous  # type: ignore[assignment]
    try:
        main(["erase", subject, "--config", str(config_path)])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return 0


# -- one trial of a cell ------------------------------------------------------------------------


HERE = Path(__file__).resolve()


def cli(*args: str, timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    """``tombstone ARGS`` in a process of its own (the code on this process's path)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TOMBSTONE_PAUSE_AT", None)
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _script(*args: str, env_extra: dict[str, str] | None = None, **popen: Any) -> "subprocess.Popen[str]":
    import os
    import subprocess

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join(sys.path), **(env_extra or {})}
    return subprocess.Popen([sys.executable, str(HERE), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _wait_for(path: Path, proc: "subprocess.Popen[str]", timeout: float = 120) -> bool:
    """Wait until ``path`` exists (True) or ``proc`` exits first (False); an event, polled, never a timer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return True
        if proc.poll() is not None:
            return path.exists() and path.stat().st_size > 0
        time.sleep(0.01)
    return False


def audit_rows(config_path: Path, receipt: Path) -> tuple[int, list[dict[str, Any]], str]:
    """``tombstone audit RECEIPT --json`` against the deployment's stores: exit code, rows, stderr."""
    import tomli_w

    from tombstone.config import load_config

    operator = load_config(config_path)
    folder = config_path.parent.parent / f"{config_path.parent.name}-auditor"
    folder.mkdir(exist_ok=True)
    stores = folder / "stores.toml"
    stores.write_text(tomli_w.dumps({"stores": {n: {"backend": c.backend, **c.options}
                                                for n, c in operator.stores.items()}}))
    done = cli("audit", str(receipt), "--json", "--config", str(stores),
               "--key", str(config_path.parent / "keys" / "signing.pub"))
    try:
        rows = json.loads(done.stdout)["artifacts"]
    except (ValueError, KeyError):
        rows = []
    return done.returncode, rows, done.stderr


def writer_cell(root: Path, backend: str, mode: str) -> dict[str, Any]:
    """One trial: a store of ``backend`` with 4 demo subjects; another process writes new records (through
    the wrappers, or raw through the store's own client) while ``tombstone erase user-0001`` runs, and is
    inside the reclaim holding the store's lock when the writer starts a write. Returns the counts a test
    asserts on and what it needs to show the fault happened."""
    root.mkdir(parents=True, exist_ok=True)
    config = build(root / "deploy", [backend])
    try:
        return _writer_cell(root, config, backend, mode)
    finally:
        release(config)


def _writer_cell(root: Path, config: Path, backend: str, mode: str) -> dict[str, Any]:
    folder = root / "signals"
    folder.mkdir()
    erased_ids = set(_demo_ids(ERASED))
    before = census(config, backend)
    assert erased_ids <= set(before), "the erased subject's records are in the store before the erasure"
    writer = _script("write", str(config), backend, mode, str(folder))
    started = time.monotonic()
    try:
        if not _wait_for(folder / "written.jsonl", writer):
            raise AssertionError(f"the writer wrote nothing: {writer.communicate()[1][-2000:]}")
        eraser = _script("erase", str(config), ERASED, str(folder),
                         env_extra={"TOMBSTONE_PAUSE_AT": f"{PAUSE_POINTS[backend]}=1"})
        erase_out, erase_err = eraser.communicate(timeout=600)
        # and a few more writes once the erasure has ended (a client left stale by it writes then)
        last = _read_mark(folder / "begin") or 0
        deadline = time.monotonic() + 120
        while (_read_mark(folder / "end") or 0) < last + 3 and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        (folder / "stop").touch()
        w_out, w_err = writer.communicate(timeout=300)
    code = eraser.returncode
    resumed = again = None
    unchecked: list[str] = []
    refused_left: list[str] = []
    if code == 2:
        # refused before it changed anything (a client outside Tombstone held the store): the erased subject's
        # records are all still there, with their vectors; with the writer stopped, the erasure run again
        between = census(config, backend)
        refused_left = sorted(i for i in erased_ids if i in between and same_direction(before[i], between[i]))
        again = cli("erase", ERASED, "--config", str(config))
    if code == 3:
        resumed = cli("resume", "--config", str(config))
    dlq = cli("dlq", "list", "--json", "--config", str(config))
    dead = json.loads(dlq.stdout).get("dead_letters", []) if dlq.returncode == 0 and dlq.stdout.strip() else []
    if code == 3 and not dead:
        # the erasure ended with artifacts it could not check while the writer ran (a client outside Tombstone
        # holding the store): with the writer stopped, the erasure run again, as the receipt says
        first = sorted((config.parent / "receipts").glob(f"{ERASED}*.json"), key=lambda p: p.stat().st_mtime_ns)
        body = json.loads(first[-1].read_text()) if first else {"artifacts": []}
        # (or found again: the client wrote its stale index back before the verify step read the files)
        unchecked = [a.get("reason") or a.get("measurement") or "" for a in body["artifacts"]
                     if a["status"] in ("UNVERIFIED", "RESIDUAL")]
        if unchecked:
            again = cli("erase", ERASED, "--config", str(config))
    recovery_s = time.monotonic() - started
    added = written(folder)
    after = census(config, backend)
    expected = {i: v for i, v in before.items() if i not in erased_ids}
    # a write through the wrapper stores the vector the embedder made; compare the census's own, by id
    expected.update({i: (after[i] if mode == "wrapper" and i in after else v) for i, v in added.items()})
    lost = survivors_lost(expected, after, found_by_own_vector(config, backend, {i: after[i] for i in expected
                                                                                  if i in after}))
    receipts = sorted((config.parent / "receipts").glob(f"{ERASED}*.json"), key=lambda p: p.stat().st_mtime_ns)
    verified: set[str] = set()
    false_verified: list[str] = []
    audit_code = None
    if receipts:
        body = json.loads(receipts[-1].read_text())
        verified = {a["artifact_id"] for a in body["artifacts"] if str(a["status"]).startswith("VERIFIED")}
        audit_code, rows, _ = audit_rows(config, receipts[-1])
        false_verified = sorted(r["artifact_id"] for r in rows
                                if r["verdict"] == "contradicted" and r["artifact_id"] in verified)
    still_there = sorted(erased_ids & set(after))
    false_verified += [i for i in still_there if i in verified and i not in false_verified]
    attempt = (folder / "attempt").exists()
    return {
        "survivors_lost": len(lost), "false_verified": len(false_verified),
        "finished_on_resume": (again.returncode == 0 if again is not None
                               else resumed is not None and resumed.returncode == 0),
        "dead_lettered": bool(dead), "recovery_s": recovery_s,
        # for the tests
        "lost": lost, "false_verified_ids": false_verified, "erase_code": code, "erase_err": erase_err,
        "resume": None if resumed is None else (resumed.returncode, resumed.stdout + resumed.stderr),
        "unchecked": unchecked, "again": None if again is None else (again.returncode, again.stdout + again.stderr),
        "dead": dead, "receipt": bool(receipts), "verified": sorted(verified), "audit_code": audit_code,
        "attempt": attempt, "added": sorted(added), "after_attempt": _after_attempt(folder),
        "writer_errors": (folder / "errors.txt").read_text() if (folder / "errors.txt").exists() else "",
        "writer_err": w_err[-2000:], "still_there": still_there, "erased": sorted(erased_ids),
        "writer_pid": writer.pid, "refused_left": refused_left,
    }


def _after_attempt(folder: Path) -> int:
    """How many writes that returned were under way, or began, once the reclaim held the store."""
    first, path = _read_mark(folder / "attempt"), folder / "written.jsonl"
    if first is None or not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if json.loads(line)["try"] >= first)


def _demo_ids(subject: str) -> list[str]:
    from tombstone.demo import demo_chunks

    return demo_chunks(subject)[0]


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "write":
        sys.exit(writer_main(Path(args[0]), args[1], args[2], Path(args[3])))
    if command == "erase":
        sys.exit(erase_main(Path(args[0]), args[1], Path(args[2])))
    raise SystemExit(f"unknown command {command!r}")
