"""The ``tombstone`` command: a thin layer over the Python API.

Exit codes (the README has the table): 0 done, nothing left to act on; 1 a check failed (a receipt that
does not verify, stores that contradict it, a gate that fails); 2 bad input or an operation that could not
run; 3 the receipt was written but holds something a person must act on (RESIDUAL, NEEDS_HUMAN, an
actionable UNVERIFIED); 4 an audit found no contradiction but could not re-check every claim; 130
interrupted (``tombstone resume`` finishes the saga). Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations
from tombstone.cli.base import (CONFIG_OPTION, EXIT_ACTION_NEEDED, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED,
                                EXIT_OK, EXIT_UNCHECKED, echo, main)
from tombstone.cli.output import format_receipt, store_lines
from tombstone.cli import agents, backups, erasure, receipts, requests, stores  # noqa: F401  (each registers its commands on main)
from tombstone.cli.examples import add_examples

add_examples(main)

__all__ = ["CONFIG_OPTION", "EXIT_ACTION_NEEDED", "EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK",
           "EXIT_UNCHECKED", "echo", "format_receipt", "main", "store_lines"]
