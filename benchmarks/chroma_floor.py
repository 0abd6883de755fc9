"""Chroma: one subject's erasure against what Chroma's own tools cost, and leave, at the same size.

Each size is built by ``scale.py build chroma N`` (dim-384 unit vectors in subjects of 100 chunks, written with
their lineage through the wrapper). Then, each time on a fresh copy of the built deployment and in a process
of its own: one subject erased by Tombstone (``Tombstone.erase``: suppress, in-place reclaim, probes, receipt);
or the same subject's records deleted with Chroma's own client (``collection.delete``, in a fresh client, as
an app would) followed by ``chroma vacuum --force`` (Chroma's command, a SQLite VACUUM of ``chroma.sqlite3``),
the floor a user pays without Tombstone. After each, the store's files are scanned for the subject's
vector and id patterns (what the physical probe looks for).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEADINGS = ("Chroma: the erasure against Chroma's own delete and vacuum",)
SIZES = tuple(int(n) for n in os.environ.get("TOMBSTONE_BENCH_CHROMA_FLOOR_SIZES", "10000,100000").split(","))
REPS = 3
HERE = Path(__file__).resolve().parent
BUILT = dict(item.split("=", 1) for item in os.environ.get("TOMBSTONE_BENCH_CHROMA_FLOOR_BUILT", "").split(",") if item)
"""``SIZE=DIR,...``: a case ``scale.py build chroma SIZE DIR`` already built (its output saved as ``DIR/build.json``),
used as it is (copied for each run, never changed) instead of building it again: a million records take
about half an hour to build."""


def _patterns(config, ref: str):
    """The subject's artifact ids and their physical patterns, read before anything is deleted."""
    from tombstone import Tombstone

    with Tombstone(config) as tomb:
        adapter = tomb.adapter("chroma")
        arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(ref))
        patterns = {f"{a.artifact_id}:{k}": v for a in arts for k, v in adapter.physical_patterns(a).items()}
        return [a.artifact_id for a in arts], patterns


def _left(store: Path, patterns: dict[str, bytes]) -> int:
    """How many of the subject's artifacts still have a pattern somewhere in the store's files."""
    from tombstone.verify.scanner import scan_files

    report = scan_files(sorted(p for p in store.rglob("*") if p.is_file()), patterns, root=store)
    return len({key.split(":", 1)[0] for key, hits in report.hits.items() if hits})


def _reclaim_time(tomb, receipt) -> float:
    """The saga's reclaim step, from its journal (begin to end)."""
    from scale import _steps

    return _steps(tomb, receipt["saga_id"]).get("reclaim", float("nan"))


def _fulltext(receipt) -> str:
    evidence = receipt["artifacts"][0]["evidence"]["reclaim"]["evidence"]
    return "in place" if evidence.get("fulltext_secure_delete") else "merged" if evidence.get("fulltext_merged") else "none"


def measure(how: str, work: Path, ref: str, later: str) -> dict:
    """One run in this process on the deployment copied to ``work``."""
    from tombstone import Tombstone
    from tombstone.config import load_config

    config = load_config(work / "tombstone.toml")
    store = work / "stores" / "chroma"
    ids, patterns = _patterns(config, ref)
    out: dict = {"records": len(ids)}
    if how == "tombstone":
        with Tombstone(config) as tomb:
            t = time.perf_counter()
            receipt, _ = tomb.erase(ref)
            out["erase"] = time.perf_counter() - t
            out["reclaim"] = _reclaim_time(tomb, receipt)
            out["fulltext"] = _fulltext(receipt)
            # the next subject's erasure: the full-text index now deletes in place (nothing to merge)
            t = time.perf_counter()
            second, _ = tomb.erase(later)
            out["next_erase"] = time.perf_counter() - t
            out["next_reclaim"] = _reclaim_time(tomb, second)
            out["next_fulltext"] = _fulltext(second)
        out["verified"] = receipt["summary"].get("VERIFIED", 0) + second["summary"].get("VERIFIED", 0)
    else:
        import chromadb

        t = time.perf_counter()
        client = chromadb.PersistentClient(str(store))
        client.get_collection(config.stores["chroma"].options["collection"]).delete(ids=ids)
        out["delete"] = time.perf_counter() - t
        del client
        chroma = Path(sys.executable).with_name("chroma")
        t = time.perf_counter()
        proc = subprocess.run([str(chroma), "vacuum", "--path", str(store), "--force"], capture_output=True,
                              text=True, check=False)
        out["vacuum"] = time.perf_counter() - t
        out["vacuum_ok"] = proc.returncode == 0
        t = time.perf_counter()  # the command's own start (it imports chromadb), to tell it from the VACUUM
        subprocess.run([str(chroma), "--help"], capture_output=True, check=False)
        out["cli_start"] = time.perf_counter() - t
        if proc.returncode != 0:
            out["vacuum_error"] = (proc.stderr or proc.stdout).strip()[-300:]
    out["left"] = _left(store, patterns)
    return out


