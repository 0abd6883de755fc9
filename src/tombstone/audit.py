"""The independent verifier: re-probe the stores a receipt names, without the lineage db.

An auditor holds a receipt, the operator's public key and read access to the stores. ``audit`` checks the
receipt's hash, signature and (given the earlier receipts) its chain, then probes every artifact again
using only what the receipt itself carries: the id, the store, and the 32-dim fingerprint. It never opens
the lineage db — it cannot: the block runs under ``forbid_lineage`` — so it has no probe vectors and does
not re-run the fragment probes; it says so, and says which probes it could not run and why.

A store contradicts the receipt when an artifact the receipt calls VERIFIED at some level is found again
at that level or below. Artifacts the receipt did not call VERIFIED cannot be contradicted by finding
them: the receipt claimed nothing about their absence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tombstone.config import CONFIG_NAME, Config, load_config
from tombstone.contract import Adapter, open_adapter
from tombstone.errors import ConfigError, ReceiptError, TombstoneError
from tombstone.keys import PUBLIC_KEY, load_public_key
from tombstone.lineage.guard import forbid_lineage
from tombstone.receipt import load_receipt, verify
from tombstone.receipt.sealing import load_private as load_auditor_private
from tombstone.receipt.model import ArtifactEntry, Receipt
from tombstone.verify import runner
from tombstone.verify.levels import Level, StatusKind

NOT_RUN_FRAGMENTS = "fragment probes not re-run: the verifier has no probe table (by design)"


@dataclass
class AuditRow:
    """One artifact: what the receipt says, what the stores show now, and whether they agree."""

    artifact_id: str
    """The artifact's id."""
    store: str
    """The store it lives in."""
    receipt_says: str
    """The receipt's status, e.g. ``VERIFIED(physical)``."""
    audit_found: str
    """What the re-probe found: ``absent (logical, physical)``, ``present: ...``, ``not checked``."""
    agree: bool
    """False only when the receipt's VERIFIED is contradicted."""
    not_run: list[str] = field(default_factory=list)
    """Probes that could not run, with the reason."""


@dataclass
class AuditReport:
    """Everything the verifier established."""

    receipt: str
    """Path of the audited receipt."""
    integrity: str
    """``ok`` or the first integrity failure (hash, signature, schema)."""
    chain: str
    """``not checked``, ``ok (...)`` or the first broken link."""
    rows: list[AuditRow]
    """One per artifact (empty when integrity failed)."""

    @property
    def agree(self) -> bool:
        return (self.integrity == "ok" and not self.chain.startswith("broken")
                and all(row.agree for row in self.rows))

    def as_json(self) -> dict[str, Any]:
        return {"receipt": self.receipt, "integrity": self.integrity, "chain": self.chain, "agree": self.agree,
                "artifacts": [asdict(r) for r in self.rows], "note": NOT_RUN_FRAGMENTS}


def _find_config(receipt_path: Path, config_path: str | None) -> Config:
    if config_path:
        return load_config(config_path)
    for parent in receipt_path.absolute().parents:
        if (parent / CONFIG_NAME).is_file():
            return load_config(parent / CONFIG_NAME)
    raise ConfigError("no store configuration: pass --config FILE (the auditor needs to know where the stores are)")


def check_chain(receipts: Sequence[dict[str, Any]], anchor: str | None) -> str:
    """Verify links between receipts (already individually verified); name the first broken link."""
    ordered = sorted(receipts, key=lambda r: r["sequence"])
    for earlier, later in zip(ordered, ordered[1:]):
        if later["sequence"] != earlier["sequence"] + 1:
            return f"broken: receipt #{earlier['sequence'] + 1} is missing between #{earlier['sequence']} and #{later['sequence']}"
        if later["previous_receipt_hash"] != earlier["receipt_hash"]:
            return (f"broken: receipt #{later['sequence']} names previous {later['previous_receipt_hash']},"
                    f" but #{earlier['sequence']} hashes to {earlier['receipt_hash']}")
    if ordered and ordered[0]["sequence"] == 1 and ordered[0]["previous_receipt_hash"] is not None:
        return "broken: receipt #1 names a previous receipt"
    if anchor:
        try:
            count_text, head_hash = anchor.split(":", 1)
            count = int(count_text)
        except ValueError as exc:
            raise ConfigError(f"--anchor must be COUNT:HASH as printed by 'tombstone receipt head', got {anchor!r}") from exc
        match = [r for r in ordered if r["sequence"] == count]
        if not match:
            return f"broken: the published head is receipt #{count}, which the given chain does not contain (truncated?)"
        if match[0]["receipt_hash"] != head_hash:
            return f"broken: receipt #{count} hashes to {match[0]['receipt_hash']}, the published head says {head_hash} (rewritten)"
    span = f"#{ordered[0]['sequence']}..#{ordered[-1]['sequence']}" if ordered else "empty"
    return f"ok ({len(ordered)} receipts, {span}{', anchored' if anchor else ''})"


