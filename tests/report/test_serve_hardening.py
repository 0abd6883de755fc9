"""``tombstone serve`` against a real server process: the token redirect never leaves the server, the cookie
is named after the port (and Secure over TLS), and ``--allow-remote`` needs TLS or an explicit
``--insecure-http``. Every server a test starts is stopped by it."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import selectors
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tombstone import init_deployment
from tombstone.report.server import cookie_name, local_target

START_TIMEOUT = 60.0


@pytest.fixture
def config(tmp_path) -> Path:
    """A deployment with no store: enough for the viewer to serve its pages."""
    return init_deployment(tmp_path / "deploy").path


@pytest.fixture
def cert(tmp_path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its unencrypted key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tombstone serve test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "tls" / "cert.pem", tmp_path / "tls" / "key.pem"
    cert_path.parent.mkdir()
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Server:
    """A ``tombstone serve`` process, its port and token, and what it printed on each stream."""

    def __init__(self, proc: subprocess.Popen, stdout: list[str], stderr: list[str]) -> None:
        self.proc, self.stdout, self.stderr = proc, stdout, stderr
        base = next(line for line in stdout if line.startswith("serving ")).rsplit(" ", 1)[1]
        self.base = base
        self.port = int(base.rstrip("/").rsplit(":", 1)[1])
        self.token = next(line for line in stdout if line.startswith("token: ")).split(" ", 1)[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def serve():
    """Start ``tombstone serve --port 0 ARGS``; return once it has printed where it listens (its socket
    listens before it prints, so a request made then waits in the backlog). Stopped after the test."""
    started: list[subprocess.Popen] = []

    def start(config: Path, *args: str) -> Server:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "tombstone", "serve", "--config", str(config), "--port", "0",
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        started.append(proc)
        received = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
        deadline = time.monotonic() + START_TIMEOUT
        with selectors.DefaultSelector() as sel:
            for fd in received:
                sel.register(fd, selectors.EVENT_READ)
            while b"\nCtrl-C" not in b"\n" + received[proc.stdout.fileno()]:
                events = sel.select(timeout=max(0.0, deadline - time.monotonic()))
                if not events:
                    raise AssertionError(f"tombstone serve did not start in {START_TIMEOUT:.0f} s: {received}")
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        raise AssertionError(f"tombstone serve ended: {received}")
                    received[key.fd] += chunk
        out = received[proc.stdout.fileno()].decode().splitlines()
        err = received[proc.stderr.fileno()].decode().splitlines()
        return Server(proc, out, err)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if not stream.closed:
                stream.close()


def request(server: Server, target: str, *, headers: dict[str, str] | None = None,
            context: ssl.SSLContext | None = None) -> http.client.HTTPResponse:
    """One request, the target sent exactly as written (no redirect followed)."""
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=30, context=context)
    conn.request("GET", target, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


# -- the open redirect ----------------------------------------------------------------------------


ELSEWHERE = [
    "//evil.example",
    "//evil.example/receipts/1",
    "///evil.example",
    "/%2F%2Fevil.example",  # decodes to //evil.example
    "/%2Fevil.example",
    "/%5Cevil.example",  # /\evil.example: a browser reads the backslash as a slash
    "/%5C%5Cevil.example",
    "/%09/evil.example",  # a browser drops the tab: //evil.example
    "/%0A/evil.example",
    "http://evil.example/",  # absolute-form request target
    "https://evil.example/receipts/1",
]


@pytest.mark.slow
def test_the_token_redirect_never_leaves_the_server(config, serve):
    server = serve(config)
    try:
        for target in ELSEWHERE:
            response = request(server, f"{target}?token={server.token}")
            location = response.getheader("Location")
            if response.status == 303:
                assert location == "/", (target, location)
            else:  # refused before it reached the gate: no redirect at all
                assert 400 <= response.status < 500 and location is None, (target, response.status, location)
        # a page of its own is kept, other parameters too (encoded: they cannot add a host)
        response = request(server, f"/receipts/1?token={server.token}&x=1&next=//evil.example")
        assert response.status == 303
        assert response.getheader("Location") == "/receipts/1?x=1&next=%2F%2Fevil.example"
        assert request(server, f"/?token={server.token}").getheader("Location") == "/"
    finally:
        server.stop()


def test_local_target_accepts_only_paths_of_this_server():
    for good in ("/", "/receipts/3", "/receipts/3.json?x=1", "/report"):
        assert local_target(good) == good
    for bad in ("", "receipts", "//evil.example", "/\\evil.example", "\\\\evil.example", "/\tx", "/\n/evil",
                "https://evil.example/", "javascript:alert(1)", "/é", "/a b"):
        assert local_target(bad) == "/", bad


# -- the cookie -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cookie_is_named_after_the_port(config, serve):
    server = serve(config)
    try:
        response = request(server, f"/?token={server.token}")
        cookie = response.getheader("Set-Cookie")
        name = f"tombstone_token_{server.port}"
        assert cookie_name(server.port) == name
        assert cookie.startswith(f"{name}={server.token};"), cookie
        attributes = [a.strip().lower() for a in cookie.split(";")[1:]]
        assert "httponly" in attributes and "samesite=strict" in attributes and "path=/" in attributes
        assert "secure" not in attributes  # plain HTTP on loopback: a Secure cookie would never come back
        # the gate reads its own cookie only: the same token under another port's name is refused
        other = f"tombstone_token_{server.port + 1}={server.token}"
        assert request(server, "/", headers={"Cookie": other}).status == 403
        assert request(server, "/", headers={"Cookie": f"{name}={server.token}"}).status == 200
    finally:
        server.stop()


# -- --allow-remote -------------------------------------------------------------------------------


def one_line_error(*args: str) -> str:
    """``tombstone serve ARGS`` in a process of its own, bounded (a server that starts instead of refusing
    would run until stopped): exit 2 with one line on stderr."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        result = subprocess.run([sys.executable, "-m", "tombstone", "serve", "--port", "0", *args],
                                capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"tombstone serve {' '.join(args)} started instead of refusing") from exc
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.slow
def test_allow_remote_without_tls_is_refused_in_one_line(config, cert, tmp_path):
    c = str(config)
    for host in ("0.0.0.0", "127.0.0.1"):
        line = one_line_error("--config", c, "--host", host, "--allow-remote")
        assert "--tls-cert" in line and "--insecure-http" in line
    assert "--allow-remote" in one_line_error("--config", c, "--host", "0.0.0.0", "--insecure-http")
    cert_path, key_path = (str(p) for p in cert)
    assert "go together" in one_line_error("--config", c, "--allow-remote", "--tls-cert", cert_path)
    assert "go together" in one_line_error("--config", c, "--allow-remote", "--tls-key", key_path)
    assert "contradicts" in one_line_error("--config", c, "--allow-remote", "--insecure-http",
                                           "--tls-cert", cert_path, "--tls-key", key_path)
    missing = str(tmp_path / "nope.pem")
    assert missing in one_line_error("--config", c, "--allow-remote", "--tls-cert", missing, "--tls-key", key_path)
    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)  # never opened: a FIFO would block the server's start
    assert "not a regular file" in one_line_error("--config", c, "--allow-remote", "--tls-cert", str(fifo),
                                                  "--tls-key", key_path)
    assert "cannot load" in one_line_error("--config", c, "--allow-remote", "--tls-cert", key_path,
                                           "--tls-key", cert_path)
    encrypted = tmp_path / "encrypted.pem"
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    assert "unencrypted" in one_line_error("--config", c, "--allow-remote", "--tls-cert", cert_path,
                                           "--tls-key", str(encrypted))


