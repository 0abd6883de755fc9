"""``tombstone report``: per subject, per store and level, across subjects, the chain; HTML, Markdown, JSON."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from report_support import LONG_ID, Chain, assert_no_content, public_pem, verified
from tombstone.cli import main
from tombstone.errors import ConfigError
from tombstone.receipt import pretty
from tombstone.report import build_report, read_files, render
from tombstone.report.collect import chain_state
from tombstone.report.readonly import ReadOnlyLineage


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result, code: int) -> str:
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def report_json(*args: str) -> tuple[int, dict]:
    result = run("report", *args, "--format", "json")
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def test_per_subject_outcomes_statuses_and_actions(tmp_path, chain, key_file):
    chain.write(tmp_path / "r")
    code, data = report_json(str(tmp_path / "r"), "--key", str(key_file))
    assert code == 3  # subjects need action
    by = {s["subject"]: s for s in data["subjects"]}
    assert set(by) == {"alice", "Zoë <b>Ünïcode</b> 🚀", "bob", "nobody"}
    # the subjects that need action come first
    assert [s["state"] for s in data["subjects"]] == ["action", "action", "action", "done"]
    assert data["subjects"][-1]["subject"] == "alice"
    assert data["needs_action"] == [s["subject"] for s in data["subjects"][:3]]
    assert by["alice"]["outcome"] == "Erased and verified: all 2 artifacts in 2 stores, VERIFIED(physical)."
    zoe = by["Zoë <b>Ünïcode</b> 🚀"]
    assert zoe["outcome"].startswith("Action needed: 1 of 3 artifacts in 3 stores need a person (1 NEEDS_HUMAN)")
    assert zoe["actions"] == ["ask the recipient to delete its copy and keep their confirmation"]
    stores = {s["store"]: s["statuses"] for s in zoe["latest"]["stores"]}
    [physical] = stores["docs"]
    assert physical["status"] == "VERIFIED(physical)" and physical["artifact_ids"] == [LONG_ID]
    assert "byte scan of every file" in physical["shows"] and "backups" in physical["does_not_show"]
    [managed] = stores["pc"]
    assert managed["status"].startswith("UNVERIFIED(physical: managed") and managed["action"] is None
    assert managed["ceiling"] and "managed service" in managed["shows"] and "logical probe passed" in managed["shows"]
    [human] = stores["third-party"]
    assert human["action"] == "ask the recipient to delete its copy and keep their confirmation"
    bob = by["bob"]
    assert "1 RESIDUAL, 1 UNVERIFIED" in bob["outcome"]
    assert any("tombstone dlq retry" in a for a in bob["actions"])
    assert by["nobody"]["outcome"].startswith("Nothing erased: the lineage db records no artifact")
    assert len(zoe["latest"]["out_of_scope"]) == 5
    assert data["signatures"]["checked"] and data["chain"]["state"] == "complete"
    assert data["chain"]["head"]["sequence"] == 4 and data["chain"]["head"]["verified"]
    totals = data["totals"]["by_store"]
    assert totals["docs"]["VERIFIED"] == 3 and totals["docs"]["RESIDUAL"] == 1 and totals["pc"]["UNVERIFIED"] == 1
    assert totals["third-party"]["NEEDS_HUMAN"] == 1


def test_signatures_only_against_a_named_key(tmp_path, chain, key):
    directory = tmp_path / "r"
    chain.write(directory)
    (directory / "signing.pub").write_bytes(public_pem(key))  # a key next to the receipts is never used
    code, data = report_json(str(directory))
    assert not data["signatures"]["checked"] and data["signatures"]["key"] is None
    assert all(s["latest"]["integrity"]["state"] == "not checked" for s in data["subjects"])
    assert "signature not checked" in data["subjects"][0]["outcome"]
    assert not data["chain"]["head"]["verified"]
    md = run("report", str(directory), "--format", "md").stdout
    assert "**Signature not checked**" in md and "verified head" not in md
    html = run("report", str(directory)).stdout
    assert "Signature not checked." in html


def test_a_tampered_receipt_fails_and_is_named(tmp_path, chain, key_file):
    paths = chain.write(tmp_path / "r")
    data = json.loads(paths[0].read_text())
    data["artifacts"][0]["status"] = "VERIFIED"
    data["subject"] = "mallory"
    paths[0].write_bytes(pretty(data))
    result = run("report", str(tmp_path / "r"), "--key", str(key_file), "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    first = report["subjects"][0]
    assert first["state"] == "failed" and first["subject"] == "mallory"
    assert first["outcome"].startswith("Receipt #1 does not verify (receipt hash mismatch")
    assert "left out of the chain because they fail their check: #1" in report["chain"]["notes"]
    assert report["chain"]["gaps"] == ["#1"]
    assert report["totals"]["left_out_of_counts"] == 1
    # without a key the hash still gives it away; re-hashing it does not get past a key
    from tombstone.receipt import body_hash

    data["receipt_hash"] = body_hash(data)
    paths[0].write_bytes(pretty(data))
    code, unchecked = report_json(str(tmp_path / "r"))
    assert unchecked["subjects"][0]["state"] != "failed"  # a forger can recompute a hash...
    code, checked = report_json(str(tmp_path / "r"), "--key", str(key_file))
    assert code == 1 and checked["subjects"][0]["latest"]["integrity"]["text"].startswith(
        "FAILS: receipt signature does not verify")  # ...not a signature


def test_a_receipt_signed_by_another_key_fails(tmp_path, chain, key_file):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = Chain(Ed25519PrivateKey.generate())
    other.add("eve", [verified("eve-doc-0001")])
    other.write(tmp_path / "r")
    code, data = report_json(str(tmp_path / "r" / "receipt-000001.json"), "--key", str(key_file))
    assert code == 1 and "not by the trusted key" in data["subjects"][0]["outcome"]


def test_chain_gaps_are_named_and_broken_links_fail(tmp_path, chain, key, key_file):
    chain.write(tmp_path / "some", which=[1, 3])
    code, data = report_json(str(tmp_path / "some"), "--key", str(key_file))
    assert data["chain"]["state"] == "gaps" and data["chain"]["gaps"] == ["#2"]
    assert code == 3  # gaps are not failures: a report may cover some subjects only
    # two different receipts claiming one position break the chain
    rogue = Chain(key)
    rogue.add("alice", [verified("alice-doc-0009")])
    rogue.write(tmp_path / "rogue")
    code, data = report_json(str(tmp_path / "some"), str(tmp_path / "rogue"), "--key", str(key_file))
    assert code == 1 and data["chain"]["state"] == "broken"
    assert data["chain"]["problems"][0].startswith("two different receipts claim #1")


def test_chain_state_names_a_link_that_does_not_match(chain):
    from tombstone.report.collect import Integrity, ReceiptView, Source
    from tombstone.receipt import Receipt

    views = []
    for n, data in enumerate(chain.receipts):
        if n == 2:
            data = {**data, "previous_receipt_hash": "sha256:" + "0" * 64}
        views.append(ReceiptView(Source("x", Receipt.parse(data)), Integrity("not checked", ""), []))
    state = chain_state(views, signatures_checked=False)
    assert state.state == "broken" and state.problems[0].startswith("receipt #3 names previous sha256:000")
    assert state.text.startswith("BROKEN: receipt #3")


def test_anchor_and_duplicates(tmp_path, chain, key_file):
    paths = chain.write(tmp_path / "r")
    head = chain.receipts[-1]["receipt_hash"]
    code, data = report_json(str(tmp_path / "r"), str(paths[0]), "--key", str(key_file), "--anchor", f"4:{head}")
    assert data["totals"]["subjects"] == 4  # the same file twice is one receipt
    assert "receipt #4 matches the published head" in data["chain"]["notes"]
    code, data = report_json(str(tmp_path / "r"), "--key", str(key_file), "--anchor", "4:sha256:" + "1" * 64)
    assert code == 1 and "(rewritten)" in data["chain"]["problems"][0]
    one_line_error(run("report", str(tmp_path / "r"), "--anchor", "nonsense"), 2)


def test_earlier_receipts_of_a_subject(tmp_path, key, key_file):
    c = Chain(key)
    c.add("carol", [dead_letter_entry()])
    c.add("carol", [verified("carol-vec-0001", "vectors", "chroma")])
    c.write(tmp_path / "r")
    code, data = report_json(str(tmp_path / "r"), "--key", str(key_file))
    assert code == 0
    [carol] = data["subjects"]
    assert carol["latest"]["sequence"] == 2 and [e["sequence"] for e in carol["earlier"]] == [1]
    assert carol["state"] == "done"


def dead_letter_entry():
    from report_support import dead_letter

    return dead_letter("carol-vec-0001")


def test_html_is_self_contained_escaped_and_printable(tmp_path, chain, key_file):
    chain.write(tmp_path / "r")
    html = run("report", str(tmp_path / "r"), "--key", str(key_file)).stdout
    assert html.startswith("<!doctype html>")
    # nothing is fetched: no external references of any kind
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html and "<script" not in html and "@import" not in html and "url(" not in html
    assert "http://" not in html and "https://" not in html
    assert "<svg" in html and "<style>" in html
    assert "@page { size: A4" in html and "@media print" in html
    # the subject is text, never markup
    assert "Zoë &lt;b&gt;Ünïcode&lt;/b&gt; 🚀" in html and "<b>Ünïcode</b>" not in html
    assert LONG_ID in html and "overflow-wrap: anywhere" in html
    assert "ask the recipient to delete its copy and keep their confirmation" in html
    assert html.index("Still needs action") < html.index('id="subjects"')


def test_markdown_escapes_and_lists(tmp_path, chain, key_file):
    chain.write(tmp_path / "r")
    md = run("report", str(tmp_path / "r"), "--key", str(key_file), "--format", "md").stdout
    assert md.startswith("# Erasure report")
    assert "### Zoë \\<b\\>Ünïcode\\</b\\> 🚀" in md
    assert "| store | status | artifacts | next step |" in md
    assert "### Still needs action" in md and "Always out of scope:" in md
    assert "| store | RESIDUAL | NEEDS_HUMAN | UNVERIFIED | VERIFIED |" in md
    assert "| docs | 1 | 0 | 0 | 3 |" in md


def test_out_writes_a_file_and_never_over_a_receipt(tmp_path, chain, key_file):
    paths = chain.write(tmp_path / "r")
    out = tmp_path / "report.html"
    result = run("report", str(tmp_path / "r"), "--key", str(key_file), "--out", str(out))
    assert result.exit_code == 3 and result.stdout == ""
    assert out.read_text().startswith("<!doctype html>")
    assert "4 subject(s), 3 needing action" in result.stderr
    before = paths[0].read_bytes()
    one_line_error(run("report", str(tmp_path / "r"), "--out", str(paths[0])), 2)
    assert paths[0].read_bytes() == before
    one_line_error(run("report", str(tmp_path / "r"), "--out", str(tmp_path / "no" / "such" / "r.html")), 2)


@pytest.mark.parametrize("setup, args", [
    ("none", []),
    ("missing", ["{d}/nope.json"]),
    ("notjson", ["{d}/bad.json"]),
    ("emptydir", ["{d}/empty"]),
    ("badkey", ["{d}/r", "--key", "{d}/bad.pub"]),
    ("noconfig", ["--config", "{d}/nope.toml"]),
    ("badformat", ["{d}/r", "--format", "pdf"]),
])
def test_bad_input_is_one_line_exit_2(tmp_path, chain, setup, args):
    chain.write(tmp_path / "r")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.pub").write_text("not a key")
    one_line_error(run("report", *[a.format(d=tmp_path) for a in args]), 2)


def test_schema_failure_is_a_failed_check(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"kind": "tombstone.erasure-receipt"}))
    one_line_error(run("report", str(tmp_path / "r.json")), 1)


def test_never_any_content(tmp_path, chain, key_file):
    chain.write(tmp_path / "r")
    for fmt in ("html", "md", "json"):
        out = run("report", str(tmp_path / "r"), "--key", str(key_file), "--format", fmt).stdout
        assert "text of" not in out  # receipts carry no content; nothing else is read


@pytest.mark.slow
def test_the_deployment_sealed_copies_via_config(demo):
    files_before = {p: p.read_bytes() for p in (demo / "receipts").iterdir()}
    db_before = (demo / "lineage.db").read_bytes()
    result = run("report", "--config", str(demo / "tombstone.toml"), "--format", "json")
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["signatures"]["checked"] and "the deployment's key" in data["signatures"]["key"]
    assert [s["subject"] for s in data["subjects"]] == ["user-0003", "user-0001", "user-0002"]
    assert data["chain"]["state"] == "complete" and "the head matches the deployment's chain head" in data["chain"]["notes"]
    # the header says where the sealed copies really are: the lineage db, not the config file
    assert data["sources"] == [f"the sealed copies in the lineage db {demo / 'lineage.db'}"
                               f" (configured by {demo / 'tombstone.toml'})"]
    assert_no_content(result.stdout)
    for fmt in ("html", "md"):
        assert_no_content(run("report", "--config", str(demo / "tombstone.toml"), "--format", fmt).stdout)
    # files given with --config: the deployment's key checks them and its head shows what is missing
    result = run("report", str(demo / "receipts" / "user-0001.json"), "--config", str(demo / "tombstone.toml"),
                 "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["chain"]["gaps"] == ["#2..#3"]
    assert data["subjects"][0]["latest"]["integrity"]["state"] == "verified"
    # nothing was written to the deployment
    assert (demo / "lineage.db").read_bytes() == db_before
    assert {p: p.read_bytes() for p in (demo / "receipts").iterdir()} == files_before


def test_read_only_lineage_cannot_write(demo_deployment, tmp_path):
    import sqlite3

    from tombstone.config import load_config

    root = tmp_path / "d"
    shutil.copytree(demo_deployment, root)
    config = load_config(root / "tombstone.toml")
    before = (root / "lineage.db").read_bytes()
    with ReadOnlyLineage.open(config) as lineage:
        assert len(lineage.receipts()) == 3 and lineage.chain_head()[0] == 3
        assert [s["subject"] for s in lineage.sagas("running")] == ["user-0004"]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            lineage.journal("x", "y", "", "begin")
    assert (root / "lineage.db").read_bytes() == before
    (root / "keys" / "lineage.secret").unlink()
    with pytest.raises(Exception, match="no lineage secret"):
        ReadOnlyLineage.open(config)


def test_build_report_reads_the_typed_receipt(tmp_path, chain, key):
    sources = read_files(chain.write(tmp_path / "r"))
    report = build_report(sources, key=key.public_key(), key_source="test", source_names=["r"])
    assert report.signatures_checked and not report.failed
    assert [s.subject for s in report.needs_action] == ["Zoë <b>Ünïcode</b> 🚀", "bob", "nobody"]
    for fmt in ("html", "md", "json"):
        assert render(report, fmt)
    with pytest.raises(ConfigError):
        chain_state([], signatures_checked=False, anchor="x")  # malformed anchor is bad input
    assert chain_state([], signatures_checked=False).state == "empty"


@pytest.mark.slow
@pytest.mark.parametrize("env, outcome", [
    ({"TOMBSTONE_CHROMIUM": "/nonexistent/chromium"}, "error"),  # pytest.fail in a fixture: an error, exit 1
    ({"TOMBSTONE_CHROMIUM": "/nonexistent/chromium", "TOMBSTONE_SKIP_BROWSER": "1"}, "skipped"),
])
def test_browser_tests_fail_without_chromium_unless_skipped_on_purpose(tmp_path, env, outcome):
    import os
    import subprocess
    import sys

    test = Path(__file__).with_name("test_browser.py")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", f"{test}::test_a_request_without_the_token_is_refused", "-q", "-rfs",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}"],
        capture_output=True, text=True, cwd=test.parents[2],
        env={**{k: v for k, v in os.environ.items() if k != "TOMBSTONE_SKIP_BROWSER"}, **env}, timeout=300)
    assert f"1 {outcome}" in result.stdout, result.stdout[-2000:]
    if outcome == "error":
        assert result.returncode == 1
        assert "Chromium not found at /nonexistent/chromium: install it with 'apt-get update && apt-get install -y" \
               " chromium'" in result.stdout
    else:
        assert result.returncode == 0 and "TOMBSTONE_SKIP_BROWSER=1" in result.stdout


def test_a_deployment_without_receipts(tmp_path):
    from tombstone import init_deployment

    config = init_deployment(tmp_path / "empty")
    result = run("report", "--config", str(config.path), "--format", "md")
    assert result.exit_code == 0 and "No receipts: no erasure has finished yet." in result.stdout
    assert "Chain: no receipts" in result.stdout
    html = run("report", "--config", str(config.path)).stdout
    assert "No subject needs action." in html and "No artifacts to count." in html


@pytest.mark.slow
def test_a_lineage_db_on_postgresql_is_opened_read_only(tmp_path):
    import os
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from tombstone import Tombstone, demo, init_deployment
    from tombstone.config import load_config
    from tombstone_adapters.pgvector.server import embedded_dsn

    server = os.environ.get("TOMBSTONE_TEST_PG_DSN") or embedded_dsn(tmp_path / "pg" / "data")
    name = f"lineage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    dsn = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}},
                             lineage_dsn=dsn)
    with Tombstone(config) as tomb:
        demo.fill(tomb, "docs", ["user-0001", "user-0002"])
        tomb.erase("user-0001")
    code, data = report_json("--config", str(config.path))
    assert code == 0 and [s["subject"] for s in data["subjects"]] == ["user-0001"]
    assert data["subjects"][0]["latest"]["integrity"]["state"] == "verified"
    with ReadOnlyLineage.open(load_config(config.path)) as lineage:
        assert lineage.chain_head()[0] == 1
        with pytest.raises(psycopg.Error, match="read-only transaction"):
            lineage.journal("x", "y", "", "begin")


def test_the_sealed_copies_place_names_a_postgresql_lineage_db_without_its_password(tmp_path):
    from types import SimpleNamespace

    from tombstone.report.collect import sealed_copies_place

    config = SimpleNamespace(lineage_dsn="postgresql://tomb:s3cret@db.internal/tombstone", lineage_db=None,
                             path=tmp_path / "tombstone.toml")
    said = sealed_copies_place(config)
    assert "postgresql://tomb:***@db.internal/tombstone" in said and "s3cret" not in said
    assert str(tmp_path / "tombstone.toml") in said
