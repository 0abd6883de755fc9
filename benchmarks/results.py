"""RESULTS.md: the list of table modules, and the writer that puts their sections together.

Every module in ``MODULES`` has ``HEADINGS`` (its ``## `` headings, in order), ``run(tmp) -> dict`` (measure)
and ``section(result) -> str`` (render those headings and their tables). A full run rewrites the file; a run
of some modules replaces only their sections and keeps the rest of the existing file as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import batch_growth
import batch_scale
import batches
import caches
import chroma_floor
import crash_trials
import dataset_copies
import dataset_shards
import docstore_erase
import docstore_residue
import faiss_threads
import faults
import forensic_scan
import lora_copies
import model_unlearning
import pgvector_probe
import pgvector_residue
import pgvector_scale
import read_path
import scale
import scan_rate
import semantic
import semantic_batch
import semantic_templated
import new_engines
import startup
import vector_stores
import workers
import write_path
from common import header

# In the order of the sections in RESULTS.md.
MODULES: dict[str, ModuleType] = {m.__name__: m for m in (
    docstore_residue, docstore_erase, scan_rate, vector_stores, write_path, pgvector_residue, pgvector_scale, pgvector_probe, new_engines, crash_trials, batches,
    batch_scale, batch_growth, workers, caches, dataset_shards, dataset_copies, read_path, faiss_threads, scale, chroma_floor, forensic_scan, semantic, semantic_templated,
    semantic_batch, model_unlearning, lora_copies, faults, startup,
)}


def split(text: str) -> tuple[str, dict[str, str]]:
    """The text before the first ``## `` heading, and each ``## `` block (heading to the next) by heading."""
    head: list[str] = []
    blocks: dict[str, list[str]] = {}
    current = head
    for line in text.splitlines():
        if line.startswith("## "):
            current = blocks.setdefault(line[3:].strip(), [])
        current.append(line)
    return "\n".join(head).rstrip(), {h: "\n".join(b).rstrip() for h, b in blocks.items()}


def render(name: str, result: dict) -> str:
    module = MODULES[name]
    text = module.section(result).rstrip()
    found = tuple(line[3:].strip() for line in text.splitlines() if line.startswith("## "))
    if found != tuple(module.HEADINGS):
        raise ValueError(f"{name}.section() wrote headings {found}, expected {tuple(module.HEADINGS)}")
    return text


def compose(results: dict[str, dict], existing: str | None = None, keep_header: bool = True) -> str:
    """The whole file: the sections of ``results`` freshly rendered; for modules not in ``results``, their
    sections as they stand in ``existing`` (left out, with a note, where ``existing`` lacks them). The
    header is ``existing``'s where there is one and ``keep_header``, else written anew."""
    top, old = split(existing) if existing is not None else ("", {})
    sections = []
    for name, module in MODULES.items():
        if name in results:
            sections.append(render(name, results[name]))
        elif all(h in old for h in module.HEADINGS):
            sections.append("\n\n".join(old[h] for h in module.HEADINGS))
        else:
            print(f"note: no figures for {name}; its section is left out", file=sys.stderr)
    known = {h for m in MODULES.values() for h in m.HEADINGS}
    for heading, block in old.items():
        if heading not in known:
            print(f"note: keeping section {heading!r}, which no module writes, at the end", file=sys.stderr)
            sections.append(block)
    fresh = header()
    if not (top and keep_header):
        top = fresh
    elif top != fresh:
        print("note: keeping the existing header; this run's environment would read:\n" + fresh, file=sys.stderr)
    return top + "\n\n" + "\n\n".join(sections) + "\n"


def write(path: Path, results: dict[str, dict], partial: bool, keep_missing: bool = False) -> str:
    """Write ``path`` and return its text: the whole file anew, or (``partial``) only the sections of
    ``results`` replaced in the existing file, its header kept. ``keep_missing``: on a full rewrite, keep
    the existing sections of modules that have no result (a module that failed) rather than drop them."""
    existing = path.read_text() if (partial or keep_missing) and path.exists() else None
    text = compose(results, existing, keep_header=partial)
    path.write_text(text)
    return text