@pytest.mark.slow
def test_insecure_http_warns_in_one_line_and_serves(config, serve):
    server = serve(config, "--allow-remote", "--insecure-http")
    try:
        assert len(server.stderr) == 1 and server.stderr[0].startswith("warning: --insecure-http"), server.stderr
        assert "plain HTTP" in server.stderr[0]
        assert server.base.startswith("http://")
        assert request(server, "/", headers={"X-Tombstone-Token": server.token}).status == 200
    finally:
        server.stop()
    assert server.proc.returncode is not None


@pytest.mark.slow
def test_tls_serves_https_with_a_secure_cookie(config, cert, serve):
    cert_path, key_path = cert
    server = serve(config, "--allow-remote", "--tls-cert", str(cert_path), "--tls-key", str(key_path))
    try:
        assert server.base.startswith("https://127.0.0.1:") and not server.stderr
        context = ssl.create_default_context(cafile=str(cert_path))
        response = request(server, f"/?token={server.token}", context=context)
        assert response.status == 303 and response.getheader("Location") == "/"
        cookie = response.getheader("Set-Cookie")
        assert cookie.startswith(f"tombstone_token_{server.port}={server.token};")
        attributes = [a.strip().lower() for a in cookie.split(";")[1:]]
        assert "secure" in attributes and "httponly" in attributes and "samesite=strict" in attributes
        ok = request(server, "/", context=context, headers={"Cookie": f"tombstone_token_{server.port}={server.token}"})
        assert ok.status == 200
        # a client that does not trust the certificate is refused by its own TLS check
        with pytest.raises(ssl.SSLCertVerificationError):
            request(server, "/", context=ssl.create_default_context())
        # and plain HTTP gets no page
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            request(server, "/", headers={"X-Tombstone-Token": server.token})
    finally:
        server.stop()
    assert server.proc.returncode is not None
