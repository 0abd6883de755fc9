"""The ``tombstone`` command: a thin layer over the Python API.

Exit codes (the README has the table): 0 done, nothing left to act on; 1 a check failed (a receipt that
does not verify, stores that contradict it, a gate that fails); 2 bad input or an operation that could not
run; 3 the receipt was written but holds something a person must act on (RESIDUAL, NEEDS_HUMAN, an
actionable UNVERIFIED); 4 an audit found no contradiction but could not re-check every claim; 130
interrupted (``tombstone resume`` finishes the saga). Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tombstone.display import printable
from tombstone.errors import ConfigError, ReceiptError, SagaError, TombstoneError, shown

if TYPE_CHECKING:
    from tombstone.receipt.model import ArtifactEntry, Receipt


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ACTION_NEEDED = 3
EXIT_UNCHECKED = 4
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReceiptError as exc:
            echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_FAILED)
        except TombstoneError as exc:
            echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            echo("interrupted; 'tombstone resume' finishes any erasure that was under way", err=True)
            sys.exit(EXIT_INTERRUPTED)


def echo(message: Any = "", err: bool = False, **kwargs: Any) -> None:
    """``click.echo`` for everything the CLI prints: control and bidirectional characters escaped, since
    subjects, ids and messages can come from anyone (:func:`tombstone.display.printable`)."""
    click.echo(printable(message) if message is not None else message, err=err, **kwargs)


def _one_line(exc: BaseException) -> str:
    """An error as one line (a server's message can span several)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tombstone-rag", prog_name="tombstone")
def main() -> None:
    """Erase a data subject from a RAG deployment and prove, level by level, how far the erasure went."""


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), default=None,
    help="Path to tombstone.toml (default: $TOMBSTONE_CONFIG, then ./tombstone.toml).",
)


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
@click.option("--subjects", type=int, default=5, show_default=True, help="Number of subjects to create.")
@click.option("--erase", "erase_subject", default=None,
              help="Subject to erase (default: the first one); 'none' builds without erasing.")
@click.option("--force", is_flag=True, help="Rebuild a directory a previous demo created.")
@click.option("--via", default="wrappers", show_default=True, metavar="wrappers|langchain",
              help="Write through the wrappers, or as a LangChain app: chunks through TombstoneVectorStore,"
                   " cached answers from a RAG chain with the caches as LangChain's LLM cache.")
def demo(workdir: str, backends: str | None, subjects: int, erase_subject: str | None, force: bool, via: str) -> None:
    """Build a small deployment through the wrappers, erase one subject, print the receipt summary."""
    from tombstone.api import Tombstone
    from tombstone.demo import build_demo, default_backends, stop_services

    names = [b.strip() for b in backends.split(",") if b.strip()] if backends is not None else default_backends()
    try:
        refs = build_demo(workdir, names, subjects, force=force, via=via)
        root = Path(workdir)
        echo(f"built {len(refs)} subjects in {root} ({', '.join(names)})"
                   + (f" through {via}" if via != "wrappers" else ""))
        if erase_subject == "none":
            echo("nothing erased (--erase none)")
            return
        subject = erase_subject or refs[0]
        with Tombstone.open(root / "tombstone.toml") as tomb:
            receipt, path = tomb.erase(subject, progress=_progress())
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
        echo(f"verify:  tombstone receipt verify {path} --key {root / 'keys' / 'signing.pub'}")
    finally:
        for line in stop_services():
            echo(line)


@main.command()
@click.argument("subject", required=False)
@CONFIG_OPTION
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the receipt (default: receipts_dir/SUBJECT.json, or a new name when that is"
                   " taken); refuses a file that holds a sealed receipt, or another erasure's.")
@click.option("--subjects-file", type=click.Path(dir_okay=False), default=None,
              help="Erase every subject listed in FILE (one per line) in one batch: one reclaim and one probe"
                   " pass per store, one receipt per subject.")
@click.option("--allow-missing-store", "allow_missing", multiple=True, metavar="NAME",
              help="Erase even though store NAME (known to the lineage db) was removed from the config or has no"
                   " adapter: its artifacts end UNVERIFIED(no adapter). Repeat for several.")
@click.option("--queue", "queue", is_flag=True,
              help="Do not erase here: create the sagas and queue them for 'tombstone worker' processes"
                   " (needs lineage_dsn).")
