"""``tombstone mcp``: a Model Context Protocol server over one deployment, for agents that handle erasure requests.

Tools: ``where`` (a subject's lineage graph), ``status``, ``erase``, ``receipt_show``, ``receipt_verify`` and
``scan``; resources: each erased subject's receipt (``tombstone://receipts/{subject}``) and the compliance report
over the sealed receipts (``tombstone://report``). Every tool opens the
deployment for its own call, so nothing is shared between calls but the server's confirmation secret.

An erasure takes two calls. ``erase`` without ``confirm`` changes nothing: it returns what would be erased (every
artifact of the subject's lineage closure) and a confirmation token, an HMAC under a secret drawn when the server
starts and never shown, over the subject and that plan. ``erase`` with the token erases, once the plan it names is
still the subject's plan: an agent cannot erase on a hallucinated call, nor replay a token after the plan
changed, nor use one from another server. A token serves one erasure. Errors reach the agent as tool errors with
the CLI's one-line messages.

The server speaks over stdio only: it opens no network listener.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import threading
from pathlib import Path
from typing import Any

from tombstone.errors import TombstoneError, UnknownSubjectError

INSTRUCTIONS = (
    "Tombstone erases a data subject from this RAG deployment and proves, level by level, how far the erasure went."
    " Find a subject with 'where', dry-run with 'erase' (no confirm), show the user what would be erased, and only"
    " then call 'erase' again with the confirmation token it returned. Verify the result with 'receipt_verify'.")


def _plan(tomb: Any, subject: str) -> list[dict[str, str]]:
    """Every artifact of the subject's lineage closure; those an erasure request keeps under an exception say so
    (``kept``): the erasure will leave them untouched."""
    import datetime as dt

    from tombstone.requests import Requests

    key = tomb.lineage.subject_key(subject)
    scope = tomb.lineage.closure(key)
    if not scope:
        raise UnknownSubjectError(f"unknown subject {subject!r}: the lineage db records no artifact for it")
    kept = Requests(tomb.lineage).retained(key, dt.date.today())
    return sorted(({"store": art.store, "artifact_id": art.artifact_id, "kind": art.kind, "state": art.state,
                    "in_scope": why, **({"kept": f"retained by exception: {kept[art.store]}"} if art.store in kept
                                        else {})}
                   for art, why in scope), key=lambda a: (a["store"], a["artifact_id"]))


def _digest(plan: list[dict[str, str]]) -> bytes:
    return hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).digest()


class Confirmations:
    """Tokens binding a subject to the plan a dry run showed; each serves one erasure."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self._spent: set[str] = set()
        self._lock = threading.Lock()

    def token(self, subject: str, plan: list[dict[str, str]]) -> str:
        return hmac.new(self._secret, subject.encode() + b"\x00" + _digest(plan), hashlib.sha256).hexdigest()

    def spend(self, token: str, subject: str, plan: list[dict[str, str]]) -> None:
        """Accept ``token`` for this subject and plan once; TombstoneError otherwise (nothing is erased)."""
        expected = self.token(subject, plan)
        with self._lock:
            if token in self._spent:
                raise TombstoneError("this confirmation token was already used: run 'erase' without confirm again")
            if not hmac.compare_digest(token, expected):
                raise TombstoneError(f"the confirmation token does not match subject {subject!r} and its current plan"
                                     " (it was altered, is another subject's, or the plan changed): run 'erase'"
                                     " without confirm again and show the user the new plan")
            self._spent.add(token)


def _receipt_of(tomb: Any, subject: str) -> tuple[dict[str, Any], str]:
    """The subject's last sealed receipt, from the lineage db's chain (not a file anyone could have replaced)."""
    key = tomb.lineage.subject_key(subject)
    done = [s for s in tomb.lineage.sagas() if s.get("subject_key") == key and s["state"] == "done"]
    for saga in reversed(done):
        data = tomb.lineage.receipt_for_saga(saga["saga_id"])
        if data is not None:
            return json.loads(data), saga["saga_id"]
    raise UnknownSubjectError(f"no sealed receipt for subject {subject!r}: it has not been erased here")


