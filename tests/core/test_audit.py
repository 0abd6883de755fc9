"""The independent verifier: agreement, contradiction after restoring old store files, tampering, chains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tombstone.audit import audit
from tombstone.errors import LineageError
from tombstone.lineage.db import LineageDB

from test_cli import one_line_error, run


@pytest.fixture
def deployed(tmp_path):
    root = tmp_path / "d"
    result = run("demo", "--workdir", str(root), "--backends", "chroma,docstore,faiss,qdrant", "--subjects", "3",
                 "--erase", "none")
    assert result.exit_code == 0, result.output
    return root


def erase(root: Path, subject: str) -> Path:
    result = run("erase", subject, "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    return root / "receipts" / f"{subject}.json"


def auditor_config(root: Path, *, drop: tuple[str, ...] = (), **extra_stores) -> Path:
    """What an auditor is handed: a stores-only config (no lineage db, no keys) in a folder of its own."""
    import tomli_w

    from tombstone.config import load_config

    operator = load_config(root / "tombstone.toml")
    stores = {name: {"backend": cfg.backend, **cfg.options} for name, cfg in operator.stores.items() if name not in drop}
    stores.update(extra_stores)
    folder = root.parent / "auditor"
    folder.mkdir(exist_ok=True)
    path = folder / "stores.toml"
    path.write_text(tomli_w.dumps({"stores": stores}))
    return path


def audit_args(root: Path, *more: str) -> list[str]:
    return ["--config", str(auditor_config(root)), "--key", str(root / "keys" / "signing.pub"), *more]


def test_fresh_receipt_agrees_without_the_lineage_db(deployed):
    receipt = erase(deployed, "user-0001")
    (deployed / "lineage.db").rename(deployed / "lineage.db.away")
    (deployed / "keys" / "lineage.secret").unlink()
    result = run("audit", str(receipt), *audit_args(deployed))
    assert result.exit_code == 0, result.output
    assert "integrity: ok" in result.output and " NO" not in result.output and "unchecked" not in result.output
    assert "key:       ed25519:" in result.output and f"from --key {deployed / 'keys' / 'signing.pub'}" in result.output
    assert "fragment probes not re-run" in result.output
    assert not (deployed / "lineage.db").exists(), "the verifier must not create or open a lineage db"


def test_the_verifier_refuses_to_open_a_lineage_db(deployed, monkeypatch):
    receipt = erase(deployed, "user-0001")
    opened = []
    real = LineageDB.__init__

    def spy(self, *args, **kwargs):
        opened.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LineageDB, "__init__", spy)
    report = audit(receipt, config_path=str(auditor_config(deployed)), key_path=str(deployed / "keys" / "signing.pub"))
    assert report.agree and report.verdict == "agree" and len(opened) == 0
    from tombstone.lineage.db import forbid_lineage
    from tombstone.keys import LineageSecret

    with forbid_lineage("the independent verifier"), pytest.raises(LineageError, match="does not open"):
        LineageDB(deployed / "lineage.db", LineageSecret(b"x" * 32))


def test_restored_store_files_contradict_the_receipt(deployed):
    before = deployed.parent / "stores-before"
    shutil.copytree(deployed / "stores", before)
    receipt = erase(deployed, "user-0002")
    shutil.rmtree(deployed / "stores")
    shutil.copytree(before, deployed / "stores")  # the operator (or a backup restore) brings the data back
    from tombstone_adapters.qdrant.adapter import close_local_clients

    close_local_clients()
    result = run("audit", str(receipt), "--json", *audit_args(deployed))
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    erased_ids = [a["artifact_id"] for a in json.loads(receipt.read_text())["artifacts"]]
    contradicted = {r["artifact_id"] for r in report["artifacts"] if r["verdict"] == "contradicted"}
    assert contradicted == set(erased_ids), report
    assert report["verdict"] == "contradicted" and not report["agree"]
    assert all(r["audit_found"].startswith("present") for r in report["artifacts"] if not r["agree"])
    text = run("audit", str(receipt), *audit_args(deployed))
    assert text.exit_code == 1 and "CONTRADICTED:" in text.output


def test_tampered_receipt_is_named(deployed):
    receipt = erase(deployed, "user-0001")
    data = json.loads(receipt.read_text())
    data["artifacts"][0]["status"] = "UNVERIFIED"
    data["artifacts"][0]["level"] = None
    data["artifacts"][0]["reason"] = "changed"
    receipt.write_text(json.dumps(data))
    result = run("audit", str(receipt), *audit_args(deployed))
    assert result.exit_code == 1 and "integrity: failed: receipt hash mismatch" in result.output


def test_chain_links_truncation_and_rewrite(deployed):
    first, second, third = (erase(deployed, s) for s in ("user-0001", "user-0002", "user-0003"))
    head = run("receipt", "head", "--config", str(deployed / "tombstone.toml"))
    assert head.exit_code == 0
    anchor = head.output.strip()
    assert anchor.startswith("3:sha256:")
    ok = run("audit", str(third), "--previous", str(first), "--previous", str(second), "--anchor", anchor,
             *audit_args(deployed))
    assert ok.exit_code == 0 and "chain:     ok (3 receipts, #1..#3, anchored)" in ok.output
    missing = run("audit", str(third), "--previous", str(first), *audit_args(deployed))
    assert missing.exit_code == 1 and "receipt #2 is missing" in missing.output
    truncated = run("audit", str(second), "--previous", str(first), "--anchor", anchor, *audit_args(deployed))
    assert truncated.exit_code == 1 and "truncated" in truncated.output
    other = json.loads(second.read_text())
    forged_anchor = f"2:sha256:{'0' * 64}"
    rewritten = run("audit", str(second), "--previous", str(first), "--anchor", forged_anchor, *audit_args(deployed))
    assert rewritten.exit_code == 1 and "rewritten" in rewritten.output
    assert other["previous_receipt_hash"] == json.loads(first.read_text())["receipt_hash"]


def test_audit_bad_input(tmp_path, deployed):
    one_line_error(run("audit", str(tmp_path / "missing.json")), 2)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    one_line_error(run("audit", str(bad), "--config", str(deployed / "tombstone.toml")), 2)
    receipt = erase(deployed, "user-0001")
    one_line_error(run("audit", str(receipt), "--anchor", "nonsense", *audit_args(deployed)), 2)  # bad input, as the README says


def _cli(*args: str, timeout: float = 300):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, timeout=timeout)


def _tree_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (links by their target), by relative path."""
    import hashlib
    import os

    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                out[rel] = "dir"
    return out