def erase(subject: str | None, config_path: str | None, out: str | None, subjects_file: str | None,
          allow_missing: tuple[str, ...], queue: bool) -> None:
    """Erase SUBJECT everywhere the lineage db knows of, then write its signed receipt."""
    from tombstone.api import Tombstone

    if bool(subject) == bool(subjects_file):
        raise ConfigError("give either SUBJECT or --subjects-file FILE")
    if out and (subjects_file or queue):
        raise ConfigError("--out writes one receipt here; a batch or a queue writes one per subject under receipts_dir")
    subjects = [subject] if subject else []
    if subjects_file:
        lines = _read_subjects_file(subjects_file)
        subjects = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if queue:
        from tombstone.workers import enqueue

        with Tombstone.open(config_path) as tomb:
            queued = enqueue(tomb, subjects)
        for item in queued:
            echo(f"{item.subject}: saga {item.saga_id} {'queued' if item.queued else 'already queued'}")
        echo(f"{_count(sum(q.queued for q in queued), 'saga')} queued for 'tombstone worker'")
        return
    if subjects_file:
        with Tombstone.open(config_path) as tomb:
            done = tomb.erase_many(subjects, allow_missing_stores=allow_missing, progress=_progress())
        for receipt, path in done:
            totals = ", ".join(f"{k} {v}" for k, v in receipt["summary"].items() if v)
            echo(f"{receipt['subject']}: {totals or 'no artifacts'} -> {path}")
        echo(f"{_count(len(done), 'subject')} erased in one batch")
        _exit_for(done)
        return
    with Tombstone.open(config_path) as tomb:
        receipt, path = tomb.erase(subject, out=out, progress=_progress(), allow_missing_stores=allow_missing)
    echo(format_receipt(receipt))
    echo(f"receipt: {path}")
    _exit_for([(receipt, path)])


def _read_subjects_file(path: str) -> list[str]:
    """Lines of a subjects file: UTF-8 (with or without a BOM) or UTF-16 with a BOM; anything else is one line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    try:
        return data.decode(encoding).splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 or UTF-16 text (byte {exc.start}); save it as UTF-8, one subject"
                          " per line") from exc


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def store_lines(receipt: "dict[str, Any] | Receipt") -> list[str]:
    """One line per store: its statuses, and what a person must do next when something is left."""
    from tombstone.receipt.model import Receipt

    if not isinstance(receipt, Receipt):
        receipt = Receipt.parse(receipt)
    lines = []
    for store, entries in receipt.by_store().items():
        counts: dict[str, int] = {}
        for entry in entries:
            key = entry.status.value + (f"({entry.level.value})" if entry.level else "")
            counts[key] = counts.get(key, 0) + 1
        line = f"{store}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
        actions = list(dict.fromkeys(entry.action for entry in entries if entry.action))
        if actions:
            line += " -- next: " + "; ".join(actions)
        lines.append(line)
    return lines


def _exit_for(done: list[tuple[dict[str, Any], Any]]) -> None:
    """Exit 3 when any receipt holds something a person must act on, after saying what, per store."""
    from tombstone.receipt.model import Receipt

    waiting = [(Receipt.parse(data), path) for data, path in done]
    waiting = [(r, p) for r, p in waiting
               if r.needs_action or r.store_left_recoverable or (not r.artifacts and r.store_reclaim is None)]
    if not waiting:
        return
    for receipt, path in waiting:
        echo(f"ACTION NEEDED for {receipt.subject} ({path}):")
        if receipt.store_left_recoverable:
            echo("  the scan after the store reclaim still finds deleted data -- next: run 'tombstone scan"
                       " --show-ids' on the store and see verification-levels.md for what its recipe leaves")
        elif not receipt.artifacts and receipt.store_reclaim is None:
            echo("  no artifact is recorded for this subject -- next: check the subject reference"
                       " (stores written outside the wrappers are not covered)")
        for line in store_lines(receipt):
            if " -- next: " in line:
                echo(f"  {line}")
    sys.exit(EXIT_ACTION_NEEDED)


def _progress():
    """A progress display for long sagas: a bar on a terminal, plain lines on stderr otherwise."""
    if sys.stderr.isatty():
        state: dict[str, Any] = {}

        def bar(step: str, store: str, done: int, total: int) -> None:
            if "bar" not in state:
                state["bar"] = click.progressbar(length=total, label="erasing", file=sys.stderr)
                state["bar"].__enter__()
            state["bar"].label = f"{step} {store}".strip()
            state["bar"].update(done - state.get("done", 0))
            state["done"] = done
            if done >= total:
                state["bar"].__exit__(None, None, None)

        return bar

    def lines(step: str, store: str, done: int, total: int) -> None:
        echo(f"[{done}/{total}] {step} {store}".rstrip(), err=True)

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
def resume(config_path: str | None) -> None:
    """Finish every erasure that was interrupted, from its journal."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        finished = tomb.resume()
        skipped = tomb.skipped
    for line in skipped:
        echo(f"skipped: {line}")
    if not finished and not skipped:
        echo("no interrupted erasure to resume")
    for receipt, path in finished:
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
    _exit_for(finished)


