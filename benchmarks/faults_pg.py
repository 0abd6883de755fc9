"""The embedded PostgreSQL killed with SIGKILL in the middle of the pgvector reclaim, then restarted and the
erasure resumed (``tombstone_adapters.pgvector.killtrials``).

``CELLS`` maps a cell's name to a callable that runs ONE trial in the fresh folder it is given and returns
``survivors_lost`` (rows of other subjects missing or changed afterwards), ``false_verified`` (artifacts the
receipt calls VERIFIED whose id or vector bytes an independent reading still finds in the table's files,
in files the killed statement left behind, or in the planner statistics), ``finished_on_resume``,
``dead_lettered`` and ``recovery_s`` (from the restart — or, where the server is not restarted by hand,
from the kill — to the saga finished or dead-lettered).

Cells: ``<statement>-<victim>``, statement one of ``vacuum_full`` (the table and its HNSW index written anew),
``analyze`` (the statistics rebuilt from the survivors); victim ``host`` (postmaster and erasing process together),
``postmaster`` (the server alone) or ``backend`` (the statement's server process alone).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tombstone_adapters.pgvector.killtrials import STATEMENTS, cell

VICTIMS = ("host", "postmaster", "backend")

CELLS: dict[str, Callable[[Path], dict]] = {
    f"{statement}-{victim}": cell(statement, victim) for statement in STATEMENTS for victim in VICTIMS
}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    names = sys.argv[1:] or sorted(CELLS)
    for name in names:
        with tempfile.TemporaryDirectory(prefix="faults-pg-") as tmp:
            print(name, json.dumps(CELLS[name](Path(tmp))), flush=True)
