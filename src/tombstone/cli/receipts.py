"""The receipt commands: verify, show, head, list, export, schema."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tombstone.errors import ConfigError, ReceiptError, SagaError, shown
from tombstone.cli.jsonout import JSON_OPTION, emit
from tombstone.cli.base import CONFIG_OPTION, _table, echo, main
from tombstone.cli.output import format_receipt


@main.group()
def receipt() -> None:
    """Verify, show and describe receipts."""


def _trusted_key(key: str | None, config_path: str | None):
    """The key a receipt is checked against: ``--key``, else the key of the configuration named by
    ``--config`` or ``$TOMBSTONE_CONFIG`` — never one found near the receipt (a forger would put one there)."""
    from tombstone.audit import explicit_config_path, trusted_key
    from tombstone.config import load_config

    if key:
        return trusted_key(key, None)
    explicit = explicit_config_path(config_path)
    return trusted_key(None, load_config(explicit) if explicit else None)


def COUNTERSIGNATURE_OPTIONS(command):  # noqa: N802  (a decorator, named as the option constants are)
    """``--countersignature`` and ``--auditor``: an auditor's counter-signature and the key it must verify with."""
    command = click.option("--auditor", "auditor", type=click.Path(dir_okay=False), default=None,
                           help="The auditor's published signing key (auditor-signing.pub) the counter-signature"
                                " must verify with.")(command)
    return click.option("--countersignature", "countersignature", type=click.Path(dir_okay=False), default=None,
                        help="An auditor's counter-signature of the receipt ('tombstone audit --sign-with'), checked"
                             " with --auditor.")(command)


def _checked_countersignature(path: str, auditor: str, receipt: dict) -> dict:
    """An auditor's counter-signature of ``receipt``, read from ``path`` and verified with the auditor's published
    signing key ``auditor``; ReceiptError naming the file otherwise."""
    from tombstone.fsutil import read_regular_file
    from tombstone.keys import load_public_key
    from tombstone.receipt.countersign import verify_countersignature
    from tombstone.receipt.signing import parse_strict

    auditor_key = load_public_key(Path(auditor))
    try:
        cs = parse_strict(read_regular_file(path, 1 << 24).decode("utf-8"), path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ReceiptError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        return verify_countersignature(cs, receipt, auditor_key)
    except ReceiptError as exc:
        raise ReceiptError(f"{path}: {exc}") from exc


@receipt.command("verify")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="The operator's published Ed25519 public key (PEM) to trust. Without it: the key of the"
                   " deployment named by --config or $TOMBSTONE_CONFIG.")
@COUNTERSIGNATURE_OPTIONS
@CONFIG_OPTION
def receipt_verify(file: str, key: str | None, countersignature: str | None, auditor: str | None,
                   config_path: str | None) -> None:
    """Check a receipt's schema, hash and signature against a key you trust; exit 1 on any alteration. With
    --countersignature and --auditor, also the auditor's counter-signature of it."""
    from tombstone.receipt import load_receipt, verify

    if bool(countersignature) != bool(auditor):
        raise ConfigError("--countersignature and --auditor go together: the counter-signature and the auditor key"
                          " you trust to have made it")

    data = load_receipt(file)
    trusted = _trusted_key(key, config_path)
    try:
        result = verify(data, trusted.key)
    except ReceiptError as exc:
        raise ReceiptError(f"{file}: {exc} (checked against {trusted.describe()})") from exc
    echo(f"OK {file}")
    echo(f"  hash:      {result.receipt_hash}")
    echo(f"  signed by: {result.key_id}")
    echo(f"  previous:  {result.previous_receipt_hash or '(first receipt of the chain)'}")
    echo(f"  trusted:   {trusted.describe()}")
    if countersignature:
        cs = _checked_countersignature(countersignature, auditor, data)
        echo(f"OK {countersignature}")
        echo(f"  audited:   {cs['audited_at']} by {cs['signature']['key_id']} (the key you trust, {auditor})")
        echo(f"  verdict:   {cs['verdict']} ({sum(a['verdict'] == 'agree' for a in cs['artifacts'])} of"
             f" {len(cs['artifacts'])} artifacts re-checked and agreeing)")


@receipt.command("certificate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="The operator's published public key to verify the receipt with first (default: the key of the"
                   " deployment named by --config or $TOMBSTONE_CONFIG).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the HTML certificate (default: RECEIPT-NAME.certificate.html here).")
