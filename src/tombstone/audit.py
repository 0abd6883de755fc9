"""The independent verifier: re-probe the stores a receipt names, without the lineage db.

An auditor holds a receipt, the operator's public key and read access to the stores. ``audit`` checks the
receipt's hash, signature and (given the earlier receipts) its chain, then probes every artifact again
using only what the receipt itself carries: the id, the store, and the 32-dim fingerprint. It never opens
the lineage db — it cannot: the block runs under ``forbid_lineage`` — so it has no probe vectors and does
not re-run the fragment probes; it says so, and says which probes it could not run and why.

A store contradicts the receipt when an artifact the receipt calls VERIFIED at some level is found again
at that level or below. Artifacts the receipt did not call VERIFIED cannot be contradicted by finding
them: the receipt claimed nothing about their absence. A VERIFIED claim the verifier could not re-check
at every level up to the claimed one (a store it could not open, a probe that could not run) is
``unchecked``, never ``agree``.

What the verifier trusts is explicit. The key: ``--key`` (the operator's published public key), else the
``keys_dir`` of the configuration named by ``--config`` or ``$TOMBSTONE_CONFIG`` — never a
``tombstone.toml`` found near the receipt. The stores: that configuration, opened read-only
(:meth:`~tombstone.contract.Adapter.open_read_only`: nothing in a store is changed, nothing it holds is
run), and a store whose adapter would send a credential of the auditor's to a host the configuration names
(:meth:`~tombstone.contract.Adapter.credential_destination`) is left unchecked unless ``trust_config``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tombstone.config import ENV_VAR, Config, load_config
from tombstone.contract import Adapter, adapter_class
from tombstone.errors import ConfigError, KeyMaterialError, ReceiptError, TombstoneError
from tombstone.keys import (LINEAGE_SECRET, PUBLIC_KEY, SIGNING_KEY, key_id, load_private_key, load_public_key, public_pem,
                            read_key_file)
from tombstone.lineage.guard import forbid_lineage
from tombstone.receipt import load_receipt, verify
from tombstone.receipt.signing import STORE_RECLAIM_KIND
from tombstone.receipt.sealing import load_private as load_auditor_private
from tombstone.receipt.model import ArtifactEntry, Receipt
from tombstone.verify import runner
from tombstone.verify.levels import Level, StatusKind

NOT_RUN_FRAGMENTS = "fragment probes not re-run: the verifier has no probe table (by design)"
AGREE, CONTRADICTED, UNCHECKED = "agree", "contradicted", "unchecked"
"""An audit row's verdict: the receipt's claim was re-checked and holds; the stores contradict it; or it
could not be re-checked at every level it claims (nothing contradicts it, nothing confirms it)."""


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
    verdict: str
    """``agree``, ``contradicted`` or ``unchecked`` (a VERIFIED claim not re-checked at every level it claims)."""
    not_run: list[str] = field(default_factory=list)
    """Probes that could not run, with the reason."""

    @property
    def agree(self) -> bool:
        """The claim was re-checked and holds (a row with no VERIFIED claim has nothing to contradict)."""
        return self.verdict == AGREE

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "agree": self.agree}


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
    key: str = ""
    """The key the receipt was checked against and where it came from."""

    @property
    def verdict(self) -> str:
        """``contradicted`` on any integrity or chain failure or contradicted row, else ``unchecked`` if any
        row is, else ``agree``."""
        if self.integrity != "ok" or self.chain.startswith("broken"):
            return CONTRADICTED
        verdicts = {row.verdict for row in self.rows}
        return CONTRADICTED if CONTRADICTED in verdicts else UNCHECKED if UNCHECKED in verdicts else AGREE

    @property
    def agree(self) -> bool:
        return self.verdict == AGREE

    def as_json(self) -> dict[str, Any]:
        return {"receipt": self.receipt, "key": self.key, "integrity": self.integrity, "chain": self.chain,
                "verdict": self.verdict, "agree": self.agree, "artifacts": [r.as_json() for r in self.rows],
                "note": NOT_RUN_FRAGMENTS}


@dataclass(frozen=True)
class TrustedKey:
    """The public key receipts are checked against, and where it came from."""

    key: Any
    """The Ed25519 public key."""
    source: str
    """``--key PATH`` or the configuration it was read from."""

    def describe(self) -> str:
        return f"{key_id(self.key)} from {self.source}"


NO_KEY = ("no trusted public key: pass --key FILE, the operator's published public key (keys/signing.pub),"
          " or --config FILE naming the deployment whose key you trust")


def explicit_config_path(config_path: str | None) -> str | None:
    """The configuration the caller named: ``--config``, else ``$TOMBSTONE_CONFIG``; None when neither.
    Never one found by looking around the receipt or the working folder."""
    return config_path or os.environ.get(ENV_VAR) or None


def trusted_key(key_path: str | None, config: Config | None) -> TrustedKey:
    """The key given with ``--key`` (a public key; a private key is refused), else the key of the named
    configuration's deployment (:func:`deployment_key`). KeyMaterialError when there is neither."""
    if key_path:
        try:
            data = read_key_file(key_path, "public key")
        except OSError as exc:
            raise KeyMaterialError(f"cannot read public key {key_path}: {exc.strerror or exc}") from exc
        if b"PRIVATE KEY" in data:
            raise KeyMaterialError(f"--key {key_path} is a private key: pass the operator's public key"
                                   " (keys/signing.pub); a signing key never leaves the operator")
        return TrustedKey(load_public_key(Path(key_path)), f"--key {key_path}")
    if config is None:
        raise KeyMaterialError(NO_KEY)
    return deployment_key(config)


