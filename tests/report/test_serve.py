"""``tombstone serve`` without a browser: the token gate, the pages, the server's check of a dropped receipt,
and that nothing is written to the deployment."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from report_support import assert_no_content, start_serve, stop_serve, tree_digest
from tombstone.cli import main
from tombstone.receipt import pretty
from tombstone.report.server import create_app, open_deployment

TOKEN = "test-token-0123456789"
BASE = "http://127.0.0.1:8765"


@pytest.fixture
def client(demo):
    from starlette.testclient import TestClient

    deployment = open_deployment(str(demo / "tombstone.toml"))
    app = create_app(deployment, TOKEN, cookie="tombstone-token-8765", check_host=True)
    with TestClient(app, base_url=BASE, follow_redirects=False) as c:
        yield c


def signed_in(client):
    response = client.get("/?token=" + TOKEN)
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN in cookie
    return client


@pytest.mark.slow
def test_every_request_needs_the_token(client):
    for path in ("/", "/receipts/1", "/receipts/1.json", "/report", "/nope"):
        response = client.get(path)
        assert response.status_code == 403 and "needs the token" in response.text, path
        assert client.get(path, headers={"X-Tombstone-Token": "wrong"}).status_code == 403
        assert client.get(path + "?token=wrong").status_code == 403
    assert client.post("/api/verify", content=b"{}").status_code == 403
    # the token once, then the cookie; a POST needs it in a header as well
    signed_in(client)
    assert client.get("/").status_code == 200
    assert client.post("/api/verify", content=b"{}").status_code == 403
    assert client.post("/api/verify", content=b"{}", headers={"X-Tombstone-Token": TOKEN}).status_code == 200
    # the token in the address is dropped by the redirect, other parameters are kept
    response = client.get("/receipts/1?token=" + TOKEN + "&x=1")
    assert response.status_code == 303 and response.headers["location"] == "/receipts/1?x=1"


@pytest.mark.slow
def test_only_loopback_names_are_answered(client):
    response = client.get("/?token=" + TOKEN, headers={"Host": "evil.example:8765"})
    assert response.status_code == 400 and "loopback" in response.text
    assert client.get("/", headers={"Host": "localhost:8765", "X-Tombstone-Token": TOKEN}).status_code == 200


@pytest.mark.slow
def test_pages_show_sagas_receipts_dead_letters_chain_and_evidence(client, demo):
    signed_in(client)
    index = client.get("/")
    assert index.status_code == 200
    csp = index.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([^']+)'", csp).group(1)
    assert f'<script nonce="{nonce}">' in index.text and "default-src 'none'" in csp
    assert index.headers["x-frame-options"] == "DENY" and index.headers["referrer-policy"] == "no-referrer"
    html = index.text
    assert "user-0004" in html and "reclaim chroma (running" in html  # the erasure in progress and its step
    assert "injected fault: reclaim failed (4 of 4)" in html  # the dead letter
    assert html.index("user-0003") < html.index("user-0001")  # action first
    assert "verified head #3" in html and 'href="/receipts/3"' in html
    receipt = client.get("/receipts/3")
    assert receipt.status_code == 200
    assert "ask the recipient to delete its copy" in receipt.text and "files_scanned" in receipt.text
    assert 'id="sealed-receipt"' in receipt.text
    raw = client.get("/receipts/3.json")
    assert raw.headers["content-type"] == "application/json"
    assert json.loads(raw.content)["subject"] == "user-0003"
    assert raw.content == (demo / "receipts" / "user-0003.json").read_bytes()
    report = client.get("/report")
    assert report.status_code == 200 and "Signatures checked against" in report.text
    assert client.get("/receipts/99").status_code == 404
    for page in (index.text, receipt.text, report.text, raw.text):
        assert_no_content(page)


@pytest.mark.slow
def test_the_server_checks_a_dropped_receipt(client, demo):
    signed_in(client)
    headers = {"X-Tombstone-Token": TOKEN, "Content-Type": "application/json"}

    def check(body: bytes) -> dict:
        response = client.post("/api/verify", content=body, headers=headers)
        assert response.status_code == 200
        return response.json()

    original = (demo / "receipts" / "user-0002.json").read_bytes()
    ok = check(original)
    assert ok["ok"] and ok["stage"] == "ok" and ok["subject"] == "user-0002" and ok["sequence"] == 2
    assert ok["chain"] == "this deployment's chain holds it as receipt #2"
    data = json.loads(original)
    data["artifacts"][0]["status"] = "RESIDUAL"
    data["artifacts"][0]["measurement"] = "id found"
    tampered = check(pretty(data))
    assert not tampered["ok"] and tampered["stage"] == "hash" and "hash mismatch" in tampered["message"]
    data = json.loads(original)
    data["subject"] = "someone else"
    from tombstone.receipt import body_hash

    data["receipt_hash"] = body_hash(data)
    forged = check(pretty(data))
    assert not forged["ok"] and forged["stage"] == "signature"
    assert check(b"{not json")["stage"] == "format"
    assert check(b'{"a": 1, "a": 2}')["message"].endswith("duplicate key 'a'")
    assert check("\ufeff".encode() + b"\xff")["stage"] == "format"
    assert check(b"[]")["message"] == "the file is not a JSON object"
    assert check(b'{"kind": "x"}')["stage"] == "schema"


@pytest.mark.slow
def test_nothing_is_written_to_the_deployment(demo):
    """A real server process: pages, checks, the report; afterwards every file is as it was."""
    before = tree_digest(demo)
    served = start_serve(demo / "tombstone.toml")
    try:
        assert served.printed[0].startswith("serving ") and "read-only" in served.printed[0]
        assert served.base.startswith("http://127.0.0.1:")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(served.base + "receipts/1", timeout=10)
        assert refused.value.code == 403
        refused.value.close()
        for path in ("", "receipts/1", "receipts/3", "report"):
            request = urllib.request.Request(served.base + path, headers={"X-Tombstone-Token": served.token})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        request = urllib.request.Request(served.base + "api/verify", method="POST",
                                         data=(demo / "receipts" / "user-0001.json").read_bytes(),
                                         headers={"X-Tombstone-Token": served.token})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["ok"] is True
    finally:
        stop_serve(served)
    assert tree_digest(demo) == before
    for side in demo.glob("lineage.db-wal"):
        assert side.stat().st_size == 0


def test_serve_refuses_bad_input_in_one_line(tmp_path, demo_deployment):
    runner = CliRunner()

    def one_line(*args: str) -> str:
        result = runner.invoke(main, ["serve", *args], catch_exceptions=False)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
        return lines[0]

    config = str(demo_deployment / "tombstone.toml")
    assert "--allow-remote" in one_line("--config", config, "--host", "0.0.0.0")
    assert "config file not found" in one_line("--config", str(tmp_path / "nope.toml"))
    assert "--port" in one_line("--config", config, "--port", "70000")
    assert "--port" in one_line("--config", config, "--port", "abc")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert "cannot listen" in one_line("--config", config, "--port", str(taken.getsockname()[1]))
