"""One saga per subject at a time, across processes — and across machines when the lineage db is PostgreSQL.

The lock itself comes from the lineage db (:meth:`LineageDB.subject_lock`): an exclusive ``flock`` on
``locks/<subject key>.lock`` next to a SQLite lineage db, or a session advisory lock on a PostgreSQL one.
Either is named by the keyed hash, never the subject, and either is dropped when its holder dies, so a
killed saga never leaves a stale lock behind. A lock that is held while the pid it records is no longer
running (a process the saga started inherited it) is named as such: waiting would not end it.
"""

from __future__ import annotations

import time
from typing import Any

from tombstone.errors import SubjectBusyError, shown

__all__ = ["SubjectBusyError", "SubjectLock"]


class SubjectLock:
    """The subject's lock from the lineage db, taken with a wait and released when the saga ends."""

    def __init__(self, lineage: Any, subject_key: str) -> None:
        self._lock = lineage.subject_lock(subject_key)

    def acquire(self, *, subject: str, wait: float = 0.0) -> None:
        deadline = time.monotonic() + wait
        while not self._lock.try_acquire():
            if time.monotonic() >= deadline:
                holder = self._lock.holder()
                if holder.held and holder.pid is not None and holder.pid_alive is False:
                    raise SubjectBusyError(
                        f"subject {shown(subject)} is being erased by another process ({holder.text}); stop the"
                        " process that holds the lock, then run 'tombstone resume'", subject=subject)
                raise SubjectBusyError(
                    f"subject {shown(subject)} is being erased by another process ({self._lock.owner()});"
                    " wait for it to finish, or run 'tombstone resume' later", subject=subject)
            time.sleep(0.1)

    def release(self) -> None:
        self._lock.release()
