"""``tombstone serve``: a read-only local page over a deployment (Starlette, Jinja2, uvicorn).

It shows the sagas in progress with their current step, the receipts by subject, one receipt with its
evidence, the dead-letter list and the chain, and verifies a receipt file dropped on the page twice: in the
browser (WebCrypto, so the reader need not take the server's word) and by the server. The lineage db is
opened read-only for each request (:mod:`tombstone.report.readonly`); nothing is written to the deployment.

Every request needs the random token printed at start: as ``?token=`` once (answered with a cookie and a
redirect that drops it from the address), then the cookie; a POST must also carry it in the
``X-Tombstone-Token`` header. The redirect goes only to a path of this server (anything else goes to ``/``),
and the cookie is named after the port (``tombstone_token_<port>``: browsers send a cookie to every port of
a host), HttpOnly, SameSite=Strict, and Secure over TLS. It binds to loopback unless told otherwise, and then
answers only requests addressed to a loopback name (a page elsewhere cannot reach it through DNS rebinding);
``--allow-remote`` needs TLS (``--tls-cert``, ``--tls-key``) or an explicit ``--insecure-http``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
import ssl
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from tombstone.config import Config, load_config
from tombstone.errors import ConfigError, ReceiptError, ReceiptFormatError, TombstoneError
from tombstone.keys import PUBLIC_KEY, key_id, load_public_key
from tombstone.receipt.build import pretty
from tombstone.receipt.signing import parse_strict, verify
from tombstone.report.collect import ReceiptView, Report, build_report, read_deployment, sealed_copies_place
from tombstone.report.readonly import ReadOnlyLineage
from tombstone.report.render import environment, render_html, require, status_chart

MAX_UPLOAD_BYTES = 32 * 1024 * 1024
"""The largest receipt the page verifies."""
LOOPBACK_NAMES = ("localhost",)
TOKEN_HEADER = "x-tombstone-token"
COOKIE_PREFIX = "tombstone_token_"


def cookie_name(port: int) -> str:
    """The token cookie of the server on ``port``: cookies ignore ports, so two viewers on one host (or
    another service beside them) never overwrite each other's cookie, and each gate reads only its own."""
    return f"{COOKIE_PREFIX}{int(port)}"


