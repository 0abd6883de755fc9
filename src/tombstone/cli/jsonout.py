"""``--json``: one JSON object per command, in the shape ``output.schema.json`` publishes.

Every object carries ``"output": "tombstone.<command>"`` and ``"version"`` (this schema's version), so a
script can tell which command wrote it and whether it knows the shape. Non-ASCII text is written as
``\\uXXXX`` escapes, so nothing a subject or a store holds can reach a terminal raw. Exit codes are the same
as without ``--json``; errors stay one line on stderr.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import click

OUTPUT_VERSION = "1"

JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as one JSON object (its shape: 'tombstone receipt schema --cli').")


def emit(command: str, body: dict[str, Any]) -> None:
    """Print ``body`` as the ``--json`` object of ``command`` (``"erase"``, ``"receipt list"``)."""
    obj = {"output": "tombstone." + command.replace(" ", "."), "version": OUTPUT_VERSION, **body}
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@lru_cache(maxsize=1)
def output_schema() -> dict[str, Any]:
    """The published JSON Schema of every command's ``--json`` object."""
    return json.loads(resources.files("tombstone.cli").joinpath("output.schema.json").read_text("utf-8"))


def receipt_brief(receipt: dict[str, Any], path: Any) -> dict[str, Any]:
    """What ``erase`` and ``resume`` say of each receipt they wrote: where, whose, the summary, and whether a
    person must act on it."""
    from tombstone.receipt.model import Receipt

    parsed = Receipt.parse(receipt)
    return {"receipt": str(path), "subject": parsed.subject, "saga_id": parsed.saga_id,
            "receipt_hash": receipt.get("receipt_hash"), "summary": dict(parsed.summary),
            "needs_action": bool(parsed.needs_action or parsed.store_left_recoverable),
            "artifacts": [{"store": a.store, "artifact_id": a.artifact_id, "status": a.status_text}
                          for a in parsed.artifacts]}


__all__ = ["JSON_OPTION", "OUTPUT_VERSION", "emit", "output_schema", "receipt_brief"]
