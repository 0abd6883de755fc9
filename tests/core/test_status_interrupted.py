"""``tombstone status`` tells an erasure whose process died from one that is running: the saga whose
subject lock no live process holds shows as "interrupted", with the command that finishes it; and the
message of a subject lock that is held says when the pid it records is no longer running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from support import write_docs
from tombstone.cli import main

pytestmark = pytest.mark.slow
TIMEOUT = 120


def tombstone(config, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args, "--config", str(config.path)],
                          capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **env})


def status(config) -> str:
    result = CliRunner().invoke(main, ["status", "--config", str(config.path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def saga_row(text: str, subject: str) -> str:
    [row] = [line for line in text.splitlines() if f" {subject} " in line]
    return row


def test_a_killed_erasure_shows_as_interrupted_with_the_resume_command(tomb):
    config = tomb.config
    write_docs(tomb, "alice", 3)
    killed = tombstone(config, "erase", "alice", TOMBSTONE_KILL_AT="saga:reclaim:docs:acting")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    shown = status(config)
    row = saga_row(shown, "alice")
    assert "interrupted" in row and "running" not in row, shown
    assert f"tombstone resume --config {config.path}" in shown

    resumed = tombstone(config, "resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = resumed.stderr.splitlines()  # progress as plain lines (not a terminal), as erase shows it
    assert steps and steps[-1].endswith("receipt") and all(line.startswith("[") for line in steps), resumed.stderr
    shown = status(config)
    assert "done" in saga_row(shown, "alice") and "interrupted" not in shown and "tombstone resume" not in shown


def test_a_running_erasure_shows_as_running_until_its_process_dies(tomb, tmp_path):
    config = tomb.config
    write_docs(tomb, "bob", 2)
    reached = tmp_path / "reached.txt"
    point = "saga:reclaim:docs:acting"
    proc = subprocess.Popen([sys.executable, "-m", "tombstone", "erase", "bob", "--config", str(config.path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TOMBSTONE_PAUSE_AT": f"{point}={TIMEOUT}",
                                 "TOMBSTONE_LIST_KILL_POINTS": str(reached)})
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (reached.exists() and f"{point}#1" in reached.read_text()):
            assert proc.poll() is None, "the erasure ended before its pause point"
            assert time.monotonic() < deadline, "the erasure never reached its pause point"
            time.sleep(0.05)
        row = saga_row(status(config), "bob")
        assert "running" in row and f"pid {proc.pid}" in row and "interrupted" not in row
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)
    shown = status(config)
    assert "interrupted" in saga_row(shown, "bob") and "tombstone resume" in shown


HOLDER = r"""
import os, sys, time
from tombstone import Tombstone
with Tombstone.open(sys.argv[1]) as tomb:
    lock = tomb.lineage.subject_lock(tomb.lineage.subject_key(sys.argv[2]))
    assert lock.try_acquire()
    child = os.fork()
    if child == 0:  # the child keeps the lock (its file description) after the parent is gone
        os.close(1)
        os.close(2)
        time.sleep(float(sys.argv[3]))
        os._exit(0)
    print(os.getpid(), child, flush=True)
    os._exit(0)
"""


def test_a_held_lock_whose_recorded_pid_is_gone_says_so(tomb):
    config = tomb.config
    write_docs(tomb, "carol", 1)
    holder = subprocess.run([sys.executable, "-c", HOLDER, str(config.path), "carol", str(TIMEOUT)],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert holder.returncode == 0, holder.stderr
    parent, child = map(int, holder.stdout.split())
    try:
        busy = tombstone(config, "erase", "carol")
        assert busy.returncode == 2, busy.stdout + busy.stderr
        [line] = busy.stderr.splitlines()
        assert line.startswith("error: subject 'carol' is being erased by another process")
        assert f"pid {parent}, which is no longer running" in line
    finally:
        os.kill(child, signal.SIGKILL)  # the process this test started (through the holder)