def deployment_key(config: Config) -> TrustedKey:
    """The public key of the deployment a configuration belongs to, when it is one.

    A configuration names an operator's own deployment when ``tombstone init`` made it: its lineage db
    exists beside the lineage secret, and its ``keys_dir`` holds the signing key whose public half is
    ``signing.pub``. A stores-only configuration handed over in a bundle has none of these; a
    ``keys/`` folder lying beside it is exactly what a forger would put there, so it is never used and the
    caller must pass ``--key``. (The lineage db is not opened: the verifier may not open one.)"""
    keys_dir = config.keys_dir
    public_path = keys_dir / PUBLIC_KEY
    missing = [str(path) for path in (keys_dir / LINEAGE_SECRET, keys_dir / SIGNING_KEY, public_path)
               if not path.is_file()]
    if not missing and not _looks_like_lineage_file(config):
        missing.append(f"lineage db {config.lineage_db}" if not config.lineage_dsn
                       else "lineage db file (its lineage db is on PostgreSQL, which the verifier does not connect to)")
    if missing:
        raise KeyMaterialError(
            f"{NO_KEY}: {config.path} is not a deployment made by 'tombstone init' (no {missing[0]}), so no key"
            " beside it is trusted")
    public = load_public_key(public_path)
    private = load_private_key(keys_dir)
    if public_pem(private.public_key()) != public_pem(public):
        raise KeyMaterialError(f"{NO_KEY}: {public_path} is not the public half of {keys_dir / SIGNING_KEY}"
                               f" in {config.path}, so neither is trusted")
    return TrustedKey(public, f"the deployment {config.path} (its {public_path}, the public half of the"
                              " signing key beside its lineage db)")


def _looks_like_lineage_file(config: Config) -> bool:
    """Whether the configuration's lineage db is a SQLite file that is there (read as bytes: the verifier opens
    no lineage db and connects to no server a configuration names)."""
    if config.lineage_dsn:
        return False
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(config.lineage_db, flags)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 16, 0) == b"SQLite format 3\x00"
    finally:
        os.close(fd)


def _store_config(config_path: str | None) -> Config:
    explicit = explicit_config_path(config_path)
    if not explicit:
        raise ConfigError("no store configuration: pass --config FILE, a stores-only tombstone.toml saying where"
                          " the stores are (the auditor needs no lineage db and no keys)")
    return load_config(explicit)


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
    trust_config: bool = False,
) -> AuditReport:
    """Audit one receipt against the stores. Raises TombstoneError only for bad input.

    With ``auditor_key_path`` (an auditor private key the receipt's content patterns were sealed to) the
    probes search for the artifacts' content as well as their ids; without it the audit is by id alone.
    The configuration comes from ``config_path`` or ``$TOMBSTONE_CONFIG``, the key from ``key_path`` or that
    configuration's ``keys_dir``; stores whose probes would send a credential of the auditor's to a host the
    configuration names are probed only with ``trust_config``."""
    receipt_path = Path(receipt_path)
    with forbid_lineage("the independent verifier"):
        receipt = load_receipt(receipt_path)  # unreadable input is ReceiptFormatError: bad input, exit 2
        config = _store_config(config_path)
        trusted = trusted_key(key_path, config)
        key = trusted.key
        try:
            verify(receipt, key)
        except ReceiptError as exc:
            return AuditReport(str(receipt_path), f"failed: {exc}", "not checked", [], trusted.describe())
        chain = "not checked"
        if previous or anchor:
            chain_receipts = [receipt]
            for path in previous:
                earlier = load_receipt(path)
                try:
                    verify(earlier, key)
                except ReceiptError as exc:
                    return AuditReport(str(receipt_path), "ok", f"broken: {path}: {exc}", [], trusted.describe())
                chain_receipts.append(earlier)
            chain = check_chain(chain_receipts, anchor)
        auditor_key = load_auditor_private(auditor_key_path) if auditor_key_path else None
        rows = _reprobe(Receipt.parse(receipt), config, auditor_key, trust_config=trust_config)
        rows += _rescan(receipt, config, trust_config=trust_config)
    return AuditReport(str(receipt_path), "ok", chain, rows, trusted.describe())


