"""Fault injection for crash tests: named kill points.

The saga and the adapters call ``kill_point(name)`` at every step boundary and inside each reclaim
recipe. Nothing happens unless ``TOMBSTONE_KILL_AT`` names that point, in which case the process sends
itself SIGKILL — no cleanup, no atexit, exactly like a machine dying. ``TOMBSTONE_PAUSE_AT=name=SECONDS``
sleeps there instead (for tests that need a saga caught mid-flight). ``TOMBSTONE_LIST_KILL_POINTS=FILE``
appends every point reached to FILE, so a test harness can enumerate them.

Names look like ``saga:reclaim:chroma:acting`` or ``reclaim:chroma:after-rewrite``; a point reached more
than once in a run is addressed as ``name#N`` for its N-th occurrence (``name`` alone is ``name#1``).
"""

from __future__ import annotations

import os
import signal
import time

KILL_ENV = "TOMBSTONE_KILL_AT"
PAUSE_ENV = "TOMBSTONE_PAUSE_AT"
LIST_ENV = "TOMBSTONE_LIST_KILL_POINTS"


_seen: dict[str, int] = {}


def kill_point(name: str) -> None:
    if not (os.environ.get(LIST_ENV) or os.environ.get(KILL_ENV) or os.environ.get(PAUSE_ENV)):
        return
    _seen[name] = _seen.get(name, 0) + 1
    here = {f"{name}#{_seen[name]}"} | ({name} if _seen[name] == 1 else set())
    listing = os.environ.get(LIST_ENV)
    if listing:
        with open(listing, "a", encoding="utf-8") as fh:
            fh.write(f"{name}#{_seen[name]}\n")
    if os.environ.get(KILL_ENV) in here:
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get(PAUSE_ENV)
    if pause and pause.rsplit("=", 1)[0] in here:
        time.sleep(float(pause.rsplit("=", 1)[1]))
