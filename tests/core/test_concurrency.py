"""One saga per subject at a time, with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from test_cli import run


def test_second_erase_of_a_running_subject_refuses_clearly(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    config = str(root / "tombstone.toml")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOMBSTONE_PAUSE_AT": "saga:reclaim:docstore:acting=4"}
    first = subprocess.Popen([sys.executable, "-m", "tombstone", "erase", "user-0001", "--config", config],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lock_dir = root / "locks"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(p.read_text().strip() for p in lock_dir.glob("*.lock")
                                                      if lock_dir.exists()):
            time.sleep(0.1)
        second = subprocess.run([sys.executable, "-m", "tombstone", "erase", "user-0001", "--config", config],
                                capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert second.returncode == 2
        assert second.stderr.strip() == (f"error: subject 'user-0001' is being erased by another process (pid {first.pid});"
                                         " wait for it to finish, or run 'tombstone resume' later")
        resumed = subprocess.run([sys.executable, "-m", "tombstone", "resume", "--config", config],
                                 capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert resumed.returncode == 0 and "skipped: subject 'user-0001' is being erased" in resumed.stdout
    finally:
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "VERIFIED(physical)" in out
    status = run("status", "--config", config)
    assert status.output.count("user-0001") == 1, "two processes must never both run (or start) the saga"
