"""What a report says, gathered from receipts: per subject, per store and level, across subjects, and the chain.

Receipts come from files, directories, or the sealed copies a deployment's lineage db keeps. Signatures
are checked only against a key the reader names (``--key``, or the deployment named by ``--config``),
never against a key found next to the receipts: whoever could alter the receipts could have replaced that
key too. Without one the report says "signature not checked" and checks only that each receipt's hash
matches its content, which a forger can recompute.

Every file read is checked on its own: two files are read as one receipt only when their bytes are identical
and both pass their check, never because they claim the same hash (a tampered copy claims the genuine
receipt's hash and signature). Each file that fails is named, with the reason, in ``Report.failures``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tombstone.config import Config
from tombstone.errors import ConfigError, ReceiptError
from tombstone.keys import key_id
from tombstone.receipt.canonical import body_hash
from tombstone.receipt.model import Receipt
from tombstone.receipt.signing import BACKUP_RECHECK_KIND, parse_strict, read_receipt, verify
from tombstone.report.explain import Explanation, explain
from tombstone.verify.levels import Level, StatusKind
from tombstone.version import __version__

NOT_CHECKED = "signature not checked"
STATUS_ORDER = tuple(kind.value for kind in (StatusKind.RESIDUAL, StatusKind.NEEDS_HUMAN, StatusKind.UNVERIFIED,
                                             StatusKind.VERIFIED, StatusKind.OUT_OF_SCOPE))
"""Statuses in the order a reader needs them: what is still there first."""
NOTHING_RECORDED_ACTION = ("check the subject reference (stores written outside the wrappers are not covered),"
                           " then erase again")


@dataclass(frozen=True)
class Source:
    """One receipt as it was read: where from, and the parsed receipt."""

    where: str
    """A file path, or ``sealed copy #N`` for the deployment's own copies."""
    receipt: Receipt
    digest: bytes | None = field(default=None, repr=False, compare=False)
    """SHA-256 of the bytes the receipt was parsed from (the file's, or the sealed copy's); None when not
    known. Two sources with one digest are byte-identical."""


@dataclass(frozen=True)
class Integrity:
    """What was established about a receipt's hash and signature."""

    state: str
    """``verified``, ``not checked`` (hash matches, no key given) or ``failed``."""
    text: str
    """One line for the reader."""

    @property
    def failed(self) -> bool:
        return self.state == "failed"


@dataclass
class StatusGroup:
    """Artifacts of one store that ended with the same status (and the same next step)."""

    status: str
    """``VERIFIED(physical)``, ``UNVERIFIED(physical: ...)``, ..."""
    kind: str
    level: str | None
    explanation: Explanation
    action: str | None
    artifact_ids: list[str] = field(default_factory=list)
    logical_passed: bool = False

    @property
    def label(self) -> str:
        """The status without its details: ``VERIFIED(physical)``, ``UNVERIFIED(dlq)``, ``NEEDS_HUMAN(third party)``."""
        if self.level:
            return f"{self.kind}({self.level})"
        head = self.status.split("(", 1)[1].rsplit(")", 1)[0].split(":", 1)[0] if "(" in self.status else ""
        return f"{self.kind}({head})" if head else self.kind


@dataclass
class StoreView:
    store: str
    backends: list[str]
    groups: list[StatusGroup]


@dataclass
class ReceiptView:
    """One receipt as the report shows it."""

    source: Source
    integrity: Integrity
    stores: list[StoreView]

    @property
    def receipt(self) -> Receipt:
        return self.source.receipt


@dataclass
class SubjectReport:
    """Everything the report says about one subject: its latest receipt first, earlier ones after."""

    subject: str
    latest: ReceiptView
    earlier: list[ReceiptView]
    outcome: str
    """The outcome in one line."""
    state: str
    """``failed`` (the receipt does not verify), ``action`` (a person must act), ``done`` (nothing left)."""
    actions: list[str]
    """The distinct next steps, as the receipt recorded them."""

    @property
    def needs_action(self) -> bool:
        return self.state in ("failed", "action")