EMBEDDED = "chroma,docstore,exact_cache,faiss,qdrant,semantic_cache"


def test_the_audit_changes_no_byte_of_any_store(tmp_path):
    root = tmp_path / "d"
    built = _cli("demo", "--workdir", str(root), "--backends", EMBEDDED, "--subjects", "3", "--erase", "none")
    assert built.returncode == 0, built.stdout + built.stderr
    erased = _cli("erase", "user-0002", "--config", str(root / "tombstone.toml"))
    assert erased.returncode == 0, erased.stdout + erased.stderr
    before = _tree_hashes(root / "stores")
    assert any(name.endswith("storage.sqlite") for name in before) and any("faiss" in n for n in before)
    audited = _cli("audit", str(root / "receipts" / "user-0002.json"), *audit_args(root))
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "unchecked" not in audited.stdout and "VERIFIED(physical)" in audited.stdout
    after = _tree_hashes(root / "stores")
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}


def test_a_claim_the_auditor_could_not_recheck_is_unchecked_and_exits_4(deployed):
    receipt = erase(deployed, "user-0001")
    config = auditor_config(deployed, drop=("faiss",))
    result = run("audit", str(receipt), "--config", str(config), "--key", str(deployed / "keys" / "signing.pub"))
    assert result.exit_code == 4, result.output
    assert "UNCHECKED:" in result.output and "CONTRADICTED" not in result.output
    report = json.loads(run("audit", str(receipt), "--json", "--config", str(config), "--key",
                            str(deployed / "keys" / "signing.pub")).output)
    assert report["verdict"] == "unchecked" and not report["agree"]
    verdicts = {r["store"]: r["verdict"] for r in report["artifacts"]}
    assert verdicts["faiss"] == "unchecked" and verdicts["chroma"] == "agree", verdicts
    faiss_row = next(r for r in report["artifacts"] if r["store"] == "faiss")
    assert any("not in the configuration" in n for n in faiss_row["not_run"]), faiss_row