@click.option("--pdf", "pdf", type=click.Path(dir_okay=False), default=None,
              help="Also print it to this PDF, with the installed Chromium.")
@click.option("--operator", default=None, help="Who performed the erasure (name, role), as it should read.")
@COUNTERSIGNATURE_OPTIONS
@CONFIG_OPTION
def receipt_certificate(file: str, key: str | None, out: str | None, pdf: str | None, operator: str | None,
                        countersignature: str | None, auditor: str | None, config_path: str | None) -> None:
    """A one-page certificate of sanitization (NIST SP 800-88 Appendix G) derived from a receipt that verifies."""
    from tombstone.fsutil import write_atomic
    from tombstone.inputs import check_out_path
    from tombstone.receipt import load_receipt, verify
    from tombstone.receipt.certificate import render, to_pdf

    if bool(countersignature) != bool(auditor):
        raise ConfigError("--countersignature and --auditor go together: the counter-signature and the auditor key"
                          " you trust to have made it")
    target = Path(out or f"{Path(file).stem}.certificate.html")
    check_out_path(str(target), "--out")
    if pdf:
        check_out_path(pdf, "--pdf")
    data = load_receipt(file)
    trusted = _trusted_key(key, config_path)
    try:
        result = verify(data, trusted.key)
    except ReceiptError as exc:
        raise ReceiptError(f"{file}: {exc} (checked against {trusted.describe()}); no certificate written") from exc
    cs = _checked_countersignature(countersignature, auditor, data) if countersignature else None
    page = render(data, verified=result, trusted=trusted.describe(), operator=operator, countersignature=cs,
                  auditor=auditor)
    write_atomic(target, page.encode("utf-8"))
    target.chmod(0o644)
    echo(f"certificate: {target}")
    if pdf:
        echo(f"pdf:         {to_pdf(page, Path(pdf))}")


@receipt.command("show")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the receipts as JSON instead of tables.")
def receipt_show(files: tuple[str, ...], as_json: bool) -> None:
    """Print one or more receipts as readable tables (this does not verify them)."""
    from tombstone.receipt import Receipt

    parsed = [Receipt.load(file) for file in files]  # every file is read before anything is printed
    if as_json:
        data = [r.data for r in parsed]
        echo(json.dumps(data[0] if len(data) == 1 else data, indent=2, sort_keys=True))
        return
    for n, receipt in enumerate(parsed):
        if n:
            echo("")
        if len(parsed) > 1:
            echo(f"== {files[n]}")
        echo(format_receipt(receipt))
    echo("(not verified here: run 'tombstone receipt verify FILE --key PUBKEY')")


@receipt.command("head")
@CONFIG_OPTION
def receipt_head(config_path: str | None) -> None:
    """Print the receipt chain's head (count and hash) for publishing where the operator cannot rewrite it."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        head = tomb.lineage.chain_head()
    if head is None:
        raise SagaError("the receipt chain is empty: no erasure has finished yet")
    echo(f"{head[0]}:{head[1]}")


@receipt.command("list")
@CONFIG_OPTION
@click.option("--subject", default=None, help="Only this subject's receipts.")
@JSON_OPTION
def receipt_list(config_path: str | None, subject: str | None, as_json: bool) -> None:
    """List the sealed receipts the lineage db keeps: sequence, subject, saga, finished, summary, hash."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        rows = tomb.lineage.receipts(tomb.lineage.subject_key(subject) if subject is not None else None)
    if as_json:
        listed = []
        for row in rows:
            data = json.loads(row["body"])
            listed.append({"sequence": row["seq"], "subject": data["subject"], "saga_id": row["saga_id"],
                           "finished_at": data.get("finished_at"), "summary": data.get("summary", {}),
                           "receipt_hash": row["receipt_hash"]})
        emit("receipt list", {"receipts": listed})
        return
    if not rows:
        echo(f"no receipts for {shown(subject)}" if subject is not None else "no receipts: no erasure has finished yet")
        return
    table = []
    for row in rows:
        data = json.loads(row["body"])
        name = data["subject"] if data["subject"].isprintable() else repr(data["subject"])
        totals = ", ".join(f"{k} {v}" for k, v in data["summary"].items() if v) or "no artifacts"
        table.append((row["seq"], name, row["saga_id"], data["finished_at"], totals, row["receipt_hash"]))
    echo(_table(("#", "subject", "saga", "finished", "summary", "hash"), table))


