"""Receipts for the report and viewer tests: signed chains with every status, built without any store, and a
demo deployment with three erased subjects (one with a copy at a third party), a dead letter and an erasure
in progress. Fixtures are re-exported by conftest.py; tests import the helpers from here by name."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tombstone.receipt import pretty, receipt_body, sign

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
"""Screenshots and reports the tests keep (git-ignored)."""

LONG_ID = "doc-" + "0123456789abcdef" * 12
"""An artifact id far wider than any table column: it must wrap, never be cut."""


def probe(level: str, ran: bool, passed: bool | None, measurement: str | None = None, why: str | None = None) -> dict:
    return {"level": level, "ran": ran, "passed": passed, "measurement": measurement,
            "detail": {"why": why} if why else {}}


def entry(artifact_id: str, store: str, backend: str, status: str, *, level: str | None = None,
          reason: str | None = None, measurement: str | None = None, action: str | None = None,
          logical: bool = True, physical: bool | None = True, physical_why: str | None = None) -> dict[str, Any]:
    probes = [probe("logical", True, logical, None if logical else "returned by get")]
    if physical is None:
        probes.append(probe("physical", False, None, why=physical_why or "not run"))
    else:
        probes.append(probe("physical", True, physical, None if physical else "id found in 1 file"))
    probes += [probe("semantic", False, None, why="no semantic probe"), probe("model", False, None, why="no model")]
    return {"artifact_id": artifact_id, "store": store, "backend": backend, "kind": "document", "status": status,
            "level": level, "reason": reason, "measurement": measurement, "action": action, "fingerprint": None,
            "inv_norm": None, "evidence": {"scope": "owned", "suppression": {"recorded": True}, "reclaim": None,
                                           "probes": probes}}


def verified(artifact_id: str, store: str = "docs", backend: str = "docstore") -> dict[str, Any]:
    return entry(artifact_id, store, backend, "VERIFIED", level="physical")


def managed(artifact_id: str) -> dict[str, Any]:
    return entry(artifact_id, "pc", "pinecone", "UNVERIFIED", physical=None,
                 reason="physical: managed: no physical check possible (no file-read API)",
                 physical_why="managed: no physical check possible (no file-read API)")


def third_party(artifact_id: str) -> dict[str, Any]:
    return entry(artifact_id, "third-party", "external", "NEEDS_HUMAN",
                 reason="third party: acme-support@example.com received a copy",
                 action="ask the recipient to delete its copy and keep their confirmation")


def residual(artifact_id: str) -> dict[str, Any]:
    return entry(artifact_id, "docs", "docstore", "RESIDUAL", level="physical", measurement="id found in 1 file",
                 physical=False, action="the bytes are still stored: run 'tombstone erase' for the subject again")


def dead_letter(artifact_id: str) -> dict[str, Any]:
    return entry(artifact_id, "vectors", "chroma", "UNVERIFIED", reason="dlq: injected fault: reclaim failed",
                 action="fix the store error, then run 'tombstone dlq retry'", physical=None)


class Chain:
    """Signed receipts, chained in the order they are added."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.receipts: list[dict[str, Any]] = []

    def add(self, subject: str, entries: list[dict[str, Any]], statement: str | None = None) -> dict[str, Any]:
        seq = len(self.receipts) + 1
        body = receipt_body(subject=subject, saga_id=str(uuid.uuid4()), sequence=seq,
                            started_at=f"2026-01-0{min(seq, 9)}T10:00:00.000000Z",
                            finished_at=f"2026-01-0{min(seq, 9)}T10:00:01.000000Z", entries=entries,
                            previous_receipt_hash=self.receipts[-1]["receipt_hash"] if self.receipts else None,
                            statement=statement)
        receipt = sign(body, self.key)
        self.receipts.append(receipt)
        return receipt

    def write(self, directory: Path, which: list[int] | None = None) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for n, receipt in enumerate(self.receipts, start=1):
            if which is None or n in which:
                path = directory / f"receipt-{n:06d}.json"
                path.write_bytes(pretty(receipt))
                paths.append(path)
        return paths


def public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def key_file(tmp_path, key) -> Path:
    path = tmp_path / "trusted" / "signing.pub"
    path.parent.mkdir()
    path.write_bytes(public_pem(key))
    return path