@main.command()
@click.argument("subject", required=False)
@CONFIG_OPTION
def status(subject: str | None, config_path: str | None) -> None:
    """Show erasures (sagas) and their state, or one SUBJECT's artifacts."""
    from tombstone.api import Tombstone
    from tombstone.errors import UnknownSubjectError

    with Tombstone.open(config_path) as tomb:
        if subject:
            arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(subject))
            if not arts:
                raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it")
            rows = [(a.store, a.backend, a.kind, a.artifact_id, a.state) for a in arts]
            echo(_table(("store", "backend", "kind", "artifact", "state"), rows))
            return
        sagas = tomb.lineage.sagas()
        counts = tomb.lineage.count_artifacts()
        echo("artifacts: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
        if tomb.config.lineage_dsn:
            from tombstone.workers import queue_counts

            jobs = queue_counts(tomb.config.lineage_dsn)
            echo("queue:     " + (", ".join(f"{k} {v}" for k, v in sorted(jobs.items())) or "empty"))
        if not sagas:
            echo("no erasure has been run")
            return
        rows = [(s["saga_id"], s["subject"], s["state"], s["started_at"], s["finished_at"] or "-") for s in sagas]
        echo(_table(("saga", "subject", "state", "started", "finished"), rows))


@main.command()
@click.argument("subject")
@CONFIG_OPTION
def where(subject: str, config_path: str | None) -> None:
    """Show SUBJECT's lineage graph: every artifact, its store, what it was derived from, and its state."""
    from tombstone.api import Tombstone
    from tombstone.errors import UnknownSubjectError

    with Tombstone.open(config_path) as tomb:
        scope = tomb.lineage.closure(tomb.lineage.subject_key(subject))
        if not scope:
            raise UnknownSubjectError(f"unknown subject {shown(subject)}: the lineage db records no artifact for it")
        blocks = []
        for art, why in scope:
            edges = tomb.lineage.edges_of(art)
            derived = ", ".join(f"{s}/{i}" for s, i, _ in edges["derived"]) or "-"
            gap = tomb.lineage.lineage_gap(art)
            third = tomb.lineage.third_party(art.artifact_id)
            lines = [f"{art.store}/{art.artifact_id}", f"  {art.kind} in a {art.backend} store; in scope: {why}",
                     f"  derived into: {derived}", f"  state: {art.state}"]
            if gap:
                lines.append(f"  lineage gap: {gap}")
            if third:
                lines.append(f"  sent to a third party: {third['recipient']}")
            blocks.append("\n".join(_wrap(line) for line in lines))
    echo("\n\n".join(blocks))
    echo("\nstates:\n" + "\n".join(f"  {k} = {v}" for k, v in STATES.items()))


STATES = {
    "live": "not erased",
    "suppressed": "hidden from every query path, bytes still stored",
    "reclaimed": "the store's reclaim recipe ran, not yet checked",
    "decided": "checked; its receipt gives the status",
}
"""What each artifact state in the lineage db means, for ``tombstone where``."""


def _wrap(line: str, width: int = 100) -> str:
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.fill(line, width=width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)


@main.group()
def dlq() -> None:
    """The dead-letter list: store operations that failed past their retry budget."""


@dlq.command("list")
@CONFIG_OPTION
@click.option("--all", "show_all", is_flag=True, help="Include dead letters already retried.")
def dlq_list(config_path: str | None, show_all: bool) -> None:
    """List dead letters: which subject, store and step failed, with the last error."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        letters = tomb.lineage.dead_letters(None if show_all else "open")
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

    with Tombstone.open(config_path) as tomb:
        done = tomb.retry_dead_letters()
    if not done:
        echo("no dead letters to retry")
    for receipt, path in done:
        echo(format_receipt(receipt))
        echo(f"receipt: {path}")
    _exit_for(done)


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


@receipt.command("verify")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="The operator's published Ed25519 public key (PEM) to trust. Without it: the key of the"
                   " deployment named by --config or $TOMBSTONE_CONFIG.")
@CONFIG_OPTION
def receipt_verify(file: str, key: str | None, config_path: str | None) -> None:
    """Check a receipt's schema, hash and signature against a key you trust; exit 1 on any alteration."""
    from tombstone.receipt import load_receipt, verify

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
def receipt_list(config_path: str | None, subject: str | None) -> None:
    """List the sealed receipts the lineage db keeps: sequence, subject, saga, finished, summary, hash."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        rows = tomb.lineage.receipts(tomb.lineage.subject_key(subject) if subject is not None else None)
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
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit_cmd(file: str, config_path: str | None, key: str | None, trust_config: bool, previous: tuple[str, ...],
              anchor: str | None, auditor_key: str | None, as_json: bool) -> None:
    """Independently re-probe, read-only, the stores a receipt names, without the lineage db; exit 1 on any
    contradiction, 4 when a claim could not be re-checked."""
    from tombstone.audit import AGREE, CONTRADICTED, NOT_RUN_FRAGMENTS, UNCHECKED, audit

    report = audit(file, config_path=config_path, key_path=key, previous=previous, anchor=anchor,
                   auditor_key_path=auditor_key, trust_config=trust_config)
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
def check_cmd(backend: str, config_path: str | None, junit: str | None, canaries: int) -> None:
    """CI gate: write canary subjects, erase them, exit 1 unless each ends at the backend's highest level."""
    from tombstone.check import run_check

    if canaries < 1:
        raise ConfigError("--canaries must be at least 1")
    result = run_check(backend, config_path=config_path, canaries=canaries)
    for note in result.notes:
        echo(f"note: {note}")
    rows = [(r.subject, r.artifact_id, r.status, "pass" if r.passed else "FAIL") for r in result.rows]
    if rows:
        echo(_table(("canary", "artifact", "status", "result"), rows))
    for failure in result.failures:
        echo(f"FAIL: {failure}")
    if junit:
        Path(junit).parent.mkdir(parents=True, exist_ok=True)
        Path(junit).write_text(result.junit(), encoding="utf-8")
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

    with Tombstone.open(config_path) as tomb:
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
    graph links); holds each store's lock while it runs."""
    from tombstone.api import Tombstone

    with Tombstone.open(config_path) as tomb:
        names = list(stores) or sorted(tomb.config.stores)
        for name in names:
            adapter = tomb.adapter(name)
            with adapter.store_lock():
                evidence = adapter.compact()
            detail = ", ".join(f"{k} {v}" for k, v in evidence.items() if k not in ("mechanism", "why"))
            echo(f"{name} ({adapter.backend}): {evidence.get('why') or evidence['mechanism']}"
                       + (f" ({detail})" if detail else ""))


