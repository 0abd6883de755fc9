"""A local EMULATOR of Pinecone's data-plane HTTP API — not Pinecone.

Pinecone is a managed service that cannot be reached from the machines this project is tested on, so the
tests and ``tombstone demo --backends pinecone`` drive the real ``pinecone`` SDK against this emulator on
a loopback port. It implements the calls the adapter uses — upsert, query (with metadata filters),
fetch, update, delete, describe_index_stats, list — and models eventual consistency explicitly: every
write becomes visible to reads only ``lag`` seconds after it was accepted. A lag larger than the
adapter's wait bound reproduces a service that keeps serving a deleted id.

It is a model of the API's shape, written from the public documentation and the SDK's requests; it
makes no claim about the service's internals, performance or storage.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

DEFAULT_NAMESPACE = "__default__"


def _matches(metadata: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    """Pinecone's metadata filter language: $eq $ne $in $nin $gt $gte $lt $lte $exists $and $or."""
    if not flt:
        return True
    for key, cond in flt.items():
        if key == "$and":
            if not all(_matches(metadata, c) for c in cond):
                return False
            continue
        if key == "$or":
            if not any(_matches(metadata, c) for c in cond):
                return False
            continue
        if not isinstance(cond, dict):
            cond = {"$eq": cond}
        present = key in metadata
        value = metadata.get(key)
        for op, arg in cond.items():
            if op == "$exists":
                ok = present == bool(arg)
            elif op == "$eq":
                ok = present and value == arg
            elif op == "$ne":
                ok = not present or value != arg  # the emulator's choice; the wrapper always writes the flag
            elif op == "$in":
                ok = present and value in arg
            elif op == "$nin":
                ok = not present or value not in arg
            elif op in ("$gt", "$gte", "$lt", "$lte"):
                ok = present and isinstance(value, (int, float)) and {
                    "$gt": value > arg, "$gte": value >= arg, "$lt": value < arg, "$lte": value <= arg}[op]
            else:
                raise ValueError(f"unsupported filter operator {op}")
            if not ok:
                return False
    return True