def open_for_audit(store: str, backend: str, options: dict[str, Any], *, trust_config: bool) -> Adapter:
    """The store's adapter, opened read-only; TombstoneError (the reason it stays unchecked) when it has no
    read-only mode or would send a credential to a host the configuration names and that is not trusted."""
    cls = adapter_class(backend)
    if not trust_config:
        destination = cls.credential_destination(store, options)
        if destination:
            raise ConfigError(f"not probed: {not_trusted(destination)}", store=store)
    return cls.open_read_only(store, options)


def not_trusted(destination: str) -> str:
    return (f"that would send {destination}, a host named by the configuration you were handed; pass"
            " --trust-config if you trust it")


def backend_mismatch(store: str, claimed: str, configured: str) -> str:
    return (f"the receipt says store {store!r} is a {claimed} store, the configuration says {configured}:"
            " not probed with the configuration's backend")


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


def _reprobe(receipt: Receipt, config: Config, auditor_key: Any = None, *, trust_config: bool = False) -> list[AuditRow]:
    rows: list[AuditRow] = []
    # The auditor's pipeline: no lineage (no probe vectors, no duplicate-content attribution), store
    # failures reported as probes that could not run, every level the receipt could have claimed.
    ctx = runner.VerifyContext(record_errors=True)
    for store, entries in receipt.by_store().items():
        adapter: Adapter | None = None
        problem = None
        cfg = config.stores.get(store)
        claimed = {entry.backend for entry in entries} - {None, ""}
        if cfg is None:
            problem = f"store {store!r} is not in the configuration"
        elif claimed and claimed != {cfg.backend}:
            problem = backend_mismatch(store, "/".join(sorted(claimed)), cfg.backend)
        else:
            try:
                adapter = open_for_audit(store, cfg.backend, cfg.options, trust_config=trust_config)
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


def _rescan(receipt: dict[str, Any], config: Config, *, trust_config: bool = False) -> list[AuditRow]:
    """A store reclaim receipt's claim, re-checked: the store scanned again (read-only, ``tombstone scan``).
    A receipt that said nothing deleted was recoverable is contradicted by a scan that finds some now."""
    section = receipt.get("store_reclaim")
    if receipt.get("kind") != STORE_RECLAIM_KIND or not isinstance(section, dict):
        return []
    store, after = str(section.get("store")), section.get("after")
    if after is None:
        says = "no scan for this backend: nothing counted"
    elif after.get("recoverable"):
        says = f"recoverable after the reclaim: {after.get('count')} record(s), {after.get('bytes')} byte(s)"
    else:
        says = "nothing deleted recoverable after the reclaim"
    row = lambda found, verdict, not_run=(): AuditRow("(the whole store)", store, says, found, verdict,  # noqa: E731
                                                      list(not_run))
    cfg = config.stores.get(store)
    if cfg is None:
        return [row("not checked", UNCHECKED, [f"scan: store {store!r} is not in the configuration"])]
    claimed = str(section.get("backend"))
    if cfg.backend != claimed:
        return [row("not checked", UNCHECKED, [f"scan: {backend_mismatch(store, claimed, cfg.backend)}"])]
    if not trust_config:
        destination = adapter_class(cfg.backend).credential_destination(store, cfg.options)
        if destination:
            return [row("not checked", UNCHECKED, [f"scan: {not_trusted(destination)}"])]
    try:
        report = adapter_class(cfg.backend).scan_deleted(store, dict(cfg.options))
    except NotImplementedError as exc:
        return [row("not checked", UNCHECKED, [f"scan: {exc}"])]
    except TombstoneError as exc:
        return [row("not checked", UNCHECKED, [f"scan: {exc}"])]
    found = (f"recoverable now: {report.count} record(s), {report.bytes} byte(s)" if report.recoverable
             else "nothing deleted recoverable now")
    if after is None or after.get("recoverable"):
        return [row(found, AGREE)]  # the receipt claimed no clean store: nothing to contradict
    return [row(found, CONTRADICTED if report.recoverable else AGREE)]


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
    # A receipt that claims no absence has nothing the stores could contradict; but if it reports probes
    # that ran and the verifier could run none, that row was not re-checked either.
    verdict = UNCHECKED if not ran and any(probe.ran for probe in entry.probes.values()) else AGREE
    if entry.status is StatusKind.VERIFIED and entry.level is not None:
        claimed = entry.level.rank
        contradicted = [level for level, outcome in ran if not outcome.passed and level.rank <= claimed]
        unchecked = [lv for lv in sorted(Level, key=lambda lv: lv.rank) if lv.rank <= claimed
                     and not (lv in outcomes and outcomes[lv].ran)]
        for level in unchecked:
            not_run.append(f"{level.value}: the receipt claims this level but the verifier could not check it")
        verdict = CONTRADICTED if contradicted else UNCHECKED if unchecked else AGREE
    return AuditRow(entry.artifact_id, entry.store, entry.status_text, summary, verdict, not_run)