def audit(
    receipt_path: str | Path,
    *,
    config_path: str | None = None,
    key_path: str | None = None,
    previous: Sequence[str] = (),
    anchor: str | None = None,
    auditor_key_path: str | None = None,
) -> AuditReport:
    """Audit one receipt against the stores. Raises TombstoneError only for bad input.

    With ``auditor_key_path`` (an auditor private key the receipt's content patterns were sealed to) the
    probes search for the artifacts' content as well as their ids; without it the audit is by id alone."""
    receipt_path = Path(receipt_path)
    with forbid_lineage("the independent verifier"):
        receipt = load_receipt(receipt_path)  # unreadable input is ReceiptFormatError: bad input, exit 2
        config = _find_config(receipt_path, config_path)
        key = load_public_key(Path(key_path) if key_path else config.keys_dir / PUBLIC_KEY)
        try:
            verify(receipt, key)
        except ReceiptError as exc:
            return AuditReport(str(receipt_path), f"failed: {exc}", "not checked", [])
        chain = "not checked"
        if previous or anchor:
            chain_receipts = [receipt]
            for path in previous:
                earlier = load_receipt(path)
                try:
                    verify(earlier, key)
                except ReceiptError as exc:
                    return AuditReport(str(receipt_path), "ok", f"broken: {path}: {exc}", [])
                chain_receipts.append(earlier)
            chain = check_chain(chain_receipts, anchor)
        auditor_key = load_auditor_private(auditor_key_path) if auditor_key_path else None
        rows = _reprobe(Receipt.parse(receipt), config, auditor_key)
    return AuditReport(str(receipt_path), "ok", chain, rows)


def _patterns_note(entries: Sequence[ArtifactEntry], auditor_key: Any, opened: int) -> str | None:
    """Why the audit searched a store by id alone, when it did."""
    sealed = [e for e in entries if e.sealed_patterns]
    if sealed:
        if auditor_key is None:
            return ("content patterns: id-only audit: the receipt's content patterns are sealed to auditor keys"
                    " (pass --auditor-key to search for content too)")
        if opened < len(sealed):
            return f"content patterns: {opened} of {len(sealed)} opened with this auditor key; the rest searched by id only"
        return None
    if all(e.fingerprint is None for e in entries):
        return ("content patterns: id-only audit: the receipt carries none for these artifacts (none recorded,"
                " or no auditor key was configured to seal them to)")
    return None


def _reprobe(receipt: Receipt, config: Config, auditor_key: Any = None) -> list[AuditRow]:
    rows: list[AuditRow] = []
    # The auditor's pipeline: no lineage (no probe vectors, no duplicate-content attribution), store
    # failures reported as probes that could not run, every level the receipt could have claimed.
    ctx = runner.VerifyContext(record_errors=True)
    for store, entries in receipt.by_store().items():
        adapter: Adapter | None = None
        problem = None
        cfg = config.stores.get(store)
        if cfg is None:
            problem = f"store {store!r} is not in the configuration"
        else:
            try:
                adapter = open_adapter(store, cfg.backend, cfg.options)
            except TombstoneError as exc:
                problem = str(exc)
        patterns = {e.artifact_id: e.open_patterns(auditor_key) if auditor_key is not None else None for e in entries}
        arts = [entry.record(patterns[entry.artifact_id]) for entry in entries]
        not_run: list[str] = [NOT_RUN_FRAGMENTS]
        note = _patterns_note(entries, auditor_key, sum(1 for p in patterns.values() if p))
        if note:
            not_run.append(note)
        verdicts: dict[str, runner.Verdict] = {}
        if adapter is not None:
            try:
                verdicts = runner.run(ctx, adapter, arts)
            finally:
                adapter.close()
            for verdict in verdicts.values():
                not_run += [f"{level.value}: {outcome.why}" for level, outcome in verdict.reported.items()
                            if not outcome.ran]
        else:
            not_run.append(f"all probes: {problem}")
        for entry in entries:
            verdict = verdicts.get(entry.artifact_id)
            rows.append(_compare(entry, verdict.reported if verdict else {}, list(dict.fromkeys(not_run))))
    return rows


def _compare(entry: ArtifactEntry, outcomes: dict[Level, Any], not_run: list[str]) -> AuditRow:
    ran = [(level, outcome) for level, outcome in sorted(outcomes.items(), key=lambda kv: kv[0].rank) if outcome.ran]
    found = [f"{level.value}: {outcome.measurement}" for level, outcome in ran if not outcome.passed]
    absent = [level.value for level, outcome in ran if outcome.passed]
    if found:
        summary = "present: " + "; ".join(found)
    elif absent:
        summary = f"absent ({', '.join(absent)})"
    else:
        summary = "not checked"
    agree = True
    if entry.status is StatusKind.VERIFIED and entry.level is not None:
        claimed = entry.level.rank
        contradicted = [level for level, outcome in ran if not outcome.passed and level.rank <= claimed]
        agree = not contradicted
        unchecked = [lv for lv in Level if lv.rank <= claimed and lv is not Level.LOGICAL
                     and not (lv in outcomes and outcomes[lv].ran)]
        for level in unchecked:
            not_run.append(f"{level.value}: the receipt claims this level but the verifier could not check it")
    return AuditRow(entry.artifact_id, entry.store, entry.status_text, summary, agree, not_run)
