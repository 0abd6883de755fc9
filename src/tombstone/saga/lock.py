"""One saga per subject at a time, across processes: an exclusive ``flock`` per subject.

The lock file lives next to the lineage db (``locks/<subject key>.lock``, named by the keyed hash, never
the subject) and holds the owner's pid for the message a second operator sees. The OS releases it when
the owner exits — or dies — so a killed saga never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from tombstone.errors import SagaError


class SubjectLock:
    def __init__(self, lineage_db: Path, subject_key: str) -> None:
        self.path = lineage_db.parent / "locks" / f"{subject_key[:32]}.lock"
        self._fd: int | None = None

    def acquire(self, *, subject: str, wait: float = 0.0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise SagaError(f"subject {subject!r} is being erased by another process (pid {owner});"
                                    " wait for it to finish, or run 'tombstone resume' later", subject=subject)
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
