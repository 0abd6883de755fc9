"""Benchmarks that write RESULTS.md. Re-run with:  python benchmarks/run.py

One module per RESULTS.md table (see ``results.MODULES``), each with ``run(tmp) -> dict`` and
``section(result) -> str``; ``results.py`` writes the file. Name modules to measure only those and replace
just their sections of the existing file:  python benchmarks/run.py scan_rate caches

Timings are medians of repeated runs measured side by side in one process on this machine;
compare ratios, not absolute numbers, across machines.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import results
from common import RESULTS, temp_dir

# Measuring order: the single-process tables and the crash trials before any embedded PostgreSQL is
# started in this process, the vector stores last.
RUN_ORDER = ("docstore_residue", "docstore_erase", "scan_rate", "crash_trials", "caches", "dataset_shards",
             "dataset_copies", "batches", "batch_scale", "batch_growth", "faiss_threads", "workers", "pgvector_residue", "pgvector_scale", "pgvector_probe", "new_engines", "vector_stores", "write_path",
             "read_path", "scale", "chroma_floor", "forensic_scan", "semantic", "semantic_templated", "semantic_batch", "model_unlearning", "lora_copies",
             "faults", "startup")
assert sorted(RUN_ORDER) == sorted(results.MODULES)


def main(argv: list[str] | None = None) -> int:
    tables = "\n".join(f"  {name:18} " + "\n  {:18} ".format("").join(m.HEADINGS)
                        for name, m in results.MODULES.items())
    parser = argparse.ArgumentParser(
        description="Measure and write RESULTS.md: every table, or only the named ones (their sections"
                    " replaced in the existing file, the others kept).",
        epilog="tables:\n" + tables, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="module names to run (default: all)")
    parser.add_argument("-o", "--output", type=Path, default=RESULTS,
                        help=f"file to write (default: {RESULTS})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.tables if n not in results.MODULES]
    if unknown:
        parser.error(f"unknown table {', '.join(unknown)} (choose from {', '.join(results.MODULES)})")
    selected = [n for n in RUN_ORDER if n in args.tables] if args.tables else list(RUN_ORDER)

    measured: dict[str, dict] = {}
    failed: list[str] = []
    with temp_dir() as tmp:
        for name in selected:
            print(f"{name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            workdir = tmp / name
            workdir.mkdir()
            try:
                measured[name] = results.MODULES[name].run(workdir)
            except Exception:  # noqa: BLE001 - a module that fails keeps its old section; the others still run
                traceback.print_exc()
                failed.append(name)
            print(f"{name}: {'failed' if name in failed else 'done'} in {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    if measured:
        results.write(args.output, measured, partial=bool(args.tables), keep_missing=True)
        print("\n\n".join(results.render(name, measured[name]) for name in results.MODULES if name in measured))
    if failed:
        print(f"failed: {', '.join(failed)} (their sections in {args.output} are left as they were)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
