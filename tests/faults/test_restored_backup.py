"""The store's files replaced under it after the erasure: the app restored a backup taken before it.

For every file-based store (real stores, built through the wrappers): erase ``user-0001``, audit the
receipt (the control: it holds, or for the model level, which an auditor cannot re-measure, nothing
contradicts it), put the backup back, audit again. The audit must say the receipt no longer holds: exit 1,
every artifact of the restored store contradicted, and one line naming them (``CONTRADICTED: ...``).

``tombstone scan`` is run too, to show what it does not see: it reports what a store's own client deleted
and left readable, and a restored record is live, not deleted (exit 0, nothing found; 2 where the backend has
no scan yet). ``tombstone check`` erases canaries of its own in a scratch place, so it says nothing about
a deployment's data. The audit is the command that finds a returned subject.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if str(Path(__file__).parent) not in sys.path:  # the helpers beside it, whether or not tests/faults is a package
    sys.path.insert(0, str(Path(__file__).parent))

from restore_conc import FILE_BACKENDS, restore_cell

CELLS = [pytest.param(b, id=b, marks=[pytest.mark.slow]) for b in FILE_BACKENDS]


@pytest.mark.parametrize("backend", CELLS)
def test_a_restored_backup_breaks_the_receipt_and_the_audit_says_so(tmp_path, backend):
    result = restore_cell(tmp_path, backend)
    assert result["erase_code"] == 0, result["erase_out"]
    assert result["mine"], "the erasure touched the store under test"
    assert all(s == "VERIFIED" for s in result["statuses"]), result["erase_out"]

    # the control: before the restore, the audit finds nothing that contradicts the receipt
    assert "contradicted" not in result["before_verdicts"].values(), result["before_verdicts"]
    if backend == "lora":  # the model level cannot be re-measured by an auditor: unchecked, exit 4
        assert result["before_code"] == 4
    else:
        assert result["before_code"] == 0 and set(result["before_verdicts"].values()) == {"agree"}

    # after the restore: exit 1, every artifact of the restored store found again, one line naming them
    assert result["after_code"] == 1, result["after_text"]
    assert set(result["mine"]) <= set(result["contradicted"]), result["after_found"]
    assert all(result["after_found"][a].startswith("present") for a in result["mine"])
    lines = [line for line in result["after_text"].splitlines() if line.startswith("CONTRADICTED:")]
    assert len(lines) == 1 and all(a in lines[0] for a in result["mine"]), result["after_text"]
    assert result["false_verified"] == 0

    # scan looks for deleted data, not for restored live records: it does not find the subject
    assert result["scan_code"] in (0, 2), result["scan_out"]
    assert not any(a in result["scan_out"] for a in result["mine"])
