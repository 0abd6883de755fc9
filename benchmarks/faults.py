"""Faults in the stores themselves: every cell of the fault matrix, N trials each.

The cells come from ``faults_pg`` (the embedded PostgreSQL killed during the pgvector reclaim), ``faults_conc``
(another process writing during the reclaim; a backup restored after the erasure) and ``faults_disk`` (the
disk full while a reclaim writes; the store's folder read-only between suppression and reclaim). Each cell's
``CELLS[name](folder)`` runs one trial in a fresh folder and returns ``survivors_lost``, ``false_verified``,
``finished_on_resume``, ``dead_lettered`` and ``recovery_s``.

Trials per cell: ``TOMBSTONE_BENCH_FAULT_TRIALS`` (default 20) for the kill cells, and
``TOMBSTONE_BENCH_FAULT_OTHER_TRIALS`` (default 5) for the others; ``TOMBSTONE_BENCH_FAULT_CELLS`` (comma-
separated prefixes) limits which cells run. A trial that raises is counted as failed, with its error.
"""

from __future__ import annotations

import importlib
import os
import shutil
import statistics
import sys
import traceback
from pathlib import Path

HEADINGS = ("Faults in the stores: survivors, false VERIFIED, recovery",)
SOURCES = ("faults_pg", "faults_conc", "faults_disk")
KILL_TRIALS = int(os.environ.get("TOMBSTONE_BENCH_FAULT_TRIALS", "20"))
OTHER_TRIALS = int(os.environ.get("TOMBSTONE_BENCH_FAULT_OTHER_TRIALS", "5"))


def _cells() -> dict[str, tuple[str, object]]:
    cells: dict[str, tuple[str, object]] = {}
    for source in SOURCES:
        try:
            module = importlib.import_module(source)
        except ImportError as exc:  # a source whose store is not installed here
            print(f"  {source}: not run ({exc})", file=sys.stderr, flush=True)
            continue
        for name, trial in module.CELLS.items():
            cells[f"{source.removeprefix('faults_')}:{name}"] = (source, trial)
    wanted = [w for w in os.environ.get("TOMBSTONE_BENCH_FAULT_CELLS", "").split(",") if w]
    return {n: c for n, c in cells.items() if not wanted or any(n.startswith(w) for w in wanted)}


def run(tmp: Path) -> dict:
    rows = []
    for name, (source, trial) in _cells().items():
        trials = KILL_TRIALS if source == "faults_pg" else OTHER_TRIALS
        outcomes, errors = [], []
        for n in range(trials):
            folder = tmp / f"{name.replace(':', '-')}-{n}"
            folder.mkdir(parents=True)
            try:
                outcomes.append(trial(folder))
            except Exception as exc:  # noqa: BLE001 - a failed trial is reported, the others still run
                traceback.print_exc()
                errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:160])
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        recovery = [o["recovery_s"] for o in outcomes if o.get("recovery_s") is not None]
        rows.append({"cell": name, "trials": trials, "ran": len(outcomes), "errors": errors,
                     "survivors_lost": sum(o["survivors_lost"] for o in outcomes),
                     "false_verified": sum(o["false_verified"] for o in outcomes),
                     "finished": sum(bool(o["finished_on_resume"]) for o in outcomes),
                     "dead_lettered": sum(bool(o["dead_lettered"]) for o in outcomes),
                     "recovery": statistics.median(recovery) if recovery else None})
        print(f"  {name}: {rows[-1]}", file=sys.stderr, flush=True)
    order = [source.removeprefix("faults_") for source in SOURCES]
    rows += _kept_rows({r["cell"] for r in rows})
    rows.sort(key=lambda r: order.index(r["cell"].split(":")[0]) if r["cell"].split(":")[0] in order else len(order))
    return {"rows": rows}


def _kept_rows(ran: set[str]) -> list[dict]:
    """When ``TOMBSTONE_BENCH_FAULT_CELLS`` limits the run, the rows of the other cells as RESULTS.md has them
    from an earlier run (the table stays whole; each row says its own trials)."""
    if not os.environ.get("TOMBSTONE_BENCH_FAULT_CELLS"):
        return []
    results = Path(__file__).resolve().parents[1] / "RESULTS.md"
    text = results.read_text() if results.exists() else ""
    start = text.find(f"## {HEADINGS[0]}")
    if start < 0:
        return []
    kept = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cell = line.split("|")[1].strip() if line.startswith("| ") else ""
        if ":" in cell and cell not in ran:
            kept.append({"cell": cell, "line": line})
    return kept


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        "Each cell injects one fault into a real store during an erasure (`benchmarks/faults.py`; the tests under"
        " `tests/faults/` keep one trial per cell). *Survivors lost*: other subjects' records missing or changed"
        " afterwards (must be 0). *False VERIFIED*: erased artifacts a receipt calls VERIFIED that an independent"
        " read of the final files still finds, or, for a restored backup, an audit that still calls the receipt"
        " sound (must be 0). How each trial's saga ended: *at once* (the erasure finished in its own run: a"
        " writer waited for, a backup restored afterwards), *on resume* (`tombstone resume` after the fault was"
        " lifted, or the erasure run again where its receipt says to: a Chroma client outside Tombstone closed)"
        " or *dead-lettered* (a one-line reason; `tombstone dlq retry` then finished it). *Recovery*:"
        " median time from lifting the fault (restart, space freed, folder writable again; for the writer and"
        " restore cells, the erasure or the audit) to the saga's end. Trials per cell: the run's"
        " `TOMBSTONE_BENCH_FAULT_TRIALS` (kill cells) and `TOMBSTONE_BENCH_FAULT_OTHER_TRIALS`.",
        "",
        "| cell | trials | survivors lost | false VERIFIED | at once | on resume | dead-lettered | median recovery |"
        " failed trials |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "line" in r:  # kept from an earlier run
            lines.append(r["line"])
            continue
        recovery = f"{r['recovery']:.1f} s" if r["recovery"] is not None else "—"
        failed = f"{len(r['errors'])}: {r['errors'][0]}" if r["errors"] else "0"
        at_once = r["ran"] - r["finished"] - r["dead_lettered"]
        lines.append(f"| {r['cell']} | {r['ran']} of {r['trials']} | {r['survivors_lost']} | {r['false_verified']} |"
                     f" {at_once} | {r['finished']} | {r['dead_lettered']} | {recovery} | {failed} |")
    lines += [
        "",
        "*writer-chroma-raw*: the writer holds Chroma's own client open through the erasure. Chroma's embedded"
        " clients are not safe across processes (that client would write the index it loaded back over the"
        " erasure, erased vectors included, and could lose its own writes when the files change under it), so"
        " the erasure refuses the store before it changes anything, naming the process (exit 2); run again once"
        " the writer has stopped, it ends VERIFIED(physical), and `tombstone audit` agrees on the final files"
        " (counted under *on resume*). Before that refusal, a trial now and then lost records the writer had"
        " written. *disk:exact_cache* and *disk:semantic_cache*: each cache is built with the"
        " document store its answers came from; only the cache's folder is faulted.",
    ]
    return "\n".join(lines)