@dataclass
class ChainState:
    """The chain of the receipts given: its verified head, its gaps, what breaks it."""

    state: str
    """``complete``, ``gaps``, ``broken`` or ``empty``."""
    head: tuple[int, str] | None
    """The last receipt of the chain among the inputs (sequence, hash)."""
    head_verified: bool
    """The head's signature was checked and holds."""
    gaps: list[str]
    """Receipt numbers missing from the inputs, as ``#2`` or ``#4..#6``."""
    problems: list[str]
    """What breaks the chain (links that do not match, conflicting receipts, a head that disagrees)."""
    notes: list[str]
    """Everything else worth saying (receipts left out because they fail their check, the deployment's head)."""

    @property
    def text(self) -> str:
        if self.state == "empty":
            return "no receipts"
        seq, digest = self.head  # type: ignore[misc]
        head = f"{'verified ' if self.head_verified else ''}head #{seq} {digest}"
        if self.state == "broken":
            return f"BROKEN: {self.problems[0]} ({head})"
        if self.state == "gaps":
            return f"{head}; not among the inputs: {', '.join(self.gaps)}"
        return f"{head}; complete from #1"


@dataclass(frozen=True)
class Failure:
    """A receipt that was read and fails its check: where it came from and why."""

    where: str
    sequence: int
    subject: str
    reason: str


@dataclass
class Report:
    """A report over receipts."""

    generated_at: str
    sources: list[str]
    """What was read: paths, or the deployment's config."""
    key: str | None
    """The key signatures were checked against (``ed25519:...`` and where it came from), or None."""
    subjects: list[SubjectReport]
    chain: ChainState
    counts: dict[str, dict[str, int]]
    """Store → status → artifacts, over each subject's latest receipt that did not fail its check."""
    left_out: int
    """Latest receipts left out of the counts because they fail their check."""
    failures: list[Failure] = field(default_factory=list)
    """Every receipt read (each file, each sealed copy) that fails its hash or signature check."""

    @property
    def signatures_checked(self) -> bool:
        return self.key is not None

    @property
    def needs_action(self) -> list[SubjectReport]:
        return [s for s in self.subjects if s.needs_action]

    @property
    def failed(self) -> bool:
        """A receipt fails its hash or signature, or the chain is broken."""
        return self.chain.state == "broken" or bool(self.failures) or any(
            view.integrity.failed for s in self.subjects for view in [s.latest, *s.earlier])

    def status_totals(self) -> dict[str, int]:
        totals = {kind: 0 for kind in STATUS_ORDER}
        for per_status in self.counts.values():
            for kind, n in per_status.items():
                totals[kind] += n
        return totals

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": "tombstone.erasure-report",
            "generated_at": self.generated_at,
            "tool_version": __version__,
            "sources": self.sources,
            "signatures": {"checked": self.signatures_checked, "key": self.key},
            "chain": {"state": self.chain.state, "text": self.chain.text,
                      "head": {"sequence": self.chain.head[0], "receipt_hash": self.chain.head[1],
                               "verified": self.chain.head_verified} if self.chain.head else None,
                      "gaps": self.chain.gaps, "problems": self.chain.problems, "notes": self.chain.notes},
            "totals": {"subjects": len(self.subjects), "by_status": self.status_totals(),
                       "by_store": self.counts, "left_out_of_counts": self.left_out},
            "needs_action": [s.subject for s in self.needs_action],
            "failures": [{"source": f.where, "sequence": f.sequence, "subject": f.subject, "reason": f.reason}
                         for f in self.failures],
            "subjects": [_subject_json(s) for s in self.subjects],
        }


def _view_json(view: ReceiptView) -> dict[str, Any]:
    r = view.receipt
    return {
        "source": view.source.where, "sequence": r.sequence, "saga_id": r.saga_id, "finished_at": r.finished_at,
        "receipt_hash": r.receipt_hash, "previous_receipt_hash": r.previous_receipt_hash, "key_id": r.key_id,
        "integrity": {"state": view.integrity.state, "text": view.integrity.text},
        "summary": r.summary, "statement": r.statement,
        "stores": [{"store": s.store, "backends": s.backends, "statuses": [
            {"status": g.status, "count": len(g.artifact_ids), "artifact_ids": g.artifact_ids,
             "shows": g.explanation.shows, "does_not_show": g.explanation.does_not_show,
             "ceiling": g.explanation.ceiling, "action": g.action} for g in s.groups]} for s in view.stores],
        "out_of_scope": [{"what": w, "reason": why} for w, why in r.out_of_scope],
    }


def _subject_json(s: SubjectReport) -> dict[str, Any]:
    return {"subject": s.subject, "outcome": s.outcome, "state": s.state, "actions": s.actions,
            "latest": _view_json(s.latest), "earlier": [_view_json(v) for v in s.earlier]}


# -- reading --------------------------------------------------------------------------------------


