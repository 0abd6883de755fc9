"""How many OpenMP threads FAISS may use in this process.

FAISS parallelises a search over its queries with OpenMP and, left alone, starts one thread per CPU the
machine has. On a shared host (a CI runner, a container given two of sixty-four cores, a web worker next to
others) that oversubscribes: the threads of one search wait on each other at OpenMP's barriers while the
scheduler runs someone else, and one query's latency swings by an order of magnitude (RESULTS.md, "FAISS
threads"). Tombstone therefore sets a default that cannot oversubscribe:

* ``threads = N`` in the store's options (or ``FaissStore(threads=N)``): exactly N;
* ``threads = "all"``: FAISS's own default, one per CPU of the machine (``os.cpu_count()``);
* otherwise, when ``OMP_NUM_THREADS`` is set in the environment, OpenMP already honours it and it is left
  as it is;
* otherwise half the CPUs this process may run on (``os.sched_getaffinity``; a container's CPU quota is
  not visible there), at least one.

The setting is per process (OpenMP keeps one), applied when a store is opened; an app that calls
``faiss.omp_set_num_threads`` itself after opening its store has the last word.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tombstone.errors import ConfigError

ALL = "all"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Half the usable CPUs, at least one: never more threads than a shared host gives this process."""
    return max(1, usable_cpus() // 2)


def parse(value: Any, store: str) -> int | str | None:
    """The ``threads`` option: None (absent), ``"all"``, or a whole number of at least 1 (an int or a string
    of one); anything else is one ConfigError line."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == ALL:
        return ALL
    try:
        number = int(value) if not isinstance(value, (bool, float)) else 0
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ConfigError(f"store {store!r}: threads must be a whole number of at least 1 or \"all\", not {value!r}",
                          store=store)
    return number


def resolve(value: int | str | None, environ: Mapping[str, str] | None = None) -> int | None:
    """The thread count to set for a parsed option, or None to leave OpenMP as it is (no option while
    ``OMP_NUM_THREADS`` is set)."""
    environ = os.environ if environ is None else environ
    if value == ALL:
        return max(1, os.cpu_count() or 1)
    if isinstance(value, int):
        return value
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    return default_threads()


def apply(value: int | str | None) -> int:
    """Set FAISS's OpenMP thread count for ``value`` (see :func:`resolve`) and return the count in force."""
    import faiss

    count = resolve(value)
    if count is not None:
        faiss.omp_set_num_threads(count)
    return int(faiss.omp_get_max_threads())


__all__ = ["ALL", "apply", "default_threads", "parse", "resolve", "usable_cpus"]
