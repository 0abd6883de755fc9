"""Erasure requests: when each came, by when it must be answered, what is lawfully kept, and which receipt
answered it (``tombstone request``).

GDPR Art. 12(3) gives the controller one month from receipt of a request to act on it, extendable by two
further months where necessary, with the data subject told why: a request's due date is its receipt date plus
one calendar month (the same day of the next month, or that month's last day), and ``extend`` moves it by one or
two months in all, recording the reason. Art. 17(3) lets a controller keep data it must keep (a legal
obligation, legal claims, ...): a request records such an exception per store, with its reason and, where it
ends, the date; an erasure of the subject while the request is open leaves that store's records untouched and
its receipt lists each of them as OUT_OF_SCOPE(retained by exception: ...), never as erased.

A request is answered by the first receipt of its subject sealed on or after the day it was received in which
no artifact needs action (none RESIDUAL or NEEDS_HUMAN): ``refresh`` records it. The lineage db keeps the
subject keyed, as everywhere: a listing names requests by their id and the operator's reference.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tombstone.errors import ConfigError

MAX_EXTENSION_MONTHS = 2
DUE_SOON_DAYS = 7
NEEDS_ACTION = frozenset({"RESIDUAL", "NEEDS_HUMAN"})
"""Statuses that keep a receipt from answering a request: something of the subject may still be held."""


def parse_date(text: str, what: str) -> dt.date:
    try:
        return dt.date.fromisoformat(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what} must be a date as YYYY-MM-DD, not {text!r}") from None


def add_months(day: dt.date, months: int) -> dt.date:
    """The same day ``months`` calendar months later, or that month's last day where it has no such day."""
    index = day.month - 1 + months
    year, month = day.year + index // 12, index % 12 + 1
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


@dataclass(frozen=True)
class Retention:
    """Records of one store kept under an Art. 17(3) exception."""

    store: str
    reason: str
    until: dt.date | None = None

    @classmethod
    def parse(cls, text: str, stores: Iterable[str]) -> "Retention":
        """``STORE:REASON`` or ``STORE:REASON:UNTIL`` (a date); the store must be configured."""
        store, sep, rest = str(text).partition(":")
        if not sep or not store.strip() or not rest.strip():
            raise ConfigError(f"--retain takes STORE:REASON[:UNTIL], not {text!r}")
        reason, until = rest, None
        head, _, tail = rest.rpartition(":")
        if head and len(tail.strip()) == 10:
            try:
                until = dt.date.fromisoformat(tail.strip())
                reason = head
            except ValueError:
                pass
        known = sorted(stores)
        if store.strip() not in known:
            raise ConfigError(f"--retain names store {store.strip()!r}, which is not configured"
                              f" (configured: {', '.join(known) or 'none'})")
        return cls(store.strip(), reason.strip(), until)

    def describe(self) -> str:
        return self.reason + (f", until {self.until.isoformat()}" if self.until else "")

    def as_json(self) -> dict[str, Any]:
        return {"store": self.store, "reason": self.reason, "until": self.until.isoformat() if self.until else None}


@dataclass
class Request:
    request_id: str
    subject_key: str
    received_on: dt.date
    due_on: dt.date
    created_at: str
    reference: str | None = None
    basis: str | None = None
    extended_to: dt.date | None = None
    extension_reason: str | None = None
    retentions: list[Retention] = field(default_factory=list)
    answered_at: str | None = None
    receipt_hash: str | None = None

    @property
    def deadline(self) -> dt.date:
        return self.extended_to or self.due_on

    def state(self, today: dt.date) -> str:
        if self.answered_at:
            return "answered"
        if today > self.deadline:
            return "overdue"
        if (self.deadline - today).days <= DUE_SOON_DAYS:
            return "due soon"
        return "open"

    def as_json(self, today: dt.date) -> dict[str, Any]:
        return {"request_id": self.request_id, "reference": self.reference, "basis": self.basis,
                "received_on": self.received_on.isoformat(), "due_on": self.due_on.isoformat(),
                "extended_to": self.extended_to.isoformat() if self.extended_to else None,
                "extension_reason": self.extension_reason, "deadline": self.deadline.isoformat(),
                "state": self.state(today), "retentions": [r.as_json() for r in self.retentions],
                "answered_at": self.answered_at, "receipt_hash": self.receipt_hash}


def _row(row: Mapping[str, Any]) -> Request:
    def day(value: Any) -> dt.date | None:
        return dt.date.fromisoformat(value) if value else None

    return Request(request_id=row["request_id"], subject_key=row["subject_key"], reference=row["reference"],
                   received_on=day(row["received_on"]), due_on=day(row["due_on"]), created_at=row["created_at"],
                   basis=row["basis"], extended_to=day(row["extended_to"]), extension_reason=row["extension_reason"],
                   retentions=[Retention(r["store"], r["reason"], day(r.get("until")))
                               for r in json.loads(row["retentions"] or "[]")],
                   answered_at=row["answered_at"], receipt_hash=row["receipt_hash"])