EXPORT_NAME = "receipt-{seq:06d}.json"
"""The file name ``receipt export`` gives a receipt inside a directory (sorted by chain position)."""


@receipt.command("export")
@CONFIG_OPTION
@click.option("--sequence", default=None, metavar="N", help="Export receipt number N of the chain.")
@click.option("--saga", "saga_id", default=None, metavar="ID", help="Export the receipt of saga ID.")
@click.option("--all", "export_all", is_flag=True, help="Export every receipt of the chain into a directory.")
@click.option("--out", default=None, metavar="DIR|FILE",
              help="Where to write: a file (or a directory to put it in) for one receipt, a directory for --all.")
def receipt_export(config_path: str | None, sequence: str | None, saga_id: str | None, export_all: bool,
                   out: str | None) -> None:
    """Write the sealed copies the lineage db keeps of one receipt, or of the whole chain, for an auditor."""
    from tombstone.api import Tombstone
    from tombstone.errors import LineageError
    from tombstone.fsutil import write_atomic
    from tombstone.receipt import body_hash, pretty

    if sum((sequence is not None, saga_id is not None, export_all)) != 1:
        raise ConfigError("give exactly one of --sequence N, --saga ID or --all")
    if not out:
        raise ConfigError("give --out DIR|FILE: where to write the receipts")
    if sequence is not None and not (sequence.isdigit() and int(sequence) >= 1):
        raise ConfigError(f"--sequence must be a receipt number (1, 2, ...), got {sequence!r}")
    with Tombstone.open(config_path) as tomb:
        rows = tomb.lineage.receipts()
        running = tomb.lineage.saga(saga_id) if saga_id is not None else None
    if export_all:
        chosen = rows
        if not chosen:
            raise LineageError("the receipt chain is empty: no erasure has finished yet")
    elif sequence is not None:
        chosen = [r for r in rows if r["seq"] == int(sequence)]
        if not chosen:
            holds = f"it holds #1..#{rows[-1]['seq']}" if rows else "it is empty"
            raise LineageError(f"the receipt chain has no receipt #{int(sequence)} ({holds})")
    else:
        chosen = [r for r in rows if r["saga_id"] == saga_id]
        if not chosen:
            if running is not None:
                raise LineageError(f"saga {saga_id} has not finished, so it has no sealed receipt yet; run 'tombstone resume'")
            raise LineageError(f"no saga {saga_id!r} has a receipt in the chain ('tombstone receipt list' shows them)")
    target = Path(out)
    if export_all or target.is_dir():
        if target.exists() and not target.is_dir():
            raise ConfigError(f"--out {out} is a file; --all writes one file per receipt into a directory")
        files = [(row, target / EXPORT_NAME.format(seq=row["seq"])) for row in chosen]
    else:
        files = [(chosen[0], target)]
    writes = []
    for row, path in files:  # everything is checked before anything is written
        data = json.loads(row["body"])
        if body_hash(data) != row["receipt_hash"] or data.get("receipt_hash") != row["receipt_hash"]:
            raise ReceiptError(f"the sealed copy of receipt #{row['seq']} does not hash to its chain entry")
        content = pretty(data)
        if path.exists():
            if not path.is_file() or path.read_bytes() != content:
                raise ConfigError(f"{path} exists and is not receipt #{row['seq']}; refusing to overwrite it:"
                                  " export into an empty directory or to a new file")
            continue
        writes.append((row, path, content))
    for row, path, content in writes:
        write_atomic(path, content)
    for row, path in files:
        echo(f"receipt #{row['seq']} ({row['saga_id']}) -> {path}")
    if export_all:
        echo(f"chain head {rows[-1]['seq']}:{rows[-1]['receipt_hash']} (compare with the one you published)")


@receipt.command("schema")
@click.option("--cli", "cli_output", is_flag=True, help="The schema of the commands' --json output instead.")
def receipt_schema_cmd(cli_output: bool) -> None:
    """Print the published JSON Schema of the receipt format (or, with --cli, of every command's --json)."""
    from tombstone.cli.jsonout import output_schema
    from tombstone.receipt import receipt_schema

    echo(json.dumps(output_schema() if cli_output else receipt_schema(), indent=2))


