"""The Python API: open a deployment, wrap stores, erase subjects."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tombstone.clock import Clock, system_clock
from tombstone.config import CONFIG_NAME, Config, load_config, write_config
from tombstone.contract import Adapter, open_adapter
from tombstone.errors import (
    ConfigError,
    KeyMaterialError,
    LineageError,
    SagaError,
    TombstoneError,
    UnknownSubjectError,
    shown,
)
from tombstone.keys import LINEAGE_SECRET, LineageSecret, create_keys, load_private_key
from tombstone.lineage.db import LineageDB
from tombstone.receipt.sealing import load_public as load_auditor_key
from tombstone.lineage.postgres import redact_dsn
from tombstone.receipt.files import receipt_file_name
from tombstone.gcpause import collector_paused
from tombstone.capture import deferred, writes
from tombstone.inputs import check_out_path, check_subject
from tombstone.preflight import (
    cause,
    check_deployment,
    check_stores,
    mark_under_way,
    nothing_changed_error,
    stores_of_plan,
    what_of,
)
from tombstone.saga import RetryPolicy, Saga, SagaContext, run_batch
from tombstone.saga.engine import create_deferred


def init_deployment(root: str | Path, stores: dict[str, dict[str, Any]] | None = None, *,
                    lineage_dsn: str | None = None, levels: Any = None) -> Config:
    """Create ``root/tombstone.toml`` (unless present), the keys and the lineage db. Idempotent.

    With ``lineage_dsn`` the lineage db is that PostgreSQL database (for several workers); ``levels`` (level
    names) goes into a new config (the default leaves the semantic level out)."""
    _check_backends(stores)
    root = Path(root)
    config_path = root / CONFIG_NAME
    created = not config_path.exists()
    if created:
        write_config(config_path, stores, lineage_dsn=lineage_dsn, levels=levels)
    try:
        config = load_config(config_path)
        if not (config.keys_dir / LINEAGE_SECRET).exists() and LineageDB.exists(config.lineage_target):
            raise KeyMaterialError(_orphaning(config, "init refuses to create one"))
        create_keys(config.keys_dir)
        LineageDB(config.lineage_target, LineageSecret.load(config.keys_dir), create=True).close()
    except BaseException:
        if created:  # a config naming a lineage db that cannot be opened is not left behind
            config_path.unlink(missing_ok=True)
        raise
    return config


def _check_backends(stores: dict[str, dict[str, Any]] | None) -> None:
    """Refuse a new config's store whose backend no adapter is registered for (a typo gets a suggestion and
    the list of backends), before anything is written."""
    from tombstone.contract import available_backends

    if stores is None:
        return
    if not isinstance(stores, dict):
        raise ConfigError(f"stores must be a dict of store name -> options, not {type(stores).__name__}")
    known = available_backends()
    for name, options in stores.items():
        backend = options.get("backend") if isinstance(options, dict) else None
        if not isinstance(backend, str) or not backend:
            raise ConfigError(f"store {name!r} needs a backend (one of {', '.join(known)})", store=name)
        if backend not in known:
            import difflib

            from tombstone.errors import AdapterNotFoundError

            close = difflib.get_close_matches(backend, known, n=1)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            raise AdapterNotFoundError(f"store {name!r}: no adapter installed for backend {backend!r}{suggestion}"
                                       f" (backends: {', '.join(known)})", store=name)


def _orphaning(config: Config, refusal: str) -> str:
    """What to say when the lineage secret is gone but the lineage db is there: a new secret would key no
    recorded subject, so the only repair is the backup."""
    where = config.lineage_dsn and redact_dsn(config.lineage_dsn) or config.lineage_db
    return (f"no lineage secret at {config.keys_dir / LINEAGE_SECRET}, but the lineage db {where} exists: a new secret"
            f" would orphan every subject it records ({refusal}); restore {config.keys_dir} from backup")


def _open_lineage(config: Config, clock: Clock) -> tuple[LineageSecret, LineageDB]:
    """The lineage secret and the existing lineage db (never a new one: only init creates it)."""
    if not (config.keys_dir / LINEAGE_SECRET).exists():
        if LineageDB.exists(config.lineage_target):
            raise KeyMaterialError(_orphaning(config, "'tombstone init' would not help and refuses"))
        where = config.lineage_dsn and redact_dsn(config.lineage_dsn) or config.lineage_db
        raise LineageError(f"lineage db {where} does not exist (nor the lineage secret"
                           f" {config.keys_dir / LINEAGE_SECRET}): run 'tombstone init' to create them")
    secret = LineageSecret.load(config.keys_dir)
    return secret, LineageDB(config.lineage_target, secret, clock=clock)


CLOSE_WAIT = 120.0
"""Seconds close() waits for queued probe vectors (as long as the process waits at exit); a stuck embedder
does not hold it forever."""


class Tombstone:
    """An open deployment: its config, lineage db and (lazily opened) store adapters."""

    def __init__(self, config: Config, *, clock: Clock = system_clock, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.clock = clock
        self.retry = retry or RetryPolicy()
        """How store errors marked retryable are retried before the artifacts go to the dead-letter list."""
        self.sleep = sleep
        self.secret, self.lineage = _open_lineage(config, clock)
        writes.register(self.lineage, config)  # wrappers given this lineage db write only to configured stores
        self._closed = False
        self._adapters: dict[str, Adapter] = {}
        self.context = SagaContext(lineage=self.lineage, adapter=self.adapter, clock=clock, sleep=sleep,
                                   retry=self.retry, signer=lambda: load_private_key(config.keys_dir),
                                   receipt_path=self.default_receipt_path, levels=config.levels,
                                   has_store=lambda store: store in config.stores,
                                   receipts_dir=config.receipts_dir,
                                   auditors=tuple(load_auditor_key(path) for path in config.auditor_keys),
                                   scan_store=self.scan_store, reopen=self.reopen, backups=config.backups)
        """What sagas of this deployment work through."""

    @classmethod
    def open(cls, config_path: str | Path | None = None, **kwargs: Any) -> "Tombstone":
        return cls(load_config(config_path), **kwargs)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        writes.closed(self.lineage)
        # Probe vectors the wrappers queued land before the lineage db is closed: the deployment on disk is
        # whole (no write left in flight, its journal checkpointed) when close() returns.
        for problem in deferred.flush(CLOSE_WAIT):
            warnings.warn(problem, RuntimeWarning, stacklevel=2)
        for adapter in self._adapters.values():
            adapter.close()
        self._adapters.clear()
        self.lineage.close()

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise LineageError("this Tombstone was closed (close() or the end of its 'with' block): open the"
                               " deployment again with Tombstone.open")

    def __enter__(self) -> "Tombstone":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def adapter(self, store: str) -> Adapter:
        """The adapter serving a configured store (opened once, then reused)."""
        self._check_open()
        if store not in self._adapters:
            if store not in self.config.stores:
                raise ConfigError(f"store {store!r} is not configured in {self.config.path}", store=store)
            cfg = self.config.stores[store]
            adapter = open_adapter(store, cfg.backend, cfg.options)
            adapter.content_key = self.secret.content_key
            self._adapters[store] = adapter
        return self._adapters[store]

    def reopen(self, store: str) -> None:
        """Close a store's adapter; the next use opens it again (after a recipe rewrote the store's files)."""
        adapter = self._adapters.pop(store, None)
        if adapter is not None:
            adapter.close()

    def scan_store(self, store: str) -> Any:
        """``tombstone scan`` of a configured store (``tombstone.scan.ScanReport``); None where its backend has
        no scan. Read-only."""
        self._check_open()
        from tombstone.contract import adapter_class

        if store not in self.config.stores:
            raise ConfigError(f"store {store!r} is not configured in {self.config.path}", store=store)
        cfg = self.config.stores[store]
        try:
            return adapter_class(cfg.backend).scan_deleted(store, dict(cfg.options))
        except NotImplementedError:
            return None

    def preflight(self, stores: Iterable[str] = (), *, out: str | Path | None = None,
                  allow_missing: Sequence[str] = ()) -> None:
        """What every state-changing call checks before it changes anything (``tombstone.preflight``): the
        signing key against the published ``signing.pub``, the receipts directory (and ``out``'s folder)
        writable, the lineage db's schema current, and each of ``stores`` opening read-only. Raises one
        TombstoneError; writes nothing."""
        check_deployment(self.config, self.lineage, out=out)
        for store in check_stores(self.config, stores, allow_missing):
            # a store this process cannot write is opened before any other: its client may refuse it, and
            # that must come before a client that writes when it opens (Chroma's) has opened its store
            try:
                self.adapter(store)
            except TombstoneError as exc:
                if store in allow_missing:
                    continue
                said = nothing_changed_error(exc, store)
                if said is exc:
                    raise
                raise said from exc

    def stores_of(self, subjects: Iterable[str]) -> set[str]:
        """The stores the lineage graphs of ``subjects`` reach (what their erasure will touch)."""
        stores: set[str] = set()
        for subject in subjects:
            try:
                key = self.lineage.subject_key(subject)
            except UnknownSubjectError:
                continue  # the saga says why, before anything is touched
            stores.update(art.store for art, _ in self.lineage.closure(key))
        return stores

    def _reached(self, pairs: Sequence[tuple[str, str]]) -> set[str]:
        """The stores of named (store, id) artifacts and of what was derived from them (what
        :meth:`erase_artifacts` will touch)."""
        stores = {store for store, _ in pairs}
        frontier = [art for store, aid in pairs if (art := self.lineage.artifact(store, aid)) is not None]
        seen = {(a.store, a.artifact_id) for a in frontier}
        while frontier:
            for store, aid, _ in self.lineage.edges_of(frontier.pop())["derived"]:
                if (store, aid) not in seen and (derived := self.lineage.artifact(store, aid)) is not None:
                    seen.add((store, aid))
                    stores.add(store)
                    frontier.append(derived)
        return stores

    def _under_way(self, subjects: list[str], action: Callable[[], Any]) -> Any:
        """``action()``, once a saga is recorded: an error from it is marked with the command that finishes
        the erasure (``tombstone.preflight.mark_under_way``) and raised as it is."""
        try:
            return action()
        except Exception as exc:
            mark_under_way(exc, what_of(subjects), self.config.path)
            raise

    def reclaim_store(self, store: str, *, out: str | Path | None = None, wait: float = 0.0,
                      ) -> tuple[dict[str, Any], Path]:
        """Apply ``store``'s reclaim recipe to the whole store, for what its own client already deleted, with
        a scan before and after; return the receipt (kind ``tombstone.store-reclaim-receipt``, subject
        ``store:NAME``) and its file. An unfinished reclaim of the same store is finished first. The
        preflight comes first: a store that cannot be opened read-only is refused with nothing changed."""
        self._check_open()
        if out:
            check_out_path(out)
        if store in self.config.stores:
            self.preflight([store], out=out)
        saga = Saga.start_store_reclaim(self.context, store, out_path=None if out is None else str(out), wait=wait)
        receipt = self._under_way([f"store:{store}"], saga.run)
        return receipt, saga.receipt_path

    def default_receipt_path(self, subject: str) -> Path:
        """Where a subject's receipt goes unless the caller names a file: ``receipts_dir/<subject>.json`` for a
        subject of letters, digits and ``_.@-`` only, else a readable slug plus a keyed hash of the subject
        (``tombstone.receipt.files``). A saga adds a counter (``<subject>.2.json``) when the name is taken."""
        return self.config.receipts_dir / receipt_file_name(subject, self.secret.file_tag)

    def erase(self, subject: str, *, out: str | Path | None = None,
              artifacts: list[tuple[str, str]] | None = None,
              progress: Callable[[str, str, int, int], None] | None = None,
              allow_missing_stores: Sequence[str] = ()) -> tuple[dict[str, Any], Path]:
        """Erase a subject (or finish its interrupted erasure); return the receipt and where it was written.

        ``artifacts`` limits the erasure to some (store, id) pairs of the subject's lineage graph; anything
        outside it raises ScopeViolationError before anything is touched. A store in scope that is not
        configured, or whose adapter is missing or misconfigured, stops the erasure before it starts
        unless it is named in ``allow_missing_stores`` (then its artifacts end UNVERIFIED(no adapter)).
        """
        self._check_open()
        check_subject(subject)
        if out:
            check_out_path(out)
        stores = {store for store, _ in artifacts} if artifacts is not None else self.stores_of([subject])
        self.preflight(stores, out=out, allow_missing=allow_missing_stores)
        saga = Saga.start(self.context, subject, str(out) if out else None, artifacts=artifacts,
                          allow_missing=allow_missing_stores)
        saga.progress = progress
        receipt = self._under_way([saga.subject], saga.run)
        return receipt, saga.receipt_path

    def erase_artifacts(self, reference: str, artifacts: Sequence[tuple[str, str]], *,
                        statement: str | None = None, why: str = "named", out: str | Path | None = None,
                        wait: float = 30.0, progress: Callable[[str, str, int, int], None] | None = None,
                        ) -> tuple[dict[str, Any], Path]:
        """Erase named (store, id) artifacts, whoever owns them, and what was derived from them; return the
        receipt (kind ``tombstone.source-erasure-receipt``, with ``reference`` as its subject) and its file.

        For erasures that are not a subject's: the records of one source that an index cleanup removes, or
        records deleted by id (``tombstone_adapters.langchain`` writes one per source). ``statement`` says on
        the receipt why these records went. An unfinished erasure of the same reference is finished first.
        Waits at most ``wait`` seconds for another erasure of the same reference."""
        self._check_open()
        if out:
            check_out_path(out)
        pairs = [(str(store), str(aid)) for store, aid in artifacts]
        self.preflight(self._reached(pairs), out=out)
        while True:
            saga = Saga.start_artifacts(self.context, reference, pairs, statement=statement, why=why,
                                        out_path=None if out is None else str(out), wait=wait)
            saga.progress = progress
            receipt = self._under_way([saga.subject], saga.run)
            if not saga.continued:
                return receipt, saga.receipt_path

    def known_subjects(self, subjects: list[str]) -> list[str]:
        """The subjects, stripped and without repeats, each checked against the lineage db: an unknown
        one raises UnknownSubjectError before anything is touched."""
        self._check_open()
        for subject in subjects:
            if not (isinstance(subject, str) and not subject.strip()):
                check_subject(subject)
        subjects = list(dict.fromkeys(s.strip() for s in subjects if s.strip()))
        if not subjects:
            raise UnknownSubjectError("no subjects given")
        for subject in subjects:
            if not self.lineage.has_artifacts(self.lineage.subject_key(subject)):
                raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it",
                                          subject=subject)
        return subjects

    @collector_paused()  # the sagas' plans too: thousands of containers, freed by reference counting
    def erase_many(self, subjects: list[str], *, allow_missing_stores: Sequence[str] = (),
                   progress: Callable[[str, str, int, int], None] | None = None,
                   ) -> list[tuple[dict[str, Any], Path]]:
        """Erase a batch of subjects with one reclaim pass and one probe pass per store; one receipt each.

        A subject the lineage db records nothing for does not stop the batch: it gets a signed receipt with
        no artifacts that says so (stores written outside the wrappers are not covered)."""
        self._check_open()
        if isinstance(subjects, (str, bytes)) or not hasattr(subjects, "__iter__"):
            raise UnknownSubjectError(f"erase_many takes a list of subject references, not {type(subjects).__name__}")
        subjects = list(subjects)
        for subject in subjects:
            if not (isinstance(subject, str) and not subject.strip()):  # blank lines of a list are skipped
                check_subject(subject)
        subjects = list(dict.fromkeys(s.strip() for s in subjects if s.strip()))
        if not subjects:
            raise UnknownSubjectError("no subjects given")
        # each subject's lineage closure read once: for the preflight's stores, then for its saga's plan
        closures = {subject: self.lineage.closure(self.lineage.subject_key(subject)) for subject in subjects}
        self.preflight({art.store for scope in closures.values() for art, _ in scope},
                       allow_missing=allow_missing_stores)
        sagas = []
        try:
            for subject in subjects:
                if closures[subject]:
                    sagas.append(Saga.start(self.context, subject, allow_missing=allow_missing_stores,
                                            defer_create=True, closure=closures[subject]))
                else:
                    sagas.append(Saga.start_unknown(self.context, subject, defer_create=True))
            create_deferred(self.context, sagas)  # the new ones, recorded together
        except BaseException:
            for saga in sagas:
                saga.lock.release()
            raise
        sagas[0].progress = progress
        return self._under_way([s.subject for s in sagas], lambda: run_batch(sagas))

    def retry_dead_letters(self) -> list[tuple[dict[str, Any], Path]]:
        """Erase again every subject with an open dead letter (a new saga each); mark the letters retried."""
        self._check_open()
        letters = self.lineage.dead_letters("open")
        done = []
        if letters:
            self.preflight()  # each subject's erasure checks its own stores
        for subject in dict.fromkeys(letter["subject"] for letter in letters):
            done.append(self.erase(subject))
            self.lineage.mark_dead_letters_retried([l["seq"] for l in letters if l["subject"] == subject])
        return done

    def resume(self, *, progress: Callable[[str, str, int, int], None] | None = None,
               ) -> list[tuple[dict[str, Any], Path]]:
        """Finish every saga that was interrupted. Sagas another process is running are left to it and
        listed in ``self.skipped``; a saga that cannot proceed (a store of its plan does not open, its run
        fails) stays running, is listed in ``self.stuck`` (one line each, saying why) and does not keep the
        others from finishing. The deployment's own preflight (signing key, receipts directory, lineage db)
        comes first: its failure raises before anything changes. ``progress(step, store, done, total)`` is
        called after each step of each saga, as for :meth:`erase`."""
        self._check_open()
        done = []
        self.skipped: list[str] = []
        self.stuck: list[str] = []
        running = self.lineage.sagas("running")
        if running:
            self.preflight()
        for row in running:
            what = f"saga {row['saga_id']} ({what_of([row['subject']])})"
            # stores removed from the config since the saga began end UNVERIFIED(no adapter), as in its run
            plan_stores = stores_of_plan(self.lineage.step_result(row["saga_id"], "plan"))
            try:
                check_stores(self.config, plan_stores, [s for s in plan_stores if s not in self.config.stores],
                             nothing_changed=False)
            except TombstoneError as exc:
                self.stuck.append(f"{what} cannot proceed: {cause(exc)}")
                continue
            try:
                saga = Saga.resume(self.context, row["saga_id"])
            except SagaError as exc:
                self.skipped.append(str(exc))
                continue
            saga.progress = progress
            try:
                done.append((saga.run(), saga.receipt_path))
            except Exception as exc:
                self.stuck.append(f"{what} cannot proceed: {cause(exc)}")
        return done
