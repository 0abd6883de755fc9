"""What an auditor is handed cannot turn the audit against the auditor: keys beside a handed config, a
handed config naming another host, receipts that are not Unicode or not numbers, FIFOs, subjects that
rewrite the terminal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest
import tomli_w

from test_cli import one_line_error, run


def _resign(receipt: Path, keys_dir: Path, change) -> dict:
    from tombstone.keys import load_private_key
    from tombstone.receipt.signing import sign

    data = json.loads(receipt.read_text())
    body = {k: v for k, v in data.items() if k not in ("receipt_hash", "signature")}
    change(body)
    return sign(body, load_private_key(keys_dir))


@pytest.fixture
def docs_deployment(tmp_path):
    """A docstore deployment with two subjects, one of them erased."""
    from support import write_docs
    from tombstone import Tombstone, init_deployment
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 3)
        write_docs(tomb, "bob", 3)
    result = run("erase", "alice", "--config", str(config.path))
    assert result.exit_code == 0, result.output
    return tmp_path / "d"


class _Listener:
    """A TCP port on loopback that records whether anything connected (and what it sent first)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.connected.set()
        conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=10)


@pytest.fixture
def listener():
    lst = _Listener()
    yield lst
    lst.close()


def _handed_pgvector_config(folder: Path, port: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "stores.toml"
    path.write_text(tomli_w.dumps({"stores": {"docs": {
        "backend": "pgvector", "dsn": f"postgresql://auditor@127.0.0.1:{port}/postgres?connect_timeout=3",
        "table": "chunks"}}}))
    return path


def _store_reclaim_receipt(root: Path, backend: str) -> Path:
    """A store reclaim receipt of store 'docs', re-signed by the operator's own key to say ``backend``
    (an operator can sign whatever it likes: the signature proves who said it, not that it is true)."""
    result = run("reclaim", "--store", "docs", "--config", str(root / "tombstone.toml"))
    assert result.exit_code in (0, 3), result.output
    genuine = sorted((root / "receipts").glob("store_docs*.json"))[-1]

    def claim(body):
        body["store_reclaim"]["backend"] = backend

    forged = root / "handed" / "reclaim.json"
    forged.parent.mkdir(exist_ok=True)
    forged.write_text(json.dumps(_resign(genuine, root / "keys", claim)))
    return forged


@pytest.mark.slow
def test_audit_of_a_store_reclaim_receipt_sends_no_credential_to_a_handed_host(docs_deployment, listener,
                                                                             monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "the-auditors-own-password")
    receipt = _store_reclaim_receipt(docs_deployment, "pgvector")
    config = _handed_pgvector_config(docs_deployment / "handed", listener.port)
    key = str(docs_deployment / "keys" / "signing.pub")
    result = run("audit", str(receipt), "--config", str(config), "--key", key)
    assert not listener.connected.is_set(), "the audit connected to the host the handed config names"
    assert result.exit_code == 4, result.output
    assert "pass --trust-config" in result.output
    # the control: trusting the config does connect (so the listener would have seen the first audit)
    run("audit", str(receipt), "--config", str(config), "--key", key, "--trust-config")
    assert listener.connected.wait(30)


def test_audit_refuses_a_store_whose_backend_differs_from_the_receipts(docs_deployment, listener):
    genuine = sorted((docs_deployment / "receipts").glob("alice*.json"))[0]
    config = _handed_pgvector_config(docs_deployment / "handed", listener.port)
    key = str(docs_deployment / "keys" / "signing.pub")
    result = run("audit", str(genuine), "--config", str(config), "--key", key, "--trust-config")
    assert not listener.connected.is_set(), "a docstore artifact was probed through a pgvector configuration"
    assert result.exit_code == 4, result.output
    assert "the receipt says store 'docs' is a docstore store, the configuration says pgvector" in result.output


def test_a_key_beside_a_handed_stores_only_config_is_never_trusted(docs_deployment, tmp_path, monkeypatch):
    monkeypatch.delenv("TOMBSTONE_CONFIG", raising=False)
    genuine = sorted((docs_deployment / "receipts").glob("alice*.json"))[0]
    # the bundle: a forged receipt, a stores-only config, and the forger's key in keys/ beside the config
    forger = tmp_path / "forger"
    assert run("init", "--home", str(forger)).exit_code == 0
    bundle = tmp_path / "bundle"
    (bundle / "keys").mkdir(parents=True)
    (bundle / "keys" / "signing.pub").write_bytes((forger / "keys" / "signing.pub").read_bytes())
    (bundle / "tombstone.toml").write_text(tomli_w.dumps({"stores": {"docs": {
        "backend": "docstore", "path": str(docs_deployment / "stores" / "docs" / "docstore.db")}}}))

    def all_gone(body):
        for entry in body["artifacts"]:
            entry["artifact_id"] = "forged-" + entry["artifact_id"]

    forged = bundle / "alice.json"
    forged.write_text(json.dumps(_resign(genuine, forger / "keys", all_gone)))
    err = one_line_error(run("receipt", "verify", str(forged), "--config", str(bundle / "tombstone.toml")), 2)
    assert "is not a deployment made by 'tombstone init'" in err and "pass --key" in err
    err = one_line_error(run("audit", str(forged), "--config", str(bundle / "tombstone.toml")), 2)
    assert "is not a deployment made by 'tombstone init'" in err
    # also with the private key planted beside it, as long as there is no lineage db
    (bundle / "keys" / "signing.key").write_bytes((forger / "keys" / "signing.key").read_bytes())
    (bundle / "keys" / "lineage.secret").write_bytes((forger / "keys" / "lineage.secret").read_bytes())
    one_line_error(run("receipt", "verify", str(forged), "--config", str(bundle / "tombstone.toml")), 2)
    # the operator's own deployment is trusted, and the output says which key and why
    ok = run("receipt", "verify", str(genuine), "--config", str(docs_deployment / "tombstone.toml"))
    assert ok.exit_code == 0, ok.output
    assert f"from the deployment {docs_deployment / 'tombstone.toml'}" in ok.output
    # a deployment whose signing.pub is not the public half of its signing key is refused
    (docs_deployment / "keys" / "signing.pub").write_bytes((forger / "keys" / "signing.pub").read_bytes())
    err = one_line_error(run("receipt", "verify", str(genuine), "--config", str(docs_deployment / "tombstone.toml")), 2)
    assert "is not the public half" in err


@pytest.mark.parametrize("value, why", [
    ("1e400", "out of range"),
    ('"\\ud800"', "lone UTF-16 surrogate"),
    ("-1e999", "out of range"),
])
def test_receipts_with_numbers_out_of_range_or_invalid_unicode_are_one_line_errors(docs_deployment, value, why):
    genuine = sorted((docs_deployment / "receipts").glob("alice*.json"))[0]
    text = genuine.read_text()
    bad = docs_deployment / "bad.json"
    # in the subject (a string the schema allows) or in a number the tables print
    if value.startswith('"'):
        bad.write_text(text.replace('"subject": "alice"', f'"subject": {value}', 1))
    else:
        bad.write_text(text.replace('"sequence": ', f'"sequence": {value}, "x": ', 1))
    assert bad.read_text() != text
    key = str(docs_deployment / "keys" / "signing.pub")
    for args in (("receipt", "verify", str(bad), "--key", key), ("receipt", "show", str(bad)),
                 ("audit", str(bad), "--key", key, "--config", str(docs_deployment / "tombstone.toml"))):
        err = one_line_error(run(*args), 2)
        assert why in err


def test_a_fifo_as_the_receipt_is_refused_at_once(tmp_path, docs_deployment):
    fifo = tmp_path / "receipt.json"
    os.mkfifo(fifo)
    key = str(docs_deployment / "keys" / "signing.pub")
    for args in (["receipt", "verify", str(fifo), "--key", key], ["receipt", "show", str(fifo)],
                 ["audit", str(fifo), "--key", key, "--config", str(docs_deployment / "tombstone.toml")]):
        # a subprocess with a timeout: a regression fails here instead of hanging the suite
        done = subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == f"error: receipt {fifo} is not a regular file ({fifo} is a FIFO)"


def test_two_spellings_of_one_name_are_one_subject(tmp_path):
    from support import write_docs
    from tombstone import Tombstone, init_deployment
    from tombstone_adapters.docstore import DocStore

    composed, decomposed = "Zo\u00eb", "Zoe\u0308"
    assert composed != decomposed and unicodedata.normalize("NFC", decomposed) == composed
    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    with Tombstone(config) as tomb:
        ids = write_docs(tomb, decomposed, 2, prefix="zoe")
        write_docs(tomb, composed, 1, prefix="zoe-again")
        assert tomb.lineage.subject_key(composed) == tomb.lineage.subject_key(decomposed)
    result = run("erase", composed, "--config", str(config.path))
    assert result.exit_code == 0, result.output
    receipt = json.loads(next((tmp_path / "d" / "receipts").glob("*.json")).read_text())
    assert receipt["subject"] == composed
    assert {a["artifact_id"] for a in receipt["artifacts"]} >= set(ids) and len(receipt["artifacts"]) == 3


def test_a_subject_that_is_not_unicode_is_a_one_line_error(docs_deployment):
    err = one_line_error(run("erase", "bad\ud800", "--config", str(docs_deployment / "tombstone.toml")), 2)
    assert "lone UTF-16 surrogate" in err


def test_terminal_escapes_and_bidi_marks_in_subjects_are_printed_escaped(tmp_path):
    from support import write_docs
    from tombstone import Tombstone, init_deployment
    from tombstone_adapters.docstore import DocStore

    hostile = "mallory\x1b[2K\rOK all erased\u202egpj.exe"
    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    with Tombstone(config) as tomb:
        write_docs(tomb, hostile, 2, prefix="m")
    outputs = [run("erase", hostile, "--config", str(config.path)),
               run("status", "--config", str(config.path)),
               run("receipt", "show", str(next((tmp_path / "d" / "receipts").glob("*.json")))),
               run("receipt", "list", "--config", str(config.path))]
    assert outputs[0].exit_code == 0, outputs[0].output
    for result in outputs:
        text = result.output
        assert "\x1b" not in text and "\r" not in text and "\u202e" not in text, text
    shown = "\n".join(r.output for r in outputs)
    assert "mallory\\u001b[2K\\u000dOK all erased\\u202egpj.exe" in shown
