"""SQLite docstore: residue after a plain delete vs after reclaim.

``SUBJECTS`` subjects with ``DOCS`` documents each, ``secure_delete`` off. Per subject: the store's own
``DELETE``, a physical probe, Tombstone's reclaim, the probe again; counts the subjects whose ids the probe
still finds at each point.
"""

from __future__ import annotations

from pathlib import Path

from builds import docstore_build
from common import DOCS
from tombstone import Tombstone

HEADINGS = ("SQLite docstore: residue after a plain delete vs after reclaim",)


def run(tmp: Path) -> dict:
    config, subjects = docstore_build(tmp / "residue")
    from tombstone_adapters.docstore import DocstoreAdapter

    found_after_delete = found_after_reclaim = 0
    with Tombstone(config) as tomb:
        adapter = DocstoreAdapter("docs", {**config.stores["docs"].options, "secure_delete": False})
        for s in subjects:
            arts = tomb.lineage.artifacts_for(tomb.lineage.subject_key(s))
            adapter.native_delete(arts)
            found_after_delete += any(not r.passed for r in adapter.probe_physical(arts).values())
            adapter.reclaim(arts)
            found_after_reclaim += any(not r.passed for r in adapter.probe_physical(arts).values())
        adapter.close()
    return {"subjects": len(subjects), "docs": DOCS, "after_delete": found_after_delete,
            "after_reclaim": found_after_reclaim}


def section(result: dict) -> str:
    n = result["subjects"]
    return "\n".join([
        f"## {HEADINGS[0]}",
        "",
        f"{n} subjects with {result['docs']} documents each, `secure_delete` off (SQLite's upstream default;"
        " this machine's Python turns it on). For each subject: the store's own `DELETE`, a physical probe,"
        " then Tombstone's reclaim (DELETE + checkpoint + VACUUM) and the probe again.",
        "",
        "| after | subjects whose ids the physical probe still found |",
        "|---|---|",
        f"| plain DELETE | {result['after_delete']} / {n} |",
        f"| Tombstone reclaim | {result['after_reclaim']} / {n} |",
    ])
