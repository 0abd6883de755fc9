"""End to end in a real browser: headless Chromium from the distribution's packages, driven by Playwright.

The report and the viewer render; a tampered receipt is shown failing (in the page and by the server); a
request without the token is refused; no page ever holds a document's text; the JavaScript canonical form
agrees byte for byte with Python's. Screenshots, the report and its PDF are kept under test-artifacts/.

Chromium is /usr/bin/chromium (``apt-get install -y chromium``) or $TOMBSTONE_CHROMIUM; nothing downloads
a browser build. Without it these tests fail and say so; TOMBSTONE_SKIP_BROWSER=1 skips them on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from report_support import ARTIFACTS, LONG_ID, Chain, assert_no_content, public_pem, start_serve, stop_serve, tree_digest
from tombstone.receipt import body_hash, canonical_bytes, pretty
from tombstone.receipt.canonical import signed_body
from tombstone.receipt.signing import parse_strict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("TOMBSTONE_CHROMIUM", "/usr/bin/chromium")
HOW_TO_INSTALL = ("install it with 'apt-get update && apt-get install -y chromium' (or point TOMBSTONE_CHROMIUM at a"
                  " Chromium binary); set TOMBSTONE_SKIP_BROWSER=1 to skip the browser tests on purpose")


@pytest.fixture(scope="session")
def browser():
    if os.environ.get("TOMBSTONE_SKIP_BROWSER") == "1":
        pytest.skip("TOMBSTONE_SKIP_BROWSER=1: browser tests skipped on purpose")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: {HOW_TO_INSTALL}", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[dev]'", pytrace=False)
    manager = sync_playwright().start()
    try:
        chromium = manager.chromium.launch(executable_path=CHROMIUM, headless=True)
    except Exception as exc:  # a binary that does not start is a failure too, with its reason
        manager.stop()
        pytest.fail(f"Chromium at {CHROMIUM} did not start: {exc}", pytrace=False)
    yield chromium
    chromium.close()
    manager.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo_deployment):
    root = tmp_path_factory.mktemp("served") / "demo"
    shutil.copytree(demo_deployment, root)
    before = tree_digest(root)
    server = start_serve(root / "tombstone.toml")
    server.root = root  # type: ignore[attr-defined]
    yield server
    stop_serve(server)
    assert tree_digest(root) == before, "the viewer wrote to the deployment"


def keep(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


def tampered_copy(source: Path, target: Path) -> Path:
    """The receipt with its first artifact that is not VERIFIED made VERIFIED(physical), summary and all."""
    data = json.loads(source.read_text())
    art = next((a for a in data["artifacts"] if a["status"] != "VERIFIED"), data["artifacts"][0])
    data["summary"][art["status"]] -= 1
    data["summary"]["VERIFIED"] += 1
    art.update(status="VERIFIED", level="physical", reason=None, measurement=None, action=None)
    target.write_bytes(pretty(data))
    return target


def no_horizontal_overflow(pg) -> bool:
    return pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


# -- the report ------------------------------------------------------------------------------------


def test_the_report_renders_prints_and_fetches_nothing(page, demo, tmp_path):
    out = keep("report.html")
    result = subprocess.run([sys.executable, "-m", "tombstone", "report", "--config", str(demo / "tombstone.toml"),
                             "--out", str(out)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 3, result.stderr  # user-0003 has a copy at a third party
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(out.as_uri())
    assert requests == [out.as_uri()], f"the report fetched something: {requests}"
    assert page.locator("h1").inner_text() == "Erasure report"
    assert page.locator("#signatures").inner_text().startswith("Signatures checked against ed25519:")
    first_needing = page.locator("#across table").first.locator("tbody tr").first
    assert "user-0003" in first_needing.inner_text()
    assert "ask the recipient to delete its copy" in first_needing.inner_text()
    chart = page.locator("svg.chart")
    assert chart.is_visible() and chart.locator("rect").count() >= 5
    assert chart.bounding_box()["width"] > 300
    subjects = page.locator("article.subject h3").all_inner_texts()
    assert subjects == ["user-0003", "user-0001", "user-0002"]
    assert page.locator("article.subject").first.locator(".badge", has_text="NEEDS_HUMAN").count() >= 1
    assert "verified head #3" in page.locator("#chain").inner_text()
    assert no_horizontal_overflow(page)
    assert_no_content(page.content())
    assert_no_content(page.locator("body").inner_text())
    page.screenshot(path=str(keep("report.png")))
    page.screenshot(path=str(keep("report-full.png")), full_page=True)
    # A4, as the browser prints it to PDF
    page.emulate_media(media="print")
    page.set_viewport_size({"width": 794, "height": 1123})
    assert no_horizontal_overflow(page)
    pdf = page.pdf(path=str(keep("report.pdf")), format="A4", print_background=True)
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Type /Page") >= 2


def test_long_ids_wrap_and_a_tampered_receipt_fails_in_the_report(page, tmp_path, key, key_file):
    from report_support import third_party, verified

    chain = Chain(key)
    chain.add("Zoë <b>Ünïcode</b> 🚀", [verified(LONG_ID), third_party("acme:" + LONG_ID)])
    chain.add("alice", [verified("alice-doc-0001")])
    paths = chain.write(tmp_path / "r")
    tampered_copy(paths[0], paths[0])
    out = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "tombstone", "report", str(tmp_path / "r"), "--key", str(key_file),
                             "--out", str(out)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 1, result.stderr
    page.set_viewport_size({"width": 794, "height": 1000})
    page.goto(out.as_uri())
    assert no_horizontal_overflow(page)
    banner = page.locator("#failures")
    assert banner.is_visible() and "fail their check" in banner.inner_text()
    article = page.locator("article.subject").first
    assert "Zoë <b>Ünïcode</b> 🚀" == article.locator("h3").inner_text()  # shown as text, not markup
    assert "does not verify (receipt hash mismatch" in article.locator(".outcome").inner_text()
    assert "FAILS" in article.inner_text()
    page.screenshot(path=str(keep("report-tampered.png")), full_page=True)


# -- the viewer ------------------------------------------------------------------------------------


def test_a_request_without_the_token_is_refused(browser, served):
    context = browser.new_context()
    pg = context.new_page()
    for path in ("", "receipts/1", "report"):
        response = pg.goto(served.base + path)
        assert response.status == 403
        assert "needs the token" in pg.locator("body").inner_text()
    response = pg.goto(served.base + "?token=not-the-token")
    assert response.status == 403
    status = pg.evaluate("""async () => (await fetch('/api/verify', {method: 'POST', body: '{}'})).status""")
    assert status == 403
    context.close()


def test_the_viewer_renders_and_checks_receipts(page, served):
    root = served.root
    response = page.goto(served.open_url)
    assert response.status == 200 and page.url == served.base  # the token left the address bar
    assert page.evaluate("isSecureContext && !!crypto.subtle")
    visited = [page.content()]
    sagas = page.locator("#sagas").inner_text()
    assert "user-0004" in sagas and "reclaim chroma (running" in sagas
    assert "injected fault: reclaim failed (4 of 4)" in page.locator("#dead-letters").inner_text()
    assert "verified head #3" in page.locator("#chain").inner_text()
    assert page.locator("#subjects tbody tr").first.inner_text().startswith("user-0003")

    # a genuine receipt, through the drop zone (a real drop event carrying the file)
    text = (root / "receipts" / "user-0002.json").read_text()
    page.evaluate("""(text) => {
        const data = new DataTransfer();
        data.items.add(new File([text], 'user-0002.json', {type: 'application/json'}));
        document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: data, bubbles: true}));
    }""", text)
    page.wait_for_selector("#drop-result[data-done='1']")
    assert page.locator("#check-browser .verdict").inner_text() == "PASS"
    assert page.locator("#check-server .verdict").inner_text() == "PASS"
    assert "chain holds it as receipt #2" in page.locator("#check-server").inner_text()

    # a tampered receipt: both checks fail, each saying why
    tampered = tampered_copy(root / "receipts" / "user-0003.json", served.root.parent / "tampered.json")
    page.evaluate("document.getElementById('drop-result').dataset.done = ''")
    page.set_input_files("#drop-file", str(tampered))
    page.wait_for_selector("#drop-result[data-done='1']")
    browser_check = page.locator("#check-browser")
    server_check = page.locator("#check-server")
    assert browser_check.locator(".verdict").inner_text() == "FAIL"
    assert browser_check.get_attribute("data-stage") == "hash"
    assert "hash mismatch" in browser_check.inner_text()
    assert server_check.locator(".verdict").inner_text() == "FAIL"
    assert "hash mismatch" in server_check.inner_text()
    assert no_horizontal_overflow(page)  # hashes wrap inside the result panels
    page.screenshot(path=str(keep("viewer.png")))
    visited.append(page.content())

    # re-hashed after tampering: only the signature gives it away, in the browser too
    data = json.loads(tampered.read_text())
    data["receipt_hash"] = body_hash(data)
    tampered.write_bytes(pretty(data))
    page.evaluate("document.getElementById('drop-result').dataset.done = ''")
    page.set_input_files("#drop-file", str(tampered))
    page.wait_for_selector("#drop-result[data-done='1']")
    assert browser_check.get_attribute("data-stage") == "signature"
    assert "signature does not verify" in browser_check.inner_text()
    assert server_check.get_attribute("data-stage") == "signature"

    # one receipt's page: statuses, evidence, and the in-browser check of the sealed copy
    page.goto(served.base + "receipts/3")
    page.wait_for_selector("#check-sealed[data-done='1']")
    assert page.locator("#check-sealed .verdict").inner_text() == "PASS"
    assert "ask the recipient to delete its copy" in page.locator("body").inner_text()
    page.locator("details.artifact").first.locator("summary").click()
    assert "files_scanned" in page.locator("details.artifact").first.inner_text()
    assert no_horizontal_overflow(page)
    page.screenshot(path=str(keep("viewer-receipt.png")), full_page=True)
    visited.append(page.content())
    page.goto(served.base + "report")
    assert page.locator("h1").inner_text() == "Erasure report"
    visited.append(page.content())
    for html in visited:
        assert_no_content(html)


def test_a_reader_can_check_against_their_own_key(page, served, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from playwright.sync_api import expect

    page.goto(served.open_url)
    other = tmp_path / "other.pub"
    other.write_bytes(public_pem(Ed25519PrivateKey.generate()))
    page.set_input_files("#key-file", str(other))
    expect(page.locator("#key-label")).to_contain_text("your key")  # polled from here: the page's CSP forbids eval
    page.set_input_files("#drop-file", str(served.root / "receipts" / "user-0001.json"))
    page.wait_for_selector("#drop-result[data-done='1']")
    assert page.locator("#check-browser").get_attribute("data-stage") == "key"  # signed by another key
    assert page.locator("#check-server .verdict").inner_text() == "PASS"  # the server uses the deployment's
    page.set_input_files("#key-file", str(served.root / "keys" / "signing.pub"))
    deployment_key = next(line for line in served.printed if line.startswith("public key: ")).split(": ")[1]
    expect(page.locator("#key-label")).to_contain_text(deployment_key)
    page.evaluate("document.getElementById('drop-result').dataset.done = ''")
    page.set_input_files("#drop-file", str(served.root / "receipts" / "user-0001.json"))
    page.wait_for_selector("#drop-result[data-done='1']")
    assert page.locator("#check-browser .verdict").inner_text() == "PASS"


# -- the canonical form: JavaScript and Python agree ------------------------------------------------

NUMBERS = ("[1.0, -0.0, 0.0, 1e-05, 0.0001, 0.00012, 1e16, 1e15, 1234567890123456.0, 12345678901234567.0,"
           " 123456789.123, 5e-324, 1.7976931348623157e308, 0.1, 0.30000000000000004, 100, -0, 1E2, 2.5e-7,"
           " 1.5e300, -1.25e-10, 3.14159, 12345678901234567890123456789, -42, 1e22, 1e21, 9007199254740993,"
           " 9007199254740993.0, 0.000123456789, 123e-20, 4.35, 2e-3]")
STRINGS = ["Zoë <b>Ünïcode</b> 🚀", "日本語の主体", "tab\tnew\nline\r\u2028\u2029 \"q\" \\ \x01\x1f\x7f /",
           "\U0001F680 astral", "é\u0301 combining", "\ufeffbom", "\x00nul"]


def _cases(served) -> list[str]:
    cases = [p.read_text() for p in sorted((served.root / "receipts").glob("*.json"))]
    cases.append((ROOT / "tests" / "fixtures" / "receipt-0.1.0" / "receipts" / "user-0001.json").read_text())
    cases.append(NUMBERS)
    cases.append(json.dumps({s: [s, n] for n, s in enumerate(STRINGS)}, ensure_ascii=True))
    cases.append(json.dumps({s: n for n, s in enumerate(STRINGS)}, ensure_ascii=False, indent=1))
    cases.append(json.dumps({"\uffff": 1, "😀": 2, "é": 3, "a": 4, "A": 5, "": 6, "\ue000": 7, "𝔸": 8}))
    cases.append('{"nested": {"b": [1, {"z": 0.5, "a": null}], "a": true}, "empty": {}, "list": [], "f": false}')
    return cases


def test_javascript_and_python_agree_on_the_canonical_bytes(page, served, key):
    page.goto(served.open_url)
    js = "(text) => Array.from(TombstoneVerify.canonicalBytes(text))"
    js_signed = "(text) => Array.from(TombstoneVerify.signedBodyOf(text))"
    for text in _cases(served):
        data = parse_strict(text, "case")
        assert bytes(page.evaluate(js, text)) == canonical_bytes(data), text[:80]
        if isinstance(data, dict) and "receipt_hash" in data:
            assert bytes(page.evaluate(js_signed, text)) == signed_body(data)
    # float formatting over many values, including every power of ten the exponent switch sits between
    values = [x * 10.0 ** e for e in range(-330, 309, 7) for x in (1.0, 1.5, 9.999999999999998, 0.7)]
    values = [v for v in values if v not in (0.0, float("inf"))]
    text = json.dumps(values)
    assert bytes(page.evaluate(js, text)) == canonical_bytes(json.loads(text))
    # what Python refuses, JavaScript refuses: duplicate keys, NaN, numbers no float can hold, lone surrogates
    for bad in ('{"a": 1, "a": 2}', '[NaN]', '[1e400]', '["\\ud800"]', '[1,]', "{'a': 1}"):
        assert page.evaluate("(t) => { try { TombstoneVerify.canonicalBytes(t); return 'accepted'; }"
                             " catch (e) { return 'refused'; } }", bad) == "refused", bad


def test_javascript_verifies_python_signatures_on_non_ascii_subjects(page, served, key):
    import base64

    from cryptography.hazmat.primitives import serialization

    from report_support import managed, verified

    chain = Chain(key)
    for subject in STRINGS[:6]:
        chain.add(subject, [verified("doc-" + str(len(chain.receipts))), managed("rec-" + str(len(chain.receipts)))])
    raw = base64.b64encode(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)).decode()
    page.goto(served.open_url)
    check = ("async ([text, raw]) => (await TombstoneVerify.verifyReceipt(text, TombstoneVerify.b64decode(raw)))")
    for receipt in chain.receipts:
        for text in (pretty(receipt).decode(), json.dumps(receipt, ensure_ascii=True)):
            result = page.evaluate(check, [text, raw])
            assert result["ok"] and result["subject"] == receipt["subject"], result
        broken = dict(receipt, subject=receipt["subject"] + "!")
        assert page.evaluate(check, [json.dumps(broken), raw])["stage"] == "hash"
