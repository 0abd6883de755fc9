"""--json: every command that prints a result prints one object of the published shape
(src/tombstone/cli/output.schema.json, 'tombstone receipt schema --cli')."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tombstone.cli.jsonout import output_schema

from test_cli import run


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("json") / "d"
    result = run("demo", "--workdir", str(root), "--subjects", "3")
    assert result.exit_code == 0, result.output
    return root


def parsed(result, command: str) -> dict:
    obj = json.loads(result.stdout)
    jsonschema.validate(obj, output_schema())
    assert obj["output"] == "tombstone." + command.replace(" ", ".") and obj["version"] == "1"
    return obj


def test_the_schema_is_published_and_valid():
    result = run("receipt", "schema", "--cli")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == output_schema()


def test_where_receipt_list_and_backends(demo):
    config = str(demo / "tombstone.toml")
    where = parsed(run("where", "user-0002", "--config", config, "--json"), "where")
    assert where["subject"] == "user-0002" and {a["state"] for a in where["artifacts"]} == {"live"}
    listed = parsed(run("receipt", "list", "--config", config, "--json"), "receipt list")
    assert [r["subject"] for r in listed["receipts"]] == ["user-0001"]
    backends = parsed(run("backends", "--json"), "backends")
    assert "docstore" in {b["backend"] for b in backends["backends"]}
    assert "faulty" not in {b["backend"] for b in backends["backends"]}


def test_a_wrong_shape_fails_the_schema():
    """Control: the schema refuses an object that does not have its command's fields."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"output": "tombstone.where", "version": "1", "artifacts": []}, output_schema())


@pytest.mark.slow
def test_check(tmp_path):
    result = run("check", "--backend", "docstore", "--canaries", "1", "--json")
    obj = parsed(result, "check")
    assert result.exit_code == (0 if obj["passed"] else 1)
    assert obj["passed"] and obj["canaries"] and all(c["passed"] for c in obj["canaries"])


def test_erase_status_resume_and_dlq(demo):
    config = str(demo / "tombstone.toml")
    erased = run("erase", "user-0002", "--config", config, "--json")
    obj = parsed(erased, "erase")
    assert erased.exit_code == (3 if obj["receipts"][0]["needs_action"] else 0)
    brief = obj["receipts"][0]
    assert brief["subject"] == "user-0002" and brief["summary"]["VERIFIED"] >= 1
    assert (demo / "receipts" / "user-0002.json").samefile(brief["receipt"])
    status = parsed(run("status", "--config", config, "--json"), "status")
    assert {s["subject"]: s["state"] for s in status["sagas"]}["user-0002"] == "done"
    one = parsed(run("status", "user-0003", "--config", config, "--json"), "status")
    assert one["subject"] == "user-0003" and {a["state"] for a in one["artifacts"]} == {"live"}
    resumed = parsed(run("resume", "--config", config, "--json"), "resume")
    assert resumed["receipts"] == [] and resumed["stuck"] == []
    letters = parsed(run("dlq", "list", "--config", config, "--json"), "dlq list")
    assert letters["dead_letters"] == []