@pytest.fixture
def chain(key) -> Chain:
    """Four subjects: one erased and verified, one with a third-party copy and a managed store, one with a
    residual and a dead letter, one with nothing recorded."""
    c = Chain(key)
    c.add("alice", [verified("alice-doc-0001"), verified("alice-vec-0001", "vectors", "chroma")])
    c.add("Zoë <b>Ünïcode</b> 🚀", [verified(LONG_ID), third_party("acme-support@example.com:docs/zoe-1"),
                                      managed("zoe-rec-0001")])
    c.add("bob", [residual("bob-doc-0001"), dead_letter("bob-vec-0001"), verified("bob-doc-0002")])
    c.add("nobody", [], statement="the lineage db records no artifact for this subject")
    return c


# -- a demo deployment ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def demo_deployment(tmp_path_factory) -> Path:
    """``tombstone demo`` with five subjects, three of them erased (user-0003 after a copy of one of its
    artifacts went to a third party); then a dead letter and an erasure left in progress for user-0004. Built
    once per session; tests copy it (``demo``) before anything that could change it."""
    from tombstone import Tombstone
    from tombstone.demo import build_demo

    root = tmp_path_factory.mktemp("report-demo") / "demo"
    build_demo(root, ["docstore", "chroma", "exact_cache", "semantic_cache"], 5)
    with Tombstone.open(root / "tombstone.toml") as tomb:
        tomb.erase("user-0001")
        tomb.erase("user-0002")
        art = tomb.lineage.artifacts_for(tomb.lineage.subject_key("user-0003"))[0]
        tomb.lineage.record_third_party("user-0003", art.store, art.artifact_id, "acme-support@example.com")
        tomb.erase("user-0003")
        saga = "0f0f0f0f-0000-4000-8000-000000000004"
        tomb.lineage.create_saga(saga, "user-0004", None, {"artifacts": []})
        tomb.lineage.journal(saga, "suppress", "docstore", "begin")
        tomb.lineage.journal(saga, "suppress", "docstore", "end")
        tomb.lineage.journal(saga, "reclaim", "chroma", "begin")
        tomb.lineage.add_dead_letter(saga, "chroma", "reclaim", 3, "injected fault: reclaim failed (4 of 4)", 4)
    return root


@pytest.fixture
def demo(demo_deployment, tmp_path) -> Path:
    """A private copy of the demo deployment."""
    target = tmp_path / "demo"
    shutil.copytree(demo_deployment, target)
    return target


def demo_texts() -> list[str]:
    """Every text the demo wrote for its subjects (documents; chunks are cut from them)."""
    from tombstone.demo import demo_chunks, demo_documents, subject_name

    texts = []
    for n in range(1, 6):
        subject = subject_name(n)
        texts += [text for _, text, _ in demo_documents(subject)]
        texts += demo_chunks(subject)[1]
    return texts


def assert_no_content(text: str) -> None:
    """No document text, nor any run of eight words of one, occurs in ``text``."""
    for doc in demo_texts():
        assert doc not in text
        words = doc.split()
        for start in range(0, max(1, len(words) - 8), 4):
            assert " ".join(words[start:start + 8]) not in text, f"content leaked: {' '.join(words[start:start + 8])!r}"


# -- a running 'tombstone serve' ------------------------------------------------------------------


class Served:
    """A ``tombstone serve`` process: its base URL, token and the line it printed."""

    def __init__(self, proc, base: str, token: str, printed: list[str]) -> None:
        self.proc, self.base, self.token, self.printed = proc, base, token, printed

    @property
    def open_url(self) -> str:
        return f"{self.base}?token={self.token}"


def start_serve(config: Path, *extra: str, timeout: float = 60.0) -> Served:
    """Run ``tombstone serve --port 0`` and wait for it to print where it listens."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tombstone", "serve", "--config", str(config), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    printed: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        printed.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C"):
            base = next(l for l in printed if l.startswith("serving")).rsplit(" ", 1)[1]
            token = next(l for l in printed if l.startswith("token: ")).split(" ", 1)[1]
            _wait_listening(base, deadline)
            return Served(proc, base, token, printed)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    raise AssertionError("tombstone serve did not start:\n" + "\n".join(printed))


def _wait_listening(base: str, deadline: float) -> None:
    import time
    import urllib.error
    import urllib.request

    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base, timeout=2)
        except urllib.error.HTTPError as exc:
            exc.close()
            return  # 403 without the token: it is answering
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{base} never answered")


def stop_serve(served: Served) -> None:
    served.proc.terminate()
    try:
        served.proc.wait(timeout=10)
    except Exception:
        served.proc.kill()
        served.proc.wait()
    served.proc.stdout.close()


def tree_digest(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (but SQLite's own -shm/-wal side files a reader may create) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(("-shm", "-wal"))}