class PineconeEmulator:
    """An in-memory index served over HTTP on 127.0.0.1. Use as a context manager, or start()/stop()."""

    def __init__(self, dimension: int, *, metric: str = "cosine", lag: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dimension, self.metric, self.lag, self.clock = dimension, metric, lag, clock
        self._lock = threading.Lock()
        self._visible: dict[str, dict[str, dict[str, Any]]] = {}
        self._pending: list[tuple[float, Callable[[], None]]] = []
        self.requests: list[str] = []
        self.api_keys: set[str] = set()
        """Every API key a request carried (a test checks what was sent where)."""
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def host(self) -> str:
        assert self._server is not None, "emulator not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "PineconeEmulator":
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                emulator.requests.append(f"{method} {url.path}")
                emulator.api_keys.add(self.headers.get("Api-Key") or "")
                if not self.headers.get("Api-Key"):
                    return self._reply(401, {"code": 16, "message": "missing API key"})
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if method == "POST" else {}
                try:
                    status, reply = emulator.dispatch(method, url.path, body, parse_qs(url.query))
                except (KeyError, ValueError, TypeError) as exc:
                    status, reply = 400, {"code": 3, "message": str(exc)}
                self._reply(status, reply)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "PineconeEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- eventual consistency -----------------------------------------------------------------

    def _write(self, apply: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append((self.clock() + self.lag, apply))
        self._settle()

    def _settle(self) -> None:
        with self._lock:
            now = self.clock()
            due = [a for t, a in self._pending if t <= now]
            self._pending = [(t, a) for t, a in self._pending if t > now]
            for apply in due:
                apply()

    def _ns(self, name: str | None) -> dict[str, dict[str, Any]]:
        return self._visible.setdefault(name or DEFAULT_NAMESPACE, {})

    # -- the API ------------------------------------------------------------------------------

    def dispatch(self, method: str, path: str, body: dict[str, Any], query: dict[str, list[str]]):
        self._settle()
        if (method, path) == ("POST", "/vectors/upsert"):
            return self._upsert(body)
        if (method, path) == ("POST", "/query"):
            return self._query(body)
        if (method, path) == ("GET", "/vectors/fetch"):
            return self._fetch(query)
        if (method, path) == ("POST", "/vectors/update"):
            return self._update(body)
        if (method, path) == ("POST", "/vectors/delete"):
            return self._delete(body)
        if (method, path) == ("POST", "/describe_index_stats"):
            return self._stats()
        if (method, path) == ("GET", "/vectors/list"):
            return self._list(query)
        return 404, {"code": 5, "message": f"no route {method} {path}"}

    def _upsert(self, body):
        ns = body.get("namespace")
        vectors = [{"id": v["id"], "values": [float(x) for x in v["values"]], "metadata": dict(v.get("metadata") or {})}
                   for v in body["vectors"]]
        for v in vectors:
            if len(v["values"]) != self.dimension:
                raise ValueError(f"vector dimension {len(v['values'])} does not match the index ({self.dimension})")

        def apply() -> None:
            target = self._ns(ns)
            for v in vectors:
                target[v["id"]] = v

        self._write(apply)
        return 200, {"upsertedCount": len(vectors)}

    def _score(self, a: np.ndarray, b: np.ndarray) -> float:
        if self.metric == "cosine":
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            return float(a @ b / (na * nb)) if na and nb else 0.0
        if self.metric == "dotproduct":
            return float(a @ b)
        return float(-np.sum((a - b) ** 2))

    def _query(self, body):
        ns = body.get("namespace")
        with self._lock:
            records = list(self._ns(ns).values())
            if "id" in body:
                query = np.asarray(self._ns(ns)[body["id"]]["values"])
            else:
                query = np.asarray(body["vector"], dtype=np.float64)
        hits = [(self._score(query, np.asarray(r["values"])), r) for r in records
                if _matches(r["metadata"], body.get("filter"))]
        hits.sort(key=lambda h: -h[0])
        matches = []
        for score, r in hits[: int(body.get("topK", 10))]:
            m: dict[str, Any] = {"id": r["id"], "score": score}
            if body.get("includeValues"):
                m["values"] = r["values"]
            if body.get("includeMetadata"):
                m["metadata"] = r["metadata"]
            matches.append(m)
        return 200, {"matches": matches, "namespace": ns or "", "usage": {"readUnits": 1}}

    def _fetch(self, query):
        ns = (query.get("namespace") or [""])[0]
        with self._lock:
            found = {i: dict(self._ns(ns)[i]) for i in query.get("ids", []) if i in self._ns(ns)}
        return 200, {"vectors": found, "namespace": ns, "usage": {"readUnits": 1}}

    def _update(self, body):
        ns, vid = body.get("namespace"), body["id"]

        def apply() -> None:
            record = self._ns(ns).get(vid)
            if record is None:
                return
            if "values" in body:
                record["values"] = [float(x) for x in body["values"]]
            if "setMetadata" in body:
                record["metadata"].update(body["setMetadata"])

        self._write(apply)
        return 200, {}

    def _delete(self, body):
        ns = body.get("namespace")
        ids = list(body.get("ids") or [])

        def apply() -> None:
            target = self._ns(ns)
            if body.get("deleteAll"):
                target.clear()
            for i in ids:
                target.pop(i, None)

        self._write(apply)
        return 200, {}

    def _stats(self):
        with self._lock:
            namespaces = {name: {"vectorCount": len(recs)} for name, recs in self._visible.items() if recs}
        total = sum(n["vectorCount"] for n in namespaces.values())
        return 200, {"namespaces": namespaces, "dimension": self.dimension, "indexFullness": 0.0,
                     "totalVectorCount": total, "metric": self.metric, "vectorType": "dense"}

    def _list(self, query):
        ns = (query.get("namespace") or [""])[0]
        prefix = (query.get("prefix") or [""])[0]
        limit = int((query.get("limit") or ["100"])[0])
        start = int((query.get("paginationToken") or ["0"])[0])
        with self._lock:
            ids = sorted(i for i in self._ns(ns) if i.startswith(prefix))
        page = ids[start : start + limit]
        body: dict[str, Any] = {"vectors": [{"id": i} for i in page], "namespace": ns, "usage": {"readUnits": 1}}
        if start + limit < len(ids):
            body["pagination"] = {"next": str(start + limit)}
        return 200, body
