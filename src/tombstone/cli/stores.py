"""Commands that look at stores and deployments from outside an erasure: audit, check, scan, reclaim,
compact, auditor-key, backends, report, serve."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from tombstone.errors import ConfigError
from tombstone.cli.jsonout import JSON_OPTION, emit
from tombstone.cli.base import CONFIG_OPTION, EXIT_ACTION_NEEDED, EXIT_FAILED, EXIT_UNCHECKED, _table, echo, main


@main.command("audit")
@click.argument("file", type=click.Path(dir_okay=False))
@CONFIG_OPTION
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="The operator's published Ed25519 public key (PEM) to trust. Without it: the keys_dir of the"
                   " configuration named by --config or $TOMBSTONE_CONFIG.")
@click.option("--trust-config", is_flag=True,
              help="Probe stores whose probes send a credential of yours (an API key, a database password)"
                   " to a host the configuration names; without it they are left unchecked.")
@click.option("--previous", multiple=True, type=click.Path(dir_okay=False),
              help="An earlier receipt of the chain (repeat for each) to check the links.")
@click.option("--anchor", default=None, help="A published chain head, COUNT:HASH from 'tombstone receipt head'.")
@click.option("--auditor-key", "auditor_key", type=click.Path(dir_okay=False), default=None,
              help="Your auditor private key (from 'tombstone auditor-key'): opens the content patterns the receipt"
                   " sealed to you, so the probes search for content as well as ids.")
@click.option("--sign-with", "sign_with", type=click.Path(dir_okay=False), default=None,
              help="Your auditor private key: counter-sign what this audit found, with the signing key derived from"
                   " it (its public half is auditor-signing.pub, beside the key).")
@click.option("--countersignature", "cs_out", type=click.Path(dir_okay=False), default=None,
              help="Where --sign-with writes the counter-signature (default: RECEIPT-NAME.countersignature.json"
                   " in the current folder).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit_cmd(file: str, config_path: str | None, key: str | None, trust_config: bool, previous: tuple[str, ...],
              anchor: str | None, auditor_key: str | None, sign_with: str | None, cs_out: str | None,
              as_json: bool) -> None:
    """Independently re-probe, read-only, the stores a receipt names, without the lineage db; exit 1 on any
    contradiction, 4 when a claim could not be re-checked. With --sign-with, counter-sign the findings."""
    from tombstone.audit import AGREE, CONTRADICTED, NOT_RUN_FRAGMENTS, UNCHECKED, audit

    signer = out_path = None
    if sign_with:  # the key and the destination are checked before anything is probed
        from tombstone.inputs import check_out_path
        from tombstone.receipt.countersign import signing_key

        signer = signing_key(sign_with)
        out_path = Path(cs_out or f"{Path(file).stem}.countersignature.json")
        check_out_path(str(out_path), "--countersignature")
    report = audit(file, config_path=config_path, key_path=key, previous=previous, anchor=anchor,
                   auditor_key_path=auditor_key, trust_config=trust_config)
    if signer is not None:
        from tombstone.fsutil import write_atomic
        from tombstone.receipt import load_receipt
        from tombstone.receipt.countersign import countersign

        data = load_receipt(file) if report.integrity == "ok" else {}
        write_atomic(out_path, (json.dumps(countersign(report, data, signer), indent=2, sort_keys=True) + "\n").encode())
        out_path.chmod(0o644)
    if as_json:
        echo(json.dumps(report.as_json(), indent=2))
    else:
        echo(f"receipt:   {report.receipt}")
        echo(f"key:       {report.key}")
        echo(f"integrity: {report.integrity}")
        echo(f"chain:     {report.chain}")
        if report.rows:
            shown_as = {AGREE: "yes", CONTRADICTED: "NO", UNCHECKED: "unchecked"}
            rows = [(r.store, r.artifact_id, r.receipt_says, r.audit_found, shown_as[r.verdict]) for r in report.rows]
            echo(_table(("store", "artifact", "receipt says", "audit found", "agree"), rows))
            notes = sorted({n for r in report.rows for n in r.not_run if n != NOT_RUN_FRAGMENTS})
            for note in [NOT_RUN_FRAGMENTS, *notes]:
                echo(f"not run: {note}")
        for verdict, label in ((CONTRADICTED, "CONTRADICTED"), (UNCHECKED, "UNCHECKED")):
            named = [r.artifact_id for r in report.rows if r.verdict == verdict]
            if named:
                echo(f"{label}: {', '.join(named)}")
    if signer is not None and not as_json:
        echo(f"counter-signature: {out_path} (verdict {report.verdict})")
    if report.verdict == CONTRADICTED:
        sys.exit(EXIT_FAILED)
    if report.verdict == UNCHECKED:
        sys.exit(EXIT_UNCHECKED)


@main.command("check")
@click.option("--backend", required=True,
              help="Backend to check: any installed adapter that can write canaries ('tombstone backends' lists them).")
@CONFIG_OPTION
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write the result as JUnit XML.")
@click.option("--canaries", type=int, default=3, show_default=True, help="Number of canary subjects.")
@JSON_OPTION
def check_cmd(backend: str, config_path: str | None, junit: str | None, canaries: int, as_json: bool) -> None:
    """CI gate: write canary subjects, erase them, exit 1 unless each ends at the backend's highest level."""
    from tombstone.check import run_check

    if canaries < 1:
        raise ConfigError("--canaries must be at least 1")
    if junit:
        from tombstone.inputs import check_out_path

        check_out_path(junit, "--junit")  # before the canaries are written: a FIFO or a folder there is refused now
    from tombstone.cli.output import _progress

    result = run_check(backend, config_path=config_path, canaries=canaries, progress=_progress())
    if junit:
        Path(junit).parent.mkdir(parents=True, exist_ok=True)
        Path(junit).write_text(result.junit(), encoding="utf-8")
    if as_json:
        emit("check", {"backend": backend, "passed": result.passed, "failures": result.failures, "notes": result.notes,
                       "canaries": [{"subject": r.subject, "artifact_id": r.artifact_id, "status": r.status,
                                     "expected": r.expected, "passed": r.passed, "detail": r.detail} for r in result.rows]})
        sys.exit(0 if result.passed else 1)
    for note in result.notes:
        echo(f"note: {note}")
    rows = [(r.subject, r.artifact_id, r.status, "pass" if r.passed else "FAIL") for r in result.rows]
    if rows:
        echo(_table(("canary", "artifact", "status", "result"), rows))
    for failure in result.failures:
        echo(f"FAIL: {failure}")
    echo(f"{backend}: {'PASS' if result.passed else 'FAIL'} ({sum(r.passed for r in result.rows)}/{len(result.rows)}"
               f" canary artifacts at the expected level)")
    if not result.passed:
        sys.exit(1)