def built_case(size: int, tmp: Path, given: dict[str, str]) -> tuple[Path, dict]:
    """The folder of a Chroma case of ``size`` and its build's output: the folder ``given`` names for the size
    (built before, used as it is), else one ``scale.py build chroma`` makes under ``tmp`` now."""
    if str(size) in given:
        base = Path(given[str(size)])
        return base, json.loads((base / "build.json").read_text())
    base = tmp / f"chroma-{size}"
    base.mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(HERE / "scale.py"), "build", "chroma", str(size), str(base)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"chroma {size}: build failed\n{proc.stderr[-3000:]}")
    return base, json.loads(proc.stdout.strip().splitlines()[-1])


def on_a_copy(script: Path, how: str, base: Path, work: Path, *refs: str) -> dict:
    """``script how WORK REF...`` run in a process of its own on a fresh copy of ``base``'s deployment at
    ``work``; what it printed last, as JSON."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base / "deploy", work)
    proc = subprocess.run([sys.executable, str(script.resolve()), how, str(work), *refs], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"chroma {base.name} {how}: failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(tmp: Path) -> dict:
    rows = []
    for size in SIZES:
        t = time.perf_counter()
        base, built = built_case(size, tmp, BUILT)
        row: dict = {"size": size, "build": time.perf_counter() - t, "runs": {"tombstone": [], "floor": []}}
        for rep in range(REPS):
            for how in ("tombstone", "floor"):
                row["runs"][how].append(on_a_copy(Path(__file__), how, base, tmp / "work",
                                                  built["refs"][rep], built["refs"][REPS + rep]))
                print(f"  chroma {size} {how}: {row['runs'][how][-1]}", file=sys.stderr, flush=True)
        store = base / "deploy" / "stores" / "chroma"
        row["store_mib"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / (1 << 20)
        if str(size) not in BUILT:
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp / "work", ignore_errors=True)
        rows.append(row)
    return {"rows": rows}


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        "One subject (100 records) of a Chroma collection of dim-384 vectors written with their lineage through the"
        " wrapper; each run on a fresh copy of the built store, in a process of its own, the two ways in turn,"
        f" median of {REPS}. *Tombstone*: `Tombstone.erase` end to end (suppress, in-place reclaim, probes, signed"
        " receipt), a first subject and then another, with the reclaim step's own time from the saga's journal:"
        " the first erasure of a store turns FTS5 `secure-delete` on and merges the whole full-text index once,"
        " the next deletes its full-text entries in place (`adapters/chroma/fulltext.py`). *Chroma's own*: the"
        " records deleted with Chroma's client (`collection.delete`, a fresh client as an app would open it) and"
        " then `chroma vacuum --force`, Chroma's command for reclaiming space (a SQLite VACUUM of"
        " `chroma.sqlite3`): the floor a user pays without Tombstone. *Left*: of the (first) subject's 100"
        " records, how many still have their vector or id somewhere in the store's files afterwards (the"
        " physical probe's patterns, scanned over every file), per run.",
        "",
        "| vectors | store MiB | Tombstone: first erasure | its reclaim | next erasure | its reclaim | left |"
        " Chroma's own: delete | vacuum | delete + vacuum | left |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        tomb, floor = row["runs"]["tombstone"], row["runs"]["floor"]

        def med(runs, key):
            return statistics.median(r[key] for r in runs)

        both = statistics.median(r["delete"] + r["vacuum"] for r in floor)
        left_t = "/".join(str(r["left"]) for r in tomb)
        left_f = "/".join(str(r["left"]) for r in floor)
        failed = [r["vacuum_error"] for r in floor if not r.get("vacuum_ok")]
        first_ft = "/".join(sorted({r["fulltext"] for r in tomb}))
        next_ft = "/".join(sorted({r["next_fulltext"] for r in tomb}))
        lines.append(f"| {row['size']:,} | {row['store_mib']:.0f} | {med(tomb, 'erase'):.2f} s |"
                     f" {med(tomb, 'reclaim'):.2f} s (full text {first_ft}) | {med(tomb, 'next_erase'):.2f} s |"
                     f" {med(tomb, 'next_reclaim'):.2f} s (full text {next_ft}) | {left_t} | {med(floor, 'delete'):.2f} s |"
                     f" {med(floor, 'vacuum'):.2f} s{' (failed)' if failed else ''} | {both:.2f} s | {left_f} |")
    starts = [r["cli_start"] for row in result["rows"] for r in row["runs"]["floor"] if "cli_start" in r]
    lines += [
        "",
        "*left* lists each run's count. `chroma vacuum` is timed as a user runs it, a process of its own: of its"
        f" time, about {statistics.median(starts):.2f} s is the command's start (`chroma --help`, timed after each"
        " run), the rest the VACUUM. Chroma's delete writes the deletions into its log in `chroma.sqlite3`; its"
        " HNSW index marks a deleted slot and leaves its bytes, and the vacuum rewrites only the SQLite file, so"
        " every record's vector or id is still in the store's files after both (the residue table above shows"
        " the same with the delete alone). Tombstone's erasure leaves none: its in-place reclaim zeroes the HNSW"
        " slots, takes the full-text entries out (merging the whole index only the first time) and zeroes the"
        " free space of the database's pages rather than writing the file anew (verification-levels.md, Chroma).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])))
