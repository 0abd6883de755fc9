"""Batches of growing size: what each subject of a batch costs as the batch grows from 50 to 400 subjects.

Each case (backend, size) is built once by ``scale.py build`` (dim-384 unit vectors in subjects of 100 chunks,
lineage recorded for every chunk); each batch size is measured on a fresh copy of it, in a process of its own
(as ``tombstone erase --subjects-file`` runs): one subject erased first (the store opened, as an erasure opens
it), then one ``erase_many`` of the batch's subjects. A cost that grows with the batch faster than the batch
(one saga's work that reads every other saga's rows, a transaction whose pages are copied again for each
part of it) shows here as a per-subject time that rises with the batch; one that stays flat does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HEADINGS = ("Batches of growing size: cost per subject",)
CASES = (("faiss", 100_000), ("chroma", 100_000))
BATCHES = (50, 100, 200, 400)
HERE = Path(__file__).resolve().parent
BEFORE = (
    "Before two changes (measured 2026-12-07 by this script on the code without them, same host, one run each),"
    " an extra subject cost more the larger the batch: faiss at 100,000, 28.8, 47.7, 56.1 and 51.6 ms per subject"
    " for 50, 100, 200 and 400 subjects, of which the probe purge 2.4, 14.7, 14.7 and 13.3 ms; chroma at 100,000,"
    " 115.2, 81.1, 73.2 and 69.7 ms, the purge 14.0 to 15.6 ms. The verify step's state change, suppression"
    " clearing and probe purge share one transaction, and each opened a savepoint of its own in it: under a"
    " savepoint SQLite copies every page a statement changes into the savepoint's journal first, and the purge"
    " deletes every probe vector of the batch (about 1.5 KB each, three or four an artifact; 400 subjects'"
    " purge took 4.6 s under savepoints and 1.8 s without in one profile). They now join the step's transaction"
    " (a failure is undone by it). And each new saga of a batch read every unfinished saga's receipt file to"
    " choose its own (n subjects read n times n rows; a quarter of a second at 400); the batch now reads them once."
)
SHOWN = ("purge", "chain", "plans", "signed")
"""The parts of ``batch_scale.PARTS`` whose per-subject time the prose lists (those that grew before)."""


def measure(backend: str, subjects: int, tmp: Path) -> dict:
    from batch_scale import _cpu, _timed
    from tombstone import Tombstone
    from tombstone.config import load_config

    built = json.loads((tmp / "build.json").read_text())
    config, refs = load_config(tmp / "deploy" / "tombstone.toml"), built["refs"]
    with Tombstone(config) as tomb:
        tomb.adapter(backend)
        receipt, _ = tomb.erase(refs[0])
        assert receipt["summary"].get("VERIFIED") == 100, receipt["summary"]
        with _timed() as parts:
            t, cpu = time.perf_counter(), _cpu()
            done = tomb.erase_many(refs[1 : 1 + subjects])
            elapsed, used = time.perf_counter() - t, _cpu() - cpu
        assert len(done) == subjects and all(r["summary"].get("VERIFIED") == 100 for r, _ in done)
    return {"backend": backend, "subjects": subjects, "time": elapsed, "cpu": used, "parts": dict(parts),
            "load": os.getloadavg()[0]}


def run(tmp: Path) -> dict:
    rows, failed = [], []
    for backend, size in CASES:
        built = tmp / f"{backend}-{size}"
        built.mkdir(parents=True)
        proc = subprocess.run([sys.executable, str(HERE / "scale.py"), "build", backend, str(size), str(built)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"  {backend} {size}: build failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            failed.append(f"{backend} at {size:,}")
            continue
        (built / "build.json").write_text(proc.stdout.strip().splitlines()[-1])
        subjects = len(json.loads((built / "build.json").read_text())["refs"])
        for n in (n for n in BATCHES if n < subjects):
            work = tmp / f"{backend}-{size}-{n}"
            shutil.copytree(built, work, symlinks=True)
            os.sync()  # the copy's writes reach the disk before the batch's own (which would otherwise wait on them)
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), backend, str(n), str(work)],
                                  capture_output=True, text=True, check=False)
            shutil.rmtree(work, ignore_errors=True)
            if proc.returncode != 0:
                print(f"  {backend} {size} batch {n}: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
                failed.append(f"{backend} at {size:,}, {n} subjects")
                continue
            rows.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "size": size})
            print(f"  {backend} {size} batch {n}: {rows[-1]['time']:.2f} s", file=sys.stderr, flush=True)
        shutil.rmtree(built, ignore_errors=True)
    if not rows:
        raise RuntimeError(f"every case failed: {', '.join(failed)}")
    return {"rows": rows, "failed": failed}


def section(result: dict) -> str:
    from batch_scale import PARTS

    lines = [
        f"## {HEADINGS[0]}",
        "",
        "Dim-384 unit vectors in subjects of 100 chunks, lineage recorded for every chunk; each batch size on a"
        " fresh copy of the same built store, in a process of its own: one subject erased first (the store"
        " opened), then one `erase_many` of the batch (one reclaim and one probe pass per store, one saga and"
        " signed receipt per subject), one run each. *Per subject*: the batch's time over its subjects; *x the"
        f" smallest*: that against the {BATCHES[0]}-subject batch's, which stays near 1.0 where nothing grows"
        " faster than the batch.",
        "",
        "| backend | vectors | subjects | batch | per subject | x the smallest | CPU per subject |",
        "|---|---|---|---|---|---|---|",
    ]
    smallest: dict[tuple[str, int], float] = {}
    for r in result["rows"]:
        per = r["time"] / r["subjects"]
        base = smallest.setdefault((r["backend"], r["size"]), per)
        lines.append(f"| {r['backend']} | {r['size']:,} | {r['subjects']} | {r['time']:.2f} s | {per * 1000:.1f} ms |"
                     f" {per / base:.2f}x | {r['cpu'] / r['subjects'] * 1000:.1f} ms |")
    lines += ["", "Per subject, timed per call in the same batches (elapsed time summed over the calls):"]
    for r in result["rows"]:
        lines.append(f"- {r['backend']} at {r['size']:,}, {r['subjects']} subjects: " + "; ".join(
            f"{PARTS[name]} {r['parts'][name] * 1000 / r['subjects']:.1f} ms" for name in SHOWN) + ".")
    lines += ["", BEFORE]
    loads = [r["load"] for r in result["rows"]]
    lines += ["", f"The host's one-minute load average as each batch ended: {min(loads):.1f} to {max(loads):.1f}"
                  f" ({os.cpu_count()} cores)."]
    if result["failed"]:
        lines += ["", f"Failed (not measured in this run): {', '.join(result['failed'])}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))))