@main.command("scan")
@CONFIG_OPTION
@click.option("--store", "store", default=None, help="The configured store to scan (with --config).")
@click.option("--backend", default=None, help="Scan a store with no deployment: its backend ...")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="... and its options, as in tombstone.toml (repeat; e.g. path=docs.db).")
@click.option("--show-ids", is_flag=True, help="Also list the ids of the deleted records found (never content).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as a self-contained HTML page to this file (never over a receipt).")
def scan_cmd(config_path: str | None, store: str | None, backend: str | None, options: tuple[str, ...],
             show_ids: bool, as_json: bool, html_out: str | None) -> None:
    """Read-only: how much deleted data the store still holds (free pages, freeblocks, ...), with no lineage
    db; exit 3 when some is recoverable."""
    from tombstone.scan import scan_configured, scan_options

    if backend is not None:
        if store is not None and config_path is not None:
            raise ConfigError("give either --config with --store, or --backend with --option, not both")
        parsed: dict[str, Any] = {}
        for item in options:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--option {item!r}: write KEY=VALUE")
            parsed[key.strip()] = value
        report = scan_options(store or backend, backend, parsed)
    else:
        if store is None:
            raise ConfigError("say which store: --config FILE --store NAME, or --backend NAME --option KEY=VALUE")
        if options:
            raise ConfigError("--option goes with --backend; a configured store's options come from --config")
        report = scan_configured(config_path, store)
    if html_out is not None:
        from datetime import datetime, timezone

        from tombstone.fsutil import write_atomic
        from tombstone.report.render import render_scan_html

        target = Path(html_out)
        if target.exists() and target.suffix == ".json":
            raise ConfigError(f"--html {html_out}: refusing to write over a .json file (a receipt, perhaps)")
        page = render_scan_html(report, show_ids=show_ids,
                                generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        try:
            write_atomic(target, page.encode("utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot write {html_out}: {exc.strerror or exc}") from exc
    if as_json:
        echo(json.dumps(report.as_json(show_ids), indent=2))
    else:
        rows = [(p.place, p.kind, p.count, p.bytes, p.note) for p in report.places]
        echo(_table(("place", "what", "deleted records", "bytes not zero", "note"), rows))
        if show_ids:
            for place in report.places:
                for ident in sorted(place.ids):
                    echo(f"id: {ident}  ({place.place}, {place.kind})")
        for note in report.notes:
            echo(f"note: {note}")
        verdict = "deleted data is recoverable" if report.recoverable else "nothing deleted is recoverable"
        echo(f"{report.store} ({report.backend}): {verdict} ({report.count} record(s), {report.bytes} byte(s))")
    if report.recoverable:
        sys.exit(EXIT_ACTION_NEEDED)


@main.command("reclaim")
@CONFIG_OPTION
@click.option("--store", "store", required=True, help="The configured store to reclaim.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the receipt here (default: the receipts directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt's store_reclaim section as JSON.")
def reclaim_cmd(config_path: str | None, store: str, out: str | None, as_json: bool) -> None:
    """Apply the store's reclaim recipe to the whole store, so what its own client already deleted leaves its
    files; 'tombstone scan' before and after (where the backend has one). Journaled (an interrupted reclaim
    finishes with 'tombstone resume') and sealed by a signed receipt of kind store reclaim. Exit 3 when the
    scan after still finds deleted data."""
    from tombstone.api import Tombstone

    from tombstone.cli.erasure import under_way

    with under_way(), Tombstone.open(config_path) as tomb:
        if store not in tomb.config.stores:
            known = ", ".join(sorted(tomb.config.stores)) or "none"
            raise ConfigError(f"no store {store!r} in {tomb.config.path} (stores: {known})")
        receipt, path = tomb.reclaim_store(store, out=out)
    section = receipt["store_reclaim"]
    before, after, evidence = section["before"], section["after"], section["evidence"]
    if as_json:
        echo(json.dumps({**section, "receipt": str(path)}, indent=2, default=str))
    else:
        steps = evidence.get("steps") or [evidence.get("mechanism", "reclaim")]
        echo(f"{store} ({section['backend']}): {'; '.join(map(str, steps))}")
        if before is None or after is None:
            echo(f"{store}: no scan for the {section['backend']} backend, so nothing is counted before or after")
        else:
            rows = [(q["place"], q["kind"], p["count"], p["bytes"], q["count"], q["bytes"])
                    for p, q in zip(before["places"], after["places"])]
            echo(_table(("place", "what", "records before", "bytes before", "records after", "bytes after"),
                              rows))
            verdict = "deleted data is still recoverable" if after["recoverable"] else "nothing deleted is recoverable"
            echo(f"{store} ({section['backend']}): {verdict} ({after['count']} record(s), {after['bytes']} byte(s))")
        echo(f"receipt: {path}")
    if after is not None and after["recoverable"]:
        sys.exit(EXIT_ACTION_NEEDED)


@main.command("compact")
@CONFIG_OPTION
@click.option("--store", "stores", multiple=True, help="A configured store (repeat; default: every store).")
def compact_cmd(config_path: str | None, stores: tuple[str, ...]) -> None:
    """Rewrite stores without the structural traces an in-place reclaim leaves (zeroed slots and their
    graph links); holds each store's lock while it runs. The preflight opens every named store read-only
    first (exit 2, nothing changed, if one fails); a store failing after others were compacted: exit 3."""
    from tombstone.api import Tombstone
    from tombstone.preflight import cause

    with Tombstone.open(config_path) as tomb:
        names = list(dict.fromkeys(stores)) or sorted(tomb.config.stores)
        for name in names:
            if name not in tomb.config.stores:
                known = ", ".join(sorted(tomb.config.stores)) or "none"
                raise ConfigError(f"no store {name!r} in {tomb.config.path} (stores: {known})")
        tomb.preflight(names)
        done: list[str] = []
        for name in names:
            try:
                adapter = tomb.adapter(name)
                with adapter.store_lock():
                    evidence = adapter.compact()
            except Exception as exc:  # past the preflight, the store may be part-way: say how to finish
                rest = " ".join(f"--store {n}" for n in names[len(done):])
                before = f"compacted before it: {', '.join(done)}; " if done else ""
                echo(f"error: {cause(exc)}; {before}the compaction of {name!r} is under way: fix that and run"
                     f" 'tombstone compact --config {tomb.config.path} {rest}'", err=True)
                sys.exit(EXIT_ACTION_NEEDED)
            done.append(name)
            detail = ", ".join(f"{k} {v}" for k, v in evidence.items() if k not in ("mechanism", "why"))
            echo(f"{name} ({adapter.backend}): {evidence.get('why') or evidence['mechanism']}"
                       + (f" ({detail})" if detail else ""))


@main.command("auditor-key")
@click.argument("directory", type=click.Path(file_okay=False))
def auditor_key_cmd(directory: str) -> None:
    """Create an auditor key pair: keep auditor.key, give auditor.pub to the operator for auditor_keys."""
    from tombstone.receipt.sealing import create_auditor_keys, key_id, load_public

    from tombstone.receipt.countersign import SIGNING_PUBLIC, write_signing_public

    private, public = create_auditor_keys(directory)
    signing = write_signing_public(private, Path(directory) / SIGNING_PUBLIC)
    echo(f"private key: {private}  (keep it: it opens the content patterns sealed to you and signs your audits)")
    echo(f"public key:  {public}  ({key_id(load_public(public))}; the operator lists it under auditor_keys)")
    echo(f"signing key: {signing}  (publish it: anyone checks your counter-signatures with it)")


@main.command("backends")
@click.option("--all", "show_all", is_flag=True, help="Also list the adapters that exist for tests (fault injection).")
@JSON_OPTION
def backends_cmd(show_all: bool, as_json: bool) -> None:
    """List the installed backend adapters: capabilities, levels, demo support, or how to install them."""
    from tombstone.contract import install_hint, loadable_adapters

    rows, items = [], []
    for name, cls in loadable_adapters().items():
        if isinstance(cls, type) and cls.for_tests and not show_all:
            continue
        if not isinstance(cls, type):
            rows.append((name, "not importable", "-", "-", install_hint(name) or str(cls)))
            items.append({"backend": name, "installed": False, "install": install_hint(name) or str(cls)})
            continue
        items.append({"backend": name, "installed": True, "capabilities": sorted(c.value for c in cls.capabilities),
                      "levels": [lv.value for lv in cls.levels], "demo": cls.demo_role, "demo_default": cls.demo_default,
                      "for_tests": cls.for_tests, "experimental": cls.experimental, "install": None})
        caps = ",".join(sorted(c.value for c in cls.capabilities)) or "-"
        levels = ",".join(lv.value for lv in cls.levels)
        demo = cls.demo_role + (" (default)" if cls.demo_default else "") if cls.demo_role else "-"
        rows.append((name + (" (experimental)" if cls.experimental else ""), caps, levels, demo, ""))
    if as_json:
        emit("backends", {"backends": items})
        return
    echo(_table(("backend", "capabilities", "levels", "demo / check", "install"), rows))


@main.command("report")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="The deployment: its sealed receipts when no PATHS are given, and its public key for signatures.")
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="Trusted Ed25519 public key (PEM) to check signatures against (never a key found next to the receipts).")
@click.option("--anchor", default=None, help="A published chain head, COUNT:HASH from 'tombstone receipt head'.")
@click.option("--format", "fmt", default="html", metavar="html|md|json",
              help="html (default: one self-contained page), md (Markdown) or json.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the report to FILE (default: stdout).")
