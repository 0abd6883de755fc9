"""``tombstone request``: erasure requests with their deadlines and exceptions (``tombstone.requests``)."""

from __future__ import annotations

import datetime as dt
import sys

import click

from tombstone.cli.base import CONFIG_OPTION, EXIT_FAILED, _table, echo, main


def _today(text: str | None) -> dt.date:
    from tombstone.requests import parse_date

    return parse_date(text, "--today") if text else dt.date.today()


@main.group("request")
def request_group() -> None:
    """Erasure requests: when each came, by when it must be answered (GDPR Art. 12(3)), what is kept under an
    Art. 17(3) exception, and which receipt answered it."""


@request_group.command("add")
@click.argument("subject")
@click.option("--received", required=True, metavar="DATE", help="When the request was received (YYYY-MM-DD).")
@click.option("--reference", default=None, help="Your own reference for the request (a ticket number).")
@click.option("--basis", default=None, help="The ground the request invokes (e.g. 'Art. 17(1)(a)').")
@click.option("--retain", "retain", multiple=True, metavar="STORE:REASON[:UNTIL]",
              help="Keep a store's records of the subject under an Art. 17(3) exception, with why and, where it"
                   " ends, the date (repeatable). An erasure leaves them untouched; its receipt lists them as"
                   " OUT_OF_SCOPE(retained by exception).")
@CONFIG_OPTION
def request_add(subject: str, received: str, reference: str | None, basis: str | None, retain: tuple[str, ...],
                config_path: str | None) -> None:
    """Record an erasure request for SUBJECT; its deadline is one month after --received."""
    from tombstone.api import Tombstone
    from tombstone.inputs import check_subject
    from tombstone.requests import Requests, Retention, parse_date

    check_subject(subject)
    day = parse_date(received, "--received")
    with Tombstone.open(config_path) as tomb:
        retentions = [Retention.parse(r, tomb.config.stores) for r in retain]
        request = Requests(tomb.lineage).add(subject, day, today=dt.date.today(), reference=reference, basis=basis,
                                             retentions=retentions)
    echo(f"request {request.request_id}: received {request.received_on}, due {request.due_on}"
         + "".join(f"; {r.store} kept ({r.describe()})" for r in request.retentions))


@request_group.command("extend")
@click.argument("request_id")
@click.option("--months", type=click.IntRange(1, 2), required=True, help="1 or 2 (Art. 12(3): two in all).")
@click.option("--reason", required=True, help="Why (the data subject must be told).")
@CONFIG_OPTION
def request_extend(request_id: str, months: int, reason: str, config_path: str | None) -> None:
    """Extend a request's deadline by one or two months, recording why."""
    from tombstone.api import Tombstone
    from tombstone.requests import Requests

    with Tombstone.open(config_path) as tomb:
        request = Requests(tomb.lineage).extend(request_id, months, reason)
    echo(f"request {request.request_id}: due {request.extended_to} (extended from {request.due_on}: "
         f"{request.extension_reason})")


@request_group.command("list")
@click.option("--today", default=None, metavar="DATE", help="Judge deadlines as of this date (default: today).")
@CONFIG_OPTION
def request_list(today: str | None, config_path: str | None) -> None:
    """List the requests: open, due soon, overdue, answered (and by which receipt). Exits 1 while any is
    overdue, for a daily check."""
    from tombstone.api import Tombstone
    from tombstone.requests import Requests

    day = _today(today)
    with Tombstone.open(config_path) as tomb:
        requests = Requests(tomb.lineage).refresh()
    rows = [(r.request_id, r.reference or "-", r.received_on.isoformat(), r.deadline.isoformat()
             + (" (extended)" if r.extended_to else ""), r.state(day),
             f"{r.answered_at[:10]} receipt {r.receipt_hash.split(':')[-1][:12]}" if r.answered_at else
             f"{(r.deadline - day).days} day(s) left" if day <= r.deadline else f"{(day - r.deadline).days} day(s) late",
             ", ".join(f"{x.store}: {x.describe()}" for x in r.retentions) or "-")
            for r in requests]
    if not rows:
        echo("no requests recorded ('tombstone request add' records one)")
        return
    echo(_table(("request", "reference", "received", "due", "state", "answer", "kept by exception"), rows))
    overdue = [r.request_id for r in requests if r.state(day) == "overdue"]
    if overdue:
        echo(f"overdue: {', '.join(overdue)}", err=True)
        sys.exit(EXIT_FAILED)