def read_files(paths: Sequence[str | Path]) -> list[Source]:
    """Receipts from files and directories (a directory's ``*.json``, not its subdirectories). Unreadable
    input is one ReceiptFormatError or ConfigError line; a file that fails the schema is a ReceiptError."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise ConfigError(f"{path} holds no receipt files (*.json)")
            files += found
        else:
            files.append(path)
    sources = []
    for path in dict.fromkeys(files):
        raw, data = _load(path)
        try:
            sources.append(Source(str(path), Receipt.parse(data), hashlib.sha256(raw).digest()))
        except ReceiptError as exc:
            raise ReceiptError(f"{path}: {exc}") from exc
    return sources


def _load(path: Path) -> tuple[bytes, Any]:
    """A receipt file's bytes and its strict JSON, read once; one ReceiptFormatError line when it cannot be."""
    return read_receipt(path)


def sealed_copies_place(config: Any) -> str:
    """Where the deployment's sealed copies really are: its lineage db (the file, or the PostgreSQL database
    with any password hidden), and the configuration that names it."""
    if config.lineage_dsn:
        from tombstone.lineage.postgres import redact_dsn

        where = f"the lineage db on PostgreSQL, {redact_dsn(config.lineage_dsn)}"
    else:
        where = f"the lineage db {config.lineage_db}"
    return f"the sealed copies in {where} (configured by {config.path})"


def read_deployment(config: Config) -> tuple[list[Source], tuple[int, str] | None]:
    """The sealed copies the deployment's lineage db keeps (opened read-only), and its chain head."""
    from tombstone.report.readonly import ReadOnlyLineage

    with ReadOnlyLineage.open(config) as lineage:
        rows = lineage.receipts()
        head = lineage.chain_head()
    sources = []
    for row in rows:
        where = f"sealed copy #{row['seq']}"
        data = parse_strict(row["body"].decode("utf-8"), where)
        try:
            sources.append(Source(where, Receipt.parse(data), hashlib.sha256(bytes(row["body"])).digest()))
        except ReceiptError as exc:
            raise ReceiptError(f"{where}: {exc}") from exc
    return sources, head


def deployment_head(config: Config) -> tuple[int, str] | None:
    from tombstone.report.readonly import ReadOnlyLineage

    with ReadOnlyLineage.open(config) as lineage:
        return lineage.chain_head()


# -- judging --------------------------------------------------------------------------------------


def check_integrity(receipt: Receipt, key: Ed25519PublicKey | None) -> Integrity:
    if key is None:
        if body_hash(receipt.data) != receipt.receipt_hash:
            return Integrity("failed", "FAILS: its content does not hash to its receipt_hash (altered)")
        return Integrity("not checked", f"{NOT_CHECKED} (no --key or --config given); the hash matches the content")
    try:
        verify(receipt.data, key)
    except ReceiptError as exc:
        return Integrity("failed", f"FAILS: {exc}")
    return Integrity("verified", f"signature verified against {key_id(key)}")


def _store_views(receipt: Receipt) -> list[StoreView]:
    views = []
    for store, entries in receipt.by_store().items():
        groups: dict[tuple[str, str | None], StatusGroup] = {}
        for entry in entries:
            key = (entry.status_text, entry.action)
            if key not in groups:
                logical = entry.probe(Level.LOGICAL)
                groups[key] = StatusGroup(entry.status_text, entry.status.value,
                                          entry.level.value if entry.level else None, explain(entry), entry.action,
                                          logical_passed=bool(logical and logical.ran and logical.passed))
            groups[key].artifact_ids.append(entry.artifact_id)
        ordered = sorted(groups.values(), key=lambda g: (STATUS_ORDER.index(g.kind), g.status))
        views.append(StoreView(store, sorted({e.backend for e in entries}), ordered))
    return views


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _outcome(view: ReceiptView, signatures_checked: bool) -> tuple[str, str, list[str]]:
    r = view.receipt
    if view.integrity.failed:
        return (f"Receipt #{r.sequence} does not verify ({view.integrity.text.removeprefix('FAILS: ')}): none of its"
                " statuses can be relied on.", "failed",
                ["obtain the original receipt from the operator, or erase the subject again"])
    suffix = "" if signatures_checked else f" ({NOT_CHECKED})"
    if not r.artifacts:
        statement = r.statement or "no artifact is recorded for this subject"
        return f"Nothing erased: {statement}.{suffix}", "action", [NOTHING_RECORDED_ACTION]
    entries = r.artifacts
    stores = len({e.store for e in entries})
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.status_text] = counts.get(entry.status_text, 0) + 1
    actions = list(dict.fromkeys(e.action for e in entries if e.action))
    waiting = [e for e in entries if e.action]
    if waiting:
        kinds: dict[str, int] = {}
        for entry in waiting:
            kinds[entry.status.value] = kinds.get(entry.status.value, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: STATUS_ORDER.index(kv[0])))
        verified = sum(1 for e in entries if e.status is StatusKind.VERIFIED)
        return (f"Action needed: {len(waiting)} of {_count(len(entries), 'artifact')} in"
                f" {_count(stores, 'store')} need a person ({what}); {verified} verified.{suffix}", "action", actions)
    if all(e.status is StatusKind.VERIFIED for e in entries):
        levels = sorted({e.level.value for e in entries if e.level}, key=lambda lv: Level(lv).rank)
        at = " or ".join(f"VERIFIED({lv})" for lv in levels)
        return (f"Erased and verified: {'all ' if len(entries) > 1 else ''}{_count(len(entries), 'artifact')} in"
                f" {_count(stores, 'store')}, {at}.{suffix}", "done", [])
    what = ", ".join(f"{n} {k}" for k, n in counts.items())
    return (f"Done as far as the backends allow: {what}; nothing is left for a person to act on.{suffix}",
            "done", [])