@main.command("auditor-key")
@click.argument("directory", type=click.Path(file_okay=False))
def auditor_key_cmd(directory: str) -> None:
    """Create an auditor key pair: keep auditor.key, give auditor.pub to the operator for auditor_keys."""
    from tombstone.receipt.sealing import create_auditor_keys, key_id, load_public

    private, public = create_auditor_keys(directory)
    echo(f"private key: {private}  (keep it: it opens the content patterns sealed to you)")
    echo(f"public key:  {public}  ({key_id(load_public(public))}; the operator lists it under auditor_keys)")


@main.command("backends")
def backends_cmd() -> None:
    """List the installed backend adapters: capabilities, levels, demo support, or how to install them."""
    from tombstone.contract import install_hint, loadable_adapters

    rows = []
    for name, cls in loadable_adapters().items():
        if not isinstance(cls, type):
            rows.append((name, "not importable", "-", "-", install_hint(name) or str(cls)))
            continue
        caps = ",".join(sorted(c.value for c in cls.capabilities)) or "-"
        levels = ",".join(lv.value for lv in cls.levels)
        demo = cls.demo_role + (" (default)" if cls.demo_default else "") if cls.demo_role else "-"
        rows.append((name, caps, levels, demo, ""))
    echo(_table(("backend", "capabilities", "levels", "demo / check", "install"), rows))


@receipt.command("schema")
def receipt_schema_cmd() -> None:
    """Print the published JSON Schema of the receipt format."""
    from tombstone.receipt import receipt_schema

    echo(json.dumps(receipt_schema(), indent=2))


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


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _probe_note(entry: "ArtifactEntry") -> str:
    """For an UNVERIFIED artifact, the probes that did run and pass (a managed store's logical probe)."""
    from tombstone.verify.levels import StatusKind

    if entry.status is not StatusKind.UNVERIFIED:
        return ""
    passed = [level.value for level, probe in entry.probes.items() if probe.ran and probe.passed]
    return f" [{', '.join(passed)} probe passed]" if passed else ""


def format_receipt(receipt: "dict[str, Any] | Receipt") -> str:
    """The receipt summary: header, one row per artifact, totals."""
    from tombstone.receipt.model import Receipt

    if not isinstance(receipt, Receipt):
        receipt = Receipt.parse(receipt)
    rows = [(a.store, a.backend, a.artifact_id, a.status_text + _probe_note(a)) for a in receipt.artifacts]
    head = [
        f"subject {receipt.subject}  saga {receipt.saga_id}  receipt #{receipt.sequence}",
        f"started {receipt.started_at}  finished {receipt.finished_at}",
    ]
    totals = ", ".join(f"{k} {v}" for k, v in receipt.summary.items() if v)
    out_of_scope = ", ".join(what for what, _ in receipt.out_of_scope)
    rows_by_store = ["by store:"] + [f"  {line}" for line in store_lines(receipt)]
    return "\n".join(
        head
        + [_table(("store", "backend", "artifact", "status"), rows)]
        + rows_by_store
        + [f"totals: {totals or 'no artifacts'}", f"always out of scope: {out_of_scope}"]
    )