class Requests:
    """The requests of one deployment's lineage db."""

    def __init__(self, lineage: Any) -> None:
        self.lineage = lineage

    def _all(self, where: str = "", params: tuple = ()) -> list[Request]:
        rows = self.lineage._conn.execute(f"SELECT * FROM requests{where} ORDER BY received_on, request_id",
                                          params).fetchall()
        return [_row(r) for r in rows]

    def get(self, request_id: str) -> Request:
        found = self._all(" WHERE request_id = ?", (request_id,))
        if not found:
            raise ConfigError(f"no request {request_id!r} ('tombstone request list' lists them)")
        return found[0]

    def add(self, subject: str, received: dt.date, *, today: dt.date, reference: str | None = None,
            basis: str | None = None, retentions: Iterable[Retention] = ()) -> Request:
        if received > today:
            raise ConfigError(f"--received {received.isoformat()} is after today ({today.isoformat()})")
        retentions = list(retentions)
        with self.lineage.atomic() as conn:
            count = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
            request_id = f"R-{count + 1:04d}"
            while conn.execute("SELECT 1 FROM requests WHERE request_id = ?", (request_id,)).fetchone():
                count += 1
                request_id = f"R-{count + 1:04d}"
            due = add_months(received, 1)
            conn.execute("INSERT INTO requests (request_id, subject_key, reference, received_on, due_on, basis,"
                         " retentions, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (request_id, self.lineage.subject_key(subject), reference, received.isoformat(),
                          due.isoformat(), basis, json.dumps([r.as_json() for r in retentions]),
                          self.lineage._now()))
        return self.get(request_id)

    def extend(self, request_id: str, months: int, reason: str) -> Request:
        request = self.get(request_id)
        if request.answered_at:
            raise ConfigError(f"request {request_id} was answered on {request.answered_at[:10]}: nothing to extend")
        if not reason or not reason.strip():
            raise ConfigError("an extension needs --reason (Art. 12(3): the data subject is told why)")
        if months < 1:
            raise ConfigError("--months must be 1 or 2")
        taken = 0
        if request.extended_to:
            taken = (request.extended_to.year - request.due_on.year) * 12 + request.extended_to.month - request.due_on.month
        if taken + months > MAX_EXTENSION_MONTHS:
            raise ConfigError(f"request {request_id} is already extended by {taken} month(s): Art. 12(3) allows"
                              f" {MAX_EXTENSION_MONTHS} further months in all")
        extended = add_months(request.due_on, taken + months)
        reasons = "; ".join(r for r in (request.extension_reason, reason.strip()) if r)
        with self.lineage.atomic() as conn:
            conn.execute("UPDATE requests SET extended_to = ?, extension_reason = ? WHERE request_id = ?",
                         (extended.isoformat(), reasons, request_id))
        return self.get(request_id)

    def refresh(self) -> list[Request]:
        """Every request, each open one checked against its subject's sealed receipts (and recorded as
        answered by the first that answers it)."""
        requests = self._all()
        for request in requests:
            if request.answered_at:
                continue
            for sealed in self.lineage.receipts(request.subject_key):
                if sealed["created_at"][:10] < request.received_on.isoformat():
                    continue
                receipt = json.loads(sealed["body"])
                if any(a.get("status") in NEEDS_ACTION for a in receipt.get("artifacts", [])):
                    continue
                request.answered_at, request.receipt_hash = sealed["created_at"], sealed["receipt_hash"]
                with self.lineage.atomic() as conn:
                    conn.execute("UPDATE requests SET answered_at = ?, receipt_hash = ? WHERE request_id = ?",
                                 (request.answered_at, request.receipt_hash, request.request_id))
                break
        return requests

    def retained(self, subject_key: str, today: dt.date) -> dict[str, str]:
        """The stores whose records a request of the subject keeps under an exception, with why. An exception
        holds until its end date, whether or not its request has been answered (a later erasure of the subject
        keeps the records too); one recorded without an end date holds for good."""
        out: dict[str, str] = {}
        for request in self._all(" WHERE subject_key = ?", (subject_key,)):
            for r in request.retentions:
                if r.until is None or r.until >= today:
                    out.setdefault(r.store, f"{r.describe()} (request {request.request_id})")
        return out


__all__ = ["DUE_SOON_DAYS", "MAX_EXTENSION_MONTHS", "NEEDS_ACTION", "Request", "Requests", "Retention", "add_months",
           "parse_date"]
