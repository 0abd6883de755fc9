"""FAISS threads: one query's latency through ``FaissStore.search`` with every OpenMP thread (FAISS's own
default, ``threads = "all"``) against Tombstone's default (half the usable CPUs), with no load added and on a
host whose every CPU is kept busy by other processes (a shared CI runner). The settings are measured in
turns within every repetition, so both see the same load.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time

import numpy as np

from common import DIM

HEADINGS = ("FAISS threads: one query's latency, with and without other load",)
RECORDS = 20_000
QUERIES = 400
BATCH = 64


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _latencies(store, queries: np.ndarray, setting, apply) -> tuple[list[float], float]:
    apply(setting)
    single = []
    for q in queries:
        start = time.perf_counter()
        store.search(query_embeddings=q[None, :], k=10)
        single.append(time.perf_counter() - start)
    start = time.perf_counter()
    store.search(query_embeddings=queries[:BATCH], k=10)
    return single, time.perf_counter() - start


def run(tmp) -> dict:
    from tombstone_adapters.faiss import threads
    from tombstone_adapters.faiss.store import FaissStore

    rng = np.random.default_rng(7)
    store = FaissStore(tmp / "faiss", dim=DIM)
    vectors = rng.standard_normal((RECORDS, DIM)).astype("float32")
    for at in range(0, RECORDS, 5000):
        store.add([f"r-{i}" for i in range(at, at + 5000)], embeddings=vectors[at:at + 5000])
    queries = rng.standard_normal((QUERIES, DIM)).astype("float32")
    settings = {"all": threads.ALL, "default": None}
    out: dict = {"records": RECORDS, "queries": QUERIES, "cpus": threads.usable_cpus(),
                 "default_threads": threads.default_threads(), "all_threads": os.cpu_count(), "hosts": {}}
    for host in ("no added load", "busy"):
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(threads.usable_cpus())] \
            if host == "busy" else []
        for p in spinners:
            p.start()
        try:
            runs: dict[str, list[float]] = {name: [] for name in settings}
            batches: dict[str, list[float]] = {name: [] for name in settings}
            for rep in range(3):
                for name, setting in settings.items():
                    part = queries[rep::3]
                    single, batch = _latencies(store, part, setting, threads.apply)
                    runs[name].extend(single)
                    batches[name].append(batch)
        finally:
            stop.set()
            for p in spinners:
                p.join()
        out["hosts"][host] = {name: {"median": statistics.median(r), "p95": float(np.percentile(r, 95)),
                                     "p99": float(np.percentile(r, 99)), "batch": statistics.median(batches[name])}
                              for name, r in runs.items()}
    return out


def section(r: dict) -> str:
    ms = lambda s: f"{s * 1000:.2f} ms"  # noqa: E731
    lines = [f"## {HEADINGS[0]}", "",
             f"`FaissStore.search` (k = 10) over {r['records']} random {DIM}-dim vectors in the store's HNSW index, one"
             f" query per call ({r['queries']} queries per setting and host), and one call with {BATCH} queries;"
             f" *all* is FAISS's own default ({r['all_threads']} OpenMP threads here), *default* Tombstone's"
             f" ({r['default_threads']}: half of the {r['cpus']} CPUs this process may use). *busy*: every CPU kept"
             " busy by another process meanwhile; *no added load*: nothing started by the benchmark (the host's"
             " other work, if any, still runs). The two settings are measured in turns within each repetition.",
             "", f"| host | threads | median | p95 | p99 | {BATCH} queries in one call |", "|---|---|---|---|---|---|"]
    for host, rows in r["hosts"].items():
        for name, v in rows.items():
            lines.append(f"| {host} | {name} | {ms(v['median'])} | {ms(v['p95'])} | {ms(v['p99'])} | {ms(v['batch'])} |")
    said = [f"{host}: median {rows['all']['median'] / rows['default']['median']:.0f}x, p99"
            f" {rows['all']['p99'] / rows['default']['p99']:.1f}x" for host, rows in r["hosts"].items()]
    lines += ["", "One query with every thread against the default (" + "; ".join(said) + "): OpenMP's threads"
              " wait for each other at the end of every search, and on a host with other work that wait is"
              " the query's latency."]
    return "\n".join(lines) + "\n"
