"""The command line: the demo, receipts, and one clear line for every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tombstone.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def one_line_error(result, code: int) -> str:
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def demo_dir(tmp_path):
    result = run("demo", "--workdir", str(tmp_path / "d"), "--subjects", "3")
    assert result.exit_code == 0, result.output
    return tmp_path / "d"


def test_demo_layout_and_receipt(demo_dir):
    assert (demo_dir / "tombstone.toml").is_file()
    assert (demo_dir / "lineage.db").is_file()
    assert (demo_dir / "stores" / "docstore" / "docstore.db").is_file()
    receipt = json.loads((demo_dir / "receipts" / "user-0001.json").read_text())
    assert receipt["subject"] == "user-0001"
    assert receipt["summary"]["VERIFIED"] == 8
    assert {a["backend"] for a in receipt["artifacts"]} == {"chroma", "docstore", "exact_cache", "semantic_cache"}
    assert (demo_dir / "stores" / "chroma" / "chroma.sqlite3").is_file()
    assert (demo_dir / "keys" / "signing.key").stat().st_mode & 0o777 == 0o600
    assert (demo_dir / "keys" / "lineage.secret").stat().st_mode & 0o777 == 0o600


def test_demo_is_deterministic(tmp_path):
    from tombstone.demo import DEFAULT_SUBJECTS, DOCS_PER_SUBJECT, demo_documents

    assert demo_documents("user-0002") == demo_documents("user-0002")
    for name in ("a", "b"):
        assert run("demo", "--workdir", str(tmp_path / name), "--erase", "none").exit_code == 0
    import sqlite3

    rows = []
    for name in ("a", "b"):
        conn = sqlite3.connect(tmp_path / name / "stores" / "docstore" / "docstore.db")
        rows.append(conn.execute("SELECT id, text, metadata FROM documents ORDER BY id").fetchall())
        conn.close()
    assert rows[0] == rows[1] and len(rows[0]) == DEFAULT_SUBJECTS * DOCS_PER_SUBJECT == 24


def test_demo_refuses_to_clobber(demo_dir, tmp_path):
    one_line_error(run("demo", "--workdir", str(demo_dir)), 2)
    other = tmp_path / "precious"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    one_line_error(run("demo", "--workdir", str(other)), 2)
    assert (other / "keep.txt").read_text() == "mine"
    assert run("demo", "--workdir", str(demo_dir), "--force", "--erase", "user-0002").exit_code == 0


def test_demo_unknown_backend(tmp_path):
    assert "cannot build" in one_line_error(run("demo", "--workdir", str(tmp_path / "x"), "--backends", "nosuch"), 2)


def test_receipt_verify_accepts_and_rejects_a_change(demo_dir):
    path = demo_dir / "receipts" / "user-0001.json"
    key = str(demo_dir / "keys" / "signing.pub")
    ok = run("receipt", "verify", str(path), "--key", key)
    assert ok.exit_code == 0 and ok.output.startswith("OK ")
    data = json.loads(path.read_text())
    data["artifacts"][0]["status"] = "RESIDUAL"
    data["artifacts"][0]["measurement"] = "x"
    path.write_text(json.dumps(data))
    one_line_error(run("receipt", "verify", str(path), "--key", key), 1)


def test_receipt_verify_with_explicit_and_wrong_key(demo_dir, tmp_path):
    path = demo_dir / "receipts" / "user-0001.json"
    assert run("receipt", "verify", str(path), "--key", str(demo_dir / "keys" / "signing.pub")).exit_code == 0
    assert run("init", "--home", str(tmp_path / "other")).exit_code == 0
    err = one_line_error(run("receipt", "verify", str(path), "--key", str(tmp_path / "other" / "keys" / "signing.pub")), 1)
    assert "trusted key" in err


def test_receipt_show(demo_dir):
    result = run("receipt", "show", str(demo_dir / "receipts" / "user-0001.json"))
    assert result.exit_code == 0
    assert "VERIFIED(physical)" in result.output and "user-0001" in result.output


def test_malformed_receipt(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in one_line_error(run("receipt", "verify", str(bad)), 2)  # not a receipt: bad input
    assert "not valid JSON" in one_line_error(run("receipt", "show", str(bad)), 2)
    bad.write_text('{"schema_version": "1.0"}')
    one_line_error(run("receipt", "show", str(bad)), 1)  # a receipt that does not match its schema fails the check
    one_line_error(run("receipt", "verify", str(tmp_path / "missing.json")), 2)
    for text, why in (('{"subject": "a", "subject": "b"}', "duplicate key 'subject'"), ('{"x": NaN}', "NaN"),
                      ("[" * 100_000 + "]" * 100_000, "nested too deeply")):
        bad.write_text(text)
        assert why in one_line_error(run("receipt", "show", str(bad)), 2)


def test_unknown_subject(demo_dir):
    err = one_line_error(run("erase", "nobody", "--config", str(demo_dir / "tombstone.toml")), 2)
    assert "unknown subject" in err
    one_line_error(run("status", "nobody", "--config", str(demo_dir / "tombstone.toml")), 2)


def test_missing_config(tmp_path):
    err = one_line_error(run("erase", "x", "--config", str(tmp_path / "nope.toml")), 2)
    assert "config file not found" in err
    one_line_error(run("status", cwd=tmp_path), 2)
    broken = tmp_path / "broken.toml"
    broken.write_text("[tombstone\n")
    assert "not valid TOML" in one_line_error(run("status", "--config", str(broken)), 2)


def test_unreadable_store_loses_nothing(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--erase", "none").exit_code == 0
    store = root / "stores" / "docstore" / "docstore.db"
    moved = store.with_name("elsewhere.db")
    store.rename(moved)
    err = one_line_error(run("erase", "user-0001", "--config", str(root / "tombstone.toml")), 2)
    assert "docstore file not found" in err
    status = run("status", "--config", str(root / "tombstone.toml"))
    from tombstone.demo import DEFAULT_SUBJECTS, DOCS_PER_SUBJECT

    per_subject = 2 * DOCS_PER_SUBJECT + 2  # documents, chunks, an exact and a semantic cache entry
    assert "no erasure has been run" in status.output and f"live {DEFAULT_SUBJECTS * per_subject}" in status.output
    moved.rename(store)
    assert run("erase", "user-0001", "--config", str(root / "tombstone.toml")).exit_code == 0


def test_erase_status_resume(demo_dir):
    cfg = str(demo_dir / "tombstone.toml")
    out = demo_dir / "elsewhere" / "r.json"
    result = run("erase", "user-0002", "--config", cfg, "--out", str(out))
    assert result.exit_code == 0 and out.is_file()
    status = run("status", "--config", cfg)
    assert status.exit_code == 0 and "user-0002" in status.output and "done" in status.output
    assert "decided" in run("status", "user-0002", "--config", cfg).output
    assert "no interrupted erasure" in run("resume", "--config", cfg).output


def test_receipt_schema_command():
    result = run("receipt", "schema")
    assert json.loads(result.output)["title"] == "Tombstone erasure receipt"


def _commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        full = f"{prefix}{name}"
        yield full, command
        if isinstance(command, click.Group):
            yield from _commands(command, full + " ")


def test_every_command_has_help_and_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for name, command in _commands(main):
        assert command.help and command.help.strip(), f"{name} has no help text"
        assert f"tombstone {name}" in readme, f"'tombstone {name}' is not documented in README.md"
        assert run(*name.split(), "--help").exit_code == 0


def test_python_dash_m_and_console_script(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-m", "tombstone", "--version"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "tombstone" in result.stdout
    result = subprocess.run([sys.executable, "-m", "tombstone", "erase", "x", "--config", str(tmp_path / "no.toml")],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_import_loads_no_vendor_client():
    code = (
        "import sys, tombstone, tombstone.cli, tombstone.api;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('chromadb','faiss','qdrant_client','psycopg','pinecone','langchain_community','torch','pgserver')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_builtin_adapter_registered_through_entry_point():
    from importlib.metadata import entry_points

    from tombstone.contract import ENTRY_POINT_GROUP, adapter_class
    from tombstone_adapters.docstore import DocstoreAdapter

    names = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert names["docstore"] == "tombstone_adapters.docstore:DocstoreAdapter"
    assert adapter_class("docstore") is DocstoreAdapter


def test_the_registry_is_read_once_per_import_path(monkeypatch, tmp_path):
    """Opening several stores reads the installed distributions' entry points once; a changed import path
    (a plugin folder added) reads them again, and so finds what it brings."""
    from importlib.metadata import EntryPoint

    import tombstone.contract as contract
    from tombstone_adapters.docstore import DocstoreAdapter

    reads = []
    known = [EntryPoint(name="docstore", value="tombstone_adapters.docstore:DocstoreAdapter",
                        group=contract.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(contract, "entry_points", lambda group: reads.append(group) or list(known))
    for _ in range(3):
        assert contract.adapter_class("docstore") is DocstoreAdapter
    assert contract.available_backends() == ["docstore"] and len(reads) == 1
    known.append(EntryPoint(name="toy", value="tombstone_adapters.docstore:DocstoreAdapter",
                            group=contract.ENTRY_POINT_GROUP))
    assert contract.available_backends() == ["docstore"]  # the same path: not read again
    monkeypatch.syspath_prepend(str(tmp_path))
    assert contract.available_backends() == ["docstore", "toy"] and len(reads) == 2


def test_unknown_backend_is_a_clear_error(monkeypatch):
    from importlib.metadata import EntryPoint

    import tombstone.contract as contract
    from tombstone.errors import AdapterNotFoundError

    with pytest.raises(AdapterNotFoundError, match="no adapter installed"):
        contract.adapter_class("nosuch")
    with pytest.raises(AdapterNotFoundError, match="did you mean 'docstore'"):
        contract.adapter_class("docstor")
    # an adapter whose client library is missing fails to import: the error names the extra its entry point declares
    broken = EntryPoint(name="pinecone", value="tombstone_adapters.not_installed:Adapter [pinecone]",
                        group=contract.ENTRY_POINT_GROUP)
    monkeypatch.setattr(contract, "entry_points", lambda group: [broken])
    with pytest.raises(AdapterNotFoundError, match=r"pip install 'tombstone-rag\[pinecone\]'"):
        contract.adapter_class("pinecone")


def test_demo_with_every_embedded_backend(tmp_path):
    root = tmp_path / "all"
    result = run("demo", "--workdir", str(root), "--backends", "chroma,faiss,qdrant,docstore", "--subjects", "2")
    assert result.exit_code == 0, result.output
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    assert {a["backend"] for a in receipt["artifacts"]} == {"chroma", "faiss", "qdrant", "docstore"}
    assert receipt["summary"]["VERIFIED"] == 12 and len(receipt["artifacts"]) == 12
    # each store under its own folder; beside it only the store locks erasures and writers share, Chroma's
    # epoch token (its wrappers reopen the collection after an in-place reclaim) and the folder where the
    # processes holding it through Tombstone register (this one, while it runs)
    listing = sorted(p.name for p in (root / "stores").iterdir())
    beside = (".tombstone.lock", ".tombstone.reclaimed", ".tombstone.clients")
    assert [n for n in listing if not n.endswith(beside)] == ["chroma", "docstore", "faiss", "qdrant"]
    assert all(n.removesuffix(".tombstone.lock") in ("chroma", "docstore", "faiss", "qdrant") for n in listing
               if n.endswith(".tombstone.lock"))
    assert [n for n in listing if n.endswith(".tombstone.reclaimed")] == ["chroma.tombstone.reclaimed"]
    assert len((root / "stores" / "chroma.tombstone.reclaimed").read_bytes()) == 32  # a random token, nothing else
    assert run("receipt", "verify", str(root / "receipts" / "user-0001.json"), "--key",
               str(root / "keys" / "signing.pub")).exit_code == 0


def test_demo_pgvector_on_the_embedded_server(tmp_path):
    root = tmp_path / "pg"
    result = run("demo", "--workdir", str(root), "--backends", "pgvector", "--subjects", "2")
    assert result.exit_code == 0, result.output
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    assert [(a["backend"], a["status"], a["level"]) for a in receipt["artifacts"]] == [("pgvector", "VERIFIED", "physical")] * 3
    assert (root / "stores" / "pgvector" / "pgdata" / "PG_VERSION").is_file()


def test_demo_pinecone_runs_against_the_emulator_and_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("PINECONE_API_KEY", raising=False)
    root = tmp_path / "pc"
    result = run("demo", "--workdir", str(root), "--backends", "pinecone", "--subjects", "2")
    assert result.exit_code == 0, result.output
    assert "local EMULATOR of Pinecone's data-plane API" in result.output and "started and stopped" in result.output
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    assert {(a["status"], a["evidence"]["probes"][0]["passed"]) for a in receipt["artifacts"]} == {("UNVERIFIED", True)}
    assert all("managed" in a["reason"] for a in receipt["artifacts"])


def test_the_demo_never_sends_a_real_pinecone_key_and_forgets_the_emulator_when_it_stops(tmp_path, monkeypatch):
    import tomllib

    from tombstone_adapters.pinecone import emulator as emulator_module

    started = []

    class Recorded(emulator_module.PineconeEmulator):
        def start(self):
            started.append(self)
            return super().start()

    monkeypatch.setattr(emulator_module, "PineconeEmulator", Recorded)
    monkeypatch.setenv("PINECONE_API_KEY", "a-real-pinecone-key")
    root = tmp_path / "pc"
    result = run("demo", "--workdir", str(root), "--backends", "pinecone", "--subjects", "2")
    assert result.exit_code == 0, result.output
    assert started and started[0].requests, "the demo did not use the emulator"
    assert "a-real-pinecone-key" not in started[0].api_keys and started[0].api_keys == {"local-emulator-key"}
    store = tomllib.loads((root / "tombstone.toml").read_text())["stores"]["pinecone"]
    assert "host" not in store and "allow_insecure_host" not in store, store  # the emulator has stopped
    assert store["api_key_env"] == "PINECONE_EMULATOR_KEY"
    err = one_line_error(run("erase", "user-0002", "--config", str(root / "tombstone.toml")), 2)
    assert "emulator, which stopped" in err and "--allow-missing-store pinecone" in err


def test_erase_with_pinecone_and_no_api_key_is_one_line(tmp_path, monkeypatch):
    from tombstone.api import init_deployment
    from tombstone.lineage.db import ArtifactRecord
    from tombstone import Tombstone

    monkeypatch.delenv("PINECONE_API_KEY", raising=False)
    config = init_deployment(tmp_path / "d", {"pc": {"backend": "pinecone", "host": "http://127.0.0.1:9",
                                                     "allow_insecure_host": True}})
    with Tombstone(config) as tomb:
        tomb.lineage.record_artifacts("alice", [ArtifactRecord("pc", "alice-1", "pinecone", "vector")])
    err = one_line_error(run("erase", "alice", "--config", str(config.path)), 2)
    assert "set PINECONE_API_KEY" in err


def test_erase_reports_progress_as_plain_lines_when_not_a_terminal(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore,chroma", "--erase", "none").exit_code == 0
    result = run("erase", "user-0001", "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0
    # the snapshot step (the semantic level's baseline, taken before anything is hidden) comes first
    assert result.stderr.splitlines() == ["[1/9] snapshot chroma", "[2/9] snapshot docstore",
                                          "[3/9] suppress chroma", "[4/9] suppress docstore", "[5/9] reclaim chroma",
                                          "[6/9] reclaim docstore", "[7/9] verify chroma", "[8/9] verify docstore",
                                          "[9/9] receipt"]
