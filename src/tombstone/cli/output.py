"""What the erasure commands print: a receipt's summary, its stores' next steps, progress, and the exit
code that says whether work remains."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from tombstone.cli.base import EXIT_ACTION_NEEDED, _table, echo

if TYPE_CHECKING:
    from tombstone.receipt.model import ArtifactEntry, Receipt


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


def _short(text: str | None, store: str = "", backend: str = "") -> str:
    """A probe's reason or finding in a few words: one line, its first clause without a parenthesis, and
    without a leading store or backend name (the summary lists the stores itself)."""
    text = " ".join(str(text or "").split())
    for name in (store, backend):
        if name and text.startswith(name + " "):
            text = text[len(name) + 1:]
            break
    text = text.split("; ", 1)[0].split(" (", 1)[0]
    return text if len(text) <= 90 else text[:87].rstrip() + "..."


_KINDS = ("passed", "failed", "ran without a decision", "not run", "not recorded")


def _probe_outcome(entry: ArtifactEntry, level: Any) -> tuple[str, str]:
    """What one artifact's probe record of ``level`` says: (passed, failed, ran without a decision, not run,
    not recorded) and, but for a pass, why in a few words."""
    probe = entry.probe(level)
    if probe is None:
        return "not recorded", ""
    outcome = probe.detail.get("outcome") if isinstance(probe.detail.get("outcome"), str) else None
    if probe.ran and probe.passed is True:
        return "passed", ""
    if probe.ran and probe.passed is False:
        return "failed", _short(probe.measurement or outcome or "found", entry.store, entry.backend)
    if probe.ran:
        return "ran without a decision", _short(outcome or probe.measurement or probe.detail.get("why") or "",
                                                entry.store, entry.backend)
    return "not run", _short(outcome or probe.why, entry.store, entry.backend)


def level_lines(receipt: dict[str, Any] | Receipt) -> list[str]:
    """One line per level, read from the receipt's probe records (whatever the level records): how many
    artifacts its probe passed, failed or ran on without deciding, on which stores, and where it did not run,
    why. Nothing for a receipt without artifacts (a store reclaim's)."""
    from tombstone.receipt.model import Receipt
    from tombstone.verify.levels import Level

    if not isinstance(receipt, Receipt):
        receipt = Receipt.parse(receipt)
    if not receipt.artifacts:
        return []
    every = sorted({entry.store for entry in receipt.artifacts})
    width = max(len(level.value) for level in Level) + 1
    lines = []
    for level in Level:
        groups: dict[tuple[str, str], dict[str, int]] = {}
        for entry in receipt.artifacts:
            stores = groups.setdefault(_probe_outcome(entry, level), {})
            stores[entry.store] = stores.get(entry.store, 0) + 1
        parts = []
        for (kind, why), stores in sorted(groups.items(), key=lambda item: _KINDS.index(item[0][0])):
            count = sum(stores.values())
            if sorted(stores) != every:
                where = f" on {', '.join(sorted(stores))}"
            else:
                where = "" if len(groups) == 1 and not why else " on every store" if len(every) > 1 else f" on {every[0]}"
            if kind == "not recorded":
                parts.append(f"{count} not recorded{where} (a receipt of an earlier release)")
            else:
                parts.append(f"{count} {kind}{where}" + (f" ({why})" if why else ""))
        lines.append(f"{(level.value + ':').ljust(width)} " + "; ".join(parts))
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
    """A progress display for long sagas: a bar on a terminal, plain lines on stderr otherwise. One display
    serves several sagas in turn (each one's steps count from 1 again)."""
    if sys.stderr.isatty():
        state: dict[str, Any] = {}

        def bar(step: str, store: str, done: int, total: int) -> None:
            if "bar" not in state:
                state["bar"] = click.progressbar(length=total, label="erasing", file=sys.stderr)
                state["bar"].__enter__()
            state["bar"].label = f"{step} {store}".strip()
            state["bar"].update(done - state.get("done", 0))
            state["done"] = done
            if done >= total:  # one saga done: the next one (resume, check) starts a bar of its own
                state["bar"].__exit__(None, None, None)
                state.clear()

        return bar

    def lines(step: str, store: str, done: int, total: int) -> None:
        echo(f"[{done}/{total}] {step} {store}".rstrip(), err=True)

    return lines


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
    levels = level_lines(receipt)
    return "\n".join(
        head
        + [_table(("store", "backend", "artifact", "status"), rows)]
        + rows_by_store
        + (["levels:"] + [f"  {line}" for line in levels] if levels else [])
        + [f"totals: {totals or 'no artifacts'}", f"always out of scope: {out_of_scope}"]
    )