def _ranges(numbers: Iterable[int]) -> list[str]:
    out: list[str] = []
    nums = sorted(numbers)
    start = prev = None
    for n in nums + [None]:  # type: ignore[operator]
        if start is not None and (n is None or n != prev + 1):
            out.append(f"#{start}" if start == prev else f"#{start}..#{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return out


def chain_state(views: Sequence[ReceiptView], *, signatures_checked: bool,
                deployment_head: tuple[int, str] | None = None, anchor: str | None = None) -> ChainState:
    """The chain of the receipts that pass their check: gaps named, broken links and conflicts named."""
    count, anchor_hash = 0, ""
    if anchor:
        try:
            count_text, anchor_hash = anchor.split(":", 1)
            count = int(count_text)
        except ValueError as exc:
            raise ConfigError(f"--anchor must be COUNT:HASH as printed by 'tombstone receipt head', got {anchor!r}") from exc
    problems: list[str] = []
    notes: list[str] = []
    failing = sorted({v.receipt.sequence for v in views if v.integrity.failed})
    if failing:
        notes.append(f"left out of the chain because they fail their check: {', '.join(f'#{n}' for n in failing)}")
    by_seq: dict[int, Receipt] = {}
    for view in views:
        if view.integrity.failed:
            continue
        r = view.receipt
        other = by_seq.get(r.sequence)
        if other is not None and other.receipt_hash != r.receipt_hash:
            problems.append(f"two different receipts claim #{r.sequence} ({other.receipt_hash}, {r.receipt_hash})")
            continue
        by_seq[r.sequence] = r
    if not by_seq:
        return ChainState("broken" if problems else "empty", None, False, [], problems, notes)
    seqs = sorted(by_seq)
    missing = [n for n in range(1, seqs[-1] + 1) if n not in by_seq]
    first = by_seq[seqs[0]]
    if seqs[0] == 1 and first.previous_receipt_hash is not None:
        problems.append("receipt #1 names a previous receipt")
    for n in seqs[1:]:
        earlier = by_seq.get(n - 1)
        if earlier is not None and by_seq[n].previous_receipt_hash != earlier.receipt_hash:
            problems.append(f"receipt #{n} names previous {by_seq[n].previous_receipt_hash}, but #{n - 1} hashes to"
                            f" {earlier.receipt_hash}")
    head_seq = seqs[-1]
    head = (head_seq, by_seq[head_seq].receipt_hash)
    if deployment_head is not None:
        d_seq, d_hash = deployment_head
        if d_seq in by_seq and by_seq[d_seq].receipt_hash != d_hash:
            problems.append(f"receipt #{d_seq} hashes to {by_seq[d_seq].receipt_hash}, the deployment's chain head"
                            f" says {d_hash}")
        elif d_seq > head_seq:
            missing += list(range(head_seq + 1, d_seq + 1))
            notes.append(f"the deployment's chain goes on to #{d_seq} ({d_hash})")
        elif d_seq < head_seq:
            problems.append(f"the inputs go to #{head_seq}, past the deployment's chain head #{d_seq}")
        else:
            notes.append("the head matches the deployment's chain head")
    if anchor:
        if count not in by_seq:
            missing += [count] if count > head_seq else []
            notes.append(f"the published head #{count} is not among the inputs")
        elif by_seq[count].receipt_hash != anchor_hash:
            problems.append(f"receipt #{count} hashes to {by_seq[count].receipt_hash}, the published head says"
                            f" {anchor_hash} (rewritten)")
        else:
            notes.append(f"receipt #{count} matches the published head")
    gaps = _ranges(set(missing))
    state = "broken" if problems else ("gaps" if gaps else "complete")
    return ChainState(state, head, signatures_checked, gaps, problems, notes)


def build_report(sources: Sequence[Source], *, key: Ed25519PublicKey | None, key_source: str | None,
                 source_names: Sequence[str], deployment_head: tuple[int, str] | None = None,
                 anchor: str | None = None, now: datetime | None = None) -> Report:
    """Judge every receipt and put the report together. Each source is checked on its own; a source is
    dropped as a duplicate only when its bytes are those of one already kept and both pass their check."""
    views: list[ReceiptView] = []
    kept: set[bytes] = set()
    for source in sources:
        view = ReceiptView(source, check_integrity(source.receipt, key), _store_views(source.receipt))
        if not view.integrity.failed and source.digest is not None:
            if source.digest in kept:  # the same file given twice, or a byte-identical copy of it
                continue
            kept.add(source.digest)
        views.append(view)
    failures = [Failure(v.source.where, v.receipt.sequence, v.receipt.subject,
                        v.integrity.text.removeprefix("FAILS: ")) for v in views if v.integrity.failed]
    by_subject: dict[str, list[ReceiptView]] = {}
    # by position in the chain; at one position a receipt that fails comes before one that passes, so that a
    # tampered copy never stands as the subject's latest receipt in place of the genuine one
    for view in sorted(views, key=lambda v: (v.receipt.sequence, not v.integrity.failed)):
        by_subject.setdefault(view.receipt.subject, []).append(view)
    subjects = []
    for subject, mine in by_subject.items():
        # a backup re-check is a follow-up of an erasure, not the subject's outcome: it is reported with it
        erasures = [v for v in mine if v.receipt.kind != BACKUP_RECHECK_KIND] or mine
        latest = erasures[-1]
        earlier = [v for v in reversed(mine) if v is not latest]
        outcome, state, actions = _outcome(latest, key is not None)
        rechecks: dict[tuple[str, str], dict[str, Any]] = {}  # the last re-check of each copy and store
        for view in mine:
            section = view.receipt.data.get("backup_recheck")
            if not view.integrity.failed and section and section.get("of_receipt") == latest.receipt.data.get("receipt_hash"):
                rechecks[(section["backup"], section["store"])] = section
        for section in rechecks.values():
            outcome += f" Re-check of {section['backup']} ({section['store']}) restored: {section['result']}."
            if section["result"] != "absent" and state == "done":
                state = "action"
            if section["result"] == "found":
                actions = [*actions, f"a restored copy of {section['backup']} still holds erased records: keep it"
                                     " out of service until its rotation overwrites it, or delete it"]
        subjects.append(SubjectReport(subject, latest, earlier, outcome, state, actions))
    rank = {"failed": 0, "action": 1, "done": 2}
    subjects.sort(key=lambda s: (rank[s.state], s.latest.receipt.sequence))
    counts: dict[str, dict[str, int]] = {}
    left_out = 0
    for s in subjects:
        if s.latest.integrity.failed:
            left_out += 1
            continue
        for entry in s.latest.receipt.artifacts:
            per = counts.setdefault(entry.store, {kind: 0 for kind in STATUS_ORDER})
            per[entry.status.value] += 1
    chain = chain_state(views, signatures_checked=key is not None, deployment_head=deployment_head, anchor=anchor)
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return Report(
        generated_at=moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        sources=list(source_names),
        key=f"{key_id(key)} ({key_source})" if key is not None else None,
        subjects=subjects, chain=chain, counts=dict(sorted(counts.items())), left_out=left_out,
        failures=failures,
    )


__all__ = ["ChainState", "Failure", "Integrity", "NOT_CHECKED", "Report", "ReceiptView", "STATUS_ORDER", "Source",
           "StatusGroup", "StoreView", "SubjectReport", "build_report", "chain_state", "check_integrity",
           "read_deployment", "read_files"]
