"""The preflight: every state-changing command checks the deployment before it touches any store. A failure
there is one line, exit 2, and not a byte under the deployment changes (lineage db included); a failure
once an erasure has begun is one line with the command that finishes it, exit 3, and that command then
finishes it with a receipt that verifies against the published key."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli import one_line_error, run

BACKENDS = "chroma,docstore,faiss,qdrant"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight") / "d"
    result = run("demo", "--workdir", str(root), "--backends", BACKENDS, "--subjects", "3", "--erase", "none")
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def deployment(template, tmp_path):
    """A copy of the demo deployment (its config's paths are relative, so the copy is whole)."""
    root = tmp_path / "d"
    shutil.copytree(template, root, symlinks=True)
    return root


def hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under the deployment (the lineage db, keys, stores, locks), by path."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = "link" if path.is_symlink() else \
                hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def config_of(root: Path) -> str:
    return str(root / "tombstone.toml")


def refused(root: Path, *args: str) -> str:
    """Run a command that the preflight must refuse: one line, exit 2, not a byte changed."""
    before = hashes(root)
    result = run(*args, "--config", config_of(root))
    line = one_line_error(result, 2)
    assert "nothing was changed" in line, line
    assert hashes(root) == before
    return line


def verified(root: Path, receipt: Path) -> None:
    result = run("receipt", "verify", str(receipt), "--key", str(root / "keys" / "signing.pub"))
    assert result.exit_code == 0, result.output


def edit_config(root: Path, old: str, new: str, occurrence: int = 1) -> None:
    path = root / "tombstone.toml"
    text = path.read_text()
    at = -1
    for _ in range(occurrence):
        at = text.index(old, at + 1)
    path.write_text(text[:at] + new + text[at + len(old):])


# -- the signing key and the receipts directory ---------------------------------------------------------------


def test_a_receipts_path_that_is_not_a_folder_changes_nothing(deployment):
    (deployment / "receipts").write_text("not a folder\n")
    line = refused(deployment, "erase", "user-0001")
    assert "receipts directory" in line
    (deployment / "receipts").unlink()
    assert run("erase", "user-0001", "--config", config_of(deployment)).exit_code == 0
    verified(deployment, deployment / "receipts" / "user-0001.json")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0500 folder")
def test_an_unwritable_receipts_directory_changes_nothing(deployment):
    receipts = deployment / "receipts"
    receipts.mkdir()
    receipts.chmod(0o500)
    try:
        line = refused(deployment, "erase", "user-0001")
        assert "not writable" in line
    finally:
        receipts.chmod(0o700)


def test_a_garbage_signing_key_changes_nothing(deployment):
    (deployment / "keys" / "signing.key").write_bytes(b"garbage\n")
    line = refused(deployment, "erase", "user-0001")
    assert "signing key" in line


def test_a_signing_key_from_another_deployment_is_refused(deployment, tmp_path):
    assert run("init", "--home", str(tmp_path / "other")).exit_code == 0
    own = (deployment / "keys" / "signing.key").read_bytes()
    (deployment / "keys" / "signing.key").write_bytes((tmp_path / "other" / "keys" / "signing.key").read_bytes())
    line = refused(deployment, "erase", "user-0001")
    assert "does not match" in line and "signing.pub" in line
    refused(deployment, "erase", "--subjects-file", str(_subjects(tmp_path, "user-0001", "user-0002")))
    (deployment / "keys" / "signing.key").write_bytes(own)
    assert run("erase", "user-0001", "--config", config_of(deployment)).exit_code == 0
    verified(deployment, deployment / "receipts" / "user-0001.json")


def _subjects(tmp_path: Path, *subjects: str) -> Path:
    path = tmp_path / "subjects.txt"
    path.write_text("".join(f"{s}\n" for s in subjects))
    return path


# -- the stores: each opens read-only first -----------------------------------------------------------------


def _faiss_option_typo(root: Path) -> None:
    edit_config(root, 'path = "stores/faiss"', 'paht = "stores/faiss"')


def _wrong_collection(root: Path) -> None:
    edit_config(root, 'collection = "rag-chunks"', 'collection = "rag-chunkz"', occurrence=2)  # qdrant's


def _truncated_docstore(root: Path) -> None:
    os.truncate(root / "stores" / "docstore" / "docstore.db", 4096)


def _faiss_folder_gone(root: Path) -> None:
    shutil.rmtree(root / "stores" / "faiss")


@pytest.mark.parametrize("damage", [_faiss_option_typo, _wrong_collection, _truncated_docstore, _faiss_folder_gone],
                         ids=["option-typo", "wrong-collection", "truncated-docstore", "faiss-folder-gone"])
def test_a_store_that_cannot_open_stops_the_erasure_before_chroma_is_opened(deployment, damage, tmp_path):
    """Chroma sorts first and its client writes whenever it opens a store: the later store's mistake must be
    found before that (chroma.sqlite3 unchanged, no lock file, no saga)."""
    damage(deployment)
    refused(deployment, "erase", "user-0001")
    refused(deployment, "erase", "--subjects-file", str(_subjects(tmp_path, "user-0001", "user-0002")))


def test_an_unwritable_docstore_is_met_before_chroma_is_opened(deployment):
    """A store file this process cannot write is opened (by its own client) before any other store."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes into a 0400 file")
    db = deployment / "stores" / "docstore" / "docstore.db"
    db.chmod(0o400)
    (deployment / "stores" / "docstore").chmod(0o500)
    try:
        before = hashes(deployment)
        result = run("erase", "user-0001", "--config", config_of(deployment))
        one_line_error(result, 2)
        assert hashes(deployment) == before
    finally:
        (deployment / "stores" / "docstore").chmod(0o700)
        db.chmod(0o600)


def test_the_lineage_db_of_another_schema_is_refused(deployment):
    import sqlite3

    conn = sqlite3.connect(deployment / "lineage.db")
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', '2030-01-01T00:00:00Z')")
    conn.commit()
    conn.close()
    before = hashes(deployment)
    result = cli("erase", "user-0001", "--config", config_of(deployment))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "newer Tombstone" in result.stderr, result
    assert hashes(deployment) == before


# -- reclaim, compact, resume --------------------------------------------------------------------------------


def test_reclaim_of_a_truncated_docstore_is_refused_with_nothing_changed(deployment):
    _truncated_docstore(deployment)
    line = refused(deployment, "reclaim", "--store", "docstore")
    assert "docstore.db" in line and "tombstone-docstore-" not in line  # the store's file, not a private copy
    assert run("resume", "--config", config_of(deployment)).output.strip() == "no interrupted erasure to resume"


def test_compact_with_a_store_that_cannot_open_changes_nothing(deployment):
    _faiss_option_typo(deployment)
    refused(deployment, "compact")


PROGRESS = re.compile(r"^\[\d+/\d+\] ")
"""A progress line on stderr (the finished sagas' steps), beside the one error line."""


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_a_stuck_store_reclaim_is_reported_in_one_line_and_does_not_block_the_others(deployment):
    """Two store reclaims killed after their first scan, then one store truncated: resume finishes the other,
    names the stuck one in one line with the command to run (exit 3, no traceback), and finishes it once
    the store is back."""
    config = config_of(deployment)
    saved = (deployment / "stores" / "docstore" / "docstore.db").read_bytes()
    killed = cli("reclaim", "--store", "docstore", "--config", config,
                 env={"TOMBSTONE_KILL_AT": "saga:reclaim-store:docstore:before"})
    assert killed.returncode == -9, killed.stderr
    killed = cli("reclaim", "--store", "faiss", "--config", config,
                 env={"TOMBSTONE_KILL_AT": "saga:reclaim-store:faiss:before"})
    assert killed.returncode == -9, killed.stderr
    _truncated_docstore(deployment)
    result = run("resume", "--config", config)
    assert result.exit_code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(errors) == 1 and errors[0].startswith("error: saga ") and "store 'docstore'" in errors[0], errors
    assert f"tombstone resume --config {config}" in errors[0] and "Traceback" not in result.output
    faiss_receipt = next((deployment / "receipts").glob("store*faiss*.json"))
    verified(deployment, faiss_receipt)
    (deployment / "stores" / "docstore" / "docstore.db").write_bytes(saved)
    again = run("resume", "--config", config)
    assert again.exit_code == 0, again.output
    verified(deployment, next((deployment / "receipts").glob("store*docstore*.json")))


@pytest.mark.slow
def test_a_failure_after_the_first_change_exits_3_and_resume_finishes_it(deployment, tmp_path):
    """The receipts directory is replaced by a file while the erasure runs (held at the point before the
    receipt is written): exit 3, one line naming the resume command; resume then finishes the erasure with
    a receipt that verifies against keys/signing.pub."""
    config = config_of(deployment)
    reached = tmp_path / "points.txt"
    proc = subprocess.Popen([sys.executable, "-m", "tombstone", "erase", "user-0001", "--config", config],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TOMBSTONE_PAUSE_AT": "saga:receipt:before-file=5",
                                 "TOMBSTONE_LIST_KILL_POINTS": str(reached)})
    try:
        deadline = time.monotonic() + 120
        while "saga:receipt:before-file#1" not in (reached.read_text() if reached.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)
            time.sleep(0.05)
        receipts = deployment / "receipts"
        if receipts.exists():
            receipts.rmdir()
        receipts.write_text("in the way\n")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 3, (out, err)
    errors = [line for line in err.splitlines() if line.strip() and not line.startswith("[")]
    assert len(errors) == 1 and errors[0].startswith("error: "), err
    assert "the erasure of 'user-0001' is under way" in errors[0] and f"tombstone resume --config {config}" in errors[0]
    assert "Traceback" not in err
    # the preflight of resume sees the same cause first, and changes nothing
    before = hashes(deployment)
    line = one_line_error(run("resume", "--config", config), 2)
    assert "receipts directory" in line and hashes(deployment) == before
    (deployment / "receipts").unlink()
    resumed = run("resume", "--config", config)
    assert resumed.exit_code == 0, resumed.output
    verified(deployment, deployment / "receipts" / "user-0001.json")
