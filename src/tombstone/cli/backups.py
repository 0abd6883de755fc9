"""``tombstone backups``: declared copies until they expire, and their re-check (``tombstone.backups``)."""

from __future__ import annotations

import datetime as dt
import sys

import click

from tombstone.cli.base import CONFIG_OPTION, EXIT_FAILED, _table, echo, main


@main.group("backups")
def backups_group() -> None:
    """Declared backups, snapshots and replicas ([backups.NAME] in the config): which still hold erased
    subjects, until when, and the re-check of a restored copy once they expire."""


@backups_group.command("due")
@click.option("--today", default=None, metavar="DATE", help="Judge expiry as of this date (default: today).")
@CONFIG_OPTION
def backups_due(today: str | None, config_path: str | None) -> None:
    """List the copies listed on receipts, their expiry and re-check; exits 1 while an expired one has not been
    re-checked."""
    from tombstone.api import Tombstone
    from tombstone.backups import due
    from tombstone.requests import parse_date

    day = parse_date(today, "--today") if today else dt.date.today()
    with Tombstone.open(config_path) as tomb:
        rows = due(tomb.lineage, day)
    if not rows:
        echo("no receipt lists a declared copy ([backups.NAME] in the config declares them)")
        return
    table = []
    for r in rows:
        check = r["recheck"]
        state = (f"re-checked: {check['result']} (receipt {check['receipt_hash'].split(':')[-1][:12]})" if check
                 else "DUE: restore it and run 'tombstone backups recheck'" if r["expired"] else "not expired yet")
        table.append((r["subject"], f"#{r['sequence']}", r["backup"], r["store"], r["expires_on"], state))
    echo(_table(("subject", "receipt", "copy", "store", "expires", "re-check"), table))
    if any(r["expired"] and not r["recheck"] for r in rows):
        sys.exit(EXIT_FAILED)


@backups_group.command("recheck")
@click.argument("subject")
@click.option("--backup", "backup", required=True, help="The declared copy ([backups.NAME]) that was restored.")
@click.option("--restored", required=True, metavar="PATH|DSN",
              help="Where the copy was restored: the store's directory or file, or the database (a DSN) it went to.")
@click.option("--store", default=None, help="The store the restored copy is of (where the copy covers several).")
@CONFIG_OPTION
def backups_recheck(subject: str, backup: str, restored: str, store: str | None, config_path: str | None) -> None:
    """Run the physical probe on a restored copy for the records SUBJECT's receipt erased, read-only, and seal
    the result as a follow-up receipt; exits 1 when the copy still holds any of them."""
    from tombstone.api import Tombstone
    from tombstone.backups import recheck
    from tombstone.inputs import check_subject

    check_subject(subject)
    with Tombstone.open(config_path) as tomb:
        receipt, path = recheck(tomb, subject, backup, restored, store)
    section = receipt["backup_recheck"]
    found = [r["artifact_id"] for r in section["records"] if r["found"]]
    echo(f"{section['backup']} restored at {section['restored']} ({section['store']}): {section['result']}"
         f" — {len(found)} of {len(section['records'])} erased record(s) found")
    echo(f"receipt: {path}")
    if section["result"] == "found":
        sys.exit(EXIT_FAILED)