def report_cmd(paths: tuple[str, ...], config_path: str | None, key: str | None, anchor: str | None, fmt: str,
               out: str | None) -> None:
    """Summarise receipts across subjects, stores and levels for a compliance team (exit 3: action needed)."""
    from tombstone.report.command import check_format, exit_code, make_report, summary_line, write_report

    check_format(fmt)
    report = make_report(paths, config_path=config_path, key_path=key, anchor=anchor)
    write_report(report, fmt, out)
    if out:
        echo(f"{summary_line(report)} -> {out}", err=True)
    sys.exit(exit_code(report))


@main.command("serve")
@CONFIG_OPTION
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless --allow-remote).")
@click.option("--port", default="8765", show_default=True, help="Port to listen on (0: any free port).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --host that other machines can reach (needs --tls-cert/--tls-key or --insecure-http).")
@click.option("--tls-cert", default=None, metavar="FILE", help="Serve HTTPS with this certificate (PEM).")
@click.option("--tls-key", default=None, metavar="FILE", help="The certificate's private key (PEM, unencrypted).")
@click.option("--insecure-http", is_flag=True,
              help="Serve --allow-remote over plain HTTP: the token and the receipts travel in clear text.")
def serve_cmd(config_path: str | None, host: str, port: str, allow_remote: bool, tls_cert: str | None,
              tls_key: str | None, insecure_http: bool) -> None:
    """A read-only local page over the deployment: sagas, receipts, evidence, dead letters, the chain."""
    from tombstone.report.server import serve

    serve(config_path, host=host, port=port, allow_remote=allow_remote, echo=click.echo, tls_cert=tls_cert,
          tls_key=tls_key, insecure_http=insecure_http, warn=lambda line: echo(line, err=True))


