"""Start-up cost of the command: ``tombstone --version``, ``--help`` and a subcommand's ``--help``, each a fresh
process, beside a bare ``python -c pass`` (the floor no command can go under) and ``import numpy`` (what the
package once imported at every start). Median of ``reps`` runs of each, measured side by side in turn.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from common import side_by_side

HEADINGS = ("Start-up: tombstone --version and --help",)


def _cli() -> list[str]:
    found = shutil.which("tombstone")
    return [found] if found else [sys.executable, "-m", "tombstone"]


def run(tmp, reps: int = 21) -> dict:
    cli = _cli()

    def call(*args: str):
        return lambda: subprocess.run([*args], check=True, capture_output=True)

    fns = {
        "python -c pass": call(sys.executable, "-c", "pass"),
        "python -c 'import numpy'": call(sys.executable, "-c", "import numpy"),
        "tombstone --version": call(*cli, "--version"),
        "tombstone --help": call(*cli, "--help"),
        "tombstone erase --help": call(*cli, "erase", "--help"),
        "tombstone audit --help": call(*cli, "audit", "--help"),
    }
    for fn in fns.values():  # one untimed call of each: the files are in the page cache for all of them
        fn()
    return {"reps": reps, "times": side_by_side(fns, reps=reps)}


def section(result: dict) -> str:
    times = result["times"]
    floor = times["python -c pass"]
    rows = "\n".join(f"| `{name}` | {t * 1000:.0f} ms | {t / floor:.1f}× |" for name, t in times.items())
    return f"""## Start-up: tombstone --version and --help

Each command a fresh process, median of {result['reps']} runs, all measured side by side in turn. The package
imports its public names on first use, and each command imports what it needs inside the command, so that
asking for help or the version costs no more than the command-line library.

| command | median | × `python -c pass` |
|---|---|---|
{rows}
"""