def build_server(config_path: str | Path | None) -> Any:
    """The MCP server over the deployment of ``config_path`` (checked now: a bad configuration fails here)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    from tombstone.api import Tombstone
    from tombstone.config import load_config
    from tombstone.version import __version__

    config = load_config(config_path)
    confirmations = Confirmations()
    server = MCPServer(name="tombstone", version=__version__, instructions=INSTRUCTIONS)
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    def opened() -> Any:
        return Tombstone.open(config.path)

    def guarded(fn):
        """The tool, with Tombstone's errors turned into tool errors carrying the CLI's one line."""
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TombstoneError as exc:
                raise ToolError(str(exc).splitlines()[0]) from exc
        return call

    @server.tool(annotations=read_only)
    @guarded
    def where(subject: str) -> dict[str, Any]:
        """The subject's lineage graph: every artifact in scope, its store, kind and state, and why it is in scope."""
        with opened() as tomb:
            return {"subject": subject, "artifacts": _plan(tomb, subject)}

    @server.tool(annotations=read_only)
    @guarded
    def status(subject: str | None = None) -> dict[str, Any]:
        """Erasures run on this deployment and their state; with a subject, its artifacts and their state."""
        with opened() as tomb:
            if subject:
                arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(subject))
                if not arts:
                    raise UnknownSubjectError(f"unknown subject {subject!r}: the lineage db records no artifact for it")
                return {"subject": subject, "artifacts": [{"store": a.store, "artifact_id": a.artifact_id,
                                                           "state": a.state} for a in arts]}
            return {"artifact_counts": dict(tomb.lineage.count_artifacts()),
                    "sagas": [{"saga_id": s["saga_id"], "subject": s["subject"], "state": s["state"],
                               "started_at": s["started_at"], "finished_at": s["finished_at"]}
                              for s in tomb.lineage.sagas()]}

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                                             open_world_hint=False))
    @guarded
    def erase(subject: str, confirm: str | None = None) -> dict[str, Any]:
        """Without confirm: a dry run (nothing changes) returning what would be erased and a confirmation token.
        With the token: erase the subject everywhere and return the receipt's summary (the plan must not have
        changed since the dry run; a token serves once)."""
        with opened() as tomb:
            plan = _plan(tomb, subject)
            if confirm is None:
                return {"dry_run": True, "subject": subject, "would_erase": plan,
                        "confirm": confirmations.token(subject, plan),
                        "next": "show the user what would be erased; to go on, call erase again with this confirm"}
            confirmations.spend(confirm, subject, plan)
            receipt, path = tomb.erase(subject)
        return {"dry_run": False, "subject": subject, "saga_id": receipt["saga_id"], "receipt": str(path),
                "summary": receipt["summary"],
                "artifacts": [{"store": a["store"], "artifact_id": a["artifact_id"], "status": a["status"],
                               "level": a["level"], "reason": a["reason"]} for a in receipt["artifacts"]]}

    @server.tool(annotations=read_only)
    @guarded
    def receipt_show(subject: str) -> dict[str, Any]:
        """The subject's last signed receipt (as sealed in the deployment's chain). This does not verify it."""
        with opened() as tomb:
            return _receipt_of(tomb, subject)[0]

    @server.tool(annotations=read_only)
    @guarded
    def receipt_verify(subject: str) -> dict[str, Any]:
        """Verify the subject's last receipt (schema, hash, signature) against this deployment's own public key,
        and that the receipt file delivered to the operator is the one the chain sealed."""
        from tombstone.audit import trusted_key
        from tombstone.receipt import load_receipt, verify

        with opened() as tomb:
            receipt, saga_id = _receipt_of(tomb, subject)
            stored = next((s["out_path"] for s in tomb.lineage.sagas() if s["saga_id"] == saga_id), None)
            path = None
            if stored:
                path = Path(stored) if Path(stored).is_absolute() else config.receipts_dir / stored
                if not path.is_absolute() or ".." in Path(stored).parts:
                    path = None
        trusted = trusted_key(None, config)
        result = verify(receipt, trusted.key)
        out: dict[str, Any] = {"verified": True, "receipt_hash": result.receipt_hash, "signed_by": result.key_id,
                               "previous_receipt_hash": result.previous_receipt_hash, "trusted": trusted.describe()}
        if path is not None and path.is_file():
            out["file"] = str(path)
            out["file_matches_chain"] = load_receipt(str(path)).get("receipt_hash") == result.receipt_hash
        return out

    @server.tool(annotations=read_only)
    @guarded
    def scan(store: str) -> dict[str, Any]:
        """Read-only: how much deleted data a configured store still holds (counts and bytes, never ids or content)."""
        from tombstone.scan import scan_configured

        return scan_configured(str(config.path), store).as_json(False)

    @server.resource("tombstone://receipts/{subject}", mime_type="application/json")
    def receipt_resource(subject: str) -> str:
        """A subject's last sealed receipt."""
        with opened() as tomb:
            return json.dumps(_receipt_of(tomb, subject)[0], indent=2, sort_keys=True)

    @server.resource("tombstone://report", mime_type="application/json")
    def report_resource() -> str:
        """The compliance report over the deployment's sealed receipts (``tombstone report --config``): per
        subject its outcome and what needs action, the chain's state, signatures checked against the
        deployment's own key."""
        from tombstone.report.command import make_report

        return json.dumps(make_report([], config_path=str(config.path), key_path=None).as_json(), indent=2,
                          sort_keys=True)

    return server


def serve_stdio(config_path: str | None) -> None:
    server = build_server(config_path)
    server.run("stdio")


__all__ = ["Confirmations", "build_server", "serve_stdio"]