def local_target(path: str) -> str:
    """``path`` when it names a page of this server: one leading ``/`` not followed by ``/`` or ``\\``, no
    backslash anywhere, no scheme, no host, printable ASCII only (a browser drops tabs and newlines, and
    reads ``\\`` as ``/``). Anything else: ``/``. The token redirect never leads to another site."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    if any(not ("!" <= ch <= "~") for ch in path):
        return "/"
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//"):
        return "/"
    return path


def _redirect_path(scope: dict[str, Any]) -> str:
    """The request's own path as it was sent (percent-encoded), if both it and its decoded form are paths
    of this server; ``/`` otherwise (``/%2F/evil.example`` decodes to ``//evil.example``)."""
    decoded = scope.get("path") or "/"
    raw = scope.get("raw_path")
    sent = raw.decode("latin-1").split("?", 1)[0] if isinstance(raw, bytes) else quote(decoded, safe="/")
    if local_target(sent) != sent or local_target(decoded) != decoded:
        return "/"
    return sent


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@lru_cache(maxsize=None)
def static_text(name: str) -> str:
    return resources.files("tombstone.report").joinpath("static", name).read_text("utf-8")


@dataclass(frozen=True)
class Deployment:
    """What the viewer serves: a config, its public key, and how to open its lineage db read-only."""

    config: Config
    public_key: Any

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    @property
    def raw_key_b64(self) -> str:
        import base64

        from cryptography.hazmat.primitives import serialization

        raw = self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode("ascii")

    def lineage(self) -> ReadOnlyLineage:
        return ReadOnlyLineage.open(self.config)

    def report(self) -> Report:
        sources, head = read_deployment(self.config)
        return build_report(sources, key=self.public_key, key_source=f"the deployment's key, {self.config.path}",
                            source_names=[sealed_copies_place(self.config)], deployment_head=head)


def _current_step(entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "planned"
    last = entries[-1]
    where = f" {last['target']}" if last.get("target") else ""
    state = "running" if last["phase"] == "begin" else "done"
    return f"{last['step']}{where} ({state}, {last['at']})"


def _verify_upload(deployment: Deployment, raw: bytes) -> dict[str, Any]:
    """The server's check of an uploaded receipt: strict JSON, schema, hash, key, signature, and whether this
    deployment's chain holds it."""
    out: dict[str, Any] = {"ok": False, "stage": "format", "message": "", "subject": None, "sequence": None,
                           "chain": None}
    if len(raw) > MAX_UPLOAD_BYTES:
        out["message"] = f"larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB: not a receipt this page checks"
        return out
    try:
        data = parse_strict(raw.decode("utf-8"), "the file")
    except UnicodeDecodeError as exc:
        out["message"] = f"the file is not UTF-8 text (byte {exc.start})"
        return out
    except ReceiptFormatError as exc:
        out["message"] = str(exc)
        return out
    if not isinstance(data, dict):
        out["message"] = "the file is not a JSON object"
        return out
    out["subject"] = data.get("subject") if isinstance(data.get("subject"), str) else None
    out["sequence"] = data.get("sequence") if isinstance(data.get("sequence"), int) else None
    try:
        verify(data, deployment.public_key)
    except ReceiptError as exc:
        message = str(exc)
        out["stage"] = ("schema" if "schema" in message else "hash" if "hash" in message
                        else "key" if "signed by key" in message else "signature")
        out["message"] = message
        return out
    except (ValueError, TypeError) as exc:  # a number no canonical form can write (1e400)
        out["message"] = f"the receipt has no canonical form: {exc}"
        return out
    out.update(ok=True, stage="ok", message=f"signature verified against {deployment.key_id}")
    with deployment.lineage() as lineage:
        seq = lineage.receipt_seq(data["receipt_hash"])
    out["chain"] = (f"this deployment's chain holds it as receipt #{seq}" if seq is not None
                    else "this deployment's chain does not hold it (signed by its key, but not in its chain)")
    return out


def create_app(deployment: Deployment, token: str, *, cookie: str, check_host: bool, secure: bool = False) -> Any:
    """The ASGI application: the pages, behind the token gate (``secure``: served over TLS, the cookie is
    Secure)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    env = environment()

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(
            nonce=request.scope["state"]["nonce"], token=token, deployment=deployment,
            verify_js=static_text("verify.js"), viewer_js=static_text("viewer.js"), **context)
        return HTMLResponse(html, status_code=status)

    def index(request: Request) -> Response:
        report = deployment.report()
        with deployment.lineage() as lineage:
            running = lineage.sagas("running")
            steps = {s["saga_id"]: _current_step(lineage.journal_entries(s["saga_id"])) for s in running}
            letters = lineage.dead_letters(None)
            rows = lineage.receipts()
        views = {v.receipt.sequence: v for s in report.subjects for v in [s.latest, *s.earlier]}
        return page(request, "viewer/index.html.j2", report=report, running=running, steps=steps, letters=letters,
                    chain_rows=rows, views=views, chart=status_chart(report.counts))

    def receipt_page(request: Request) -> Response:
        seq = request.path_params["seq"]
        with deployment.lineage() as lineage:
            rows = [r for r in lineage.receipts() if r["seq"] == seq]
        if not rows:
            return page(request, "viewer/missing.html.j2", status=404, what=f"receipt #{seq}")
        body = rows[0]["body"].decode("utf-8")
        report = deployment.report()
        view: ReceiptView | None = None
        subject_report = None
        for s in report.subjects:
            for v in [s.latest, *s.earlier]:
                if v.receipt.sequence == seq:
                    view, subject_report = v, s
        assert view is not None and subject_report is not None
        evidence = [(entry, json.dumps(entry.evidence, indent=2, sort_keys=True, ensure_ascii=False))
                    for entry in view.receipt.artifacts]
        return page(request, "viewer/receipt.html.j2", view=view, subject=subject_report,
                    latest=subject_report.latest is view, evidence=evidence, sealed_body=body)

    def receipt_json(request: Request) -> Response:
        seq = request.path_params["seq"]
        with deployment.lineage() as lineage:
            rows = [r for r in lineage.receipts() if r["seq"] == seq]
        if not rows:
            return JSONResponse({"error": f"no receipt #{seq}"}, status_code=404)
        data = parse_strict(rows[0]["body"].decode("utf-8"), f"sealed copy #{seq}")
        return Response(pretty(data), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="receipt-{seq:06d}.json"'})

    def report_page(request: Request) -> Response:
        return HTMLResponse(render_html(deployment.report()))

    async def api_verify(request: Request) -> Response:
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_UPLOAD_BYTES:
                break
        from starlette.concurrency import run_in_threadpool

        return JSONResponse(await run_in_threadpool(_verify_upload, deployment, raw))

    app = Starlette(routes=[
        Route("/", index),
        Route("/receipts/{seq:int}", receipt_page),
        Route("/receipts/{seq:int}.json", receipt_json),
        Route("/report", report_page),
        Route("/api/verify", api_verify, methods=["POST"]),
    ])

    async def on_error(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=500) if request.url.path.startswith("/api/") else \
            HTMLResponse(f"<!doctype html><title>error</title><p>{_escape(str(exc))}</p>", status_code=500)

    app.add_exception_handler(TombstoneError, on_error)
    return TokenGate(app, token, cookie=cookie, check_host=check_host, secure=secure)


def _escape(text: str) -> str:
    from markupsafe import escape

    return str(escape(text))


class TokenGate:
    """ASGI middleware: refuse any request without the token, set security headers on every response."""

    def __init__(self, app: Any, token: str, *, cookie: str, check_host: bool, secure: bool = False) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie
        self.check_host = check_host
        self.secure = secure

    def _valid(self, supplied: str | None) -> bool:
        return supplied is not None and secrets.compare_digest(supplied.encode(), self.token.encode())

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, RedirectResponse

        request = Request(scope)
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["nonce"] = nonce

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                for name, value in security_headers(nonce).items():
                    headers.append((name.encode("latin-1"), value.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        if self.check_host and not is_loopback(request.url.hostname or ""):
            await PlainTextResponse("refused: this server answers only requests addressed to a loopback name\n",
                                    status_code=400)(scope, receive, send_with_headers)
            return
        supplied = request.query_params.get("token")
        if supplied is not None:
            if not self._valid(supplied) or request.method not in ("GET", "HEAD"):
                await refusal()(scope, receive, send_with_headers)
                return
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = local_target(_redirect_path(scope) + (f"?{urlencode(rest)}" if rest else ""))
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/",
                                secure=self.secure)
            await response(scope, receive, send_with_headers)
            return
        header_ok = self._valid(request.headers.get(TOKEN_HEADER))
        cookie_ok = self._valid(request.cookies.get(self.cookie))
        allowed = header_ok if request.method not in ("GET", "HEAD") else (header_ok or cookie_ok)
        if not allowed:
            await refusal()(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def refusal() -> Any:
    from starlette.responses import PlainTextResponse

    return PlainTextResponse("403 forbidden: this page needs the token 'tombstone serve' printed when it started"
                             " (open the URL it printed)\n", status_code=403)


def security_headers(nonce: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline';"
                                    " img-src data:; connect-src 'self'; form-action 'none'; base-uri 'none';"
                                    " frame-ancestors 'none'"),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-store",
    }


def open_deployment(config_path: str | None) -> Deployment:
    """Load the config and the public key, and check that the lineage db opens read-only (one line if not)."""
    config = load_config(config_path)
    public_key = load_public_key(config.keys_dir / PUBLIC_KEY)
    ReadOnlyLineage.open(config).close()
    return Deployment(config, public_key)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one); one ConfigError line when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: {exc.strerror or exc}") from exc
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def _tls_file(option: str, path: str) -> str:
    """A certificate or key file for TLS: it must be a regular file (a FIFO would block the server's start)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{option} {path}: not a regular file")
    return path


def check_transport(host: str, *, allow_remote: bool, tls_cert: str | None, tls_key: str | None,
                    insecure_http: bool) -> bool:
    """Whether the server speaks TLS; one ConfigError line for a combination it refuses: a non-loopback
    ``host`` without ``--allow-remote``, ``--allow-remote`` (whatever the host) without TLS or
    ``--insecure-http``, half a certificate, or a certificate and key that do not load."""
    if not is_loopback(host) and not allow_remote:
        raise ConfigError(f"--host {host} is not a loopback address: pass --allow-remote to serve the deployment's"
                          " receipts to other machines (anyone who reaches it with the token can read them)")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together: pass both (the certificate and its private key)")
    tls = tls_cert is not None
    if tls and insecure_http:
        raise ConfigError("--insecure-http contradicts --tls-cert/--tls-key: pass one or the other")
    if allow_remote and not tls and not insecure_http:
        raise ConfigError("--allow-remote sends the token and the receipts over the network: pass --tls-cert FILE"
                          " --tls-key FILE to serve them over HTTPS, or --insecure-http to send them in clear text")
    if tls:
        assert tls_cert is not None and tls_key is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:  # the password callback keeps OpenSSL from prompting on the terminal for an encrypted key
            context.load_cert_chain(_tls_file("--tls-cert", tls_cert), _tls_file("--tls-key", tls_key),
                                    password=lambda: b"")
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(f"--tls-cert {tls_cert} / --tls-key {tls_key}: cannot load them as a certificate and"
                              f" its unencrypted private key ({getattr(exc, 'reason', None) or exc})") from exc
    return tls


def serve(config_path: str | None, *, host: str, port: int | str, allow_remote: bool,
          echo: Callable[[str], None], token: str | None = None, tls_cert: str | None = None,
          tls_key: str | None = None, insecure_http: bool = False,
          warn: Callable[[str], None] | None = None) -> None:
    """Serve the deployment until interrupted. Prints where, and the token, before the first request;
    ``warn`` (default: stderr) gets the one-line warning of ``--insecure-http``."""
    require("serve", "starlette", "uvicorn", "jinja2")
    try:
        port = int(port)
    except ValueError as exc:
        raise ConfigError(f"--port must be a number 0..65535, got {port!r}") from exc
    tls = check_transport(host, allow_remote=allow_remote, tls_cert=tls_cert, tls_key=tls_key,
                          insecure_http=insecure_http)
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be a number 0..65535, got {port!r}")
    deployment = open_deployment(config_path)
    token = token or secrets.token_urlsafe(24)
    sock = bind(host, port)
    actual = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    base = f"{'https' if tls else 'http'}://{shown}:{actual}/"
    app = create_app(deployment, token, cookie=cookie_name(actual), check_host=is_loopback(host), secure=tls)
    import uvicorn

    if insecure_http:
        (warn or (lambda line: print(line, file=sys.stderr, flush=True)))(
            f"warning: --insecure-http: the token and the receipts go over plain HTTP to {shown}:{actual};"
            " anyone on the network path can read them")
    echo(f"serving {deployment.config.path} read-only at {base}")
    echo(f"public key: {deployment.key_id}")
    echo(f"token: {token}")
    echo(f"open: {base}?token={token}")
    echo("Ctrl-C stops it")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           ssl_certfile=tls_cert if tls else None,
                                           ssl_keyfile=tls_key if tls else None))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


__all__ = ["Deployment", "TokenGate", "check_transport", "cookie_name", "create_app", "is_loopback", "local_target",
           "open_deployment", "serve"]
