"""One example per command, shown at the end of its ``--help`` (the way a man page ends with EXAMPLES).

Every example runs from the deployment's folder (where ``tombstone.toml`` is) unless it says otherwise; the
test suite checks that each command has one and that each names its own command.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, tuple[str, str]] = {
    "init": ("create a deployment in ./deploy", "tombstone init --home deploy"),
    "demo": ("build the demo with three subjects and erase the first",
             "tombstone demo --workdir demo --subjects 3"),
    "erase": ("erase one subject and keep its receipt where you choose",
              "tombstone erase user-42 --out user-42.json"),
    "worker": ("work the shared queue until it is empty", "tombstone worker --drain"),
    "resume": ("finish whatever erasure a crash interrupted", "tombstone resume"),
    "status": ("what happened to one subject", "tombstone status user-42"),
    "where": ("everything the lineage db records for a subject", "tombstone where user-42"),
    "dlq list": ("store operations that failed past their retries", "tombstone dlq list"),
    "dlq retry": ("erase again every subject with an open dead letter", "tombstone dlq retry"),
    "receipt verify": ("check a receipt against the operator's published key",
                       "tombstone receipt verify receipts/user-42.json --key keys/signing.pub"),
    "receipt certificate": ("a printable certificate of sanitization from a verified receipt, as HTML and PDF",
                            "tombstone receipt certificate receipts/user-42.json --key keys/signing.pub --pdf user-42.pdf"),
    "receipt show": ("read a receipt as tables (not verified)", "tombstone receipt show receipts/user-42.json"),
    "receipt head": ("the chain's head, to publish", "tombstone receipt head"),
    "receipt list": ("the sealed receipts of one subject", "tombstone receipt list --subject user-42"),
    "receipt export": ("every sealed receipt, one file each", "tombstone receipt export --all --out export/"),
    "receipt schema": ("the receipt's JSON Schema", "tombstone receipt schema > receipt.schema.json"),
    "audit": ("re-probe a handed receipt's stores read-only, from the auditor's folder",
              "tombstone audit bundle/user-42.json --config stores.toml --key operator-signing.pub"),
    "check": ("the CI gate for one backend", "tombstone check --backend docstore --junit check.xml"),
    "scan": ("how much deleted data a configured store still holds", "tombstone scan --store docs"),
    "reclaim": ("reclaim what a store's own client already deleted", "tombstone reclaim --store docs"),
    "compact": ("rewrite every store without in-place reclaim traces", "tombstone compact"),
    "auditor-key": ("an auditor's key pair, in a folder of the auditor's", "tombstone auditor-key auditor-keys"),
    "backends": ("which backends are installed and what they can prove", "tombstone backends"),
    "report": ("a month of receipts as HTML", "tombstone report receipts/ --key keys/signing.pub --format html"
               " --out report.html"),
    "serve": ("a read-only page over the deployment on this machine", "tombstone serve --port 8765"),
    "mcp": ("serve the deployment to an agent over stdio", "tombstone mcp --config tombstone.toml"),
    "request add": ("record a request received on 20 November, keeping the invoices archive by law",
                    "tombstone request add user-42 --received 2026-11-20 --retain 'archive:tax law:2033-12-31'"),
    "request extend": ("move a request's deadline by two months, saying why",
                       "tombstone request extend R-0001 --months 2 --reason 'several systems to search'"),
    "backups due": ("declared copies still holding erased subjects; exit 1 while an expired one waits for its"
                    " re-check", "tombstone backups due"),
    "backups recheck": ("probe a restored copy for what a receipt erased, and seal the result",
                        "tombstone backups recheck user-42 --backup nightly --restored /restore/docs.db"),
    "request list": ("every request and its deadline; exit 1 while one is overdue", "tombstone request list"),
}


def add_examples(group: click.Group, prefix: str = "") -> None:
    """Set the epilog of every command under ``group`` to its example (kept as written: ``\\b``)."""
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            add_examples(command, path + " ")
            continue
        if path in EXAMPLES:
            what, example = EXAMPLES[path]
            command.epilog = f"\b\nExample ({what}):\n  $ {example}"


__all__ = ["EXAMPLES", "add_examples"]