def test_a_read_only_adapter_refuses_to_change_the_store(deployed):
    from tombstone.contract import adapter_class
    from tombstone.config import load_config
    from tombstone.errors import AdapterError
    from tombstone.lineage.records import ArtifactRecord

    cfg = load_config(deployed / "tombstone.toml").stores["docstore"]
    adapter = adapter_class("docstore").open_read_only("docstore", cfg.options)
    try:
        art = ArtifactRecord("docstore", "x", "docstore", "document")
        for write in (adapter.suppress, adapter.reclaim, adapter.native_delete):
            with pytest.raises(AdapterError, match="opened read-only"):
                write([art])
    finally:
        adapter.close()


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_the_audit_runs_nothing_a_store_holds(tmp_path):
    import pickle
    import sqlite3

    root = tmp_path / "d"
    assert _cli("demo", "--workdir", str(root), "--backends", "qdrant", "--subjects", "2").returncode == 0
    marker = tmp_path / "pwned"
    storage = next((root / "stores").rglob("storage.sqlite"))
    conn = sqlite3.connect(storage)
    with conn:
        conn.execute("INSERT INTO points VALUES (?, ?)", ("planted", pickle.dumps(_Planted(marker))))
    conn.close()
    result = _cli("audit", str(root / "receipts" / "user-0001.json"), *audit_args(root))
    assert not marker.exists(), "a stored pickle ran during the audit"
    assert result.returncode == 4, result.stdout + result.stderr
    assert "holds a row that is not a plain point" in result.stdout


def _resign(receipt: Path, keys_dir: Path, change) -> dict:
    from tombstone.keys import load_private_key
    from tombstone.receipt.signing import sign

    data = json.loads(receipt.read_text())
    body = {k: v for k, v in data.items() if k not in ("receipt_hash", "signature")}
    change(body)
    return sign(body, load_private_key(keys_dir))


def test_a_key_beside_the_receipt_is_never_trusted(deployed, tmp_path, monkeypatch):
    monkeypatch.delenv("TOMBSTONE_CONFIG", raising=False)
    genuine = erase(deployed, "user-0001")
    forger = tmp_path / "forged"
    assert run("init", "--home", str(forger)).exit_code == 0

    def claim_all_verified(body):
        for entry in body["artifacts"]:
            entry["artifact_id"] = "forged-" + entry["artifact_id"]

    forged = forger / "receipts" / "user-0001.json"
    forged.parent.mkdir(parents=True, exist_ok=True)
    forged.write_text(json.dumps(_resign(genuine, forger / "keys", claim_all_verified)))
    # a tombstone.toml and its key sit right beside the forged receipt: neither command looks there
    err = one_line_error(run("receipt", "verify", str(forged)), 2)
    assert "pass --key" in err and "published public key" in err
    one_line_error(run("audit", str(forged), "--key", str(deployed / "keys" / "signing.pub")), 2)
    operator_key = str(deployed / "keys" / "signing.pub")
    err = one_line_error(run("receipt", "verify", str(forged), "--key", operator_key), 1)
    assert f"checked against ed25519:" in err and f"--key {operator_key}" in err
    ok = run("receipt", "verify", str(genuine), "--key", operator_key)
    assert ok.exit_code == 0 and f"trusted:   ed25519:" in ok.output and f"from --key {operator_key}" in ok.output
    via_config = run("receipt", "verify", str(genuine), "--config", str(deployed / "tombstone.toml"))
    assert via_config.exit_code == 0 and f"from the deployment {deployed / 'tombstone.toml'}" in via_config.output
    monkeypatch.setenv("TOMBSTONE_CONFIG", str(deployed / "tombstone.toml"))
    assert run("receipt", "verify", str(genuine)).exit_code == 0


def test_a_private_key_given_as_the_trusted_key_is_refused(deployed):
    receipt = erase(deployed, "user-0001")
    private = str(deployed / "keys" / "signing.key")
    assert "is a private key" in one_line_error(run("receipt", "verify", str(receipt), "--key", private), 2)
    assert "is a private key" in one_line_error(run("audit", str(receipt), "--config", str(auditor_config(deployed)),
                                                    "--key", private), 2)
